/* lifecycle.c - a pool's creation and destruction: options checked, the source opened (its
 * segments from the caller's callbacks when the pool is made with them, and wrapped for
 * fault injection when asked), the host tables and the limit set up, the
 * preallocation made, the history and the published record attached (not for a replay's
 * private pool, which no environment or other process reaches); and the way back,
 * which refuses to free under the user while blocks are live (vram_pool_destroy_force
 * reports them as leaks and frees anyway). */
#include <stdlib.h>

#include "pool/block.h"
#include "pool/call.h"
#include "pool/events.h"
#include "pool/oom.h"
#include "pool/pending.h"
#include "pool/placement.h"
#include "pool/pool.h"
#include "pool/giveback.h"
#include "pool/published.h"
#include "pool/segment.h"

/* The pointer map starts with room for this many blocks (16,384 slots, 256 KiB), so that a
 * pool of a few thousand blocks, a training step's worth, never rehashes and keeps its
 * table nearly empty: probes then end at their home slot and the probe loops' exits are
 * predicted. */
#define PTRMAP_INITIAL_BLOCKS 4096

static void pool_free_everything(vram_pool_t *pool) {
  _vram_giveback_leave(pool);
  _vram_pool_publish_close(pool);
  _vram_history_detach(pool);
  _vram_pending_destroy(pool);
  _vram_segments_destroy(pool);
  _vram_blocks_destroy(pool);
  _vram_ptrmap_destroy(&pool->ptrs);
  pool->src->xClose(pool->src_state);
  free(pool);
}

/* The pool's source: its segments from the caller's callbacks when given (the source of
 * the options then serves the rest), wrapped for fault injection when the options ask. */
static int pool_open_source(vram_pool_t *pool, const vram_source_methods *methods,
                            const vram_source_callbacks_t *callbacks, bool private_pool) {
  const vram_options_t *o = &pool->opts;
  vram_source_config cfg = {.device = o->device,
                            .sim_capacity = o->sim_capacity,
                            .sim_event_delay = o->sim_event_delay,
                            .managed_prefetch = o->managed_prefetch,
                            .private_device = private_pool};
  void *state = NULL;
  int rc = methods->xOpen(&cfg, &state);
  if (rc) return rc;
  pool->src = methods;
  pool->src_state = state;
  if (callbacks) {
    rc = _vram_callback_wrap(methods, state, o->device, callbacks, &pool->src, &pool->src_state);
    if (rc) {
      methods->xClose(state);
      return rc;
    }
  }
  if (o->fault_fail_at) {
    vram_fault_plan plan = {.fail_at = o->fault_fail_at, .fail_every = o->fault_fail_every};
    const vram_source_methods *inner = pool->src;
    void *inner_state = pool->src_state;
    rc = _vram_fault_wrap(inner, inner_state, &plan, &pool->src, &pool->src_state);
    if (rc) {
      inner->xClose(inner_state);
      return rc;
    }
  }
  return VRAM_OK;
}

/* The largest request the pool could ever serve. Managed memory may exceed the device (it
 * spills to the host), so there only the address space bounds it. */
static size_t max_request_of(const vram_pool_t *pool) {
  if (pool->opts.source == VRAM_SOURCE_MANAGED || pool->device_total > VRAM_MAX_REQUEST)
    return VRAM_MAX_REQUEST;
  return pool->device_total;
}

/* Everything after the source opened; on failure the caller frees what was made. */
static int pool_setup(vram_pool_t *pool) {
  const vram_options_t *o = &pool->opts;
  pool->granularity = pool->src->xGranularity(pool->src_state);
  /* Rounding masks and granule shifts assume a power of two; the driver's is one. */
  if (!pool->granularity || (pool->granularity & (pool->granularity - 1)))
    return VRAM_EUNSUPPORTED;
  pool->granule_shift = (unsigned)__builtin_ctzll((unsigned long long)pool->granularity);
  size_t free_bytes = 0;
  int rc = pool->src->xMemInfo(pool->src_state, &free_bytes, &pool->device_total);
  if (rc) return rc;
  pool->max_request = max_request_of(pool);
  rc = _vram_ptrmap_init(&pool->ptrs, PTRMAP_INITIAL_BLOCKS);
  if (!rc) rc = _vram_pool_limit_from(pool, o->limit_bytes, o->limit_fraction, &pool->limit);
  _vram_place_init(pool);
  pool->vmm_reserve_size =
      _vram_round_up(pool->device_total + pool->device_total / 4, pool->granularity);
  size_t pre = 0;
  if (!rc) rc = _vram_pool_limit_from(pool, o->preallocate_bytes, o->preallocate_fraction, &pre);
  if (!rc && pre) rc = _vram_pool_preallocate(pool, pre);
  return rc;
}

/* What no_split asks for: segments that are never cut, so no preallocation (one segment
 * that every request cuts) and no virtual-memory source (ranges are cut by nature). */
static int check_no_split(const vram_options_t *o, const vram_source_methods *methods,
                          const vram_source_callbacks_t *callbacks) {
  if (!o->no_split) return VRAM_OK;
  if (o->preallocate_bytes || o->preallocate_fraction) {
    _vram_create_report_refusal(
        "no_split (VRAMKIT_NO_SPLIT) cannot go with a preallocation (VRAMKIT_PREALLOCATE): "
        "a preallocated pool is one segment that every request cuts; set one of the two");
    return VRAM_EINVAL;
  }
  if (methods->is_vmm && !callbacks) {
    _vram_create_report_refusal(
        "no_split (VRAMKIT_NO_SPLIT) cannot go with a virtual-memory source (vmm, "
        "sim:vmm), whose ranges are cut by nature: use the cuda source for segments that "
        "are never split");
    return VRAM_EUNSUPPORTED;
  }
  return VRAM_OK;
}

static int pool_create(vram_pool_t **out, const vram_options_t *opts,
                       const vram_source_callbacks_t *callbacks, bool private_pool) {
  if (!out) return VRAM_EINVAL;
  *out = NULL;
  _vram_create_report_clear();
  vram_options_t o;
  if (opts) o = *opts;
  else vram_options_init(&o);
  if (o.device < 0) return VRAM_EDEVICE;
  if (!(o.tight_threshold >= 0 && o.tight_threshold <= 1)) return VRAM_EINVAL; /* NaN too */
  if (!(o.virtual_threshold >= 0 && o.virtual_threshold <= 1)) return VRAM_EINVAL;
  if (o.large_blocks != VRAM_LARGE_FIXED && o.large_blocks != VRAM_LARGE_VIRTUAL)
    return VRAM_EINVAL;
  vram_source_kind kind;
  int rc = _vram_resolve_source(o.source, &kind);
  if (rc) return rc;
  o.source = kind;
  const vram_source_methods *methods = _vram_source_for(kind);
  if (!methods) return VRAM_EINVAL;
  rc = check_no_split(&o, methods, callbacks);
  if (rc) return rc;

  vram_pool_t *pool = calloc(1, sizeof *pool);
  if (!pool) return VRAM_EHOSTMEM;
  _vram_lock_init(&pool->lock);
  pool->opts = o;
  pool->oom_info.cause = -1; /* no OOM yet: vram_oom_info says so */
  pool->split_stats = o.split_stats != 0;
  pool->no_split = o.no_split != 0;
  if (pool->split_stats) atomic_store(&pool->history_flags, VRAM_REC_KINDS);
  rc = pool_open_source(pool, methods, callbacks, private_pool);
  if (rc) {
    free(pool);
    return rc;
  }
  rc = pool_setup(pool);
  /* A private pool reads no environment and is seen by no other process. */
  if (!rc && !private_pool) {
    rc = _vram_history_attach_env(pool);
    if (!rc) _vram_pool_publish_open(pool); /* never fails: publishing turns itself off */
    if (!rc) rc = _vram_giveback_join(pool);
  }
  if (rc) {
    pool_free_everything(pool);
    return rc;
  }
  *out = pool;
  return VRAM_OK;
}

int vram_pool_create(vram_pool_t **out, const vram_options_t *opts) {
  return pool_create(out, opts, NULL, false);
}

int _vram_pool_create_private(vram_pool_t **out, const vram_options_t *opts) {
  return pool_create(out, opts, NULL, true);
}

static bool callbacks_usable(const vram_source_callbacks_t *cb) {
  return cb && cb->alloc && cb->free && !(cb->granularity & (cb->granularity - 1));
}

int vram_pool_create_with_callbacks(vram_pool_t **out, const vram_options_t *opts,
                                    const vram_source_callbacks_t *callbacks) {
  if (!out) return VRAM_EINVAL;
  *out = NULL;
  if (!callbacks_usable(callbacks)) return VRAM_EINVAL;
  return pool_create(out, opts, callbacks, false);
}

static int count_live_locked(vram_pool_t *pool, void *arg) {
  return pool->stats.allocation.current != 0;
}

int vram_pool_destroy(vram_pool_t *pool) {
  if (!pool) return VRAM_EINVAL;
  if (locked_call(pool, count_live_locked, NULL, NULL)) return VRAM_EBUSY;
  pool_free_everything(pool);
  return VRAM_OK;
}

int vram_pool_destroy_force(vram_pool_t *pool) {
  if (!pool) return VRAM_EINVAL;
  _vram_leak_report_pool(pool);
  pool_free_everything(pool);
  return VRAM_OK;
}

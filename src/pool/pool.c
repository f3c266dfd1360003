/* pool.c - the public entry points of the engine: malloc, free, streams, limits and
 * statistics (create and destroy are lifecycle.c).
 *
 * types.h draws the picture. The hot path of a size just freed on the same stream: find
 * the stream's arena (one-entry cache) and take back the block parked in its one-block
 * cache. Otherwise: merge the parked block, find a free block in the arena's TLSF index,
 * split it, record the pointer in the hash (block.h). Free looks the pointer up and parks
 * the block; the block it displaces is merged with its free address neighbours and indexed.
 * No source call, no allocation of host memory (block structs come from a free list), one
 * lock taken once per call.
 *
 * Misses go down a ladder: drain completed cross-stream frees (pending.c); grow by a
 * segment from the source, or, for virtual memory, map granules (placement.h and .c decide
 * which block a request takes, what grows and what goes back; segment.c and granules.c do
 * it); release cached memory and retry; borrow a free block of another stream's arena; ask
 * the neighbours; then fail with a report that says why and what to try.
 *
 * Every entry point runs its work through locked_call, which takes the lock, runs the
 * invariant checker at VRAM_DEBUG >= 3, and lets go; every entry point given a pointer finds
 * its block through live_block.
 */
#include <stdio.h>
#include <stdlib.h>

#include "pool/block.h"
#include "pool/call.h"
#include "pool/events.h"
#include "pool/giveback.h"
#include "pool/kinds.h"
#include "pool/oom.h"
#include "pool/pending.h"
#include "pool/placement.h"
#include "pool/pool.h"
#include "pool/published.h"
#include "pool/segment.h"
#include "pool/snapshot.h"


/* ---------------------------------------------------------------------------------------
 * The way in: one lock, one check, one lookup.
 * ------------------------------------------------------------------------------------- */

static void report_error(vram_pool_t *pool, error_hook hook, int status, const char *message) {
  if (hook.fn) hook.fn(hook.user, pool, status, message);
}

/* The block of arena `a`, in any state, whose bytes hold `addr`; NULL if none. A walk of
 * the segments' address lists: for the rare calls that start from an address. */
static vram_block *block_at(const vram_arena *a, uintptr_t addr) {
  for (vram_segment *s = a->segments; s; s = s->next) {
    if (addr < s->addr || addr >= s->addr + s->size) continue;
    for (vram_block *b = s->first; b; b = b->addr_next)
      if (b->addr <= addr && addr < b->addr + b->size) return b;
  }
  return NULL;
}

/* Why a pointer that is not live is refused: a freed block of ours, or not ours at all. */
static __attribute__((noinline, cold)) int classify_unknown_pointer(const vram_pool_t *pool,
                                                                    uintptr_t addr) {
  for (vram_arena *a = pool->arenas; a; a = a->next) {
    const vram_block *b = block_at(a, addr);
    /* An aligned address in free memory of ours was handed out once and freed (maybe
     * since merged with a neighbour): a double free. Anything else is not a block. */
    if (b)
      return (b->state == VRAM_BLOCK_FREE && addr % VRAM_ALIGN == 0) ? VRAM_EDOUBLEFREE
                                                                      : VRAM_EFOREIGN;
  }
  return VRAM_EFOREIGN;
}

/* The live block at `ptr`, or why there is none: freed already (pending and parked blocks
 * included) or never ours. */
VRAM_HOT int live_block(vram_pool_t *pool, const void *ptr, vram_block **out) {
  vram_block *b = _vram_ptrmap_get(&pool->ptrs, (uintptr_t)ptr);
  if (!b) return classify_unknown_pointer(pool, (uintptr_t)ptr);
  if (b->state != VRAM_BLOCK_LIVE) return VRAM_EDOUBLEFREE;
  *out = b;
  return VRAM_OK;
}

/* ---------------------------------------------------------------------------------------
 * Allocation.
 * ------------------------------------------------------------------------------------- */

/* A request its own arena cannot serve takes a free block of another stream's arena, as
 * RMM's pool does, where PyTorch's allocator would fail: the request's stream waits for
 * the work queued on the owner's stream first, and the block's free waits for the
 * request's stream before the owner's stream reuses it (pending.h). Each borrow costs an
 * event and a stream wait, and ties the two streams' work together, so it comes only
 * where growing fails: at once in preallocate mode, whose memory is the default stream's
 * arena (before the ladder's waits for every stream), else as the ladder's last step. */
static __attribute__((noinline)) int alloc_borrowed(vram_pool_t *pool, vram_arena *a,
                                                    size_t rounded, size_t requested,
                                                    vram_block **out) {
  bool small = rounded <= VRAM_SMALL_MAX && !pool->unified_index;
  vram_block *b = _vram_place_borrow(pool, a, rounded, small);
  if (!b) return VRAM_ENOMEM;
  vram_stream_uses *uses = NULL;
  int rc = _vram_pending_borrow(pool, b->segment->arena, a->stream, &uses);
  if (!rc) rc = _vram_block_take(pool, b, rounded, requested, out);
  if (rc) {
    free(uses);
    return rc;
  }
  (*out)->uses = uses;
  pool->stats.num_stream_borrows++;
  return VRAM_OK;
}

/* One attempt: reuse a cached block, else grow. */
VRAM_HOT int alloc_attempt(vram_pool_t *pool, vram_arena *a, size_t rounded, size_t requested,
                           vram_block **out) {
  bool small = rounded <= VRAM_SMALL_MAX && !pool->unified_index;
  vram_block **slot = _vram_arena_cache_slot(a, small);
  vram_block *b = *slot;
  if (b) {
    /* While cross-stream frees wait, every request takes the path below, which looks at
     * them now and then. */
    if (b->size == rounded && !pool->pending_count) {
      *slot = NULL;
      b->state = VRAM_BLOCK_LIVE;
      b->requested = requested;
      *out = b;
      return VRAM_OK;
    }
    *slot = NULL;
    _vram_block_uncache(pool, b);
  }
  vram_tlsf *index = _vram_arena_index(a, small);
  b = _vram_tlsf_find(index, rounded);
  /* Retire completed cross-stream frees when the index has nothing that fits, when the
   * fit would map new memory (virtual segments always have room), and now and then
   * otherwise, so that a waiting block is not forgotten while other blocks keep fitting. */
  if (pool->pending_count &&
      (!b || (++pool->pending_tick & 63) == 0 ||
       (b->segment->gran_mapped && _vram_granules_unmapped_in(pool, b->segment, b->addr, rounded)))) {
    _vram_pending_drain(pool, false);
    b = _vram_tlsf_find(index, rounded);
  }
  /* Which free block the request takes is placement's (placement.h): NULL to grow. */
  b = _vram_place_fit(pool, a, index, b, rounded, small);
  if (_vram_place_wants_own_segment(pool, b, rounded, small)) {
    vram_block *own = NULL;
    /* If no segment can be had (limit, device full, a failing driver call), carving is the
     * way left; the grow may have given b's segment back on its way, so look again. */
    if (_vram_place_grow(pool, a, rounded, small, &own) == VRAM_OK) {
      b = own;
      _vram_pool_publish_slow(pool);
    } else {
      b = _vram_tlsf_find(index, rounded);
    }
  }
  if (!b) {
    int rc = _vram_place_grow(pool, a, rounded, small, &b);
    if (rc == VRAM_ENOMEM && pool->unified_index && pool->arena_count > 1)
      return alloc_borrowed(pool, a, rounded, requested, out);
    if (rc) return rc;
    _vram_pool_publish_slow(pool); /* a segment change: the slow fields too */
  }
  return _vram_block_take(pool, b, rounded, requested, out);
}

typedef struct malloc_call {
  size_t size;
  vram_stream_t stream;
  vram_block *block;
  uint64_t context; /* recording path only */
} malloc_call;

VRAM_HOT int malloc_locked(vram_pool_t *pool, void *arg) {
  malloc_call *c = arg;
  size_t requested = c->size;
  /* A size no device of this kind can hold fails before any rounding (which could
   * overflow) and before the ladder, which would give back cached memory for nothing. */
  if (__builtin_expect(requested > pool->max_request, 0)) {
    _vram_note_oom(pool, requested, c->stream, pool->max_request);
    return VRAM_ENOMEM;
  }
  size_t rounded = _vram_round_up(requested, VRAM_ALIGN);
  vram_arena *a = _vram_arena_get(pool, c->stream);
  if (!a) return VRAM_EHOSTMEM;
  int rc = alloc_attempt(pool, a, rounded, requested, &c->block);
  if (rc == VRAM_ENOMEM) {
    /* The ladder: wait for every pending free, give back all cached memory, retry. */
    pool->stats.num_alloc_retries++;
    _vram_pending_drain(pool, true);
    _vram_release_cached(pool, SIZE_MAX, NULL);
    rc = alloc_attempt(pool, a, rounded, requested, &c->block);
    /* Last: a hole of a retired fixed segment (virtual growth), kept out of the way so
     * that those segments drain, is still better than failing. */
    if (rc == VRAM_ENOMEM && a->retired.fl_bitmap) {
      vram_block *hole = _vram_tlsf_find(&a->retired, rounded);
      if (hole) rc = _vram_block_take(pool, hole, rounded, requested, &c->block);
    }
    /* Then another stream's free memory, ordered after that stream's work. */
    if (rc == VRAM_ENOMEM && pool->arena_count > 1) {
      int borrowed = alloc_borrowed(pool, a, rounded, requested, &c->block);
      if (borrowed != VRAM_ENOMEM) rc = borrowed;
    }
    /* Then the neighbours on the device: their idle cache, if they give it back in time. */
    if (rc == VRAM_ENOMEM && pool->giveback && _vram_giveback_ask(pool, rounded))
      rc = alloc_attempt(pool, a, rounded, requested, &c->block);
    _vram_pool_publish_slow(pool);
  }
  if (rc == VRAM_OK) {
    vram_block *b = c->block;
    vram_stat_up(&pool->stats.allocated_bytes, (int64_t)b->size);
    vram_stat_up(&pool->stats.requested_bytes, (int64_t)requested);
    vram_stat_up(&pool->stats.allocation, 1);
    if (pool->pending_blocks) _vram_active_peaks_note(pool);
    _vram_pool_publish_hot(pool);
  } else if (rc == VRAM_ENOMEM) {
    _vram_note_oom(pool, requested, c->stream, 0);
  }
  return rc;
}

/* Kept out of line: the message buffer and the formatting stay off the hot path. */
static __attribute__((noinline, cold)) int malloc_failed(vram_pool_t *pool, error_hook hook,
                                                         size_t size, int rc) {
  if (!hook.fn) return rc;
  char msg[2048];
  if (rc == VRAM_ENOMEM) vram_oom_report(pool, msg, sizeof msg);
  else snprintf(msg, sizeof msg, "vram_malloc(%zu): %s", size, vram_strerror(rc));
  report_error(pool, hook, rc, msg);
  return rc;
}

/* The recording path: the same work, then the event. */
static int malloc_recorded_locked(vram_pool_t *pool, void *arg) {
  malloc_call *c = arg;
  _vram_call_context_set(pool, c->context);
  int rc = malloc_locked(pool, c);
  _vram_call_context_set(pool, 0);
  if (rc != VRAM_OK) return rc;
  if (pool->split_stats) _vram_kind_alloc(pool, c->block->segment, c->block->size, c->size);
  vram_history *h = pool->history;
  if (h) _vram_note_alloc(pool, h, c->block->addr, c->block->size, c->size, c->stream, c->context);
  return rc;
}

/* Out of line, so that vram_malloc with history off pays one branch for it. The context
 * function runs before the lock is taken: it may be slow and may call into the pool. */
static __attribute__((noinline)) int malloc_recorded(vram_pool_t *pool, size_t size,
                                                     vram_stream_t stream, void **out,
                                                     void *call_site) {
  unsigned flags = atomic_load_explicit(&pool->history_flags, memory_order_relaxed);
  malloc_call c = {size, stream, NULL, 0};
  if (flags & (VRAM_REC_CONTEXTS | VRAM_REC_LEAKS)) c.context = _vram_context_current(flags, call_site);
  error_hook hook = {NULL, NULL};
  int rc = locked_call(pool, malloc_recorded_locked, &c, &hook);
  if (rc) return malloc_failed(pool, hook, size, rc);
  *out = (void *)c.block->addr;
  return VRAM_OK;
}

int vram_malloc(vram_pool_t *pool, size_t size, vram_stream_t stream, void **out) {
  if (!pool || !out) return VRAM_EINVAL;
  *out = NULL;
  if (size == 0) return VRAM_OK;
  if (__builtin_expect(atomic_load_explicit(&pool->history_flags, memory_order_relaxed) != 0, 0))
    return malloc_recorded(pool, size, stream, out, __builtin_return_address(0));
  malloc_call c = {size, stream, NULL, 0};
  error_hook hook = {NULL, NULL};
  int rc = locked_call(pool, malloc_locked, &c, &hook);
  if (rc) return malloc_failed(pool, hook, size, rc);
  *out = (void *)c.block->addr;
  return VRAM_OK;
}

/* ---------------------------------------------------------------------------------------
 * Free and the calls about one block.
 * ------------------------------------------------------------------------------------- */

/* Keep cached memory under the release threshold. */
static __attribute__((noinline)) void release_over_threshold(vram_pool_t *pool) {
  size_t cached = _vram_place_releasable(pool);
  if (cached > pool->opts.release_threshold)
    _vram_release_cached(pool, cached - pool->opts.release_threshold, NULL);
  _vram_pool_publish_slow(pool);
}

/* Free live block b; the release threshold is the caller's to apply. */
VRAM_HOT int free_block(vram_pool_t *pool, vram_block *b) {
  int rc;
  size_t size = b->size, requested = b->requested;
  if (b->uses && b->uses->count) {
    rc = _vram_pending_free(pool, b);
    if (rc) return rc;
  } else {
    _vram_block_retire(pool, b);
  }
  vram_stat_down(&pool->stats.allocated_bytes, (int64_t)(size));
  vram_stat_down(&pool->stats.requested_bytes, (int64_t)(requested));
  vram_stat_down(&pool->stats.allocation, 1);
  _vram_pool_publish_hot(pool);
  return VRAM_OK;
}

VRAM_HOT int free_locked(vram_pool_t *pool, void *ptr) {
  vram_block *b = NULL;
  int rc = live_block(pool, ptr, &b);
  if (!rc) rc = free_block(pool, b);
  if (!rc && pool->opts.release_threshold != SIZE_MAX) release_over_threshold(pool);
  return rc;
}

typedef struct free_call {
  void *ptr;
  uint64_t context; /* the free's own (VRAM_REC_FREE_CONTEXTS), or 0 */
} free_call;

/* The recording path: the block's fields are read before the free may merge it away, and
 * the free is recorded (and counted in its kind's share) before the release threshold
 * gives segments back. */
static int free_recorded_work(vram_pool_t *pool, void *ptr) {
  vram_history *h = pool->history;
  if (!h && !pool->split_stats) return free_locked(pool, ptr);
  vram_block *b = NULL;
  int rc = live_block(pool, ptr, &b);
  if (rc) return rc;
  uint64_t addr = b->addr, size = b->size, requested = b->requested;
  const vram_segment *segment = b->segment; /* b may merge away; its segment stays */
  vram_stream_t stream = _vram_block_stream(b);
  bool pending = b->uses && b->uses->count;
  rc = free_block(pool, b);
  if (rc) return rc;
  if (pool->split_stats) _vram_kind_free(_vram_kind_of(pool, segment), size, requested);
  if (h) _vram_note_free(pool, h, addr, size, requested, stream, pending);
  if (pool->opts.release_threshold != SIZE_MAX) release_over_threshold(pool);
  return VRAM_OK;
}

/* The free's context (its own, under context="all") is the call's: its events and the
 * segments it gives back carry it. */
static int free_recorded_locked(vram_pool_t *pool, void *arg) {
  const free_call *c = arg;
  _vram_call_context_set(pool, c->context);
  int rc = free_recorded_work(pool, c->ptr);
  _vram_call_context_set(pool, 0);
  return rc;
}

int vram_free(vram_pool_t *pool, void *ptr) {
  if (!pool) return VRAM_EINVAL;
  if (!ptr) return VRAM_OK;
  error_hook hook = {NULL, NULL};
  unsigned flags = atomic_load_explicit(&pool->history_flags, memory_order_relaxed);
  int rc;
  if (__builtin_expect(flags != 0, 0)) {
    /* As at an allocation, the context function runs before the lock is taken. */
    free_call c = {ptr, 0};
    if (flags & VRAM_REC_FREE_CONTEXTS) c.context = _vram_context_current(VRAM_REC_CONTEXTS, NULL);
    rc = locked_call(pool, free_recorded_locked, &c, &hook);
  } else {
    rc = locked_call(pool, free_locked, ptr, &hook);
  }
  if (rc && hook.fn) {
    char msg[128];
    snprintf(msg, sizeof msg, "vram_free(%p): %s", ptr, vram_strerror(rc));
    report_error(pool, hook, rc, msg);
  }
  return rc;
}

typedef struct block_call {
  void *ptr;
  vram_stream_t stream;
  size_t size, *requested;
  vram_stream_t *stream_out;
  void *base_out;
  int to_device;
} block_call;

static int record_stream_locked(vram_pool_t *pool, void *arg) {
  block_call *c = arg;
  vram_block *b = NULL;
  int rc = live_block(pool, c->ptr, &b);
  if (rc || c->stream == _vram_block_stream(b)) return rc;
  return _vram_pending_add_use(b, c->stream);
}

int vram_record_stream(vram_pool_t *pool, void *ptr, vram_stream_t stream) {
  if (!pool || !ptr) return VRAM_EINVAL;
  block_call c = {.ptr = ptr, .stream = stream};
  return locked_call(pool, record_stream_locked, &c, NULL);
}

static int block_info_locked(vram_pool_t *pool, void *arg) {
  block_call *c = arg;
  vram_block *b = NULL;
  int rc = live_block(pool, c->ptr, &b);
  if (rc) return rc;
  if (c->requested) *c->requested = b->requested;
  if (c->stream_out) *c->stream_out = _vram_block_stream(b);
  return VRAM_OK;
}

int vram_block_info(vram_pool_t *pool, void *ptr, size_t *requested, vram_stream_t *stream) {
  if (!pool || !ptr) return VRAM_EINVAL;
  block_call c = {.ptr = ptr, .requested = requested, .stream_out = stream};
  return locked_call(pool, block_info_locked, &c, NULL);
}

/* The live block at `ptr` by its pointer alone: no search of freed memory, so that a caller
 * asking each of several pools which one owns a pointer pays one hash probe per pool. */
static int segment_of_locked(vram_pool_t *pool, void *arg) {
  block_call *c = arg;
  vram_block *b = _vram_ptrmap_get(&pool->ptrs, (uintptr_t)c->ptr);
  if (!b || b->state != VRAM_BLOCK_LIVE) return VRAM_EFOREIGN;
  c->base_out = (void *)b->segment->addr;
  c->size = b->segment->size;
  return VRAM_OK;
}

int vram_segment_of(vram_pool_t *pool, void *ptr, void **base, size_t *size) {
  if (!pool || !ptr) return VRAM_EINVAL;
  block_call c = {.ptr = ptr};
  int rc = locked_call(pool, segment_of_locked, &c, NULL);
  if (rc) return rc;
  if (base) *base = c.base_out;
  if (size) *size = c.size;
  return VRAM_OK;
}

/* The free block of `a` holding [addr, addr + size), or why there is none. */
static int free_block_holding(vram_arena *a, uintptr_t addr, size_t size, vram_block **out) {
  vram_block *b = block_at(a, addr);
  if (!b) return VRAM_EFOREIGN;
  if (b->state != VRAM_BLOCK_FREE || addr + size > b->addr + b->size) return VRAM_EBUSY;
  *out = b;
  return VRAM_OK;
}

typedef struct malloc_at_call {
  uintptr_t addr;
  size_t size;
  vram_stream_t stream;
} malloc_at_call;

static int malloc_at_locked(vram_pool_t *pool, void *arg) {
  malloc_at_call *c = arg;
  size_t rounded = _vram_round_up(c->size, VRAM_ALIGN);
  vram_arena *a = _vram_arena_find(pool, c->stream);
  if (!a) return VRAM_EFOREIGN;
  /* Parked blocks are free memory to the caller: merge them so the range reads as free. */
  _vram_cache_flush_all(pool);
  vram_block *b = NULL;
  int rc = free_block_holding(a, c->addr, rounded, &b);
  if (rc) return rc;
  bool split = b->addr < c->addr;
  if (split && pool->no_split) return VRAM_EINVAL; /* a block there would be a cut */
  if (split && (rc = _vram_block_split_front(pool, b, c->addr)) != VRAM_OK) return rc;
  vram_block *live = NULL;
  rc = _vram_block_take(pool, b, rounded, c->size, &live);
  if (rc) {
    if (split) _vram_block_merge_front(pool, b);
    return rc;
  }
  vram_stat_up(&pool->stats.allocated_bytes, (int64_t)live->size);
  vram_stat_up(&pool->stats.requested_bytes, (int64_t)c->size);
  vram_stat_up(&pool->stats.allocation, 1);
  if (pool->split_stats) _vram_kind_alloc(pool, live->segment, live->size, c->size);
  if (pool->pending_blocks) _vram_active_peaks_note(pool);
  vram_history *h = pool->history;
  if (h) _vram_note_alloc(pool, h, live->addr, live->size, c->size, c->stream, 0);
  _vram_pool_publish_hot(pool);
  return VRAM_OK;
}

int vram_malloc_at(vram_pool_t *pool, void *ptr, size_t size, vram_stream_t stream) {
  if (!pool || !ptr || size == 0 || size > VRAM_MAX_REQUEST ||
      (uintptr_t)ptr % VRAM_ALIGN)
    return VRAM_EINVAL;
  malloc_at_call c = {(uintptr_t)ptr, size, stream};
  return locked_call(pool, malloc_at_locked, &c, NULL);
}

static int prefetch_locked(vram_pool_t *pool, void *arg) {
  block_call *c = arg;
  vram_block *b = NULL;
  int rc = live_block(pool, c->ptr, &b);
  if (rc) return rc;
  if (c->size == 0 || c->size > b->size) return VRAM_EINVAL;
  return pool->src->xPrefetch(pool->src_state, b->addr, c->size, c->to_device, c->stream);
}

int vram_prefetch(vram_pool_t *pool, void *ptr, size_t size, int to_device, vram_stream_t stream) {
  if (!pool || !ptr) return VRAM_EINVAL;
  if (!pool->src->xPrefetch) return VRAM_EUNSUPPORTED;
  block_call c = {.ptr = ptr, .stream = stream, .size = size, .to_device = to_device};
  return locked_call(pool, prefetch_locked, &c, NULL);
}

typedef struct for_each_call {
  vram_block_fn fn;
  void *user;
} for_each_call;

static int for_each_block_locked(vram_pool_t *pool, void *arg) {
  for_each_call *c = arg;
  for (vram_arena *a = pool->arenas; a; a = a->next)
    for (vram_segment *s = a->segments; s; s = s->next)
      for (vram_block *b = s->first; b; b = b->addr_next)
        if (b->state == VRAM_BLOCK_LIVE)
          c->fn(c->user, (void *)b->addr, b->requested, b->size, _vram_block_stream(b));
  return VRAM_OK;
}

int vram_for_each_block(vram_pool_t *pool, vram_block_fn fn, void *user) {
  if (!pool || !fn) return VRAM_EINVAL;
  for_each_call c = {fn, user};
  return locked_call(pool, for_each_block_locked, &c, NULL);
}

/* ---------------------------------------------------------------------------------------
 * Cache, limit, device.
 * ------------------------------------------------------------------------------------- */

static int empty_cache_locked(vram_pool_t *pool, void *arg) {
  int first_error = VRAM_OK;
  _vram_call_context_set(pool, *(const uint64_t *)arg);
  _vram_note(pool, VRAM_EVENT_EMPTY_CACHE, 0, 0, 0, NULL, 0);
  _vram_pending_drain(pool, true);
  _vram_release_cached(pool, SIZE_MAX, &first_error);
  _vram_call_context_set(pool, 0);
  _vram_pool_publish_slow(pool);
  return first_error;
}

int vram_empty_cache(vram_pool_t *pool) {
  if (!pool) return VRAM_EINVAL;
  /* Under context="all" the segments it gives back name this call, as at a free. */
  uint64_t context = 0;
  if (atomic_load_explicit(&pool->history_flags, memory_order_relaxed) & VRAM_REC_FREE_CONTEXTS)
    context = _vram_context_current(VRAM_REC_CONTEXTS, NULL);
  return locked_call(pool, empty_cache_locked, &context, NULL);
}

int _vram_pool_limit_from(const vram_pool_t *pool, size_t bytes, double fraction,
                          size_t *out) {
  if (bytes) {
    *out = bytes;
    return VRAM_OK;
  }
  if (fraction < 0 || fraction > 1 || fraction != fraction) return VRAM_EINVAL;
  *out = fraction > 0 ? (size_t)(fraction * (double)pool->device_total) : 0;
  return VRAM_OK;
}

static int set_limit_locked(vram_pool_t *pool, void *arg) {
  size_t limit = *(const size_t *)arg;
  pool->limit = limit;
  /* Above the new limit, cached memory goes back now rather than at the next miss. */
  if (limit && (size_t)pool->stats.reserved_bytes.current > limit)
    _vram_release_cached(pool, (size_t)pool->stats.reserved_bytes.current - limit, NULL);
  _vram_pool_publish_slow(pool);
  return VRAM_OK;
}

int vram_set_limit(vram_pool_t *pool, size_t bytes, double fraction) {
  if (!pool) return VRAM_EINVAL;
  size_t limit;
  int rc = _vram_pool_limit_from(pool, bytes, fraction, &limit);
  if (rc) return rc;
  return locked_call(pool, set_limit_locked, &limit, NULL);
}

static int enable_peer_locked(vram_pool_t *pool, void *arg) {
  return pool->src->xEnablePeer(pool->src_state, *(const int *)arg);
}

int vram_enable_peer_access(vram_pool_t *pool, int peer_device) {
  if (!pool) return VRAM_EINVAL;
  if (!pool->src->xEnablePeer) return VRAM_EUNSUPPORTED;
  if (peer_device < 0) return VRAM_EDEVICE;
  return locked_call(pool, enable_peer_locked, &peer_device, NULL);
}

int vram_pool_device(const vram_pool_t *pool) { return pool ? pool->opts.device : VRAM_EINVAL; }

vram_source_kind vram_pool_source(const vram_pool_t *pool) {
  return pool ? pool->opts.source : VRAM_SOURCE_AUTO;
}

typedef struct mem_info_call {
  size_t *free_bytes, *total_bytes;
} mem_info_call;

static int mem_info_locked(vram_pool_t *pool, void *arg) {
  mem_info_call *c = arg;
  return pool->src->xMemInfo(pool->src_state, c->free_bytes, c->total_bytes);
}

int vram_mem_get_info(vram_pool_t *pool, size_t *free_bytes, size_t *total_bytes) {
  if (!pool || !free_bytes || !total_bytes) return VRAM_EINVAL;
  mem_info_call c = {free_bytes, total_bytes};
  return locked_call(pool, mem_info_locked, &c, NULL);
}

int vram_device_count(vram_source_kind kind, int *count) {
  if (!count) return VRAM_EINVAL;
  *count = 0;
  return _vram_source_device_count(kind, count);
}

/* ---------------------------------------------------------------------------------------
 * Statistics and reports: snapshots under the lock, formatted by src/obs.
 * ------------------------------------------------------------------------------------- */

static int get_stats_locked(vram_pool_t *pool, void *arg) {
  _vram_pool_fill_stats(pool, arg);
  return VRAM_OK;
}

int vram_get_stats(vram_pool_t *pool, vram_stats_t *out) {
  if (!pool || !out) return VRAM_EINVAL;
  return locked_call(pool, get_stats_locked, out, NULL);
}

static int reset_peak_locked(vram_pool_t *pool, void *arg) {
#define VRAM_X_RESET(name, doc) pool->stats.name.peak = pool->stats.name.current;
  VRAM_STAT_LIST(VRAM_X_RESET)
#undef VRAM_X_RESET
  pool->active_bytes_peak = pool->active_peak = 0;
  for (int k = 0; k < 2; k++) {
    vram_kind_counts *c = &pool->kinds[k];
    c->allocated_bytes.peak = c->allocated_bytes.current;
    c->requested_bytes.peak = c->requested_bytes.current;
    c->allocation.peak = c->allocation.current;
    c->reserved_bytes.peak = c->reserved_bytes.current;
    c->segment.peak = c->segment.current;
    c->active_bytes_peak = c->active_peak = 0;
  }
  pool->guard_ceiling = 0; /* the guard holds to the new peak */
  _vram_place_forget_map_ghosts(pool); /* and the mapped allowance to its new figures */
  _vram_active_peaks_note(pool);
  _vram_pool_publish_slow(pool);
  return VRAM_OK;
}

int vram_reset_peak_stats(vram_pool_t *pool) {
  if (!pool) return VRAM_EINVAL;
  return locked_call(pool, reset_peak_locked, NULL, NULL);
}

static int snapshot_locked(vram_pool_t *pool, void *arg) {
  _vram_pool_snapshot(pool, false, arg);
  return VRAM_OK;
}

int vram_summary(vram_pool_t *pool, char *buf, size_t cap) {
  if (!pool || (!buf && cap)) return VRAM_EINVAL;
  vram_pool_snapshot snap;
  locked_call(pool, snapshot_locked, &snap, NULL);
  return _vram_format_summary(&snap, buf, cap);
}

int vram_stats_json(vram_pool_t *pool, char *buf, size_t cap) {
  if (!pool || (!buf && cap)) return VRAM_EINVAL;
  vram_stats_t s;
  vram_get_stats(pool, &s);
  return _vram_format_stats_json(&s, buf, cap);
}

typedef struct text_call {
  char *buf;
  size_t cap;
} text_call;

static int oom_report_locked(vram_pool_t *pool, void *arg) {
  text_call *c = arg;
  return snprintf(c->buf, c->cap, "%s", pool->oom_report);
}

int vram_oom_report(vram_pool_t *pool, char *buf, size_t cap) {
  if (!pool || (!buf && cap)) return VRAM_EINVAL;
  text_call c = {buf, cap};
  return locked_call(pool, oom_report_locked, &c, NULL);
}

static int oom_info_locked(vram_pool_t *pool, void *arg) {
  vram_oom_info_t *info = arg;
  if (pool->oom_info.cause < 0) {
    memset(info, 0, sizeof *info);
    return VRAM_EINVAL;
  }
  *info = pool->oom_info;
  return VRAM_OK;
}

int vram_oom_info(vram_pool_t *pool, vram_oom_info_t *info) {
  if (!pool || !info) return VRAM_EINVAL;
  return locked_call(pool, oom_info_locked, info, NULL);
}

static int set_error_callback_locked(vram_pool_t *pool, void *arg) {
  const error_hook *h = arg;
  pool->on_error = h->fn;
  pool->on_error_user = h->user;
  return VRAM_OK;
}

int vram_set_error_callback(vram_pool_t *pool, vram_error_fn fn, void *user) {
  if (!pool) return VRAM_EINVAL;
  error_hook h = {fn, user};
  return locked_call(pool, set_error_callback_locked, &h, NULL);
}

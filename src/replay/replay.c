/* replay.c - one trace through fresh pools (vram_replay_trace, vramkit.h): the op loop
 * under the clock, the cold, warm and yardstick passes, and the checks that every pass
 * gave every byte back. `vramkit replay` and the Python package both call this, so that
 * the figures of a trace have one owner. The bisection for the smallest capacity is in
 * capacity.c.
 */
#define _POSIX_C_SOURCE 200809L
#include "replay/replay.h"

#include "pool/pool.h"
#include "prim/hashtab.h"
#include "source/source.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)now.tv_sec * 1e9 + (double)now.tv_nsec;
}

/* The first failure's message wins: later ones are consequences of it. */
static void fail(vram_replay_result *result, const char *format, ...) {
  if (result->error[0]) return;
  va_list ap;
  va_start(ap, format);
  vsnprintf(result->error, sizeof result->error, format, ap);
  va_end(ap);
}

static uint64_t device_calls(vram_pool_t *pool) {
  vram_stats_t stats;
  if (vram_get_stats(pool, &stats) != VRAM_OK) return 0;
  return stats.num_device_alloc + stats.num_device_free;
}

static int source_is_gpu(vram_source_kind kind) {
  return kind == VRAM_SOURCE_CUDA || kind == VRAM_SOURCE_VMM || kind == VRAM_SOURCE_MANAGED;
}

/* Free every block the replay left live (the trace's never-freed blocks, or those of an
 * interrupted pass). Returns 0, or -1 after noting the first failure. */
static int free_live(vram_pool_t *pool, const trace_t *trace, void **blocks,
                     vram_replay_result *result) {
  int failed = 0;
  for (uint32_t slot = 0; slot < trace->slot_count; slot++) {
    if (!blocks[slot]) continue;
    int status = vram_free(pool, blocks[slot]);
    blocks[slot] = NULL;
    if (status != VRAM_OK && !failed) {
      fail(result, "%s: final free failed: %s", trace->name, vram_strerror(status));
      failed = 1;
    }
  }
  return failed ? -1 : 0;
}

/* Free what is still live, then check that the pool has every byte back and that
 * empty_cache returns everything to the source but `kept`, what the pool held from its
 * creation (a preallocation, which empty_cache leaves alone). */
static int drain_and_check(vram_pool_t *pool, const trace_t *trace, void **blocks,
                           int64_t kept, vram_replay_result *result) {
  int failed = free_live(pool, trace, blocks, result) != 0;
  vram_stats_t stats;
  int status = vram_get_stats(pool, &stats);
  if (status != VRAM_OK) {
    fail(result, "%s: vram_get_stats: %s", trace->name, vram_strerror(status));
    return status;
  }
  if (stats.allocated_bytes.current != 0 || stats.allocation.current != 0) {
    fail(result, "%s: bytes not returned: after freeing every block the pool still counts "
                 "%lld bytes in %lld allocations", trace->name,
         (long long)stats.allocated_bytes.current, (long long)stats.allocation.current);
    failed = 1;
  }
  status = vram_empty_cache(pool);
  if (status == VRAM_OK) status = vram_get_stats(pool, &stats);
  if (status != VRAM_OK) {
    fail(result, "%s: vram_empty_cache: %s", trace->name, vram_strerror(status));
    return status;
  }
  if (stats.reserved_bytes.current > kept) {
    fail(result, "%s: memory not released: %lld bytes still reserved after vram_empty_cache "
                 "with nothing allocated (%lld held from the start)", trace->name,
         (long long)stats.reserved_bytes.current, (long long)kept);
    failed = 1;
  }
  return failed ? VRAM_EBUSY : VRAM_OK;
}

/* Ops [from, to) of a pass: the timed loop. OOMs are counted and the op skipped (its free
 * is then ignored, since the slot stays NULL); with stop_at_oom the pass ends at the
 * first, and with report_oom the first one's report is kept. Any other error ends the pass
 * with pass->failed_at set. Returns the index it reached: `to` unless it ended early. */
static size_t run_ops(vram_pool_t *pool, const trace_t *trace, _vram_replay_pass *pass,
                      size_t from, size_t to, uint64_t *ooms, double *elapsed_ns) {
  const trace_op_t *ops = trace->ops;
  void **blocks = pass->blocks;
  vram_stream_t *streams = pass->streams;
  uint64_t oom_count = 0;
  size_t done = from;
  int status = VRAM_OK;
  double start = now_ns();
  for (; done < to; done++) {
    const trace_op_t *op = &ops[done];
    if (op->is_alloc) {
      status = vram_malloc(pool, (size_t)op->size, streams[op->stream], &blocks[op->slot]);
      if (status != VRAM_OK) {
        blocks[op->slot] = NULL;
        /* Out of memory, a size beyond the device's included, is the trace not fitting. */
        if (status != VRAM_ENOMEM) {
          pass->failed_at = done;
          break;
        }
        if (oom_count++ == 0 && pass->report) {
          pass->report->first_oom_op = (int64_t)done;
          pass->report->first_oom_size = op->size;
          vram_oom_report(pool, pass->report->first_oom_report,
                          sizeof pass->report->first_oom_report);
          vram_oom_info(pool, &pass->report->first_oom_info);
          pass->report = NULL;
        }
        if (pass->stop_at_oom) break;
      }
    } else if (blocks[op->slot]) {
      status = vram_free(pool, blocks[op->slot]);
      blocks[op->slot] = NULL;
      if (status != VRAM_OK) {
        pass->failed_at = done;
        break;
      }
    }
  }
  *elapsed_ns = now_ns() - start;
  *ooms = oom_count;
  pass->failed_status = status;
  return done;
}

int vram_replay_pool_made(const vram_replay_result *result) {
  /* The pool's creation is the first OOM's op -1 (create_failed below). */
  return !result->failed_creating && !(result->ooms && result->first_oom_op < 0);
}

double vram_replay_reserved_over_live(const vram_replay_result *result) {
  if (!vram_replay_pool_made(result) || result->ooms || result->peak_live_bytes == 0) return 0.0;
  return (double)result->peak_reserved_bytes / (double)result->peak_live_bytes;
}

/* A pool that could not be made: a capacity below a preallocation counts as one OOM
 * (nothing fits at all), anything else fails the replay. */
static int create_failed(int status, const trace_t *trace, const vram_options_t *options,
                         _vram_replay_pass *pass, _vram_replay_run *run,
                         vram_replay_result *result) {
  if (status == VRAM_ENOMEM) {
    run->ooms = 1;
    if (pass->report) {
      pass->report->first_oom_op = -1;
      vram_pool_create_report(pass->report->first_oom_report,
                              sizeof pass->report->first_oom_report);
      vram_pool_create_oom_info(&pass->report->first_oom_info);
    }
    return VRAM_OK;
  }
  result->failed_creating = 1;
  fail(result, "cannot create a pool on source %s: %s (%s)", vram_source_name(options->source),
       vram_strerror(status), vram_errname(status));
  return status;
}

/* The cold pass in two parts when calls_after is asked, so that the timed loop is the same
 * loop either way; the count between them is read outside the timing. */
static size_t cold_pass(vram_pool_t *pool, const trace_t *trace, _vram_replay_pass *pass,
                        _vram_replay_run *run, double *elapsed) {
  size_t mark = pass->calls_after < trace->op_count ? pass->calls_after : trace->op_count;
  uint64_t ooms = 0;
  size_t done = run_ops(pool, trace, pass, 0, mark, &ooms, elapsed);
  uint64_t calls_at_mark = device_calls(pool);
  if (mark < trace->op_count && done == mark && pass->failed_at == SIZE_MAX &&
      !(pass->stop_at_oom && ooms)) {
    uint64_t more_ooms = 0;
    double more_elapsed = 0;
    done = run_ops(pool, trace, pass, mark, trace->op_count, &more_ooms, &more_elapsed);
    ooms += more_ooms;
    *elapsed += more_elapsed;
  }
  run->device_calls_after = device_calls(pool) - calls_at_mark;
  run->ooms = ooms;
  return done;
}

int _vram_replay_once(const trace_t *trace, const vram_options_t *options,
                      _vram_replay_pass *pass, _vram_replay_run *run,
                      vram_replay_result *result) {
  memset(run, 0, sizeof *run);
  /* What was asked, should the pool not come to be: AUTO resolved as the pool would have
   * resolved it, so the row names a source that exists. */
  if (_vram_resolve_source(options->source, &run->source) != VRAM_OK)
    run->source = options->source;
  pass->failed_at = SIZE_MAX;
  vram_pool_t *pool = NULL;
  /* Asked for, a pool on a host model is the process's own (no shared sim device, no
   * published record, no environment beyond the options): what it holds depends on them
   * alone. A replay on a GPU is a pool on a card others share, and behaves as one. */
  bool host_model = run->source == VRAM_SOURCE_SIM || run->source == VRAM_SOURCE_SIM_VMM;
  int status = host_model && pass->private_pools ? _vram_pool_create_private(&pool, options)
                                                 : vram_pool_create(&pool, options);
  if (status != VRAM_OK) return create_failed(status, trace, options, pass, run, result);
  run->source = vram_pool_source(pool);
  vram_stats_t stats;
  int64_t kept = vram_get_stats(pool, &stats) == VRAM_OK ? stats.reserved_bytes.current : 0;

  /* The driver needs real CUstreams and a replay has none to create, so GPU sources get
   * the legacy default stream for every op; sim takes the trace's numbers as they are. */
  int opaque_streams = !source_is_gpu(run->source);
  for (uint32_t i = 0; i < trace->stream_count; i++)
    pass->streams[i] = opaque_streams ? (vram_stream_t)(uintptr_t)trace->stream_ids[i] : NULL;
  memset(pass->blocks, 0, sizeof *pass->blocks * trace->slot_count);

  double elapsed = 0;
  size_t done = cold_pass(pool, trace, pass, run, &elapsed);
  uint64_t calls_before = 0;
  if (pass->warm && pass->failed_at == SIZE_MAX &&
      free_live(pool, trace, pass->blocks, result) == 0) {
    uint64_t warm_ooms = 0;
    calls_before = device_calls(pool);
    pass->report = NULL;
    done = run_ops(pool, trace, pass, 0, trace->op_count, &warm_ooms, &elapsed);
  }
  run->ns_per_op = done ? elapsed / (double)done : 0.0;

  int outcome = VRAM_OK;
  if (pass->failed_at != SIZE_MAX) {
    const trace_op_t *op = &trace->ops[pass->failed_at];
    fail(result, "%s: op %zu (%s %llu bytes) failed: %s (%s)", trace->name, pass->failed_at,
         op->is_alloc ? "allocate" : "free", (unsigned long long)op->size,
         vram_strerror(pass->failed_status), vram_errname(pass->failed_status));
    outcome = pass->failed_status;
  }
  if (vram_get_stats(pool, &stats) == VRAM_OK) {
    run->peak_reserved = (uint64_t)stats.reserved_bytes.peak;
    run->device_calls = stats.num_device_alloc + stats.num_device_free - calls_before;
  }
  if (pass->before_drain) pass->before_drain(pool, pass->context);
  int drained = drain_and_check(pool, trace, pass->blocks, kept, result);
  if (outcome == VRAM_OK) outcome = drained;
  status = vram_pool_destroy(pool);
  if (status != VRAM_OK) {
    fail(result, "%s: vram_pool_destroy: %s", trace->name, vram_strerror(status));
    vram_pool_destroy_force(pool);
    if (outcome == VRAM_OK) outcome = status;
  }
  return outcome;
}

/* The yardstick: one hash-table insert or delete per op, keyed by a fake block address
 * made from the slot (unique among live blocks, 512-byte aligned like real blocks). */
static __attribute__((noinline)) double baseline_once(const trace_t *trace, hashtab_t *table) {
  hashtab_clear(table);
  const trace_op_t *ops = trace->ops;
  const size_t op_count = trace->op_count;
  double start = now_ns();
  for (size_t i = 0; i < op_count; i++) {
    uint64_t fake_address = 0x7f0000000000ull + (uint64_t)ops[i].slot * 4096;
    if (ops[i].is_alloc) hashtab_insert(table, fake_address, ops[i].slot);
    else hashtab_remove(table, fake_address);
  }
  double elapsed = now_ns() - start;
  /* Reading the count keeps the compiler from discarding the loop's stores. */
  volatile size_t left = table->count;
  (void)left;
  return op_count ? elapsed / (double)op_count : 0.0;
}

/* The cold passes; the yardstick's alternate with them, so that both bests come from the
 * same seconds of the machine (timed apart, the ratio moved by half between two calls). */
static int cold_passes(const trace_t *trace, const vram_replay_options *opts,
                       const vram_options_t *options, _vram_replay_pass *pass,
                       hashtab_t *table, vram_replay_result *result) {
  int status = VRAM_OK;
  int repeat = opts->repeat > 0 ? opts->repeat : 1;
  for (int r = 0; r < repeat && status == VRAM_OK; r++) {
    _vram_replay_run run;
    pass->report = r == 0 ? result : NULL;
    pass->before_drain = r == repeat - 1 ? opts->before_drain : NULL;
    status = _vram_replay_once(trace, options, pass, &run, result);
    if (opts->baseline) {
      double ns = baseline_once(trace, table);
      if (r == 0 || ns < result->baseline_ns_per_op) result->baseline_ns_per_op = ns;
    }
    if (r == 0) {
      /* The first pass is the cold one; later ones only improve the time. */
      result->source = run.source;
      result->peak_reserved_bytes = run.peak_reserved;
      result->ooms = run.ooms;
      result->ns_per_op = run.ns_per_op;
      result->device_calls = run.device_calls;
      result->device_calls_after = run.device_calls_after;
    } else if (run.ns_per_op < result->ns_per_op) {
      result->ns_per_op = run.ns_per_op;
    }
  }
  pass->report = NULL;
  pass->before_drain = NULL;
  for (int r = 0; opts->warm && r < repeat && status == VRAM_OK; r++) {
    _vram_replay_run run;
    pass->warm = 1;
    pass->calls_after = SIZE_MAX;
    status = _vram_replay_once(trace, options, pass, &run, result);
    if (r == 0 || run.ns_per_op < result->ns_per_op_warm) result->ns_per_op_warm = run.ns_per_op;
    if (r == 0) result->device_calls_warm = run.device_calls;
  }
  return status;
}

int vram_replay_trace(const vram_replay_trace_t *handle, const vram_replay_options *opts,
                      vram_replay_result *result) {
  if (!handle || !opts || !result) return VRAM_EINVAL;
  const trace_t *trace = &handle->trace;
  vram_replay_describe(handle, result);
  _vram_replay_pass pass;
  if (_vram_replay_pass_init(&pass, trace) != 0) {
    fail(result, "%s: out of host memory", trace->name);
    return VRAM_EHOSTMEM;
  }
  vram_options_t options = opts->pool;
  if (opts->capacity) {
    options.limit_bytes = (size_t)opts->capacity;
    options.limit_fraction = 0;
    options.sim_capacity = (size_t)opts->capacity;
  }
  pass.calls_after = opts->calls_after < 0 ? SIZE_MAX : (size_t)opts->calls_after;
  pass.context = opts->context;
  pass.private_pools = opts->private_pools;
  hashtab_t table;
  int status = VRAM_OK, have_table = 0;
  if (opts->baseline) {
    have_table = hashtab_init(&table, trace->slot_count) == 0;
    if (!have_table) {
      fail(result, "%s: out of host memory", trace->name);
      status = VRAM_EHOSTMEM;
    }
  }
  if (status == VRAM_OK) status = cold_passes(trace, opts, &options, &pass, &table, result);
  if (have_table) hashtab_close(&table);
  _vram_replay_pass_close(&pass);
  if (status == VRAM_OK && opts->min_capacity) {
    vram_options_t family = opts->pool;
    family.source = result->source;
    status = vram_replay_min_capacity(handle, &family, result);
  }
  return status;
}

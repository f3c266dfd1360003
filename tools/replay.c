/* replay.c - `vramkit replay`: replay allocation traces through a pool and report peak
 * live bytes, peak reserved bytes, their ratio and the time per op, one row or one JSON
 * object per trace (the keys of that object are what scripts rely on; add, never rename).
 *
 * Each trace is parsed whole before anything runs (trace_io.c), then replayed on a fresh
 * pool per repetition with only the op loop under the clock. The allocator's own statistics
 * give peak reserved bytes; peak live bytes come from the trace, so the ratio does not
 * depend on what the allocator reports about itself. Every replay ends by freeing what is
 * left and checking that the pool got every byte back, so a replay doubles as a leak test.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "hashtab.h"
#include "reference.h"
#include "trace_io.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((uint64_t)1 << 20)
/* VRAM_TRACE_DEFAULT_MAX_OPS as the help text writes it. */
#define REPLAY_MAX_OPS_HELP "20,000,000"
_Static_assert(VRAM_TRACE_DEFAULT_MAX_OPS == 20000000ull, "REPLAY_MAX_OPS_HELP is stale");

static const char replay_usage[] =
    "usage: vramkit replay [options] TRACE...\n"
    "\n"
    "Replay allocation traces (format v1: gzip text, a first line '# vramkit-trace v1',\n"
    "then 'a ID SIZE STREAM T_US' and 'f ID STREAM T_US' lines) through a vramkit pool,\n"
    "and report peak live bytes, peak reserved bytes, their ratio, and the time per op of\n"
    "the replay loop alone. A free of an ID the trace never allocated (a block from before\n"
    "the recording) is skipped; stderr and the JSON key skipped_frees say how many.\n"
    "\n"
    "options:\n"
    "  --source S      sim (= sim:cuda), sim:vmm, cuda, vmm, managed or auto. Default: auto\n"
    "                  (VRAMKIT_SOURCE, else a GPU source if a CUDA driver is found, else sim).\n"
    "                  On sim the trace's stream numbers are passed as opaque streams. On the\n"
    "                  GPU sources every op runs on the legacy default stream (NULL): the\n"
    "                  command creates no CUDA streams, so a 2-stream trace runs on one GPU\n"
    "                  stream there; per-stream effects are measured on sim.\n"
    "  --capacity SIZE hard limit on reserved memory (and the sim device's capacity), e.g.\n"
    "                  14G. An op that runs out of memory is counted in 'ooms' and skipped\n"
    "                  (its later free is ignored), and the exit status is 1. Without it the\n"
    "                  sim device has " CLI_SIM_CAPACITY_HELP " (VRAMKIT_SIM_CAPACITY changes that).\n"
    "  --min-capacity  also find the smallest capacity under which the trace replays with no\n"
    "                  out-of-memory, by bisection to 1 MiB between peak live and 4x peak live,\n"
    "                  on the host model of the source's family (sim for sim/cuda/managed,\n"
    "                  sim:vmm for sim:vmm/vmm), whose capacity is at most 256 TiB: the search\n"
    "                  stops there, and a trace live past it has none.\n"
    "  --baseline      also time one open-addressing hash-table insert or delete per op over\n"
    "                  the same trace, a pass after each cold replay (best of --repeat), and\n"
    "                  report ns_per_op over that bare cost.\n"
    "  --warm          also time a warm replay: an untimed pass fills the cache, then a second\n"
    "                  pass on the same pool is timed (ns_per_op_warm); the steady state of a\n"
    "                  training loop, where ns_per_op includes growing a cold pool.\n"
    "  --repeat N      replays per trace, each on a fresh pool; the best time is reported\n"
    "                  (default 3).\n"
    "  --max-ops N     refuse a trace of more than N ops (allocations and frees; default\n"
    "                  " REPLAY_MAX_OPS_HELP "; 0: no limit). A trace is held in memory for\n"
    "                  the timed loop, 16 bytes an op, so a small gzip file of many repeated\n"
    "                  lines would otherwise take gigabytes; a trace of more than 65535\n"
    "                  streams is refused too.\n"
    "  --calls-after N also count the source calls of the cold pass that come after its\n"
    "                  first N ops (device_calls_after): 0 when a recorded training loop\n"
    "                  has settled by the step that starts at op N.\n"
    "  --json          one JSON object per trace per line instead of a table; it also gives\n"
    "                  device_calls (and device_calls_warm): the source's allocations and\n"
    "                  releases, i.e. driver calls on a GPU source, of the timed pass.\n"
    "  --summary       print vram_summary() after each trace's replay (before the final\n"
    "                  frees) and a fragmentation table at the end (to stderr with --json),\n"
    "                  beside PyTorch's figures for the same traces where they were measured.\n"
    "  --compare       the fragmentation table beside PyTorch's figures alone, without the\n"
    "                  summaries.\n"
    "  -h, --help      this text.\n"
    "\n"
    "SIZE is bytes, or a number with K/M/G/T (1024-based): 512M, 1.5G. The VRAMKIT_*\n"
    "environment variables apply first (`vramkit --help` lists them); the\n"
    "options override them.\n"
    "\n" CLI_EXIT_STATUS_HELP;

typedef struct replay_settings {
  vram_options_t options;
  int have_capacity;
  size_t capacity;
  int json, summary, compare, min_capacity, baseline, warm;
  long repeat;
  long calls_after; /* --calls-after: ops of the cold pass before the count; -1 = not asked */
  long max_ops;     /* --max-ops: the most ops a trace may have; 0 = no limit */
} replay_settings_t;

typedef struct replay_run {
  double ns_per_op;
  uint64_t device_calls; /* source allocations and releases (driver calls) in the timed pass */
  uint64_t device_calls_after; /* those of the cold pass after its first calls_after ops */
  uint64_t peak_reserved;
  uint64_t ooms;
  vram_source_kind source;
} replay_run_t;

typedef struct replay_result {
  const char *name;
  vram_source_kind source;
  size_t ops;
  size_t skipped_frees;           /* frees of ids the trace never allocated */
  uint64_t peak_live, peak_reserved, ooms;
  double ns_per_op;
  int have_min_capacity;          /* 1 found, 0 not asked, -1 no fit up to 4x peak live
                                     (or the sim's largest capacity), -2 nothing to search */
  uint64_t min_capacity;
  vram_source_kind min_capacity_source;
  double baseline_ns;             /* 0 when not asked */
  double warm_ns;                 /* 0 when not asked */
  uint64_t device_calls;          /* driver allocations + releases of the cold pass */
  uint64_t device_calls_warm;     /* the same for the warm pass, when asked */
  uint64_t device_calls_after;    /* the cold pass's after --calls-after ops, when asked */
} replay_result_t;

/* Per-trace scratch: the pointer of each slot and the stream of each trace stream. */
typedef struct replay_buffers {
  void **blocks;
  vram_stream_t *streams;
} replay_buffers_t;

static double ratio(uint64_t numerator, uint64_t denominator) {
  return denominator ? (double)numerator / (double)denominator : 0.0;
}

static const char *op_kind(const trace_op_t *op) { return op->is_alloc ? "allocate" : "free"; }

/* Free every block the replay left live (the trace's never-freed blocks, or those of an
 * interrupted run). Returns 0, or -1 after printing the first failure. */
static int free_live(vram_pool_t *pool, const trace_t *trace, void **blocks) {
  int failed = 0;
  for (uint32_t slot = 0; slot < trace->slot_count; slot++) {
    if (!blocks[slot]) continue;
    int status = vram_free(pool, blocks[slot]);
    blocks[slot] = NULL;
    if (status != VRAM_OK && !failed) {
      fprintf(stderr, "vramkit: %s: final free failed: %s\n", trace->name, vram_strerror(status));
      failed = 1;
    }
  }
  return failed ? -1 : 0;
}

/* Free what is still live, then check that the pool has every byte back and that
 * empty_cache returns everything to the source but `kept`, what the pool held from its
 * creation (a preallocation, VRAMKIT_PREALLOCATE, which empty_cache leaves alone). */
static int drain_and_check(vram_pool_t *pool, const trace_t *trace, void **blocks,
                           int64_t kept) {
  int failed = free_live(pool, trace, blocks) != 0;
  vram_stats_t stats;
  int status = vram_get_stats(pool, &stats);
  if (status != VRAM_OK) {
    fprintf(stderr, "vramkit: %s: vram_get_stats: %s\n", trace->name, vram_strerror(status));
    return CLI_EXIT_FAILURE;
  }
  if (stats.allocated_bytes.current != 0 || stats.allocation.current != 0) {
    fprintf(stderr,
            "vramkit: %s: bytes not returned: after freeing every block the pool still counts "
            "%lld bytes in %lld allocations\n",
            trace->name, (long long)stats.allocated_bytes.current,
            (long long)stats.allocation.current);
    failed = 1;
  }
  status = vram_empty_cache(pool);
  if (status == VRAM_OK) status = vram_get_stats(pool, &stats);
  if (status != VRAM_OK) {
    fprintf(stderr, "vramkit: %s: vram_empty_cache: %s\n", trace->name, vram_strerror(status));
    return CLI_EXIT_FAILURE;
  }
  if (stats.reserved_bytes.current > kept) {
    fprintf(stderr,
            "vramkit: %s: memory not released: %lld bytes still reserved after "
            "vram_empty_cache with nothing allocated (%lld held from the start)\n",
            trace->name, (long long)stats.reserved_bytes.current, (long long)kept);
    failed = 1;
  }
  return failed ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
}

/* Ops [from, to) of a pass: the timed loop. OOMs are counted and the op skipped (its free
 * is then ignored, since the slot stays NULL); with stop_at_oom the pass ends at the
 * first. Any other error ends the pass with *failed_at set. Returns the index it reached:
 * `to` unless it ended early. */
static size_t run_ops(vram_pool_t *pool, const trace_t *trace, replay_buffers_t *buffers,
                      size_t from, size_t to, int stop_at_oom, int report_oom, uint64_t *ooms,
                      size_t *failed_at, int *failed_status, double *elapsed_ns) {
  const trace_op_t *ops = trace->ops;
  void **blocks = buffers->blocks;
  vram_stream_t *streams = buffers->streams;
  uint64_t oom_count = 0;
  size_t done = from;
  int status = VRAM_OK;
  *failed_at = SIZE_MAX;
  double start = cli_now_ns();
  for (; done < to; done++) {
    const trace_op_t *op = &ops[done];
    if (op->is_alloc) {
      status = vram_malloc(pool, (size_t)op->size, streams[op->stream], &blocks[op->slot]);
      if (status != VRAM_OK) {
        blocks[op->slot] = NULL;
        /* Out of memory, a size beyond the device's included, is the trace not fitting:
         * counted, with the pool's report of why, and exit status 1. */
        if (status != VRAM_ENOMEM) {
          *failed_at = done;
          break;
        }
        if (oom_count++ == 0 && report_oom) {
          fprintf(stderr, "vramkit: %s: op %zu (allocate %llu bytes) ran out of memory:\n",
                  trace->name, done, (unsigned long long)op->size);
          cli_print_oom_report(pool);
        }
        if (stop_at_oom) break;
      }
    } else if (blocks[op->slot]) {
      status = vram_free(pool, blocks[op->slot]);
      blocks[op->slot] = NULL;
      if (status != VRAM_OK) {
        *failed_at = done;
        break;
      }
    }
  }
  *elapsed_ns = cli_now_ns() - start;
  *ooms = oom_count;
  *failed_status = status;
  return done;
}

/* One replay of the whole trace on a fresh pool. OOMs are counted, not failures; with
 * stop_at_oom the replay ends at the first (the bisection only needs to know whether one
 * happens). report_oom prints the first OOM's report; summary_out, when set, receives
 * vram_summary() before the final frees. calls_after (SIZE_MAX: none) is the op from which
 * the cold pass's run->device_calls_after counts. With warm, an untimed first pass fills
 * the cache and a second pass on the same pool is the one timed. Returns a CLI_EXIT_*
 * status. */
static int replay_once(const trace_t *trace, const vram_options_t *options, int stop_at_oom,
                       int report_oom, int warm, size_t calls_after, FILE *summary_out,
                       replay_buffers_t *buffers, replay_run_t *run) {
  memset(run, 0, sizeof *run);
  vram_pool_t *pool = NULL;
  int status = vram_pool_create(&pool, options);
  if (status == VRAM_ENOMEM) {
    /* A capacity below a preallocation: nothing fits at all. */
    run->ooms = 1;
    if (report_oom) {
      fprintf(stderr, "vramkit: %s: out of memory creating the pool: its preallocation "
                      "(VRAMKIT_PREALLOCATE='%s') does not fit:\n",
              trace->name, getenv("VRAMKIT_PREALLOCATE") ? getenv("VRAMKIT_PREALLOCATE") : "");
      cli_print_create_report();
    }
    return CLI_EXIT_OK;
  }
  if (status != VRAM_OK) {
    cli_report_pool_error(status, options);
    return CLI_EXIT_FAILURE;
  }
  run->source = vram_pool_source(pool);
  vram_stats_t stats;
  int64_t kept = vram_get_stats(pool, &stats) == VRAM_OK ? stats.reserved_bytes.current : 0;

  /* The driver needs real CUstreams; without the toolkit we have none to create, so GPU
   * sources get the legacy default stream for every op (see the usage text). */
  int opaque_streams = !cli_source_is_gpu(run->source);
  for (uint32_t i = 0; i < trace->stream_count; i++)
    buffers->streams[i] = opaque_streams ? (vram_stream_t)(uintptr_t)trace->stream_ids[i] : NULL;
  memset(buffers->blocks, 0, sizeof *buffers->blocks * trace->slot_count);

  uint64_t ooms = 0;
  size_t failed_at = SIZE_MAX;
  double elapsed = 0;
  /* With calls_after the cold pass runs in two parts, so that the timed loop is the same
   * loop either way; the count between them is read outside the timing. */
  size_t mark = calls_after < trace->op_count ? calls_after : trace->op_count;
  size_t done = run_ops(pool, trace, buffers, 0, mark, stop_at_oom, report_oom, &ooms,
                        &failed_at, &status, &elapsed);
  uint64_t calls_at_mark = cli_device_calls(pool);
  if (mark < trace->op_count && done == mark && failed_at == SIZE_MAX &&
      !(stop_at_oom && ooms)) {
    uint64_t more_ooms = 0;
    double more_elapsed = 0;
    done = run_ops(pool, trace, buffers, mark, trace->op_count, stop_at_oom,
                   report_oom && !ooms, &more_ooms, &failed_at, &status, &more_elapsed);
    ooms += more_ooms;
    elapsed += more_elapsed;
  }
  run->device_calls_after = cli_device_calls(pool) - calls_at_mark;
  uint64_t calls_before = 0;
  if (warm && failed_at == SIZE_MAX && free_live(pool, trace, buffers->blocks) == 0) {
    uint64_t warm_ooms = 0;
    calls_before = cli_device_calls(pool);
    done = run_ops(pool, trace, buffers, 0, trace->op_count, stop_at_oom, 0, &warm_ooms,
                   &failed_at, &status, &elapsed);
  }
  run->ns_per_op = done ? elapsed / (double)done : 0.0;
  run->ooms = ooms;

  int result = CLI_EXIT_OK;
  if (failed_at != SIZE_MAX) {
    const trace_op_t *op = &trace->ops[failed_at];
    fprintf(stderr, "vramkit: %s: op %zu (%s %llu bytes) failed: %s (%s)\n", trace->name,
            failed_at, op_kind(op), (unsigned long long)op->size, vram_strerror(status),
            vram_errname(status));
    result = CLI_EXIT_FAILURE;
  }
  if (vram_get_stats(pool, &stats) == VRAM_OK) {
    run->peak_reserved = (uint64_t)stats.reserved_bytes.peak;
    run->device_calls = stats.num_device_alloc + stats.num_device_free - calls_before;
  }
  if (summary_out) {
    fprintf(summary_out, "== %s on %s\n", trace->name, vram_source_name(run->source));
    cli_print_summary(pool, summary_out);
  }
  int drained = drain_and_check(pool, trace, buffers->blocks, kept);
  if (result == CLI_EXIT_OK) result = drained;
  status = vram_pool_destroy(pool);
  if (status != VRAM_OK) {
    fprintf(stderr, "vramkit: %s: vram_pool_destroy: %s\n", trace->name, vram_strerror(status));
    vram_pool_destroy_force(pool);
    result = CLI_EXIT_FAILURE;
  }
  return result;
}

/* Does the trace replay with no OOM when capacity bounds the source of `family`? */
static int fits_under(const trace_t *trace, const vram_options_t *family, uint64_t capacity,
                      replay_buffers_t *buffers, int *fits) {
  vram_options_t options = *family;
  options.sim_capacity = (size_t)capacity;
  options.limit_bytes = (size_t)capacity;
  options.limit_fraction = 0;
  replay_run_t run;
  int result = replay_once(trace, &options, 1, 0, 0, SIZE_MAX, NULL, buffers, &run);
  *fits = run.ooms == 0;
  return result;
}

/* Smallest capacity, to 1 MiB, under which the trace fits; found = -1 if even the top
 * (4x peak live, or the largest capacity the sim models if that is less) does not, -2 if
 * peak live is past that largest capacity, so that there is nothing to search. Bisection
 * keeps `high` fitting and `low` not fitting, both in MiB. */
static int find_min_capacity(const trace_t *trace, const vram_options_t *family,
                             replay_buffers_t *buffers, uint64_t *min_capacity, int *found) {
  const uint64_t most = VRAM_SIM_MAX_CAPACITY;
  if (trace->peak_live_bytes > most) {
    fprintf(stderr,
            "vramkit replay: %s: peak live bytes, %llu bytes, are past the largest capacity "
            "the sim models (%llu bytes, 256 TiB): no capacity to search\n",
            trace->name, (unsigned long long)trace->peak_live_bytes, (unsigned long long)most);
    *found = -2;
    *min_capacity = 0;
    return CLI_EXIT_OK;
  }
  /* Peak live is at most 2^48 here: four times it cannot overflow. */
  uint64_t low = trace->peak_live_bytes / MIB;
  uint64_t high = (4 * trace->peak_live_bytes + MIB - 1) / MIB;
  if (high > most / MIB) high = most / MIB;
  int fits = 0;
  int result;
  *found = 1;
  if (trace->peak_live_bytes == 0) {
    *min_capacity = 0;
    return CLI_EXIT_OK;
  }
  if ((result = fits_under(trace, family, high * MIB, buffers, &fits)) != CLI_EXIT_OK) return result;
  if (!fits) {
    *found = -1;
    *min_capacity = 0;
    return CLI_EXIT_OK;
  }
  if (low > 0) {
    if ((result = fits_under(trace, family, low * MIB, buffers, &fits)) != CLI_EXIT_OK)
      return result;
    if (fits) high = low;
  }
  while (high - low > 1) {
    uint64_t middle = low + (high - low) / 2;
    if ((result = fits_under(trace, family, middle * MIB, buffers, &fits)) != CLI_EXIT_OK)
      return result;
    if (fits) high = middle;
    else low = middle;
  }
  *min_capacity = high * MIB;
  return CLI_EXIT_OK;
}

/* The yardstick: one hash-table insert or delete per op, keyed by a fake block address
 * made from the slot (unique among live blocks, 512-byte aligned like real blocks). */
static __attribute__((noinline)) double baseline_once(const trace_t *trace, hashtab_t *table) {
  hashtab_clear(table);
  const trace_op_t *ops = trace->ops;
  const size_t op_count = trace->op_count;
  double start = cli_now_ns();
  for (size_t i = 0; i < op_count; i++) {
    uint64_t fake_address = 0x7f0000000000ull + (uint64_t)ops[i].slot * 4096;
    if (ops[i].is_alloc) hashtab_insert(table, fake_address, ops[i].slot);
    else hashtab_remove(table, fake_address);
  }
  double elapsed = cli_now_ns() - start;
  /* Reading the count keeps the compiler from discarding the loop's stores. */
  volatile size_t left = table->count;
  (void)left;
  return op_count ? elapsed / (double)op_count : 0.0;
}

static void print_table_header(const replay_settings_t *settings) {
  printf("%-20s %-8s %8s %12s %14s %9s %8s %5s", "trace", "source", "ops", "peak live",
         "peak reserved", "res/live", "ns/op", "ooms");
  if (settings->min_capacity) printf(" %12s %9s", "min cap", "cap/live");
  if (settings->warm) printf(" %10s", "warm ns/op");
  if (settings->baseline) printf(" %11s %10s", "baseline ns", "x baseline");
  if (settings->calls_after >= 0) printf(" %11s", "calls after");
  printf("\n");
}

static void print_mib(uint64_t bytes, int width) {
  char text[32];
  snprintf(text, sizeof text, "%.1f MiB", (double)bytes / (double)MIB);
  printf(" %*s", width, text);
}

static void print_result_row(const replay_settings_t *settings, const replay_result_t *r) {
  printf("%-20s %-8s %8zu", r->name, vram_source_name(r->source), r->ops);
  print_mib(r->peak_live, 12);
  print_mib(r->peak_reserved, 14);
  printf(" %9.3f %8.1f %5llu", ratio(r->peak_reserved, r->peak_live), r->ns_per_op,
         (unsigned long long)r->ooms);
  if (settings->min_capacity) {
    if (r->have_min_capacity > 0) {
      print_mib(r->min_capacity, 12);
      printf(" %9.3f", ratio(r->min_capacity, r->peak_live));
    } else if (r->have_min_capacity == -1) {
      printf(" %12s %9s", r->peak_live > VRAM_SIM_MAX_CAPACITY / 4 ? "> sim max" : "> 4x live",
             "-");
    } else {
      printf(" %12s %9s", "-", "-");
    }
  }
  if (settings->warm) printf(" %10.1f", r->warm_ns);
  if (settings->baseline)
    printf(" %11.1f %10.2f", r->baseline_ns,
           r->baseline_ns > 0 ? r->ns_per_op / r->baseline_ns : 0.0);
  if (settings->calls_after >= 0) printf(" %11llu", (unsigned long long)r->device_calls_after);
  printf("\n");
  fflush(stdout);
}

static void print_result_json(const replay_settings_t *settings, const replay_result_t *r) {
  printf("{\"trace\": ");
  cli_json_string(stdout, r->name);
  printf(", \"source\": ");
  cli_json_string(stdout, vram_source_name(r->source));
  printf(", \"ops\": %zu, \"peak_live_bytes\": %llu, \"peak_reserved_bytes\": %llu, "
         "\"reserved_over_live\": %.3f, \"ns_per_op\": %.1f, \"ooms\": %llu",
         r->ops, (unsigned long long)r->peak_live, (unsigned long long)r->peak_reserved,
         ratio(r->peak_reserved, r->peak_live), r->ns_per_op, (unsigned long long)r->ooms);
  printf(", \"skipped_frees\": %zu", r->skipped_frees);
  if (settings->have_capacity)
    printf(", \"capacity_bytes\": %llu", (unsigned long long)settings->capacity);
  printf(", \"repeat\": %ld", settings->repeat);
  if (settings->min_capacity) {
    if (r->have_min_capacity > 0)
      printf(", \"min_capacity_bytes\": %llu, \"min_capacity_over_live\": %.3f",
             (unsigned long long)r->min_capacity, ratio(r->min_capacity, r->peak_live));
    else
      printf(", \"min_capacity_bytes\": null, \"min_capacity_over_live\": null");
    printf(", \"min_capacity_source\": ");
    cli_json_string(stdout, vram_source_name(r->min_capacity_source));
  }
  printf(", \"device_calls\": %llu", (unsigned long long)r->device_calls);
  if (settings->calls_after >= 0)
    printf(", \"calls_after_op\": %ld, \"device_calls_after\": %llu", settings->calls_after,
           (unsigned long long)r->device_calls_after);
  if (settings->warm)
    printf(", \"ns_per_op_warm\": %.1f, \"device_calls_warm\": %llu", r->warm_ns,
           (unsigned long long)r->device_calls_warm);
  if (settings->baseline) {
    printf(", \"baseline_ns_per_op\": %.2f, \"ns_over_baseline\": %.2f", r->baseline_ns,
           r->baseline_ns > 0 ? r->ns_per_op / r->baseline_ns : 0.0);
    if (settings->warm)
      printf(", \"warm_over_baseline\": %.2f", r->baseline_ns > 0 ? r->warm_ns / r->baseline_ns : 0.0);
  }
  printf("}\n");
  fflush(stdout);
}

static void print_fragmentation_table(FILE *out, const replay_result_t *results, size_t count) {
  fprintf(out, "\nFragmentation: peak reserved over peak live\n");
  fprintf(out, "%-20s %-8s %14s %14s %9s %16s %20s\n", "trace", "source", "peak live",
          "peak reserved", "vramkit", "PyTorch native", "PyTorch expandable");
  for (size_t i = 0; i < count; i++) {
    const replay_result_t *r = &results[i];
    char live[32], reserved[32], native[16] = "-", expandable[16] = "-";
    snprintf(live, sizeof live, "%.1f MiB", (double)r->peak_live / (double)MIB);
    snprintf(reserved, sizeof reserved, "%.1f MiB", (double)r->peak_reserved / (double)MIB);
    const reference_figures_t *reference = reference_lookup(r->name);
    if (reference) {
      snprintf(native, sizeof native, "%.3f", reference->native);
      snprintf(expandable, sizeof expandable, "%.3f", reference->expandable);
    }
    fprintf(out, "%-20s %-8s %14s %14s %9.3f %16s %20s\n", r->name,
            vram_source_name(r->source), live, reserved, ratio(r->peak_reserved, r->peak_live),
            native, expandable);
  }
  fprintf(out, "PyTorch's figures, for reference: %s.\n", reference_provenance);
}

/* Replay one parsed trace as the settings ask and fill *result. */
static int replay_trace(const replay_settings_t *settings, const trace_t *trace,
                        replay_result_t *result) {
  replay_buffers_t buffers;
  buffers.blocks = calloc(trace->slot_count ? trace->slot_count : 1, sizeof *buffers.blocks);
  buffers.streams = calloc(trace->stream_count ? trace->stream_count : 1, sizeof *buffers.streams);
  if (!buffers.blocks || !buffers.streams) {
    free(buffers.blocks);
    free(buffers.streams);
    fprintf(stderr, "vramkit: %s: out of host memory\n", trace->name);
    return CLI_EXIT_FAILURE;
  }
  memset(result, 0, sizeof *result);
  result->name = trace->name;
  result->ops = trace->op_count;
  result->skipped_frees = trace->unmatched_frees;
  result->peak_live = trace->peak_live_bytes;

  vram_options_t options = settings->options;
  if (settings->have_capacity) {
    options.limit_bytes = settings->capacity;
    options.limit_fraction = 0;
    options.sim_capacity = settings->capacity;
  }
  FILE *summary_out = settings->json ? stderr : stdout;
  size_t calls_after = settings->calls_after < 0 ? SIZE_MAX : (size_t)settings->calls_after;
  int status = CLI_EXIT_OK;
  /* The yardstick's passes alternate with the pool's cold ones, so that both bests come
   * from the same seconds of the machine: timed apart (the yardstick after the bisection),
   * one trace's ratio on the GPU machine's CPU moved from 8.5 to 16.3 between two calls of
   * one tree. */
  hashtab_t table;
  if (settings->baseline && hashtab_init(&table, trace->slot_count) != 0) {
    fprintf(stderr, "vramkit: %s: out of host memory\n", trace->name);
    free(buffers.blocks);
    free(buffers.streams);
    return CLI_EXIT_FAILURE;
  }
  for (long r = 0; r < settings->repeat && status == CLI_EXIT_OK; r++) {
    replay_run_t run;
    int last = r == settings->repeat - 1;
    status = replay_once(trace, &options, 0, r == 0, 0, calls_after,
                         settings->summary && last ? summary_out : NULL, &buffers, &run);
    if (settings->baseline) {
      double ns = baseline_once(trace, &table);
      if (r == 0 || ns < result->baseline_ns) result->baseline_ns = ns;
    }
    if (r == 0) {
      /* The first run is the cold one; later ones only improve the time. */
      result->source = run.source;
      result->peak_reserved = run.peak_reserved;
      result->ooms = run.ooms;
      result->ns_per_op = run.ns_per_op;
      result->device_calls = run.device_calls;
      result->device_calls_after = run.device_calls_after;
    } else if (run.ns_per_op < result->ns_per_op) {
      result->ns_per_op = run.ns_per_op;
    }
  }

  for (long r = 0; settings->warm && r < settings->repeat && status == CLI_EXIT_OK; r++) {
    replay_run_t run;
    status = replay_once(trace, &options, 0, 0, 1, SIZE_MAX, NULL, &buffers, &run);
    if (r == 0 || run.ns_per_op < result->warm_ns) result->warm_ns = run.ns_per_op;
    if (r == 0) result->device_calls_warm = run.device_calls;
  }

  if (status == CLI_EXIT_OK && settings->min_capacity) {
    int vmm_family = result->source == VRAM_SOURCE_VMM || result->source == VRAM_SOURCE_SIM_VMM;
    vram_options_t family = settings->options;
    family.source = vmm_family ? VRAM_SOURCE_SIM_VMM : VRAM_SOURCE_SIM;
    /* Managed memory has no virtual ranges to grow into: its model is fixed segments. */
    if (result->source == VRAM_SOURCE_MANAGED) {
      family.virtual_threshold = 1.0;
      family.large_blocks = VRAM_LARGE_FIXED;
    }
    result->min_capacity_source = family.source;
    status = find_min_capacity(trace, &family, &buffers, &result->min_capacity,
                               &result->have_min_capacity);
  }

  if (settings->baseline) hashtab_close(&table);
  free(buffers.blocks);
  free(buffers.streams);
  return status;
}

/* What the command line asked for: settings, the trace paths, or only the help. */
typedef enum replay_parse { REPLAY_RUN, REPLAY_HELP, REPLAY_USAGE_ERROR } replay_parse_t;

/* The options that take no value; returns 0 if arg is none of them. */
static int parse_flag(const char *arg, replay_settings_t *settings) {
  const struct {
    const char *name;
    int *target;
  } flags[] = {
      {"--json", &settings->json},
      {"--summary", &settings->summary},
      {"--compare", &settings->compare},
      {"--min-capacity", &settings->min_capacity},
      {"--baseline", &settings->baseline},
      {"--warm", &settings->warm},
  };
  for (size_t k = 0; k < sizeof flags / sizeof *flags; k++) {
    if (strcmp(arg, flags[k].name) == 0) {
      *flags[k].target = 1;
      return 1;
    }
  }
  return 0;
}

/* The options that take a value. Returns 1 if arg was one of them (advancing *i past its
 * value), 0 if not, -1 after printing what is wrong with it. */
static int parse_valued(int argc, char **argv, int *i, replay_settings_t *settings,
                        int *have_source, vram_source_kind *source) {
  const char *value = NULL;
  int matched;
  if ((matched = cli_option_value(argc, argv, i, "--source", &value)) != 0) {
    if (matched < 0 || cli_parse_source(value, source) != 0) return -1;
    *have_source = 1;
    return 1;
  }
  if ((matched = cli_option_value(argc, argv, i, "--capacity", &value)) != 0) {
    if (matched < 0 || cli_parse_size("--capacity", value, &settings->capacity) != 0) return -1;
    if (settings->capacity == 0) {
      fprintf(stderr, "vramkit: --capacity must be more than 0\n");
      return -1;
    }
    settings->have_capacity = 1;
    return 1;
  }
  if ((matched = cli_option_value(argc, argv, i, "--calls-after", &value)) != 0) {
    if (matched < 0 ||
        cli_parse_long("--calls-after", value, 0, LONG_MAX, &settings->calls_after) != 0)
      return -1;
    return 1;
  }
  if ((matched = cli_option_value(argc, argv, i, "--max-ops", &value)) != 0) {
    if (matched < 0 || cli_parse_long("--max-ops", value, 0, LONG_MAX, &settings->max_ops) != 0)
      return -1;
    return 1;
  }
  if ((matched = cli_option_value(argc, argv, i, "--repeat", &value)) != 0) {
    if (matched < 0 || cli_parse_long("--repeat", value, 1, 1000, &settings->repeat) != 0)
      return -1;
    return 1;
  }
  return 0;
}

/* Fill settings and paths (room for argc entries) from the command line. */
static replay_parse_t parse_replay_args(int argc, char **argv, replay_settings_t *settings,
                                        const char **paths, size_t *path_count) {
  memset(settings, 0, sizeof *settings);
  settings->repeat = 3;
  settings->calls_after = -1;
  settings->max_ops = (long)VRAM_TRACE_DEFAULT_MAX_OPS;
  int have_source = 0, options_done = 0;
  vram_source_kind source = VRAM_SOURCE_AUTO;
  *path_count = 0;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (options_done || arg[0] != '-' || arg[1] == '\0') {
      paths[(*path_count)++] = arg;
      continue;
    }
    if (strcmp(arg, "--") == 0) {
      options_done = 1;
      continue;
    }
    if (cli_is_help(arg)) return REPLAY_HELP;
    if (parse_flag(arg, settings)) continue;
    int matched = parse_valued(argc, argv, &i, settings, &have_source, &source);
    if (matched < 0) return REPLAY_USAGE_ERROR;
    if (matched == 0) {
      fprintf(stderr, "vramkit replay: unknown option '%s' (see vramkit replay --help)\n", arg);
      return REPLAY_USAGE_ERROR;
    }
  }
  if (*path_count == 0) {
    fprintf(stderr, "vramkit replay: no trace given (see vramkit replay --help)\n");
    return REPLAY_USAGE_ERROR;
  }
  if (cli_base_options(&settings->options, have_source, source) != 0) return REPLAY_USAGE_ERROR;
  return REPLAY_RUN;
}

/* Parse every trace before replaying any: a bad file is reported before minutes of replay,
 * not after. *loaded counts the traces to free afterwards. Returns a CLI_EXIT_* status. */
static int load_traces(const char **paths, size_t path_count, long max_ops, trace_t *traces,
                       size_t *loaded) {
  for (*loaded = 0; *loaded < path_count; (*loaded)++) {
    char error[1024];
    trace_t *trace = &traces[*loaded];
    int rc = trace_load(paths[*loaded], (uint64_t)max_ops, trace, error, sizeof error);
    if (rc != TRACE_OK) {
      fprintf(stderr, "vramkit replay: %s%s\n", error,
              rc == TRACE_ELIMIT && max_ops ? " (--max-ops N raises the limit)" : "");
      return rc == TRACE_ENOMEM ? CLI_EXIT_FAILURE : CLI_EXIT_BAD_TRACE;
    }
    if (trace->peak_live_bytes == UINT64_MAX)
      fprintf(stderr,
              "vramkit replay: %s: live bytes reach 2^64 - 1 or more; peak live bytes are "
              "shown saturated at %llu\n",
              paths[*loaded], (unsigned long long)UINT64_MAX);
    if (trace->unmatched_frees)
      fprintf(stderr,
              "vramkit replay: %s: skipped %zu free%s of IDs the trace never allocated "
              "(blocks from before the recording began)\n",
              paths[*loaded], trace->unmatched_frees, trace->unmatched_frees == 1 ? "" : "s");
  }
  return CLI_EXIT_OK;
}

/* Replay every trace and print what the settings ask for. Rows go out as each trace
 * finishes, except that with --summary in text mode the summaries come first and the
 * table after them, so that neither breaks up the other. */
static int replay_all(const replay_settings_t *settings, const trace_t *traces, size_t count,
                      replay_result_t *results) {
  int status = CLI_EXIT_OK, any_oom = 0;
  size_t replayed = 0;
  int rows_as_we_go = !settings->json && !settings->summary;
  for (; replayed < count; replayed++) {
    status = replay_trace(settings, &traces[replayed], &results[replayed]);
    if (status != CLI_EXIT_OK) return status;
    if (results[replayed].ooms) any_oom = 1;
    if (settings->json) {
      print_result_json(settings, &results[replayed]);
    } else if (rows_as_we_go) {
      /* The header waits for the first row, so that an early error stands alone. */
      if (replayed == 0) print_table_header(settings);
      print_result_row(settings, &results[replayed]);
    }
  }
  if (!settings->json && settings->summary) {
    printf("\n");
    print_table_header(settings);
    for (size_t i = 0; i < replayed; i++) print_result_row(settings, &results[i]);
  }
  if (settings->summary || settings->compare)
    print_fragmentation_table(settings->json ? stderr : stdout, results, replayed);
  return any_oom ? CLI_EXIT_OOM : CLI_EXIT_OK;
}

int cmd_replay(int argc, char **argv) {
  replay_settings_t settings;
  size_t path_count = 0;
  const char **paths = calloc((size_t)argc, sizeof *paths);
  if (!paths) return CLI_EXIT_FAILURE;
  replay_parse_t parsed = parse_replay_args(argc, argv, &settings, paths, &path_count);
  if (parsed != REPLAY_RUN) {
    if (parsed == REPLAY_HELP) fputs(replay_usage, stdout);
    free(paths);
    return parsed == REPLAY_HELP ? CLI_EXIT_OK : CLI_EXIT_USAGE;
  }
  trace_t *traces = calloc(path_count, sizeof *traces);
  replay_result_t *results = calloc(path_count, sizeof *results);
  int status = CLI_EXIT_FAILURE;
  size_t loaded = 0;
  if (traces && results) {
    status = load_traces(paths, path_count, settings.max_ops, traces, &loaded);
    if (status == CLI_EXIT_OK) status = replay_all(&settings, traces, path_count, results);
  } else {
    fprintf(stderr, "vramkit replay: out of host memory\n");
  }
  for (size_t i = 0; i < loaded; i++) trace_free(&traces[i]);
  free(traces);
  free(results);
  free(paths);
  return status;
}

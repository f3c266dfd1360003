/* bench.c - `vramkit bench`: the allocator's micro-benchmarks.
 *
 *   random  the random workload (workload.c): the op sequence that PyTorch's allocator and
 *           cudaMallocAsync were also measured on, so that the figures compare directly;
 *   pair    alloc+free of one cached size, timed as PyTorch's raw_alloc/raw_delete pair
 *           was timed for comparison: warm-up, then the median of five batches;
 *   scale   cost per op with 1,000 and with 1,000,000 live blocks, which is where a linear
 *           scan or a tree that grows deep would show (the aim: within 2x).
 * Only the op loops are timed; ops and sizes are generated beforehand.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "hashtab.h"
#include "reference.h"
#include "workload.h"

#include <stdlib.h>
#include <string.h>

#define MIB ((uint64_t)1 << 20)
#define PAIR_MAX_SIZES 32
#define PAIR_BATCHES 5
#define PAIR_WARMUP 1000
#define PAIR_WARMUP_NS 2e8 /* 0.2 s */
#define RANDOM_PASSES 3
#define SCALE_PASSES 3
#define SCALE_MIN_SIZE ((size_t)256)
#define SCALE_MAX_SIZE ((size_t)256 << 10)

static const char bench_usage[] =
    "usage: vramkit bench COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  random  the random workload (200,000 ops, <= 1,000 live, sizes log-uniform\n"
    "          256 B..32 MiB, seed 42), the op sequence PyTorch was measured on too\n"
    "  pair    alloc+free of a cached size, ns per pair\n"
    "  scale   ns per op with 1,000 and with 1,000,000 live blocks, and their ratio\n"
    "\n"
    "vramkit bench COMMAND --help describes each one.\n"
    "\n" CLI_EXIT_STATUS_HELP;

static const char random_usage[] =
    "usage: vramkit bench random [--source S] [--json]\n"
    "\n"
    "Run the random workload: 200,000 decisions (allocate with probability 1/2 while\n"
    "between 0 and 1,000 blocks are live), sizes log-uniform from 256 B to 32 MiB from an\n"
    "xorshift64 generator with seed 42, then frees of what is left; the same op sequence\n"
    "that PyTorch's caching allocator was measured on. Three passes on one pool; prints the\n"
    "best ns per op, peak reserved over peak live (the aim: at most 1.15) beside PyTorch's\n"
    "figure, and the source calls (driver calls on a GPU) of the first and of the last pass.\n"
    "The sim device has " CLI_SIM_CAPACITY_HELP " unless VRAMKIT_SIM_CAPACITY says otherwise.\n"
    "VRAMKIT_* variables apply: VRAMKIT_TIGHT_THRESHOLD=0 measures tight placement.\n"
    "\n"
    "  --source S  sim, sim:vmm, cuda, vmm, managed or auto (default auto); every op runs on\n"
    "              the default stream.\n"
    "  --json      one JSON object instead of text.\n"
    "\n" CLI_EXIT_STATUS_HELP;

static const char pair_usage[] =
    "usage: vramkit bench pair [--source S] [--sizes LIST] [--pairs N] [--history]\n"
    "                          [--history-entries N] [--json]\n"
    "\n"
    "For each size: warm-up pairs (1,000, and 0.2 s at least), then 5 batches of N\n"
    "vram_malloc+vram_free pairs of that size on the default stream; prints the median\n"
    "batch's ns per pair, timed as PyTorch's raw_alloc and raw_delete pair was timed for\n"
    "comparison. A size larger than the device holds is out of memory (exit status 1).\n"
    "\n"
    "  --source S    sim, sim:vmm, cuda, vmm, managed or auto (default auto).\n"
    "  --sizes LIST  comma-separated sizes with K/M/G suffixes (default 512,64K,2M,64M).\n"
    "  --pairs N     pairs per batch (default 200000).\n"
    "  --history     record memory history (vram_history_start, no contexts) while timing,\n"
    "                to measure what recording adds to a pair.\n"
    "  --history-entries N\n"
    "                the ring's max_entries under --history (default 0: the library's\n"
    "                100,000, 32 bytes a slot), to see what the ring's size costs.\n"
    "  --json        one JSON object per size instead of text.\n"
    "\n" CLI_EXIT_STATUS_HELP;

static const char scale_usage[] =
    "usage: vramkit bench scale [--source S] [--small N] [--large N] [--ops N] [--json]\n"
    "\n"
    "Fill a pool with N live blocks (sizes log-uniform 256 B..256 KiB), then time a steady\n"
    "mix that frees a random live block and allocates a new one in its place, so the live\n"
    "count stays N. Done for a small and a large N; prints ns per op for both and the\n"
    "large-over-small ratio (the aim: within 2x). The same loop with a hash-table\n"
    "delete and insert per step in place of free and malloc is timed beside it, to show how\n"
    "much of the growth is cache misses that any pointer map pays.\n"
    "\n"
    "  --source S  default sim with an " CLI_SIM_CAPACITY_HELP " device (this measures the engine, not\n"
    "              a GPU); VRAMKIT_SIM_CAPACITY resizes it.\n"
    "  --small N   live blocks of the small case (default 1000).\n"
    "  --large N   live blocks of the large case (default 1000000).\n"
    "  --ops N     timed ops per pass, frees and allocations together (default 1000000);\n"
    "              best of 3 passes; an odd N runs N - 1 (a free and an allocation a step).\n"
    "  --json      one JSON object instead of text.\n"
    "\n" CLI_EXIT_STATUS_HELP;

typedef struct bench_common {
  int have_source;
  vram_source_kind source;
  int json;
} bench_common_t;

/* Options every bench command takes. Returns 1 if arg was one (advancing *i past a value),
 * 0 if not, -1 on a usage error already reported. */
static int parse_common(int argc, char **argv, int *i, bench_common_t *common) {
  const char *value = NULL;
  int matched = cli_option_value(argc, argv, i, "--source", &value);
  if (matched < 0) return -1;
  if (matched) {
    if (cli_parse_source(value, &common->source) != 0) return -1;
    common->have_source = 1;
    return 1;
  }
  if (strcmp(argv[*i], "--json") == 0) {
    common->json = 1;
    return 1;
  }
  return 0;
}

static int unknown_option(const char *arg) {
  fprintf(stderr, "%s: unknown argument '%s' (see %s --help)\n", cli_command(), cli_shown(arg),
          cli_command());
  return CLI_EXIT_USAGE;
}

/* Report a failed call inside a benchmark loop and pick the exit status for it: a size
 * that does not fit is the user's to change (exit 1), anything else the allocator's. */
static int loop_failure(vram_pool_t *pool, const char *what, size_t size, int status) {
  if (size) fprintf(stderr, "%s: %s of %zu bytes failed: %s (%s)\n", cli_command(), what,
                   size, vram_strerror(status), vram_errname(status));
  else fprintf(stderr, "%s: %s failed: %s (%s)\n", cli_command(), what,
               vram_strerror(status), vram_errname(status));
  if (status == VRAM_ENOMEM) {
    cli_print_oom_report(pool);
    return CLI_EXIT_OOM;
  }
  return CLI_EXIT_FAILURE;
}

/* Give the cache back and close the pool, checking that nothing stayed allocated. */
static int close_pool(vram_pool_t *pool) {
  vram_stats_t stats;
  int status = vram_get_stats(pool, &stats);
  int result = CLI_EXIT_OK;
  if (status == VRAM_OK && (stats.allocated_bytes.current || stats.allocation.current)) {
    fprintf(stderr, "%s: bytes not returned: %lld bytes in %lld allocations\n", cli_command(),
            (long long)stats.allocated_bytes.current, (long long)stats.allocation.current);
    result = CLI_EXIT_FAILURE;
  }
  vram_empty_cache(pool);
  status = vram_pool_destroy(pool);
  if (status != VRAM_OK) {
    fprintf(stderr, "%s: vram_pool_destroy: %s\n", cli_command(), vram_strerror(status));
    vram_pool_destroy_force(pool);
    result = CLI_EXIT_FAILURE;
  }
  return result;
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* ---- random --------------------------------------------------------------------------- */

/* The random workload, generated before anything is timed, and its peak live bytes. */
typedef struct random_workload {
  workload_op_t *ops;
  size_t op_count;
  uint64_t peak_live;
} random_workload_t;

/* What the passes measured. */
typedef struct random_measure {
  double best_ns;
  uint64_t peak_reserved;
  uint64_t calls_cold, calls_warm;
  vram_source_kind source;
} random_measure_t;

static int random_workload_make(random_workload_t *w) {
  size_t capacity = WORKLOAD_RANDOM_OPS + WORKLOAD_RANDOM_MAX_LIVE;
  memset(w, 0, sizeof *w);
  w->ops = malloc(sizeof *w->ops * capacity);
  uint64_t *slot_sizes = calloc(WORKLOAD_RANDOM_MAX_LIVE, sizeof *slot_sizes);
  if (w->ops)
    w->op_count = workload_make_random(w->ops, WORKLOAD_RANDOM_OPS, WORKLOAD_RANDOM_MAX_LIVE,
                                       WORKLOAD_RANDOM_MIN_SIZE, WORKLOAD_RANDOM_MAX_SIZE,
                                       WORKLOAD_RANDOM_SEED);
  if (!slot_sizes || w->op_count == 0) {
    free(slot_sizes);
    return -1;
  }
  /* Peak live is a property of the op sequence alone, not of any allocator. */
  uint64_t live = 0;
  for (size_t i = 0; i < w->op_count; i++) {
    const workload_op_t *op = &w->ops[i];
    if (op->is_alloc) {
      slot_sizes[op->slot] = op->size;
      live += op->size;
      if (live > w->peak_live) w->peak_live = live;
    } else {
      live -= slot_sizes[op->slot];
    }
  }
  free(slot_sizes);
  return 0;
}

/* RANDOM_PASSES timed passes on one pool. Returns a CLI_EXIT_* status; on failure the pool
 * is already destroyed. */
static int random_passes(vram_pool_t *pool, const random_workload_t *w, void **blocks,
                         random_measure_t *m) {
  /* Source calls (driver calls on a GPU) of the first pass, on an empty pool, and of the
   * last, on a pool the earlier passes filled: what tight placement costs shows here. */
  for (int pass = 0; pass < RANDOM_PASSES; pass++) {
    uint64_t calls_before = cli_device_calls(pool);
    double start = cli_now_ns();
    for (size_t i = 0; i < w->op_count; i++) {
      const workload_op_t *op = &w->ops[i];
      int status = op->is_alloc ? vram_malloc(pool, op->size, NULL, &blocks[op->slot])
                                : vram_free(pool, blocks[op->slot]);
      if (status != VRAM_OK) {
        int result = loop_failure(pool, op->is_alloc ? "vram_malloc" : "vram_free",
                                  op->size, status);
        /* The run is void; destroy_force also frees the blocks the failed pass left live. */
        vram_pool_destroy_force(pool);
        return result;
      }
    }
    double ns = (cli_now_ns() - start) / (double)w->op_count;
    if (pass == 0 || ns < m->best_ns) m->best_ns = ns;
    m->calls_warm = cli_device_calls(pool) - calls_before;
    if (pass == 0) m->calls_cold = m->calls_warm;
  }
  vram_stats_t stats;
  if (vram_get_stats(pool, &stats) == VRAM_OK) m->peak_reserved = (uint64_t)stats.reserved_bytes.peak;
  m->source = vram_pool_source(pool);
  return close_pool(pool);
}

static void random_print(int json, const random_workload_t *w, const random_measure_t *m) {
  double over_live = w->peak_live ? (double)m->peak_reserved / (double)w->peak_live : 0.0;
  if (json) {
    printf("{\"bench\": \"random\", \"source\": ");
    cli_json_string(stdout, vram_source_name(m->source));
    printf(", \"ops\": %zu, \"passes\": %d, \"ns_per_op\": %.1f, \"peak_live_bytes\": %llu, "
           "\"peak_reserved_bytes\": %llu, \"reserved_over_live\": %.3f, \"device_calls\": %llu, "
           "\"device_calls_warm\": %llu}\n",
           w->op_count, RANDOM_PASSES, m->best_ns, (unsigned long long)w->peak_live,
           (unsigned long long)m->peak_reserved, over_live, (unsigned long long)m->calls_cold,
           (unsigned long long)m->calls_warm);
    return;
  }
  printf("random workload on %s: %zu ops (200,000 random + drain), best of %d passes\n",
         vram_source_name(m->source), w->op_count, RANDOM_PASSES);
  printf("  ns per op            %10.1f\n", m->best_ns);
  printf("  peak live            %10.1f MiB\n", (double)w->peak_live / (double)MIB);
  printf("  peak reserved        %10.1f MiB\n", (double)m->peak_reserved / (double)MIB);
  /* Found only while the sequence is still the one PyTorch was measured on. */
  const reference_figures_t *pytorch = reference_lookup(w->op_count, w->peak_live);
  if (pytorch)
    printf("  reserved over live   %10.3f   (PyTorch native %.3f, expandable %.3f)\n", over_live,
           pytorch->native, pytorch->expandable);
  else
    printf("  reserved over live   %10.3f\n", over_live);
  printf("  source calls         %10llu first pass, %llu last pass\n",
         (unsigned long long)m->calls_cold, (unsigned long long)m->calls_warm);
  if (pytorch) printf("PyTorch's figures, for reference: %s.\n", reference_provenance);
}

static int bench_random(int argc, char **argv) {
  bench_common_t common = {0};
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) {
      fputs(random_usage, stdout);
      return CLI_EXIT_OK;
    }
    int matched = parse_common(argc, argv, &i, &common);
    if (matched < 0) return CLI_EXIT_USAGE;
    if (!matched) return unknown_option(argv[i]);
  }
  vram_options_t options;
  if (cli_base_options(&options, common.have_source, common.source) != 0) return CLI_EXIT_USAGE;

  random_workload_t workload;
  void **blocks = calloc(WORKLOAD_RANDOM_MAX_LIVE, sizeof *blocks);
  int result = CLI_EXIT_OK;
  if (random_workload_make(&workload) != 0 || !blocks) {
    fprintf(stderr, "vramkit bench random: out of host memory\n");
    result = CLI_EXIT_FAILURE;
  }
  vram_pool_t *pool = NULL;
  if (result == CLI_EXIT_OK && cli_pool_create(&pool, &options) != VRAM_OK)
    result = CLI_EXIT_FAILURE;
  random_measure_t measured = {0};
  if (result == CLI_EXIT_OK) result = random_passes(pool, &workload, blocks, &measured);
  if (result == CLI_EXIT_OK) random_print(common.json, &workload, &measured);
  free(workload.ops);
  free(blocks);
  return result;
}

/* ---- pair ----------------------------------------------------------------------------- */

static int parse_size_list(const char *text, size_t *sizes, int *count) {
  *count = 0;
  const char *cursor = text;
  size_t text_length = strlen(text);
  /* A comma at the end stands for a size left out, as one between two commas does. */
  int open_end = text_length && text[text_length - 1] == ',';
  while (*cursor) {
    const char *comma = strchr(cursor, ',');
    size_t length = comma ? (size_t)(comma - cursor) : strlen(cursor);
    char item[64];
    if (length == 0 || open_end || length >= sizeof item || *count >= PAIR_MAX_SIZES) {
      fprintf(stderr, "vramkit bench pair: --sizes: bad list '%s' (e.g. 512,64K,2M,64M)\n",
              cli_shown(text));
      return -1;
    }
    memcpy(item, cursor, length);
    item[length] = '\0';
    if (cli_parse_size("--sizes", item, &sizes[*count]) != 0) return -1;
    if (sizes[*count] == 0) {
      fprintf(stderr, "vramkit bench pair: --sizes: 0 is not a size to time\n");
      return -1;
    }
    (*count)++;
    cursor += length;
    if (*cursor == ',') cursor++;
  }
  if (*count == 0) {
    fprintf(stderr, "vramkit bench pair: --sizes: empty list\n");
    return -1;
  }
  return 0;
}

/* Warm up, then time PAIR_BATCHES batches of `pairs` alloc+free pairs of one size, sorted
 * fastest first. Returns the status of the call that failed, or VRAM_OK. */
static int pair_batches(vram_pool_t *pool, size_t size, long pairs, double *batches) {
  void *block = NULL;
  int status = VRAM_OK;
  /* The warm-up puts a block of this size in the cache, so every timed pair hits it, and
   * runs for PAIR_WARMUP_NS at least: a core that was idle runs at a low clock for its
   * first milliseconds, which would otherwise land in the first batches and make the
   * same code measure half again as slow in one run as in the next. */
  double warm_start = cli_now_ns();
  for (long w = 0; status == VRAM_OK && (w < PAIR_WARMUP || cli_now_ns() - warm_start < PAIR_WARMUP_NS); w++) {
    status = vram_malloc(pool, size, NULL, &block);
    if (status == VRAM_OK) status = vram_free(pool, block);
  }
  for (int b = 0; b < PAIR_BATCHES && status == VRAM_OK; b++) {
    double start = cli_now_ns();
    for (long p = 0; p < pairs; p++) {
      status = vram_malloc(pool, size, NULL, &block);
      if (status != VRAM_OK) break;
      status = vram_free(pool, block);
      if (status != VRAM_OK) break;
    }
    batches[b] = (cli_now_ns() - start) / (double)pairs;
  }
  if (status == VRAM_OK) qsort(batches, PAIR_BATCHES, sizeof *batches, compare_doubles);
  return status;
}

static int bench_pair(int argc, char **argv) {
  bench_common_t common = {0};
  size_t sizes[PAIR_MAX_SIZES] = {512, 64 << 10, 2 << 20, 64 << 20};
  int size_count = 4;
  long pairs = 200000;
  int history = 0;
  long history_entries = 0;
  for (int i = 1; i < argc; i++) {
    const char *value = NULL;
    int matched;
    if (cli_is_help(argv[i])) {
      fputs(pair_usage, stdout);
      return CLI_EXIT_OK;
    }
    if (strcmp(argv[i], "--history") == 0) {
      history = 1;
      continue;
    }
    if ((matched = parse_common(argc, argv, &i, &common)) != 0) {
      if (matched < 0) return CLI_EXIT_USAGE;
    } else if ((matched = cli_option_value(argc, argv, &i, "--sizes", &value)) != 0) {
      if (matched < 0 || parse_size_list(value, sizes, &size_count) != 0) return CLI_EXIT_USAGE;
    } else if ((matched = cli_option_value(argc, argv, &i, "--pairs", &value)) != 0) {
      if (matched < 0 || cli_parse_long("--pairs", value, 1, 1000000000L, &pairs) != 0)
        return CLI_EXIT_USAGE;
    } else if ((matched = cli_option_value(argc, argv, &i, "--history-entries", &value)) != 0) {
      if (matched < 0 ||
          cli_parse_long("--history-entries", value, 0, 1L << 30, &history_entries) != 0)
        return CLI_EXIT_USAGE;
    } else {
      return unknown_option(argv[i]);
    }
  }
  vram_options_t options;
  if (cli_base_options(&options, common.have_source, common.source) != 0) return CLI_EXIT_USAGE;
  vram_pool_t *pool = NULL;
  if (cli_pool_create(&pool, &options) != VRAM_OK) return CLI_EXIT_FAILURE;
  if (history && vram_history_start(pool, (size_t)history_entries, 0) != VRAM_OK) {
    fprintf(stderr, "vramkit bench pair: vram_history_start failed\n");
    vram_pool_destroy_force(pool);
    return CLI_EXIT_FAILURE;
  }
  vram_source_kind source = vram_pool_source(pool);
  if (!common.json)
    printf("alloc+free pair on %s%s, median of %d batches of %ld pairs\n", vram_source_name(source),
           history ? " recording history" : "", PAIR_BATCHES, pairs);

  for (int s = 0; s < size_count; s++) {
    size_t size = sizes[s];
    double batches[PAIR_BATCHES];
    int status = pair_batches(pool, size, pairs, batches);
    if (status != VRAM_OK) {
      int result = loop_failure(pool, "vram_malloc+vram_free", size, status);
      vram_pool_destroy_force(pool);
      return result;
    }
    double median = batches[PAIR_BATCHES / 2];
    if (common.json) {
      printf("{\"bench\": \"pair\", \"source\": ");
      cli_json_string(stdout, vram_source_name(source));
      printf(", \"size\": %zu, \"ns_per_pair\": %.1f, \"min_ns_per_pair\": %.1f, "
             "\"batches\": %d, \"pairs_per_batch\": %ld, \"history\": %s}\n",
             size, median, batches[0], PAIR_BATCHES, pairs, history ? "true" : "false");
    } else {
      printf("  size %12zu   %8.1f ns per pair   (fastest batch %.1f)\n", size, median,
             batches[0]);
    }
    fflush(stdout);
  }
  return close_pool(pool);
}

/* ---- scale ---------------------------------------------------------------------------- */

typedef struct scale_case {
  size_t live_blocks;
  double ns_per_op;
  double baseline_ns;  /* the same loop with a hash-table delete and insert per step */
  uint64_t live_bytes;
  uint64_t peak_reserved;
} scale_case_t;

/* The yardstick for one case: the same loop shape, with a hash-table delete and insert per
 * step in place of free and malloc. Each new block gets a fresh fake address, as a real
 * allocation lands somewhere new, so that with a million entries the table pays the same
 * cache misses a pointer map would. */
static int scale_baseline(scale_case_t *measured, const uint32_t *victims, size_t steps) {
  size_t live_blocks = measured->live_blocks;
  uint64_t *addresses = malloc(sizeof *addresses * live_blocks);
  hashtab_t table;
  if (!addresses || hashtab_init(&table, live_blocks) != 0) {
    free(addresses);
    fprintf(stderr, "vramkit bench scale: out of host memory\n");
    return CLI_EXIT_FAILURE;
  }
  uint64_t next_address = 0x7f0000000000ull;
  for (size_t i = 0; i < live_blocks; i++) {
    addresses[i] = next_address;
    hashtab_insert(&table, next_address, (uint32_t)i);
    next_address += 512;
  }
  for (int pass = 0; pass < SCALE_PASSES; pass++) {
    double start = cli_now_ns();
    for (size_t s = 0; s < steps; s++) {
      uint32_t victim = victims[s];
      hashtab_remove(&table, addresses[victim]);
      hashtab_insert(&table, next_address, victim);
      addresses[victim] = next_address;
      next_address += 512;
    }
    double ns = (cli_now_ns() - start) / (double)(2 * steps);
    if (pass == 0 || ns < measured->baseline_ns) measured->baseline_ns = ns;
  }
  volatile size_t left = table.count; /* keeps the loop's stores observable */
  (void)left;
  hashtab_close(&table);
  free(addresses);
  return CLI_EXIT_OK;
}

static int scale_measure(const vram_options_t *options, size_t op_count, uint64_t seed,
                         scale_case_t *measured, vram_source_kind *source) {
  size_t live_blocks = measured->live_blocks;
  size_t steps = op_count / 2 ? op_count / 2 : 1;
  void **blocks = calloc(live_blocks, sizeof *blocks);
  size_t *block_sizes = calloc(live_blocks, sizeof *block_sizes);
  uint32_t *victims = malloc(sizeof *victims * steps);
  size_t *new_sizes = malloc(sizeof *new_sizes * steps);
  int result = CLI_EXIT_OK;
  vram_pool_t *pool = NULL;
  if (!blocks || !block_sizes || !victims || !new_sizes) {
    fprintf(stderr, "vramkit bench scale: out of host memory\n");
    result = CLI_EXIT_FAILURE;
    goto done;
  }
  /* Every random number is drawn here, so the timed loop is allocator calls alone. */
  workload_rng_t rng = {seed};
  for (size_t i = 0; i < live_blocks; i++)
    block_sizes[i] = workload_log_uniform(&rng, SCALE_MIN_SIZE, SCALE_MAX_SIZE);
  for (size_t s = 0; s < steps; s++) {
    victims[s] = (uint32_t)(workload_unit(&rng) * (double)live_blocks);
    new_sizes[s] = workload_log_uniform(&rng, SCALE_MIN_SIZE, SCALE_MAX_SIZE);
  }
  if (cli_pool_create(&pool, options) != VRAM_OK) {
    result = CLI_EXIT_FAILURE;
    goto done;
  }
  *source = vram_pool_source(pool);
  int status = VRAM_OK;
  size_t failed_size = 0;
  for (size_t i = 0; i < live_blocks && status == VRAM_OK; i++) {
    failed_size = block_sizes[i];
    status = vram_malloc(pool, block_sizes[i], NULL, &blocks[i]);
  }
  for (int pass = 0; pass < SCALE_PASSES && status == VRAM_OK; pass++) {
    double start = cli_now_ns();
    for (size_t s = 0; s < steps; s++) {
      uint32_t victim = victims[s];
      status = vram_free(pool, blocks[victim]);
      if (status != VRAM_OK) {
        failed_size = 0;
        break;
      }
      status = vram_malloc(pool, new_sizes[s], NULL, &blocks[victim]);
      if (status != VRAM_OK) {
        blocks[victim] = NULL;
        failed_size = new_sizes[s];
        break;
      }
    }
    double ns = (cli_now_ns() - start) / (double)(2 * steps);
    if (pass == 0 || ns < measured->ns_per_op) measured->ns_per_op = ns;
  }
  if (status != VRAM_OK) {
    result = loop_failure(pool, "allocator call", failed_size, status);
    vram_pool_destroy_force(pool);
    goto done;
  }
  vram_stats_t stats;
  vram_get_stats(pool, &stats);
  measured->live_bytes = (uint64_t)stats.requested_bytes.current;
  measured->peak_reserved = (uint64_t)stats.reserved_bytes.peak;
  for (size_t i = 0; i < live_blocks; i++) {
    status = vram_free(pool, blocks[i]);
    if (status != VRAM_OK && result == CLI_EXIT_OK) {
      fprintf(stderr, "vramkit bench scale: final free failed: %s\n", vram_strerror(status));
      result = CLI_EXIT_FAILURE;
    }
  }
  int closed = close_pool(pool);
  if (result == CLI_EXIT_OK) result = closed;
  if (result == CLI_EXIT_OK) result = scale_baseline(measured, victims, steps);
done:
  free(blocks);
  free(block_sizes);
  free(victims);
  free(new_sizes);
  return result;
}

static int bench_scale(int argc, char **argv) {
  bench_common_t common = {0};
  long small = 1000, large = 1000000, ops = 1000000;
  for (int i = 1; i < argc; i++) {
    const char *value = NULL;
    int matched;
    if (cli_is_help(argv[i])) {
      fputs(scale_usage, stdout);
      return CLI_EXIT_OK;
    }
    if ((matched = parse_common(argc, argv, &i, &common)) != 0) {
      if (matched < 0) return CLI_EXIT_USAGE;
    } else if ((matched = cli_option_value(argc, argv, &i, "--small", &value)) != 0) {
      if (matched < 0 || cli_parse_long("--small", value, 1, 100000000L, &small) != 0)
        return CLI_EXIT_USAGE;
    } else if ((matched = cli_option_value(argc, argv, &i, "--large", &value)) != 0) {
      if (matched < 0 || cli_parse_long("--large", value, 1, 100000000L, &large) != 0)
        return CLI_EXIT_USAGE;
    } else if ((matched = cli_option_value(argc, argv, &i, "--ops", &value)) != 0) {
      if (matched < 0 || cli_parse_long("--ops", value, 2, 1000000000L, &ops) != 0)
        return CLI_EXIT_USAGE;
    } else {
      return unknown_option(argv[i]);
    }
  }
  vram_options_t options;
  /* A CPU measure of the engine: sim unless asked otherwise, whatever VRAMKIT_SOURCE says. */
  if (cli_base_options(&options, 1, common.have_source ? common.source : VRAM_SOURCE_SIM) != 0)
    return CLI_EXIT_USAGE;

  scale_case_t cases[2] = {{.live_blocks = (size_t)small}, {.live_blocks = (size_t)large}};
  vram_source_kind source = options.source;
  for (int c = 0; c < 2; c++) {
    int result = scale_measure(&options, (size_t)ops, 7 + (uint64_t)c, &cases[c], &source);
    if (result != CLI_EXIT_OK) return result;
  }
  double growth = cases[0].ns_per_op > 0 ? cases[1].ns_per_op / cases[0].ns_per_op : 0.0;
  /* A pass times whole free+alloc steps: an odd --ops runs one op fewer than asked. */
  long timed_ops = 2 * (ops / 2);
  if (common.json) {
    printf("{\"bench\": \"scale\", \"source\": ");
    cli_json_string(stdout, vram_source_name(source));
    printf(", \"ops\": %ld, \"live_small\": %zu, \"ns_per_op_small\": %.1f, \"live_large\": %zu, "
           "\"ns_per_op_large\": %.1f, \"large_over_small\": %.2f, "
           "\"baseline_ns_small\": %.1f, \"baseline_ns_large\": %.1f",
           timed_ops, cases[0].live_blocks, cases[0].ns_per_op, cases[1].live_blocks,
           cases[1].ns_per_op, growth, cases[0].baseline_ns, cases[1].baseline_ns);
    /* The figures the text prints beside each case's time. */
    printf(", \"live_bytes_small\": %llu, \"peak_reserved_bytes_small\": %llu, "
           "\"live_bytes_large\": %llu, \"peak_reserved_bytes_large\": %llu}\n",
           (unsigned long long)cases[0].live_bytes, (unsigned long long)cases[0].peak_reserved,
           (unsigned long long)cases[1].live_bytes, (unsigned long long)cases[1].peak_reserved);
  } else {
    printf("steady free+alloc mix on %s, sizes 256 B..256 KiB, best of %d passes of %ld ops\n",
           vram_source_name(source), SCALE_PASSES, timed_ops);
    for (int c = 0; c < 2; c++)
      printf("  %9zu live blocks (%10.1f MiB live, %10.1f MiB peak reserved): %8.1f ns per op"
             "  (hash-table baseline %.1f)\n",
             cases[c].live_blocks, (double)cases[c].live_bytes / (double)MIB,
             (double)cases[c].peak_reserved / (double)MIB, cases[c].ns_per_op,
             cases[c].baseline_ns);
    printf("  large over small: %.2f (target: at most 2)\n", growth);
  }
  return CLI_EXIT_OK;
}

int cmd_bench(int argc, char **argv) {
  if (argc < 2) {
    fputs(bench_usage, stderr);
    return CLI_EXIT_USAGE;
  }
  const char *command = argv[1];
  if (cli_is_help(command) || strcmp(command, "help") == 0) {
    fputs(bench_usage, stdout);
    return CLI_EXIT_OK;
  }
  /* Each benchmark, and the name its messages carry. */
  static const struct {
    const char *name, *command;
    int (*run)(int argc, char **argv);
  } benchmarks[] = {{"random", "vramkit bench random", bench_random},
                    {"pair", "vramkit bench pair", bench_pair},
                    {"scale", "vramkit bench scale", bench_scale}};
  for (size_t i = 0; i < sizeof benchmarks / sizeof benchmarks[0]; i++) {
    if (strcmp(command, benchmarks[i].name) == 0) {
      cli_set_command(benchmarks[i].command);
      return benchmarks[i].run(argc - 1, argv + 1);
    }
  }
  fprintf(stderr, "vramkit bench: unknown benchmark '%s' (random, pair or scale)\n",
          cli_shown(command));
  return CLI_EXIT_USAGE;
}

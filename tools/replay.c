/* replay.c - `vramkit replay`: the command around the library's replay (vram_replay_*,
 * src/replay): it parses the options, loads every trace before replaying any, and prints
 * one row or one JSON object per trace (the keys of that object are what scripts rely on;
 * add, never rename). The loop, the timing, the leak checks and the bisection for the
 * smallest capacity are the library's, so that Python's vramkit.replay() gives the same
 * figures.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "reference.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((uint64_t)1 << 20)
/* VRAM_TRACE_DEFAULT_MAX_OPS as the help text writes it. */
#define REPLAY_MAX_OPS_HELP "20,000,000"
_Static_assert(VRAM_TRACE_DEFAULT_MAX_OPS == 20000000ull, "REPLAY_MAX_OPS_HELP is stale");
/* VRAM_SIM_MAX_CAPACITY, the largest --capacity, as a SIZE the option reads back. */
#define REPLAY_MAX_CAPACITY_HELP "256T"
_Static_assert(VRAM_SIM_MAX_CAPACITY == (size_t)256 << 40, "REPLAY_MAX_CAPACITY_HELP is stale");

static const char replay_usage[] =
    "usage: vramkit replay [options] TRACE...\n"
    "\n"
    "Replay allocation traces (format v1: gzip text, a first line '# vramkit-trace v1',\n"
    "then 'a ID SIZE STREAM T_US' and 'f ID STREAM T_US' lines) through a vramkit pool,\n"
    "and report peak live bytes, peak reserved bytes, their ratio (none where ops ran out\n"
    "of memory: what they asked was never held), and the time per op of the replay loop\n"
    "alone. A free of an ID not live then (a block from before the\n"
    "recording, or one freed twice) is skipped; stderr and the JSON key skipped_frees say\n"
    "how many.\n"
    "\n"
    "options:\n"
    "  --source S      sim (= sim:cuda), sim:vmm, cuda, vmm, managed or auto. Default: auto\n"
    "                  (VRAMKIT_SOURCE, else a GPU source if a CUDA driver is found, else sim).\n"
    "                  On sim the trace's stream numbers are passed as opaque streams. On the\n"
    "                  GPU sources every op runs on the legacy default stream (NULL): the\n"
    "                  command creates no CUDA streams, so a 2-stream trace runs on one GPU\n"
    "                  stream there; per-stream effects are measured on sim.\n"
    "  --capacity SIZE hard limit on reserved memory (and the sim device's capacity), e.g.\n"
    "                  14G, at most " REPLAY_MAX_CAPACITY_HELP ". An op that runs out of memory\n"
    "                  is counted in 'ooms' and skipped (its later free is ignored), and the\n"
    "                  exit status is 1. Without it the sim device has " CLI_SIM_CAPACITY_HELP
    "\n                  (VRAMKIT_SIM_CAPACITY changes that).\n"
    "  --min-capacity  also find the smallest capacity under which the trace replays with no\n"
    "                  out-of-memory, by bisection to 1 MiB between peak live and 4x peak live\n"
    "                  (or the replay's peak reserved, if it had no out-of-memory and that is\n"
    "                  more), on the host model of the source's family (sim for sim, cuda and\n"
    "                  managed, sim:vmm for sim:vmm and vmm), whose capacity is at most\n"
    "                  256 TiB: the search stops there, and a trace live past it has none;\n"
    "                  nor has a trace with nothing live ('-', JSON null).\n"
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
    "                  has settled by the step that starts at op N; '-' (JSON null) for a\n"
    "                  trace of fewer than N ops, which has nothing to count.\n"
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

typedef vram_replay_result replay_result_t;

static double ratio(uint64_t numerator, uint64_t denominator) {
  return denominator ? (double)numerator / (double)denominator : 0.0;
}

/* A time over the baseline's (0 where either was not timed). */
static double times_baseline(double ns, const replay_result_t *r) {
  return r->baseline_ns_per_op > 0 ? ns / r->baseline_ns_per_op : 0.0;
}

/* Whether the cold pass reached op N of --calls-after N, so that device_calls_after counts
 * something: a trace of fewer ops (or a pool never made) has no op N, and its 0 would read
 * as a loop that had settled. N equal to the op count is reached: nothing comes after. */
static int calls_after_counted(const replay_settings_t *settings, const replay_result_t *r) {
  return vram_replay_pool_made(r) && (uint64_t)settings->calls_after <= r->ops;
}

/* The smallest capacity over peak live, or 0 where the search found none to show (none
 * asked, none up to its top, or nothing live to search for). */
static double min_capacity_over_live(const replay_result_t *r) {
  if (r->have_min_capacity <= 0) return 0.0;
  return ratio(r->min_capacity_bytes, r->peak_live_bytes);
}

/* A figure of the table, or "-" where there is none: a time or a ratio is never 0. */
static void print_figure(double value, int width, int precision) {
  if (value > 0)
    printf(" %*.*f", width, precision, value);
  else
    printf(" %*s", width, "-");
}

/* The same in the JSON line: the key's number, or null. */
static void json_figure(const char *key, double value, int precision) {
  if (value > 0)
    printf(", \"%s\": %.*f", key, precision, value);
  else
    printf(", \"%s\": null", key);
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
  printf("%-20s %-8s %8zu", cli_shown(r->name), vram_source_name(r->source), (size_t)r->ops);
  print_mib(r->peak_live_bytes, 12);
  print_mib(r->peak_reserved_bytes, 14);
  print_figure(vram_replay_reserved_over_live(r), 9, 3);
  print_figure(r->ns_per_op, 8, 1);
  printf(" %5llu", (unsigned long long)r->ooms);
  if (settings->min_capacity) {
    if (min_capacity_over_live(r) > 0) {
      print_mib(r->min_capacity_bytes, 12);
      print_figure(min_capacity_over_live(r), 9, 3);
    } else if (r->have_min_capacity == -1) {
      printf(" %12s %9s",
             r->peak_live_bytes > VRAM_SIM_MAX_CAPACITY / 4 ? "> sim max" : "> 4x live", "-");
    } else {
      printf(" %12s %9s", "-", "-");
    }
  }
  if (settings->warm) print_figure(r->ns_per_op_warm, 10, 1);
  if (settings->baseline) {
    print_figure(r->baseline_ns_per_op, 11, 1);
    print_figure(times_baseline(r->ns_per_op, r), 10, 2);
  }
  if (settings->calls_after >= 0 && calls_after_counted(settings, r))
    printf(" %11llu", (unsigned long long)r->device_calls_after);
  else if (settings->calls_after >= 0)
    printf(" %11s", "-");
  printf("\n");
  fflush(stdout);
}

static void print_result_json(const replay_settings_t *settings, const replay_result_t *r) {
  printf("{\"trace\": ");
  cli_json_string(stdout, r->name);
  printf(", \"source\": ");
  cli_json_string(stdout, vram_source_name(r->source));
  printf(", \"ops\": %zu, \"peak_live_bytes\": %llu, \"peak_reserved_bytes\": %llu",
         (size_t)r->ops, (unsigned long long)r->peak_live_bytes,
         (unsigned long long)r->peak_reserved_bytes);
  json_figure("reserved_over_live", vram_replay_reserved_over_live(r), 3);
  json_figure("ns_per_op", r->ns_per_op, 1);
  printf(", \"ooms\": %llu", (unsigned long long)r->ooms);
  printf(", \"skipped_frees\": %zu", (size_t)r->skipped_frees);
  if (settings->have_capacity)
    printf(", \"capacity_bytes\": %llu", (unsigned long long)settings->capacity);
  printf(", \"repeat\": %ld", settings->repeat);
  if (settings->min_capacity) {
    if (min_capacity_over_live(r) > 0)
      printf(", \"min_capacity_bytes\": %llu, \"min_capacity_over_live\": %.3f",
             (unsigned long long)r->min_capacity_bytes, min_capacity_over_live(r));
    else
      printf(", \"min_capacity_bytes\": null, \"min_capacity_over_live\": null");
    printf(", \"min_capacity_source\": ");
    cli_json_string(stdout, vram_source_name(r->min_capacity_source));
  }
  printf(", \"device_calls\": %llu", (unsigned long long)r->device_calls);
  if (settings->calls_after >= 0) {
    printf(", \"calls_after_op\": %ld", settings->calls_after);
    if (calls_after_counted(settings, r))
      printf(", \"device_calls_after\": %llu", (unsigned long long)r->device_calls_after);
    else
      printf(", \"device_calls_after\": null");
  }
  if (settings->warm) {
    json_figure("ns_per_op_warm", r->ns_per_op_warm, 1);
    printf(", \"device_calls_warm\": %llu", (unsigned long long)r->device_calls_warm);
  }
  if (settings->baseline) {
    json_figure("baseline_ns_per_op", r->baseline_ns_per_op, 2);
    json_figure("ns_over_baseline", times_baseline(r->ns_per_op, r), 2);
    if (settings->warm)
      json_figure("warm_over_baseline", times_baseline(r->ns_per_op_warm, r), 2);
  }
  printf("}\n");
  fflush(stdout);
}

/* PyTorch's figures sit beside a row only when its trace is the op sequence they were
 * measured on (reference_lookup matches op count and peak live bytes, never the name). */
static void print_fragmentation_table(FILE *out, const replay_result_t *results, size_t count) {
  int any_quoted = 0;
  fprintf(out, "\nFragmentation: peak reserved over peak live\n");
  fprintf(out, "%-20s %-8s %14s %14s %9s %16s %20s\n", "trace", "source", "peak live",
          "peak reserved", "vramkit", "PyTorch native", "PyTorch expandable");
  for (size_t i = 0; i < count; i++) {
    const replay_result_t *r = &results[i];
    char live[32], reserved[32], ours[16] = "-", native[16] = "-", expandable[16] = "-";
    snprintf(live, sizeof live, "%.1f MiB", (double)r->peak_live_bytes / (double)MIB);
    snprintf(reserved, sizeof reserved, "%.1f MiB",
             (double)r->peak_reserved_bytes / (double)MIB);
    double over_live = vram_replay_reserved_over_live(r); /* 0: "-" (vramkit.h says when) */
    if (over_live > 0) snprintf(ours, sizeof ours, "%.3f", over_live);
    const reference_figures_t *reference = reference_lookup(r->ops, r->peak_live_bytes);
    if (reference) {
      snprintf(native, sizeof native, "%.3f", reference->native);
      snprintf(expandable, sizeof expandable, "%.3f", reference->expandable);
      any_quoted = 1;
    }
    fprintf(out, "%-20s %-8s %14s %14s %9s %16s %20s\n", cli_shown(r->name),
            vram_source_name(r->source), live, reserved, ours, native, expandable);
  }
  if (any_quoted)
    fprintf(out, "PyTorch's figures, for reference: %s.\n", reference_provenance);
  else
    fprintf(out, "PyTorch's figures: none were measured on these traces (recognised by op "
                 "count and peak live bytes).\n");
}

/* What the library kept of a replay that went wrong, or ran out of memory, on stderr. */
static void print_replay_notes(const replay_settings_t *settings, const replay_result_t *r,
                               int status) {
  if (r->ooms && r->first_oom_report[0]) {
    if (r->first_oom_op >= 0) {
      fprintf(stderr, "vramkit replay: %s: op %lld (allocate %llu bytes) ran out of memory:\n",
              cli_shown(r->name), (long long)r->first_oom_op,
              (unsigned long long)r->first_oom_size);
    } else {
      const char *pre = getenv("VRAMKIT_PREALLOCATE");
      fprintf(stderr, "vramkit replay: %s: out of memory creating the pool: its preallocation "
                      "(VRAMKIT_PREALLOCATE='%s') does not fit:\n", cli_shown(r->name),
              cli_shown(pre ? pre : ""));
    }
    size_t length = strlen(r->first_oom_report);
    fprintf(stderr, "%s%s", r->first_oom_report,
            r->first_oom_report[length - 1] == '\n' ? "" : "\n");
  }
  if (status != VRAM_OK && r->failed_creating) {
    /* The pool as the library made it: --capacity is its limit and sim capacity. */
    vram_options_t options = settings->options;
    if (settings->have_capacity) {
      options.limit_bytes = settings->capacity;
      options.sim_capacity = settings->capacity;
    }
    cli_report_pool_error(status, &options);
  } else if (status != VRAM_OK) {
    fprintf(stderr, "vramkit replay: %s\n",
            r->error[0] ? cli_shown(r->error) : vram_strerror(status));
  }
  if (settings->min_capacity && r->have_min_capacity == -2)
    fprintf(stderr,
            "vramkit replay: %s: peak live bytes, %llu bytes, are past the largest capacity "
            "the sim models (%llu bytes, 256 TiB): no capacity to search\n",
            cli_shown(r->name), (unsigned long long)r->peak_live_bytes,
            (unsigned long long)VRAM_SIM_MAX_CAPACITY);
}

typedef struct summary_context {
  FILE *out;
  const char *name;
} summary_context_t;

static void print_summary_before_drain(vram_pool_t *pool, void *context) {
  const summary_context_t *summary = context;
  fprintf(summary->out, "== %s on %s\n", cli_shown(summary->name),
          vram_source_name(vram_pool_source(pool)));
  cli_print_summary(pool, summary->out);
}

/* Replay one loaded trace as the settings ask and fill *result. */
static int replay_trace(const replay_settings_t *settings, const vram_replay_trace_t *trace,
                        replay_result_t *result) {
  vram_replay_options options;
  vram_replay_options_init(&options, &settings->options);
  if (settings->have_capacity) options.capacity = settings->capacity;
  options.repeat = (int)settings->repeat;
  options.warm = settings->warm;
  options.baseline = settings->baseline;
  options.min_capacity = settings->min_capacity;
  options.calls_after = settings->calls_after;
  vram_replay_describe(trace, result);
  summary_context_t summary = {settings->json ? stderr : stdout, result->name};
  if (settings->summary) {
    options.before_drain = print_summary_before_drain;
    options.context = &summary;
  }
  int status = vram_replay_trace(trace, &options, result);
  print_replay_notes(settings, result, status);
  if (status != VRAM_OK && result->failed_creating && cli_options_refused(status))
    return CLI_EXIT_USAGE;
  return status == VRAM_OK ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
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
      fprintf(stderr, "vramkit replay: --capacity must be more than 0 (see vramkit replay "
                      "--help)\n");
      return -1;
    }
    /* The capacity sizes the sim device too, and no device addresses more: past it the
     * value is the command line's mistake, refused here rather than by the pool. */
    if (settings->capacity > VRAM_SIM_MAX_CAPACITY) {
      fprintf(stderr, "vramkit replay: --capacity: '%s' is more than the largest capacity "
                      "accepted, %s (%zu bytes)\n", cli_shown(value), REPLAY_MAX_CAPACITY_HELP,
              (size_t)VRAM_SIM_MAX_CAPACITY);
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
      fprintf(stderr, "vramkit replay: unknown option '%s' (see vramkit replay --help)\n",
              cli_shown(arg));
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
static int load_traces(const char **paths, size_t path_count, long max_ops,
                       vram_replay_trace_t **traces, size_t *loaded) {
  for (*loaded = 0; *loaded < path_count; (*loaded)++) {
    char error[1024];
    int rc = vram_replay_load(paths[*loaded], (uint64_t)max_ops, &traces[*loaded], error,
                              sizeof error);
    if (rc != VRAM_OK) {
      cli_print_trace_error(stderr, "vramkit replay: ", paths[*loaded], error,
                            rc == VRAM_ELIMIT && max_ops ? " (--max-ops N raises the limit)"
                                                         : "");
      return rc == VRAM_EHOSTMEM ? CLI_EXIT_FAILURE : CLI_EXIT_BAD_TRACE;
    }
    vram_replay_result description;
    vram_replay_describe(traces[*loaded], &description);
    const vram_replay_result *trace = &description;
    if (trace->peak_live_bytes == UINT64_MAX)
      fprintf(stderr,
              "vramkit replay: %s: live bytes reach 2^64 - 1 or more; peak live bytes are "
              "shown saturated at %llu\n",
              cli_shown(paths[*loaded]), (unsigned long long)UINT64_MAX);
    if ((size_t)trace->skipped_frees)
      fprintf(stderr,
              "vramkit replay: %s: skipped %zu free%s of IDs not live then (blocks from "
              "before the recording began, or freed twice)\n",
              cli_shown(paths[*loaded]), (size_t)trace->skipped_frees,
              trace->skipped_frees == 1 ? "" : "s");
  }
  return CLI_EXIT_OK;
}

/* Replay every trace and print what the settings ask for. Rows go out as each trace
 * finishes, except that with --summary in text mode the summaries come first and the
 * table after them, so that neither breaks up the other. */
static int replay_all(const replay_settings_t *settings, vram_replay_trace_t *const *traces,
                      size_t count, replay_result_t *results) {
  int status = CLI_EXIT_OK, any_oom = 0;
  size_t replayed = 0;
  int rows_as_we_go = !settings->json && !settings->summary;
  for (; replayed < count; replayed++) {
    status = replay_trace(settings, traces[replayed], &results[replayed]);
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
  vram_replay_trace_t **traces = calloc(path_count, sizeof *traces);
  replay_result_t *results = calloc(path_count, sizeof *results);
  int status = CLI_EXIT_FAILURE;
  size_t loaded = 0;
  if (traces && results) {
    status = load_traces(paths, path_count, settings.max_ops, traces, &loaded);
    if (status == CLI_EXIT_OK) status = replay_all(&settings, traces, path_count, results);
  } else {
    fprintf(stderr, "vramkit replay: out of host memory\n");
  }
  for (size_t i = 0; i < loaded; i++) vram_replay_unload(traces[i]);
  free(traces);
  free(results);
  free(paths);
  return status;
}

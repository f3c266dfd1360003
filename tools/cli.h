/* cli.h - what the vramkit subcommands share: exit statuses, option parsing, pool set-up,
 * timing and JSON output. Each subcommand lives in its own file (replay.c, bench.c) and is
 * reached through the dispatcher in main.c.
 */
#ifndef VRAMKIT_TOOLS_CLI_H
#define VRAMKIT_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "vramkit.h"

/* Exit statuses, one per kind of failure so that scripts can tell them apart. */
enum {
  CLI_EXIT_OK = 0,
  CLI_EXIT_OOM = 1,       /* an allocation ran out of memory (e.g. under --capacity) */
  CLI_EXIT_BAD_TRACE = 2, /* a trace file is unreadable or has a malformed line */
  CLI_EXIT_USAGE = 3,     /* bad command line: unknown option, source or size */
  CLI_EXIT_FAILURE = 4    /* the allocator failed: an error code, or bytes not returned */
};

#define CLI_EXIT_STATUS_HELP                                                               \
  "Exit status: 0 ok, 1 out of memory, 2 bad trace file, 3 bad command line,\n"            \
  "4 allocator failure (an unexpected error, or bytes not returned at the end).\n"

/* Capacity of the sim device when none is given: large enough that nothing runs out. */
#define CLI_SIM_DEFAULT_CAPACITY ((size_t)1 << 40)

/* Subcommands: argv[0] is the subcommand's own name. */
int cmd_replay(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Monotonic clock in nanoseconds. */
double cli_now_ns(void);

/* "-h" or "--help". */
int cli_is_help(const char *arg);

/* Match argv[*index] against "--name VALUE" or "--name=VALUE". Returns 1 and sets *value
 * (advancing *index past a separate value), 0 if it is another argument, or -1 after
 * printing an error when the value is missing. */
int cli_option_value(int argc, char **argv, int *index, const char *name, const char **value);

/* Parsers that print a message naming the option on bad input and return -1. */
int cli_parse_source(const char *text, vram_source_kind *kind);
int cli_parse_size(const char *option, const char *text, size_t *bytes);
int cli_parse_long(const char *option, const char *text, long min, long max, long *out);

/* vram_options_init, the VRAMKIT_* environment on top, then the sim capacity default
 * (CLI_SIM_DEFAULT_CAPACITY unless VRAMKIT_SIM_CAPACITY set one) and the source when
 * have_source. Returns 0, or -1 after printing why the environment is bad. */
int cli_base_options(vram_options_t *opts, int have_source, vram_source_kind source);

/* A source that talks to a GPU (cuda, vmm, managed) rather than the host-only model. */
int cli_source_is_gpu(vram_source_kind kind);

/* vram_pool_create with a message that says what to do when it fails. Returns the status. */
int cli_pool_create(vram_pool_t **pool, const vram_options_t *opts);
/* That message alone, for a status vram_pool_create returned. */
void cli_report_pool_error(int status, const vram_options_t *opts);

/* Print text as a JSON string literal, quotes included. */
void cli_json_string(FILE *out, const char *text);

/* Source allocations and releases so far: on a GPU source, driver calls of tens of
 * microseconds each, the cost that decides a replay's or a workload's time there. */
uint64_t cli_device_calls(vram_pool_t *pool);

/* Print the pool's last OOM report to stderr. */
void cli_print_oom_report(vram_pool_t *pool);

/* Print vram_summary(pool) to out. */
void cli_print_summary(vram_pool_t *pool, FILE *out);

#endif

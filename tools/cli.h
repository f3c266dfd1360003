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

/* Exit statuses, one per kind of failure so that scripts can tell them apart. The Python
 * subcommands (python/vramkit/cli/__init__.py, EXIT_*) use the same table, and 5 besides. */
enum {
  CLI_EXIT_OK = 0,
  CLI_EXIT_OOM = 1,       /* out of memory: under --capacity, or a size no device holds */
  CLI_EXIT_BAD_TRACE = 2, /* a trace file is unreadable, empty, headerless or malformed */
  CLI_EXIT_USAGE = 3,     /* bad command line: unknown option, missing value, bad size */
  CLI_EXIT_FAILURE = 4    /* the allocator failed: an error code, or bytes not returned */
};

#define CLI_EXIT_STATUS_HELP                                                               \
  "Exit status:\n"                                                                         \
  "  0  success\n"                                                                         \
  "  1  out of memory: an allocation did not fit (under --capacity, or a size larger\n"    \
  "     than the device holds); for estimate, the step does not fit the card\n"            \
  "  2  bad input file: a trace unreadable, empty, without the '# vramkit-trace v1'\n"     \
  "     header, or with a malformed line; a snapshot, log, report or model\n"              \
  "     configuration that cannot be read; a trace past a limit (--max-ops, 65535\n"       \
  "     streams)\n"                                                                        \
  "  3  bad command line: unknown command or option, an option without its value, a\n"     \
  "     bad size or number\n"                                                              \
  "  4  failure: the allocator's (an unexpected error code, or bytes not returned at\n"    \
  "     the end), an output that cannot be written, or the C command missing\n"            \
  "  5  missing optional package: matplotlib, PyTorch or transformers (the message\n"      \
  "     says what to install)\n"                                                           \
  "Every command, in C or in Python, uses this table. A Python command whose standard\n"   \
  "output is closed early (vramkit top --once | head -1) stops quietly with 141, the\n"    \
  "status of a command SIGPIPE ends.\n"

/* The sim device is the library's own default (vram_options_init: 80 GiB) unless
 * VRAMKIT_SIM_CAPACITY or an option sizes it; this is what the help texts say. */
#define CLI_SIM_CAPACITY_HELP "80 GiB"

/* Subcommands: argv[0] is the subcommand's own name. */
int cmd_replay(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* The command the shared helpers' messages name ("vramkit replay", "vramkit bench
 * random"; "vramkit" until a command sets it): a static string. */
void cli_set_command(const char *name);
const char *cli_command(void);

/* Monotonic clock in nanoseconds. */
double cli_now_ns(void);

/* "-h" or "--help". */
int cli_is_help(const char *arg);

/* Match argv[*index] against "--name VALUE" or "--name=VALUE". Returns 1 and sets *value
 * (advancing *index past a separate value), 0 if it is another argument, or -1 after
 * printing an error when the value is missing. A separate value starting with '-' is taken
 * only when a digit or '.' follows (so "--capacity -1G" is refused as a size, naming the
 * option): "--capacity --json" is a missing value, not a size. */
int cli_option_value(int argc, char **argv, int *index, const char *name, const char **value);

/* Parsers that print a message naming the option on bad input and return -1. */
int cli_parse_source(const char *text, vram_source_kind *kind);
int cli_parse_size(const char *option, const char *text, size_t *bytes);
int cli_parse_long(const char *option, const char *text, long min, long max, long *out);

/* vram_options_init, the VRAMKIT_* environment on top, then the source when have_source.
 * Returns 0, or -1 after printing why the environment is bad. */
int cli_base_options(vram_options_t *opts, int have_source, vram_source_kind source);

/* A source that talks to a GPU (cuda, vmm, managed) rather than the host-only model. */
int cli_source_is_gpu(vram_source_kind kind);

/* vram_pool_create with a message that says what to do when it fails. Returns the status. */
int cli_pool_create(vram_pool_t **pool, const vram_options_t *opts);
/* That message alone, for a status vram_pool_create returned. */
void cli_report_pool_error(int status, const vram_options_t *opts);

/* Print text as a JSON string literal, quotes included; a byte that is not part of
 * well-formed UTF-8 (a file name from a Latin-1 system) becomes \ufffd. */
void cli_json_string(FILE *out, const char *text);

/* Foreign text (an argument, a file name, a variable's value) as the engine's reports show
 * it (vram_escape_text): controls, a backslash, invalid UTF-8 and bidi controls as \xNN.
 * The result lives in one of a few static slots, so that one message may show several;
 * text too long for a slot is cut between whole characters. */
const char *cli_shown(const char *text);

/* A message of the trace reader, which starts with the path as given (raw) and goes on in
 * its own words (quoting only lines it checked to be printable ASCII): the path shown. */
void cli_print_trace_error(FILE *out, const char *prefix, const char *path, const char *error,
                           const char *suffix);

/* Source allocations and releases so far: on a GPU source, driver calls of tens of
 * microseconds each, the cost that decides a replay's or a workload's time there. */
uint64_t cli_device_calls(vram_pool_t *pool);

/* Print the pool's last OOM report to stderr. */
void cli_print_oom_report(vram_pool_t *pool);
/* Print why the pool this thread could not create failed (its preallocation's OOM report,
 * or the options the library refused together), if the library left a reason. */
void cli_print_create_report(void);
/* Whether a pool's creation just failed with `status` because of its configuration: options
 * the library refused together (no_split with a preallocation or a virtual-memory source),
 * or a sim capacity past what the sim models. CLI_EXIT_USAGE then, not the tool's failure. */
int cli_options_refused(int status);

/* Print vram_summary(pool) to out. */
void cli_print_summary(vram_pool_t *pool, FILE *out);

#endif

/* cli.c - helpers shared by the vramkit subcommands (see cli.h). */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The command whose messages these are ("vramkit replay", "vramkit bench scale"): a
 * message names what was run, as the commands' own messages do. */
static const char *command_name = "vramkit";

void cli_set_command(const char *name) { command_name = name; }

const char *cli_command(void) { return command_name; }

double cli_now_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)now.tv_sec * 1e9 + (double)now.tv_nsec;
}

const char *cli_shown(const char *text) {
  enum { SLOTS = 4, SLOT_BYTES = 4 * 4096 + 1 };
  static char slots[SLOTS][SLOT_BYTES];
  static unsigned next;
  char *slot = slots[next++ % SLOTS];
  vram_escape_text(slot, SLOT_BYTES, text, strlen(text));
  return slot;
}

void cli_print_trace_error(FILE *out, const char *prefix, const char *path, const char *error,
                           const char *suffix) {
  size_t length = strlen(path);
  if (strncmp(error, path, length) == 0)
    fprintf(out, "%s%s%s%s\n", prefix, cli_shown(path), error + length, suffix);
  else
    fprintf(out, "%s%s%s\n", prefix, cli_shown(error), suffix);
}

int cli_is_help(const char *arg) {
  return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

int cli_option_value(int argc, char **argv, int *index, const char *name, const char **value) {
  const char *arg = argv[*index];
  size_t name_length = strlen(name);
  if (strncmp(arg, name, name_length) != 0) return 0;
  if (arg[name_length] == '=') {
    *value = arg + name_length + 1;
    return 1;
  }
  if (arg[name_length] != '\0') return 0;
  if (*index + 1 >= argc) {
    fprintf(stderr, "%s: %s needs a value (see %s --help)\n", command_name, name,
            command_name);
    return -1;
  }
  const char *next = argv[*index + 1];
  /* "-1G" is a value, refused by the option's parser with what is wrong with it; "--json"
   * is the next option, and the value is missing. */
  int number = (next[1] >= '0' && next[1] <= '9') || next[1] == '.';
  if (next[0] == '-' && next[1] != '\0' && !number) {
    fprintf(stderr, "%s: %s needs a value, and '%s' after it is an option (see %s --help)\n",
            command_name, name, cli_shown(next), command_name);
    return -1;
  }
  *value = argv[++*index];
  return 1;
}

int cli_parse_source(const char *text, vram_source_kind *kind) {
  if (vram_source_parse(text, kind) != VRAM_OK) {
    fprintf(stderr,
            "%s: unknown source '%s' (choose sim, sim:cuda, sim:vmm, cuda, vmm, managed "
            "or auto)\n",
            command_name, cli_shown(text));
    return -1;
  }
  return 0;
}

int cli_parse_size(const char *option, const char *text, size_t *bytes) {
  const char *why = vram_parse_size_error(text, 0);
  if (why) {
    fprintf(stderr, "%s: %s: '%s' is not a size: %s; expected bytes, or a number with "
                    "K/M/G/T: 512M, 1.5G\n", command_name, option, cli_shown(text), why);
    return -1;
  }
  return vram_parse_size(text, 0, bytes, NULL) == VRAM_OK ? 0 : -1;
}

int cli_parse_long(const char *option, const char *text, long min, long max, long *out) {
  char *end = NULL;
  errno = 0;
  long value = strtol(text, &end, 10);
  if (errno || end == text || *end || value < min || value > max) {
    fprintf(stderr, "%s: %s: expected a whole number from %ld to %ld, got '%s'\n",
            command_name, option, min, max, cli_shown(text));
    return -1;
  }
  *out = value;
  return 0;
}

int cli_base_options(vram_options_t *opts, int have_source, vram_source_kind source) {
  /* The sim device keeps the library's default size, so that the command and the library
   * (and the README) describe one device. */
  vram_options_init(opts);
  const char *why = NULL;
  if (vram_options_from_env(opts, &why) != VRAM_OK) {
    fprintf(stderr, "%s: %s\n", command_name,
            why ? cli_shown(why) : "bad VRAMKIT_* environment variable");
    return -1;
  }
  if (have_source) opts->source = source;
  return 0;
}

int cli_source_is_gpu(vram_source_kind kind) {
  return kind == VRAM_SOURCE_CUDA || kind == VRAM_SOURCE_VMM || kind == VRAM_SOURCE_MANAGED;
}

int cli_pool_create(vram_pool_t **pool, const vram_options_t *opts) {
  int status = vram_pool_create(pool, opts);
  if (status != VRAM_OK) cli_report_pool_error(status, opts);
  return status;
}

void cli_report_pool_error(int status, const vram_options_t *opts) {
  fprintf(stderr, "%s: cannot create a pool on source %s: %s (%s)\n", command_name,
          vram_source_name(opts->source), vram_strerror(status), vram_errname(status));
  /* The replay and bench options size no preallocation: only the variable can. */
  const char *pre = getenv("VRAMKIT_PREALLOCATE");
  if (status == VRAM_ENOMEM && pre && (opts->preallocate_bytes || opts->preallocate_fraction))
    fprintf(stderr, "%s: VRAMKIT_PREALLOCATE: '%s' is more than the device holds\n",
            command_name, cli_shown(pre));
  if (status == VRAM_ENODRIVER)
    fprintf(stderr, "%s: no CUDA driver here; --source sim replays on the host model\n",
            command_name);
  /* Out of memory creating it (its preallocation), or options refused together: the
   * library's words for why, which it keeps for the thread that tried. */
  if (status == VRAM_ENOMEM || status == VRAM_EINVAL || status == VRAM_EUNSUPPORTED)
    cli_print_create_report();
  /* replay refuses a --capacity past the sim's range itself: only the variable gets here. */
  if (status == VRAM_ESIMCAPACITY)
    fprintf(stderr, "%s: the sim capacity asked is %zu bytes (VRAMKIT_SIM_CAPACITY); "
                    "the sim models 1 to %zu bytes\n",
            command_name, opts->sim_capacity, (size_t)VRAM_SIM_MAX_CAPACITY);
}

/* The length of the well-formed UTF-8 sequence at c (Unicode's table 3-7: no overlong forms,
 * no surrogates, nothing past U+10FFFF), or 0 when the byte at c starts none. */
static int utf8_length(const unsigned char *c) {
  int length = *c < 0x80 ? 1 : *c < 0xC2 ? 0 : *c < 0xE0 ? 2 : *c < 0xF0 ? 3 : *c < 0xF5 ? 4 : 0;
  unsigned char low = 0x80, high = 0xBF; /* the range of the second byte */
  if (*c == 0xE0) low = 0xA0;
  if (*c == 0xED) high = 0x9F;
  if (*c == 0xF0) low = 0x90;
  if (*c == 0xF4) high = 0x8F;
  for (int i = 1; i < length; i++) {
    if (c[i] < (i == 1 ? low : 0x80) || c[i] > (i == 1 ? high : 0xBF)) return 0;
  }
  return length;
}

/* The code point of the well-formed UTF-8 sequence of `length` bytes at c. */
static unsigned code_point(const unsigned char *c, int length) {
  unsigned cp = length == 1 ? *c : *c & (0x7Fu >> length);
  for (int i = 1; i < length; i++) cp = cp << 6 | (c[i] & 0x3Fu);
  return cp;
}

/* Text from outside (a file name) need not be UTF-8, and JSON must be: each byte that
 * starts no well-formed sequence is written as U+FFFD, as a lenient decoder would read it.
 * Everything past printable ASCII is a \\u escape (a pair past U+FFFF), as Python's json
 * writes it: controls, C1 and bidirectional overrides in a name reach no terminal raw. */
void cli_json_string(FILE *out, const char *text) {
  fputc('"', out);
  for (const unsigned char *c = (const unsigned char *)text; *c;) {
    int length = utf8_length(c);
    unsigned cp = length ? code_point(c, length) : 0xFFFDu;
    if (cp == '"' || cp == '\\') fprintf(out, "\\%c", (int)cp);
    else if (cp >= 0x20 && cp < 0x7F) fputc((int)cp, out);
    else if (cp > 0xFFFF)
      fprintf(out, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10),
              0xDC00 + ((cp - 0x10000) & 0x3FF));
    else fprintf(out, "\\u%04x", cp);
    c += length ? length : 1;
  }
  fputc('"', out);
}

/* vram_summary and vram_oom_report share one calling convention: they return the length
 * the full text needs, so ask once for the length and once for the text. */
static char *pool_text(vram_pool_t *pool, int (*writer)(vram_pool_t *, char *, size_t)) {
  char probe[1];
  int length = writer(pool, probe, sizeof probe);
  if (length < 0) return NULL;
  char *text = malloc((size_t)length + 1);
  if (!text) return NULL;
  if (writer(pool, text, (size_t)length + 1) < 0) {
    free(text);
    return NULL;
  }
  return text;
}

uint64_t cli_device_calls(vram_pool_t *pool) {
  vram_stats_t stats;
  if (vram_get_stats(pool, &stats) != VRAM_OK) return 0;
  return stats.num_device_alloc + stats.num_device_free;
}

int cli_options_refused(int status) {
  if (status == VRAM_ESIMCAPACITY) return 1; /* VRAMKIT_SIM_CAPACITY past what the sim models */
  return (status == VRAM_EINVAL || status == VRAM_EUNSUPPORTED) &&
         vram_pool_create_report(NULL, 0) > 0;
}

/* The report of a pool that could not be made (its preallocation did not fit, or its
 * options were refused together); nothing where the library left none. */
void cli_print_create_report(void) {
  int length = vram_pool_create_report(NULL, 0);
  char *report = length > 0 ? malloc((size_t)length + 1) : NULL;
  if (report && vram_pool_create_report(report, (size_t)length + 1) > 0)
    fprintf(stderr, "%s%s", report, report[strlen(report) - 1] == '\n' ? "" : "\n");
  free(report);
}

void cli_print_oom_report(vram_pool_t *pool) {
  char *report = pool_text(pool, vram_oom_report);
  if (report && *report) fprintf(stderr, "%s%s", report,
                                 report[strlen(report) - 1] == '\n' ? "" : "\n");
  free(report);
}

void cli_print_summary(vram_pool_t *pool, FILE *out) {
  char *summary = pool_text(pool, vram_summary);
  if (!summary) {
    fprintf(stderr, "%s: vram_summary failed\n", command_name);
    return;
  }
  fputs(summary, out);
  if (*summary && summary[strlen(summary) - 1] != '\n') fputc('\n', out);
  free(summary);
}

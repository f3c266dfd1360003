/* trace_io.c - the trace reader: gzip text in, a dense op array out (see trace_io.h).
 *
 * Decompression goes through zlib's gzopen/gzgets. Where the build found no zlib headers
 * (VRAMKIT_NO_ZLIB, set by tools/CMakeLists.txt), the file is piped through `gzip -dcf`
 * instead, so that the command still builds on a machine with a compiler and nothing else.
 * Parsing is strict: a line that is not exactly a comment, a blank, an `a` line or an `f`
 * line is an error naming the file and the line, because a silently skipped op would make
 * every figure computed from the trace wrong.
 */
#define _POSIX_C_SOURCE 200809L
#include "trace_io.h"

#include "hashtab.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef VRAMKIT_NO_ZLIB
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#else
#include <zlib.h>
#endif

#define TRACE_LINE_MAX 4096
#define TRACE_MAX_STREAMS 65535

/* ---- reading lines from a compressed file ------------------------------------------- */

typedef struct line_reader {
#ifdef VRAMKIT_NO_ZLIB
  FILE *pipe;
  pid_t child;
#else
  gzFile gz;
#endif
} line_reader_t;

static void set_error(char *error, size_t cap, const char *format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(error, cap, format, args);
  va_end(args);
}

#ifdef VRAMKIT_NO_ZLIB
static int reader_open(line_reader_t *reader, const char *path, char *error, size_t cap) {
  /* Open it ourselves first so that a missing file gets our message, not gzip's. */
  FILE *probe = fopen(path, "rb");
  if (!probe) {
    set_error(error, cap, "%s: cannot open: %s", path, strerror(errno));
    return TRACE_EIO;
  }
  fclose(probe);
  int fds[2];
  if (pipe(fds) != 0) {
    set_error(error, cap, "%s: pipe: %s", path, strerror(errno));
    return TRACE_EIO;
  }
  pid_t child = fork();
  if (child < 0) {
    close(fds[0]);
    close(fds[1]);
    set_error(error, cap, "%s: fork: %s", path, strerror(errno));
    return TRACE_EIO;
  }
  if (child == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    /* -f passes a file that is not compressed through unchanged, as gzopen does. */
    execlp("gzip", "gzip", "-dcf", "--", path, (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  reader->pipe = fdopen(fds[0], "r");
  reader->child = child;
  if (!reader->pipe) {
    close(fds[0]);
    waitpid(child, NULL, 0);
    set_error(error, cap, "%s: fdopen: %s", path, strerror(errno));
    return TRACE_EIO;
  }
  return TRACE_OK;
}

static char *reader_gets(line_reader_t *reader, char *buffer, int cap) {
  return fgets(buffer, cap, reader->pipe);
}

/* Closes the reader; TRACE_EIO if decompression failed part-way. */
static int reader_close(line_reader_t *reader, const char *path, char *error, size_t cap) {
  fclose(reader->pipe);
  int status = 0;
  if (waitpid(reader->child, &status, 0) < 0 || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    set_error(error, cap, "%s: gzip could not decompress it (is gzip installed?)", path);
    return TRACE_EIO;
  }
  return TRACE_OK;
}
#else
static int reader_open(line_reader_t *reader, const char *path, char *error, size_t cap) {
  errno = 0;
  reader->gz = gzopen(path, "rb");
  if (!reader->gz) {
    set_error(error, cap, "%s: cannot open: %s", path,
              errno ? strerror(errno) : "out of memory");
    return TRACE_EIO;
  }
  gzbuffer(reader->gz, 1 << 17);
  return TRACE_OK;
}

static char *reader_gets(line_reader_t *reader, char *buffer, int cap) {
  return gzgets(reader->gz, buffer, cap);
}

static int reader_close(line_reader_t *reader, const char *path, char *error, size_t cap) {
  /* gzgets returns NULL both at the end and on a corrupt stream: ask which it was. */
  /* A truncated file reads as Z_BUF_ERROR ("unexpected end of file"). */
  int code = Z_OK;
  const char *message = gzerror(reader->gz, &code);
  int failed = code != Z_OK;
  if (failed)
    set_error(error, cap, "%s: cannot decompress: %s", path, message ? message : "error");
  gzclose(reader->gz);
  return failed ? TRACE_EIO : TRACE_OK;
}
#endif

/* ---- growing pieces of the trace ------------------------------------------------------ */

typedef struct builder {
  trace_t *trace;
  size_t op_cap;
  hashtab_t live_ids;      /* trace id -> slot, for the blocks live at this point */
  uint32_t *free_slots;    /* slots released by frees, reused before new ones */
  size_t free_slot_count, free_slot_cap;
  uint64_t *slot_sizes;    /* size of the block in each slot */
  size_t slot_size_cap;
  uint32_t stream_cap;
  unsigned __int128 live_bytes; /* wider than any sum of uint64_t sizes: never wraps */
} builder_t;

static int grow(void **array, size_t *cap, size_t element, size_t need) {
  if (need <= *cap) return 0;
  size_t new_cap = *cap ? *cap : 64;
  while (new_cap < need) new_cap *= 2;
  void *grown = realloc(*array, new_cap * element);
  if (!grown) return -1;
  *array = grown;
  *cap = new_cap;
  return 0;
}

/* Keep the id table at most half full, rehashing into a table twice as large. */
static int grow_live_ids(hashtab_t *table) {
  size_t capacity = table->mask + 1;
  if ((table->count + 1) * 2 <= capacity) return 0;
  hashtab_t bigger;
  if (hashtab_init(&bigger, capacity) != 0) return -1;
  for (size_t i = 0; i < capacity; i++)
    if (table->keys[i] != HASHTAB_EMPTY) hashtab_insert(&bigger, table->keys[i], table->values[i]);
  hashtab_close(table);
  *table = bigger;
  return 0;
}

static int stream_index(builder_t *b, uint64_t stream_id, uint16_t *index) {
  trace_t *t = b->trace;
  /* Traces have a handful of streams, so a linear look-up is plenty. */
  for (uint32_t i = 0; i < t->stream_count; i++) {
    if (t->stream_ids[i] == stream_id) {
      *index = (uint16_t)i;
      return TRACE_OK;
    }
  }
  if (t->stream_count >= TRACE_MAX_STREAMS) return TRACE_EFORMAT;
  size_t cap = b->stream_cap;
  if (grow((void **)&t->stream_ids, &cap, sizeof *t->stream_ids, t->stream_count + 1))
    return TRACE_ENOMEM;
  b->stream_cap = (uint32_t)cap;
  t->stream_ids[t->stream_count] = stream_id;
  *index = (uint16_t)t->stream_count++;
  return TRACE_OK;
}

/* ---- parsing one line ----------------------------------------------------------------- */

/* A decimal number that fills the whole field and fits in 64 bits. */
static int parse_u64(const char *field, uint64_t *out) {
  if (!*field) return -1;
  uint64_t value = 0;
  for (const char *c = field; *c; c++) {
    if (*c < '0' || *c > '9') return -1;
    uint64_t digit = (uint64_t)(*c - '0');
    if (value > (UINT64_MAX - digit) / 10) return -1;
    value = value * 10 + digit;
  }
  *out = value;
  return 0;
}

/* Split on blanks in place; returns the number of fields (at most max + 1, to detect extras). */
static int split_fields(char *line, char **fields, int max) {
  int count = 0;
  char *c = line;
  for (;;) {
    while (*c == ' ' || *c == '\t') c++;
    if (!*c) break;
    if (count > max) break;
    fields[count++] = c;
    while (*c && *c != ' ' && *c != '\t') c++;
    if (*c) *c++ = '\0';
  }
  return count;
}

static const char *trace_basename(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

static char *trace_name_of(const char *path) {
  const char *base = trace_basename(path);
  size_t length = strlen(base);
  static const char *const suffixes[] = {".trace.gz", ".trace", ".gz"};
  for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; i++) {
    size_t suffix_length = strlen(suffixes[i]);
    if (length > suffix_length && strcmp(base + length - suffix_length, suffixes[i]) == 0) {
      length -= suffix_length;
      break;
    }
  }
  char *name = malloc(length + 1);
  if (name) {
    memcpy(name, base, length);
    name[length] = '\0';
  }
  return name;
}

/* A short, printable copy of a field for an error message: a binary file must not spray
 * control bytes over the user's terminal. */
static const char *excerpt(const char *field, char *out, size_t cap) {
  size_t i = 0;
  for (; field[i] && i + 1 < cap; i++) {
    unsigned char c = (unsigned char)field[i];
    out[i] = c >= 0x20 && c < 0x7f ? (char)c : '?';
  }
  out[i] = '\0';
  if (field[i] && i >= 3) memcpy(out + i - 3, "...", 3);
  return out;
}

#define FORMAT_HINT "expected 'a ID SIZE STREAM T_US' or 'f ID STREAM T_US'"

/* One event line once its fields are checked: the numbers in the order the line gives. */
typedef struct event_line {
  int is_alloc;
  uint64_t id, size, stream_id;
} event_line_t;

/* Check that the fields form an `a` or `f` event of decimal numbers and fill *event. */
static int parse_event_fields(char **fields, int count, event_line_t *event, const char *path,
                              size_t line_number, char *error, size_t cap) {
  int is_alloc = strcmp(fields[0], "a") == 0;
  if (!is_alloc && strcmp(fields[0], "f") != 0) {
    char shown[24];
    set_error(error, cap, "%s:%zu: unknown event '%s': " FORMAT_HINT, path, line_number,
              excerpt(fields[0], shown, sizeof shown));
    return TRACE_EFORMAT;
  }
  int expected = is_alloc ? 5 : 4;
  if (count != expected) {
    set_error(error, cap, "%s:%zu: '%s' event with %d fields: " FORMAT_HINT, path,
              line_number, fields[0], count - 1);
    return TRACE_EFORMAT;
  }
  static const char *const alloc_names[] = {"ID", "SIZE", "STREAM", "T_US"};
  static const char *const free_names[] = {"ID", "STREAM", "T_US"};
  uint64_t values[4];
  for (int i = 1; i < count; i++) {
    if (parse_u64(fields[i], &values[i - 1]) != 0) {
      char shown[32];
      set_error(error, cap, "%s:%zu: %s '%s' is not an unsigned 64-bit decimal number", path,
                line_number, is_alloc ? alloc_names[i - 1] : free_names[i - 1],
                excerpt(fields[i], shown, sizeof shown));
      return TRACE_EFORMAT;
    }
  }
  if (values[0] == HASHTAB_EMPTY) {
    set_error(error, cap, "%s:%zu: ID %llu is out of range", path, line_number,
              (unsigned long long)values[0]);
    return TRACE_EFORMAT;
  }
  event->is_alloc = is_alloc;
  event->id = values[0];
  event->size = is_alloc ? values[1] : 0;
  event->stream_id = is_alloc ? values[2] : values[1];
  return TRACE_OK;
}

/* Give a newly allocated id a slot (a released one first) and count its bytes as live. */
static int add_alloc(builder_t *b, const event_line_t *event, trace_op_t *op) {
  trace_t *t = b->trace;
  uint32_t slot;
  if (b->free_slot_count) {
    slot = b->free_slots[--b->free_slot_count];
  } else {
    if (t->slot_count == UINT32_MAX) return TRACE_ENOMEM;
    slot = t->slot_count++;
    if (grow((void **)&b->slot_sizes, &b->slot_size_cap, sizeof *b->slot_sizes, t->slot_count))
      return TRACE_ENOMEM;
  }
  if (grow_live_ids(&b->live_ids) != 0) return TRACE_ENOMEM;
  hashtab_insert(&b->live_ids, event->id, slot);
  op->slot = slot;
  op->size = event->size;
  b->slot_sizes[slot] = op->size;
  b->live_bytes += op->size;
  /* A peak past 2^64 - 1 stays there (saturated), never a wrapped smaller one. */
  if (b->live_bytes > t->peak_live_bytes)
    t->peak_live_bytes = b->live_bytes > UINT64_MAX ? UINT64_MAX : (uint64_t)b->live_bytes;
  t->alloc_count++;
  return TRACE_OK;
}

/* Release the slot of a live id; the op carries the size the block had. */
static int add_free(builder_t *b, size_t where, trace_op_t *op) {
  uint32_t slot = b->live_ids.values[where];
  hashtab_remove_at(&b->live_ids, where);
  if (grow((void **)&b->free_slots, &b->free_slot_cap, sizeof *b->free_slots,
           b->free_slot_count + 1))
    return TRACE_ENOMEM;
  b->free_slots[b->free_slot_count++] = slot;
  op->slot = slot;
  op->size = b->slot_sizes[slot];
  b->live_bytes -= op->size;
  return TRACE_OK;
}

static int parse_line(builder_t *b, char *line, const char *path, size_t line_number,
                      char *error, size_t cap) {
  trace_t *t = b->trace;
  size_t length = strlen(line);
  while (length && (line[length - 1] == '\n' || line[length - 1] == '\r')) line[--length] = '\0';
  char *fields[6];
  int count = split_fields(line, fields, 5);
  if (count == 0 || fields[0][0] == '#') return TRACE_OK;

  event_line_t event;
  int rc = parse_event_fields(fields, count, &event, path, line_number, error, cap);
  if (rc != TRACE_OK) return rc;
  trace_op_t op = {0};
  op.is_alloc = (uint8_t)event.is_alloc;
  rc = stream_index(b, event.stream_id, &op.stream);
  if (rc == TRACE_EFORMAT) {
    set_error(error, cap, "%s:%zu: more than %d distinct streams", path, line_number,
              TRACE_MAX_STREAMS);
    return rc;
  }
  if (rc != TRACE_OK) return rc;

  size_t where = hashtab_find(&b->live_ids, event.id);
  if (event.is_alloc && where != SIZE_MAX) {
    set_error(error, cap, "%s:%zu: block ID %llu allocated again while still live", path,
              line_number, (unsigned long long)event.id);
    return TRACE_EFORMAT;
  }
  if (!event.is_alloc && where == SIZE_MAX) {
    /* A block allocated before recording began: nothing to replay. */
    t->unmatched_frees++;
    return TRACE_OK;
  }
  rc = event.is_alloc ? add_alloc(b, &event, &op) : add_free(b, where, &op);
  if (rc != TRACE_OK) return rc;
  if (grow((void **)&t->ops, &b->op_cap, sizeof *t->ops, t->op_count + 1)) return TRACE_ENOMEM;
  t->ops[t->op_count++] = op;
  return TRACE_OK;
}

/* The first line of a trace names the format and its version, so that a file of another
 * kind is refused at once instead of failing on some later line, or replaying as nothing. */
static int check_header(const char *line, const char *path, char *error, size_t cap) {
  static const char magic[] = TRACE_HEADER_MAGIC;
  const size_t magic_length = sizeof magic - 1;
  char shown[48];
  if (strncmp(line, magic, magic_length) != 0 ||
      (line[magic_length] != ' ' && line[magic_length] != '\t')) {
    char copy[48];
    size_t shown_length = strcspn(line, "\r\n");
    if (shown_length > sizeof copy - 1) shown_length = sizeof copy - 1;
    memcpy(copy, line, shown_length);
    copy[shown_length] = '\0';
    set_error(error, cap,
              "%s:1: not a vramkit trace: the first line must be the header '%s %s', "
              "not '%s'",
              path, magic, TRACE_FORMAT_VERSION, excerpt(copy, shown, sizeof shown));
    return TRACE_EFORMAT;
  }
  const char *version = line + magic_length;
  while (*version == ' ' || *version == '\t') version++;
  size_t version_length = strcspn(version, " \t\r\n");
  if (version_length != strlen(TRACE_FORMAT_VERSION) ||
      strncmp(version, TRACE_FORMAT_VERSION, version_length) != 0) {
    char copy[24];
    snprintf(copy, sizeof copy, "%.*s", (int)(version_length < 23 ? version_length : 23),
             version);
    set_error(error, cap, "%s:1: trace format '%s' is not one this vramkit reads (%s)", path,
              excerpt(copy, shown, sizeof shown), TRACE_FORMAT_VERSION);
    return TRACE_EFORMAT;
  }
  return TRACE_OK;
}

/* ---- the whole file ------------------------------------------------------------------- */

int trace_load(const char *path, trace_t *trace, char *error, size_t cap) {
  memset(trace, 0, sizeof *trace);
  if (cap) error[0] = '\0';
  builder_t b = {0};
  b.trace = trace;
  line_reader_t reader;
  int rc = reader_open(&reader, path, error, cap);
  if (rc != TRACE_OK) return rc;
  char *line = malloc(TRACE_LINE_MAX);
  trace->path = strdup(path);
  trace->name = trace_name_of(path);
  if (!line || !trace->path || !trace->name || hashtab_init(&b.live_ids, 1024) != 0) {
    rc = TRACE_ENOMEM;
  }
  size_t line_number = 0;
  while (rc == TRACE_OK && reader_gets(&reader, line, TRACE_LINE_MAX)) {
    line_number++;
    size_t length = strlen(line);
    if (length == TRACE_LINE_MAX - 1 && line[length - 1] != '\n') {
      set_error(error, cap, "%s:%zu: line longer than %d characters", path, line_number,
                TRACE_LINE_MAX - 2);
      rc = TRACE_EFORMAT;
      break;
    }
    rc = line_number == 1 ? check_header(line, path, error, cap)
                          : parse_line(&b, line, path, line_number, error, cap);
  }
  char close_error[512];
  int close_rc = reader_close(&reader, path, close_error, sizeof close_error);
  if (rc == TRACE_OK && close_rc != TRACE_OK) {
    set_error(error, cap, "%s", close_error);
    rc = close_rc;
  }
  if (rc == TRACE_OK && line_number == 0) {
    set_error(error, cap, "%s: empty file: a trace starts with the header line '%s %s'", path,
              TRACE_HEADER_MAGIC, TRACE_FORMAT_VERSION);
    rc = TRACE_EFORMAT;
  }
  if (rc == TRACE_ENOMEM) set_error(error, cap, "%s: out of host memory while reading", path);
  if (rc == TRACE_OK) trace->left_live = (uint32_t)b.live_ids.count;
  free(line);
  hashtab_close(&b.live_ids);
  free(b.free_slots);
  free(b.slot_sizes);
  if (rc != TRACE_OK) trace_free(trace);
  return rc;
}

void trace_free(trace_t *trace) {
  free(trace->path);
  free(trace->name);
  free(trace->ops);
  free(trace->stream_ids);
  memset(trace, 0, sizeof *trace);
}

/* reader.c - the one reader of allocation traces (format v1, grammar in vramkit.h):
 * vram_trace_reader_open/next/close, used by the vramkit command and, through the Python
 * extension, by the Python package, so that every tool accepts and refuses the same files.
 *
 * The file is read in blocks and cut into lines here, byte by byte, rather than with a
 * C-string line reader: such a reader stops at a NUL, so whatever followed a NUL on a line
 * was dropped unseen, and a long line with a NUL could leave its tail to be parsed as a
 * hidden line. Every byte is checked as it arrives, so a run of binary data fails at its
 * first byte instead of being buffered. Memory is bounded: one line, one block of input,
 * and the table of live ids (which grows with blocks live at once, not with the file).
 *
 * Decompression goes through zlib's gzread, which passes a file that is not gzip through
 * unchanged. Where the build found no zlib headers (VRAMKIT_NO_ZLIB), the file is piped
 * through `gzip -dcf` instead, so that the library still builds with a compiler alone.
 */
#define _POSIX_C_SOURCE 200809L
#include "vramkit.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prim/grow.h"
#include "prim/hashtab.h"
#include "trace/input.h"

#define TRACE_MAGIC "# vramkit-trace"
#define TRACE_VERSION "v1"
#define FORMAT_HINT "expected 'a ID SIZE STREAM T_US' or 'f ID STREAM T_US'"

struct vram_trace_reader {
  _vram_trace_input input;
  char *path;
  char line[VRAM_TRACE_LINE_MAX + 1];
  uint64_t line_number;
  uint64_t ops, max_ops;
  int status;               /* sticky: once an error, every call returns it */
  int at_end;
  hashtab_t live;           /* block id -> slot, for the blocks live now */
  uint32_t *free_slots;     /* slots released by frees, reused before new ones */
  size_t free_slot_count, free_slot_cap;
  uint64_t *slot_sizes;     /* size of the block in each slot */
  size_t slot_cap;
  uint32_t slot_count;
  char error[512];
};

static int fail(vram_trace_reader_t *r, int status, const char *format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(r->error, sizeof r->error, format, args);
  va_end(args);
  r->status = status;
  return status;
}

/* A printable copy of file content for a message: control bytes and bytes past ASCII
 * become escapes, so that a binary file cannot write over the user's terminal. */
static const char *escaped(const char *text, size_t length, char *out, size_t cap) {
  size_t o = 0, i = 0;
  for (; i < length; i++) {
    unsigned char c = (unsigned char)text[i];
    char piece[8];
    int n = c >= 0x20 && c < 0x7f && c != '\\' ? snprintf(piece, sizeof piece, "%c", c)
                                               : snprintf(piece, sizeof piece, "\\x%02x", c);
    if (o + (size_t)n + 4 > cap) break; /* room for "..." and the NUL */
    memcpy(out + o, piece, (size_t)n);
    o += (size_t)n;
  }
  if (i < length) memcpy(out + o, "...", 3), o += 3;
  out[o] = '\0';
  return out;
}

/* ---- cutting the input into checked lines ------------------------------------------- */

/* Why byte c may not stand in a line, or NULL if it may ('\r' is checked by the caller:
 * it may only end a line). */
static const char *bad_byte(unsigned char c) {
  if (c == '\0') return "a NUL byte";
  if (c >= 0x80) return "a byte outside ASCII";
  if (c < 0x20 && c != '\t' && c != '\r') return "a control byte";
  if (c == 0x7f) return "a control byte";
  return NULL;
}

/* Read the next line into r->line (without its end); 1 read, 0 at the end, or a status. */
static int next_line(vram_trace_reader_t *r) {
  size_t length = 0;
  int any = 0;
  for (;;) {
    int c = _vram_trace_input_byte(&r->input);
    if (c == _VRAM_TRACE_INPUT_ERROR)
      return fail(r, VRAM_EIO, "%s: %s", r->path, _vram_trace_input_error(&r->input));
    if (c == _VRAM_TRACE_INPUT_END) {
      if (!any) return 0;
      break;
    }
    if (!any) r->line_number++;
    any = 1;
    if (c == '\n') break;
    const char *why = bad_byte((unsigned char)c);
    char byte = (char)c;
    size_t column = length + 1;
    if (!why && length && r->line[length - 1] == '\r') {
      why = "a carriage return inside a line";
      byte = '\r';
      column = length;
    }
    if (why) {
      char shown[16];
      return fail(r, VRAM_ETRACE, "%s:%llu: %s ('%s') at column %zu: a trace line holds "
                  "printable ASCII, blanks and tabs only", r->path,
                  (unsigned long long)r->line_number, why, escaped(&byte, 1, shown, sizeof shown),
                  column);
    }
    if (length == VRAM_TRACE_LINE_MAX - 1)
      return fail(r, VRAM_ETRACE, "%s:%llu: line longer than %d bytes", r->path,
                  (unsigned long long)r->line_number, VRAM_TRACE_LINE_MAX - 1);
    r->line[length++] = (char)c;
  }
  if (length && r->line[length - 1] == '\r') length--;
  r->line[length] = '\0';
  return 1;
}

/* ---- the header and the event lines -------------------------------------------------- */

/* The first line names the format and its version, so that a file of another kind is
 * refused at once instead of failing on some later line, or replaying as nothing. */
static int check_header(vram_trace_reader_t *r) {
  const char *line = r->line;
  const size_t magic_length = sizeof TRACE_MAGIC - 1;
  char shown[64];
  if (strncmp(line, TRACE_MAGIC, magic_length) != 0 ||
      (line[magic_length] != ' ' && line[magic_length] != '\t')) {
    size_t length = strlen(line);
    return fail(r, VRAM_ETRACE, "%s:1: not a vramkit trace: the first line must be the "
                "header '%s %s', not '%s'", r->path, TRACE_MAGIC, TRACE_VERSION,
                escaped(line, length < 40 ? length : 40, shown, sizeof shown));
  }
  const char *version = line + magic_length;
  while (*version == ' ' || *version == '\t') version++;
  size_t version_length = strcspn(version, " \t");
  if (version_length != strlen(TRACE_VERSION) ||
      strncmp(version, TRACE_VERSION, version_length) != 0)
    return fail(r, VRAM_ETRACE, "%s:1: trace format '%s' is not one this vramkit reads (%s)",
                r->path, escaped(version, version_length < 20 ? version_length : 20, shown,
                                 sizeof shown), TRACE_VERSION);
  return VRAM_OK;
}

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

/* Split on blanks and tabs in place; returns the number of fields (at most max + 1, so
 * that extras are seen). */
static int split_fields(char *line, char **fields, int max) {
  int count = 0;
  char *c = line;
  for (;;) {
    while (*c == ' ' || *c == '\t') c++;
    if (!*c || count > max) break;
    fields[count++] = c;
    while (*c && *c != ' ' && *c != '\t') c++;
    if (*c) *c++ = '\0';
  }
  return count;
}

/* Check that the fields form an `a` or `f` event of decimal numbers and fill *op's
 * numbers. */
static int parse_event(vram_trace_reader_t *r, char **fields, int count, vram_trace_op_t *op) {
  unsigned long long line = (unsigned long long)r->line_number;
  char shown[64];
  int is_alloc = strcmp(fields[0], "a") == 0;
  if (!is_alloc && strcmp(fields[0], "f") != 0)
    return fail(r, VRAM_ETRACE, "%s:%llu: unknown event '%s': " FORMAT_HINT, r->path, line,
                escaped(fields[0], strnlen(fields[0], 20), shown, sizeof shown));
  if (count != (is_alloc ? 5 : 4))
    return fail(r, VRAM_ETRACE, "%s:%llu: '%s' event with %d fields: " FORMAT_HINT, r->path,
                line, fields[0], count - 1);
  static const char *const alloc_names[] = {"ID", "SIZE", "STREAM", "T_US"};
  static const char *const free_names[] = {"ID", "STREAM", "T_US"};
  uint64_t values[4];
  for (int i = 1; i < count; i++)
    if (parse_u64(fields[i], &values[i - 1]) != 0)
      return fail(r, VRAM_ETRACE, "%s:%llu: %s '%s' is not an unsigned 64-bit decimal number",
                  r->path, line, is_alloc ? alloc_names[i - 1] : free_names[i - 1],
                  escaped(fields[i], strnlen(fields[i], 24), shown, sizeof shown));
  if (values[0] == HASHTAB_EMPTY)
    return fail(r, VRAM_ETRACE, "%s:%llu: ID %llu is out of range", r->path, line,
                (unsigned long long)values[0]);
  memset(op, 0, sizeof *op);
  op->is_alloc = (uint8_t)is_alloc;
  op->id = values[0];
  op->size = is_alloc ? values[1] : 0;
  op->stream = is_alloc ? values[2] : values[1];
  op->time_us = is_alloc ? values[3] : values[2];
  op->line = r->line_number;
  return VRAM_OK;
}

/* Give a newly allocated id a slot (a released one first), or take a live id's slot back:
 * the slots are what lets a replay keep its blocks in an array. */
static int track(vram_trace_reader_t *r, vram_trace_op_t *op) {
  size_t where = hashtab_find(&r->live, op->id);
  if (!op->is_alloc) {
    if (where == SIZE_MAX) return VRAM_OK; /* allocated before the recording began */
    op->slot = r->live.values[where];
    op->size = r->slot_sizes[op->slot];
    op->matched = 1;
    hashtab_remove_at(&r->live, where);
    if (_vram_grow((void **)&r->free_slots, &r->free_slot_cap, sizeof *r->free_slots,
             r->free_slot_count + 1))
      return VRAM_EHOSTMEM;
    r->free_slots[r->free_slot_count++] = op->slot;
    return VRAM_OK;
  }
  if (where != SIZE_MAX)
    return fail(r, VRAM_ETRACE, "%s:%llu: block ID %llu allocated again while still live",
                r->path, (unsigned long long)r->line_number, (unsigned long long)op->id);
  if (hashtab_reserve(&r->live) != 0) return VRAM_EHOSTMEM;
  if (r->free_slot_count) {
    op->slot = r->free_slots[--r->free_slot_count];
  } else {
    if (r->slot_count == UINT32_MAX ||
        _vram_grow((void **)&r->slot_sizes, &r->slot_cap, sizeof *r->slot_sizes,
                   r->slot_count + 1))
      return VRAM_EHOSTMEM;
    op->slot = r->slot_count++;
  }
  hashtab_insert(&r->live, op->id, op->slot);
  r->slot_sizes[op->slot] = op->size;
  return VRAM_OK;
}

/* ---- the public calls ------------------------------------------------------------------ */

int vram_trace_reader_next(vram_trace_reader_t *r, vram_trace_op_t *op) {
  if (!r || !op) return VRAM_EINVAL;
  while (r->status == VRAM_OK && !r->at_end) {
    int got = next_line(r);
    if (got < 0) break;
    if (got == 0) {
      r->at_end = 1;
      break;
    }
    char *fields[6];
    int count = split_fields(r->line, fields, 5);
    if (count == 0 || fields[0][0] == '#') continue;
    if (r->max_ops && r->ops == r->max_ops)
      return fail(r, VRAM_ELIMIT, "%s:%llu: the trace has more than %llu ops, the most it "
                  "may have here", r->path, (unsigned long long)r->line_number,
                  (unsigned long long)r->max_ops);
    if (parse_event(r, fields, count, op) != VRAM_OK) break;
    int rc = track(r, op);
    if (rc == VRAM_EHOSTMEM)
      return fail(r, rc, "%s:%llu: out of host memory while reading", r->path,
                  (unsigned long long)r->line_number);
    if (rc != VRAM_OK) break;
    r->ops++;
    return 1;
  }
  return r->status;
}

int vram_trace_reader_open(const char *path, uint64_t max_ops, vram_trace_reader_t **out,
                           char *error, size_t cap) {
  if (cap) error[0] = '\0';
  if (!out || !path) return VRAM_EINVAL;
  *out = NULL;
  vram_trace_reader_t *r = calloc(1, sizeof *r);
  if (!r || !(r->path = strdup(path)) || hashtab_init(&r->live, 1024) != 0) {
    if (r) free(r->path);
    free(r);
    if (cap) snprintf(error, cap, "%s: out of host memory", path);
    return VRAM_EHOSTMEM;
  }
  r->max_ops = max_ops;
  int rc = _vram_trace_input_open(&r->input, path, r->error, sizeof r->error);
  if (rc == VRAM_OK) {
    int got = next_line(r);
    if (got == 0)
      fail(r, VRAM_ETRACE, "%s: empty file: a trace starts with the header line '%s %s'",
           path, TRACE_MAGIC, TRACE_VERSION);
    else if (got > 0)
      check_header(r);
    rc = r->status;
  }
  if (rc != VRAM_OK) {
    if (cap) snprintf(error, cap, "%s", r->error);
    vram_trace_reader_close(r);
    return rc;
  }
  *out = r;
  return VRAM_OK;
}

const char *vram_trace_reader_error(const vram_trace_reader_t *r) { return r ? r->error : ""; }

uint64_t vram_trace_reader_live(const vram_trace_reader_t *r) { return r ? r->live.count : 0; }

void vram_trace_reader_close(vram_trace_reader_t *r) {
  if (!r) return;
  _vram_trace_input_close(&r->input);
  hashtab_close(&r->live);
  free(r->free_slots);
  free(r->slot_sizes);
  free(r->path);
  free(r);
}

/* writer.c - the one writer of allocation traces (format v1, grammar in vramkit.h):
 * vram_trace_writer_open/put/close, used by the Python package (save_trace, the estimator)
 * through its extension, so that every trace vramkit writes is one its reader
 * (reader.c) reads back, op for op.
 *
 * What the reader would refuse is refused here, before a byte of it is written: a header
 * with a line end or a control byte, or longer than a line may be; the one ID the reader
 * cannot hold; an ID allocated again while live. A free of an ID that is not live is
 * written, as the reader accepts it (a block from before the recording). Any refusal or
 * write failure is sticky, and closing a writer that failed removes the file it made, so
 * that no failed write leaves a shorter trace that reads as a whole one. A full disk is
 * seen at the latest by the final flush, whose status close returns.
 *
 * The output is gzip through zlib. Where the build has no zlib (VRAMKIT_NO_ZLIB) it is
 * plain text, which the reader reads the same way (gzread and `gzip -dcf` pass it through).
 */
#define _POSIX_C_SOURCE 200809L
#include "vramkit.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "prim/hashtab.h"

#ifndef VRAMKIT_NO_ZLIB
#include <zlib.h>
#endif

#define TRACE_HEADER_START "# vramkit-trace v1"
#define WRITER_BUFFER (1 << 16)
#define LINE_ROOM 96 /* "a " and four 20-digit numbers, blanks and the end, with margin */

struct vram_trace_writer {
  char *path;
  int regular;            /* the path is a regular file this writer made: removed on failure */
#ifdef VRAMKIT_NO_ZLIB
  int fd;
#else
  gzFile gz;
#endif
  char *buffer;           /* WRITER_BUFFER bytes of lines not yet handed to the output */
  size_t used;
  uint64_t ops;
  hashtab_t live;         /* the IDs allocated and not yet freed */
  int status;             /* sticky: once an error, every call returns it */
  char error[512];
};

static int fail(vram_trace_writer_t *w, int status, const char *format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(w->error, sizeof w->error, format, args);
  va_end(args);
  w->status = status;
  return status;
}

/* ---- the output ----------------------------------------------------------------------- */

/* Hand the buffered lines to the file (through zlib when there is one). */
static int flush_buffer(vram_trace_writer_t *w) {
  if (w->used == 0) return VRAM_OK;
#ifdef VRAMKIT_NO_ZLIB
  size_t done = 0;
  while (done < w->used) {
    ssize_t wrote = write(w->fd, w->buffer + done, w->used - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0)
      return fail(w, VRAM_EIO, "%s: cannot write: %s", w->path,
                  wrote < 0 ? strerror(errno) : "no progress");
    done += (size_t)wrote;
  }
#else
  errno = 0;
  if (gzwrite(w->gz, w->buffer, (unsigned)w->used) != (int)w->used)
    return fail(w, VRAM_EIO, "%s: cannot write: %s", w->path,
                errno ? strerror(errno) : "compression failed");
#endif
  w->used = 0;
  return VRAM_OK;
}

/* Close the output; VRAM_OK only if every byte reached the file. */
static int close_output(vram_trace_writer_t *w) {
#ifdef VRAMKIT_NO_ZLIB
  if (w->fd < 0) return VRAM_OK;
  int rc = close(w->fd);
  w->fd = -1;
#else
  if (!w->gz) return VRAM_OK;
  errno = 0;
  int rc = gzclose(w->gz) == Z_OK ? 0 : -1;
  w->gz = NULL;
#endif
  if (rc != 0 && w->status == VRAM_OK)
    return fail(w, VRAM_EIO, "%s: cannot write the end of the trace: %s", w->path,
                errno ? strerror(errno) : "compression failed");
  return VRAM_OK;
}

static void free_writer(vram_trace_writer_t *w) {
  hashtab_close(&w->live);
  free(w->buffer);
  free(w->path);
  free(w);
}

/* Unsigned decimal of value at out; returns the digits written. */
static size_t put_decimal(char *out, uint64_t value) {
  char digits[20];
  size_t count = 0;
  do digits[count++] = (char)('0' + value % 10);
  while ((value /= 10) != 0);
  for (size_t i = 0; i < count; i++) out[i] = digits[count - 1 - i];
  return count;
}

/* ---- checks ----------------------------------------------------------------------------- */

/* Why the header cannot follow "# vramkit-trace v1 " on the reader's first line, or NULL. */
static const char *bad_header(const char *header, size_t *column) {
  size_t length = strlen(header);
  for (size_t i = 0; i < length; i++) {
    unsigned char c = (unsigned char)header[i];
    if ((c < 0x20 && c != '\t') || c >= 0x7f) {
      *column = i + 1;
      return "a byte that is not printable ASCII, a blank or a tab";
    }
  }
  *column = 0;
  if (length > VRAM_TRACE_HEADER_MAX) return "longer than a trace line may be";
  return NULL;
}

/* ---- the public calls ------------------------------------------------------------------ */

int vram_trace_writer_open(const char *path, const char *header, vram_trace_writer_t **out,
                           char *error, size_t cap) {
  if (cap) error[0] = '\0';
  if (!out || !path) return VRAM_EINVAL;
  *out = NULL;
  if (!header) header = "";
  size_t column;
  const char *why = bad_header(header, &column);
  if (why) {
    if (cap && column)
      snprintf(error, cap, "%s: trace header has %s at column %zu", path, why, column);
    else if (cap)
      snprintf(error, cap, "%s: trace header of %zu bytes is %s (at most %d)", path,
               strlen(header), why, VRAM_TRACE_HEADER_MAX);
    return VRAM_EINVAL;
  }
  vram_trace_writer_t *w = calloc(1, sizeof *w);
  if (!w || !(w->path = strdup(path)) || !(w->buffer = malloc(WRITER_BUFFER)) ||
      hashtab_init(&w->live, 1024) != 0) {
    if (w) free(w->buffer), free(w->path);
    free(w);
    if (cap) snprintf(error, cap, "%s: out of host memory", path);
    return VRAM_EHOSTMEM;
  }
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  struct stat info;
  if (fd < 0 || fstat(fd, &info) != 0) {
    if (cap) snprintf(error, cap, "%s: cannot open for writing: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    free_writer(w);
    return VRAM_EIO;
  }
  /* Only a regular file is removed on failure: never a device such as /dev/stdout. */
  w->regular = S_ISREG(info.st_mode);
#ifdef VRAMKIT_NO_ZLIB
  w->fd = fd;
#else
  w->gz = gzdopen(fd, "wb");
  if (!w->gz) {
    close(fd);
    if (w->regular) unlink(path);
    free_writer(w);
    if (cap) snprintf(error, cap, "%s: out of host memory", path);
    return VRAM_EHOSTMEM;
  }
  gzbuffer(w->gz, 1 << 17);
#endif
  w->used = (size_t)snprintf(w->buffer, WRITER_BUFFER, "%s%s%s\n", TRACE_HEADER_START,
                             *header ? " " : "", header);
  *out = w;
  return VRAM_OK;
}

/* Refuse what the reader would refuse, and keep the set of live IDs the reader keeps. */
static int check_and_track(vram_trace_writer_t *w, const vram_trace_op_t *op) {
  if (op->is_alloc > 1)
    return fail(w, VRAM_EINVAL, "%s: op %llu: is_alloc is %u, not 0 or 1", w->path,
                (unsigned long long)w->ops + 1, (unsigned)op->is_alloc);
  if (op->id == HASHTAB_EMPTY)
    return fail(w, VRAM_EINVAL, "%s: op %llu: ID %llu is out of range (below 2^64 - 1)",
                w->path, (unsigned long long)w->ops + 1, (unsigned long long)op->id);
  size_t where = hashtab_find(&w->live, op->id);
  if (!op->is_alloc) {
    if (where != SIZE_MAX) hashtab_remove_at(&w->live, where);
    return VRAM_OK;
  }
  if (where != SIZE_MAX)
    return fail(w, VRAM_ETRACE, "%s: op %llu: block ID %llu allocated again while still live",
                w->path, (unsigned long long)w->ops + 1, (unsigned long long)op->id);
  if (hashtab_reserve(&w->live) != 0)
    return fail(w, VRAM_EHOSTMEM, "%s: out of host memory while writing", w->path);
  hashtab_insert(&w->live, op->id, 0);
  return VRAM_OK;
}

int vram_trace_writer_put(vram_trace_writer_t *w, const vram_trace_op_t *op) {
  if (!w) return VRAM_EINVAL;
  if (w->status != VRAM_OK) return w->status;
  if (!op) return fail(w, VRAM_EINVAL, "%s: no op given", w->path);
  if (check_and_track(w, op) != VRAM_OK) return w->status;
  if (w->used + LINE_ROOM > WRITER_BUFFER && flush_buffer(w) != VRAM_OK) return w->status;
  char *line = w->buffer + w->used;
  size_t length = 0;
  line[length++] = op->is_alloc ? 'a' : 'f';
  line[length++] = ' ';
  length += put_decimal(line + length, op->id);
  if (op->is_alloc) {
    line[length++] = ' ';
    length += put_decimal(line + length, op->size);
  }
  line[length++] = ' ';
  length += put_decimal(line + length, op->stream);
  line[length++] = ' ';
  length += put_decimal(line + length, op->time_us);
  line[length++] = '\n';
  w->used += length;
  w->ops++;
  return VRAM_OK;
}

const char *vram_trace_writer_error(const vram_trace_writer_t *w) { return w ? w->error : ""; }

uint64_t vram_trace_writer_ops(const vram_trace_writer_t *w) { return w ? w->ops : 0; }

int vram_trace_writer_close(vram_trace_writer_t *w, char *error, size_t cap) {
  if (cap) error[0] = '\0';
  if (!w) return VRAM_EINVAL;
  if (w->status == VRAM_OK) flush_buffer(w);
  close_output(w);
  int status = w->status;
  if (status != VRAM_OK) {
    if (w->regular) unlink(w->path);
    if (cap) snprintf(error, cap, "%s", w->error);
  }
  free_writer(w);
  return status;
}

void vram_trace_writer_discard(vram_trace_writer_t *w) {
  if (!w) return;
  if (w->status == VRAM_OK) w->status = VRAM_EINVAL; /* so that close removes the file */
  vram_trace_writer_close(w, NULL, 0);
}

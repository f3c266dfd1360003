/* load.c - the trace loader: the library's reader in, a dense op array out (see
 * load.h). Parsing and its checks belong to the reader (src/trace/reader.c); what is
 * here is the replay's own bookkeeping: stream numbers to indices, through a hash table so
 * that a trace with thousands of streams costs no more per op than one with two, and the
 * peak of live bytes.
 */
#define _POSIX_C_SOURCE 200809L
#include "load.h"

#include "prim/grow.h"
#include "prim/hashtab.h"
#include "vramkit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct builder {
  trace_t *trace;
  size_t op_cap;
  size_t stream_cap;
  hashtab_t streams;  /* trace stream number -> index into trace.stream_ids */
  int32_t empty_key_index; /* the index of stream HASHTAB_EMPTY, or -1 */
  unsigned __int128 live_bytes; /* wider than any sum of uint64_t sizes: never wraps */
} builder_t;

/* The index of a stream number, given one on first sight. */
static int stream_index(builder_t *b, uint64_t stream_id, uint16_t *index) {
  trace_t *t = b->trace;
  /* The table cannot hold its empty key, so that one stream number has a field of its own. */
  int special = stream_id == HASHTAB_EMPTY;
  size_t where = special ? SIZE_MAX : hashtab_find(&b->streams, stream_id);
  if (special && b->empty_key_index >= 0) {
    *index = (uint16_t)b->empty_key_index;
    return TRACE_OK;
  }
  if (where != SIZE_MAX) {
    *index = (uint16_t)b->streams.values[where];
    return TRACE_OK;
  }
  if (t->stream_count >= TRACE_MAX_STREAMS) return TRACE_ELIMIT;
  if (hashtab_reserve(&b->streams) != 0 ||
      _vram_grow((void **)&t->stream_ids, &b->stream_cap, sizeof *t->stream_ids,
                 t->stream_count + 1))
    return TRACE_ENOMEM;
  if (special) b->empty_key_index = (int32_t)t->stream_count;
  else hashtab_insert(&b->streams, stream_id, t->stream_count);
  t->stream_ids[t->stream_count] = stream_id;
  *index = (uint16_t)t->stream_count++;
  return TRACE_OK;
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

/* Keep one op the reader gave: unmatched frees are counted, not kept (nothing to replay). */
static int add_op(builder_t *b, const vram_trace_op_t *in) {
  trace_t *t = b->trace;
  if (!in->is_alloc && !in->matched) {
    t->unmatched_frees++;
    return TRACE_OK;
  }
  trace_op_t op = {.size = in->size, .slot = in->slot, .is_alloc = in->is_alloc};
  int rc = stream_index(b, in->stream, &op.stream);
  if (rc != TRACE_OK) return rc;
  if (_vram_grow((void **)&t->ops, &b->op_cap, sizeof *t->ops, t->op_count + 1))
    return TRACE_ENOMEM;
  t->ops[t->op_count++] = op;
  if (in->slot >= t->slot_count) t->slot_count = in->slot + 1;
  if (in->is_alloc) {
    t->alloc_count++;
    b->live_bytes += in->size;
    /* A peak past 2^64 - 1 stays there (saturated), never a wrapped smaller one. */
    if (b->live_bytes > t->peak_live_bytes)
      t->peak_live_bytes = b->live_bytes > UINT64_MAX ? UINT64_MAX : (uint64_t)b->live_bytes;
  } else {
    b->live_bytes -= in->size;
  }
  return TRACE_OK;
}

static int status_of(int vram_status) {
  switch (vram_status) {
  case VRAM_EIO: return TRACE_EIO;
  case VRAM_EHOSTMEM: return TRACE_ENOMEM;
  case VRAM_ELIMIT: return TRACE_ELIMIT;
  default: return TRACE_EFORMAT;
  }
}

int _vram_trace_load(const char *path, uint64_t max_ops, trace_t *trace, char *error, size_t cap) {
  memset(trace, 0, sizeof *trace);
  if (cap) error[0] = '\0';
  builder_t b = {.trace = trace, .empty_key_index = -1};
  vram_trace_reader_t *reader = NULL;
  int rc = vram_trace_reader_open(path, max_ops, &reader, error, cap);
  if (rc != VRAM_OK) return status_of(rc);
  trace->path = strdup(path);
  trace->name = trace_name_of(path);
  rc = trace->path && trace->name && hashtab_init(&b.streams, 16) == 0 ? TRACE_OK
                                                                        : TRACE_ENOMEM;
  vram_trace_op_t op;
  int got = 0;
  while (rc == TRACE_OK && (got = vram_trace_reader_next(reader, &op)) == 1) {
    rc = add_op(&b, &op);
    if (rc == TRACE_ELIMIT)
      snprintf(error, cap, "%s:%llu: more than %d distinct streams", path,
               (unsigned long long)op.line, TRACE_MAX_STREAMS);
  }
  if (rc == TRACE_OK && got < 0) {
    rc = status_of(got);
    snprintf(error, cap, "%s", vram_trace_reader_error(reader));
  }
  if (rc == TRACE_ENOMEM) snprintf(error, cap, "%s: out of host memory while reading", path);
  if (rc == TRACE_OK) trace->left_live = (uint32_t)vram_trace_reader_live(reader);
  vram_trace_reader_close(reader);
  if (b.streams.keys) hashtab_close(&b.streams);
  if (rc != TRACE_OK) _vram_trace_free(trace);
  return rc;
}

void _vram_trace_free(trace_t *trace) {
  free(trace->path);
  free(trace->name);
  free(trace->ops);
  free(trace->stream_ids);
  memset(trace, 0, sizeof *trace);
}

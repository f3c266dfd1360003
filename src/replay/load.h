/* load.h - allocation traces (format v1) loaded into memory for a timed replay.
 *
 * The format and its one reader are the library's (vramkit.h, vram_trace_reader_*): this
 * file only keeps what the reader hands over in the compact form a replay loop wants. A
 * trace is loaded completely before anything is timed: ids are already dense slots (a slot
 * is unique among live blocks and slots are reused, so a replay needs only an array of
 * slot_count pointers), streams become small indices, and the peak of live bytes is
 * computed from the op sizes, independently of any allocator. An op costs sizeof(trace_op_t)
 * bytes, so the loader refuses a trace past max_ops rather than grow without bound.
 */
#ifndef VRAMKIT_REPLAY_LOAD_H
#define VRAMKIT_REPLAY_LOAD_H

#include <stddef.h>
#include <stdint.h>

typedef struct trace_op {
  uint64_t size;     /* allocation: bytes asked for; free: the size the block had */
  uint32_t slot;     /* dense block index, < trace.slot_count */
  uint16_t stream;   /* index into trace.stream_ids */
  uint8_t is_alloc;  /* 1: allocate, 0: free */
} trace_op_t;

typedef struct trace {
  char *path;
  char *name;               /* file name without directory and ".trace.gz" */
  trace_op_t *ops;
  size_t op_count;
  size_t alloc_count;
  size_t unmatched_frees;   /* frees of ids that were not live: skipped, not replayed */
  uint32_t slot_count;      /* most blocks live at once */
  uint32_t left_live;       /* blocks still live at the end of the trace */
  uint64_t *stream_ids;     /* the trace's opaque stream numbers, in order of appearance */
  uint32_t stream_count;
  uint64_t peak_live_bytes; /* largest sum of live block sizes; UINT64_MAX if at or past it */
} trace_t;

typedef enum trace_status {
  TRACE_OK = 0,
  TRACE_EIO = -1,     /* cannot open or decompress the file */
  TRACE_EFORMAT = -2, /* no header, or a malformed line; the message names file and line */
  TRACE_ENOMEM = -3,  /* out of host memory */
  TRACE_ELIMIT = -4   /* more than max_ops events, or more streams than an op can name */
} trace_status;

/* The most distinct streams a trace may use: trace_op_t.stream's range. */
#define TRACE_MAX_STREAMS 65535

/* Load the gzip (or plain) text trace at path, refusing it past max_ops events (0: no
 * limit). On failure, writes a message naming the file (and line) into error and leaves
 * *trace empty. */
int _vram_trace_load(const char *path, uint64_t max_ops, trace_t *trace, char *error,
               size_t error_cap);
void _vram_trace_free(trace_t *trace);

#endif

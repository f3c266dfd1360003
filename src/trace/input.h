/* input.h - the bytes of a trace file, decompressed: zlib's gzread, or a `gzip -dcf` pipe
 * where the build has no zlib (VRAMKIT_NO_ZLIB). The reader (reader.c) takes them one at a
 * time through an inline call that touches the buffer only; refills happen in input.c. */
#ifndef VRAM_TRACE_INPUT_H
#define VRAM_TRACE_INPUT_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#define _VRAM_TRACE_INPUT_END (-1)
#define _VRAM_TRACE_INPUT_ERROR (-2)
#define _VRAM_TRACE_INPUT_BLOCK (1 << 16)

typedef struct _vram_trace_input {
  void *gz;              /* gzFile, or NULL */
  FILE *pipe;            /* the gzip child's output, without zlib */
  pid_t child;
  const char *path;
  unsigned char *buffer; /* _VRAM_TRACE_INPUT_BLOCK bytes */
  size_t position, length;
  int finished;          /* 1 at a clean end, -1 after an error */
  char error[256];
} _vram_trace_input;

/* VRAM_OK, or VRAM_EIO / VRAM_EHOSTMEM with a message naming path in error. */
int _vram_trace_input_open(_vram_trace_input *in, const char *path, char *error, size_t cap);
/* Refill the buffer; the next byte, or _VRAM_TRACE_INPUT_END / _ERROR. */
int _vram_trace_input_refill(_vram_trace_input *in);
const char *_vram_trace_input_error(const _vram_trace_input *in);
/* Safe on an input that failed to open or was never opened (all zero). */
void _vram_trace_input_close(_vram_trace_input *in);

static inline int _vram_trace_input_byte(_vram_trace_input *in) {
  if (in->position < in->length) return in->buffer[in->position++];
  return _vram_trace_input_refill(in);
}

#endif

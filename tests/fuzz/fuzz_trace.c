/* fuzz_trace.c - the one trace reader (vram_trace_reader_*), which the command, plot and the
 * Python package all read traces through, on any file: gzip or plain text, as a user or a
 * download hands it over. It reads op by op to the end or to an error; an error has a
 * message naming the file, an op is one of the grammar's, and the reader stops at its op
 * limit. The first byte selects gzip (odd: the rest is compressed first) so that the
 * decompressor's side is fuzzed too. */
#define _GNU_SOURCE
#include <stdio.h>
#include <unistd.h>
#include <zlib.h>

#include "fuzz.h"
#include "vramkit.h"

/* Small, so that a decompression bomb in the corpus costs little: the limit is the point. */
#define FUZZ_MAX_OPS 100000

static char path[256];

static void write_input(const uint8_t *data, size_t size, int gzip) {
  if (!path[0]) {
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(path, sizeof path, "%s/vramkit-fuzz-trace-%d.trace", tmp, (int)getpid());
  }
  if (gzip) {
    gzFile g = gzopen(path, "wb");
    if (!g || (size && gzwrite(g, data, (unsigned)size) != (int)size)) abort();
    gzclose(g);
  } else {
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size)) abort();
    fclose(f);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  write_input(data + 1, size - 1, data[0] & 1);
  char error[512];
  vram_trace_reader_t *reader = NULL;
  int rc = vram_trace_reader_open(path, FUZZ_MAX_OPS, &reader, error, sizeof error);
  if (rc != VRAM_OK) {
    if (reader || !strstr(error, path)) {
      fprintf(stderr, "a refused trace without the file's name: '%s'\n", error);
      abort();
    }
    return 0;
  }
  vram_trace_op_t op;
  uint64_t ops = 0;
  while ((rc = vram_trace_reader_next(reader, &op)) == 1) {
    if (op.is_alloc > 1 || ++ops > FUZZ_MAX_OPS) {
      fprintf(stderr, "op %llu: is_alloc %u\n", (unsigned long long)ops, op.is_alloc);
      abort();
    }
  }
  if (rc < 0 && !strstr(vram_trace_reader_error(reader), path)) {
    fprintf(stderr, "an error without the file's name: '%s'\n", vram_trace_reader_error(reader));
    abort();
  }
  if (rc < 0 && vram_trace_reader_next(reader, &op) != rc) {
    fprintf(stderr, "the reader went on past its error\n");
    abort();
  }
  vram_trace_reader_close(reader);
  return 0;
}

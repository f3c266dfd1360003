/* fuzz.h - what the fuzz targets of tests/fuzz share: the entry point every target defines
 * (libFuzzer's), and a copy of the input as a NUL-terminated string, since the readers under
 * test take C strings as users hand them over. */
#ifndef VRAM_FUZZ_H
#define VRAM_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input as a C string: a NUL inside ends it early, as it would for any C caller. The
 * caller frees it. */
static inline char *fuzz_string(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) abort();
  memcpy(text, data, size);
  text[size] = 0;
  return text;
}

#endif /* VRAM_FUZZ_H */

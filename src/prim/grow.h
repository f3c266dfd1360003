/* grow.h - doubling growth of a malloc'd array, shared by the trace reader (src/trace) and
 * the command's trace loader (tools/trace_io.c), which include it from src/prim. */
#ifndef VRAMKIT_PRIM_GROW_H
#define VRAMKIT_PRIM_GROW_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* Make room for `need` elements of `element` bytes in *array (capacity *cap), doubling
 * from 64. 0, or -1 when out of memory or the size would overflow (the array is kept). */
static inline int _vram_grow(void **array, size_t *cap, size_t element, size_t need) {
  if (need <= *cap) return 0;
  size_t new_cap = *cap ? *cap : 64;
  while (new_cap < need) {
    if (new_cap > SIZE_MAX / 2) return -1;
    new_cap *= 2;
  }
  if (new_cap > SIZE_MAX / element) return -1;
  void *grown = realloc(*array, new_cap * element);
  if (!grown) return -1;
  *array = grown;
  *cap = new_cap;
  return 0;
}

#endif

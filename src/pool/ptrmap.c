/* ptrmap.c - device pointer to block: creating, growing and destroying the open-addressing
 * hash table whose per-call operations are inline in ptrmap_inline.h.
 *
 * vram_free gets only a pointer, and device memory never holds headers, so the block is
 * found through this table. Tables of 2 MiB and up live on huge pages (prim/hostmem.h):
 * at a million live blocks every lookup lands somewhere new in 32 MB. */
#include <stdlib.h>

#include "pool/ptrmap.h"
#include "prim/hostmem.h"

/* A table with room for `entries` before it must grow. */
int _vram_ptrmap_init(vram_ptrmap *m, size_t entries) {
  size_t capacity = entries * VRAM_PTRMAP_SLOTS_PER_ENTRY;
  size_t cap = 64;
  unsigned bits = 6;
  while (cap < capacity) {
    cap <<= 1;
    bits++;
  }
  m->slots = _vram_host_zalloc(cap * sizeof *m->slots);
  if (!m->slots) return VRAM_EHOSTMEM;
  m->mask = cap - 1;
  m->shift = 64 - bits;
  m->count = 0;
  return VRAM_OK;
}

void _vram_ptrmap_destroy(vram_ptrmap *m) {
  if (m->slots) _vram_host_free(m->slots, (m->mask + 1) * sizeof *m->slots);
  m->slots = NULL;
  m->count = 0;
}

int _vram_ptrmap_grow(vram_ptrmap *m) {
  vram_ptrmap bigger;
  int rc = _vram_ptrmap_init(&bigger, (m->mask + 1) * 2 / VRAM_PTRMAP_SLOTS_PER_ENTRY);
  if (rc) return rc;
  for (size_t i = 0; i <= m->mask; i++) {
    if (!m->slots[i].key) continue;
    size_t j = _vram_ptrmap_home(&bigger, m->slots[i].key);
    while (bigger.slots[j].key) j = (j + 1) & bigger.mask;
    bigger.slots[j] = m->slots[i];
  }
  bigger.count = m->count;
  _vram_ptrmap_destroy(m);
  *m = bigger;
  return VRAM_OK;
}

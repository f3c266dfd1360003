/* ptrmap.c - device pointer to block: an open-addressing hash table.
 *
 * vram_free gets only a pointer, and device memory never holds headers, so the block is
 * found here. Keys are 512-byte aligned addresses: the low bits carry nothing, so they are
 * shifted out before Fibonacci hashing. Linear probing keeps a lookup to one or two cache
 * lines; deletion shifts later entries back instead of leaving tombstones, so lookups stay
 * short however long the pool runs. The table doubles at half full. */
#include <stdlib.h>

#include "pool/internal.h"
#include "prim/hostmem.h"

static inline size_t ptrmap_slot(const vram_ptrmap *m, uintptr_t key) {
  /* The top bits of the product are the well-mixed ones; mask = 2^k - 1 has 64 - k
   * leading zeros, which is exactly the shift that keeps k of them. */
  return (size_t)(((uint64_t)(key >> 9) * 0x9E3779B97F4A7C15ull) >> __builtin_clzll(m->mask));
}

int _vram_ptrmap_init(vram_ptrmap *m, size_t capacity) {
  size_t cap = 64;
  while (cap < capacity) cap <<= 1;
  m->slots = _vram_host_zalloc(cap * sizeof *m->slots);
  if (!m->slots) return VRAM_EHOSTMEM;
  m->mask = cap - 1;
  m->count = 0;
  return VRAM_OK;
}

void _vram_ptrmap_destroy(vram_ptrmap *m) {
  if (m->slots) _vram_host_free(m->slots, (m->mask + 1) * sizeof *m->slots);
  m->slots = NULL;
  m->count = 0;
}

static int ptrmap_grow(vram_ptrmap *m) {
  vram_ptrmap bigger;
  int rc = _vram_ptrmap_init(&bigger, (m->mask + 1) * 2);
  if (rc) return rc;
  for (size_t i = 0; i <= m->mask; i++) {
    if (!m->slots[i].key) continue;
    size_t j = ptrmap_slot(&bigger, m->slots[i].key);
    while (bigger.slots[j].key) j = (j + 1) & bigger.mask;
    bigger.slots[j] = m->slots[i];
  }
  bigger.count = m->count;
  _vram_ptrmap_destroy(m);
  *m = bigger;
  return VRAM_OK;
}

int _vram_ptrmap_insert(vram_ptrmap *m, uintptr_t key, vram_block *value) {
  if ((m->count + 1) * 2 > m->mask + 1) {
    int rc = ptrmap_grow(m);
    if (rc) return rc;
  }
  size_t i = ptrmap_slot(m, key);
  while (m->slots[i].key) {
    if (m->slots[i].key == key) {
      m->slots[i].value = value;
      return VRAM_OK;
    }
    i = (i + 1) & m->mask;
  }
  m->slots[i].key = key;
  m->slots[i].value = value;
  m->count++;
  return VRAM_OK;
}

vram_block *_vram_ptrmap_get(const vram_ptrmap *m, uintptr_t key) {
  size_t i = ptrmap_slot(m, key);
  while (m->slots[i].key) {
    if (m->slots[i].key == key) return m->slots[i].value;
    i = (i + 1) & m->mask;
  }
  return NULL;
}

vram_block *_vram_ptrmap_remove(vram_ptrmap *m, uintptr_t key) {
  size_t i = ptrmap_slot(m, key);
  while (m->slots[i].key && m->slots[i].key != key) i = (i + 1) & m->mask;
  if (!m->slots[i].key) return NULL;
  vram_block *value = m->slots[i].value;
  /* Backward-shift: move later entries of the probe run into the hole when their home
   * slot does not lie cyclically in (hole, j]. */
  size_t hole = i;
  for (size_t j = (i + 1) & m->mask; m->slots[j].key; j = (j + 1) & m->mask) {
    size_t home = ptrmap_slot(m, m->slots[j].key);
    bool home_in_range = (hole <= j) ? (hole < home && home <= j) : (hole < home || home <= j);
    if (home_in_range) continue;
    m->slots[hole] = m->slots[j];
    hole = j;
  }
  m->slots[hole].key = 0;
  m->slots[hole].value = NULL;
  m->count--;
  return value;
}

/* ptrmap_inline.h - the pointer map's per-call operations: look up, insert, remove.
 *
 * Every vram_malloc and vram_free does one of these, so they are inline in the engine
 * rather than calls into ptrmap.c, which keeps the rare work (creating, growing and
 * destroying the table). Included by ptrmap.h, not on its own.
 *
 * Keys are 512-byte aligned addresses: the low bits carry nothing, so they are shifted
 * out before Fibonacci hashing. Linear probing keeps a lookup to one or two cache lines;
 * deletion shifts later entries back instead of leaving tombstones, so lookups stay short
 * however long the pool runs. The table doubles at a quarter full: with runs that short
 * nearly every lookup ends at its home slot and the probe loops' exits are predictable,
 * for 64 bytes of table per live block. */
#ifndef VRAM_PTRMAP_INLINE_H
#define VRAM_PTRMAP_INLINE_H

static inline size_t _vram_ptrmap_home(const vram_ptrmap *m, uintptr_t key) {
  return (size_t)(((uint64_t)(key >> 9) * 0x9E3779B97F4A7C15ull) >> m->shift);
}

static inline vram_block *_vram_ptrmap_get(const vram_ptrmap *m, uintptr_t key) {
  for (size_t i = _vram_ptrmap_home(m, key);; i = (i + 1) & m->mask) {
    if (m->slots[i].key == key) return m->slots[i].value;
    if (!m->slots[i].key) return NULL;
  }
}

/* Insert or replace. VRAM_EHOSTMEM (table unchanged) when it had to grow and could not. */
static inline int _vram_ptrmap_insert(vram_ptrmap *m, uintptr_t key, vram_block *value) {
  if (__builtin_expect((m->count + 1) * VRAM_PTRMAP_SLOTS_PER_ENTRY > m->mask + 1, 0)) {
    int rc = _vram_ptrmap_grow(m);
    if (rc) return rc;
  }
  size_t i = _vram_ptrmap_home(m, key);
  for (; m->slots[i].key; i = (i + 1) & m->mask) {
    if (m->slots[i].key == key) {
      m->slots[i].value = value;
      return VRAM_OK;
    }
  }
  m->slots[i].key = key;
  m->slots[i].value = value;
  m->count++;
  return VRAM_OK;
}

/* Remove key; returns its value, or NULL when absent. */
static inline vram_block *_vram_ptrmap_remove(vram_ptrmap *m, uintptr_t key) {
  const size_t mask = m->mask;
  vram_ptrmap_slot *slots = m->slots;
  size_t i = _vram_ptrmap_home(m, key);
  while (slots[i].key != key) {
    if (!slots[i].key) return NULL;
    i = (i + 1) & mask;
  }
  vram_block *value = slots[i].value;
  /* Backward shift: an entry further along the run moves into the hole unless its home
   * lies cyclically in (hole, j], where it is already reachable without the hole. */
  size_t hole = i;
  for (size_t j = (i + 1) & mask; slots[j].key; j = (j + 1) & mask) {
    size_t home = _vram_ptrmap_home(m, slots[j].key);
    if (((j - home) & mask) < ((j - hole) & mask)) continue;
    slots[hole] = slots[j];
    hole = j;
  }
  slots[hole].key = 0;
  slots[hole].value = NULL;
  m->count--;
  return value;
}

#endif /* VRAM_PTRMAP_INLINE_H */

/* tlsf_inline.h - the free-block index's per-call operations: insert, remove, find.
 *
 * tlsf.c says how the index works. These run several times per vram_malloc and vram_free,
 * so they are inline in the engine; included by tlsf.h, not on their own. */
#ifndef VRAM_TLSF_INLINE_H
#define VRAM_TLSF_INLINE_H

#define VRAM_TLSF_SCAN_LIMIT 8 /* bound on the best-fit scan of one bin: keeps find O(1) */

static inline void _vram_tlsf_mapping(size_t size, int *fl, int *sl) {
  size_t units = size / VRAM_ALIGN;
  if (units < VRAM_TLSF_SL_COUNT) {
    *fl = 0;
    *sl = (int)units;
    return;
  }
  int top = 63 - __builtin_clzll((unsigned long long)units);
  *fl = top - VRAM_TLSF_SL_LOG2 + 1;
  *sl = (int)((units >> (top - VRAM_TLSF_SL_LOG2)) - VRAM_TLSF_SL_COUNT);
}

/* One bin's doubly linked list: push at the head, unlink from anywhere. The bitmaps and
 * the byte counts are the callers' business. */
static inline void _vram_tlsf_list_push(vram_tlsf *t, int fl, int sl, vram_block *b) {
  vram_block *head = t->heads[fl][sl];
  b->free_prev = NULL;
  b->free_next = head;
  if (head) head->free_prev = b;
  t->heads[fl][sl] = b;
}

static inline void _vram_tlsf_list_unlink(vram_tlsf *t, int fl, int sl, vram_block *b) {
  if (b->free_prev) b->free_prev->free_next = b->free_next;
  else t->heads[fl][sl] = b->free_next;
  if (b->free_next) b->free_next->free_prev = b->free_prev;
}

static inline void _vram_tlsf_insert(vram_tlsf *t, vram_block *b) {
  int fl, sl;
  _vram_tlsf_mapping(b->size, &fl, &sl);
  b->bin_fl = (uint8_t)fl;
  b->bin_sl = (uint8_t)sl;
  _vram_tlsf_list_push(t, fl, sl, b);
  t->fl_bitmap |= (uint64_t)1 << fl;
  t->sl_bitmap[fl] |= (uint32_t)1 << sl;
  t->free_bytes += b->size;
}

static inline void _vram_tlsf_remove(vram_tlsf *t, vram_block *b) {
  int fl = b->bin_fl, sl = b->bin_sl;
  _vram_tlsf_list_unlink(t, fl, sl, b);
  if (!t->heads[fl][sl]) {
    t->sl_bitmap[fl] &= ~((uint32_t)1 << sl);
    if (!t->sl_bitmap[fl]) t->fl_bitmap &= ~((uint64_t)1 << fl);
  }
  b->free_prev = b->free_next = NULL;
  t->free_bytes -= b->size;
}

/* Indexed block `b` changes size to `size` (it grew over a neighbour or lost its front).
 * Like a fresh insert it goes to the head of its bin's list (LIFO: the random workload is
 * less tight when resized blocks keep their place), but when the bin is unchanged the
 * bitmaps and the mapping stay as they are. */
static inline void _vram_tlsf_resize(vram_tlsf *t, vram_block *b, size_t size) {
  int fl, sl;
  _vram_tlsf_mapping(size, &fl, &sl);
  if (fl != b->bin_fl || sl != b->bin_sl) {
    _vram_tlsf_remove(t, b);
    b->size = size;
    _vram_tlsf_insert(t, b);
    return;
  }
  t->free_bytes = t->free_bytes - b->size + size;
  b->size = size;
  if (t->heads[fl][sl] != b) {
    _vram_tlsf_list_unlink(t, fl, sl, b);
    _vram_tlsf_list_push(t, fl, sl, b);
  }
}

/* The smallest of the first VRAM_TLSF_SCAN_LIMIT blocks of a bin (the head on ties). */
static inline vram_block *_vram_tlsf_smallest_of(vram_block *b) {
  vram_block *best = b;
  for (int scanned = 1; (b = b->free_next) && scanned < VRAM_TLSF_SCAN_LIMIT; scanned++)
    if (b->size < best->size) best = b;
  return best;
}

/* A free block of at least `size` bytes (best fit within the first bin that holds one),
 * or NULL. The block stays in the index. */
static inline vram_block *_vram_tlsf_find(const vram_tlsf *t, size_t size) {
  int fl, sl;
  _vram_tlsf_mapping(size, &fl, &sl);
  /* The request's own bin: best fit among its first TLSF_SCAN_LIMIT blocks. */
  vram_block *best = NULL;
  int scanned = 0;
  for (vram_block *b = t->heads[fl][sl]; b && scanned < VRAM_TLSF_SCAN_LIMIT; b = b->free_next, scanned++) {
    if (b->size >= size && (!best || b->size < best->size)) {
      best = b;
      if (b->size == size) break;
    }
  }
  if (best) return best;
  /* The next non-empty bin above: every block there is large enough. */
  uint32_t sl_map = (sl + 1 < VRAM_TLSF_SL_COUNT) ? t->sl_bitmap[fl] & (~(uint32_t)0 << (sl + 1)) : 0;
  if (!sl_map) {
    uint64_t fl_map = (fl + 1 < 64) ? t->fl_bitmap & (~(uint64_t)0 << (fl + 1)) : 0;
    if (!fl_map) return NULL;
    fl = __builtin_ctzll(fl_map);
    sl_map = t->sl_bitmap[fl];
  }
  sl = __builtin_ctz(sl_map);
  /* Every block of that bin fits; the smallest, not the last freed, leaves the bigger holes
   * whole, so a loop's layout repeats sooner (Note [The smallest of a bin] in
   * docs/performance.md). */
  return _vram_tlsf_smallest_of(t->heads[fl][sl]);
}

#endif /* VRAM_TLSF_INLINE_H */

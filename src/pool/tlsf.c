/* tlsf.c - the free-block index: a two-level segregated fit (TLSF).
 *
 * Sizes are counted in VRAM_ALIGN units. The first level is the power of two of the size,
 * the second splits each power of two into VRAM_TLSF_SL_COUNT linear bins; sizes below
 * VRAM_TLSF_SL_COUNT units get one exact bin each. Two bitmaps find the first non-empty bin
 * at or above a size in O(1). Lists are LIFO so that a block just freed is the first one
 * reused, which keeps the working set of device memory (and of host metadata) warm.
 *
 * Fit: within the request's own bin blocks may be smaller than the request, so that bin is
 * scanned for the best fit (bounded); otherwise the head of the next non-empty bin is
 * taken, which is at most one bin (1/16 of a power of two) larger than needed. */
#include <string.h>

#include "pool/internal.h"

#define TLSF_SCAN_LIMIT 8 /* bound on the best-fit scan of one bin: keeps find O(1) */

void _vram_tlsf_mapping(size_t size, int *fl, int *sl) {
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

void _vram_tlsf_init(vram_tlsf *t) { memset(t, 0, sizeof *t); }

void _vram_tlsf_insert(vram_tlsf *t, vram_block *b) {
  int fl, sl;
  _vram_tlsf_mapping(b->size, &fl, &sl);
  b->bin_fl = (uint8_t)fl;
  b->bin_sl = (uint8_t)sl;
  vram_block *head = t->heads[fl][sl];
  b->free_prev = NULL;
  b->free_next = head;
  if (head) head->free_prev = b;
  t->heads[fl][sl] = b;
  t->fl_bitmap |= (uint64_t)1 << fl;
  t->sl_bitmap[fl] |= (uint32_t)1 << sl;
  t->free_bytes += b->size;
  t->free_blocks++;
}

void _vram_tlsf_remove(vram_tlsf *t, vram_block *b) {
  int fl = b->bin_fl, sl = b->bin_sl;
  if (b->free_prev) {
    b->free_prev->free_next = b->free_next;
  } else {
    t->heads[fl][sl] = b->free_next;
    if (!b->free_next) {
      t->sl_bitmap[fl] &= ~((uint32_t)1 << sl);
      if (!t->sl_bitmap[fl]) t->fl_bitmap &= ~((uint64_t)1 << fl);
    }
  }
  if (b->free_next) b->free_next->free_prev = b->free_prev;
  b->free_prev = b->free_next = NULL;
  t->free_bytes -= b->size;
  t->free_blocks--;
}

vram_block *_vram_tlsf_find(const vram_tlsf *t, size_t size) {
  int fl, sl;
  _vram_tlsf_mapping(size, &fl, &sl);
  /* The request's own bin: best fit among its first TLSF_SCAN_LIMIT blocks. */
  vram_block *best = NULL;
  int scanned = 0;
  for (vram_block *b = t->heads[fl][sl]; b && scanned < TLSF_SCAN_LIMIT; b = b->free_next, scanned++) {
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
  return t->heads[fl][sl];
}

size_t _vram_tlsf_largest(const vram_tlsf *t) {
  if (!t->fl_bitmap) return 0;
  int fl = 63 - __builtin_clzll(t->fl_bitmap);
  int sl = 31 - __builtin_clz(t->sl_bitmap[fl]);
  size_t largest = 0;
  /* The top bin spans 1/16 of a power of two; its blocks differ, so look at each. */
  for (vram_block *b = t->heads[fl][sl]; b; b = b->free_next)
    if (b->size > largest) largest = b->size;
  return largest;
}

bool _vram_tlsf_check(const vram_tlsf *t, bool (*visit)(void *ctx, const vram_block *b), void *ctx) {
  size_t bytes = 0, blocks = 0;
  for (int fl = 0; fl < VRAM_TLSF_FL_COUNT; fl++) {
    bool fl_set = (t->fl_bitmap >> fl) & 1;
    if (fl_set != (t->sl_bitmap[fl] != 0)) return false;
    for (int sl = 0; sl < VRAM_TLSF_SL_COUNT; sl++) {
      bool sl_set = (t->sl_bitmap[fl] >> sl) & 1;
      if (sl_set != (t->heads[fl][sl] != NULL)) return false;
      const vram_block *prev = NULL;
      for (const vram_block *b = t->heads[fl][sl]; b; b = b->free_next) {
        if (b->free_prev != prev) return false;
        int bfl, bsl;
        _vram_tlsf_mapping(b->size, &bfl, &bsl);
        if (bfl != fl || bsl != sl || b->bin_fl != fl || b->bin_sl != sl) return false;
        if (!visit(ctx, b)) return false;
        bytes += b->size;
        blocks++;
        prev = b;
      }
    }
  }
  return bytes == t->free_bytes && blocks == t->free_blocks;
}

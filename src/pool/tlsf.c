/* tlsf.c - the free-block index: a two-level segregated fit (TLSF). Its per-call
 * operations (insert, remove, find) are inline in tlsf_inline.h; here are the rest.
 *
 * Sizes are counted in VRAM_ALIGN units. The first level is the power of two of the size,
 * the second splits each power of two into VRAM_TLSF_SL_COUNT linear bins; sizes below
 * VRAM_TLSF_SL_COUNT units get one exact bin each. Two bitmaps find the first non-empty bin
 * at or above a size in O(1). Lists are LIFO so that a block just freed (or resized) is the
 * first one reused, which keeps the working set of device memory (and of host metadata) warm.
 *
 * Fit: within the request's own bin blocks may be smaller than the request, so that bin is
 * scanned for the best fit (bounded); otherwise every block of the next non-empty bin
 * fits, and the smallest of its first few is taken. */
#include <string.h>

#include "pool/tlsf.h"

void _vram_tlsf_init(vram_tlsf *t) { memset(t, 0, sizeof *t); }

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
  size_t bytes = 0;
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
        prev = b;
      }
    }
  }
  return bytes == t->free_bytes;
}

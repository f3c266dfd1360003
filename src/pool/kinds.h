/* kinds.h - the statistics of small and large segments apart, as PyTorch reports its
 * small_pool and large_pool: every step that moves a pool-wide statistic moves the share
 * of the segment's kind too (kinds.c reads them, with the layout-derived ones). */
#ifndef VRAM_KINDS_H
#define VRAM_KINDS_H

#include "pool/types.h"

static inline vram_kind_counts *_vram_kind_of(vram_pool_t *pool, const vram_segment *seg) {
  return &pool->kinds[seg->is_small ? 1 : 0];
}

VRAM_HOT void _vram_kind_alloc(vram_pool_t *pool, const vram_segment *seg, size_t size,
                               size_t requested) {
  vram_kind_counts *k = _vram_kind_of(pool, seg);
  vram_stat_up(&k->allocated_bytes, (int64_t)size);
  vram_stat_up(&k->requested_bytes, (int64_t)requested);
  vram_stat_up(&k->allocation, 1);
}

VRAM_HOT void _vram_kind_free(vram_kind_counts *k, size_t size, size_t requested) {
  vram_stat_down(&k->allocated_bytes, (int64_t)size);
  vram_stat_down(&k->requested_bytes, (int64_t)requested);
  vram_stat_down(&k->allocation, 1);
}

/* Bytes held from the source for a segment of this kind (fixed: the segment; virtual: the
 * granules mapped in it), and given back. */
static inline void _vram_kind_reserve(vram_pool_t *pool, const vram_segment *seg, size_t bytes) {
  vram_stat_up(&_vram_kind_of(pool, seg)->reserved_bytes, (int64_t)bytes);
}
static inline void _vram_kind_unreserve(vram_pool_t *pool, const vram_segment *seg, size_t bytes) {
  vram_stat_down(&_vram_kind_of(pool, seg)->reserved_bytes, (int64_t)bytes);
}

#endif /* VRAM_KINDS_H */

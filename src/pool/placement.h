/* placement.h - the placement policy of a pool, one table per memory mode (placement.c):
 * what a miss grows, what the peak guard gives back, what a release gives back, and how a
 * preallocation is held. Segment and granule code carry these decisions out.
 *
 * Only the slow path goes through the table (growth, release, the OOM ladder). What the
 * hot path needs of the mode it reads from data the table keeps in the pool's struct
 * (vram_pool.has_virtual, vram_pool.unified_index), so a malloc or free of a cached size
 * pays no indirection for it. */
#ifndef VRAM_PLACEMENT_H
#define VRAM_PLACEMENT_H

#include "pool/segment.h"

/* One memory mode. Every slot runs with the pool's lock held. */
struct vram_placement {
  const char *name;
  /* A fixed source whose arenas may still turn to virtual ranges. */
  bool may_grow_virtual;
  /* The pool holds virtual ranges (or may, for a virtual-memory source): cached memory
   * includes idle granules. Copied to vram_pool.has_virtual for the hot path. */
  bool holds_ranges;
  /* The segment a miss of `rounded` bytes in arena `a` grows by. */
  vram_growth (*plan)(const vram_pool_t *pool, const vram_arena *a, size_t rounded, bool small);
  /* The peak guard's release, before a fixed segment of `size` would take reserved memory
   * `shortfall` bytes past the guard's ceiling. */
  void (*guard_release)(vram_pool_t *pool, size_t size, size_t shortfall);
  /* Give back cached memory until `want` bytes went back (SIZE_MAX: all of it). */
  size_t (*release)(vram_pool_t *pool, size_t want, int *first_error);
  /* Hold `rounded` bytes in arena `a` for good (preallocate mode). */
  int (*preallocate)(vram_pool_t *pool, vram_arena *a, size_t rounded);
};

/* Choose the pool's first table from its source and options (pool creation). */
void _vram_place_init(vram_pool_t *pool);

/* A miss: grow arena `a` so that it holds a free block of `rounded` bytes, *out_free.
 * ENOMEM when the limit or the device says no; other codes are source failures. */
int _vram_place_grow(vram_pool_t *pool, vram_arena *a, size_t rounded, bool small,
                     vram_block **out_free);

/* Release cached memory, as the pool's mode gives it back, until at least `want` bytes
 * went back or nothing is left; SIZE_MAX releases everything cached. The first failure
 * goes to *first_error (if non-NULL and still 0). */
static inline size_t _vram_release_cached(vram_pool_t *pool, size_t want, int *first_error) {
  return pool->place->release(pool, want, first_error);
}

/* Preallocate mode: hold `bytes` from the start and serve every size from them. When they
 * do not fit, VRAM_ENOMEM with an OOM report (oom.h), the creating thread's too. */
int _vram_pool_preallocate(vram_pool_t *pool, size_t bytes);

/* A fixed-segment pool whose large requests go to virtual ranges from the first
 * (vram_options_t.large_blocks) and whose source can map them. */
static inline bool _vram_large_blocks_virtual(const vram_pool_t *pool) {
  return pool->place->may_grow_virtual && pool->opts.large_blocks == VRAM_LARGE_VIRTUAL;
}

#endif /* VRAM_PLACEMENT_H */

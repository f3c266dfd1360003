/* placement.h - the placement policy of a pool (placement.c): one table per memory mode
 * for what a miss grows, what the peak guard gives back, what a release gives back, and how
 * a preallocation is held; and the questions every mode answers alike: which free block a
 * request takes, what makes room for a mapping, how many granules one mapping holds.
 * Segment, granule and block code carry the answers out.
 *
 * Only the slow path goes through the table (growth, release, the OOM ladder). What the
 * hot path needs of the policy is inline here and reads the pool's fields (has_virtual,
 * unified_index, kept_ceiling, the options), so a malloc or free of a cached size pays no
 * indirection for it: a fit from the index pays a call only where placement looks further
 * (a mapped window, a small request carved from mapped large memory). */
#ifndef VRAM_PLACEMENT_H
#define VRAM_PLACEMENT_H

#include "pool/granules.h"
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

/* A free block of another stream's arena, for a request its own arena cannot serve: the
 * tightest fit in any other arena's index of the request's kind, or NULL. */
vram_block *_vram_place_borrow(vram_pool_t *pool, const vram_arena *a, size_t rounded,
                               bool small);

/* Preallocate mode: hold `bytes` from the start and serve every size from them. When they
 * do not fit, VRAM_ENOMEM with an OOM report (oom.h), the creating thread's too. */
int _vram_pool_preallocate(vram_pool_t *pool, size_t bytes);

/* A fixed-segment pool whose large requests go to virtual ranges from the first
 * (vram_options_t.large_blocks) and whose source can map them. */
static inline bool _vram_large_blocks_virtual(const vram_pool_t *pool) {
  return pool->place->may_grow_virtual && pool->opts.large_blocks == VRAM_LARGE_VIRTUAL;
}

/* A segment of `size` bytes went back to the source (segment.c tells): while the peak guard
 * gives back, it remembers the size, a ghost (guard_peak in placement.c). */
static inline void _vram_place_segment_released(vram_pool_t *pool, size_t size) {
  if (!pool->guard_releasing) return;
  pool->guard_ghosts[pool->guard_ghost_next] = size;
  pool->guard_ghost_next = (pool->guard_ghost_next + 1) % VRAM_GUARD_GHOSTS;
}

/* ---------------------------------------------------------------------------------------
 * Virtual memory: how much stays mapped.
 * ------------------------------------------------------------------------------------- */

/* Whether the pool, holding `bytes` more, is far enough from its cap to keep what it maps
 * (the kept regime): no limit, and reserved memory within the virtual threshold's share of
 * the device. Inline, against a ceiling worked out once (_vram_place_init): it runs on
 * every allocation from a virtual range. */
static inline bool _vram_place_keeps_mapped(const vram_pool_t *pool, size_t bytes) {
  return !pool->limit && (size_t)pool->stats.reserved_bytes.current + bytes <= pool->kept_ceiling;
}

/* Granules per mapping (one physical handle each) for a run of `run_bytes` to map: up to
 * VRAM_VMM_MAP_UNIT in the kept regime, else one, so that idle granules move one by one. */
static inline size_t _vram_place_map_unit(const vram_pool_t *pool, size_t run_bytes) {
  return _vram_place_keeps_mapped(pool, run_bytes) ? VRAM_VMM_MAP_UNIT : 1;
}

/* What the pool may hold mapped before new mappings take idle granules back, from its
 * figures: the larger of the high-water mark of reserved bytes and the allocated peak
 * (`allocated`: the current allocation with the request, or the peak if that is more) plus
 * a slack of 1/2^VRAM_VMM_SLACK_SHIFT of it, and at least `min_slack`. */
static inline size_t _vram_place_allowance_of(size_t allocated, size_t allocated_peak,
                                              size_t reserved_peak, size_t min_slack) {
  if (allocated_peak > allocated) allocated = allocated_peak;
  size_t slack = allocated >> VRAM_VMM_SLACK_SHIFT;
  size_t allowance = allocated + (slack > min_slack ? slack : min_slack);
  return allowance > reserved_peak ? allowance : reserved_peak;
}

/* Whether taking [addr, addr+size) of virtual segment seg would map granules past the
 * pool's allowance or limit (placement.c). */
bool _vram_place_over_allowance(vram_pool_t *pool, vram_segment *seg, uintptr_t addr, size_t size);

/* What makes room for a mapping: before `bytes` of new granules are mapped in [g0, g1) of
 * seg for a request of `size` bytes, idle granules elsewhere (and, under a limit, idle fixed
 * segments) go back as the limit and the allowance ask. VRAM_ENOMEM when the limit leaves
 * no room. */
int _vram_place_make_room(vram_pool_t *pool, vram_segment *seg, size_t g0, size_t g1,
                          size_t bytes, size_t size);

/* Far from the cap, the mapped allowance remembers what it unmapped: [lo, hi) went back
 * to make room (granules.c tells), and mapping it again raises the allowance instead of
 * unmapping more (placement.c). reset_peak_stats forgets, and how often it trimmed. */
void _vram_place_map_ghost(vram_pool_t *pool, uintptr_t lo, uintptr_t hi);
void _vram_place_forget_map_ghosts(vram_pool_t *pool);
/* ... and the ghosts in [lo, hi), a range given back (segment.c). */
void _vram_place_forget_map_ghosts_in(vram_pool_t *pool, uintptr_t lo, uintptr_t hi);

/* The cached memory a release could give back, as the mode holds it: idle fixed segments,
 * and idle granules where the pool holds ranges (counted by a walk, so only there). */
size_t _vram_place_releasable(const vram_pool_t *pool);

/* ---------------------------------------------------------------------------------------
 * Which free block a request takes.
 * ------------------------------------------------------------------------------------- */

/* Virtual memory: a free window of at least `rounded` bytes whose granules are all mapped,
 * split off so that the returned block starts there; NULL if none (placement.c). With
 * `beside_small` (a small request far from the cap), one right after a small block in use
 * first. */
vram_block *_vram_place_mapped_fit(vram_pool_t *pool, vram_tlsf *index, size_t rounded,
                                   bool beside_small);
/* A small request whose growth would raise the high-water mark: carved from idle mapped
 * granules of its arena's large range instead; returns that block, or b (placement.c). */
vram_block *_vram_place_small_into_large(vram_pool_t *pool, vram_arena *a, vram_block *b,
                                         size_t rounded);

/* Far from the cap: whether [lo, hi) overlaps a span the allowance unmapped lately (a map
 * ghost), and, for a fit that would map one again, a free block elsewhere that maps fewer
 * new granules and no ghost, or NULL (placement.c). */
bool _vram_place_retakes_ghost(const vram_pool_t *pool, uintptr_t lo, uintptr_t hi);
vram_block *_vram_place_least_growth(vram_pool_t *pool, vram_tlsf *index, vram_block *fit,
                                     size_t rounded);

/* Which free block of arena `a` a request of `rounded` bytes takes, given b, the index's
 * fit (NULL: none): the block to carve, or NULL to grow. Virtual memory: where the fit
 * would map past the allowance, a window already mapped; a small request that would grow
 * (a miss, or a fit on unmapped granules) past the high-water mark, idle mapped granules
 * of the large range. A small fit in a fixed segment needs no growth: it stands. */
static inline vram_block *_vram_place_fit(vram_pool_t *pool, vram_arena *a, vram_tlsf *index,
                                          vram_block *b, size_t rounded, bool small) {
  if (b && b->segment->gran_mapped &&
      _vram_place_over_allowance(pool, b->segment, b->addr, rounded)) {
    vram_block *mapped = _vram_place_mapped_fit(pool, index, rounded, false);
    if (mapped) b = mapped;
    /* A request of two whole mappings or more that would map a ghost again (and so raise the
     * allowance for good) takes a block that maps fewer new granules, if one does. */
    else if (rounded >= 2 * VRAM_VMM_MAP_UNIT * pool->granularity &&
             _vram_place_keeps_mapped(pool, 0) &&
             _vram_place_retakes_ghost(pool, b->addr, b->addr + rounded)) {
      vram_block *less = _vram_place_least_growth(pool, index, b, rounded);
      if (less) b = less;
    }
  }
  if (small && pool->has_virtual && (!b || b->segment->gran_mapped)) {
    size_t growth = !b ? VRAM_SMALL_SEGMENT
                       : _vram_granules_unmapped_in(pool, b->segment, b->addr, rounded) *
                             pool->granularity;
    if (growth && (size_t)pool->stats.reserved_bytes.current + growth >
                      (size_t)pool->stats.reserved_bytes.peak)
      b = _vram_place_small_into_large(pool, a, b, rounded);
  }
  return b;
}

/* Tight placement's question from figures alone: does a request whose own segment would be
 * `own` bytes take one rather than be carved from a fully free segment of `free_segment`
 * bytes, when the pool holds `reserved` bytes of its `cap` and the threshold is
 * `threshold`? Only past the threshold, and only when the free segment is bigger. */
static inline bool _vram_place_tight_takes_own(size_t free_segment, size_t own, size_t reserved,
                                               size_t cap, double threshold) {
  if (free_segment <= own) return false;
  return (double)(reserved + own) > threshold * (double)cap;
}

/* Tight placement (vram_options_t.tight_threshold): whether a large request whose fit b is
 * a fully free fixed segment gets a segment of its own instead. Carving it from a fully
 * free cached segment bigger than its own pins the whole segment for the request's
 * lifetime; with lifetimes that do not nest, such pinned remainders are most of the waste
 * of fixed segments (the random workload of bench/ shows it). Past the threshold the
 * request gets its own segment instead, at the price of driver calls whenever the cached
 * sizes do not match: a pair for each such request once the pool is at its peak, which is
 * why the default never does it. The threshold first: off by default, it keeps the common
 * path to one predictable test. If no segment can be had, the caller carves. */
static inline bool _vram_place_wants_own_segment(const vram_pool_t *pool, const vram_block *b,
                                                 size_t rounded, bool small) {
  if (!(pool->opts.tight_threshold < 1.0) || !b) return false;
  const vram_segment *seg = b->segment;
  if (small || seg->used_bytes || seg->keep || seg->gran_mapped) return false;
  size_t cap = pool->limit ? pool->limit : pool->device_total;
  return _vram_place_tight_takes_own(seg->size, _vram_fixed_segment_size(pool, rounded, false),
                                     (size_t)pool->stats.reserved_bytes.current, cap,
                                     pool->opts.tight_threshold);
}

#endif /* VRAM_PLACEMENT_H */

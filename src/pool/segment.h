/* segment.h - arenas (one per stream) and the segments they hold: growth from the source,
 * release back to it, and the pool's list of fully free segments.
 *
 * The list and the arena lookup are inline: block.h keeps the list in step on every split
 * and merge, and every malloc looks up its stream's arena. */
#ifndef VRAM_SEGMENT_H
#define VRAM_SEGMENT_H

#include "pool/types.h"

/* An arena's free index and one-block cache for one kind (segments keep both resolved). */
static inline vram_tlsf *_vram_arena_index(vram_arena *a, bool small) {
  return small ? &a->free_small : &a->free_large;
}

static inline vram_block **_vram_arena_cache_slot(vram_arena *a, bool small) {
  return small ? &a->cached_small : &a->cached_large;
}

/* The stream's arena if the pool has one (it never makes one). */
vram_arena *_vram_arena_find(const vram_pool_t *pool, vram_stream_t stream);
/* The stream's arena, made on first use; NULL when host memory runs out. */
vram_arena *_vram_arena_find_or_create(vram_pool_t *pool, vram_stream_t stream);

/* The stream's arena; almost always the one used last. */
static inline vram_arena *_vram_arena_get(vram_pool_t *pool, vram_stream_t stream) {
  vram_arena *a = pool->last_arena;
  if (a && a->stream == stream) return a;
  return _vram_arena_find_or_create(pool, stream);
}

/* Wait for the work queued so far on an arena's stream, so that its memory may go back to
 * the source. */
int _vram_arena_quiesce(vram_pool_t *pool, vram_arena *arena);

/* Fixed sources: keep the list of fully free segments in step with their usage. */
static inline void _vram_idle_push(vram_pool_t *pool, vram_segment *seg) {
  if (seg->keep || seg->idle || seg->gran_mapped) return;
  seg->idle = true;
  seg->idle_prev = NULL;
  seg->idle_next = pool->idle_head;
  if (pool->idle_head) pool->idle_head->idle_prev = seg;
  else pool->idle_tail = seg;
  pool->idle_head = seg;
  pool->idle_bytes += seg->size;
}

static inline void _vram_idle_remove(vram_pool_t *pool, vram_segment *seg) {
  if (!seg->idle) return;
  seg->idle = false;
  if (seg->idle_prev) seg->idle_prev->idle_next = seg->idle_next;
  else pool->idle_head = seg->idle_next;
  if (seg->idle_next) seg->idle_next->idle_prev = seg->idle_prev;
  else pool->idle_tail = seg->idle_prev;
  seg->idle_prev = seg->idle_next = NULL;
  pool->idle_bytes -= seg->size;
}

/* Fixed sources: the bytes of a new segment that must hold `rounded`. Small requests share
 * 2 MiB segments; a large one gets a segment of its own size rounded to the source's
 * granularity, so that no segment is bigger than the request that made it and the only
 * waste is the granularity tail, which later requests can use. */
static inline size_t _vram_fixed_segment_size(const vram_pool_t *pool, size_t rounded, bool small) {
  if (small) return VRAM_SMALL_SEGMENT;
  return _vram_round_up(rounded, pool->granularity);
}

/* A growth as placement.c orders it: a fixed segment or a virtual range of `size` bytes;
 * retire: the arena's first range, whose fixed large segments are retired as it is added. */
typedef struct vram_growth {
  bool virtual;
  bool retire;
  size_t size;
} vram_growth;

/* Add the segment of growth g to the arena; *out_free is its one free block. The limit and
 * the peak guard are placement.c's; codes are the source's (or EHOSTMEM). */
int _vram_segment_add(vram_pool_t *pool, vram_arena *a, vram_growth g, bool small,
                      vram_block **out_free);

/* Give back idle fixed segment s (the idle list) after its arena's stream; the caller has
 * started a release epoch (vram_pool.release_epoch). */
int _vram_segment_release_idle(vram_pool_t *pool, vram_segment *s);
/* Fixed segments only: release fully free ones, longest unused first, until `want` bytes
 * went back. The first failure goes to *first_error (if non-NULL and still 0). */
size_t _vram_release_fixed_idle(vram_pool_t *pool, size_t want, int *first_error);
/* Give back every virtual range with nothing mapped and no block in use. */
void _vram_release_empty_ranges(vram_pool_t *pool, int *first_error);

/* Give every segment back to the source and free the arenas (pool teardown). */
void _vram_segments_destroy(vram_pool_t *pool);

#endif /* VRAM_SEGMENT_H */

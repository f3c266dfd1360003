/* snapshot.c - the pool's state as its observers see it: derived statistics and the
 * snapshots that src/obs formats. Every function here reads the pool with its lock held and
 * changes nothing. */
#include "pool/granules.h"
#include "pool/placement.h"
#include "pool/snapshot.h"
#include "pool/tlsf.h"

/* The size a cached block will have once coalesced with its free neighbours. */
static size_t merged_size(const vram_block *b) {
  if (!b) return 0;
  size_t size = b->size;
  if (b->addr_prev && b->addr_prev->state == VRAM_BLOCK_FREE) size += b->addr_prev->size;
  if (b->addr_next && b->addr_next->state == VRAM_BLOCK_FREE) size += b->addr_next->size;
  return size;
}

/* A pool with virtual segments next to fixed ones (virtual growth): its free fixed blocks
 * (parked ones merged as they will be) and the largest of them, walked block by block; the
 * rest of its cached memory is mapped virtual space, which serves any request. */
static void fixed_free_of(const vram_pool_t *pool, size_t *bytes, size_t *largest) {
  *bytes = *largest = 0;
  for (vram_arena *a = pool->arenas; a; a = a->next)
    for (vram_segment *s = a->segments; s; s = s->next) {
      if (s->gran_mapped) continue;
      for (vram_block *b = s->first; b; b = b->addr_next) {
        if (b->state != VRAM_BLOCK_FREE && b->state != VRAM_BLOCK_CACHED) continue;
        *bytes += b->size;
        size_t merged = b->state == VRAM_BLOCK_CACHED ? merged_size(b) : b->size;
        if (merged > *largest) *largest = merged;
      }
    }
}

size_t _vram_pool_largest_free(const vram_pool_t *pool) {
  /* Virtual segments: physical granules are interchangeable and a free range can always
   * be found in the reserved address space, so all cached memory serves one request. */
  if (pool->src->is_vmm) return _vram_pool_cached_free(pool);
  if (pool->has_virtual) {
    size_t fixed_bytes, fixed_largest;
    fixed_free_of(pool, &fixed_bytes, &fixed_largest);
    size_t mapped = _vram_pool_cached_free(pool) - fixed_bytes;
    return mapped > fixed_largest ? mapped : fixed_largest;
  }
  size_t largest = 0;
  for (vram_arena *a = pool->arenas; a; a = a->next) {
    size_t s = _vram_tlsf_largest(&a->free_small), l = _vram_tlsf_largest(&a->free_large);
    if (s > largest) largest = s;
    if (l > largest) largest = l;
    size_t cs = merged_size(a->cached_small), cl = merged_size(a->cached_large);
    if (cs > largest) largest = cs;
    if (cl > largest) largest = cl;
  }
  return largest;
}

size_t _vram_pool_cached_free(const vram_pool_t *pool) {
  /* Every reserved byte is allocated, waiting on an event, or cached: for virtual segments
   * the free bytes of mapped granules, for fixed ones their free and parked blocks. */
  if (pool->has_virtual)
    return (size_t)pool->stats.reserved_bytes.current -
           ((size_t)pool->stats.allocated_bytes.current + pool->pending_bytes);
  size_t bytes = 0;
  for (vram_arena *a = pool->arenas; a; a = a->next) {
    bytes += a->free_small.free_bytes + a->free_large.free_bytes;
    if (a->cached_small) bytes += a->cached_small->size;
    if (a->cached_large) bytes += a->cached_large->size;
  }
  return bytes;
}

void _vram_pool_fill_stats(const vram_pool_t *pool, vram_stats_t *out) {
  *out = pool->stats;
  /* Active = allocated + waiting on events; each block became active once, at its malloc. */
  const vram_stats_t *s = &pool->stats;
  out->active_bytes = vram_active_stat(&s->allocated_bytes, (int64_t)pool->pending_bytes,
                                       pool->active_bytes_peak);
  out->active = vram_active_stat(&s->allocation, (int64_t)pool->pending_blocks, pool->active_peak);
  out->num_mallocs = (uint64_t)s->allocation.total;
  out->num_frees = (uint64_t)(s->allocation.total - s->allocation.current);
  size_t cached = _vram_pool_cached_free(pool);
  out->largest_free_block = _vram_pool_largest_free(pool);
  if (out->largest_free_block > cached) out->largest_free_block = cached;
  out->fragmentation = cached ? 1.0 - (double)out->largest_free_block / (double)cached : 0.0;
  out->limit_bytes = pool->limit;
}

/* The largest request the free blocks of virtual segments serve without taking more from the
 * device: a free block's mapped bytes, plus as many of its unmapped granules as idle
 * granules elsewhere can be moved into (none below a preallocation's granules, which are
 * never unmapped). The statistics' figure takes all cached memory of virtual segments as
 * one piece (granules are interchangeable), which free bytes in granules that live blocks
 * share are not; an out-of-memory report, which must not name a largest free block that
 * would have served the request, walks the blocks for this one. */
static size_t virtual_servable(const vram_pool_t *pool) {
  size_t g = pool->granularity, idle_total = _vram_granules_idle_total(pool), best = 0;
  size_t mapped_total = 0;
  for (vram_arena *a = pool->arenas; a; a = a->next)
    for (vram_segment *s = a->segments; s; s = s->next) mapped_total += s->mapped_granules;
  size_t unmappable = mapped_total > pool->keep_mapped ? mapped_total - pool->keep_mapped : 0;
  if (idle_total > unmappable) idle_total = unmappable;
  for (vram_arena *a = pool->arenas; a; a = a->next)
    for (vram_segment *s = a->segments; s; s = s->next) {
      if (!s->gran_mapped) continue;
      for (vram_block *b = s->first; b; b = b->addr_next) {
        if (b->state != VRAM_BLOCK_FREE) continue;
        size_t unmapped = _vram_granules_unmapped_in(pool, s, b->addr, b->size);
        size_t first = (b->addr - s->addr + g - 1) / g, end = (b->addr - s->addr + b->size) / g;
        size_t idle_in = end > first ? end - first - unmapped : 0;
        size_t movable = idle_total - (idle_in < idle_total ? idle_in : idle_total);
        size_t mapped = b->size - unmapped * g;
        size_t serves = mapped + (unmapped < movable ? unmapped : movable) * g;
        if (serves > best) best = serves;
      }
    }
  return best;
}

void _vram_pool_snapshot(const vram_pool_t *pool, bool ask_device, vram_pool_snapshot *out) {
  out->device = pool->opts.device;
  out->source_name = pool->src->zName;
  out->source = pool->opts.source;
  out->is_vmm = pool->src->is_vmm != 0;
  out->grows_virtual = pool->has_virtual && !pool->src->is_vmm;
  /* With large blocks virtual from the start, no threshold turns the pool virtual. */
  bool threshold_applies = (pool->place->may_grow_virtual || out->grows_virtual) &&
                           pool->opts.large_blocks == VRAM_LARGE_FIXED;
  out->virtual_threshold = threshold_applies ? pool->opts.virtual_threshold : 1.0;
  out->tight_threshold = pool->opts.tight_threshold;
  /* A pool whose large blocks are in virtual ranges from the first has no fixed large
   * segments for tight placement to choose between. */
  out->fixed_large = !out->is_vmm && !_vram_large_blocks_virtual(pool);
  _vram_pool_fill_stats(pool, &out->stats);
  out->cached_free = _vram_pool_cached_free(pool);
  out->device_total = pool->device_total;
  out->device_free = 0;
  out->granularity = pool->granularity;
  out->preallocated = pool->preallocated;
  out->neighbours = NULL;
  out->giveback = NULL;
  if (ask_device) {
    size_t total = 0;
    if (pool->src->xMemInfo(pool->src_state, &out->device_free, &total) == VRAM_OK && total)
      out->device_total = total;
    if (pool->has_virtual) {
      size_t fixed_bytes, fixed_largest, servable = virtual_servable(pool);
      fixed_free_of(pool, &fixed_bytes, &fixed_largest);
      size_t largest = servable > fixed_largest ? servable : fixed_largest;
      if (largest < out->stats.largest_free_block) {
        out->stats.largest_free_block = largest;
        out->stats.fragmentation =
            out->cached_free ? 1.0 - (double)largest / (double)out->cached_free : 0.0;
      }
    }
  }
}

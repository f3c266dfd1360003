/* kinds.c - vram_get_split_stats: the pool's statistics for small and large segments apart,
 * the rows PyTorch's memory_stats() calls small_pool and large_pool. The counts that every
 * malloc and free moves are kept as they go (kinds.h); the inactive split ones are read
 * from the layout here, so that no hot step pays for them. */
#include "pool/granules.h"
#include "pool/kinds.h"
#include "pool/call.h"

static void copy_stat(vram_stat_t *out, const vram_stat_t *in) { *out = *in; }

/* Active derived as _vram_pool_fill_stats derives the pool's. */
static void fill_kind(const vram_kind_counts *k, vram_kind_stats_t *out) {
  copy_stat(&out->allocated_bytes, &k->allocated_bytes);
  copy_stat(&out->requested_bytes, &k->requested_bytes);
  copy_stat(&out->reserved_bytes, &k->reserved_bytes);
  copy_stat(&out->allocation, &k->allocation);
  copy_stat(&out->segment, &k->segment);
  out->active_bytes = vram_active_stat(&k->allocated_bytes, (int64_t)k->pending_bytes,
                                       k->active_bytes_peak);
  out->active = vram_active_stat(&k->allocation, (int64_t)k->pending_blocks, k->active_peak);
}

/* The free bytes of block b that hold memory: all of a fixed segment's block, the mapped
 * part of a virtual one's (its unmapped granules are address space only). */
static size_t held_bytes(vram_pool_t *pool, vram_segment *s, const vram_block *b) {
  if (!s->gran_mapped) return b->size;
  size_t unmapped = _vram_granules_unmapped_in(pool, s, b->addr, b->size) * pool->granularity;
  return unmapped < b->size ? b->size - unmapped : 0;
}

/* Free (and parked) blocks of segments that also hold an allocated or pending block:
 * memory empty_cache cannot give back until its neighbours go. */
static void count_inactive_split(vram_pool_t *pool, vram_split_stats_t *out) {
  for (vram_arena *a = pool->arenas; a; a = a->next)
    for (vram_segment *s = a->segments; s; s = s->next) {
      bool split = false;
      for (const vram_block *b = s->first; b && !split; b = b->addr_next)
        split = b->state == VRAM_BLOCK_LIVE || b->state == VRAM_BLOCK_PENDING;
      if (!split) continue;
      vram_kind_stats_t *k = s->is_small ? &out->small : &out->large;
      for (const vram_block *b = s->first; b; b = b->addr_next) {
        if (b->state != VRAM_BLOCK_FREE && b->state != VRAM_BLOCK_CACHED) continue;
        size_t bytes = held_bytes(pool, s, b);
        if (!bytes) continue;
        k->inactive_split.current++;
        k->inactive_split_bytes.current += (int64_t)bytes;
      }
    }
  /* Not tracked between calls: the peak is what the call saw, no total. */
  out->small.inactive_split.peak = out->small.inactive_split.current;
  out->small.inactive_split_bytes.peak = out->small.inactive_split_bytes.current;
  out->large.inactive_split.peak = out->large.inactive_split.current;
  out->large.inactive_split_bytes.peak = out->large.inactive_split_bytes.current;
}

static int split_stats_locked(vram_pool_t *pool, void *arg) {
  vram_split_stats_t *out = arg;
  *out = (vram_split_stats_t){0};
  fill_kind(&pool->kinds[1], &out->small);
  fill_kind(&pool->kinds[0], &out->large);
  count_inactive_split(pool, out);
  out->num_sync_all_streams = pool->num_sync_all_streams;
  return VRAM_OK;
}

int vram_get_split_stats(vram_pool_t *pool, vram_split_stats_t *out) {
  if (!pool || !out) return VRAM_EINVAL;
  if (!pool->split_stats) return VRAM_EUNSUPPORTED; /* made without vram_options_t.split_stats */
  return locked_call(pool, split_stats_locked, out, NULL);
}

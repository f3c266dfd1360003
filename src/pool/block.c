/* block.c - the rare work of blocks (block.h has the per-call steps): slabs of host structs,
 * flushing the one-block caches, and splitting a free block at an address. */
#include <stdlib.h>

#include "pool/block.h"
#include "prim/hostmem.h"

/* Block structs come in slabs that double from BLOCK_SLAB up to BLOCK_SLAB << 8 (65,536
 * blocks, 4 MiB), so that a small pool stays small and a pool of a million blocks keeps its
 * structs on a few dozen huge pages (prim/hostmem.h). */
#define BLOCK_SLAB 256
#define BLOCK_SLAB_MAX_SHIFT 8

static inline size_t slab_blocks(size_t slab_index) {
  return (size_t)BLOCK_SLAB << (slab_index < BLOCK_SLAB_MAX_SHIFT ? slab_index : BLOCK_SLAB_MAX_SHIFT);
}

/* Kept out of line, so that the hot path that calls it now and then stays small. */
__attribute__((noinline)) bool _vram_block_slab_add(vram_pool_t *pool) {
  vram_block_cache *c = &pool->blocks;
  if (c->n_slabs == c->slab_capacity) {
    size_t cap = c->slab_capacity ? c->slab_capacity * 2 : 16;
    void **slabs = realloc(c->slabs, cap * sizeof *slabs);
    if (!slabs) return false;
    c->slabs = slabs;
    c->slab_capacity = cap;
  }
  size_t count = slab_blocks(c->n_slabs);
  vram_block *slab = _vram_host_zalloc(count * sizeof *slab);
  if (!slab) return false;
  c->slabs[c->n_slabs++] = slab;
  for (size_t i = count; i-- > 0;) {
    slab[i].free_next = c->free_list;
    c->free_list = &slab[i];
  }
  return true;
}

void _vram_blocks_destroy(vram_pool_t *pool) {
  vram_block_cache *c = &pool->blocks;
  for (size_t i = 0; i < c->n_slabs; i++) _vram_host_free(c->slabs[i], slab_blocks(i) * sizeof(vram_block));
  free(c->slabs);
  c->slabs = NULL;
  c->n_slabs = c->slab_capacity = 0;
  c->free_list = NULL;
}

static void cache_flush(vram_pool_t *pool, vram_arena *a) {
  vram_block *small = a->cached_small, *large = a->cached_large;
  a->cached_small = a->cached_large = NULL;
  if (small) _vram_block_uncache(pool, small);
  if (large) _vram_block_uncache(pool, large);
}

/* Every cached block is in an arena of the list (a cache is filled only through
 * _vram_block_retire, which lists its arena), so the list is all a flush needs to see. */
void _vram_cache_flush_all(vram_pool_t *pool) {
  vram_arena *a = pool->cache_arenas;
  pool->cache_arenas = NULL;
  while (a) {
    vram_arena *next = a->cache_next;
    a->cache_next = NULL;
    a->cache_listed = false;
    cache_flush(pool, a);
    a = next;
  }
}

/* The front becomes a free block of its own in the index; b keeps the back. */
int _vram_block_split_front(vram_pool_t *pool, vram_block *b, uintptr_t addr) {
  vram_block *front = _vram_block_new(pool);
  if (!front) return VRAM_EHOSTMEM;
  vram_segment *seg = b->segment;
  _vram_block_link_before(front, b, addr - b->addr);
  _vram_tlsf_resize(seg->index, b, b->size - front->size);
  front->state = VRAM_BLOCK_FREE;
  _vram_tlsf_insert(seg->index, front);
  return VRAM_OK;
}

void _vram_block_merge_front(vram_pool_t *pool, vram_block *b) {
  vram_block *front = b->addr_prev;
  vram_tlsf *index = b->segment->index;
  size_t size = front->size + b->size;
  _vram_tlsf_remove(index, front);
  b->addr = front->addr;
  _vram_block_unlink(pool, front);
  _vram_tlsf_resize(index, b, size);
}

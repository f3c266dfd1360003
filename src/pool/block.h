/* block.h - blocks inside segments: host structs for them, taking one (split), giving one
 * back (merge with free address neighbours), and the arena's one-block cache.
 *
 * The steps are inline (VRAM_HOT): each vram_malloc and vram_free runs one or two of them,
 * and as calls they would cost more than their work. block.c keeps what is rare. */
#ifndef VRAM_BLOCK_H
#define VRAM_BLOCK_H

#include <string.h>

#include "pool/granules.h"
#include "pool/ptrmap.h"
#include "pool/segment.h"
#include "pool/tlsf.h"

/* block.c: another slab of block structs on the free list, off the hot path. */
bool _vram_block_slab_add(vram_pool_t *pool);
/* block.c: give every slab back (pool teardown). */
void _vram_blocks_destroy(vram_pool_t *pool);
/* block.c: merge the blocks parked in every arena's one-block cache. */
void _vram_cache_flush_all(vram_pool_t *pool);
/* block.c: split free block b at `addr` (inside it): the front becomes a free block of its
 * own in the index, b keeps the back (where a placement chose to carve). VRAM_EHOSTMEM when
 * no block struct can be had. Undone by _vram_block_merge_front. */
int _vram_block_split_front(vram_pool_t *pool, vram_block *b, uintptr_t addr);
void _vram_block_merge_front(vram_pool_t *pool, vram_block *b);

static inline vram_block *_vram_block_new(vram_pool_t *pool) {
  vram_block_cache *c = &pool->blocks;
  if (!c->free_list && !_vram_block_slab_add(pool)) return NULL;
  vram_block *b = c->free_list;
  c->free_list = b->free_next;
  memset(b, 0, sizeof *b);
  return b;
}

/* The block must hold no stream list: a free block's links share its bytes. */
static inline void _vram_block_delete(vram_pool_t *pool, vram_block *b) {
  b->free_next = pool->blocks.free_list;
  pool->blocks.free_list = b;
}

/* Take `gone` out of its segment's address list; a neighbour now covers its bytes. */
static inline void _vram_block_unlink(vram_pool_t *pool, vram_block *gone) {
  vram_block *prev = gone->addr_prev, *next = gone->addr_next;
  if (prev) prev->addr_next = next;
  else gone->segment->first = next;
  if (next) next->addr_prev = prev;
  _vram_block_delete(pool, gone);
}

/* Put the new block `fresh` in front of `b` in b's segment: it takes the front `size`
 * bytes of b's range, which b gives up. The free index is the caller's business. */
static inline void _vram_block_link_before(vram_block *fresh, vram_block *b, size_t size) {
  vram_segment *seg = b->segment;
  fresh->addr = b->addr;
  fresh->size = size;
  fresh->segment = seg;
  fresh->addr_prev = b->addr_prev;
  fresh->addr_next = b;
  if (fresh->addr_prev) fresh->addr_prev->addr_next = fresh;
  else seg->first = fresh;
  b->addr_prev = fresh;
  b->addr += size;
}

/* Give block `b` (in use, not in the pointer map) back to its segment's free space. A free
 * neighbour grows over it in place and keeps its slot in the index unless its new size
 * maps to another bin: most merges then cost no index update at all. */
VRAM_HOT void _vram_block_make_free(vram_pool_t *pool, vram_block *b) {
  vram_segment *seg = b->segment;
  vram_tlsf *index = seg->index;
  seg->used_bytes -= b->size;
  if (!seg->used_bytes) _vram_idle_push(pool, seg);
  if (seg->gran_mapped) _vram_granules_release(pool, b); /* before the merge: see granules.h */
  vram_block *prev = b->addr_prev, *next = b->addr_next;
  bool next_free = next && next->state == VRAM_BLOCK_FREE;
  if (prev && prev->state == VRAM_BLOCK_FREE) {
    size_t size = prev->size + b->size;
    _vram_block_unlink(pool, b);
    if (next_free) {
      size += next->size;
      _vram_tlsf_remove(index, next);
      _vram_block_unlink(pool, next);
    }
    _vram_tlsf_resize(index, prev, size);
  } else if (next_free) {
    size_t size = next->size + b->size;
    next->addr = b->addr;
    _vram_block_unlink(pool, b);
    _vram_tlsf_resize(index, next, size);
  } else {
    b->state = VRAM_BLOCK_FREE;
    _vram_tlsf_insert(index, b);
  }
}

/* Carve a live block of exactly `rounded` bytes from the front of the free block `b`. The
 * free rest keeps b's struct and, unless its size now maps to another bin, its slot in the
 * index. Every fallible step comes first, so a failure changes nothing. */
VRAM_HOT int _vram_block_take(vram_pool_t *pool, vram_block *b, size_t rounded, size_t requested,
                              vram_block **out) {
  vram_segment *seg = b->segment;
  vram_block *live = b;
  if (pool->no_split) rounded = b->size; /* the whole segment, never a cut of it */
  if (b->size > rounded) {
    live = _vram_block_new(pool);
    if (!live) return VRAM_EHOSTMEM;
  }
  int rc = _vram_ptrmap_insert(&pool->ptrs, b->addr, live);
  if (rc == VRAM_OK && seg->gran_mapped) {
    rc = _vram_granules_acquire(pool, b, rounded);
    if (rc) _vram_ptrmap_remove(&pool->ptrs, b->addr);
  }
  if (rc) {
    if (live != b) _vram_block_delete(pool, live);
    return rc;
  }
  vram_tlsf *index = seg->index;
  if (live == b) {
    _vram_tlsf_remove(index, b); /* clears the links, so requested and uses start at 0 */
  } else {
    _vram_block_link_before(live, b, rounded);
    _vram_tlsf_resize(index, b, b->size - rounded);
  }
  live->state = VRAM_BLOCK_LIVE;
  live->requested = requested;
  if (!seg->used_bytes) _vram_idle_remove(pool, seg);
  seg->used_bytes += rounded;
  *out = live;
  return VRAM_OK;
}

/* A cached block stays in the pointer map, so that freeing and taking it back cost no
 * hash insert or delete; it leaves the map when it is really freed. */
VRAM_HOT void _vram_block_uncache(vram_pool_t *pool, vram_block *b) {
  _vram_ptrmap_remove(&pool->ptrs, b->addr);
  _vram_block_make_free(pool, b);
}

/* An arena whose one-block cache was filled joins the pool's list of those a flush visits,
 * once: only a flush empties the list. One test of a flag beside the cache slots, where a
 * flush that walked every arena cost a miss per stream at every growth past the peak. */
VRAM_HOT void _vram_cache_note(vram_pool_t *pool, vram_arena *a) {
  if (a->cache_listed) return;
  a->cache_listed = true;
  a->cache_next = pool->cache_arenas;
  pool->cache_arenas = a;
}

/* A freed block goes to its arena's cache; the block it displaces is coalesced now. */
VRAM_HOT void _vram_block_retire(vram_pool_t *pool, vram_block *b) {
  /* The block is merged with its neighbours when it leaves the cache, often on the very
   * next call; in a pool far larger than the CPU cache their structs are misses, so start
   * loading them now, alongside the segment's. */
  __builtin_prefetch(b->addr_prev);
  __builtin_prefetch(b->addr_next);
  b->state = VRAM_BLOCK_CACHED;
  b->requested = 0;
  /* With a release threshold the user asked for memory back at free: no parking. */
  if (pool->opts.release_threshold != SIZE_MAX) {
    _vram_block_uncache(pool, b);
    return;
  }
  vram_block **slot = b->segment->cached;
  vram_block *old = *slot;
  *slot = b;
  if (old) _vram_block_uncache(pool, old);
  else _vram_cache_note(pool, b->segment->arena);
}

#endif /* VRAM_BLOCK_H */

/* check.c - the invariant checker (_vram_pool_is_valid).
 *
 * Recomputes everything the engine keeps incrementally and compares: blocks tile each
 * segment by address with no two free neighbours; every free block is in its arena's
 * index for its kind and nothing else is; every live, pending or parked block is in the
 * pointer map and the map holds nothing else; a parked block is its arena's cached one; segment usage, granule counts and the statistics
 * agree with the blocks. The tests run it after every operation (VRAM_DEBUG >= 3 builds
 * also run it inside every public call). It prints the first broken invariant. */
#include <stdio.h>

#include "pool/internal.h"

#define REQUIRE(cond, ...)                                                                 \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "vramkit invariant: " __VA_ARGS__);                                  \
      fputc('\n', stderr);                                                                 \
      return false;                                                                        \
    }                                                                                      \
  } while (0)

typedef struct index_visit {
  const vram_arena *arena;
  bool small;
  size_t blocks;
} index_visit;

static bool visit_index_block(void *ctx, const vram_block *b) {
  index_visit *v = ctx;
  v->blocks++;
  return b->state == VRAM_BLOCK_FREE && b->segment && b->segment->arena == v->arena &&
         b->segment->is_small == v->small;
}

bool _vram_pool_check_locked(vram_pool_t *pool) {
  int64_t allocated = 0, requested = 0, active = 0, live = 0, active_blocks = 0, segments = 0;
  int64_t reserved = 0;
  size_t in_map = 0, idle_bytes = 0;
  for (vram_arena *a = pool->arenas; a; a = a->next) {
    size_t free_small = 0, free_large = 0, cached = 0;
    vram_segment *prev_seg = NULL;
    for (vram_segment *s = a->segments; s; prev_seg = s, s = s->next) {
      segments++;
      REQUIRE(s->arena == a && s->prev == prev_seg, "segment %p badly linked", (void *)s);
      REQUIRE(s->index == (s->is_small ? &a->free_small : &a->free_large) &&
                  s->cached == (s->is_small ? &a->cached_small : &a->cached_large),
              "segment %p names another kind's index or cache", (void *)s);
      REQUIRE(s->first && s->first->addr == s->addr && !s->first->addr_prev,
              "segment %p does not start with its first block", (void *)s);
      uintptr_t expect_addr = s->addr;
      size_t used = 0;
      for (vram_block *b = s->first; b; b = b->addr_next) {
        REQUIRE(b->segment == s, "block %#lx names another segment", (unsigned long)b->addr);
        REQUIRE(b->addr == expect_addr, "gap or overlap at %#lx", (unsigned long)b->addr);
        REQUIRE(b->size && b->size % VRAM_ALIGN == 0, "block size %zu not aligned", b->size);
        REQUIRE(!b->addr_next || b->addr_next->addr_prev == b, "address links broken");
        expect_addr += b->size;
        if (b->state == VRAM_BLOCK_FREE) {
          REQUIRE(!b->addr_next || b->addr_next->state != VRAM_BLOCK_FREE,
                  "free neighbours not coalesced at %#lx", (unsigned long)b->addr);
          if (s->is_small) free_small++; else free_large++;
          continue;
        }
        if (b->state == VRAM_BLOCK_CACHED) {
          REQUIRE(b == (s->is_small ? a->cached_small : a->cached_large),
                  "cached block %#lx is not its arena's cached block", (unsigned long)b->addr);
          REQUIRE(b->requested == 0 && _vram_ptrmap_get(&pool->ptrs, b->addr) == b,
                  "cached block %#lx not in the pointer map", (unsigned long)b->addr);
          used += b->size;
          cached++;
          in_map++;
          continue;
        }
        REQUIRE(b->state == VRAM_BLOCK_LIVE || b->state == VRAM_BLOCK_PENDING, "bad block state");
        REQUIRE(_vram_ptrmap_get(&pool->ptrs, b->addr) == b, "block %#lx missing from pointer map",
                (unsigned long)b->addr);
        REQUIRE(b->requested > 0 && b->requested <= b->size, "requested %zu outside block %zu",
                b->requested, b->size);
        in_map++;
        used += b->size;
        active += (int64_t)b->size;
        active_blocks++;
        if (b->state == VRAM_BLOCK_LIVE) {
          allocated += (int64_t)b->size;
          requested += (int64_t)b->requested;
          live++;
          REQUIRE(b->events_left == 0, "live block with pending events");
        } else {
          REQUIRE(b->events_left > 0, "pending block with no events");
        }
      }
      REQUIRE(expect_addr == s->addr + s->size, "blocks do not cover segment %p", (void *)s);
      REQUIRE(used == s->used_bytes, "segment used bytes %zu, blocks say %zu", s->used_bytes, used);
      REQUIRE(s->idle == (!pool->src->is_vmm && !s->keep && !s->used_bytes),
              "segment %p idle flag disagrees with its usage", (void *)s);
      if (s->idle) idle_bytes += s->size;
      if (pool->src->is_vmm) {
        REQUIRE(_vram_granules_check(pool, s), "granule accounting of segment %p", (void *)s);
        reserved += (int64_t)(s->mapped_granules * pool->granularity);
      } else {
        reserved += (int64_t)s->size;
      }
    }
    REQUIRE(cached == (size_t)(a->cached_small != NULL) + (size_t)(a->cached_large != NULL),
            "arena cache names blocks that are not cached");
    index_visit vs = {a, true, 0}, vl = {a, false, 0};
    REQUIRE(_vram_tlsf_check(&a->free_small, visit_index_block, &vs), "small free index corrupt");
    REQUIRE(_vram_tlsf_check(&a->free_large, visit_index_block, &vl), "large free index corrupt");
    REQUIRE(vs.blocks == free_small && vl.blocks == free_large,
            "free index holds %zu+%zu blocks, segments %zu+%zu", vs.blocks, vl.blocks, free_small,
            free_large);
  }
  size_t idle_listed = 0;
  for (vram_segment *s = pool->idle_head; s; s = s->idle_next) {
    REQUIRE(s->idle && (s->idle_next ? s->idle_next->idle_prev == s : pool->idle_tail == s),
            "idle segment list broken");
    idle_listed += s->size;
  }
  REQUIRE(idle_listed == idle_bytes && idle_bytes == pool->idle_bytes,
          "idle segments: listed %zu, flagged %zu, counted %zu", idle_listed, idle_bytes,
          pool->idle_bytes);
  REQUIRE(in_map == pool->ptrs.count, "pointer map holds %zu, blocks %zu", pool->ptrs.count, in_map);
  REQUIRE(pool->ptrs.count * VRAM_PTRMAP_SLOTS_PER_ENTRY <= pool->ptrs.mask + 1,
          "pointer map over its load bound: %zu entries in %zu slots", pool->ptrs.count,
          pool->ptrs.mask + 1);
  size_t pending = 0;
  for (vram_pending *p = pool->pending_head; p; p = p->next) {
    REQUIRE(p->block->state == VRAM_BLOCK_PENDING, "pending entry for a non-pending block");
    REQUIRE(p->next || p == pool->pending_tail, "pending tail wrong");
    pending++;
  }
  REQUIRE(pending == pool->pending_count, "pending count");
  vram_stats_t derived = pool->stats;
  _vram_fill_derived_stats(pool, &derived);
  const vram_stats_t *st = &derived;
  REQUIRE(st->allocated_bytes.current == allocated, "allocated_bytes %lld, blocks %lld",
          (long long)st->allocated_bytes.current, (long long)allocated);
  REQUIRE(st->requested_bytes.current == requested, "requested_bytes");
  REQUIRE(st->active_bytes.current == active, "active_bytes");
  REQUIRE(st->allocation.current == live, "allocation count");
  REQUIRE(st->active.current == active_blocks, "active count");
  REQUIRE(st->reserved_bytes.current == reserved, "reserved_bytes %lld, segments %lld",
          (long long)st->reserved_bytes.current, (long long)reserved);
  REQUIRE(st->segment.current == segments, "segment count");
#define VRAM_X_PEAK(name, doc) REQUIRE(st->name.peak >= st->name.current, #name " peak below current");
  VRAM_STAT_LIST(VRAM_X_PEAK)
#undef VRAM_X_PEAK
  return true;
}

int _vram_pool_is_valid(vram_pool_t *pool) {
  if (!pool) return 0;
  vram_lock_acquire(&pool->lock);
  bool ok = _vram_pool_check_locked(pool);
  vram_lock_release(&pool->lock);
  return ok;
}

/* check.c - the invariant checker (_vram_pool_is_valid).
 *
 * Recomputes everything the engine keeps incrementally and compares, one structure at a
 * time: blocks tile each segment by address with no two free neighbours; every free block
 * is in its arena's index for its kind and nothing else is; every live, pending or parked
 * block is in the pointer map and the map holds nothing else; a parked block is its arena's
 * cached one; a no_split pool's segments are one block each; segment usage, granule
 * counts, the idle list, the pending list and the statistics agree with the blocks. The
 * tests run it after every operation (VRAM_DEBUG >= 3 builds also run it inside every
 * public call). It prints the first broken invariant. */
#include <stdio.h>

#include "pool/pool.h"
#include "pool/granules.h"
#include "pool/ptrmap.h"
#include "pool/snapshot.h"
#include "pool/tlsf.h"

#define REQUIRE(cond, ...)                                                                 \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "vramkit invariant: " __VA_ARGS__);                                  \
      fputc('\n', stderr);                                                                 \
      return false;                                                                        \
    }                                                                                      \
  } while (0)

/* What the walk over the blocks adds up, to compare with the pool's own counts. */
typedef struct tally {
  int64_t allocated, requested, active, live, active_blocks, segments, reserved;
  size_t in_map, idle_bytes;
  size_t free_small, free_large, free_retired, cached; /* of the arena being walked */
} tally;

/* A parked block: its arena's cached one, still in the pointer map. */
static bool check_cached_block(vram_pool_t *pool, const vram_arena *a, const vram_segment *s,
                               const vram_block *b) {
  REQUIRE(b == (s->is_small ? a->cached_small : a->cached_large),
          "cached block %#lx is not its arena's cached block", (unsigned long)b->addr);
  REQUIRE(b->requested == 0 && _vram_ptrmap_get(&pool->ptrs, b->addr) == b,
          "cached block %#lx not in the pointer map", (unsigned long)b->addr);
  return true;
}

/* A live or pending block: in the pointer map, with a plausible request and events. */
static bool check_used_block(vram_pool_t *pool, const vram_block *b, tally *t) {
  REQUIRE(b->state == VRAM_BLOCK_LIVE || b->state == VRAM_BLOCK_PENDING, "bad block state");
  REQUIRE(_vram_ptrmap_get(&pool->ptrs, b->addr) == b, "block %#lx missing from pointer map",
          (unsigned long)b->addr);
  REQUIRE(b->requested > 0 && b->requested <= b->size, "requested %zu outside block %zu",
          b->requested, b->size);
  t->active += (int64_t)b->size;
  t->active_blocks++;
  if (b->state == VRAM_BLOCK_PENDING) {
    REQUIRE(b->events_left > 0, "pending block with no events");
    return true;
  }
  REQUIRE(b->events_left == 0, "live block with pending events");
  t->allocated += (int64_t)b->size;
  t->requested += (int64_t)b->requested;
  t->live++;
  return true;
}

/* The blocks of one segment tile it by address; returns the bytes in use in *used. */
static bool check_segment_blocks(vram_pool_t *pool, const vram_arena *a, const vram_segment *s,
                                 tally *t, size_t *used) {
  uintptr_t expect_addr = s->addr;
  *used = 0;
  for (vram_block *b = s->first; b; b = b->addr_next) {
    REQUIRE(b->segment == s, "block %#lx names another segment", (unsigned long)b->addr);
    REQUIRE(b->addr == expect_addr, "gap or overlap at %#lx", (unsigned long)b->addr);
    REQUIRE(b->size && b->size % VRAM_ALIGN == 0, "block size %zu not aligned", b->size);
    REQUIRE(!b->addr_next || b->addr_next->addr_prev == b, "address links broken");
    expect_addr += b->size;
    if (b->state == VRAM_BLOCK_FREE) {
      REQUIRE(!b->addr_next || b->addr_next->state != VRAM_BLOCK_FREE,
              "free neighbours not coalesced at %#lx", (unsigned long)b->addr);
      if (s->index == &a->retired) t->free_retired++;
      else if (s->is_small) t->free_small++;
      else t->free_large++;
      continue;
    }
    if (b->state == VRAM_BLOCK_CACHED) {
      if (!check_cached_block(pool, a, s, b)) return false;
      t->cached++;
    } else if (!check_used_block(pool, b, t)) {
      return false;
    }
    t->in_map++;
    *used += b->size;
  }
  REQUIRE(expect_addr == s->addr + s->size, "blocks do not cover segment %p", (void *)s);
  return true;
}

/* One segment: its links, its blocks, its usage, its idle flag and its granules. */
static bool check_segment(vram_pool_t *pool, const vram_arena *a, vram_segment *s,
                          const vram_segment *prev, tally *t) {
  t->segments++;
  REQUIRE(s->arena == a && s->prev == prev, "segment %p badly linked", (void *)s);
  /* A retired segment (virtual growth): a fixed large one of an arena that grows virtual. */
  bool retired = s->index == &a->retired;
  REQUIRE(!retired || (a->grows_virtual && !s->is_small && !s->gran_mapped),
          "segment %p retired but not a fixed large one of an arena growing virtual", (void *)s);
  REQUIRE((s->index == (s->is_small ? &a->free_small : &a->free_large) || retired) &&
              s->cached == (s->is_small ? &a->cached_small : &a->cached_large),
          "segment %p names another kind's index or cache", (void *)s);
  REQUIRE(s->first && s->first->addr == s->addr && !s->first->addr_prev,
          "segment %p does not start with its first block", (void *)s);
  REQUIRE(!pool->no_split || (!s->first->addr_next && !s->gran_mapped),
          "segment %p of a no_split pool is cut or virtual", (void *)s);
  size_t used = 0;
  if (!check_segment_blocks(pool, a, s, t, &used)) return false;
  REQUIRE(used == s->used_bytes, "segment used bytes %zu, blocks say %zu", s->used_bytes, used);
  REQUIRE(s->idle == (!s->gran_mapped && !s->keep && !s->used_bytes),
          "segment %p idle flag disagrees with its usage", (void *)s);
  if (s->idle) t->idle_bytes += s->size;
  if (!s->gran_mapped) {
    t->reserved += (int64_t)s->size;
    return true;
  }
  REQUIRE(_vram_granules_check(pool, s), "granule accounting of segment %p", (void *)s);
  t->reserved += (int64_t)(s->mapped_granules * pool->granularity);
  return true;
}

typedef struct index_visit {
  const vram_arena *arena;
  bool small, retired;
  size_t blocks;
} index_visit;

static bool visit_index_block(void *ctx, const vram_block *b) {
  index_visit *v = ctx;
  v->blocks++;
  return b->state == VRAM_BLOCK_FREE && b->segment && b->segment->arena == v->arena &&
         b->segment->is_small == v->small &&
         (b->segment->index == &v->arena->retired) == v->retired;
}

/* One arena: its segments, its one-block caches, and its two free indexes. */
static bool check_arena(vram_pool_t *pool, vram_arena *a, tally *t) {
  t->free_small = t->free_large = t->free_retired = t->cached = 0;
  vram_segment *prev = NULL;
  for (vram_segment *s = a->segments; s; prev = s, s = s->next)
    if (!check_segment(pool, a, s, prev, t)) return false;
  REQUIRE(t->cached == (size_t)(a->cached_small != NULL) + (size_t)(a->cached_large != NULL),
          "arena cache names blocks that are not cached");
  index_visit vs = {a, true, false, 0}, vl = {a, false, false, 0}, vr = {a, false, true, 0};
  REQUIRE(_vram_tlsf_check(&a->free_small, visit_index_block, &vs), "small free index corrupt");
  REQUIRE(_vram_tlsf_check(&a->free_large, visit_index_block, &vl), "large free index corrupt");
  REQUIRE(_vram_tlsf_check(&a->retired, visit_index_block, &vr), "retired free index corrupt");
  REQUIRE(vs.blocks == t->free_small && vl.blocks == t->free_large && vr.blocks == t->free_retired,
          "free indexes hold %zu+%zu+%zu blocks, segments %zu+%zu+%zu", vs.blocks, vl.blocks,
          vr.blocks, t->free_small, t->free_large, t->free_retired);
  return true;
}

static bool check_idle_list(const vram_pool_t *pool, const tally *t) {
  size_t listed = 0;
  for (vram_segment *s = pool->idle_head; s; s = s->idle_next) {
    REQUIRE(s->idle && (s->idle_next ? s->idle_next->idle_prev == s : pool->idle_tail == s),
            "idle segment list broken");
    listed += s->size;
  }
  REQUIRE(listed == t->idle_bytes && t->idle_bytes == pool->idle_bytes,
          "idle segments: listed %zu, flagged %zu, counted %zu", listed, t->idle_bytes,
          pool->idle_bytes);
  return true;
}

static bool check_ptrmap(const vram_pool_t *pool, const tally *t) {
  REQUIRE(t->in_map == pool->ptrs.count, "pointer map holds %zu, blocks %zu", pool->ptrs.count,
          t->in_map);
  REQUIRE(pool->ptrs.count * VRAM_PTRMAP_SLOTS_PER_ENTRY <= pool->ptrs.mask + 1,
          "pointer map over its load bound: %zu entries in %zu slots", pool->ptrs.count,
          pool->ptrs.mask + 1);
  return true;
}

static bool check_pending(const vram_pool_t *pool) {
  size_t pending = 0;
  for (vram_pending *p = pool->pending_head; p; p = p->next) {
    REQUIRE(p->block->state == VRAM_BLOCK_PENDING, "pending entry for a non-pending block");
    REQUIRE(p->next || p == pool->pending_tail, "pending tail wrong");
    pending++;
  }
  REQUIRE(pending == pool->pending_count, "pending count");
  return true;
}

static bool check_stats(const vram_pool_t *pool, const tally *t) {
  vram_stats_t derived;
  _vram_pool_fill_stats(pool, &derived);
  const vram_stats_t *st = &derived;
  REQUIRE(st->allocated_bytes.current == t->allocated, "allocated_bytes %lld, blocks %lld",
          (long long)st->allocated_bytes.current, (long long)t->allocated);
  REQUIRE(st->requested_bytes.current == t->requested, "requested_bytes");
  REQUIRE(st->active_bytes.current == t->active, "active_bytes");
  REQUIRE(st->allocation.current == t->live, "allocation count");
  REQUIRE(st->active.current == t->active_blocks, "active count");
  REQUIRE(st->reserved_bytes.current == t->reserved, "reserved_bytes %lld, segments %lld",
          (long long)st->reserved_bytes.current, (long long)t->reserved);
  REQUIRE(st->segment.current == t->segments, "segment count");
#define VRAM_X_PEAK(name, doc) REQUIRE(st->name.peak >= st->name.current, #name " peak below current");
  VRAM_STAT_LIST(VRAM_X_PEAK)
#undef VRAM_X_PEAK
  return true;
}

/* With split statistics, the two kinds add up to the pool's own figures. */
static bool check_kinds(const vram_pool_t *pool) {
  if (!pool->split_stats) return true;
  const vram_kind_counts *k = pool->kinds;
  const vram_stats_t *st = &pool->stats;
  REQUIRE(k[0].allocated_bytes.current + k[1].allocated_bytes.current ==
              st->allocated_bytes.current, "small and large allocated_bytes");
  REQUIRE(k[0].requested_bytes.current + k[1].requested_bytes.current ==
              st->requested_bytes.current, "small and large requested_bytes");
  REQUIRE(k[0].allocation.current + k[1].allocation.current == st->allocation.current,
          "small and large allocation counts");
  REQUIRE(k[0].reserved_bytes.current + k[1].reserved_bytes.current ==
              st->reserved_bytes.current, "small and large reserved_bytes");
  REQUIRE(k[0].segment.current + k[1].segment.current == st->segment.current,
          "small and large segment counts");
  return true;
}

bool _vram_pool_check_locked(vram_pool_t *pool) {
  tally t = {0};
  for (vram_arena *a = pool->arenas; a; a = a->next)
    if (!check_arena(pool, a, &t)) return false;
  return check_idle_list(pool, &t) && check_ptrmap(pool, &t) && check_pending(pool) &&
         check_stats(pool, &t) && check_kinds(pool);
}

int _vram_pool_is_valid(vram_pool_t *pool) {
  if (!pool) return 0;
  vram_lock_acquire(&pool->lock);
  bool ok = _vram_pool_check_locked(pool);
  vram_lock_release(&pool->lock);
  return ok;
}

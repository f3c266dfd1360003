/* segment.c - arenas and segments: growth from the source, release back to it, as
 * placement.c decides (which segment a miss grows by, which cached memory goes back).
 *
 * Fixed sources (cuda, managed, sim) hand out whole segments; virtual-memory sources
 * reserve one large range per arena and kind, whose granules granules.c maps. Release
 * always waits for the arena's stream first (one stream wait, never a device-wide one), so
 * that no kernel still running can touch memory that went back. */
#include <stdlib.h>

#include "pool/block.h"
#include "pool/events.h"
#include "pool/kinds.h"
#include "pool/placement.h"
#include "pool/segment.h"
#include "prim/hostmem.h"

static size_t arena_home(const vram_pool_t *pool, vram_stream_t stream) {
  /* Streams are pointers: Fibonacci hashing spreads their aligned low bits. */
  return (size_t)(((uint64_t)(uintptr_t)stream * 0x9E3779B97F4A7C15ull) >> 32) & pool->arena_mask;
}

vram_arena *_vram_arena_find(const vram_pool_t *pool, vram_stream_t stream) {
  if (!pool->arena_slots) return NULL;
  for (size_t i = arena_home(pool, stream);; i = (i + 1) & pool->arena_mask) {
    vram_arena *a = pool->arena_slots[i];
    if (!a || a->stream == stream) return a;
  }
}

static void arena_slot_put(vram_pool_t *pool, vram_arena *a) {
  size_t i = arena_home(pool, a->stream);
  while (pool->arena_slots[i]) i = (i + 1) & pool->arena_mask;
  pool->arena_slots[i] = a;
}

/* Room for one more arena at a load of at most one half; false when host memory runs out.
 * Arenas are never removed before the pool goes, so the table only grows. */
static bool arena_table_reserve(vram_pool_t *pool) {
  size_t capacity = pool->arena_slots ? pool->arena_mask + 1 : 0;
  if ((pool->arena_count + 1) * 2 <= capacity) return true;
  size_t bigger = capacity ? 2 * capacity : 16;
  vram_arena **slots = calloc(bigger, sizeof *slots);
  if (!slots) return false;
  free(pool->arena_slots);
  pool->arena_slots = slots;
  pool->arena_mask = bigger - 1;
  for (vram_arena *a = pool->arenas; a; a = a->next) arena_slot_put(pool, a);
  return true;
}

vram_arena *_vram_arena_find_or_create(vram_pool_t *pool, vram_stream_t stream) {
  vram_arena *a = _vram_arena_find(pool, stream);
  if (a) {
    pool->last_arena = a;
    return a;
  }
  if (!arena_table_reserve(pool)) return NULL;
  a = calloc(1, sizeof *a);
  if (!a) return NULL;
  a->stream = stream;
  _vram_tlsf_init(&a->free_small);
  _vram_tlsf_init(&a->free_large);
  _vram_tlsf_init(&a->retired);
  a->next = pool->arenas;
  pool->arenas = a;
  arena_slot_put(pool, a);
  pool->arena_count++;
  pool->last_arena = a;
  return a;
}

/* Wait for the work queued so far on an arena's stream: memory of the arena may then go
 * back to the source. A stream wait, never a device-wide one. */
int _vram_arena_quiesce(vram_pool_t *pool, vram_arena *arena) {
  int rc;
  if (!arena->release_event) {
    rc = pool->src->xEventCreate(pool->src_state, &arena->release_event);
    if (rc) return rc;
  }
  rc = pool->src->xEventRecord(pool->src_state, arena->release_event, arena->stream);
  if (!rc) rc = pool->src->xEventSynchronize(pool->src_state, arena->release_event);
  if (!rc) pool->stats.num_sync_waits++;
  return rc;
}

static void segment_link(vram_arena *a, vram_segment *seg) {
  seg->arena = a;
  seg->index = _vram_arena_index(a, seg->is_small);
  seg->cached = _vram_arena_cache_slot(a, seg->is_small);
  seg->prev = NULL;
  seg->next = a->segments;
  if (a->segments) a->segments->prev = seg;
  a->segments = seg;
}

static void segment_unlink(vram_segment *seg) {
  vram_arena *a = seg->arena;
  if (seg->prev) seg->prev->next = seg->next;
  else a->segments = seg->next;
  if (seg->next) seg->next->prev = seg->prev;
}

/* Give one fully free segment back to the source; its arena must be quiesced. */
static int segment_release(vram_pool_t *pool, vram_segment *seg) {
  vram_assert(seg->used_bytes == 0 && seg->first && !seg->first->addr_next);
  int rc;
  bool virtual = seg->gran_mapped != NULL;
  if (virtual) {
    if (seg->mapped_granules) return VRAM_EBUSY; /* unmap first (granules.c) */
    rc = pool->src->xUnreserve(pool->src_state, seg->addr, seg->size);
    /* Its addresses may come back in another range, which never unmapped them. */
    if (!rc) _vram_place_forget_map_ghosts_in(pool, seg->addr, seg->addr + seg->size);
  } else {
    rc = pool->src->xFree(pool->src_state, seg->addr, seg->size, seg->arena->stream);
  }
  if (rc) return rc;
  if (!virtual) {
    vram_stat_down(&pool->stats.reserved_bytes, (int64_t)(seg->size));
    _vram_kind_unreserve(pool, seg, seg->size);
    uint64_t context = _vram_call_context(pool);
    _vram_note(pool, VRAM_EVENT_SEGMENT_FREE, seg->addr, seg->size, 0, seg->arena->stream,
               context ? context : seg->context);
  }
  pool->stats.num_device_free++;
  _vram_place_segment_released(pool, seg->size);
  vram_stat_down(&pool->stats.segment, 1);
  vram_stat_down(&_vram_kind_of(pool, seg)->segment, 1);
  _vram_tlsf_remove(seg->index, seg->first);
  _vram_block_delete(pool, seg->first);
  _vram_idle_remove(pool, seg);
  segment_unlink(seg);
  _vram_granules_destroy(seg);
  _vram_host_free(seg, sizeof *seg);
  return VRAM_OK;
}

/* Keep the first failure of a release that goes on past failures. */
static inline void note_error(int *first_error, int rc) {
  if (rc && first_error && !*first_error) *first_error = rc;
}

/* Its arena's stream is waited for once per release epoch, however many of its segments go. */
int _vram_segment_release_idle(vram_pool_t *pool, vram_segment *s) {
  vram_arena *a = s->arena;
  if (a->quiesced_at != pool->release_epoch) {
    int rc = _vram_arena_quiesce(pool, a);
    if (rc) return rc;
    a->quiesced_at = pool->release_epoch;
  }
  return segment_release(pool, s);
}

/* Fully free fixed segments, longest unused first. */
size_t _vram_release_fixed_idle(vram_pool_t *pool, size_t want, int *first_error) {
  size_t released = 0;
  pool->release_epoch++;
  vram_segment *prev;
  for (vram_segment *s = pool->idle_tail; s && released < want; s = prev) {
    prev = s->idle_prev;
    size_t size = s->size;
    int rc = _vram_segment_release_idle(pool, s);
    if (rc) {
      note_error(first_error, rc);
      continue;
    }
    released += size;
  }
  return released;
}

void _vram_release_empty_ranges(vram_pool_t *pool, int *first_error) {
  for (vram_arena *a = pool->arenas; a; a = a->next) {
    vram_segment *next;
    for (vram_segment *s = a->segments; s; s = next) {
      next = s->next;
      if (!s->gran_mapped || s->used_bytes || s->mapped_granules || s->keep) continue;
      note_error(first_error, segment_release(pool, s));
    }
  }
}

/* The arena's large requests go to virtual ranges from now on (placement.c records it):
 * the free blocks of its fixed large segments leave the index for the retired one, so that those segments drain as
 * their blocks are freed and go back (the idle list) when granules need the memory. Their
 * holes, fixed in size and place, are what keeps fixed segments from fitting a cap
 * tightly. */
static void retire_fixed_large(vram_pool_t *pool, vram_arena *a) {
  _vram_cache_flush_all(pool);
  for (vram_segment *s = a->segments; s; s = s->next) {
    if (s->is_small || s->gran_mapped || s->keep) continue;
    for (vram_block *b = s->first; b; b = b->addr_next)
      if (b->state == VRAM_BLOCK_FREE) {
        _vram_tlsf_remove(&a->free_large, b);
        _vram_tlsf_insert(&a->retired, b);
      }
    s->index = &a->retired;
  }
}

/* The growth placement.c chose: no policy here, only the source calls and the bookkeeping. */
int _vram_segment_add(vram_pool_t *pool, vram_arena *a, vram_growth g, bool small,
                      vram_block **out_free) {
  bool vmm = g.virtual;
  size_t size = g.size;
  vram_segment *seg = _vram_host_zalloc(sizeof *seg); /* on a line of its own: types.h */
  vram_block *b = _vram_block_new(pool);
  if (!seg || !b) {
    _vram_host_free(seg, sizeof *seg);
    if (b) _vram_block_delete(pool, b);
    return VRAM_EHOSTMEM;
  }
  uintptr_t addr = 0;
  int rc = vmm ? pool->src->xReserve(pool->src_state, size, &addr)
               : pool->src->xAlloc(pool->src_state, size, a->stream, &addr);
  if (rc) {
    _vram_host_free(seg, sizeof *seg);
    _vram_block_delete(pool, b);
    return rc;
  }
  seg->addr = addr;
  seg->size = size;
  seg->is_small = small;
  if (vmm) {
    rc = _vram_granules_init(pool, seg);
    if (rc) {
      pool->src->xUnreserve(pool->src_state, addr, size);
      _vram_host_free(seg, sizeof *seg);
      _vram_block_delete(pool, b);
      return rc;
    }
  }
  if (g.retire) retire_fixed_large(pool, a);
  segment_link(a, seg);
  b->addr = addr;
  b->size = size;
  b->segment = seg;
  b->state = VRAM_BLOCK_FREE;
  seg->first = b;
  seg->context = _vram_call_context(pool);
  _vram_tlsf_insert(seg->index, b);
  _vram_idle_push(pool, seg);
  if (!vmm) {
    vram_stat_up(&pool->stats.reserved_bytes, (int64_t)size);
    _vram_kind_reserve(pool, seg, size);
    _vram_note(pool, VRAM_EVENT_SEGMENT_ALLOC, addr, size, 0, a->stream, 0);
  }
  vram_stat_up(&pool->stats.segment, 1);
  vram_stat_up(&_vram_kind_of(pool, seg)->segment, 1);
  pool->stats.num_device_alloc += vmm ? 0 : 1;
  *out_free = b;
  return VRAM_OK;
}

/* Blocks still in use (a forced destroy) lose their stream lists with their segments. */
void _vram_segments_destroy(vram_pool_t *pool) {
  for (vram_arena *a = pool->arenas, *an; a; a = an) {
    an = a->next;
    if (a->segments) _vram_arena_quiesce(pool, a);
    for (vram_segment *s = a->segments, *sn; s; s = sn) {
      sn = s->next;
      for (vram_block *b = s->first; b; b = b->addr_next)
        if (b->state != VRAM_BLOCK_FREE) free(b->uses);
      if (s->gran_mapped) {
        _vram_granules_unmap_all(pool, s);
        pool->src->xUnreserve(pool->src_state, s->addr, s->size);
      } else {
        pool->src->xFree(pool->src_state, s->addr, s->size, a->stream);
      }
      _vram_granules_destroy(s);
      _vram_host_free(s, sizeof *s);
    }
    if (a->release_event) pool->src->xEventDestroy(pool->src_state, a->release_event);
    free(a);
  }
  pool->arenas = pool->last_arena = pool->cache_arenas = NULL;
  free(pool->arena_slots);
  pool->arena_slots = NULL;
  pool->arena_mask = pool->arena_count = 0;
}

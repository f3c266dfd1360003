/* pool.c - the allocator engine: malloc, free, streams, growth, release and the OOM ladder.
 *
 * internal.h draws the picture. The hot path of a size just freed on the same stream: find
 * the stream's arena (one-entry cache) and take back the block parked in its one-block
 * cache. Otherwise: merge the parked block, find a free block in the arena's TLSF index,
 * split it, record the pointer in the hash. Free looks the pointer up and parks the block;
 * the block it displaces is merged with its free address neighbours and indexed. No source
 * call, no allocation of host memory (block structs come from a free list), one lock taken
 * once per call.
 *
 * Misses go down a ladder: drain completed cross-stream frees; grow by a segment from the
 * source (or, for virtual memory, map granules); release cached memory and retry; then
 * fail with a report that says why and what to try.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool/internal.h"
#include "prim/hostmem.h"

/* Block structs come in slabs that double from BLOCK_SLAB up to BLOCK_SLAB << 8 (65,536
 * blocks, 4 MiB), so that a small pool stays small and a pool of a million blocks keeps its
 * structs on a few dozen huge pages (prim/hostmem.h). */
#define BLOCK_SLAB 256
#define BLOCK_SLAB_MAX_SHIFT 8

/* The pointer map starts with room for this many blocks (16,384 slots, 256 KiB), so that a
 * pool of a few thousand blocks, a training step's worth, never rehashes and keeps its
 * table nearly empty: probes then end at their home slot and the probe loops' exits are
 * predicted. Measured (bench/RESULTS.md, run 10): the sim replays 9% to 21% faster per op,
 * round by round, than with a table that starts at 256 blocks. */
#define PTRMAP_INITIAL_BLOCKS 4096

static inline size_t slab_blocks(size_t slab_index) {
  return (size_t)BLOCK_SLAB << (slab_index < BLOCK_SLAB_MAX_SHIFT ? slab_index : BLOCK_SLAB_MAX_SHIFT);
}

/* ---------------------------------------------------------------------------------------
 * Small helpers.
 * ------------------------------------------------------------------------------------- */

/* The steps of a malloc or a free: inlined into vram_malloc and vram_free, so that one
 * call does not pay the register saves of five (measured: bench/RESULTS.md, run 9). */
#define VRAM_HOT static inline __attribute__((always_inline))

static inline size_t round_up(size_t n, size_t unit) { return (n + unit - 1) & ~(unit - 1); }

/* Another slab of block structs on the free list; kept out of line, off the hot path. */
static __attribute__((noinline)) bool block_slab_add(vram_pool_t *pool) {
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

static inline vram_block *block_new(vram_pool_t *pool) {
  vram_block_cache *c = &pool->blocks;
  if (!c->free_list && !block_slab_add(pool)) return NULL;
  vram_block *b = c->free_list;
  c->free_list = b->free_next;
  memset(b, 0, sizeof *b);
  return b;
}

/* The block must hold no stream list: a free block's links share its bytes. */
static void block_delete(vram_pool_t *pool, vram_block *b) {
  b->free_next = pool->blocks.free_list;
  pool->blocks.free_list = b;
}

/* An arena's free index and one-block cache for one kind (segments keep both resolved). */
static inline vram_tlsf *free_index(vram_arena *a, bool small) {
  return small ? &a->free_small : &a->free_large;
}

static inline vram_block **cache_slot(vram_arena *a, bool small) {
  return small ? &a->cached_small : &a->cached_large;
}

static vram_arena *arena_find_or_create(vram_pool_t *pool, vram_stream_t stream) {
  vram_arena *a;
  for (a = pool->arenas; a; a = a->next) {
    if (a->stream == stream) {
      pool->last_arena = a;
      return a;
    }
  }
  a = calloc(1, sizeof *a);
  if (!a) return NULL;
  a->stream = stream;
  _vram_tlsf_init(&a->free_small);
  _vram_tlsf_init(&a->free_large);
  a->next = pool->arenas;
  pool->arenas = a;
  pool->last_arena = a;
  return a;
}

/* The stream's arena; almost always the one used last. */
static inline vram_arena *arena_get(vram_pool_t *pool, vram_stream_t stream) {
  vram_arena *a = pool->last_arena;
  if (a && a->stream == stream) return a;
  return arena_find_or_create(pool, stream);
}

/* The error callback as it was when the failing call held the lock, called after unlocking
 * so that it may call back into the pool. */
typedef struct error_hook {
  vram_error_fn fn;
  void *user;
} error_hook;

static inline error_hook error_hook_locked(const vram_pool_t *pool) {
  return (error_hook){pool->on_error, pool->on_error_user};
}

static void report_error(vram_pool_t *pool, error_hook hook, int status, const char *message) {
  if (hook.fn) hook.fn(hook.user, pool, status, message);
}

#if VRAM_DEBUG >= 3
#define CHECK_POOL_LOCKED(pool)                                                            \
  do {                                                                                     \
    if (!_vram_pool_check_locked(pool)) {                                                  \
      fprintf(stderr, "vramkit: pool invariant broken at %s:%d\n", __FILE__, __LINE__);    \
      abort();                                                                             \
    }                                                                                      \
  } while (0)
#else
#define CHECK_POOL_LOCKED(pool) ((void)0)
#endif

/* ---------------------------------------------------------------------------------------
 * Events: cross-stream frees and waiting before memory goes back to the source.
 * ------------------------------------------------------------------------------------- */

static int event_take(vram_pool_t *pool, void **event) {
  if (pool->n_spare_events) {
    *event = pool->spare_events[--pool->n_spare_events];
    return VRAM_OK;
  }
  return pool->src->xEventCreate(pool->src_state, event);
}

static void event_give(vram_pool_t *pool, void *event) {
  if (pool->n_spare_events == pool->cap_spare_events) {
    size_t cap = pool->cap_spare_events ? pool->cap_spare_events * 2 : 16;
    void **grown = realloc(pool->spare_events, cap * sizeof *grown);
    if (!grown) {
      pool->src->xEventDestroy(pool->src_state, event);
      return;
    }
    pool->spare_events = grown;
    pool->cap_spare_events = cap;
  }
  pool->spare_events[pool->n_spare_events++] = event;
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

/* ---------------------------------------------------------------------------------------
 * Blocks inside segments: take (split) and give back (coalesce).
 * ------------------------------------------------------------------------------------- */

/* Fixed sources: keep the list of fully free segments in step with their usage. */
static void idle_push(vram_pool_t *pool, vram_segment *seg) {
  if (seg->keep || seg->idle || pool->src->is_vmm) return;
  seg->idle = true;
  seg->idle_prev = NULL;
  seg->idle_next = pool->idle_head;
  if (pool->idle_head) pool->idle_head->idle_prev = seg;
  else pool->idle_tail = seg;
  pool->idle_head = seg;
  pool->idle_bytes += seg->size;
}

static void idle_remove(vram_pool_t *pool, vram_segment *seg) {
  if (!seg->idle) return;
  seg->idle = false;
  if (seg->idle_prev) seg->idle_prev->idle_next = seg->idle_next;
  else pool->idle_head = seg->idle_next;
  if (seg->idle_next) seg->idle_next->idle_prev = seg->idle_prev;
  else pool->idle_tail = seg->idle_prev;
  seg->idle_prev = seg->idle_next = NULL;
  pool->idle_bytes -= seg->size;
}

/* Take `gone` out of its segment's address list; a neighbour now covers its bytes. */
static inline void block_unlink(vram_pool_t *pool, vram_block *gone) {
  vram_block *prev = gone->addr_prev, *next = gone->addr_next;
  if (prev) prev->addr_next = next;
  else gone->segment->first = next;
  if (next) next->addr_prev = prev;
  block_delete(pool, gone);
}

/* Give block `b` (in use, not in the pointer map) back to its segment's free space. A free
 * neighbour grows over it in place and keeps its slot in the index unless its new size
 * maps to another bin: most merges then cost no index update at all. */
VRAM_HOT void block_make_free(vram_pool_t *pool, vram_block *b) {
  vram_segment *seg = b->segment;
  vram_tlsf *index = seg->index;
  seg->used_bytes -= b->size;
  if (!seg->used_bytes) idle_push(pool, seg);
  if (seg->gran_used) _vram_granules_release(pool, seg, b->addr, b->size);
  vram_block *prev = b->addr_prev, *next = b->addr_next;
  bool next_free = next && next->state == VRAM_BLOCK_FREE;
  if (prev && prev->state == VRAM_BLOCK_FREE) {
    size_t size = prev->size + b->size;
    block_unlink(pool, b);
    if (next_free) {
      size += next->size;
      _vram_tlsf_remove(index, next);
      block_unlink(pool, next);
    }
    _vram_tlsf_resize(index, prev, size);
  } else if (next_free) {
    size_t size = next->size + b->size;
    next->addr = b->addr;
    block_unlink(pool, b);
    _vram_tlsf_resize(index, next, size);
  } else {
    b->state = VRAM_BLOCK_FREE;
    _vram_tlsf_insert(index, b);
  }
}

/* Carve a live block of exactly `rounded` bytes from the front of the free block `b`. The
 * free rest keeps b's struct and, unless its size now maps to another bin, its slot in the
 * index. Every fallible step comes first, so a failure changes nothing. */
VRAM_HOT int block_take(vram_pool_t *pool, vram_block *b, size_t rounded, size_t requested,
                      vram_block **out) {
  vram_segment *seg = b->segment;
  vram_block *live = b;
  if (b->size > rounded) {
    live = block_new(pool);
    if (!live) return VRAM_EHOSTMEM;
  }
  int rc = _vram_ptrmap_insert(&pool->ptrs, b->addr, live);
  if (rc == VRAM_OK && seg->gran_used) {
    rc = _vram_granules_acquire(pool, seg, b->addr, rounded);
    if (rc) _vram_ptrmap_remove(&pool->ptrs, b->addr);
  }
  if (rc) {
    if (live != b) block_delete(pool, live);
    return rc;
  }
  vram_tlsf *index = seg->index;
  if (live == b) {
    _vram_tlsf_remove(index, b); /* clears the links, so requested and uses start at 0 */
  } else {
    live->addr = b->addr;
    live->size = rounded;
    live->segment = seg;
    live->addr_prev = b->addr_prev;
    live->addr_next = b;
    if (live->addr_prev) live->addr_prev->addr_next = live;
    else seg->first = live;
    b->addr_prev = live;
    b->addr += rounded;
    _vram_tlsf_resize(index, b, b->size - rounded);
  }
  live->state = VRAM_BLOCK_LIVE;
  live->requested = requested;
  if (!seg->used_bytes) idle_remove(pool, seg);
  seg->used_bytes += rounded;
  *out = live;
  return VRAM_OK;
}

/* A cached block stays in the pointer map, so that freeing and taking it back cost no
 * hash insert or delete; it leaves the map when it is really freed. */
VRAM_HOT void block_uncache(vram_pool_t *pool, vram_block *b) {
  _vram_ptrmap_remove(&pool->ptrs, b->addr);
  block_make_free(pool, b);
}

/* A freed block goes to its arena's cache; the block it displaces is coalesced now. */
VRAM_HOT void block_retire(vram_pool_t *pool, vram_block *b) {
  /* The block is merged with its neighbours when it leaves the cache, often on the very
   * next call; in a pool far larger than the CPU cache their structs are misses, so start
   * loading them now, alongside the segment's. */
  __builtin_prefetch(b->addr_prev);
  __builtin_prefetch(b->addr_next);
  b->state = VRAM_BLOCK_CACHED;
  b->requested = 0;
  /* With a release threshold the user asked for memory back at free: no parking. */
  if (pool->opts.release_threshold != SIZE_MAX) {
    block_uncache(pool, b);
    return;
  }
  vram_block **slot = b->segment->cached;
  vram_block *old = *slot;
  *slot = b;
  if (old) block_uncache(pool, old);
}

static void cache_flush(vram_pool_t *pool, vram_arena *a) {
  vram_block *small = a->cached_small, *large = a->cached_large;
  a->cached_small = a->cached_large = NULL;
  if (small) block_uncache(pool, small);
  if (large) block_uncache(pool, large);
}

static void cache_flush_all(vram_pool_t *pool) {
  for (vram_arena *a = pool->arenas; a; a = a->next) cache_flush(pool, a);
}

/* ---------------------------------------------------------------------------------------
 * Segments: growth from the source and release back to it.
 * ------------------------------------------------------------------------------------- */

/* Fixed sources: the bytes of a new segment that must hold `rounded`. Small requests share
 * 2 MiB segments; a large one gets a segment of its own size rounded to the source's
 * granularity, so that no segment is bigger than the request that made it and the only
 * waste is the granularity tail, which later requests can use. */
static size_t fixed_segment_size(const vram_pool_t *pool, size_t rounded, bool small) {
  if (small) return VRAM_SMALL_SEGMENT;
  return round_up(rounded, pool->granularity);
}

static void segment_link(vram_arena *a, vram_segment *seg) {
  seg->arena = a;
  seg->index = free_index(a, seg->is_small);
  seg->cached = cache_slot(a, seg->is_small);
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
  if (pool->src->is_vmm) {
    if (seg->mapped_granules) return VRAM_EBUSY; /* unmap first (granules.c) */
    rc = pool->src->xUnreserve(pool->src_state, seg->addr, seg->size);
  } else {
    rc = pool->src->xFree(pool->src_state, seg->addr, seg->size);
  }
  if (rc) return rc;
  if (!pool->src->is_vmm) vram_stat_down(&pool->stats.reserved_bytes, (int64_t)(seg->size));
  pool->stats.num_device_free++;
  vram_stat_down(&pool->stats.segment, 1);
  _vram_tlsf_remove(seg->index, seg->first);
  block_delete(pool, seg->first);
  idle_remove(pool, seg);
  segment_unlink(seg);
  _vram_granules_destroy(seg);
  _vram_host_free(seg, sizeof *seg);
  return VRAM_OK;
}

/* Keep the first failure of a release that goes on past failures. */
static inline void note_error(int *first_error, int rc) {
  if (rc && first_error && !*first_error) *first_error = rc;
}

/* Release fully free segments (and, for virtual memory, idle granules) until at least
 * `want` bytes went back or nothing is left; SIZE_MAX releases everything cached. */
static size_t release_cached(vram_pool_t *pool, size_t want, int *first_error) {
  size_t released = 0;
  cache_flush_all(pool);
  if (pool->src->is_vmm) {
    size_t granules = want == SIZE_MAX ? SIZE_MAX : (want + pool->granularity - 1) / pool->granularity;
    released = _vram_granules_trim(pool, granules, first_error) * pool->granularity;
    if (want != SIZE_MAX) return released;
    /* Everything: empty virtual ranges go back too. */
    for (vram_arena *a = pool->arenas; a; a = a->next) {
      vram_segment *next;
      for (vram_segment *s = a->segments; s; s = next) {
        next = s->next;
        if (s->used_bytes || s->mapped_granules || s->keep) continue;
        note_error(first_error, segment_release(pool, s));
      }
    }
    return released;
  }
  /* Fixed sources: the idle list, longest unused first; each arena's stream is waited
   * for once per release. */
  pool->release_epoch++;
  vram_segment *prev;
  for (vram_segment *s = pool->idle_tail; s && released < want; s = prev) {
    prev = s->idle_prev;
    vram_arena *a = s->arena;
    if (a->quiesced_at != pool->release_epoch) {
      int rc = _vram_arena_quiesce(pool, a);
      if (rc) {
        note_error(first_error, rc);
        continue;
      }
      a->quiesced_at = pool->release_epoch;
    }
    size_t size = s->size;
    int rc = segment_release(pool, s);
    if (rc) {
      note_error(first_error, rc);
      continue;
    }
    released += size;
  }
  return released;
}

static size_t vmm_reserve_size(const vram_pool_t *pool, size_t rounded) {
  size_t size = pool->vmm_reserve_size;
  if (size < 2 * rounded) size = round_up(2 * rounded, pool->granularity);
  return size;
}

/* Add a segment able to hold `rounded` bytes to the arena. ENOMEM when the limit or the
 * device says no; other codes are source failures. */
static int segment_grow(vram_pool_t *pool, vram_arena *a, size_t rounded, bool small,
                        vram_block **out_free) {
  bool vmm = pool->src->is_vmm;
  size_t size = vmm ? vmm_reserve_size(pool, rounded) : fixed_segment_size(pool, rounded, small);
  if (!vmm && pool->limit && (size_t)pool->stats.reserved_bytes.current + size > pool->limit)
    return VRAM_ENOMEM;
  /* Do not raise the high-water mark while cached segments that cannot serve this request
   * could go back instead: it keeps peak reserved near peak live at the cost of driver
   * calls that happen only when the footprint would otherwise grow. */
  if (!vmm && (size_t)pool->stats.reserved_bytes.current + size > (size_t)pool->stats.reserved_bytes.peak)
    release_cached(pool, (size_t)pool->stats.reserved_bytes.current + size -
                             (size_t)pool->stats.reserved_bytes.peak, NULL);
  vram_segment *seg = _vram_host_zalloc(sizeof *seg); /* on a line of its own: internal.h */
  vram_block *b = block_new(pool);
  if (!seg || !b) {
    _vram_host_free(seg, sizeof *seg);
    if (b) block_delete(pool, b);
    return VRAM_EHOSTMEM;
  }
  uintptr_t addr = 0;
  int rc = vmm ? pool->src->xReserve(pool->src_state, size, &addr)
               : pool->src->xAlloc(pool->src_state, size, &addr);
  if (rc) {
    _vram_host_free(seg, sizeof *seg);
    block_delete(pool, b);
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
      block_delete(pool, b);
      return rc;
    }
  }
  segment_link(a, seg);
  b->addr = addr;
  b->size = size;
  b->segment = seg;
  b->state = VRAM_BLOCK_FREE;
  seg->first = b;
  _vram_tlsf_insert(seg->index, b);
  idle_push(pool, seg);
  if (!vmm) vram_stat_up(&pool->stats.reserved_bytes, (int64_t)size);
  vram_stat_up(&pool->stats.segment, 1);
  pool->stats.num_device_alloc += vmm ? 0 : 1;
  *out_free = b;
  return VRAM_OK;
}

/* Preallocate mode (TensorFlow's default): hold `bytes` from the start in the default
 * stream's arena and serve every size from it, so a program that fits never calls the
 * driver again. The memory stays held through empty_cache. */
int _vram_pool_preallocate(vram_pool_t *pool, size_t bytes) {
  vram_arena *a = arena_get(pool, NULL);
  if (!a) return VRAM_EHOSTMEM;
  pool->unified_index = true;
  size_t rounded = round_up(bytes, pool->granularity);
  vram_block *b = NULL;
  if (pool->src->is_vmm) {
    /* Reserve a range holding the preallocation and map it now. */
    int rc = segment_grow(pool, a, rounded, false, &b);
    if (rc) return rc;
    rc = _vram_granules_acquire(pool, b->segment, b->addr, rounded);
    if (rc) return rc;
    _vram_granules_release(pool, b->segment, b->addr, rounded);
    pool->keep_mapped = rounded / pool->granularity;
    return VRAM_OK;
  }
  int rc = segment_grow(pool, a, rounded, false, &b);
  if (rc) return rc;
  idle_remove(pool, b->segment);
  b->segment->keep = true;
  return VRAM_OK;
}

/* While blocks wait on events, active memory exceeds allocated memory, and only then can a
 * malloc take active memory past the allocated peak: note the derived peaks there. */
static void active_peaks_note(vram_pool_t *pool) {
  int64_t bytes = pool->stats.allocated_bytes.current + (int64_t)pool->pending_bytes;
  int64_t blocks = pool->stats.allocation.current + (int64_t)pool->pending_blocks;
  if (bytes > pool->active_bytes_peak) pool->active_bytes_peak = bytes;
  if (blocks > pool->active_peak) pool->active_peak = blocks;
}

/* ---------------------------------------------------------------------------------------
 * Cross-stream frees waiting for events.
 * ------------------------------------------------------------------------------------- */

static void pending_finish_block(vram_pool_t *pool, vram_block *b) {
  _vram_ptrmap_remove(&pool->ptrs, b->addr);
  pool->pending_bytes -= b->size;
  pool->pending_blocks--;
  free(b->uses);
  b->uses = NULL;
  block_make_free(pool, b);
}

/* Retire pending frees whose events completed; with `wait`, wait for all of them. */
static void drain_pending(vram_pool_t *pool, bool wait) {
  vram_pending **link = &pool->pending_head;
  vram_pending *last = NULL;
  while (*link) {
    vram_pending *p = *link;
    int done = wait ? (pool->src->xEventSynchronize(pool->src_state, p->event) == VRAM_OK)
                    : (pool->src->xEventQuery(pool->src_state, p->event) == 1);
    if (wait && done) pool->stats.num_sync_waits++;
    if (!done) {
      last = p;
      link = &p->next;
      continue;
    }
    *link = p->next;
    pool->pending_count--;
    event_give(pool, p->event);
    vram_block *b = p->block;
    free(p);
    if (--b->events_left == 0) pending_finish_block(pool, b);
  }
  pool->pending_tail = last;
}

/* ---------------------------------------------------------------------------------------
 * Allocation.
 * ------------------------------------------------------------------------------------- */

/* Tight placement (vram_options_t.tight_threshold). Carving a request from a fully free
 * cached segment bigger than the one it would get of its own pins the whole segment for the
 * request's lifetime; with lifetimes that do not nest, such pinned remainders are most of the
 * waste of fixed segments (bench/RESULTS.md: the random workload at 1.227, 1.087 without
 * it). Past the threshold the request gets its own segment instead, at the price of driver
 * calls whenever the cached sizes do not match: a pair for each such request once the pool
 * is at its peak, which is why the default never does it. */
static bool wants_own_segment(const vram_pool_t *pool, const vram_block *b, size_t rounded,
                              bool small) {
  const vram_segment *seg = b->segment;
  if (small || seg->used_bytes || seg->keep || pool->src->is_vmm) return false;
  size_t own = fixed_segment_size(pool, rounded, false);
  if (seg->size <= own) return false;
  size_t cap = pool->limit ? pool->limit : pool->device_total;
  return (double)((size_t)pool->stats.reserved_bytes.current + own) >
         pool->opts.tight_threshold * (double)cap;
}

/* One attempt: reuse a cached block, else grow. */
VRAM_HOT int alloc_attempt(vram_pool_t *pool, vram_arena *a, size_t rounded, size_t requested,
                         vram_block **out) {
  bool small = rounded <= VRAM_SMALL_MAX && !pool->unified_index;
  vram_block **slot = cache_slot(a, small);
  vram_block *b = *slot;
  if (b) {
    /* While cross-stream frees wait, every request takes the path below, which looks at
     * them now and then. */
    if (b->size == rounded && !pool->pending_count) {
      *slot = NULL;
      b->state = VRAM_BLOCK_LIVE;
      b->requested = requested;
      *out = b;
      return VRAM_OK;
    }
    *slot = NULL;
    block_uncache(pool, b);
  }
  vram_tlsf *index = free_index(a, small);
  b = _vram_tlsf_find(index, rounded);
  /* Retire completed cross-stream frees when the index has nothing that fits, when the
   * fit would map new memory (virtual segments always have room), and now and then
   * otherwise, so that a waiting block is not forgotten while other blocks keep fitting. */
  if (pool->pending_count &&
      (!b || (++pool->pending_tick & 63) == 0 ||
       (b->segment->gran_used && _vram_granules_unmapped_in(pool, b->segment, b->addr, rounded)))) {
    drain_pending(pool, false);
    b = _vram_tlsf_find(index, rounded);
  }
  /* The threshold first: off by default, it keeps the common path to one predictable test. */
  if (pool->opts.tight_threshold < 1.0 && b && wants_own_segment(pool, b, rounded, small)) {
    vram_block *own = NULL;
    /* If no segment can be had (limit, device full, a failing driver call), carving is the
     * way left; the grow may have given b's segment back on its way, so look again. */
    if (segment_grow(pool, a, rounded, small, &own) == VRAM_OK) b = own;
    else b = _vram_tlsf_find(index, rounded);
  }
  if (!b) {
    int rc = segment_grow(pool, a, rounded, small, &b);
    if (rc) return rc;
  }
  return block_take(pool, b, rounded, requested, out);
}

static int alloc_locked(vram_pool_t *pool, size_t rounded, size_t requested, vram_stream_t stream,
                        vram_block **out) {
  vram_arena *a = arena_get(pool, stream);
  if (!a) return VRAM_EHOSTMEM;
  int rc = alloc_attempt(pool, a, rounded, requested, out);
  if (rc == VRAM_ENOMEM) {
    /* The ladder: wait for every pending free, give back all cached memory, retry. */
    pool->stats.num_alloc_retries++;
    drain_pending(pool, true);
    release_cached(pool, SIZE_MAX, NULL);
    rc = alloc_attempt(pool, a, rounded, requested, out);
  }
  if (rc == VRAM_OK) {
    vram_block *b = *out;
    vram_stat_up(&pool->stats.allocated_bytes, (int64_t)b->size);
    vram_stat_up(&pool->stats.requested_bytes, (int64_t)requested);
    vram_stat_up(&pool->stats.allocation, 1);
    if (pool->pending_blocks) active_peaks_note(pool);
  } else if (rc == VRAM_ENOMEM) {
    pool->stats.num_ooms++;
    _vram_format_oom_report(pool, requested, stream, pool->oom_report, sizeof pool->oom_report);
  }
  return rc;
}

/* Kept out of line: the message buffer and the formatting stay off the hot path. */
static __attribute__((noinline, cold)) int malloc_failed(vram_pool_t *pool, error_hook hook,
                                                         size_t size, int rc) {
  if (!hook.fn) return rc;
  char msg[2048];
  if (rc == VRAM_ENOMEM) vram_oom_report(pool, msg, sizeof msg);
  else snprintf(msg, sizeof msg, "vram_malloc(%zu): %s", size, vram_strerror(rc));
  report_error(pool, hook, rc, msg);
  return rc;
}

int vram_malloc(vram_pool_t *pool, size_t size, vram_stream_t stream, void **out) {
  if (!pool || !out) return VRAM_EINVAL;
  *out = NULL;
  if (size == 0) return VRAM_OK;
  vram_block *b = NULL;
  error_hook hook = {NULL, NULL};
  vram_lock_acquire(&pool->lock);
  int rc = size > VRAM_MAX_REQUEST ? VRAM_ETOOBIG
                                   : alloc_locked(pool, round_up(size, VRAM_ALIGN), size, stream, &b);
  if (rc) hook = error_hook_locked(pool);
  CHECK_POOL_LOCKED(pool);
  vram_lock_release(&pool->lock);
  if (rc) return malloc_failed(pool, hook, size, rc);
  *out = (void *)b->addr;
  return VRAM_OK;
}

/* ---------------------------------------------------------------------------------------
 * Free and record_stream.
 * ------------------------------------------------------------------------------------- */

/* Why a pointer that is not live is refused: a freed block of ours, or not ours at all. */
static int classify_unknown_pointer(const vram_pool_t *pool, uintptr_t addr) {
  for (vram_arena *a = pool->arenas; a; a = a->next)
    for (vram_segment *s = a->segments; s; s = s->next) {
      if (addr < s->addr || addr >= s->addr + s->size) continue;
      /* An aligned address in free memory of ours was handed out once and freed (maybe
       * since merged with a neighbour): a double free. Anything else is not a block. */
      for (vram_block *b = s->first; b; b = b->addr_next)
        if (b->addr <= addr && addr < b->addr + b->size)
          return (b->state == VRAM_BLOCK_FREE && addr % VRAM_ALIGN == 0) ? VRAM_EDOUBLEFREE
                                                                          : VRAM_EFOREIGN;
    }
  return VRAM_EFOREIGN;
}

/* Record one event per extra stream; the block waits for all of them. On failure nothing
 * changes and the block stays live. */
static int free_after_events(vram_pool_t *pool, vram_block *b) {
  int n = b->uses->count;
  vram_pending *entries[n];
  int rc = VRAM_OK, made = 0;
  for (; made < n; made++) {
    vram_pending *p = malloc(sizeof *p);
    void *event = NULL;
    if (!p) { rc = VRAM_EHOSTMEM; break; }
    rc = event_take(pool, &event);
    if (!rc) rc = pool->src->xEventRecord(pool->src_state, event, b->uses->streams[made]);
    if (rc) {
      if (event) event_give(pool, event);
      free(p);
      break;
    }
    p->block = b;
    p->event = event;
    p->next = NULL;
    entries[made] = p;
  }
  if (rc) {
    for (int i = 0; i < made; i++) {
      event_give(pool, entries[i]->event);
      free(entries[i]);
    }
    return rc;
  }
  for (int i = 0; i < n; i++) {
    if (pool->pending_tail) pool->pending_tail->next = entries[i];
    else pool->pending_head = entries[i];
    pool->pending_tail = entries[i];
  }
  pool->pending_count += (size_t)n;
  pool->pending_bytes += b->size;
  pool->pending_blocks++;
  b->state = VRAM_BLOCK_PENDING;
  b->events_left = (uint32_t)n;
  return VRAM_OK;
}

static int free_locked(vram_pool_t *pool, uintptr_t addr) {
  vram_block *b = _vram_ptrmap_get(&pool->ptrs, addr);
  if (!b) return classify_unknown_pointer(pool, addr);
  if (b->state != VRAM_BLOCK_LIVE) return VRAM_EDOUBLEFREE; /* pending or cached */
  size_t size = b->size, requested = b->requested;
  if (b->uses && b->uses->count) {
    int rc = free_after_events(pool, b);
    if (rc) return rc;
  } else {
    block_retire(pool, b);
  }
  vram_stat_down(&pool->stats.allocated_bytes, (int64_t)(size));
  vram_stat_down(&pool->stats.requested_bytes, (int64_t)(requested));
  vram_stat_down(&pool->stats.allocation, 1);
  /* Keep cached memory under the release threshold. */
  if (pool->opts.release_threshold != SIZE_MAX) {
    size_t cached = pool->src->is_vmm ? _vram_granules_idle_total(pool) * pool->granularity
                                      : pool->idle_bytes;
    if (cached > pool->opts.release_threshold)
      release_cached(pool, cached - pool->opts.release_threshold, NULL);
  }
  return VRAM_OK;
}

int vram_free(vram_pool_t *pool, void *ptr) {
  if (!pool) return VRAM_EINVAL;
  if (!ptr) return VRAM_OK;
  error_hook hook = {NULL, NULL};
  vram_lock_acquire(&pool->lock);
  int rc = free_locked(pool, (uintptr_t)ptr);
  if (rc) hook = error_hook_locked(pool);
  CHECK_POOL_LOCKED(pool);
  vram_lock_release(&pool->lock);
  if (rc && hook.fn) {
    char msg[128];
    snprintf(msg, sizeof msg, "vram_free(%p): %s", ptr, vram_strerror(rc));
    report_error(pool, hook, rc, msg);
  }
  return rc;
}

int vram_record_stream(vram_pool_t *pool, void *ptr, vram_stream_t stream) {
  if (!pool || !ptr) return VRAM_EINVAL;
  int rc = VRAM_OK;
  vram_lock_acquire(&pool->lock);
  vram_block *b = _vram_ptrmap_get(&pool->ptrs, (uintptr_t)ptr);
  if (!b) {
    rc = classify_unknown_pointer(pool, (uintptr_t)ptr);
  } else if (b->state != VRAM_BLOCK_LIVE) {
    rc = VRAM_EDOUBLEFREE;
  } else if (stream != b->segment->arena->stream) {
    vram_stream_uses *u = b->uses;
    bool known = false;
    for (int i = 0; u && i < u->count; i++) known |= u->streams[i] == stream;
    if (!known) {
      if (!u || u->count == u->capacity) {
        int cap = u ? u->capacity * 2 : 2;
        vram_stream_uses *grown = realloc(u, sizeof *u + (size_t)cap * sizeof(vram_stream_t));
        if (!grown) {
          rc = VRAM_EHOSTMEM;
        } else {
          if (!u) grown->count = 0;
          grown->capacity = cap;
          b->uses = u = grown;
        }
      }
      if (!rc) u->streams[u->count++] = stream;
    }
  }
  CHECK_POOL_LOCKED(pool);
  vram_lock_release(&pool->lock);
  return rc;
}

int vram_block_info(vram_pool_t *pool, void *ptr, size_t *requested, vram_stream_t *stream) {
  if (!pool || !ptr) return VRAM_EINVAL;
  int rc = VRAM_OK;
  vram_lock_acquire(&pool->lock);
  vram_block *b = _vram_ptrmap_get(&pool->ptrs, (uintptr_t)ptr);
  if (!b) rc = classify_unknown_pointer(pool, (uintptr_t)ptr);
  else if (b->state != VRAM_BLOCK_LIVE) rc = VRAM_EDOUBLEFREE;
  else {
    if (requested) *requested = b->requested;
    if (stream) *stream = b->segment->arena->stream;
  }
  CHECK_POOL_LOCKED(pool);
  vram_lock_release(&pool->lock);
  return rc;
}

int vram_for_each_block(vram_pool_t *pool, vram_block_fn fn, void *user) {
  if (!pool || !fn) return VRAM_EINVAL;
  vram_lock_acquire(&pool->lock);
  for (vram_arena *a = pool->arenas; a; a = a->next)
    for (vram_segment *s = a->segments; s; s = s->next)
      for (vram_block *b = s->first; b; b = b->addr_next)
        if (b->state == VRAM_BLOCK_LIVE) fn(user, (void *)b->addr, b->requested, b->size, a->stream);
  CHECK_POOL_LOCKED(pool);
  vram_lock_release(&pool->lock);
  return VRAM_OK;
}

/* ---------------------------------------------------------------------------------------
 * Cache, limit, statistics.
 * ------------------------------------------------------------------------------------- */

int vram_empty_cache(vram_pool_t *pool) {
  if (!pool) return VRAM_EINVAL;
  int first_error = VRAM_OK;
  vram_lock_acquire(&pool->lock);
  drain_pending(pool, true);
  release_cached(pool, SIZE_MAX, &first_error);
  CHECK_POOL_LOCKED(pool);
  vram_lock_release(&pool->lock);
  return first_error;
}

static int limit_from(const vram_pool_t *pool, size_t bytes, double fraction, size_t *out) {
  if (bytes) {
    *out = bytes;
    return VRAM_OK;
  }
  if (fraction < 0 || fraction > 1 || fraction != fraction) return VRAM_EINVAL;
  *out = fraction > 0 ? (size_t)(fraction * (double)pool->device_total) : 0;
  return VRAM_OK;
}

int vram_set_limit(vram_pool_t *pool, size_t bytes, double fraction) {
  if (!pool) return VRAM_EINVAL;
  size_t limit;
  int rc = limit_from(pool, bytes, fraction, &limit);
  if (rc) return rc;
  vram_lock_acquire(&pool->lock);
  pool->limit = limit;
  /* Above the new limit, cached memory goes back now rather than at the next miss. */
  if (limit && (size_t)pool->stats.reserved_bytes.current > limit)
    release_cached(pool, (size_t)pool->stats.reserved_bytes.current - limit, NULL);
  CHECK_POOL_LOCKED(pool);
  vram_lock_release(&pool->lock);
  return VRAM_OK;
}

int vram_prefetch(vram_pool_t *pool, void *ptr, size_t size, int to_device, vram_stream_t stream) {
  if (!pool || !ptr) return VRAM_EINVAL;
  if (!pool->src->xPrefetch) return VRAM_EUNSUPPORTED;
  vram_lock_acquire(&pool->lock);
  vram_block *b = _vram_ptrmap_get(&pool->ptrs, (uintptr_t)ptr);
  int rc = !b ? classify_unknown_pointer(pool, (uintptr_t)ptr)
              : b->state != VRAM_BLOCK_LIVE ? VRAM_EDOUBLEFREE
              : (size == 0 || size > b->size) ? VRAM_EINVAL
              : pool->src->xPrefetch(pool->src_state, b->addr, size, to_device, stream);
  CHECK_POOL_LOCKED(pool);
  vram_lock_release(&pool->lock);
  return rc;
}

int vram_enable_peer_access(vram_pool_t *pool, int peer_device) {
  if (!pool) return VRAM_EINVAL;
  if (!pool->src->xEnablePeer) return VRAM_EUNSUPPORTED;
  if (peer_device < 0) return VRAM_EDEVICE;
  vram_lock_acquire(&pool->lock);
  int rc = pool->src->xEnablePeer(pool->src_state, peer_device);
  CHECK_POOL_LOCKED(pool);
  vram_lock_release(&pool->lock);
  return rc;
}

int vram_pool_device(const vram_pool_t *pool) { return pool ? pool->opts.device : VRAM_EINVAL; }

vram_source_kind vram_pool_source(const vram_pool_t *pool) {
  return pool ? pool->opts.source : VRAM_SOURCE_AUTO;
}

/* The size a cached block will have once coalesced with its free neighbours. */
static size_t merged_size(const vram_block *b) {
  if (!b) return 0;
  size_t size = b->size;
  if (b->addr_prev && b->addr_prev->state == VRAM_BLOCK_FREE) size += b->addr_prev->size;
  if (b->addr_next && b->addr_next->state == VRAM_BLOCK_FREE) size += b->addr_next->size;
  return size;
}

size_t _vram_pool_largest_free(const vram_pool_t *pool) {
  size_t largest = 0;
  for (vram_arena *a = pool->arenas; a; a = a->next) {
    size_t s = _vram_tlsf_largest(&a->free_small), l = _vram_tlsf_largest(&a->free_large);
    if (s > largest) largest = s;
    if (l > largest) largest = l;
    size_t cs = merged_size(a->cached_small), cl = merged_size(a->cached_large);
    if (cs > largest) largest = cs;
    if (cl > largest) largest = cl;
  }
  /* Virtual segments: physical granules are interchangeable and a free range can always
   * be found in the reserved address space, so all cached memory serves one request. */
  if (pool->src->is_vmm) return _vram_pool_cached_free(pool);
  return largest;
}

size_t _vram_pool_cached_free(const vram_pool_t *pool) {
  if (pool->src->is_vmm)
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

int vram_get_stats(vram_pool_t *pool, vram_stats_t *out) {
  if (!pool || !out) return VRAM_EINVAL;
  vram_lock_acquire(&pool->lock);
  *out = pool->stats;
  _vram_fill_derived_stats(pool, out);
  CHECK_POOL_LOCKED(pool);
  vram_lock_release(&pool->lock);
  return VRAM_OK;
}

int vram_reset_peak_stats(vram_pool_t *pool) {
  if (!pool) return VRAM_EINVAL;
  vram_lock_acquire(&pool->lock);
#define VRAM_X_RESET(name, doc) pool->stats.name.peak = pool->stats.name.current;
  VRAM_STAT_LIST(VRAM_X_RESET)
#undef VRAM_X_RESET
  pool->active_bytes_peak = pool->active_peak = 0;
  active_peaks_note(pool);
  CHECK_POOL_LOCKED(pool);
  vram_lock_release(&pool->lock);
  return VRAM_OK;
}

int vram_mem_get_info(vram_pool_t *pool, size_t *free_bytes, size_t *total_bytes) {
  if (!pool || !free_bytes || !total_bytes) return VRAM_EINVAL;
  vram_lock_acquire(&pool->lock);
  int rc = pool->src->xMemInfo(pool->src_state, free_bytes, total_bytes);
  CHECK_POOL_LOCKED(pool);
  vram_lock_release(&pool->lock);
  return rc;
}

int vram_summary(vram_pool_t *pool, char *buf, size_t cap) {
  if (!pool || (!buf && cap)) return VRAM_EINVAL;
  vram_lock_acquire(&pool->lock);
  int n = _vram_format_summary(pool, buf, cap);
  CHECK_POOL_LOCKED(pool);
  vram_lock_release(&pool->lock);
  return n;
}

int vram_stats_json(vram_pool_t *pool, char *buf, size_t cap) {
  if (!pool || (!buf && cap)) return VRAM_EINVAL;
  vram_stats_t s;
  vram_get_stats(pool, &s);
  return _vram_format_stats_json(&s, buf, cap);
}

int vram_oom_report(vram_pool_t *pool, char *buf, size_t cap) {
  if (!pool || (!buf && cap)) return VRAM_EINVAL;
  vram_lock_acquire(&pool->lock);
  int n = snprintf(buf, cap, "%s", pool->oom_report);
  CHECK_POOL_LOCKED(pool);
  vram_lock_release(&pool->lock);
  return n;
}

int vram_set_error_callback(vram_pool_t *pool, vram_error_fn fn, void *user) {
  if (!pool) return VRAM_EINVAL;
  vram_lock_acquire(&pool->lock);
  pool->on_error = fn;
  pool->on_error_user = user;
  CHECK_POOL_LOCKED(pool);
  vram_lock_release(&pool->lock);
  return VRAM_OK;
}

/* ---------------------------------------------------------------------------------------
 * Create and destroy.
 * ------------------------------------------------------------------------------------- */

static void pool_free_everything(vram_pool_t *pool) {
  drain_pending(pool, true);
  vram_pending *p = pool->pending_head;
  while (p) { /* events that failed to synchronize: drop them */
    vram_pending *next = p->next;
    pool->src->xEventDestroy(pool->src_state, p->event);
    free(p);
    p = next;
  }
  for (vram_arena *a = pool->arenas, *an; a; a = an) {
    an = a->next;
    if (a->segments) _vram_arena_quiesce(pool, a);
    for (vram_segment *s = a->segments, *sn; s; s = sn) {
      sn = s->next;
      for (vram_block *b = s->first; b; b = b->addr_next)
        if (b->state != VRAM_BLOCK_FREE) free(b->uses); /* blocks still in use (force) */
      if (pool->src->is_vmm) {
        _vram_granules_unmap_all(pool, s);
        pool->src->xUnreserve(pool->src_state, s->addr, s->size);
      } else {
        pool->src->xFree(pool->src_state, s->addr, s->size);
      }
      _vram_granules_destroy(s);
      _vram_host_free(s, sizeof *s);
    }
    if (a->release_event) pool->src->xEventDestroy(pool->src_state, a->release_event);
    free(a);
  }
  for (size_t i = 0; i < pool->blocks.n_slabs; i++)
    _vram_host_free(pool->blocks.slabs[i], slab_blocks(i) * sizeof(vram_block));
  free(pool->blocks.slabs);
  for (size_t i = 0; i < pool->n_spare_events; i++)
    pool->src->xEventDestroy(pool->src_state, pool->spare_events[i]);
  free(pool->spare_events);
  _vram_ptrmap_destroy(&pool->ptrs);
  pool->src->xClose(pool->src_state);
  free(pool);
}

int vram_pool_create(vram_pool_t **out, const vram_options_t *opts) {
  if (!out) return VRAM_EINVAL;
  *out = NULL;
  vram_options_t o;
  if (opts) o = *opts;
  else vram_options_init(&o);
  if (o.device < 0) return VRAM_EDEVICE;
  if (!(o.tight_threshold >= 0 && o.tight_threshold <= 1)) return VRAM_EINVAL; /* NaN too */
  vram_source_kind kind;
  int rc = _vram_resolve_source(o.source, &kind);
  if (rc) return rc;
  o.source = kind;
  const vram_source_methods *methods = _vram_source_for(kind);
  if (!methods) return VRAM_EINVAL;

  vram_pool_t *pool = calloc(1, sizeof *pool);
  if (!pool) return VRAM_EHOSTMEM;
  _vram_lock_init(&pool->lock);
  pool->opts = o;
  vram_source_config cfg = {.device = o.device,
                            .sim_capacity = o.sim_capacity,
                            .sim_event_delay = o.sim_event_delay,
                            .managed_prefetch = o.managed_prefetch};
  void *state = NULL;
  rc = methods->xOpen(&cfg, &state);
  if (rc) {
    free(pool);
    return rc;
  }
  pool->src = methods;
  pool->src_state = state;
  if (o.fault_fail_at) {
    vram_fault_plan plan = {.fail_at = o.fault_fail_at, .fail_every = o.fault_fail_every};
    rc = _vram_fault_wrap(methods, state, &plan, &pool->src, &pool->src_state);
    if (rc) {
      methods->xClose(state);
      free(pool);
      return rc;
    }
  }
  pool->granularity = pool->src->xGranularity(pool->src_state);
  size_t free_bytes = 0;
  rc = pool->src->xMemInfo(pool->src_state, &free_bytes, &pool->device_total);
  if (!rc) rc = _vram_ptrmap_init(&pool->ptrs, PTRMAP_INITIAL_BLOCKS);
  if (!rc) rc = limit_from(pool, o.limit_bytes, o.limit_fraction, &pool->limit);
  pool->vmm_reserve_size = round_up(pool->device_total + pool->device_total / 4, pool->granularity);
  if (!rc) {
    size_t pre = 0;
    rc = limit_from(pool, o.preallocate_bytes, o.preallocate_fraction, &pre);
    if (!rc && pre) rc = _vram_pool_preallocate(pool, pre);
  }
  if (rc) {
    pool_free_everything(pool);
    return rc;
  }
  *out = pool;
  return VRAM_OK;
}

int vram_pool_destroy(vram_pool_t *pool) {
  if (!pool) return VRAM_EINVAL;
  vram_lock_acquire(&pool->lock);
  bool busy = pool->stats.allocation.current != 0;
  CHECK_POOL_LOCKED(pool);
  vram_lock_release(&pool->lock);
  if (busy) return VRAM_EBUSY;
  pool_free_everything(pool);
  return VRAM_OK;
}

int vram_pool_destroy_force(vram_pool_t *pool) {
  if (!pool) return VRAM_EINVAL;
  pool_free_everything(pool);
  return VRAM_OK;
}

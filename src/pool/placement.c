/* placement.c - the placement policy in one place, for each memory mode: where a miss
 * grows, which free block a request takes, what stays mapped and what makes room for a
 * mapping, when the peak guard gives back, what a release gives back, how a preallocation
 * is held. segment.c, granules.c and block.c carry the decisions out; pool.c asks and does
 * what it is told. What the hot path asks is inline in placement.h and reads fields only
 * (has_virtual, unified_index, kept_ceiling, the options): no call through the table.
 *
 * The questions, and who asks them:
 *
 *   what a miss grows by            the table's plan (a fixed segment or a virtual range);
 *                                   _vram_place_grow, from pool.c's alloc_attempt
 *   which free block a request      _vram_place_fit (placement.h): the index's fit, or on
 *     takes                         virtual memory a window already mapped where the fit
 *                                   would map past the allowance, or for a small request
 *                                   that would raise the peak, idle mapped granules of the
 *                                   large range; _vram_place_wants_own_segment: tight
 *                                   placement, a segment of its own instead of carving a
 *                                   fully free bigger one (vram_options_t.tight_threshold)
 *   which other stream's free       _vram_place_borrow: the tightest fit of the other
 *     block a request borrows       arenas' indexes, from pool.c's alloc_borrowed, where
 *                                   growing fails (at once in preallocate mode, else the
 *                                   ladder's last own step)
 *   what stays mapped               _vram_place_keeps_mapped: far from the cap (no limit,
 *                                   reserved within the virtual threshold's share of the
 *                                   device) mappings of up to VRAM_VMM_MAP_UNIT granules
 *                                   (_vram_place_map_unit), else one granule a mapping;
 *                                   either way held to the allowance (mapped_allowance)
 *   what makes room for a mapping   _vram_place_make_room, from granules.c: under a limit,
 *                                   idle granules elsewhere, then idle fixed segments;
 *                                   past the allowance, idle granules elsewhere
 *   the peak guard                  the table's guard_release, before a fixed segment would
 *                                   raise the high-water mark, with its ghosts (segment.c
 *                                   tells _vram_place_segment_released what went back)
 *   what a release gives back       the table's release (the OOM ladder, empty_cache, the
 *                                   limit, the release threshold: _vram_place_releasable)
 *   how a preallocation is held     the table's preallocate
 *
 * The modes, one table each (the table a pool uses changes as it goes, never back to a
 * mode it left):
 *
 *   fixed     fixed segments (cuda or sim with large_blocks fixed and no virtual
 *             threshold): a miss grows by a fixed segment; before growing past its peak
 *             the peak guard gives back idle segments; a release gives back idle segments,
 *             longest unused first.
 *   managed   the managed source: fixed segments as above; it cannot reserve a virtual
 *             range, so it never leaves this mode.
 *   growing   fixed segments whose source can map virtual ranges (cuda and sim by
 *             default): small requests grow by fixed segments; large ones by a virtual
 *             range from the first (large_blocks virtual) or once reserved memory would pass
 *             the virtual threshold's share of the cap. The first range moves the pool to
 *             mixed, and marks its arena as one whose large requests go to ranges
 *             (vram_arena.grows_virtual; segment.c retires its fixed large segments).
 *   mixed     a fixed source that holds virtual ranges: growth as in growing (an arena
 *             that has not turned virtual still grows fixed segments); the peak guard gives
 *             back idle segments alone while the pool keeps what it maps, else any cached
 *             memory; a release gives back idle segments first, then idle granules, then,
 *             for a full release, the ranges with nothing mapped.
 *   closed    mixed, after a reserve was refused as unsupported: no more ranges, fixed
 *             segments for every miss, the ranges it holds still released as in mixed.
 *   virtual   a virtual-memory source (vmm, sim:vmm): every miss grows by a virtual range
 *             (granules.c maps what blocks touch); releases as in mixed.
 *
 * The questions of which block a request takes and of what stays mapped have one answer
 * for every mode: they ask what the pool holds (a fit in a virtual range, has_virtual),
 * which a mode decides, and so need no slot of the table.
 *
 * Preallocate mode is no table of its own: once its memory is held, placement is that of
 * its source's mode; how it is held is each table's preallocate slot, and that every size
 * shares one index is vram_pool.unified_index. */
#include <string.h>

#include "pool/placement.h"

#include "pool/block.h"
#include "pool/granules.h"
#include "pool/oom.h"

/* ---------------------------------------------------------------------------------------
 * What a miss grows by.
 * ------------------------------------------------------------------------------------- */

static vram_growth fixed_segment(const vram_pool_t *pool, size_t rounded, bool small) {
  vram_growth g = {.virtual = false, .retire = false,
                   .size = _vram_fixed_segment_size(pool, rounded, small)};
  return g;
}

/* A virtual range of the pool's reserve size, or twice the request if that is more. The
 * arena's first range retires its fixed large segments (segment.c). */
static vram_growth virtual_range(const vram_pool_t *pool, const vram_arena *a, size_t rounded) {
  size_t size = pool->vmm_reserve_size;
  if (size < 2 * rounded) size = _vram_round_up(2 * rounded, pool->granularity);
  vram_growth g = {.virtual = true, .retire = !a->grows_virtual, .size = size};
  return g;
}

static vram_growth plan_fixed(const vram_pool_t *pool, const vram_arena *a, size_t rounded,
                              bool small) {
  (void)a;
  return fixed_segment(pool, rounded, small);
}

static vram_growth plan_virtual(const vram_pool_t *pool, const vram_arena *a, size_t rounded,
                                bool small) {
  (void)small;
  return virtual_range(pool, a, rounded);
}

/* Virtual growth (vram_options_t.virtual_threshold): a large request that would take
 * reserved memory past the threshold's share of the cap makes its arena grow virtual.
 * With large_blocks virtual, every large request does, from the first. */
static vram_growth plan_growing(const vram_pool_t *pool, const vram_arena *a, size_t rounded,
                                bool small) {
  if (small) return fixed_segment(pool, rounded, small);
  /* An arena that turned virtual stays so: its range is full, another one. */
  if (a->grows_virtual || pool->opts.large_blocks == VRAM_LARGE_VIRTUAL)
    return virtual_range(pool, a, rounded);
  size_t cap = pool->limit ? pool->limit : pool->device_total;
  size_t own = _vram_fixed_segment_size(pool, rounded, false);
  if ((double)((size_t)pool->stats.reserved_bytes.current + own) >
      pool->opts.virtual_threshold * (double)cap)
    return virtual_range(pool, a, rounded);
  return fixed_segment(pool, rounded, small);
}

/* ---------------------------------------------------------------------------------------
 * What a release gives back.
 * ------------------------------------------------------------------------------------- */

static size_t release_fixed(vram_pool_t *pool, size_t want, int *first_error) {
  _vram_cache_flush_all(pool);
  return pool->idle_bytes ? _vram_release_fixed_idle(pool, want, first_error) : 0;
}

/* Fixed segments first: a granule can back any request, a fixed segment only what fits in
 * it. */
static size_t release_ranges(vram_pool_t *pool, size_t want, int *first_error) {
  size_t released = release_fixed(pool, want, first_error);
  if (released >= want) return released;
  size_t left = want == SIZE_MAX ? SIZE_MAX : want - released;
  size_t granules = left == SIZE_MAX ? SIZE_MAX : (left + pool->granularity - 1) / pool->granularity;
  released += _vram_granules_trim(pool, granules, first_error) * pool->granularity;
  /* Everything: empty virtual ranges go back too. */
  if (want == SIZE_MAX) _vram_release_empty_ranges(pool, first_error);
  return released;
}

size_t _vram_place_releasable(const vram_pool_t *pool) {
  size_t cached = pool->idle_bytes;
  if (pool->place->holds_ranges) cached += _vram_granules_idle_total(pool) * pool->granularity;
  return cached;
}

/* ---------------------------------------------------------------------------------------
 * Virtual memory: what stays mapped, what makes room for a mapping.
 * ------------------------------------------------------------------------------------- */

/* The kept regime's slack floor (Note [The kept regime's allowance]): two whole mappings,
 * but in a pool smaller than that makes sensible a share of its allocated peak (and at
 * least a few granules), so that a pool of a gigabyte does not hold a quarter of itself
 * idle beside live blocks. A pool whose requests vary from pass to pass (inference at
 * changing sizes) would then take idle mappings back and map them again in every pass:
 * every VRAM_VMM_TRIMS_PER_DOUBLING times the allowance trims, the share doubles, up to
 * the two mappings, and such a pool settles after its first pass. Only trims of at least
 * a quarter of the slack count (_vram_place_make_room): a step that trims a few MiB while
 * it grows is not a pool whose requests change, and doubling on those left a checkpointed
 * UNet step holding a hole beside each request that did not fit. */
static size_t kept_slack(const vram_pool_t *pool) {
  size_t two_mappings = 2 * VRAM_VMM_MAP_UNIT * pool->granularity;
  unsigned doublings = pool->kept_trims / VRAM_VMM_TRIMS_PER_DOUBLING;
  size_t share = (size_t)pool->stats.allocated_bytes.peak >> VRAM_VMM_KEPT_SLACK_SHIFT;
  size_t least = VRAM_VMM_KEPT_SLACK_MIN_GRANULES * pool->granularity;
  if (share < least) share = least;
  while (doublings-- && share < two_mappings) share <<= 1;
  return share < two_mappings ? share : two_mappings;
}

/* Far from the cap a pool keeps what it maps (_vram_place_keeps_mapped): it maps in
 * mappings of up to VRAM_VMM_MAP_UNIT granules, as PyTorch's expandable segments do: a
 * physical handle costs about as much at 128 MiB as at 2 MiB (bench/vmm_cost.c), and a
 * loop's blocks then land on mapped memory after its first pass. Under a limit, or past
 * the threshold, it fits: one granule per mapping, so that idle granules move one by one.
 *
 * What the pool may hold mapped before new mappings first take idle granules back
 * (_vram_place_allowance_of): its high-water mark, or its allocated peak (this request
 * included) plus a slack. Without the slack a pool that reached its peak would unmap and
 * map again on almost every request that lands on unmapped space; with it a training
 * loop's steady state makes few or none (Note [The mapped allowance's slack] in
 * docs/performance.md). Far from the cap the allowance holds too: a request larger than
 * every free hole would otherwise map at the range's end while the holes' idle mappings
 * stayed, and the range would hold the bf16 logits' hole beside the fp32 copy that did
 * not fit it (Note [The kept regime's allowance]). There, only whole mappings of up to
 * VRAM_VMM_MAP_UNIT granules can go back, and a run of free space may end at each side in
 * one that a live block shares: the slack is at least two of them, or the pool would
 * unmap and map again around those (in a small pool, a share of its peak: kept_slack). */
static size_t mapped_allowance(const vram_pool_t *pool, size_t request) {
  bool kept = _vram_place_keeps_mapped(pool, request);
  size_t min_slack = kept ? kept_slack(pool) : 0;
  size_t allowance =
      _vram_place_allowance_of((size_t)pool->stats.allocated_bytes.current + request,
                               (size_t)pool->stats.allocated_bytes.peak,
                               (size_t)pool->stats.reserved_bytes.peak, min_slack);
  return kept && pool->map_ceiling > allowance ? pool->map_ceiling : allowance;
}

/* A loop whose blocks land elsewhere each step would unmap every step what the next one
 * maps again, if the allowance held it to its first peak: so the pool remembers the spans
 * it unmapped to make room (ghosts, as the peak guard remembers the segments it gave
 * back), and a mapping that takes one of them again shows that unmapping it was a
 * mistake: the allowance rises to what this mapping needs, and the loop keeps both. */
void _vram_place_map_ghost(vram_pool_t *pool, uintptr_t lo, uintptr_t hi) {
  pool->map_ghosts[pool->map_ghost_next].lo = lo;
  pool->map_ghosts[pool->map_ghost_next].hi = hi;
  pool->map_ghost_next = (pool->map_ghost_next + 1) % VRAM_MAP_GHOSTS;
}

void _vram_place_forget_map_ghosts(vram_pool_t *pool) {
  memset(pool->map_ghosts, 0, sizeof pool->map_ghosts);
  pool->map_ghost_next = 0;
  pool->map_ceiling = 0;
  pool->kept_trims = 0;
}

static inline bool ghost_overlaps(const vram_pool_t *pool, unsigned i, uintptr_t lo,
                                  uintptr_t hi) {
  return pool->map_ghosts[i].lo < hi && lo < pool->map_ghosts[i].hi;
}

/* Forgets the ghosts that overlap [lo, hi); whether there was one. */
static bool forget_overlapping(vram_pool_t *pool, uintptr_t lo, uintptr_t hi) {
  bool found = false;
  for (unsigned i = 0; i < VRAM_MAP_GHOSTS; i++)
    if (ghost_overlaps(pool, i, lo, hi)) {
      pool->map_ghosts[i].lo = pool->map_ghosts[i].hi = 0;
      found = true;
    }
  return found;
}

/* Whether [lo, hi) overlaps a span the allowance unmapped lately (a map ghost). */
bool _vram_place_retakes_ghost(const vram_pool_t *pool, uintptr_t lo, uintptr_t hi) {
  for (unsigned i = 0; i < VRAM_MAP_GHOSTS; i++)
    if (ghost_overlaps(pool, i, lo, hi)) return true;
  return false;
}

void _vram_place_forget_map_ghosts_in(vram_pool_t *pool, uintptr_t lo, uintptr_t hi) {
  forget_overlapping(pool, lo, hi);
}

bool _vram_place_over_allowance(vram_pool_t *pool, vram_segment *seg, uintptr_t addr,
                                size_t size) {
  size_t need = _vram_granules_unmapped_in(pool, seg, addr, size);
  if (!need) return false;
  size_t after = (size_t)pool->stats.reserved_bytes.current + need * pool->granularity;
  return after > mapped_allowance(pool, size) || (pool->limit && after > pool->limit);
}

/* Under a limit, idle granules elsewhere give their memory first, then idle fixed segments
 * (a mixed pool); past the allowance, where mapping would raise the high-water mark, idle
 * granules elsewhere go back, but the mapping goes ahead if they fall short. */
int _vram_place_make_room(vram_pool_t *pool, vram_segment *seg, size_t g0, size_t g1,
                          size_t bytes, size_t size) {
  size_t G = pool->granularity;
  size_t reserved = (size_t)pool->stats.reserved_bytes.current;
  if (pool->limit && reserved + bytes > pool->limit) {
    _vram_granules_trim_outside(pool, (reserved + bytes - pool->limit + G - 1) / G, seg, g0, g1,
                                false);
    reserved = (size_t)pool->stats.reserved_bytes.current;
    if (reserved + bytes > pool->limit && pool->idle_bytes) {
      _vram_release_fixed_idle(pool, reserved + bytes - pool->limit, NULL);
      reserved = (size_t)pool->stats.reserved_bytes.current;
    }
    if (reserved + bytes > pool->limit) return VRAM_ENOMEM;
  }
  bool kept = _vram_place_keeps_mapped(pool, size);
  /* A mapping that takes back spans the allowance unmapped: those ghosts go. */
  if (kept && forget_overlapping(pool, seg->addr + g0 * G, seg->addr + g1 * G) &&
      reserved + bytes > pool->map_ceiling)
    pool->map_ceiling = reserved + bytes;
  size_t allowance = mapped_allowance(pool, size);
  if (reserved + bytes > allowance) {
    _vram_granules_trim_outside(pool, (reserved + bytes - allowance + G - 1) / G, seg, g0, g1,
                                kept);
    size_t trimmed = reserved - (size_t)pool->stats.reserved_bytes.current;
    if (kept && trimmed && 4 * trimmed >= kept_slack(pool)) pool->kept_trims++;
  }
  return VRAM_OK;
}

/* ---------------------------------------------------------------------------------------
 * Which free block a request takes (placement.h's _vram_place_fit asks these).
 * ------------------------------------------------------------------------------------- */

/* Virtual memory: where in free space a request lands decides whether the driver is
 * called. When the index's fit would map granules while idle mapped granules exist, look
 * through a bounded number of free blocks of the request's size and above for a window
 * whose granules are all mapped, and carve the request there: no map call now, and no
 * trim of idle granules elsewhere to stay within the allowance. A training loop whose
 * blocks land in other places each step then reuses the mapped memory it has instead of
 * unmapping and mapping granules every step.
 *
 * Far from the cap, a small request carved from the large range
 * (_vram_place_small_into_large, `beside_small`) takes, among those windows, one that
 * begins right after a small block in use: small blocks then sit together, and when they
 * go they leave one hole rather than pinning several holes that large requests want
 * (Note [Small blocks together in the large range] in docs/performance.md). Else it takes
 * the first window found, as a large request does. */
#define VRAM_MAPPED_SCAN_LIMIT 16

/* The free blocks a bounded scan looks at: the first VRAM_MAPPED_SCAN_LIMIT of the index,
 * from the bin of `rounded` bytes up (the first bin may hold smaller ones, which count and
 * which the caller skips). Returns how many went to out. */
static unsigned scan_free_blocks(const vram_tlsf *index, size_t rounded,
                                 vram_block *out[VRAM_MAPPED_SCAN_LIMIT]) {
  unsigned n = 0;
  int fl, sl;
  _vram_tlsf_mapping(rounded, &fl, &sl);
  /* The bins that hold blocks, lowest first, found by their bits: the scan runs on the hot
   * path of a pool that keeps idle mappings, where most of the index's bins are empty. */
  uint64_t first_levels = fl < 64 ? index->fl_bitmap & (~(uint64_t)0 << fl) : 0;
  while (first_levels && n < VRAM_MAPPED_SCAN_LIMIT) {
    int f = __builtin_ctzll(first_levels);
    first_levels &= first_levels - 1;
    uint32_t second_levels = index->sl_bitmap[f];
    if (f == fl) second_levels &= ~(uint32_t)0 << sl;
    while (second_levels && n < VRAM_MAPPED_SCAN_LIMIT) {
      int s = __builtin_ctz(second_levels);
      second_levels &= second_levels - 1;
      for (vram_block *c = index->heads[f][s]; c && n < VRAM_MAPPED_SCAN_LIMIT; c = c->free_next)
        out[n++] = c;
    }
  }
  return n;
}

static bool follows_small_block(const vram_block *c) {
  const vram_block *p = c->addr_prev;
  return p && p->state != VRAM_BLOCK_FREE && p->size <= VRAM_SMALL_MAX;
}

VRAM_NOINLINE vram_block *_vram_place_mapped_fit(vram_pool_t *pool, vram_tlsf *index,
                                                 size_t rounded, bool beside_small) {
  if (_vram_granules_idle_total(pool) * pool->granularity < rounded) return NULL;
  vram_block *found = NULL, *scanned[VRAM_MAPPED_SCAN_LIMIT];
  uintptr_t found_start = 0;
  unsigned n = scan_free_blocks(index, rounded, scanned);
  for (unsigned i = 0; i < n; i++) {
    vram_block *c = scanned[i];
    uintptr_t start;
    if (c->size < rounded ||
        !_vram_granules_mapped_window(pool, c->segment, c->addr, c->size, rounded, &start))
      continue;
    bool clusters = beside_small && start == c->addr && follows_small_block(c);
    if (!found || clusters) {
      found = c;
      found_start = start;
    }
    if (!beside_small || clusters) goto take;
  }
  if (!found) return NULL;
take:
  if (found_start != found->addr && _vram_block_split_front(pool, found, found_start) != VRAM_OK)
    return NULL;
  return found;
}

/* A request whose fit would map a ghost again raises the allowance for good
 * (_vram_place_map_ghost's note): the pool then keeps that span and the idle mappings it
 * had kept beside it. A request of at least two whole mappings may find a free block
 * elsewhere, the range's free end for one, where fewer new granules serve it and no ghost
 * is taken: a bounded scan (16 free blocks of its size and above) returns the one that
 * maps the fewest, or NULL if none maps fewer than the fit. Smaller requests are left to
 * the ghosts: there the scan moved blocks of an inference loop at random sizes into the
 * range's end and raised its peak (Note [Whole mappings past a ghost] in
 * docs/performance.md). */
vram_block *_vram_place_least_growth(vram_pool_t *pool, vram_tlsf *index, vram_block *fit,
                                     size_t rounded) {
  size_t best_need = _vram_granules_unmapped_in(pool, fit->segment, fit->addr, rounded);
  vram_block *best = NULL, *scanned[VRAM_MAPPED_SCAN_LIMIT];
  unsigned n = scan_free_blocks(index, rounded, scanned);
  for (unsigned i = 0; i < n; i++) {
    vram_block *c = scanned[i];
    if (c == fit || c->size < rounded || !c->segment->gran_mapped) continue;
    size_t need = _vram_granules_unmapped_in(pool, c->segment, c->addr, rounded);
    if (need >= best_need || _vram_place_retakes_ghost(pool, c->addr, c->addr + rounded))
      continue;
    best = c;
    best_need = need;
  }
  return best;
}

/* A small request that its own segments cannot serve without growing (a new 2 MiB small
 * segment, or on vmm new granules of the small range) past the high-water mark, while the
 * arena's large range may hold idle mapped granules (a pool keeps them far from its cap):
 * the request is carved from one of those instead, so the peak stays where the large
 * blocks put it. */
vram_block *_vram_place_small_into_large(vram_pool_t *pool, vram_arena *a, vram_block *b,
                                         size_t rounded) {
  vram_block **cached = _vram_arena_cache_slot(a, false); /* back in the index, to be seen */
  if (*cached) {
    _vram_block_uncache(pool, *cached);
    *cached = NULL;
  }
  vram_block *mapped = _vram_place_mapped_fit(pool, _vram_arena_index(a, false), rounded,
                                              _vram_place_keeps_mapped(pool, rounded));
  return mapped ? mapped : b;
}

/* ---------------------------------------------------------------------------------------
 * The peak guard.
 * ------------------------------------------------------------------------------------- */

/* What the guard gives back when only fixed segments can go: the smallest idle segment
 * that covers the shortfall by itself, one call and no more memory than needed, else idle
 * segments longest unused first. Longest unused first alone, as a release for the cap
 * does, can give back a large segment to make room for a small one, which the loop asks
 * for again at its next size: Note [The smallest segment that covers it] in
 * docs/performance.md.
 *
 * When even all idle segments fall short, every large one goes, but the small ones stay
 * if they are under a quarter of what is still short: the peak rises anyway, they would
 * lower it by little, and small blocks ask for them again. Where they are a good part of
 * the shortfall they go too, or a loop settles later: Note [Small segments when the guard
 * falls short] in docs/performance.md. */
static void guard_release_fixed(vram_pool_t *pool, size_t size, size_t want) {
  (void)size;
  _vram_cache_flush_all(pool);
  vram_segment *fit = NULL;
  size_t small_idle = 0;
  for (vram_segment *s = pool->idle_tail; s; s = s->idle_prev) {
    if (s->size >= want && (!fit || s->size < fit->size)) fit = s;
    if (s->is_small) small_idle += s->size;
  }
  if (fit) {
    pool->release_epoch++;
    if (_vram_segment_release_idle(pool, fit) == VRAM_OK) return;
  }
  size_t large_idle = pool->idle_bytes - small_idle;
  if (pool->idle_bytes >= want || small_idle >= (want - large_idle) / 4) {
    _vram_release_fixed_idle(pool, want, NULL);
    return;
  }
  pool->release_epoch++;
  vram_segment *prev;
  for (vram_segment *s = pool->idle_tail; s; s = prev) {
    prev = s->idle_prev;
    if (!s->is_small) _vram_segment_release_idle(pool, s);
  }
}

/* Far from the cap a pool keeps what it maps (granules.c): the guard gives back fixed
 * segments alone. Unmapping idle granules here, to make room for a small segment, made a
 * loop's next large block map them again a step later. */
static void guard_release_ranges(vram_pool_t *pool, size_t size, size_t want) {
  if (_vram_place_keeps_mapped(pool, size)) {
    _vram_cache_flush_all(pool);
    if (pool->idle_bytes) _vram_release_fixed_idle(pool, want, NULL);
  } else {
    release_ranges(pool, want, NULL);
  }
}

/* The peak guard, before a new fixed segment of `size`: do not raise the high-water mark
 * while cached segments that cannot serve the request could go back instead. It keeps
 * peak reserved near peak live when sizes drift (inference over varying lengths), at the
 * cost of driver calls made only when the footprint would otherwise grow.
 *
 * A loop whose segments do not all fit under that peak would pay those calls every step:
 * a segment given back is asked for again later in the step, and making room for it gives
 * back another that the next step asks for (Note [How many ghosts] in docs/performance.md
 * has a loop that did). So the guard remembers the sizes it gave back, as an
 * adaptive cache remembers what it evicted (ARC's ghost entries). A new segment of such a
 * size shows that giving it back was a mistake: the guard's ceiling rises to what this
 * segment needs, so the loop keeps both. A loop settles within a few steps; sizes that do
 * not come back leave the ceiling where it was. reset_peak_stats lowers it again. */
static void guard_peak(vram_pool_t *pool, size_t size) {
  size_t peak = (size_t)pool->stats.reserved_bytes.peak;
  size_t ceiling = pool->guard_ceiling > peak ? pool->guard_ceiling : peak;
  size_t after = (size_t)pool->stats.reserved_bytes.current + size;
  for (unsigned i = 0; i < VRAM_GUARD_GHOSTS; i++)
    if (pool->guard_ghosts[i] == size) {
      pool->guard_ghosts[i] = 0;
      if (after > ceiling) ceiling = pool->guard_ceiling = after;
      break;
    }
  if (after <= ceiling) return;
  pool->guard_releasing = true;
  pool->place->guard_release(pool, size, after - ceiling);
  pool->guard_releasing = false;
}

/* ---------------------------------------------------------------------------------------
 * Borrowing across streams.
 * ------------------------------------------------------------------------------------- */

/* The parked blocks of the other arenas are merged first, so that one of the request's
 * size, just freed on its own stream, is found too. The tightest fit leaves the owners'
 * larger blocks whole. */
vram_block *_vram_place_borrow(vram_pool_t *pool, const vram_arena *a, size_t rounded,
                               bool small) {
  _vram_cache_flush_all(pool);
  vram_block *best = NULL;
  for (vram_arena *o = pool->arenas; o; o = o->next) {
    if (o == a) continue;
    vram_block *b = _vram_tlsf_find(_vram_arena_index(o, small), rounded);
    if (b && (!best || b->size < best->size)) best = b;
  }
  return best;
}

/* ---------------------------------------------------------------------------------------
 * Preallocation.
 * ------------------------------------------------------------------------------------- */

static int grow_as(vram_pool_t *pool, vram_arena *a, vram_growth g, bool small,
                   vram_block **out_free);

/* One fixed segment held for good, whatever virtual growth would choose for its size. */
static int preallocate_fixed(vram_pool_t *pool, vram_arena *a, size_t rounded) {
  vram_block *b = NULL;
  int rc = grow_as(pool, a, fixed_segment(pool, rounded, false), false, &b);
  if (rc) return rc;
  _vram_idle_remove(pool, b->segment);
  b->segment->keep = true;
  return VRAM_OK;
}

/* A range holding the preallocation, mapped now and never trimmed below it. */
static int preallocate_range(vram_pool_t *pool, vram_arena *a, size_t rounded) {
  vram_block *b = NULL;
  int rc = grow_as(pool, a, virtual_range(pool, a, rounded), false, &b);
  if (rc) return rc;
  rc = _vram_granules_map(pool, b->segment, b->addr, rounded);
  if (rc) return rc;
  pool->keep_mapped = rounded / pool->granularity;
  return VRAM_OK;
}

/* ---------------------------------------------------------------------------------------
 * The tables, and the moves between them.
 * ------------------------------------------------------------------------------------- */

static const vram_placement place_fixed = {"fixed", false, false, plan_fixed,
                                           guard_release_fixed, release_fixed, preallocate_fixed};
static const vram_placement place_managed = {"managed", false, false, plan_fixed,
                                             guard_release_fixed, release_fixed,
                                             preallocate_fixed};
static const vram_placement place_growing = {"growing", true, false, plan_growing,
                                             guard_release_fixed, release_fixed,
                                             preallocate_fixed};
static const vram_placement place_mixed = {"mixed", true, true, plan_growing,
                                           guard_release_ranges, release_ranges,
                                           preallocate_fixed};
static const vram_placement place_closed = {"closed", false, true, plan_fixed,
                                            guard_release_ranges, release_ranges,
                                            preallocate_fixed};
static const vram_placement place_virtual = {"virtual", false, true, plan_virtual,
                                             guard_release_ranges, release_ranges,
                                             preallocate_range};

static void place_set(vram_pool_t *pool, const vram_placement *place) {
  pool->place = place;
  pool->has_virtual = place->holds_ranges;
}

/* The table of a fixed source from what it may still do and what it holds. */
static const vram_placement *fixed_mode(const vram_pool_t *pool, bool grows, bool holds) {
  if (holds) return grows ? &place_mixed : &place_closed;
  if (grows) return &place_growing;
  return pool->opts.source == VRAM_SOURCE_MANAGED ? &place_managed : &place_fixed;
}

void _vram_place_init(vram_pool_t *pool) {
  const vram_options_t *o = &pool->opts;
  pool->kept_ceiling = (size_t)(o->virtual_threshold * (double)pool->device_total);
  if (pool->src->is_vmm) {
    place_set(pool, &place_virtual);
    return;
  }
  /* Virtual growth needs both families from the source and one rounding unit for both. */
  bool grows = pool->src->xReserve && pool->src->xMap && !o->no_split &&
               (o->virtual_threshold < 1.0 || o->large_blocks == VRAM_LARGE_VIRTUAL);
  place_set(pool, fixed_mode(pool, grows, false));
}

/* Grow as told: the limit and the peak guard first for a fixed segment; the first range of
 * a fixed source moves the pool to a mode that holds ranges. */
static int grow_as(vram_pool_t *pool, vram_arena *a, vram_growth g, bool small,
                   vram_block **out_free) {
  if (!g.virtual) {
    if (pool->limit && (size_t)pool->stats.reserved_bytes.current + g.size > pool->limit)
      return VRAM_ENOMEM;
    guard_peak(pool, g.size);
  }
  int rc = _vram_segment_add(pool, a, g, small, out_free);
  /* The arena's large requests go to ranges from now on (plan_growing asks this). */
  if (rc == VRAM_OK && g.retire) a->grows_virtual = true;
  if (rc == VRAM_OK && g.virtual && !pool->place->holds_ranges)
    place_set(pool, fixed_mode(pool, pool->place->may_grow_virtual, true));
  return rc;
}

int _vram_place_grow(vram_pool_t *pool, vram_arena *a, size_t rounded, bool small,
                     vram_block **out_free) {
  /* A preallocated pool at its limit has nothing to grow by: it answers at once, so that the
   * request borrows from the preallocation without reserving a range it cannot map. */
  if (pool->preallocated && pool->limit &&
      (size_t)pool->stats.reserved_bytes.current + rounded > pool->limit)
    return VRAM_ENOMEM;
  vram_growth g = pool->place->plan(pool, a, rounded, small);
  int rc = grow_as(pool, a, g, small, out_free);
  if (rc == VRAM_EUNSUPPORTED && g.virtual && pool->place->may_grow_virtual) {
    /* A device or driver without virtual memory: fixed segments from now on. */
    place_set(pool, fixed_mode(pool, false, pool->place->holds_ranges));
    rc = grow_as(pool, a, pool->place->plan(pool, a, rounded, small), small, out_free);
  }
  return rc;
}

/* Preallocate mode (TensorFlow's default): hold `bytes` from the start in the default
 * stream's arena and serve every size from it (other streams borrow), so a program that
 * fits never calls the driver again. The memory stays held through empty_cache. The size
 * is rounded to the granule: up, unless that passes the limit or the device's capacity
 * that `bytes` is within, where it is rounded down, so that a preallocation of 90% under a
 * limit of 90% holds what the limit allows rather than failing by a part of a granule. */
static int preallocate(vram_pool_t *pool, size_t bytes) {
  vram_arena *a = _vram_arena_get(pool, NULL);
  if (!a) return VRAM_EHOSTMEM;
  pool->unified_index = true;
  size_t rounded = _vram_round_up(bytes, pool->granularity);
  size_t bound = pool->limit && pool->limit < pool->device_total ? pool->limit
                                                                 : pool->device_total;
  if (rounded > bound && bytes <= bound && bound >= pool->granularity)
    rounded = bound & ~(pool->granularity - 1);
  int rc = pool->place->preallocate(pool, a, rounded);
  if (!rc) pool->preallocated = rounded;
  return rc;
}

int _vram_pool_preallocate(vram_pool_t *pool, size_t bytes) {
  /* Past what the device could ever hold: refused before rounding, which could overflow. */
  int rc = bytes > pool->max_request ? VRAM_ENOMEM : preallocate(pool, bytes);
  if (rc == VRAM_ENOMEM) _vram_note_preallocate_oom(pool, bytes);
  return rc;
}

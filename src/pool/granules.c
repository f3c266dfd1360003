/* granules.c - physical backing of virtual-memory segments (vmm and sim:vmm sources).
 *
 * A virtual segment is a large reserved address range; blocks are carved from it as from
 * any segment, but only the granules (2 MiB on current GPUs) that live blocks touch are
 * mapped to physical memory. Per granule this file keeps the bytes of the live, pending
 * and parked blocks on it, a mapped bit and an idle bit (mapped but unused: cached memory).
 *
 * (Blocks parked in their arena's one-block cache count as used until they are merged.)
 *
 * Physical granules are interchangeable, which is what makes this layout tight: when a
 * request needs new granules and the pool would otherwise pass its limit or its
 * allowance (its high-water mark, or its allocated peak plus 1/64), idle granules anywhere
 * are unmapped first and their memory mapped where it is needed. So the pool's footprint
 * follows the granules that live blocks touch, not the history of holes. Mapping is slow
 * (tens of microseconds per granule, bench/vmm_cost.c), so runs of granules are mapped with
 * one call, and idle granules stay mapped until memory is actually needed. */
#include <stdlib.h>
#include <string.h>

#include "pool/events.h"
#include "pool/granules.h"
#include "pool/segment.h"

#define BITS 64

static inline bool bit_get(const uint64_t *bits, size_t i) { return (bits[i / BITS] >> (i % BITS)) & 1; }
static inline void bit_set(uint64_t *bits, size_t i) { bits[i / BITS] |= (uint64_t)1 << (i % BITS); }
static inline void bit_clear(uint64_t *bits, size_t i) { bits[i / BITS] &= ~((uint64_t)1 << (i % BITS)); }

/* The granules [*g0, *g1) that [addr, addr+size) of a segment touches. */
static inline void granule_span(const vram_segment *seg, size_t G, uintptr_t addr, size_t size,
                                size_t *g0, size_t *g1) {
  *g0 = (addr - seg->addr) / G;
  *g1 = (addr + size - 1 - seg->addr) / G + 1;
}

/* Bytes of [addr, addr+size) that lie on granule g. */
static inline uint32_t granule_overlap(const vram_segment *seg, size_t G, size_t g, uintptr_t addr,
                                       size_t size) {
  uintptr_t lo = seg->addr + g * G, hi = lo + G;
  uintptr_t a = addr > lo ? addr : lo, b = addr + size < hi ? addr + size : hi;
  return (uint32_t)(b - a);
}

int _vram_granules_init(vram_pool_t *pool, vram_segment *seg) {
  size_t n = seg->size / pool->granularity;
  size_t words = (n + BITS - 1) / BITS;
  seg->gran_used = calloc(n, sizeof *seg->gran_used);
  seg->gran_mapped = calloc(words, sizeof *seg->gran_mapped);
  seg->gran_idle = calloc(words, sizeof *seg->gran_idle);
  if (!seg->gran_used || !seg->gran_mapped || !seg->gran_idle) {
    _vram_granules_destroy(seg);
    return VRAM_EHOSTMEM;
  }
  seg->n_granules = n;
  return VRAM_OK;
}

void _vram_granules_destroy(vram_segment *seg) {
  free(seg->gran_used);
  free(seg->gran_mapped);
  free(seg->gran_idle);
  seg->gran_used = NULL;
  seg->gran_mapped = seg->gran_idle = NULL;
}

/* Mark granules [g0, g1) mapped (and idle: nothing uses them yet). */
static void mark_mapped(vram_pool_t *pool, vram_segment *seg, size_t g0, size_t g1) {
  for (size_t g = g0; g < g1; g++) {
    bit_set(seg->gran_mapped, g);
    bit_set(seg->gran_idle, g);
  }
  seg->mapped_granules += g1 - g0;
  seg->idle_granules += g1 - g0;
  if (g1 > seg->gran_hwm) seg->gran_hwm = g1;
  vram_stat_up(&pool->stats.reserved_bytes, (int64_t)((g1 - g0) * pool->granularity));
  pool->stats.num_device_alloc++;
  _vram_note(pool, VRAM_EVENT_SEGMENT_MAP, seg->addr + g0 * pool->granularity,
             (g1 - g0) * pool->granularity, 0, seg->arena->stream, 0);
}

static void mark_unmapped(vram_pool_t *pool, vram_segment *seg, size_t g0, size_t g1) {
  for (size_t g = g0; g < g1; g++) {
    bit_clear(seg->gran_mapped, g);
    bit_clear(seg->gran_idle, g);
  }
  seg->mapped_granules -= g1 - g0;
  seg->idle_granules -= g1 - g0;
  vram_stat_down(&pool->stats.reserved_bytes, (int64_t)((g1 - g0) * pool->granularity));
  pool->stats.num_device_free++;
  _vram_note(pool, VRAM_EVENT_SEGMENT_UNMAP, seg->addr + g0 * pool->granularity,
             (g1 - g0) * pool->granularity, 0, seg->arena->stream, 0);
}

size_t _vram_granules_unmapped_in(vram_pool_t *pool, vram_segment *seg, uintptr_t addr, size_t size) {
  size_t g0, g1, n = 0;
  granule_span(seg, pool->granularity, addr, size, &g0, &g1);
  for (size_t g = g0; g < g1; g++) n += !bit_get(seg->gran_mapped, g);
  return n;
}

size_t _vram_granules_idle_total(const vram_pool_t *pool) {
  size_t n = 0;
  for (vram_arena *a = pool->arenas; a; a = a->next)
    for (vram_segment *s = a->segments; s; s = s->next) n += s->idle_granules;
  return n;
}

/* The first mapped granule at or after g, below n (n if none), a word at a time: the
 * unmapped tail of a reserved range runs to tens of thousands of granules. */
static size_t next_mapped(const vram_segment *seg, size_t g, size_t n) {
  while (g < n) {
    uint64_t word = seg->gran_mapped[g / BITS] >> (g % BITS);
    if (word) return g + (size_t)__builtin_ctzll(word) < n ? g + (size_t)__builtin_ctzll(word) : n;
    g = (g / BITS + 1) * BITS;
  }
  return n;
}

bool _vram_granules_mapped_window(vram_pool_t *pool, vram_segment *seg, uintptr_t addr,
                                  size_t span, size_t size, uintptr_t *start) {
  size_t G = pool->granularity;
  /* Nothing at or above the high-water granule was ever mapped. */
  uintptr_t end = addr + span, hwm_end = seg->addr + seg->gran_hwm * G;
  if (end > hwm_end) end = hwm_end;
  uintptr_t at = addr;
  while (at + size <= end) {
    size_t g0, g1;
    granule_span(seg, G, at, size, &g0, &g1);
    size_t g = g0;
    while (g < g1 && bit_get(seg->gran_mapped, g)) g++;
    if (g == g1) {
      *start = at;
      return true;
    }
    /* The window cannot hold unmapped granule g: start again at the next mapped one. */
    size_t next = next_mapped(seg, g + 1, seg->gran_hwm);
    if (next >= seg->gran_hwm) return false;
    at = seg->addr + next * G;
  }
  return false;
}

/* Unmap idle granules, highest addresses first (the dense low end of a segment is the most
 * likely to be reused), skipping [skip_g0, skip_g1) of skip_seg. Each arena's stream is
 * waited for once before its first unmap: a block freed on it may still be in use by
 * work queued there. Returns the granules unmapped. */
static size_t trim(vram_pool_t *pool, size_t want, vram_segment *skip_seg, size_t skip_g0,
                   size_t skip_g1, int *first_error) {
  size_t done = 0;
  size_t mapped_total = (size_t)pool->stats.reserved_bytes.current / pool->granularity;
  for (vram_arena *a = pool->arenas; a && done < want; a = a->next) {
    bool quiesced = false;
    for (vram_segment *s = a->segments; s && done < want; s = s->next) {
      size_t g = s->gran_hwm;
      while (g > 0 && done < want && s->idle_granules && mapped_total > pool->keep_mapped) {
        /* Find the next run of idle granules below g. */
        size_t hi = g;
        while (hi > 0 && !(bit_get(s->gran_idle, hi - 1) && !(s == skip_seg && hi - 1 >= skip_g0 && hi - 1 < skip_g1)))
          hi--;
        if (hi == 0) break;
        size_t lo = hi - 1;
        size_t limit = want - done;
        if (mapped_total - pool->keep_mapped < limit) limit = mapped_total - pool->keep_mapped;
        while (lo > 0 && hi - lo < limit && bit_get(s->gran_idle, lo - 1) &&
               !(s == skip_seg && lo - 1 >= skip_g0 && lo - 1 < skip_g1))
          lo--;
        g = lo;
        if (!quiesced) {
          int rc = _vram_arena_quiesce(pool, a);
          if (rc) {
            if (first_error && !*first_error) *first_error = rc;
            return done;
          }
          quiesced = true;
        }
        int rc = pool->src->xUnmap(pool->src_state, s->addr + lo * pool->granularity,
                                   (hi - lo) * pool->granularity);
        if (rc) { /* still mapped and idle: consistent, tried again later */
          if (first_error && !*first_error) *first_error = rc;
          continue;
        }
        mark_unmapped(pool, s, lo, hi);
        done += hi - lo;
        mapped_total -= hi - lo;
      }
      while (s->gran_hwm > 0 && !bit_get(s->gran_mapped, s->gran_hwm - 1) && !s->gran_used[s->gran_hwm - 1])
        s->gran_hwm--;
    }
  }
  return done;
}

size_t _vram_granules_trim(vram_pool_t *pool, size_t want, int *first_error) {
  return trim(pool, want, NULL, 0, 0, first_error);
}

/* What the pool may hold mapped before new mappings first take idle granules back: its
 * high-water mark of mapped bytes, or the peak of allocated bytes (this request included)
 * plus 1/2^VRAM_VMM_SLACK_SHIFT of it, whichever is larger. Without the slack a pool that
 * reached its peak would unmap and map again on almost every request that lands on
 * unmapped space; with it a training loop's steady state makes no driver call on
 * stream_prefetch and a quarter of them on gpt2_train. */
static size_t mapped_allowance(const vram_pool_t *pool, size_t request) {
  size_t allocated = (size_t)pool->stats.allocated_bytes.current + request;
  if ((size_t)pool->stats.allocated_bytes.peak > allocated)
    allocated = (size_t)pool->stats.allocated_bytes.peak;
  size_t allowance = allocated + (allocated >> VRAM_VMM_SLACK_SHIFT);
  size_t high_water = (size_t)pool->stats.reserved_bytes.peak;
  return allowance > high_water ? allowance : high_water;
}

bool _vram_granules_must_trim(vram_pool_t *pool, vram_segment *seg, uintptr_t addr, size_t size) {
  size_t need = _vram_granules_unmapped_in(pool, seg, addr, size);
  if (!need) return false;
  size_t after = (size_t)pool->stats.reserved_bytes.current + need * pool->granularity;
  return after > mapped_allowance(pool, size) || (pool->limit && after > pool->limit);
}

int _vram_granules_acquire(vram_pool_t *pool, vram_segment *seg, uintptr_t addr, size_t size) {
  size_t G = pool->granularity;
  size_t g0, g1;
  granule_span(seg, G, addr, size, &g0, &g1);
  size_t need = _vram_granules_unmapped_in(pool, seg, addr, size);
  if (need) {
    size_t reserved = (size_t)pool->stats.reserved_bytes.current;
    size_t bytes = need * G;
    /* Under a limit, or where mapping would raise the high-water mark, idle granules
     * elsewhere give their memory first. */
    if (pool->limit && reserved + bytes > pool->limit) {
      trim(pool, (reserved + bytes - pool->limit + G - 1) / G, seg, g0, g1, NULL);
      reserved = (size_t)pool->stats.reserved_bytes.current;
      if (reserved + bytes > pool->limit && pool->idle_bytes) {
        _vram_release_fixed_idle(pool, reserved + bytes - pool->limit, NULL);
        reserved = (size_t)pool->stats.reserved_bytes.current;
      }
      if (reserved + bytes > pool->limit) return VRAM_ENOMEM;
    }
    size_t allowance = mapped_allowance(pool, size);
    if (reserved + bytes > allowance) {
      size_t over = (reserved + bytes - allowance + G - 1) / G;
      trim(pool, over, seg, g0, g1, NULL);
    }
    /* Map each run of unmapped granules with one call; undo this call's runs on failure. */
    for (size_t g = g0; g < g1;) {
      if (bit_get(seg->gran_mapped, g)) {
        g++;
        continue;
      }
      size_t run_end = g;
      while (run_end < g1 && !bit_get(seg->gran_mapped, run_end)) run_end++;
      int rc = pool->src->xMap(pool->src_state, seg->addr + g * G, (run_end - g) * G);
      if (rc) {
        /* Granules mapped by this call stay mapped but idle: valid cached memory that the
         * next trim returns. Unmapping here could fail too and gains nothing. */
        return rc;
      }
      mark_mapped(pool, seg, g, run_end);
      g = run_end;
    }
  }
  for (size_t g = g0; g < g1; g++) {
    if (!seg->gran_used[g]) {
      bit_clear(seg->gran_idle, g);
      seg->idle_granules--;
    }
    seg->gran_used[g] += granule_overlap(seg, G, g, addr, size);
  }
  return VRAM_OK;
}

void _vram_granules_release(vram_pool_t *pool, vram_segment *seg, uintptr_t addr, size_t size) {
  size_t G = pool->granularity;
  size_t g0, g1;
  granule_span(seg, G, addr, size, &g0, &g1);
  for (size_t g = g0; g < g1; g++) {
    seg->gran_used[g] -= granule_overlap(seg, G, g, addr, size);
    if (!seg->gran_used[g]) {
      bit_set(seg->gran_idle, g);
      seg->idle_granules++;
    }
  }
}

void _vram_granules_unmap_all(vram_pool_t *pool, vram_segment *seg) {
  for (size_t g = 0; g < seg->gran_hwm;) {
    if (!bit_get(seg->gran_mapped, g)) {
      g++;
      continue;
    }
    size_t end = g;
    while (end < seg->gran_hwm && bit_get(seg->gran_mapped, end)) end++;
    pool->src->xUnmap(pool->src_state, seg->addr + g * pool->granularity, (end - g) * pool->granularity);
    g = end;
  }
}

/* Recount every granule of the segment from its blocks and compare. */
bool _vram_granules_check(vram_pool_t *pool, vram_segment *seg) {
  size_t G = pool->granularity;
  size_t n = seg->gran_hwm;
  if (n > seg->n_granules) return false;
  uint32_t *expect = calloc(n ? n : 1, sizeof *expect);
  if (!expect) return true; /* cannot check without memory; not a broken invariant */
  bool ok = true;
  for (vram_block *b = seg->first; b && ok; b = b->addr_next) {
    if (b->state == VRAM_BLOCK_FREE) continue;
    size_t g0, g1;
    granule_span(seg, G, b->addr, b->size, &g0, &g1);
    if (g1 > n) { ok = false; break; }
    for (size_t g = g0; g < g1; g++) expect[g] += granule_overlap(seg, G, g, b->addr, b->size);
  }
  size_t mapped = 0, idle = 0;
  for (size_t g = 0; g < n && ok; g++) {
    bool m = bit_get(seg->gran_mapped, g), i = bit_get(seg->gran_idle, g);
    if (expect[g] != seg->gran_used[g]) ok = false;
    if (seg->gran_used[g] && !m) ok = false;       /* a used granule is always mapped */
    if (i != (m && !seg->gran_used[g])) ok = false; /* idle = mapped and unused */
    mapped += m;
    idle += i;
  }
  for (size_t w = n / BITS; ok && w < (seg->n_granules + BITS - 1) / BITS; w++) {
    uint64_t m = seg->gran_mapped[w], i = seg->gran_idle[w];
    if (w == n / BITS && n % BITS) { m >>= n % BITS; i >>= n % BITS; }
    if (m || i) ok = false; /* nothing mapped at or above the high-water index */
  }
  free(expect);
  return ok && mapped == seg->mapped_granules && idle == seg->idle_granules;
}

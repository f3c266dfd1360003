/* granules.c - physical backing of virtual-memory segments (the vmm and sim:vmm sources,
 * and the virtual ranges a cuda pool grows into near its cap).
 *
 * A virtual segment is a large reserved address range; blocks are carved from it as from
 * any segment, but only the granules (2 MiB on current GPUs) that live blocks touch are
 * mapped to physical memory. Per granule this file keeps a mapped bit, an idle bit and a
 * head bit where a mapping begins: each mapping is one physical handle, and the driver
 * unmaps only whole mappings. Blocks tile their segment, so a granule no live, pending or
 * parked block touches is one lying wholly in free space: a mapped granule is idle (cached
 * memory) exactly when it lies inside the run of free blocks around it. Taking a block from
 * free space and giving one back change the idle bits of one range of granules, found from
 * the ends of that run, a word of bits at a time, whatever the block's size; nothing is
 * counted per granule.
 *
 * (Blocks parked in their arena's one-block cache count as used until they are merged.)
 *
 * What stays mapped, what makes room for a new mapping and how many granules one mapping
 * holds are the placement policy's (placement.c: the kept regime far from the cap, the
 * allowance near it); this file maps, unmaps and keeps the bits as it is told. Mapping
 * costs tens of microseconds per handle (bench/vmm_cost.c), so idle granules stay mapped
 * until memory is actually needed. */
#include <stdlib.h>
#include <string.h>

#include "pool/events.h"
#include "pool/granules.h"
#include "pool/kinds.h"
#include "pool/placement.h"
#include "pool/segment.h"

#define BITS 64

static inline bool bit_get(const uint64_t *bits, size_t i) { return (bits[i / BITS] >> (i % BITS)) & 1; }
static inline void bit_set(uint64_t *bits, size_t i) { bits[i / BITS] |= (uint64_t)1 << (i % BITS); }

/* Masks of the bits of [g0, g1) in its first and in its last word (g0 < g1). */
static inline uint64_t first_word_mask(size_t g0) { return ~(uint64_t)0 << (g0 % BITS); }
static inline uint64_t last_word_mask(size_t g1) {
  return ~(uint64_t)0 >> (BITS - 1 - (g1 - 1) % BITS);
}

/* The set bits of bits[] in [g0, g1), a word at a time: a large block spans hundreds of
 * granules, and these run on every allocation and free that reaches the index. */
static size_t bits_count(const uint64_t *bits, size_t g0, size_t g1) {
  if (g0 >= g1) return 0;
  size_t w0 = g0 / BITS, w1 = (g1 - 1) / BITS;
  uint64_t first = first_word_mask(g0), last = last_word_mask(g1);
  if (w0 == w1) return (size_t)__builtin_popcountll(bits[w0] & first & last);
  size_t n = (size_t)__builtin_popcountll(bits[w0] & first);
  for (size_t w = w0 + 1; w < w1; w++) n += (size_t)__builtin_popcountll(bits[w]);
  return n + (size_t)__builtin_popcountll(bits[w1] & last);
}

/* Whether every bit of bits[] in [g0, g1) is set: the common answer to "is this span
 * mapped?", which needs no count (a popcount is a dozen instructions on a build for
 * baseline x86-64, which has no popcnt instruction). */
static inline bool bits_all(const uint64_t *bits, size_t g0, size_t g1) {
  size_t w0 = g0 / BITS, w1 = (g1 - 1) / BITS;
  uint64_t first = first_word_mask(g0), last = last_word_mask(g1);
  if (w0 == w1) return (bits[w0] & first & last) == (first & last);
  if ((bits[w0] & first) != first || (bits[w1] & last) != last) return false;
  for (size_t w = w0 + 1; w < w1; w++)
    if (bits[w] != ~(uint64_t)0) return false;
  return true;
}

/* The unmapped granules of [g0, g1) (g0 < g1). */
static inline size_t unmapped_between(const vram_segment *seg, size_t g0, size_t g1) {
  if (bits_all(seg->gran_mapped, g0, g1)) return 0;
  return (g1 - g0) - bits_count(seg->gran_mapped, g0, g1);
}

/* The highest clear bit of bits[] in [g0, g1), or SIZE_MAX if every bit there is set. */
static size_t bits_last_clear(const uint64_t *bits, size_t g0, size_t g1) {
  if (g0 >= g1) return SIZE_MAX;
  size_t w0 = g0 / BITS;
  uint64_t mask = last_word_mask(g1);
  for (size_t w = (g1 - 1) / BITS;; w--, mask = ~(uint64_t)0) {
    if (w == w0) mask &= first_word_mask(g0);
    uint64_t clear = ~bits[w] & mask;
    if (clear) return w * BITS + (size_t)(63 - __builtin_clzll(clear));
    if (w == w0) return SIZE_MAX;
  }
}

/* bits_fill past one word: the first and last words under their masks, whole words
 * between. Out of line, so that the one-word case inlined in the hot paths needs neither
 * the loop's registers nor memset's call. */
static VRAM_NOINLINE void bits_fill_words(uint64_t *bits, size_t w0, size_t w1, uint64_t first,
                                          uint64_t last, bool on) {
  bits[w0] = on ? bits[w0] | first : bits[w0] & ~first;
  for (size_t w = w0 + 1; w < w1; w++) bits[w] = on ? ~(uint64_t)0 : 0;
  bits[w1] = on ? bits[w1] | last : bits[w1] & ~last;
}

/* Set (on) or clear bits [g0, g1), a word at a time. */
static inline void bits_fill(uint64_t *bits, size_t g0, size_t g1, bool on) {
  if (g0 >= g1) return;
  size_t w0 = g0 / BITS, w1 = (g1 - 1) / BITS;
  uint64_t first = first_word_mask(g0), last = last_word_mask(g1);
  if (w0 != w1) {
    bits_fill_words(bits, w0, w1, first, last, on);
    return;
  }
  first &= last;
  bits[w0] = on ? bits[w0] | first : bits[w0] & ~first;
}

/* The granule holding byte `offset` of a segment. Granularities are powers of two (the
 * pool refuses a source whose is not), so this is one shift by the pool's granule_shift. */
static inline size_t granule_at(unsigned shift, uintptr_t offset) { return offset >> shift; }

/* The granules [*g0, *g1) that [addr, addr+size) of a segment touches. */
static inline void granule_span(const vram_segment *seg, unsigned shift, uintptr_t addr,
                                size_t size, size_t *g0, size_t *g1) {
  *g0 = granule_at(shift, addr - seg->addr);
  *g1 = granule_at(shift, addr + size - 1 - seg->addr) + 1;
}

/* The granules of [g0, g1) that lie wholly inside [lo, hi), the run of free blocks
 * around a block that is taken or given back, as [*i0, *i1) (empty if none). */
static inline void wholly_inside(const vram_segment *seg, unsigned shift, uintptr_t lo,
                                 uintptr_t hi, size_t g0, size_t g1, size_t *i0, size_t *i1) {
  size_t first = granule_at(shift, lo - seg->addr + ((uintptr_t)1 << shift) - 1);
  size_t last = granule_at(shift, hi - seg->addr);
  *i0 = first > g0 ? first : g0;
  *i1 = last < g1 ? last : g1;
  if (*i1 < *i0) *i1 = *i0;
}

/* The bytes [*lo, *hi) of b and the free blocks on either side of it. A free block's
 * neighbours are in use, but for a moment after a free block is split in two (the front
 * given up to reach a window), so the walk looks on past one. */
static inline void free_run(const vram_block *b, uintptr_t *lo, uintptr_t *hi) {
  *lo = b->addr;
  *hi = b->addr + b->size;
  for (const vram_block *p = b->addr_prev; p && p->state == VRAM_BLOCK_FREE; p = p->addr_prev)
    *lo = p->addr;
  for (const vram_block *n = b->addr_next; n && n->state == VRAM_BLOCK_FREE; n = n->addr_next)
    *hi = n->addr + n->size;
}

/* Set (idle) or clear the idle bits of the granules of [g0, g1), b's own span, that lie
 * wholly in the run of free blocks around b: the one change a take or a free makes. */
static inline void set_idle_in_free_run(vram_segment *seg, unsigned shift, const vram_block *b,
                                        size_t g0, size_t g1, bool idle) {
  uintptr_t lo, hi;
  size_t i0, i1;
  free_run(b, &lo, &hi);
  wholly_inside(seg, shift, lo, hi, g0, g1, &i0, &i1);
  if (idle) seg->idle_granules += i1 - i0;
  else seg->idle_granules -= i1 - i0;
  /* Last, so that on the free side a fill of several words is a tail call. */
  bits_fill(seg->gran_idle, i0, i1, idle);
}

int _vram_granules_init(vram_pool_t *pool, vram_segment *seg) {
  size_t n = seg->size / pool->granularity;
  size_t words = (n + BITS - 1) / BITS;
  seg->gran_mapped = calloc(words, sizeof *seg->gran_mapped);
  seg->gran_idle = calloc(words, sizeof *seg->gran_idle);
  seg->gran_head = calloc(words, sizeof *seg->gran_head);
  if (!seg->gran_mapped || !seg->gran_idle || !seg->gran_head) {
    _vram_granules_destroy(seg);
    return VRAM_EHOSTMEM;
  }
  seg->n_granules = n;
  return VRAM_OK;
}

void _vram_granules_destroy(vram_segment *seg) {
  free(seg->gran_mapped);
  free(seg->gran_idle);
  free(seg->gran_head);
  seg->gran_mapped = seg->gran_idle = seg->gran_head = NULL;
}

/* Mark granules [g0, g1) mapped as one mapping (and idle: nothing uses them yet). */
static void mark_mapped(vram_pool_t *pool, vram_segment *seg, size_t g0, size_t g1) {
  bits_fill(seg->gran_mapped, g0, g1, true);
  bits_fill(seg->gran_idle, g0, g1, true);
  bit_set(seg->gran_head, g0);
  seg->mapped_granules += g1 - g0;
  seg->idle_granules += g1 - g0;
  if (g1 > seg->gran_hwm) seg->gran_hwm = g1;
  vram_stat_up(&pool->stats.reserved_bytes, (int64_t)((g1 - g0) * pool->granularity));
  _vram_kind_reserve(pool, seg, (g1 - g0) * pool->granularity);
  pool->stats.num_device_alloc++;
  _vram_note(pool, VRAM_EVENT_SEGMENT_MAP, seg->addr + g0 * pool->granularity,
             (g1 - g0) * pool->granularity, 0, seg->arena->stream, 0);
}

/* Mark the whole mappings [g0, g1) unmapped; each was one physical handle given back. */
static void mark_unmapped(vram_pool_t *pool, vram_segment *seg, size_t g0, size_t g1) {
  pool->stats.num_device_free += bits_count(seg->gran_head, g0, g1);
  bits_fill(seg->gran_mapped, g0, g1, false);
  bits_fill(seg->gran_idle, g0, g1, false);
  bits_fill(seg->gran_head, g0, g1, false);
  seg->mapped_granules -= g1 - g0;
  seg->idle_granules -= g1 - g0;
  vram_stat_down(&pool->stats.reserved_bytes, (int64_t)((g1 - g0) * pool->granularity));
  _vram_kind_unreserve(pool, seg, (g1 - g0) * pool->granularity);
  _vram_note(pool, VRAM_EVENT_SEGMENT_UNMAP, seg->addr + g0 * pool->granularity,
             (g1 - g0) * pool->granularity, 0, seg->arena->stream, 0);
}

size_t _vram_granules_unmapped_in(const vram_pool_t *pool, const vram_segment *seg, uintptr_t addr,
                                  size_t size) {
  size_t g0, g1;
  granule_span(seg, pool->granule_shift, addr, size, &g0, &g1);
  return unmapped_between(seg, g0, g1);
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
    granule_span(seg, pool->granule_shift, at, size, &g0, &g1);
    size_t g = bits_last_clear(seg->gran_mapped, g0, g1);
    if (g == SIZE_MAX) {
      *start = at;
      return true;
    }
    /* No window from here to unmapped granule g can hold it: start again at the next
     * mapped one after it. */
    size_t next = next_mapped(seg, g + 1, seg->gran_hwm);
    if (next >= seg->gran_hwm) return false;
    at = seg->addr + next * G;
  }
  return false;
}

static inline bool trimmable(const vram_segment *s, size_t g, const vram_segment *skip_seg,
                             size_t skip_g0, size_t skip_g1) {
  return bit_get(s->gran_idle, g) && !(s == skip_seg && g >= skip_g0 && g < skip_g1);
}

/* The whole mappings inside [lo, hi), a run of trimmable granules, as [*from, *to): a
 * mapping runs from its head granule to the next head or unmapped granule, and the driver
 * unmaps only whole mappings. Empty when one partly used mapping covers the whole run. */
static void whole_mappings(const vram_segment *s, size_t lo, size_t hi, size_t *from, size_t *to) {
  size_t x = lo;
  while (x < hi && !bit_get(s->gran_head, x)) x++;
  size_t y = hi;
  if (hi < s->gran_hwm && bit_get(s->gran_mapped, hi) && !bit_get(s->gran_head, hi)) {
    /* The mapping holding granule hi - 1 goes on past the run: leave it out. */
    y = hi - 1;
    while (y > x && !bit_get(s->gran_head, y)) y--;
  }
  *from = x;
  *to = y > x ? y : x;
}

/* Unmap idle granules, highest addresses first (the dense low end of a segment is the most
 * likely to be reused), whole mappings at a time, skipping [skip_g0, skip_g1) of skip_seg.
 * Each arena's stream is waited for once before its first unmap: a block freed on it may
 * still be in use by work queued there. Returns the granules unmapped, which may pass
 * `want` by less than one mapping. */
static size_t trim(vram_pool_t *pool, size_t want, vram_segment *skip_seg, size_t skip_g0,
                   size_t skip_g1, bool remember, int *first_error) {
  size_t done = 0;
  size_t mapped_total = (size_t)pool->stats.reserved_bytes.current / pool->granularity;
  for (vram_arena *a = pool->arenas; a && done < want; a = a->next) {
    bool quiesced = false;
    for (vram_segment *s = a->segments; s && done < want; s = s->next) {
      size_t g = s->gran_hwm;
      while (g > 0 && done < want && s->idle_granules && mapped_total > pool->keep_mapped) {
        /* Find the next run of idle granules below g. */
        size_t hi = g;
        while (hi > 0 && !trimmable(s, hi - 1, skip_seg, skip_g0, skip_g1)) hi--;
        if (hi == 0) break;
        size_t lo = hi - 1;
        while (lo > 0 && trimmable(s, lo - 1, skip_seg, skip_g0, skip_g1)) lo--;
        g = lo;
        size_t from, to;
        whole_mappings(s, lo, hi, &from, &to);
        /* Mappings from the top of the run down until enough, within what preallocation
         * lets go: [cut, to). */
        size_t need = want - done, room = mapped_total - pool->keep_mapped, cut = to;
        for (size_t h = to; h > from && to - cut < need;) {
          h--;
          if (!bit_get(s->gran_head, h)) continue;
          if (to - h > room) break;
          cut = h;
        }
        if (cut == to) continue;
        if (!quiesced) {
          int rc = _vram_arena_quiesce(pool, a);
          if (rc) {
            if (first_error && !*first_error) *first_error = rc;
            return done;
          }
          quiesced = true;
        }
        int rc = pool->src->xUnmap(pool->src_state, s->addr + cut * pool->granularity,
                                   (to - cut) * pool->granularity);
        if (rc) { /* still mapped and idle: consistent, tried again later */
          if (first_error && !*first_error) *first_error = rc;
          continue;
        }
        mark_unmapped(pool, s, cut, to);
        if (remember)
          _vram_place_map_ghost(pool, s->addr + cut * pool->granularity,
                                s->addr + to * pool->granularity);
        done += to - cut;
        mapped_total -= to - cut;
      }
      while (s->gran_hwm > 0 && !bit_get(s->gran_mapped, s->gran_hwm - 1))
        s->gran_hwm--;
    }
  }
  return done;
}

size_t _vram_granules_trim(vram_pool_t *pool, size_t want, int *first_error) {
  return trim(pool, want, NULL, 0, 0, false, first_error);
}

size_t _vram_granules_trim_outside(vram_pool_t *pool, size_t want, vram_segment *seg, size_t g0,
                                   size_t g1, bool remember) {
  return trim(pool, want, seg, g0, g1, remember, NULL);
}

/* The mappings one acquire made, so that a map failing part way gives them back: the
 * memory it could not use then goes to others. A few fit on the stack; the list grows on
 * the heap past that, and if even that fails the rest stay mapped and idle, which is
 * valid cached memory that the next trim returns. */
typedef struct fresh_list {
  size_t stack[16], *at, n, cap;
} fresh_list;

static void fresh_add(fresh_list *f, size_t g0, size_t g1) {
  if (f->n + 2 > f->cap) {
    size_t cap = f->cap * 2;
    size_t *more = f->at == f->stack ? malloc(cap * sizeof *more) : realloc(f->at, cap * sizeof *more);
    if (!more) return;
    if (f->at == f->stack) memcpy(more, f->stack, sizeof f->stack);
    f->at = more;
    f->cap = cap;
  }
  f->at[f->n++] = g0;
  f->at[f->n++] = g1;
}

/* Unmap the fresh mappings: no stream has used them, so none is waited for. */
static void fresh_undo(vram_pool_t *pool, vram_segment *seg, fresh_list *f) {
  for (size_t i = 0; i < f->n; i += 2)
    if (pool->src->xUnmap(pool->src_state, seg->addr + f->at[i] * pool->granularity,
                          (f->at[i + 1] - f->at[i]) * pool->granularity) == VRAM_OK)
      mark_unmapped(pool, seg, f->at[i], f->at[i + 1]);
}

/* Map the unmapped granules of [g0, g1), which hold the `size` bytes of a request, once
 * placement made room for them. Fresh granules are idle (mark_mapped); on failure nothing
 * of this call stays mapped. */
static int map_span(vram_pool_t *pool, vram_segment *seg, size_t g0, size_t g1, size_t size) {
  size_t G = pool->granularity;
  size_t need = unmapped_between(seg, g0, g1);
  if (need) {
    int rc = _vram_place_make_room(pool, seg, g0, g1, need * G, size);
    if (rc) return rc;
    /* Map each run of unmapped granules (in pieces, below); undo this call's on failure. */
    fresh_list fresh = {.n = 0, .cap = 16};
    fresh.at = fresh.stack;
    for (size_t g = g0; g < g1 && rc == VRAM_OK;) {
      if (bit_get(seg->gran_mapped, g)) {
        g++;
        continue;
      }
      size_t run_end = g;
      while (run_end < g1 && !bit_get(seg->gran_mapped, run_end)) run_end++;
      /* One mapping, one physical handle, per piece of the run; pieces of up to the unit
       * are cut from where the run begins. Cutting at multiples of the unit instead split a
       * run that crosses one into two handles for nothing: a fifth more mappings on
       * gpt2_train, each of them tens of microseconds. */
      size_t unit = _vram_place_map_unit(pool, (run_end - g) * G);
      while (g < run_end) {
        size_t piece_end = run_end - g > unit ? g + unit : run_end;
        rc = pool->src->xMap(pool->src_state, seg->addr + g * G, (piece_end - g) * G);
        if (rc) break;
        mark_mapped(pool, seg, g, piece_end);
        fresh_add(&fresh, g, piece_end);
        g = piece_end;
      }
    }
    if (rc) fresh_undo(pool, seg, &fresh);
    if (fresh.at != fresh.stack) free(fresh.at);
    if (rc) return rc;
  }
  return VRAM_OK;
}

/* Acquire's rare half, out of line beside the driver calls it makes: map the unmapped
 * granules of [g0, g1), then take the span as acquire does. */
static VRAM_NOINLINE int acquire_mapping(vram_pool_t *pool, vram_block *b, size_t size,
                                         size_t g0, size_t g1) {
  int rc = map_span(pool, b->segment, g0, g1, size);
  if (rc) return rc;
  set_idle_in_free_run(b->segment, pool->granule_shift, b, g0, g1, false);
  return VRAM_OK;
}

int _vram_granules_acquire(vram_pool_t *pool, vram_block *b, size_t size) {
  vram_segment *seg = b->segment;
  size_t g0, g1;
  granule_span(seg, pool->granule_shift, b->addr, size, &g0, &g1);
  /* Almost always mapped already: a mask test, and no call. */
  if (!bits_all(seg->gran_mapped, g0, g1)) return acquire_mapping(pool, b, size, g0, g1);
  /* Of the new block's granules, those that lay wholly in free space were idle (fresh ones
   * included); the block uses them now. The others touch a neighbour in use already. */
  set_idle_in_free_run(seg, pool->granule_shift, b, g0, g1, false);
  return VRAM_OK;
}

int _vram_granules_map(vram_pool_t *pool, vram_segment *seg, uintptr_t addr, size_t size) {
  size_t g0, g1;
  granule_span(seg, pool->granule_shift, addr, size, &g0, &g1);
  return map_span(pool, seg, g0, g1, size);
}

void _vram_granules_release(vram_pool_t *pool, vram_block *b) {
  vram_segment *seg = b->segment;
  size_t g0, g1;
  granule_span(seg, pool->granule_shift, b->addr, b->size, &g0, &g1);
  /* Of its granules, those that will lie wholly in free space once it merges with its free
   * neighbours become idle; every one of them is mapped, since b used it. */
  set_idle_in_free_run(seg, pool->granule_shift, b, g0, g1, true);
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

/* Work out which granules the segment's blocks use, from the blocks, and compare. */
bool _vram_granules_check(vram_pool_t *pool, vram_segment *seg) {
  size_t n = seg->gran_hwm;
  if (n > seg->n_granules) return false;
  bool *touched = calloc(n ? n : 1, sizeof *touched);
  if (!touched) return true; /* cannot check without memory; not a broken invariant */
  bool ok = true;
  uintptr_t covered = seg->addr;
  for (vram_block *b = seg->first; b && ok; b = b->addr_next) {
    if (b->addr != covered) ok = false; /* blocks tile the segment: the idle rule needs it */
    covered = b->addr + b->size;
    if (b->state == VRAM_BLOCK_FREE) continue;
    size_t g0, g1;
    granule_span(seg, pool->granule_shift, b->addr, b->size, &g0, &g1);
    if (g1 > n) { ok = false; break; }
    for (size_t g = g0; g < g1; g++) touched[g] = true;
  }
  if (ok && covered != seg->addr + seg->size) ok = false;
  size_t mapped = 0, idle = 0;
  for (size_t g = 0; g < n && ok; g++) {
    bool m = bit_get(seg->gran_mapped, g), i = bit_get(seg->gran_idle, g);
    bool h = bit_get(seg->gran_head, g);
    bool used = touched[g];
    if (used && !m) ok = false;       /* a used granule is always mapped */
    if (i != (m && !used)) ok = false; /* idle = mapped and unused */
    if (h && !m) ok = false;                        /* a mapping starts on a mapped granule */
    if (m && (g == 0 || !bit_get(seg->gran_mapped, g - 1)) && !h) ok = false; /* and after a gap */
    mapped += m;
    idle += i;
  }
  for (size_t w = n / BITS; ok && w < (seg->n_granules + BITS - 1) / BITS; w++) {
    uint64_t m = seg->gran_mapped[w], i = seg->gran_idle[w], h = seg->gran_head[w];
    if (w == n / BITS && n % BITS) { m >>= n % BITS; i >>= n % BITS; h >>= n % BITS; }
    if (m || i || h) ok = false; /* nothing mapped at or above the high-water index */
  }
  free(touched);
  return ok && mapped == seg->mapped_granules && idle == seg->idle_granules;
}

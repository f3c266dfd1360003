/* vt.h - helpers shared by vramkit's C tests.
 *
 * The cmocka includes in the order cmocka needs, the check that runs the engine's full
 * invariant checker (`_vram_pool_is_valid`) after an operation, status assertions that
 * print symbolic names, a seeded xorshift generator (the tests never use rand()), the
 * choice of memory source from argv or the environment, and small helpers to read the
 * statistics and the live blocks of a pool. Everything is `static inline` so each test
 * file compiles clean with -Wall -Wextra whatever it uses.
 */
#ifndef VT_H
#define VT_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>
#include <math.h>

#include <cmocka.h>

#include "vramkit.h"
#include "pool/pool.h"

#define VT_KiB ((size_t)1 << 10)
#define VT_MiB ((size_t)1 << 20)
#define VT_GiB ((size_t)1 << 30)

/* The full invariant check; cmocka reports the line of the caller. */
#define VT_VALID(pool)                                                                    \
  do {                                                                                    \
    if (!_vram_pool_is_valid(pool))                                                       \
      fail_msg("%s:%d: _vram_pool_is_valid failed (see stderr)", __FILE__, __LINE__);     \
  } while (0)

/* A call must return exactly `want`; the message names both codes. */
#define VT_EXPECT(expr, want)                                                             \
  do {                                                                                    \
    int vt_rc_ = (expr);                                                                  \
    int vt_want_ = (want);                                                                \
    if (vt_rc_ != vt_want_)                                                               \
      fail_msg("%s:%d: %s returned %s (%d), expected %s (%d)", __FILE__, __LINE__, #expr, \
               vram_errname(vt_rc_), vt_rc_, vram_errname(vt_want_), vt_want_);           \
  } while (0)
#define VT_OK(expr) VT_EXPECT(expr, VRAM_OK)

#define VT_STREAM(n) ((vram_stream_t)(uintptr_t)(n))

static inline size_t vt_round512(size_t n) { return (n + 511) & ~(size_t)511; }

/* ---- xorshift64* ------------------------------------------------------------------- */
typedef struct vt_rng {
  uint64_t s;
} vt_rng;

static inline uint64_t vt_rng_next(vt_rng *r) {
  uint64_t x = r->s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  r->s = x;
  return x * 0x2545F4914F6CDD1DULL;
}

static inline void vt_rng_seed(vt_rng *r, uint64_t seed) {
  /* splitmix64 of the seed, so that seeds 1, 2, 3 give unrelated streams. */
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  r->s = z ? z : 0x1234567ULL;
  for (int i = 0; i < 4; i++) (void)vt_rng_next(r);
}

/* Uniform in [0, n); 0 when n == 0. */
static inline uint64_t vt_rng_below(vt_rng *r, uint64_t n) {
  return n ? vt_rng_next(r) % n : 0;
}

static inline double vt_rng_unit(vt_rng *r) {
  return (double)(vt_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Log-uniform size in [lo, hi]. */
static inline size_t vt_rng_logsize(vt_rng *r, size_t lo, size_t hi) {
  double a = log((double)lo), b = log((double)hi + 1.0);
  double v = exp(a + (b - a) * vt_rng_unit(r));
  size_t s = (size_t)v;
  if (s < lo) s = lo;
  if (s > hi) s = hi;
  return s;
}

/* ---- sources ------------------------------------------------------------------------ */
typedef struct vt_source {
  const char *name;      /* as given: "sim", "sim:vmm", "cuda", "vmm", "managed" */
  vram_source_kind kind;
  int is_sim;            /* host-only: fake stream handles and capacities are allowed */
  int is_vmm;            /* virtual segments: vmm or sim:vmm */
  int runnable;          /* 0: GPU source without VRAMKIT_TEST_GPU=1, tests skip */
} vt_source;

/* Source from argv[1], else $VRAMKIT_TEST_SOURCE, else "sim". Returns 0 on bad names. */
static inline int vt_source_pick(int argc, char **argv, vt_source *out) {
  const char *name = argc > 1 ? argv[1] : getenv("VRAMKIT_TEST_SOURCE");
  if (!name || !*name) name = "sim";
  memset(out, 0, sizeof *out);
  out->name = name;
  if (vram_source_parse(name, &out->kind) != VRAM_OK) return 0;
  out->is_sim = out->kind == VRAM_SOURCE_SIM || out->kind == VRAM_SOURCE_SIM_VMM;
  out->is_vmm = out->kind == VRAM_SOURCE_VMM || out->kind == VRAM_SOURCE_SIM_VMM;
  if (out->is_sim) {
    out->runnable = 1;
  } else {
    const char *gpu = getenv("VRAMKIT_TEST_GPU");
    out->runnable = gpu && strcmp(gpu, "1") == 0;
  }
  return 1;
}

/* A pool made from these options, which must succeed; checked before it is returned. */
static inline vram_pool_t *vt_pool_from(const vram_options_t *o) {
  vram_pool_t *pool = NULL;
  VT_OK(vram_pool_create(&pool, o));
  VT_VALID(pool);
  return pool;
}

/* A valid pool on `kind` whose sim device holds `sim_capacity` bytes (ignored on a GPU). */
static inline vram_pool_t *vt_pool_new(vram_source_kind kind, size_t sim_capacity) {
  vram_options_t o;
  vram_options_init(&o);
  o.source = kind;
  o.sim_capacity = sim_capacity;
  return vt_pool_from(&o);
}

/* ---- statistics and live blocks ------------------------------------------------------ */
/* 1 if the live block at `ptr` lies in a virtual range of the pool (a snapshot's
 * expandable segment), 0 if in a fixed segment; a pointer that is no live block fails the
 * test. For pools of at most 64 segments and 512 blocks. */
static inline int vt_in_virtual(vram_pool_t *pool, void *ptr) {
  vram_snapshot_segment_t segs[64];
  vram_snapshot_block_t blocks[512];
  size_t n_segs = 0, n_blocks = 0;
  VT_OK(vram_snapshot(pool, segs, 64, &n_segs, blocks, 512, &n_blocks));
  assert_true(n_segs <= 64 && n_blocks <= 512);
  uint64_t p = (uint64_t)(uintptr_t)ptr;
  for (size_t i = 0; i < n_segs; i++)
    for (uint64_t b = segs[i].first_block; b < segs[i].first_block + segs[i].n_blocks; b++)
      if (blocks[b].addr == p && blocks[b].state == VRAM_SNAPSHOT_ACTIVE_ALLOCATED)
        return segs[i].is_expandable != 0;
  fail_msg("%p is no live block of the pool", ptr);
  return -1;
}

static inline vram_stats_t vt_stats(vram_pool_t *pool) {
  vram_stats_t s;
  memset(&s, 0, sizeof s);
  VT_OK(vram_get_stats(pool, &s));
  return s;
}

/* A block that must be had, and its free, each followed by the invariant checker. */
static inline void *vt_take(vram_pool_t *pool, size_t size) {
  void *p = NULL;
  VT_OK(vram_malloc(pool, size, NULL, &p));
  assert_non_null(p);
  VT_VALID(pool);
  return p;
}

static inline void vt_give(vram_pool_t *pool, void *p) {
  VT_OK(vram_free(pool, p));
  VT_VALID(pool);
}

typedef struct vt_blk {
  void *ptr;
  size_t req, size;
  vram_stream_t stream;
} vt_blk;

typedef struct vt_blkset {
  vt_blk *v;
  size_t n, cap;
} vt_blkset;

static inline void vt_collect_fn(void *user, void *ptr, size_t requested, size_t size,
                                 vram_stream_t stream) {
  vt_blkset *set = (vt_blkset *)user;
  if (set->n == set->cap) {
    size_t cap = set->cap ? set->cap * 2 : 64;
    vt_blk *v = (vt_blk *)realloc(set->v, cap * sizeof *v);
    if (!v) abort();
    set->v = v;
    set->cap = cap;
  }
  set->v[set->n].ptr = ptr;
  set->v[set->n].req = requested;
  set->v[set->n].size = size;
  set->v[set->n].stream = stream;
  set->n++;
}

static inline int vt_blk_cmp(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const vt_blk *)a)->ptr, y = (uintptr_t)((const vt_blk *)b)->ptr;
  return x < y ? -1 : x > y;
}

/* The live blocks, sorted by address. Free with vt_blkset_free. */
static inline vt_blkset vt_collect(vram_pool_t *pool) {
  vt_blkset set = {NULL, 0, 0};
  VT_OK(vram_for_each_block(pool, vt_collect_fn, &set));
  if (set.n > 1) qsort(set.v, set.n, sizeof *set.v, vt_blk_cmp);
  return set;
}

static inline void vt_blkset_free(vt_blkset *set) {
  free(set->v);
  set->v = NULL;
  set->n = set->cap = 0;
}

static inline const vt_blk *vt_blkset_find(const vt_blkset *set, const void *ptr) {
  for (size_t i = 0; i < set->n; i++)
    if (set->v[i].ptr == ptr) return &set->v[i];
  return NULL;
}

/* Rounded size of one live block, from for_each_block; fails the test if not live. */
static inline size_t vt_block_size(vram_pool_t *pool, void *ptr) {
  vt_blkset set = vt_collect(pool);
  const vt_blk *b = vt_blkset_find(&set, ptr);
  size_t size = b ? b->size : 0;
  vt_blkset_free(&set);
  if (!b) fail_msg("block %p not visited by vram_for_each_block", ptr);
  return size;
}

/* Case-insensitive substring search. */
static inline int vt_contains_ci(const char *hay, const char *needle) {
  size_t n = strlen(needle);
  for (; *hay; hay++) {
    size_t i = 0;
    while (i < n && hay[i] &&
           tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i]))
      i++;
    if (i == n) return 1;
  }
  return n == 0;
}

/* Does a human-written text mention this byte count, in bytes or in K/M/G units? */
static inline int vt_mentions_size(const char *text, size_t bytes) {
  char buf[64];
  static const struct {
    const char *unit;
    double div;
  } units[] = {{"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
               {"KB", 1024.0},  {"MB", 1048576.0},  {"GB", 1073741824.0},
               {"K", 1024.0},   {"M", 1048576.0},   {"G", 1073741824.0}};
  snprintf(buf, sizeof buf, "%zu", bytes);
  if (strstr(text, buf)) return 1;
  for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
    double v = (double)bytes / units[u].div;
    if (v < 1.0 || v >= 100000.0) continue;
    static const char *fmts[] = {"%.0f %s", "%.0f%s", "%.1f %s", "%.1f%s", "%.2f %s",
                                 "%.2f%s",  "%.3f %s", "%.3f%s"};
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
      if (f < 2 && v != floor(v)) continue;
      snprintf(buf, sizeof buf, fmts[f], v, units[u].unit);
      if (strstr(text, buf)) return 1;
    }
  }
  return 0;
}

/* vram_snapshot of the pool, checked: each segment is tiled by its blocks (contiguous,
 * address order, from its start to its end), segments do not overlap, inactive blocks carry
 * no request and never lie side by side (free memory between two used blocks is one block,
 * as in PyTorch's snapshots, however the engine keeps it), and the states add up to the statistics (allocated and active bytes; the
 * segments' bytes are the reserved bytes). Returns NULL if all holds, else what broke
 * (a static buffer). *n_segs and *n_blocks (if non-NULL) get the counts. */
static inline const char *vt_snapshot_problem(vram_pool_t *pool, size_t *n_segs_out,
                                              size_t *n_blocks_out) {
  static char why[256];
  size_t ns = 0, nb = 0;
  if (vram_snapshot(pool, NULL, 0, &ns, NULL, 0, &nb) != VRAM_OK) return "vram_snapshot failed";
  vram_snapshot_segment_t *segs = calloc(ns + 1, sizeof *segs);
  vram_snapshot_block_t *blocks = calloc(nb + 1, sizeof *blocks);
  size_t ns2 = 0, nb2 = 0;
  const char *bad = NULL;
  if (vram_snapshot(pool, segs, ns, &ns2, blocks, nb, &nb2) != VRAM_OK || ns2 != ns || nb2 != nb)
    bad = "second vram_snapshot disagrees with the first";
  vram_stats_t st;
  vram_get_stats(pool, &st);
  uint64_t reserved = 0, allocated = 0, active = 0, covered = 0;
  for (size_t i = 0; i < ns && !bad; i++) {
    const vram_snapshot_segment_t *s = &segs[i];
    uint64_t at = s->addr;
    reserved += s->size;
    if (i && segs[i - 1].addr + segs[i - 1].size > s->addr)
      snprintf(why, sizeof why, "segments %zu and %zu overlap or are out of order", i - 1, i), bad = why;
    if (s->n_blocks == 0 || s->first_block + s->n_blocks > nb)
      snprintf(why, sizeof why, "segment %zu has blocks [%llu, +%llu) of %zu", i,
               (unsigned long long)s->first_block, (unsigned long long)s->n_blocks, nb), bad = why;
    for (uint64_t k = 0; k < s->n_blocks && !bad; k++) {
      const vram_snapshot_block_t *b = &blocks[s->first_block + k];
      if (b->addr != at || b->size == 0)
        snprintf(why, sizeof why, "segment %zu: block %llu at %#llx, expected %#llx", i,
                 (unsigned long long)k, (unsigned long long)b->addr, (unsigned long long)at), bad = why;
      if (b->state == VRAM_SNAPSHOT_INACTIVE && (b->requested || b->context)) bad = "inactive block with a request";
      if (k && b->state == VRAM_SNAPSHOT_INACTIVE && b[-1].state == VRAM_SNAPSHOT_INACTIVE)
        snprintf(why, sizeof why, "segment %zu: free blocks %llu and %llu side by side", i,
                 (unsigned long long)k - 1, (unsigned long long)k), bad = why;
      if (b->state != VRAM_SNAPSHOT_INACTIVE && (b->requested == 0 || b->requested > b->size))
        bad = "active block with a bad request";
      if (b->state == VRAM_SNAPSHOT_ACTIVE_ALLOCATED) allocated += b->size;
      if (b->state != VRAM_SNAPSHOT_INACTIVE) active += b->size;
      at += b->size;
      covered++;
    }
    if (!bad && at != s->addr + s->size)
      snprintf(why, sizeof why, "segment %zu: blocks end at %#llx, segment at %#llx", i,
               (unsigned long long)at, (unsigned long long)(s->addr + s->size)), bad = why;
  }
  if (!bad && covered != nb) bad = "blocks that belong to no segment";
  if (!bad && (allocated != (uint64_t)st.allocated_bytes.current ||
               active != (uint64_t)st.active_bytes.current ||
               reserved != (uint64_t)st.reserved_bytes.current))
    snprintf(why, sizeof why, "snapshot allocated/active/reserved %llu/%llu/%llu, stats %lld/%lld/%lld",
             (unsigned long long)allocated, (unsigned long long)active, (unsigned long long)reserved,
             (long long)st.allocated_bytes.current, (long long)st.active_bytes.current,
             (long long)st.reserved_bytes.current), bad = why;
  free(segs);
  free(blocks);
  if (n_segs_out) *n_segs_out = ns;
  if (n_blocks_out) *n_blocks_out = nb;
  return bad;
}

#define VT_TILES(pool)                                                                    \
  do {                                                                                    \
    const char *vt_why_ = vt_snapshot_problem(pool, NULL, NULL);                          \
    if (vt_why_) fail_msg("%s:%d: snapshot: %s", __FILE__, __LINE__, vt_why_);           \
  } while (0)

#endif /* VT_H */

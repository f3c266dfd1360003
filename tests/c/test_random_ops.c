/* test_random_ops.c - seeded random operation sequences with fault injection, checked
 * against a shadow model after every operation; and a sweep that fails each source call
 * of a fixed scenario in turn.
 *
 * Usage (CTest registers both):
 *   test_random_ops random SOURCE FIRST_SEED N_SEEDS OPS_PER_SEED
 *   test_random_ops sweep SOURCE
 * $VRAMKIT_TEST_OPS, when set, replaces OPS_PER_SEED.
 *
 * Random: mallocs (sizes log-uniform 1 B..64 MiB, four streams), frees, record_stream,
 * empty_cache, reset_peak, set_limit, occasional free-everything, double and foreign
 * frees, on a sim device small enough that OOMs happen, with most seeds injecting source
 * failures (fault_fail_at / fault_fail_every). After every operation: the engine's full
 * invariant check, and the shadow model: every live block keeps its pointer, requested
 * size and stream, no two live blocks overlap, requested_bytes / allocated_bytes /
 * allocation / num_mallocs / num_frees / num_ooms equal what the model counts, reserved
 * stays within the capacity and (after growth) within the limit.
 *
 * SOURCE "sim+callbacks": the same on a pool whose segments come from callbacks
 * (vram_pool_create_with_callbacks) over a host model of a device of the sim's capacity,
 * which must have every byte back once the pool is destroyed; "+no_split" (either source):
 * a pool that never splits a segment, whose blocks count their whole segments.
 *
 * Sweep (fault injection at every call of the map path): for k = 1, 2, ... run a
 * fixed scenario with fault_fail_at = k (once with the k-th call failing alone, once with
 * every call from the k-th on failing) and check validity and the live blocks after every
 * step, until k is past the scenario's last source call.
 */
#include "vt.h"

#include <stdarg.h>
#include <stdbool.h>

enum { MAX_LIVE = 200 };

typedef struct live_blk {
  void *ptr;
  size_t req;
  size_t held; /* what allocated_bytes counts: req rounded, or a no_split block's segment */
  vram_stream_t stream;
} live_blk;

/* The device behind the callbacks of a "+callbacks" run: addresses that never repeat, and
 * a capacity past which an allocation fails. */
typedef struct host_device {
  uintptr_t next;
  size_t capacity, outstanding;
} host_device;

static int host_alloc(void *ctx, size_t size, int device, vram_stream_t stream, void **ptr) {
  host_device *d = ctx;
  (void)device;
  (void)stream;
  if (size > d->capacity - d->outstanding) return 1;
  *ptr = (void *)d->next;
  d->next += size;
  d->outstanding += size;
  return 0;
}

static void host_free(void *ctx, void *ptr, size_t size, int device, vram_stream_t stream) {
  host_device *d = ctx;
  (void)ptr;
  (void)device;
  (void)stream;
  d->outstanding -= size;
}

typedef struct model {
  const char *src_name;
  int callbacks;           /* segments from host_alloc and host_free */
  int no_split;            /* vram_options_t.no_split: a block holds its whole segment */
  host_device device;
  uint64_t seed, op;
  vram_pool_t *pool;
  int faults;              /* fault injection on: source failures may surface */
  size_t capacity;
  live_blk live[MAX_LIVE + 8];
  size_t nlive;
  int64_t sum_req, sum_round;
  uint64_t mallocs, frees, ooms;
  void *recent_freed[16];  /* for double-free probes */
  size_t n_recent;
  uint64_t faults_seen;    /* calls that returned VRAM_EFAULT */
  size_t max_nlive;
} model;

static void mfail(const model *m, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fail_msg("[%s seed %llu op %llu] %s", m->src_name, (unsigned long long)m->seed,
           (unsigned long long)m->op, msg);
}

/* The model of the running test; the teardown force-destroys a pool a failed run left. */
static model g_model;

static int teardown_model(void **state) {
  (void)state;
  if (g_model.pool) vram_pool_destroy_force(g_model.pool);
  g_model.pool = NULL;
  return 0;
}

static const vram_stream_t streams[4] = {NULL, VT_STREAM(0x11), VT_STREAM(0x22),
                                         VT_STREAM(0x33)};

static int find_live(const model *m, const void *p) {
  for (size_t i = 0; i < m->nlive; i++)
    if (m->live[i].ptr == p) return (int)i;
  return -1;
}

static void check_block(const model *m, const live_blk *b) {
  size_t r = 0;
  vram_stream_t s = VT_STREAM(0xbad);
  int rc = vram_block_info(m->pool, b->ptr, &r, &s);
  if (rc != VRAM_OK) mfail(m, "block_info(%p) = %s for a live block", b->ptr, vram_errname(rc));
  if (r != b->req || s != b->stream)
    mfail(m, "block %p: requested %zu stream %p, expected %zu %p", b->ptr, r, s, b->req,
          b->stream);
}

/* The checks that run after every operation. */
static void check_model(model *m, int full) {
  if (!_vram_pool_is_valid(m->pool)) mfail(m, "_vram_pool_is_valid failed (see stderr)");
  vram_stats_t s;
  int rc = vram_get_stats(m->pool, &s);
  if (rc) mfail(m, "get_stats = %s", vram_errname(rc));
  if (s.requested_bytes.current != m->sum_req)
    mfail(m, "requested_bytes.current %lld, model %lld", (long long)s.requested_bytes.current,
          (long long)m->sum_req);
  if (s.allocated_bytes.current != m->sum_round)
    mfail(m, "allocated_bytes.current %lld, model %lld", (long long)s.allocated_bytes.current,
          (long long)m->sum_round);
  if (s.allocation.current != (int64_t)m->nlive)
    mfail(m, "allocation.current %lld, model %zu", (long long)s.allocation.current, m->nlive);
  if (s.num_mallocs != m->mallocs || s.num_frees != m->frees || s.num_ooms != m->ooms)
    mfail(m, "counters mallocs/frees/ooms %llu/%llu/%llu, model %llu/%llu/%llu",
          (unsigned long long)s.num_mallocs, (unsigned long long)s.num_frees,
          (unsigned long long)s.num_ooms, (unsigned long long)m->mallocs,
          (unsigned long long)m->frees, (unsigned long long)m->ooms);
  if (s.reserved_bytes.current < s.allocated_bytes.current ||
      s.active_bytes.current < s.allocated_bytes.current ||
      s.reserved_bytes.current > (int64_t)m->capacity ||
      s.reserved_bytes.peak > (int64_t)m->capacity)
    mfail(m, "reserved %lld (peak %lld) active %lld allocated %lld capacity %zu",
          (long long)s.reserved_bytes.current, (long long)s.reserved_bytes.peak,
          (long long)s.active_bytes.current, (long long)s.allocated_bytes.current, m->capacity);
#define PEAK_OK(name, doc)                                                                \
  if (s.name.peak < s.name.current || s.name.current < 0 || s.name.total < s.name.peak)  \
    mfail(m, #name " current %lld peak %lld total %lld", (long long)s.name.current,       \
          (long long)s.name.peak, (long long)s.name.total);
  VRAM_STAT_LIST(PEAK_OK)
#undef PEAK_OK
  if (full) {
    for (size_t i = 0; i < m->nlive; i++) check_block(m, &m->live[i]);
    vt_blkset set = vt_collect(m->pool);
    if (set.n != m->nlive) mfail(m, "for_each_block visited %zu, model has %zu", set.n, m->nlive);
    for (size_t i = 0; i < set.n; i++) {
      int k = find_live(m, set.v[i].ptr);
      if (k < 0) mfail(m, "for_each_block visited %p, not live in the model", set.v[i].ptr);
      if (set.v[i].req != m->live[k].req || set.v[i].stream != m->live[k].stream ||
          set.v[i].size < vt_round512(set.v[i].req))
        mfail(m, "for_each_block %p: req %zu size %zu", set.v[i].ptr, set.v[i].req,
              set.v[i].size);
      if (i && (uintptr_t)set.v[i - 1].ptr + set.v[i - 1].size > (uintptr_t)set.v[i].ptr)
        mfail(m, "blocks %p and %p overlap", set.v[i - 1].ptr, set.v[i].ptr);
    }
    vt_blkset_free(&set);
    const char *why = vt_snapshot_problem(m->pool, NULL, NULL);
    if (why) mfail(m, "snapshot: %s", why);
  } else if (m->nlive) {
    /* A few live blocks every time. */
    for (int k = 0; k < 3; k++) check_block(m, &m->live[(m->op * 7 + (uint64_t)k * 131) % m->nlive]);
  }
}

static void model_add(model *m, void *p, size_t req, vram_stream_t stream) {
  if (!p) mfail(m, "malloc(%zu) returned OK and NULL", req);
  if ((uintptr_t)p % 512) mfail(m, "malloc(%zu) = %p is not 512-byte aligned", req, p);
  uintptr_t a = (uintptr_t)p, ae = a + vt_round512(req);
  for (size_t i = 0; i < m->nlive; i++) {
    uintptr_t b = (uintptr_t)m->live[i].ptr, be = b + vt_round512(m->live[i].req);
    if (a < be && b < ae)
      mfail(m, "malloc(%zu) = %p overlaps live block %p of %zu", req, p, m->live[i].ptr,
            m->live[i].req);
  }
  size_t held = vt_round512(req);
  if (m->no_split && vram_segment_of(m->pool, p, NULL, &held)) mfail(m, "segment_of(%p)", p);
  m->live[m->nlive].ptr = p;
  m->live[m->nlive].req = req;
  m->live[m->nlive].held = held;
  m->live[m->nlive].stream = stream;
  m->nlive++;
  if (m->nlive > m->max_nlive) m->max_nlive = m->nlive;
  m->sum_req += (int64_t)req;
  m->sum_round += (int64_t)held;
  m->mallocs++;
}

static void model_remove(model *m, size_t i) {
  m->sum_req -= (int64_t)m->live[i].req;
  m->sum_round -= (int64_t)m->live[i].held;
  m->recent_freed[m->n_recent++ % 16] = m->live[i].ptr;
  m->live[i] = m->live[--m->nlive];
  m->frees++;
}

/* Free live block i. Under fault injection a free may fail, but then atomically: the block
 * must still be live and intact. Returns 1 if it was freed. */
static int do_free(model *m, size_t i) {
  live_blk b = m->live[i];
  int rc = vram_free(m->pool, b.ptr);
  if (rc == VRAM_OK) {
    model_remove(m, i);
    return 1;
  }
  if (!m->faults || rc != VRAM_EFAULT) mfail(m, "free(%p) = %s", b.ptr, vram_errname(rc));
  m->faults_seen++;
  check_block(m, &b);
  return 0;
}

static void do_malloc(model *m, size_t size, vram_stream_t stream) {
  vram_stats_t before;
  vram_get_stats(m->pool, &before);
  void *p = NULL;
  int rc = vram_malloc(m->pool, size, stream, &p);
  if (rc == VRAM_OK) {
    model_add(m, p, size, stream);
    vram_stats_t after;
    vram_get_stats(m->pool, &after);
    if (after.limit_bytes && after.reserved_bytes.current > before.reserved_bytes.current &&
        after.reserved_bytes.current > (int64_t)after.limit_bytes)
      mfail(m, "malloc(%zu) grew reserved to %lld past the limit %zu", size,
            (long long)after.reserved_bytes.current, after.limit_bytes);
    return;
  }
  if (p) mfail(m, "failed malloc left *out = %p", p);
  if (rc == VRAM_ENOMEM) {
    m->ooms++;
    char report[256];
    int n = vram_oom_report(m->pool, report, sizeof report);
    if (n <= 0 || !report[0]) mfail(m, "ENOMEM without an OOM report");
    return;
  }
  if (m->faults && rc == VRAM_EFAULT) {
    m->faults_seen++;
    return;
  }
  mfail(m, "malloc(%zu) = %s", size, vram_errname(rc));
}

static void free_everything(model *m) {
  for (int attempt = 0; m->nlive && attempt < 1000; attempt++)
    for (size_t i = m->nlive; i-- > 0;) do_free(m, i);
  if (m->nlive) mfail(m, "%zu blocks could not be freed", m->nlive);
}

/* ---- the random test ------------------------------------------------------------------ */

typedef struct random_params {
  const char *src_name;
  vram_source_kind kind;
  uint64_t seed, ops;
  int callbacks, no_split;
} random_params;

/* The model's pool, on callbacks over its host device when the run asks for them. */
static int model_pool_create(model *m, const vram_options_t *o) {
  if (!m->callbacks) return vram_pool_create(&m->pool, o);
  m->device = (host_device){.next = (uintptr_t)1 << 44, .capacity = o->sim_capacity};
  vram_source_callbacks_t cb = {.alloc = host_alloc, .free = host_free, .ctx = &m->device};
  return vram_pool_create_with_callbacks(&m->pool, o, &cb);
}

static void random_run(void **state) {
  const random_params *rp = (const random_params *)*state;
  model *mp = &g_model; /* large; one run at a time */
  memset(mp, 0, sizeof *mp);
  mp->src_name = rp->src_name;
  mp->seed = rp->seed;
  mp->callbacks = rp->callbacks;
  mp->no_split = rp->no_split;
  vt_rng rng;
  vt_rng_seed(&rng, rp->seed * 1000003ULL + (uint64_t)rp->kind);

  static const size_t caps[] = {96 << 20, 192 << 20, 384 << 20, (size_t)1 << 30};
  vram_options_t o;
  memset(&o, 0, sizeof o);
  vram_options_init(&o);
  o.source = rp->kind;
  o.sim_capacity = caps[vt_rng_below(&rng, 4)];
  o.sim_event_delay = (int)vt_rng_below(&rng, 5);
  mp->capacity = o.sim_capacity;
  mp->faults = vt_rng_below(&rng, 3) != 0;
  size_t prealloc = 0;
  if (mp->faults) {
    o.fault_fail_at = 1 + vt_rng_below(&rng, 64);
    o.fault_fail_every = 5 + vt_rng_below(&rng, 120);
  } else if (vt_rng_below(&rng, 2) && !mp->no_split) { /* no_split refuses preallocation */
    prealloc = o.sim_capacity / 4;
    o.preallocate_bytes = prealloc;
  }
  if (vt_rng_below(&rng, 3) == 0) o.limit_bytes = o.sim_capacity / 2;
  if (vt_rng_below(&rng, 4) == 0) o.release_threshold = vt_rng_below(&rng, 64 << 20);
  if (vt_rng_below(&rng, 3) == 0) o.tight_threshold = (double)vt_rng_below(&rng, 3) / 2; /* 0, .5, 1 */
  /* Virtual growth from the first large request, at a quarter of the cap, or never. */
  if (vt_rng_below(&rng, 2) == 0) o.virtual_threshold = (double)vt_rng_below(&rng, 3) / 2 * 0.5;
  size_t max_live = 50 + (size_t)vt_rng_below(&rng, MAX_LIVE - 50 + 1);

  o.no_split = mp->no_split;
  int rc = model_pool_create(mp, &o);
  if (rc) mfail(mp, "pool_create = %s", vram_errname(rc));
  /* A third of the runs record history (a small ring that overflows, half with contexts),
   * so that the recording paths of malloc and free run under faults and the checker. */
  uint64_t recording = vt_rng_below(&rng, 6);
  if (recording < 2) {
    rc = vram_history_start(mp->pool, 1000, recording ? VRAM_HISTORY_CONTEXTS : 0);
    if (rc) mfail(mp, "history_start = %s", vram_errname(rc));
  }
  check_model(mp, 1);

  for (mp->op = 1; mp->op <= rp->ops; mp->op++) {
    uint64_t r = vt_rng_below(&rng, 10000);
    if (r < 4700) { /* malloc, or free when full */
      if (mp->nlive >= max_live) {
        do_free(mp, (size_t)vt_rng_below(&rng, mp->nlive));
      } else {
        size_t size = vt_rng_logsize(&rng, 1, 64 << 20);
        do_malloc(mp, size, streams[vt_rng_below(&rng, 4)]);
      }
    } else if (r < 9300) { /* free */
      if (mp->nlive) do_free(mp, (size_t)vt_rng_below(&rng, mp->nlive));
    } else if (r < 9600) { /* record_stream */
      if (mp->nlive) {
        const live_blk *b = &mp->live[vt_rng_below(&rng, mp->nlive)];
        rc = vram_record_stream(mp->pool, b->ptr, streams[vt_rng_below(&rng, 4)]);
        if (rc) mfail(mp, "record_stream(%p) = %s", b->ptr, vram_errname(rc));
      }
    } else if (r < 9680) { /* empty_cache */
      rc = vram_empty_cache(mp->pool);
      if (rc && !(mp->faults && rc == VRAM_EFAULT)) mfail(mp, "empty_cache = %s", vram_errname(rc));
    } else if (r < 9760) { /* reset_peak */
      rc = vram_reset_peak_stats(mp->pool);
      if (rc) mfail(mp, "reset_peak = %s", vram_errname(rc));
      vram_stats_t s = vt_stats(mp->pool);
#define PEAK_IS_CURRENT(name, doc)                                                        \
  if (s.name.peak != s.name.current) mfail(mp, "after reset_peak " #name ".peak != current");
      VRAM_STAT_LIST(PEAK_IS_CURRENT)
#undef PEAK_IS_CURRENT
    } else if (r < 9840) { /* set_limit */
      size_t limit = vt_rng_below(&rng, 3) ? vt_rng_logsize(&rng, 32 << 20, mp->capacity) : 0;
      rc = vram_set_limit(mp->pool, limit, 0);
      if (rc) mfail(mp, "set_limit(%zu) = %s", limit, vram_errname(rc));
      if (vt_stats(mp->pool).limit_bytes != limit) mfail(mp, "limit_bytes != %zu", limit);
    } else if (r < 9900) { /* malloc(0) and free(NULL) */
      void *p = mp;
      rc = vram_malloc(mp->pool, 0, streams[vt_rng_below(&rng, 4)], &p);
      if (rc || p) mfail(mp, "malloc(0) = %s, %p", vram_errname(rc), p);
      rc = vram_free(mp->pool, NULL);
      if (rc) mfail(mp, "free(NULL) = %s", vram_errname(rc));
    } else if (r < 9960) { /* double free of a recently freed pointer not live again */
      if (mp->n_recent) {
        void *p = mp->recent_freed[vt_rng_below(&rng, mp->n_recent < 16 ? mp->n_recent : 16)];
        if (find_live(mp, p) < 0) {
          rc = vram_free(mp->pool, p);
          if (rc != VRAM_EDOUBLEFREE && rc != VRAM_EFOREIGN)
            mfail(mp, "second free(%p) = %s", p, vram_errname(rc));
        }
      }
    } else if (r < 9995) { /* foreign: inside a live block */
      if (mp->nlive) {
        const live_blk *b = &mp->live[vt_rng_below(&rng, mp->nlive)];
        if (b->req > 512) {
          rc = vram_free(mp->pool, (char *)b->ptr + 512);
          if (rc != VRAM_EFOREIGN) mfail(mp, "free(inside %p) = %s", b->ptr, vram_errname(rc));
        }
      }
    } else { /* free everything, then the pool holds nothing live */
      free_everything(mp);
      rc = vram_empty_cache(mp->pool);
      if (rc && !(mp->faults && rc == VRAM_EFAULT)) mfail(mp, "empty_cache = %s", vram_errname(rc));
      vram_stats_t s = vt_stats(mp->pool);
      if (s.active_bytes.current != 0) mfail(mp, "active_bytes %lld after free all + empty_cache",
                                             (long long)s.active_bytes.current);
      if (!mp->faults && s.reserved_bytes.current > (int64_t)vt_round512(prealloc) + (2 << 20))
        mfail(mp, "reserved %lld after free all + empty_cache",
              (long long)s.reserved_bytes.current);
    }
    check_model(mp, mp->op % 64 == 0);
  }
  free_everything(mp);
  check_model(mp, 1);
  vram_stats_t s = vt_stats(mp->pool);
  print_message("seed %llu: %llu ops, capacity %zu MiB, faults %s, %llu mallocs, %llu OOMs, "
                "%llu EFAULTs, %llu retries, %llu device allocs, max %zu live\n",
                (unsigned long long)mp->seed, (unsigned long long)rp->ops, mp->capacity >> 20,
                mp->faults ? "on" : "off", (unsigned long long)mp->mallocs,
                (unsigned long long)mp->ooms, (unsigned long long)mp->faults_seen,
                (unsigned long long)s.num_alloc_retries,
                (unsigned long long)s.num_device_alloc, mp->max_nlive);
  /* What the pool still holds goes back as it is destroyed, unless a planted fault fails
   * that very call (the engine cannot retry at teardown; no callback ever fails a free). */
  bool teardown_frees = vt_stats(mp->pool).reserved_bytes.current != 0;
  rc = vram_pool_destroy(mp->pool);
  if (rc) mfail(mp, "destroy of an empty pool = %s", vram_errname(rc));
  mp->pool = NULL;
  if (mp->device.outstanding && !(mp->faults && teardown_frees))
    mfail(mp, "%zu bytes never given back", mp->device.outstanding);
}

/* ---- the sweep ------------------------------------------------------------------------ */

enum { OP_MALLOC, OP_FREE, OP_RECORD, OP_EMPTY, OP_LIMIT, OP_END };
typedef struct scen_op {
  int op;
  int slot;
  size_t size; /* malloc: size; limit: bytes */
  int stream;
} scen_op;

#define M(slot, size, stream) {OP_MALLOC, slot, size, stream}
#define F(slot) {OP_FREE, slot, 0, 0}
#define R(slot, stream) {OP_RECORD, slot, 0, stream}
static const scen_op scenario[] = {
    M(0, 1000, 0),          M(1, 3 << 20, 0),       M(2, 512, 0),
    M(3, (5 << 20) + 123, 1), R(3, 2),              M(4, 70 << 10, 2),
    F(1),                   M(5, 8 << 20, 0),       F(3),
    M(6, 2 << 20, 1),       {OP_EMPTY, 0, 0, 0},    M(7, 30 << 20, 0),
    F(0),                   {OP_LIMIT, 0, 64 << 20, 0}, M(8, 48 << 20, 0),
    {OP_LIMIT, 0, 0, 0},    M(9, 48 << 20, 0),      F(5),
    F(7),                   M(10, (2 << 20) + 1, 0), M(11, 600 << 10, 1),
    R(11, 0),               F(11),                  {OP_EMPTY, 0, 0, 0},
    M(12, 100 << 20, 0),    F(9),                   M(13, 12 << 20, 2),
    M(14, 3 << 20, 0),      F(2),                   M(15, 1 << 20, 0),
    F(14),                  M(16, 7 << 20, 0),      F(6),
    F(4),                   {OP_EMPTY, 0, 0, 0},    M(17, 200 << 20, 0),
    {OP_END, 0, 0, 0},
};
#undef M
#undef F
#undef R

enum { NSLOTS = 18 };

/* Run the scenario with fault_fail_at = k (k = 0: no faults). Writes the status of every
 * step into sig (a signature to compare with the fault-free run). Returns the number of
 * steps. */
typedef struct sweep_params {
  const char *src_name;
  vram_source_kind kind;
  int callbacks, no_split;
  uint64_t every;
  int variant; /* 0: defaults; 1: release_threshold 0 (frees unmap); 2: preallocate;
                 3: tight placement always (tight_threshold 0); 4: fixed small segments
                 beside virtual large ranges from the start (virtual_threshold 0) */
} sweep_params;

static size_t sweep_run(const sweep_params *sp, uint64_t k, uint64_t every, int *sig,
                        size_t sig_cap) {
  const char *src_name = sp->src_name;
  model *mp = &g_model;
  memset(mp, 0, sizeof *mp);
  mp->src_name = src_name;
  mp->callbacks = sp->callbacks;
  mp->no_split = sp->no_split;
  mp->seed = k;
  mp->faults = k != 0;
  mp->capacity = 512 << 20;
  vram_options_t o;
  memset(&o, 0, sizeof o);
  vram_options_init(&o);
  o.source = sp->kind;
  o.sim_capacity = mp->capacity;
  o.sim_event_delay = 2;
  if (sp->variant == 1) o.release_threshold = 0;
  if (sp->variant == 2 && !sp->no_split) o.preallocate_bytes = 40 << 20;
  o.no_split = sp->no_split;
  if (sp->variant == 3) o.tight_threshold = 0;
  if (sp->variant == 4) o.virtual_threshold = 0;
  o.fault_fail_at = k;
  o.fault_fail_every = every;
  size_t n = 0;
  int rc = model_pool_create(mp, &o);
  if (rc) {
    if (!k || rc != VRAM_EFAULT) mfail(mp, "pool_create = %s", vram_errname(rc));
    if (mp->pool) mfail(mp, "failed pool_create left a pool");
    sig[n++] = rc;
    return n;
  }
  check_model(mp, 1);
  void *slot[NSLOTS] = {0};
  for (const scen_op *s = scenario; s->op != OP_END; s++) {
    mp->op++;
    rc = VRAM_OK;
    switch (s->op) {
    case OP_MALLOC: {
      size_t before = mp->nlive;
      do_malloc(mp, s->size, streams[s->stream]);
      slot[s->slot] = mp->nlive > before ? mp->live[mp->nlive - 1].ptr : NULL;
      rc = mp->nlive > before ? VRAM_OK : VRAM_ENOMEM; /* ENOMEM or EFAULT: either */
      break;
    }
    case OP_FREE: {
      int i = slot[s->slot] ? find_live(mp, slot[s->slot]) : -1;
      if (i >= 0) rc = do_free(mp, (size_t)i) ? VRAM_OK : VRAM_EFAULT;
      if (rc == VRAM_OK) slot[s->slot] = NULL;
      break;
    }
    case OP_RECORD:
      if (slot[s->slot]) {
        rc = vram_record_stream(mp->pool, slot[s->slot], streams[s->stream]);
        if (rc) mfail(mp, "record_stream = %s", vram_errname(rc));
      }
      break;
    case OP_EMPTY:
      rc = vram_empty_cache(mp->pool);
      if (rc && !(mp->faults && rc == VRAM_EFAULT)) mfail(mp, "empty_cache = %s", vram_errname(rc));
      break;
    case OP_LIMIT:
      rc = vram_set_limit(mp->pool, s->size, 0);
      if (rc) mfail(mp, "set_limit = %s", vram_errname(rc));
      break;
    }
    if (n < sig_cap) sig[n++] = rc;
    check_model(mp, 1);
  }
  /* Free what is left; with every call from k on failing, frees that need a source call
   * may keep failing: then force the pool down. */
  for (int attempt = 0; mp->nlive && attempt < (every == 1 ? 2 : 50); attempt++)
    for (size_t i = mp->nlive; i-- > 0;) {
      do_free(mp, i);
      check_model(mp, 0);
    }
  check_model(mp, 1);
  rc = vram_empty_cache(mp->pool);
  if (rc && !(mp->faults && rc == VRAM_EFAULT)) mfail(mp, "final empty_cache = %s", vram_errname(rc));
  check_model(mp, 1);
  if (mp->nlive) {
    VT_OK(vram_pool_destroy_force(mp->pool));
    mp->pool = NULL;
  } else {
    vram_stats_t s = vt_stats(mp->pool);
    if (s.allocated_bytes.current || s.active_bytes.current)
      mfail(mp, "allocated %lld active %lld at the end", (long long)s.allocated_bytes.current,
            (long long)s.active_bytes.current);
    int64_t kept = sp->variant == 2 ? (int64_t)o.preallocate_bytes : 0;
    if (!k && s.reserved_bytes.current != kept)
      mfail(mp, "%lld reserved bytes left after empty_cache, expected %lld",
            (long long)s.reserved_bytes.current, (long long)kept);
    rc = vram_pool_destroy(mp->pool);
    if (rc) mfail(mp, "destroy = %s", vram_errname(rc));
    mp->pool = NULL;
    /* As in random_run: a planted fault may fail the teardown's own frees. */
    if (mp->device.outstanding && !(k && s.reserved_bytes.current))
      mfail(mp, "%zu bytes never given back", mp->device.outstanding);
  }
  return n;
}

static void sweep(void **state) {
  const sweep_params *sp = (const sweep_params *)*state;
  enum { CAP = 64 };
  int base[CAP], sig[CAP];
  size_t nb = sweep_run(sp, 0, 0, base, CAP);
  uint64_t k, quiet = 0, differing = 0;
  /* Past the last source call a run is identical to the fault-free one; stop after 64
   * identical runs in a row (a failure absorbed by a retry also looks identical, hence
   * the margin). */
  for (k = 1; k < 5000 && quiet < 64; k++) {
    size_t n = sweep_run(sp, k, sp->every, sig, CAP);
    if (n == nb && !memcmp(sig, base, n * sizeof *sig)) {
      quiet++;
    } else {
      quiet = 0;
      differing++;
    }
  }
  print_message("sweep %s variant %d every=%llu: k = 1..%llu, %llu runs changed by the fault\n",
                sp->src_name, sp->variant, (unsigned long long)sp->every,
                (unsigned long long)(k - 1), (unsigned long long)differing);
  if (k >= 5000) fail_msg("the scenario never stopped seeing faults");
  /* Injection must have reached the scenario: the fault-free run is not all we saw. */
  assert_true(differing >= 5);
}

/* ---- main ----------------------------------------------------------------------------- */

static int usage(void) {
  fprintf(stderr, "usage: test_random_ops random SOURCE FIRST_SEED N_SEEDS OPS_PER_SEED\n"
                  "       test_random_ops sweep SOURCE\n"
                  "SOURCE: sim or sim:vmm; sim+callbacks: segments from callbacks; "
                  "+no_split: a pool that never splits a segment\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 3) return usage();
  /* "sim+callbacks": the sim's events and figures, segments from callbacks; "+no_split":
   * a pool that never splits a segment. */
  char name[48];
  snprintf(name, sizeof name, "%s", argv[2]);
  int callbacks = strstr(name, "+callbacks") != NULL, no_split = strstr(name, "+no_split") != NULL;
  char *plus = strchr(name, '+');
  if (plus) *plus = 0;
  char *picked[] = {argv[0], name};
  vt_source src;
  if (!vt_source_pick(2, picked, &src) || !src.is_sim) return usage();
  src.name = argv[2];
  if (!strcmp(argv[1], "random")) {
    if (argc != 6) return usage();
    uint64_t first = strtoull(argv[3], NULL, 10), nseeds = strtoull(argv[4], NULL, 10);
    uint64_t ops = strtoull(argv[5], NULL, 10);
    const char *env = getenv("VRAMKIT_TEST_OPS");
    if (env && *env) ops = strtoull(env, NULL, 10);
    if (!nseeds || nseeds > 64 || !ops) return usage();
    random_params params[64];
    struct CMUnitTest tests[64];
    char names[64][48];
    for (uint64_t i = 0; i < nseeds; i++) {
      params[i] = (random_params){src.name, src.kind, first + i, ops, callbacks, no_split};
      snprintf(names[i], sizeof names[i], "random_seed_%llu", (unsigned long long)(first + i));
      tests[i] = (struct CMUnitTest){names[i], random_run, NULL, teardown_model, &params[i]};
    }
    char group[64];
    snprintf(group, sizeof group, "random_ops[%s, %llu ops/seed]", src.name,
             (unsigned long long)ops);
    return _cmocka_run_group_tests(group, tests, (size_t)nseeds, NULL, NULL) ? 1 : 0;
  }
  if (!strcmp(argv[1], "sweep")) {
    sweep_params p[10];
    for (int v = 0; v < 5; v++) {
      p[2 * v] = (sweep_params){src.name, src.kind, callbacks, no_split, 0, v};
      p[2 * v + 1] = (sweep_params){src.name, src.kind, callbacks, no_split, 1, v};
    }
    const struct CMUnitTest tests[] = {
        {"sweep_fail_kth_call", sweep, NULL, teardown_model, &p[0]},
        {"sweep_fail_from_kth_call_on", sweep, NULL, teardown_model, &p[1]},
        {"sweep_release_threshold_0_fail_kth_call", sweep, NULL, teardown_model, &p[2]},
        {"sweep_release_threshold_0_fail_from_kth_call_on", sweep, NULL, teardown_model, &p[3]},
        {"sweep_preallocate_fail_kth_call", sweep, NULL, teardown_model, &p[4]},
        {"sweep_preallocate_fail_from_kth_call_on", sweep, NULL, teardown_model, &p[5]},
        {"sweep_tight_fail_kth_call", sweep, NULL, teardown_model, &p[6]},
        {"sweep_tight_fail_from_kth_call_on", sweep, NULL, teardown_model, &p[7]},
        {"sweep_virtual_fail_kth_call", sweep, NULL, teardown_model, &p[8]},
        {"sweep_virtual_fail_from_kth_call_on", sweep, NULL, teardown_model, &p[9]},
    };
    char group[64];
    snprintf(group, sizeof group, "fault_sweep[%s]", src.name);
    return cmocka_run_group_tests_name(group, tests, NULL, NULL) ? 1 : 0;
  }
  return usage();
}

/* test_conformance.c - one behaviour suite run against every memory source.
 *
 * The source comes from argv[1] (or $VRAMKIT_TEST_SOURCE): "sim", "sim:vmm", "cuda",
 * "vmm", "managed". CTest registers this program once per source. The GPU sources need
 * VRAMKIT_TEST_GPU=1 and a driver; without the variable every test is skipped (and the
 * program exits 77, which CTest reports as skipped). Tests that need fake stream handles,
 * a small device or a sim event delay run on the sim sources only.
 *
 * Each test builds its own pool and runs the engine's full invariant checker
 * (`_vram_pool_is_valid`, through VT_VALID) after every operation. Covered: round trip,
 * 512-byte alignment, size 0, exact statistics on known sequences, peaks and their reset,
 * reuse of a freed block on its stream, coalescing, empty_cache, preallocation, the hard
 * limit and its OOM report, set_limit at run time, stream-ordered reuse, block_info,
 * for_each_block, summary and JSON statistics, and destroy with live blocks.
 */
#include "vt.h"

static vt_source g_src;

/* ---- helpers ----------------------------------------------------------------------- */

static void conf_opts(vram_options_t *o) {
  memset(o, 0, sizeof *o);
  vram_options_init(o);
  o->source = g_src.kind;
  if (g_src.is_sim) o->sim_capacity = 4 * VT_GiB;
}

/* Pools a test has open: the teardown force-destroys what a failed test left behind, so
 * that the sanitizer build reports leaks of the library, not of failed tests. */
enum { MAX_OPEN = 16 };
static vram_pool_t *g_open[MAX_OPEN];

static void track(vram_pool_t *pool, int open) {
  for (int i = 0; i < MAX_OPEN; i++)
    if (g_open[i] == (open ? NULL : pool)) {
      g_open[i] = open ? pool : NULL;
      return;
    }
  if (open) fail_msg("too many open pools");
}

static int teardown_pools(void **state) {
  (void)state;
  for (int i = 0; i < MAX_OPEN; i++)
    if (g_open[i]) {
      vram_pool_destroy_force(g_open[i]);
      g_open[i] = NULL;
    }
  return 0;
}

static vram_pool_t *conf_pool(const vram_options_t *o) {
  if (!g_src.runnable) skip();
  vram_pool_t *pool = NULL;
  VT_OK(vram_pool_create(&pool, o));
  assert_non_null(pool);
  track(pool, 1);
  VT_VALID(pool);
  return pool;
}

static void conf_force(vram_pool_t *pool) {
  track(pool, 0);
  VT_OK(vram_pool_destroy_force(pool));
}

static vram_pool_t *conf_pool_default(void) {
  vram_options_t o;
  conf_opts(&o);
  return conf_pool(&o);
}

static void need_sim(void) {
  if (!g_src.runnable || !g_src.is_sim) skip();
}

/* The set-up of the cross-stream tests: a sim pool whose stream events complete at the
 * `event_delay`-th query (or when waited for), under `limit_bytes` (0: none). */
static vram_pool_t *conf_pool_events(int event_delay, size_t limit_bytes) {
  need_sim();
  vram_options_t o;
  conf_opts(&o);
  o.sim_event_delay = event_delay;
  o.limit_bytes = limit_bytes;
  return conf_pool(&o);
}

static void *conf_malloc(vram_pool_t *pool, size_t size, vram_stream_t stream) {
  void *p = NULL;
  VT_OK(vram_malloc(pool, size, stream, &p));
  VT_VALID(pool);
  assert_non_null(p);
  assert_int_equal((uintptr_t)p % 512, 0);
  return p;
}

static void conf_free(vram_pool_t *pool, void *p) {
  VT_OK(vram_free(pool, p));
  VT_VALID(pool);
}

static void conf_destroy(vram_pool_t *pool) {
  VT_VALID(pool);
  VT_OK(vram_pool_destroy(pool));
  track(pool, 0);
}

/* The block is live with these requested size and stream. */
static void expect_info(vram_pool_t *pool, void *p, size_t req, vram_stream_t stream) {
  size_t r = 0;
  vram_stream_t s = VT_STREAM(0xdead);
  VT_OK(vram_block_info(pool, p, &r, &s));
  assert_int_equal(r, req);
  assert_ptr_equal(s, stream);
}

/* A tiny JSON validator: one value, then only white space. Returns 1 if valid. */
typedef struct json_cur {
  const char *p;
  int depth;
} json_cur;

static void json_ws(json_cur *c) {
  while (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r') c->p++;
}

static int json_value(json_cur *c);

static int json_string(json_cur *c) {
  if (*c->p != '"') return 0;
  c->p++;
  while (*c->p && *c->p != '"') {
    if ((unsigned char)*c->p < 0x20) return 0;
    if (*c->p == '\\') {
      c->p++;
      if (*c->p == 'u') {
        for (int i = 1; i <= 4; i++)
          if (!isxdigit((unsigned char)c->p[i])) return 0;
        c->p += 4;
      } else if (!strchr("\"\\/bfnrt", *c->p) || !*c->p) {
        return 0;
      }
    }
    c->p++;
  }
  if (*c->p != '"') return 0;
  c->p++;
  return 1;
}

static int json_number(json_cur *c) {
  const char *s = c->p;
  if (*c->p == '-') c->p++;
  if (!isdigit((unsigned char)*c->p)) return 0;
  if (*c->p == '0') c->p++;
  else
    while (isdigit((unsigned char)*c->p)) c->p++;
  if (*c->p == '.') {
    c->p++;
    if (!isdigit((unsigned char)*c->p)) return 0;
    while (isdigit((unsigned char)*c->p)) c->p++;
  }
  if (*c->p == 'e' || *c->p == 'E') {
    c->p++;
    if (*c->p == '+' || *c->p == '-') c->p++;
    if (!isdigit((unsigned char)*c->p)) return 0;
    while (isdigit((unsigned char)*c->p)) c->p++;
  }
  return c->p > s;
}

static int json_value(json_cur *c) {
  json_ws(c);
  if (++c->depth > 64) return 0;
  int ok = 0;
  if (*c->p == '{' || *c->p == '[') {
    char close = *c->p == '{' ? '}' : ']';
    int is_obj = close == '}';
    c->p++;
    json_ws(c);
    if (*c->p == close) {
      c->p++;
      ok = 1;
    } else {
      for (;;) {
        if (is_obj) {
          json_ws(c);
          if (!json_string(c)) break;
          json_ws(c);
          if (*c->p != ':') break;
          c->p++;
        }
        if (!json_value(c)) break;
        json_ws(c);
        if (*c->p == ',') {
          c->p++;
          continue;
        }
        if (*c->p == close) {
          c->p++;
          ok = 1;
        }
        break;
      }
    }
  } else if (*c->p == '"') {
    ok = json_string(c);
  } else if (!strncmp(c->p, "true", 4)) {
    c->p += 4, ok = 1;
  } else if (!strncmp(c->p, "false", 5)) {
    c->p += 5, ok = 1;
  } else if (!strncmp(c->p, "null", 4)) {
    c->p += 4, ok = 1;
  } else {
    ok = json_number(c);
  }
  c->depth--;
  return ok;
}

static int json_is_single_object(const char *text) {
  json_cur c = {text, 0};
  json_ws(&c);
  if (*c.p != '{') return 0;
  if (!json_value(&c)) return 0;
  json_ws(&c);
  return *c.p == '\0';
}

/* ---- tests ------------------------------------------------------------------------- */

static void t_round_trip(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_default();
  void *p = conf_malloc(pool, 1000, NULL);
  expect_info(pool, p, 1000, NULL);
  vram_stats_t s = vt_stats(pool);
  assert_int_equal(s.allocation.current, 1);
  assert_int_equal(s.requested_bytes.current, 1000);
  conf_free(pool, p);
  s = vt_stats(pool);
  assert_int_equal(s.allocation.current, 0);
  assert_int_equal(s.allocated_bytes.current, 0);
  assert_int_equal(s.requested_bytes.current, 0);
  assert_int_equal(vram_pool_device(pool), 0);
  assert_int_equal(vram_pool_source(pool), g_src.kind);
  conf_destroy(pool);
}

static void t_alignment(void **state) {
  (void)state;
  static const size_t sizes[] = {1,     7,       511,         512,          513,
                                 1000,  4095,    4097,        65535,        (1 << 20) - 1,
                                 1 << 20, (1 << 20) + 1, (3 << 20) + 7, (2 << 20) + 512,
                                 33 << 20};
  enum { N = sizeof sizes / sizeof sizes[0] };
  vram_pool_t *pool = conf_pool_default();
  void *p[N];
  for (int i = 0; i < N; i++) {
    p[i] = conf_malloc(pool, sizes[i], NULL);
    expect_info(pool, p[i], sizes[i], NULL);
  }
  /* No two blocks overlap. */
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) {
      if (i == j) continue;
      uintptr_t a = (uintptr_t)p[i], b = (uintptr_t)p[j];
      assert_false(a < b + sizes[j] && b < a + sizes[i]);
    }
  for (int i = 0; i < N; i++) conf_free(pool, p[i]);
  conf_destroy(pool);
}

static void t_size_zero(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_default();
  void *keep = conf_malloc(pool, 4096, NULL);
  vram_stats_t before = vt_stats(pool);
  void *p = (void *)&before;
  VT_OK(vram_malloc(pool, 0, NULL, &p));
  assert_null(p);
  VT_VALID(pool);
  VT_OK(vram_free(pool, NULL));
  VT_VALID(pool);
  vram_stats_t after = vt_stats(pool);
  assert_int_equal(after.allocation.current, before.allocation.current);
  assert_int_equal(after.allocated_bytes.current, before.allocated_bytes.current);
  assert_int_equal(after.requested_bytes.current, before.requested_bytes.current);
  assert_int_equal(after.num_frees, before.num_frees);
  assert_int_equal(after.num_device_alloc, before.num_device_alloc);
  expect_info(pool, keep, 4096, NULL);
  conf_free(pool, keep);
  conf_destroy(pool);
}

/* allocated_bytes is the sum of 512-rounded sizes, requested_bytes of asked sizes; both
 * with exact peaks and totals, and the counters move by one per call. */
static void t_stats_exact(void **state) {
  (void)state;
  static const size_t sizes[] = {1,          100,          511,      512,     513,
                                 4096,       65537,        1 << 20,  (1 << 20) + 1,
                                 3 << 20,    9000000,      25 << 20, 777};
  enum { N = sizeof sizes / sizeof sizes[0] };
  vram_pool_t *pool = conf_pool_default();
  void *p[N];
  size_t bsize[N];
  int64_t alloc_sum = 0, req_sum = 0, alloc_total = 0, req_total = 0, peak_alloc = 0,
          peak_req = 0;
  for (int i = 0; i < N; i++) {
    vram_stats_t b = vt_stats(pool);
    p[i] = conf_malloc(pool, sizes[i], NULL);
    vram_stats_t a = vt_stats(pool);
    bsize[i] = vt_block_size(pool, p[i]);
    assert_int_equal(bsize[i], vt_round512(sizes[i]));
    alloc_sum += (int64_t)bsize[i];
    req_sum += (int64_t)sizes[i];
    alloc_total += (int64_t)bsize[i];
    req_total += (int64_t)sizes[i];
    if (alloc_sum > peak_alloc) peak_alloc = alloc_sum;
    if (req_sum > peak_req) peak_req = req_sum;
    assert_int_equal(a.allocated_bytes.current, alloc_sum);
    assert_int_equal(a.allocated_bytes.current - b.allocated_bytes.current, bsize[i]);
    assert_int_equal(a.allocated_bytes.peak, peak_alloc);
    assert_int_equal(a.allocated_bytes.total, alloc_total);
    assert_int_equal(a.requested_bytes.current, req_sum);
    assert_int_equal(a.requested_bytes.peak, peak_req);
    assert_int_equal(a.requested_bytes.total, req_total);
    assert_int_equal(a.allocation.current, i + 1);
    assert_int_equal(a.allocation.total, i + 1);
    assert_int_equal(a.num_mallocs, b.num_mallocs + 1);
    assert_int_equal(a.num_frees, b.num_frees);
    assert_int_equal(a.active_bytes.current, alloc_sum); /* nothing waits on events */
    assert_true(a.reserved_bytes.current >= a.allocated_bytes.current);
    assert_true(a.reserved_bytes.peak >= a.reserved_bytes.current);
    assert_true(a.segment.current >= 1);
  }
  /* Free in a scrambled order: current drops exactly, peaks and totals stay. */
  static const int order[] = {3, 0, 12, 7, 1, 11, 5, 9, 2, 10, 4, 8, 6};
  assert_int_equal(sizeof order / sizeof order[0], N);
  for (int k = 0; k < N; k++) {
    int i = order[k];
    vram_stats_t b = vt_stats(pool);
    conf_free(pool, p[i]);
    vram_stats_t a = vt_stats(pool);
    alloc_sum -= (int64_t)bsize[i];
    req_sum -= (int64_t)sizes[i];
    assert_int_equal(a.allocated_bytes.current, alloc_sum);
    assert_int_equal(a.requested_bytes.current, req_sum);
    assert_int_equal(a.allocated_bytes.peak, peak_alloc);
    assert_int_equal(a.requested_bytes.peak, peak_req);
    assert_int_equal(a.allocated_bytes.total, alloc_total);
    assert_int_equal(a.requested_bytes.total, req_total);
    assert_int_equal(a.allocation.current, N - k - 1);
    assert_int_equal(a.allocation.peak, N);
    assert_int_equal(a.num_frees, b.num_frees + 1);
    assert_int_equal(a.num_mallocs, b.num_mallocs);
  }
  vram_stats_t s = vt_stats(pool);
  assert_int_equal(s.num_mallocs, N);
  assert_int_equal(s.num_frees, N);
  assert_int_equal(s.allocated_bytes.current, 0);
  assert_int_equal(s.active_bytes.current, 0);
  assert_int_equal(s.num_ooms, 0);
  conf_destroy(pool);
}

static void t_reset_peak(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_default();
  void *a = conf_malloc(pool, 8 << 20, NULL);
  void *b = conf_malloc(pool, 3000, NULL);
  conf_free(pool, a);
  vram_stats_t s = vt_stats(pool);
  assert_int_equal(s.allocated_bytes.peak, (8 << 20) + 3072);
  assert_int_equal(s.requested_bytes.peak, (8 << 20) + 3000);
  VT_OK(vram_reset_peak_stats(pool));
  VT_VALID(pool);
  s = vt_stats(pool);
#define CHECK_PEAK_IS_CURRENT(name, doc) assert_int_equal(s.name.peak, s.name.current);
  VRAM_STAT_LIST(CHECK_PEAK_IS_CURRENT)
#undef CHECK_PEAK_IS_CURRENT
  assert_int_equal(s.allocated_bytes.peak, 3072);
  assert_int_equal(s.requested_bytes.peak, 3000);
  /* Totals and counters are not peaks: reset leaves them. */
  assert_int_equal(s.allocated_bytes.total, (8 << 20) + 3072);
  assert_int_equal(s.num_mallocs, 2);
  assert_int_equal(s.num_frees, 1);
  void *c = conf_malloc(pool, 1 << 20, NULL);
  s = vt_stats(pool);
  assert_int_equal(s.allocated_bytes.peak, 3072 + (1 << 20));
  conf_free(pool, c);
  conf_free(pool, b);
  s = vt_stats(pool);
  assert_int_equal(s.allocated_bytes.peak, 3072 + (1 << 20));
  conf_destroy(pool);
}

/* A freed block comes back on the same stream for the same size, with no device call. */
static void t_reuse_same_stream(void **state) {
  (void)state;
  static const size_t sizes[] = {512, 4096, 100000, 1 << 20, (1 << 20) + 512, 24 << 20};
  vram_pool_t *pool = conf_pool_default();
  void *anchor = conf_malloc(pool, 2048, NULL); /* keeps the pool from being empty */
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    void *p = conf_malloc(pool, sizes[i], NULL);
    conf_free(pool, p);
    vram_stats_t b = vt_stats(pool);
    void *q = conf_malloc(pool, sizes[i], NULL);
    vram_stats_t a = vt_stats(pool);
    assert_ptr_equal(q, p);
    assert_int_equal(a.num_device_alloc, b.num_device_alloc);
    assert_int_equal(a.reserved_bytes.current, b.reserved_bytes.current);
    conf_free(pool, q);
  }
  if (g_src.is_sim) { /* the same on a non-default stream */
    vram_stream_t s1 = VT_STREAM(0x51);
    void *p = conf_malloc(pool, 70000, s1);
    expect_info(pool, p, 70000, s1);
    conf_free(pool, p);
    vram_stats_t b = vt_stats(pool);
    void *q = conf_malloc(pool, 70000, s1);
    assert_ptr_equal(q, p);
    assert_int_equal(vt_stats(pool).num_device_alloc, b.num_device_alloc);
    conf_free(pool, q);
  }
  conf_free(pool, anchor);
  conf_destroy(pool);
}

/* Two adjacent blocks, each between live neighbours, merge into one free block when both
 * are freed: a request of their sum is served from it without a device call and, with
 * check_stat, the largest free block grows to their sum (the other cached free space is
 * filled first so that no free block that large exists before). */
static void coalesce_case(int check_stat) {
  /* Block sizes whose double stays in the same size class (small: up to 1 MiB). */
  static const size_t xs[] = {64 << 10, 256 << 10, 4 << 20, 16 << 20};
  int done = 0;
  for (size_t xi = 0; xi < sizeof xs / sizeof xs[0] && !done; xi++) {
    size_t x = xs[xi];
    vram_pool_t *pool = conf_pool_default();
    enum { NB = 8, NF = 128 };
    int nfill = 0;
    for (int i = 0; i < NB; i++) (void)conf_malloc(pool, x, NULL);
    vt_blkset set = vt_collect(pool);
    assert_int_equal(set.n, NB);
    int at = -1;
    for (size_t i = 0; i + 3 < set.n && at < 0; i++) {
      int ok = 1;
      for (size_t j = i; j < i + 3; j++)
        ok &= (uintptr_t)set.v[j].ptr + set.v[j].size == (uintptr_t)set.v[j + 1].ptr;
      if (ok) at = (int)i;
    }
    void *pa = at >= 0 ? set.v[at + 1].ptr : NULL, *pb = at >= 0 ? set.v[at + 2].ptr : NULL;
    size_t need = at >= 0 ? set.v[at + 1].size + set.v[at + 2].size : 0;
    size_t sa = at >= 0 ? set.v[at + 1].size : 0;
    vt_blkset_free(&set);
    if (at >= 0) {
      /* Fill the cached free space so that no free block of `need` bytes exists yet. */
      while (nfill < NF && vt_stats(pool).largest_free_block >= need)
        (void)conf_malloc(pool, x, NULL), nfill++;
    }
    if (at >= 0 && (!check_stat || vt_stats(pool).largest_free_block < need)) {
      conf_free(pool, pa);
      vram_stats_t s1 = vt_stats(pool);
      if (check_stat) {
        assert_true(s1.largest_free_block >= sa);
        /* On virtual segments any cached memory serves one request (granules are
         * remapped), so the figure is all cached free memory, not one block. */
        if (!g_src.is_vmm) assert_true(s1.largest_free_block < need);
      }
      conf_free(pool, pb);
      vram_stats_t s2 = vt_stats(pool);
      if (check_stat) {
        assert_true(s2.largest_free_block >= need);
        assert_true(s2.largest_free_block > s1.largest_free_block || g_src.is_vmm);
      }
      void *q = conf_malloc(pool, need, NULL);
      vram_stats_t s3 = vt_stats(pool);
      assert_int_equal(s3.num_device_alloc, s2.num_device_alloc);
      assert_ptr_equal(q, pa);
      conf_free(pool, q);
      done = 1;
    }
    conf_force(pool);
  }
  if (!done) fail_msg("no layout found with two adjacent blocks between live neighbours");
}

/* The merged block serves a request of both sizes, at the first block's address. */
static void t_coalesce(void **state) {
  (void)state;
  coalesce_case(0);
}

/* The same, seen through largest_free_block ("largest block a request could get without
 * growing"): it grows from one block to the sum when the second neighbour is freed. */
static void t_coalesce_largest_free_block(void **state) {
  (void)state;
  coalesce_case(1);
}

static void t_empty_cache(void **state) {
  (void)state;
  static const size_t sizes[] = {512, 3000, 1 << 20, 5 << 20, 100000, 40 << 20, 2 << 20};
  enum { N = sizeof sizes / sizeof sizes[0] };
  vram_pool_t *pool = conf_pool_default();
  for (int round = 0; round < 2; round++) {
    void *p[N];
    for (int i = 0; i < N; i++) p[i] = conf_malloc(pool, sizes[i], NULL);
    for (int i = 0; i < N; i++) conf_free(pool, p[i]);
    vram_stats_t b = vt_stats(pool);
    assert_true(b.reserved_bytes.current > 0);
    VT_OK(vram_empty_cache(pool));
    VT_VALID(pool);
    vram_stats_t a = vt_stats(pool);
    assert_int_equal(a.reserved_bytes.current, 0);
    assert_int_equal(a.segment.current, 0);
    assert_int_equal(a.largest_free_block, 0);
    assert_true(a.num_device_free > b.num_device_free);
    assert_int_equal(a.num_device_alloc, b.num_device_alloc);
  }
  /* A live block keeps its memory; the rest goes. */
  void *live = conf_malloc(pool, 3000, NULL);
  void *big = conf_malloc(pool, 48 << 20, NULL);
  conf_free(pool, big);
  VT_OK(vram_empty_cache(pool));
  VT_VALID(pool);
  vram_stats_t s = vt_stats(pool);
  assert_true(s.reserved_bytes.current >= s.allocated_bytes.current);
  assert_true(s.reserved_bytes.current < (int64_t)(48 << 20));
  expect_info(pool, live, 3000, NULL);
  conf_free(pool, live);
  VT_OK(vram_empty_cache(pool));
  VT_VALID(pool);
  assert_int_equal(vt_stats(pool).reserved_bytes.current, 0);
  conf_destroy(pool);
}

static void t_preallocate(void **state) {
  (void)state;
  vram_options_t o;
  conf_opts(&o);
  o.preallocate_bytes = 64 * VT_MiB;
  vram_pool_t *pool = conf_pool(&o);
  vram_stats_t s0 = vt_stats(pool);
  assert_true(s0.reserved_bytes.current >= (int64_t)(64 * VT_MiB));
  assert_true(s0.num_device_alloc >= 1);
  assert_int_equal(s0.allocated_bytes.current, 0);
  static const size_t sizes[] = {512, 3000, 65536, 1 << 20, 8 << 20, 16 << 20, 100000,
                                 2 << 20, 5 << 20, 777};
  enum { N = sizeof sizes / sizeof sizes[0] };
  void *p[N];
  for (int r = 0; r < 3; r++) {
    for (int i = 0; i < N; i++) p[i] = conf_malloc(pool, sizes[i], NULL);
    for (int i = N - 1; i >= 0; i -= 2) conf_free(pool, p[i]);
    for (int i = N - 2; i >= 0; i -= 2) conf_free(pool, p[i]);
  }
  vram_stats_t s1 = vt_stats(pool);
  assert_int_equal(s1.num_device_alloc, s0.num_device_alloc);
  assert_int_equal(s1.reserved_bytes.current, s0.reserved_bytes.current);
  conf_destroy(pool);
}

static void t_preallocate_fraction(void **state) {
  (void)state;
  need_sim();
  vram_options_t o;
  conf_opts(&o);
  o.sim_capacity = 1 * VT_GiB;
  o.preallocate_fraction = 0.25;
  vram_pool_t *pool = conf_pool(&o);
  vram_stats_t s = vt_stats(pool);
  assert_true(s.reserved_bytes.current >= (int64_t)(256 * VT_MiB));
  assert_true(s.reserved_bytes.current <= (int64_t)(1 * VT_GiB));
  void *p = conf_malloc(pool, 200 * VT_MiB, NULL);
  assert_int_equal(vt_stats(pool).num_device_alloc, s.num_device_alloc);
  conf_free(pool, p);
  conf_destroy(pool);
}

typedef struct cb_record {
  int calls;
  int last_status;
  char last_message[4096];
} cb_record;

static void record_error(void *user, vram_pool_t *pool, int status, const char *message) {
  (void)pool;
  cb_record *r = (cb_record *)user;
  r->calls++;
  r->last_status = status;
  snprintf(r->last_message, sizeof r->last_message, "%s", message ? message : "");
}

static void t_hard_limit(void **state) {
  (void)state;
  vram_options_t o;
  conf_opts(&o);
  o.limit_bytes = 64 * VT_MiB;
  vram_pool_t *pool = conf_pool(&o);
  cb_record rec;
  memset(&rec, 0, sizeof rec);
  VT_OK(vram_set_error_callback(pool, record_error, &rec));
  char report[4096];
  assert_true(vram_oom_report(pool, report, sizeof report) >= 0);
  assert_string_equal(report, "");
  assert_int_equal(vt_stats(pool).limit_bytes, 64 * VT_MiB);

  size_t big = 100 * VT_MiB;
  void *p = (void *)&rec;
  VT_EXPECT(vram_malloc(pool, big, NULL, &p), VRAM_ENOMEM);
  VT_VALID(pool);
  vram_stats_t s = vt_stats(pool);
  assert_int_equal(s.num_ooms, 1);
  assert_int_equal(s.allocation.current, 0);
  int n = vram_oom_report(pool, report, sizeof report);
  assert_true(n > 0);
  assert_int_equal((size_t)n, strlen(report));
  if (!vt_mentions_size(report, big)) fail_msg("OOM report does not name 100 MiB:\n%s", report);
  assert_true(vt_contains_ci(report, "reserved"));
  assert_true(vt_contains_ci(report, "allocated"));
  assert_int_equal(rec.calls, 1);
  assert_int_equal(rec.last_status, VRAM_ENOMEM);
  assert_true(vt_mentions_size(rec.last_message, big));

  /* The pool recovers: a smaller request works, and fills up to the limit. */
  void *a = conf_malloc(pool, 16 * VT_MiB, NULL);
  void *b = conf_malloc(pool, 40 * VT_MiB, NULL);
  VT_EXPECT(vram_malloc(pool, 32 * VT_MiB, NULL, &p), VRAM_ENOMEM);
  VT_VALID(pool);
  s = vt_stats(pool);
  assert_int_equal(s.num_ooms, 2);
  assert_true(s.reserved_bytes.current <= (int64_t)(64 * VT_MiB));
  assert_true(s.reserved_bytes.peak <= (int64_t)(64 * VT_MiB));
  expect_info(pool, a, 16 * VT_MiB, NULL);
  expect_info(pool, b, 40 * VT_MiB, NULL);
  conf_free(pool, b);
  void *c = conf_malloc(pool, 32 * VT_MiB, NULL);
  s = vt_stats(pool);
  assert_true(s.reserved_bytes.current <= (int64_t)(64 * VT_MiB));
  assert_int_equal(s.num_ooms, 2);
  conf_free(pool, a);
  conf_free(pool, c);
  /* Anything up to the limit itself fits once the pool is empty. */
  void *d = conf_malloc(pool, 60 * VT_MiB, NULL);
  conf_free(pool, d);
  assert_true(vt_stats(pool).reserved_bytes.peak <= (int64_t)(64 * VT_MiB));
  conf_destroy(pool);
}

/* Out of device memory without a limit: the sim capacity. The ladder gives cached
 * segments back before it fails. */
static void t_capacity_and_ladder(void **state) {
  (void)state;
  need_sim();
  vram_options_t o;
  conf_opts(&o);
  o.sim_capacity = 64 * VT_MiB;
  vram_pool_t *pool = conf_pool(&o);
  size_t fr = 0, total = 0;
  VT_OK(vram_mem_get_info(pool, &fr, &total));
  assert_int_equal(total, 64 * VT_MiB);
  assert_int_equal(fr, 64 * VT_MiB);
  void *p = NULL;
  VT_EXPECT(vram_malloc(pool, 65 * VT_MiB, NULL, &p), VRAM_ENOMEM);
  VT_VALID(pool);
  char report[4096];
  assert_true(vram_oom_report(pool, report, sizeof report) > 0);
  assert_true(vt_mentions_size(report, 65 * VT_MiB));
  /* Cache 40 MiB, then ask for 48 MiB: only fits once the cached memory goes back. */
  void *a = conf_malloc(pool, 40 * VT_MiB, NULL);
  VT_OK(vram_mem_get_info(pool, &fr, &total));
  assert_true(fr <= 24 * VT_MiB);
  conf_free(pool, a);
  vram_stats_t b = vt_stats(pool);
  void *c = conf_malloc(pool, 48 * VT_MiB, NULL);
  vram_stats_t s = vt_stats(pool);
  assert_int_equal(s.num_ooms, b.num_ooms);
  assert_true(s.reserved_bytes.current <= (int64_t)(64 * VT_MiB));
  if (g_src.kind == VRAM_SOURCE_SIM) /* fixed segments cannot grow: one went back */
    assert_true(s.num_device_free > b.num_device_free);
  conf_free(pool, c);
  conf_destroy(pool);
}

static void t_set_limit_runtime(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_default();
  assert_int_equal(vt_stats(pool).limit_bytes, 0);
  VT_OK(vram_set_limit(pool, 32 * VT_MiB, 0));
  VT_VALID(pool);
  assert_int_equal(vt_stats(pool).limit_bytes, 32 * VT_MiB);
  void *p = NULL;
  VT_EXPECT(vram_malloc(pool, 48 * VT_MiB, NULL, &p), VRAM_ENOMEM);
  VT_VALID(pool);
  void *a = conf_malloc(pool, 8 * VT_MiB, NULL);
  VT_OK(vram_set_limit(pool, 0, 0));
  VT_VALID(pool);
  assert_int_equal(vt_stats(pool).limit_bytes, 0);
  void *b = conf_malloc(pool, 48 * VT_MiB, NULL);
  /* A limit below what is held: cached memory above it goes back, live blocks stay. */
  conf_free(pool, b);
  VT_OK(vram_set_limit(pool, 16 * VT_MiB, 0));
  VT_VALID(pool);
  vram_stats_t s = vt_stats(pool);
  assert_int_equal(s.limit_bytes, 16 * VT_MiB);
  assert_true(s.reserved_bytes.current <= (int64_t)(16 * VT_MiB));
  expect_info(pool, a, 8 * VT_MiB, NULL);
  VT_EXPECT(vram_malloc(pool, 12 * VT_MiB, NULL, &p), VRAM_ENOMEM);
  VT_VALID(pool);
  conf_free(pool, a);
  void *c = conf_malloc(pool, 12 * VT_MiB, NULL);
  conf_free(pool, c);
  VT_OK(vram_set_limit(pool, 0, 0));
  conf_destroy(pool);
}

static void t_limit_fraction(void **state) {
  (void)state;
  need_sim();
  vram_options_t o;
  conf_opts(&o);
  o.sim_capacity = 1 * VT_GiB;
  o.limit_fraction = 0.25;
  vram_pool_t *pool = conf_pool(&o);
  assert_int_equal(vt_stats(pool).limit_bytes, 256 * VT_MiB);
  void *p = NULL;
  VT_EXPECT(vram_malloc(pool, 300 * VT_MiB, NULL, &p), VRAM_ENOMEM);
  VT_VALID(pool);
  VT_OK(vram_set_limit(pool, 0, 0.5));
  VT_VALID(pool);
  assert_int_equal(vt_stats(pool).limit_bytes, 512 * VT_MiB);
  p = conf_malloc(pool, 300 * VT_MiB, NULL);
  void *q = NULL;
  VT_EXPECT(vram_malloc(pool, 300 * VT_MiB, NULL, &q), VRAM_ENOMEM);
  VT_VALID(pool);
  conf_free(pool, p);
  conf_destroy(pool);
}

/* A block freed after record_stream(other stream) waits for that stream's event: it is
 * not handed out again (on any stream) until the event completes, then it is. */
static void t_record_stream_waits(void **state) {
  (void)state;
  enum { EVENT_DELAY = 3 };
  vram_pool_t *pool = conf_pool_events(EVENT_DELAY, 0);
  vram_stream_t s1 = VT_STREAM(0x1001), s2 = VT_STREAM(0x1002);
  static const size_t sizes[] = {4096, 3 << 20};
  for (size_t k = 0; k < 2; k++) {
    size_t size = sizes[k];
    void *p = conf_malloc(pool, size, s1);
    VT_OK(vram_record_stream(pool, p, s2));
    VT_VALID(pool);
    expect_info(pool, p, size, s1);
    vram_stats_t b = vt_stats(pool);
    conf_free(pool, p);
    vram_stats_t a = vt_stats(pool);
    /* Not allocated any more, but still active: it waits on s2's event. */
    assert_int_equal(a.allocated_bytes.current, b.allocated_bytes.current - (int64_t)size);
    assert_int_equal(a.active_bytes.current, b.active_bytes.current);
    assert_int_equal(a.num_frees, b.num_frees + 1);
    VT_EXPECT(vram_free(pool, p), VRAM_EDOUBLEFREE);
    VT_VALID(pool);
    assert_int_not_equal(vram_block_info(pool, p, NULL, NULL), VRAM_OK);
    /* The next requests of the same size on its own stream get other memory until the
     * event completes: the sim completes it at the query after sim_event_delay queries,
     * and the pool queries pending events when a request misses the cache. */
    enum { MAXN = 10000 };
    static void *held[MAXN];
    int n = 0, reused_at = -1;
    for (; n < MAXN; n++) {
      held[n] = conf_malloc(pool, size, s1);
      if (held[n] == p) {
        reused_at = n;
        n++;
        break;
      }
    }
    if (reused_at < 0)
      fail_msg("a block freed after record_stream (%zu bytes) was never reused in %d "
               "allocations of its size on its stream: pending frees are not drained",
               size, MAXN);
    assert_true(reused_at >= EVENT_DELAY);
    vram_stats_t c = vt_stats(pool);
    assert_int_equal(c.active_bytes.current, c.allocated_bytes.current);
    for (int i = 0; i < n; i++) conf_free(pool, held[i]);
  }
  VT_OK(vram_empty_cache(pool));
  VT_VALID(pool);
  assert_int_equal(vt_stats(pool).reserved_bytes.current, 0);
  conf_destroy(pool);
}

/* A block waiting on an event is active but no longer allocated, so a malloc meanwhile
 * takes active memory past allocated memory; the active peak must show it, and the totals
 * and call counts stay those of the mallocs and frees. */
static void t_active_peak_pending(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_events(1000, 0); /* the event completes only when waited for */
  vram_stream_t s1 = VT_STREAM(0x2001), s2 = VT_STREAM(0x2002);
  const int64_t size = 64 << 10;
  void *p = conf_malloc(pool, (size_t)size, s1);
  VT_OK(vram_record_stream(pool, p, s2));
  conf_free(pool, p);
  VT_OK(vram_reset_peak_stats(pool));
  vram_stats_t a = vt_stats(pool);
  assert_int_equal(a.allocated_bytes.peak, 0);
  assert_int_equal(a.active_bytes.current, size);
  assert_int_equal(a.active_bytes.peak, size);
  void *q = conf_malloc(pool, (size_t)size, s1);
  assert_ptr_not_equal(q, p);
  vram_stats_t b = vt_stats(pool);
  assert_int_equal(b.allocated_bytes.peak, size);
  assert_int_equal(b.active_bytes.current, 2 * size);
  assert_int_equal(b.active_bytes.peak, 2 * size);
  assert_int_equal(b.active.current, 2);
  assert_int_equal(b.active.peak, 2);
  assert_int_equal(b.active_bytes.total, b.allocated_bytes.total);
  assert_int_equal(b.num_mallocs, 2);
  assert_int_equal(b.num_frees, 1);
  conf_free(pool, q);
  VT_OK(vram_empty_cache(pool)); /* waits for the event */
  VT_VALID(pool);
  vram_stats_t c = vt_stats(pool);
  assert_int_equal(c.active_bytes.current, 0);
  assert_int_equal(c.active.current, 0);
  assert_int_equal(c.active_bytes.peak, 2 * size);
  assert_int_equal(c.num_frees, 2);
  VT_OK(vram_reset_peak_stats(pool));
  assert_int_equal(vt_stats(pool).active_bytes.peak, 0);
  conf_destroy(pool);
}

/* Pending frees are waited for by empty_cache and by the OOM ladder. */
static void t_pending_drained(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_events(1000000, 32 * VT_MiB);
  vram_stream_t s1 = VT_STREAM(0x2001), s2 = VT_STREAM(0x2002);
  void *p = conf_malloc(pool, 24 * VT_MiB, s1);
  VT_OK(vram_record_stream(pool, p, s2));
  conf_free(pool, p);
  vram_stats_t b = vt_stats(pool);
  assert_int_equal(b.active_bytes.current, 24 * VT_MiB);
  /* 24 MiB more only fits under the limit once the pending block is waited for. */
  void *q = conf_malloc(pool, 24 * VT_MiB, s1);
  vram_stats_t a = vt_stats(pool);
  assert_true(a.num_sync_waits > b.num_sync_waits);
  assert_int_equal(a.num_ooms, 0);
  assert_true(a.reserved_bytes.current <= (int64_t)(32 * VT_MiB));
  VT_OK(vram_record_stream(pool, q, s2));
  conf_free(pool, q);
  b = vt_stats(pool);
  assert_int_equal(b.active_bytes.current, 24 * VT_MiB);
  VT_OK(vram_empty_cache(pool));
  VT_VALID(pool);
  a = vt_stats(pool);
  assert_int_equal(a.active_bytes.current, 0);
  assert_int_equal(a.reserved_bytes.current, 0);
  assert_true(a.num_sync_waits > b.num_sync_waits);
  conf_destroy(pool);
}

/* Memory freed on one stream is not handed to another stream before an event. */
static void t_other_stream_no_early_reuse(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_events(1000000, 0);
  vram_stream_t s1 = VT_STREAM(0x3001), s2 = VT_STREAM(0x3002);
  static const size_t sizes[] = {512, 65536, 2 << 20, 10 << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    void *p = conf_malloc(pool, sizes[i], s1);
    conf_free(pool, p);
    vram_stats_t b = vt_stats(pool);
    void *q = conf_malloc(pool, sizes[i], s2);
    vram_stats_t a = vt_stats(pool);
    /* The same address may come back only after the pool waited for s1 (it released
     * s1's cached segment after synchronizing with s1, and the device reused it). */
    if (q == p) assert_true(a.num_sync_waits > b.num_sync_waits);
    expect_info(pool, q, sizes[i], s2);
    void *r = conf_malloc(pool, sizes[i], s1); /* its own stream takes it back at once */
    if (a.num_device_free == b.num_device_free) assert_ptr_equal(r, p);
    conf_free(pool, q);
    conf_free(pool, r);
  }
  conf_destroy(pool);
}

/* With a release threshold of 0 memory goes back at free: nothing stays reserved once the
 * last block is freed, whether it was the only size or one of several. */
static void t_release_threshold_zero(void **state) {
  (void)state;
  vram_options_t o;
  conf_opts(&o);
  o.release_threshold = 0;
  vram_pool_t *pool = conf_pool(&o);
  void *big = conf_malloc(pool, 64 * VT_MiB, NULL);
  conf_free(pool, big);
  assert_int_equal(vt_stats(pool).reserved_bytes.current, 0);
  void *a = conf_malloc(pool, 4 * VT_MiB, NULL);
  void *b = conf_malloc(pool, 3000, NULL);
  conf_free(pool, a);
  conf_free(pool, b);
  vram_stats_t s = vt_stats(pool);
  assert_int_equal(s.reserved_bytes.current, 0);
  assert_int_equal(s.allocated_bytes.current, 0);
  conf_destroy(pool);
}

static void t_block_info(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_default();
  vram_stream_t s = g_src.is_sim ? VT_STREAM(0x77) : NULL;
  void *a = conf_malloc(pool, 12345, NULL);
  void *b = conf_malloc(pool, 5 << 20, s);
  expect_info(pool, a, 12345, NULL);
  expect_info(pool, b, 5 << 20, s);
  size_t r = 0;
  VT_OK(vram_block_info(pool, a, &r, NULL)); /* out arguments are optional */
  assert_int_equal(r, 12345);
  VT_OK(vram_block_info(pool, b, NULL, NULL));
  conf_free(pool, a);
  assert_int_not_equal(vram_block_info(pool, a, &r, NULL), VRAM_OK);
  VT_VALID(pool);
  expect_info(pool, b, 5 << 20, s);
  conf_free(pool, b);
  conf_destroy(pool);
}

static void t_for_each_block(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_default();
  enum { N = 24 };
  void *p[N];
  size_t req[N];
  vt_rng rng;
  vt_rng_seed(&rng, 7);
  for (int i = 0; i < N; i++) {
    req[i] = vt_rng_logsize(&rng, 1, 8 << 20);
    vram_stream_t s = g_src.is_sim ? VT_STREAM(1 + i % 3) : NULL;
    p[i] = conf_malloc(pool, req[i], s);
  }
  for (int i = 0; i < N; i += 3) conf_free(pool, p[i]);
  vt_blkset set = vt_collect(pool);
  assert_int_equal(set.n, N - (N + 2) / 3);
  int64_t sum = 0;
  for (int i = 0; i < N; i++) {
    const vt_blk *b = vt_blkset_find(&set, p[i]);
    if (i % 3 == 0) {
      assert_null(b);
      continue;
    }
    assert_non_null(b);
    assert_int_equal(b->req, req[i]);
    assert_int_equal(b->size, vt_round512(req[i]));
    assert_ptr_equal(b->stream, g_src.is_sim ? VT_STREAM(1 + i % 3) : NULL);
    sum += (int64_t)b->size;
  }
  for (size_t i = 1; i < set.n; i++) /* distinct and not overlapping */
    assert_true((uintptr_t)set.v[i - 1].ptr + set.v[i - 1].size <= (uintptr_t)set.v[i].ptr);
  vt_blkset_free(&set);
  assert_int_equal(vt_stats(pool).allocated_bytes.current, sum);
  for (int i = 0; i < N; i++)
    if (i % 3) conf_free(pool, p[i]);
  set = vt_collect(pool);
  assert_int_equal(set.n, 0);
  vt_blkset_free(&set);
  conf_destroy(pool);
}

static void t_summary_and_json(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_default();
  void *a = conf_malloc(pool, 3 << 20, NULL);
  void *b = conf_malloc(pool, 1536, NULL);
  vram_stats_t s = vt_stats(pool);
  assert_int_equal(s.allocated_bytes.current, (3 << 20) + 1536);

  char small[8];
  int need = vram_summary(pool, small, sizeof small);
  assert_true(need > (int)sizeof small);
  assert_int_equal(strlen(small), sizeof small - 1);
  char *text = malloc((size_t)need + 1);
  assert_non_null(text);
  assert_int_equal(vram_summary(pool, text, (size_t)need + 1), need);
  assert_int_equal(strlen(text), (size_t)need);
  assert_true(vt_contains_ci(text, "allocated"));
  assert_true(vt_contains_ci(text, "reserved"));
  free(text);
  VT_VALID(pool);

  need = vram_stats_json(pool, small, sizeof small);
  assert_true(need > (int)sizeof small);
  assert_int_equal(strlen(small), sizeof small - 1);
  char *json = malloc((size_t)need + 1);
  assert_non_null(json);
  assert_int_equal(vram_stats_json(pool, json, (size_t)need + 1), need);
  assert_int_equal(strlen(json), (size_t)need);
  if (!json_is_single_object(json)) fail_msg("stats_json is not one JSON object:\n%s", json);
#define CHECK_KEY(name, doc) assert_non_null(strstr(json, "\"" #name "\""));
  VRAM_STAT_LIST(CHECK_KEY)
  VRAM_COUNTER_LIST(CHECK_KEY)
#undef CHECK_KEY
  char num[32];
  snprintf(num, sizeof num, "%lld", (long long)s.allocated_bytes.current);
  assert_non_null(strstr(json, num));
  free(json);
  VT_VALID(pool);
  conf_free(pool, a);
  conf_free(pool, b);
  conf_destroy(pool);
}

static void t_destroy_busy(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_default();
  void *a = conf_malloc(pool, 4000, NULL);
  void *b = conf_malloc(pool, 6 << 20, NULL);
  vram_stats_t before = vt_stats(pool);
  VT_EXPECT(vram_pool_destroy(pool), VRAM_EBUSY);
  VT_VALID(pool);
  vram_stats_t after = vt_stats(pool);
  assert_int_equal(after.reserved_bytes.current, before.reserved_bytes.current);
  assert_int_equal(after.num_device_free, before.num_device_free);
  expect_info(pool, a, 4000, NULL);
  expect_info(pool, b, 6 << 20, NULL);
  void *c = conf_malloc(pool, 1 << 20, NULL);
  conf_free(pool, a);
  VT_EXPECT(vram_pool_destroy(pool), VRAM_EBUSY);
  VT_VALID(pool);
  conf_free(pool, b);
  conf_free(pool, c);
  conf_destroy(pool);

  /* destroy_force frees live blocks (the sanitizer build checks that nothing leaks). */
  pool = conf_pool_default();
  for (int i = 0; i < 10; i++) (void)conf_malloc(pool, (size_t)(i + 1) * 300000, NULL);
  conf_force(pool);
}

static void t_mem_info(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_default();
  size_t fr = 0, total = 0;
  VT_OK(vram_mem_get_info(pool, &fr, &total));
  assert_true(total > 0);
  assert_true(fr <= total);
  if (g_src.is_sim) {
    assert_int_equal(total, 4 * VT_GiB);
    void *p = conf_malloc(pool, 100 * VT_MiB, NULL);
    size_t fr2 = 0, total2 = 0;
    VT_OK(vram_mem_get_info(pool, &fr2, &total2));
    assert_int_equal(total2, total);
    assert_true(fr2 + (size_t)vt_stats(pool).reserved_bytes.current <= total);
    assert_true(fr2 <= fr - 100 * VT_MiB);
    conf_free(pool, p);
  }
  conf_destroy(pool);
}

static void t_devices(void **state) {
  (void)state;
  need_sim();
  int count = 0;
  VT_OK(vram_device_count(g_src.kind, &count));
  assert_int_equal(count, 8);
  vram_options_t o;
  conf_opts(&o);
  o.device = 7;
  vram_pool_t *pool = conf_pool(&o);
  assert_int_equal(vram_pool_device(pool), 7);
  void *p = conf_malloc(pool, 1000, NULL);
  conf_free(pool, p);
  conf_destroy(pool);
}

int main(int argc, char **argv) {
  if (!vt_source_pick(argc, argv, &g_src)) {
    fprintf(stderr, "test_conformance: unknown source '%s'\n", g_src.name);
    return 2;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(t_round_trip, teardown_pools),
      cmocka_unit_test_teardown(t_alignment, teardown_pools),
      cmocka_unit_test_teardown(t_size_zero, teardown_pools),
      cmocka_unit_test_teardown(t_stats_exact, teardown_pools),
      cmocka_unit_test_teardown(t_reset_peak, teardown_pools),
      cmocka_unit_test_teardown(t_reuse_same_stream, teardown_pools),
      cmocka_unit_test_teardown(t_coalesce, teardown_pools),
      cmocka_unit_test_teardown(t_coalesce_largest_free_block, teardown_pools),
      cmocka_unit_test_teardown(t_empty_cache, teardown_pools),
      cmocka_unit_test_teardown(t_preallocate, teardown_pools),
      cmocka_unit_test_teardown(t_preallocate_fraction, teardown_pools),
      cmocka_unit_test_teardown(t_hard_limit, teardown_pools),
      cmocka_unit_test_teardown(t_capacity_and_ladder, teardown_pools),
      cmocka_unit_test_teardown(t_set_limit_runtime, teardown_pools),
      cmocka_unit_test_teardown(t_limit_fraction, teardown_pools),
      cmocka_unit_test_teardown(t_record_stream_waits, teardown_pools),
      cmocka_unit_test_teardown(t_active_peak_pending, teardown_pools),
      cmocka_unit_test_teardown(t_pending_drained, teardown_pools),
      cmocka_unit_test_teardown(t_other_stream_no_early_reuse, teardown_pools),
      cmocka_unit_test_teardown(t_release_threshold_zero, teardown_pools),
      cmocka_unit_test_teardown(t_block_info, teardown_pools),
      cmocka_unit_test_teardown(t_for_each_block, teardown_pools),
      cmocka_unit_test_teardown(t_summary_and_json, teardown_pools),
      cmocka_unit_test_teardown(t_destroy_busy, teardown_pools),
      cmocka_unit_test_teardown(t_mem_info, teardown_pools),
      cmocka_unit_test_teardown(t_devices, teardown_pools),
  };
  char group[64];
  snprintf(group, sizeof group, "conformance[%s]", g_src.name);
  int failed = cmocka_run_group_tests_name(group, tests, NULL, NULL);
  if (failed) return 1;
  return g_src.runnable ? 0 : 77; /* 77: CTest's SKIP_RETURN_CODE */
}

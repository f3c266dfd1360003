/* conformance_blocks.c - conformance tests of round trip, alignment, size 0, exact
 * statistics and peaks, reuse on the same stream, coalescing and empty_cache.
 * test_conformance.c says how the suite runs. */
#include "conformance.h"

void t_round_trip(void **state) {
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

void t_alignment(void **state) {
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

void t_size_zero(void **state) {
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
void t_stats_exact(void **state) {
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

void t_reset_peak(void **state) {
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
void t_reuse_same_stream(void **state) {
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
void t_coalesce(void **state) {
  (void)state;
  coalesce_case(0);
}

/* The same, seen through largest_free_block ("largest block a request could get without
 * growing"): it grows from one block to the sum when the second neighbour is freed. */
void t_coalesce_largest_free_block(void **state) {
  (void)state;
  coalesce_case(1);
}

void t_empty_cache(void **state) {
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

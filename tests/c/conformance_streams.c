/* conformance_streams.c - conformance tests of stream-ordered reuse: record_stream and the
 * events a free waits for, active peaks while blocks wait, draining, blocks borrowed across
 * streams, and the release threshold. test_conformance.c says how the suite runs. */
#include "conformance.h"

/* A block freed after record_stream(other stream) waits for that stream's event: it is
 * not handed out again (on any stream) until the event completes, then it is. */
void t_record_stream_waits(void **state) {
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
void t_active_peak_pending(void **state) {
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
void t_pending_drained(void **state) {
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
void t_other_stream_no_early_reuse(void **state) {
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
     * s1's cached segment after synchronizing with s1, and the device reused it), or
     * after s2 was made to wait for s1 (a borrowed block). */
    if (q == p)
      assert_true(a.num_sync_waits > b.num_sync_waits ||
                  a.num_stream_borrows > b.num_stream_borrows);
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
void t_release_threshold_zero(void **state) {
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

/* A preallocated pool whose limit is its preallocation (dask-cuda's rmm_pool_size equal to
 * rmm_maximum_pool_size) serves every stream from that memory: a request on another stream,
 * which cannot grow, borrows a free block of the default stream's arena with no device
 * call. The block is the borrowing stream's (block_info, for_each_block), and its free
 * waits for that stream before the memory is reused. */
void t_borrow_preallocated(void **state) {
  (void)state;
  vram_options_t o;
  conf_opts(&o);
  o.preallocate_bytes = o.limit_bytes = 128 * VT_MiB; /* room for the blocks left waiting */
  if (g_src.is_sim) o.sim_event_delay = 1000000; /* completes only when waited for */
  vram_pool_t *pool = conf_pool(&o);
  vram_stats_t s0 = vt_stats(pool);
  vram_stream_t s1 = VT_STREAM(0x4001);
  static const size_t sizes[] = {512, 3000, 1 << 20, 8 << 20, 40 << 20};
  enum { N = sizeof sizes / sizeof sizes[0] };
  for (int i = 0; i < N; i++) {
    void *p = conf_malloc(pool, sizes[i], s1);
    expect_info(pool, p, sizes[i], s1);
    vt_blkset set = vt_collect(pool);
    assert_int_equal(set.n, 1);
    assert_ptr_equal(set.v[0].stream, s1);
    vt_blkset_free(&set);
    conf_free(pool, p);
    /* Freed, but still active: it waits for s1's work. */
    vram_stats_t a = vt_stats(pool);
    assert_true(a.active_bytes.current - a.allocated_bytes.current >= (int64_t)sizes[i]);
    if (g_src.is_sim) {
      void *q = conf_malloc(pool, sizes[i], NULL);
      assert_ptr_not_equal(q, p);
      conf_free(pool, q);
    }
  }
  vram_stats_t s = vt_stats(pool);
  assert_int_equal(s.num_device_alloc, s0.num_device_alloc);
  assert_int_equal(s.reserved_bytes.current, s0.reserved_bytes.current);
  assert_int_equal(s.num_stream_borrows, N);
  assert_int_equal(s.num_ooms, 0);
  conf_destroy(pool);
}

/* Under a limit, a request whose stream's arena cannot grow takes the free part of another
 * stream's fixed segment, which a live block keeps from going back, instead of failing.
 * (Virtual segments move granules between streams' ranges instead: nothing to borrow.) */
void t_borrow_under_limit(void **state) {
  (void)state;
  need_sim();
  if (g_src.is_vmm) return;
  vram_options_t o;
  conf_opts(&o);
  o.sim_event_delay = 1000000;
  o.limit_bytes = 24 * VT_MiB;
  o.large_blocks = VRAM_LARGE_FIXED;
  o.virtual_threshold = 1.0;
  vram_pool_t *pool = conf_pool(&o);
  vram_stream_t s1 = VT_STREAM(0x5001), s2 = VT_STREAM(0x5002);
  conf_free(pool, conf_malloc(pool, 24 * VT_MiB, s1));
  void *keep = conf_malloc(pool, 4 * VT_MiB, s1);
  vram_stats_t b = vt_stats(pool);
  void *q = conf_malloc(pool, 16 * VT_MiB, s2);
  vram_stats_t a = vt_stats(pool);
  expect_info(pool, q, 16 * VT_MiB, s2);
  assert_int_equal(a.num_stream_borrows, b.num_stream_borrows + 1);
  assert_int_equal(a.num_device_alloc, b.num_device_alloc);
  assert_int_equal(a.num_ooms, 0);
  /* s1 gets the memory back once s2's work is waited for; the limit still holds. */
  conf_free(pool, q);
  void *r = conf_malloc(pool, 16 * VT_MiB, s1);
  expect_info(pool, r, 16 * VT_MiB, s1);
  assert_true(vt_stats(pool).reserved_bytes.peak <= (int64_t)(24 * VT_MiB));
  conf_free(pool, r);
  conf_free(pool, keep);
  conf_destroy(pool);
}

/* With room to grow, another stream's request takes memory of its own, as before there was
 * borrowing: a borrow costs an event and a stream wait on every such request, and ties the
 * two streams' work together; growing once costs neither again. */
void t_preallocated_with_room_grows(void **state) {
  (void)state;
  vram_options_t o;
  conf_opts(&o);
  o.preallocate_bytes = 64 * VT_MiB;
  vram_pool_t *pool = conf_pool(&o);
  vram_stats_t s0 = vt_stats(pool);
  void *p = conf_malloc(pool, 8 * VT_MiB, VT_STREAM(0x4101));
  vram_stats_t s1 = vt_stats(pool);
  assert_int_equal(s1.num_stream_borrows, 0);
  assert_true(s1.reserved_bytes.current > s0.reserved_bytes.current);
  conf_free(pool, p);
  conf_destroy(pool);
}

/* test_source_extras.c - what only some sources offer: prefetch (managed) and peer access
 * (virtual memory). Elsewhere each is a clear VRAM_EUNSUPPORTED that changes nothing; on
 * sim:vmm peer access checks the device. Also: releasing mapped memory reports a failing
 * source call instead of hiding it, virtual memory keeps idle granules mapped within its
 * allowance and recycles them past it, fixed segments follow the tight placement option,
 * and device counts resolve AUTO; a failing event call while a stream borrows memory of
 * another stream's arena fails that request alone. The pool stays valid after every call. */
#include "vt.h"

static vram_pool_t *make_pool(vram_source_kind kind) { return vt_pool_new(kind, 1 * VT_GiB); }

static void t_prefetch_unsupported_off_managed(void **state) {
  (void)state;
  vram_source_kind kinds[] = {VRAM_SOURCE_SIM, VRAM_SOURCE_SIM_VMM};
  for (int k = 0; k < 2; k++) {
    vram_pool_t *pool = make_pool(kinds[k]);
    void *p = NULL;
    VT_OK(vram_malloc(pool, 3 << 20, NULL, &p));
    vram_stats_t before = vt_stats(pool);
    VT_EXPECT(vram_prefetch(pool, p, 3 << 20, 1, NULL), VRAM_EUNSUPPORTED);
    VT_EXPECT(vram_prefetch(pool, NULL, 1, 1, NULL), VRAM_EINVAL);
    VT_VALID(pool);
    vram_stats_t after = vt_stats(pool);
    assert_int_equal(after.allocated_bytes.current, before.allocated_bytes.current);
    assert_int_equal(after.reserved_bytes.current, before.reserved_bytes.current);
    VT_OK(vram_free(pool, p));
    VT_VALID(pool);
    VT_OK(vram_pool_destroy(pool));
  }
}

static void t_peer_access(void **state) {
  (void)state;
  vram_pool_t *fixed = make_pool(VRAM_SOURCE_SIM);
  VT_EXPECT(vram_enable_peer_access(fixed, 1), VRAM_EUNSUPPORTED);
  VT_VALID(fixed);
  VT_OK(vram_pool_destroy(fixed));

  vram_pool_t *vmm = make_pool(VRAM_SOURCE_SIM_VMM);
  void *p = NULL;
  VT_OK(vram_malloc(vmm, 5 << 20, NULL, &p));
  VT_OK(vram_enable_peer_access(vmm, 1));
  VT_EXPECT(vram_enable_peer_access(vmm, -1), VRAM_EDEVICE);
  VT_EXPECT(vram_enable_peer_access(vmm, 99), VRAM_EDEVICE);
  VT_EXPECT(vram_enable_peer_access(NULL, 1), VRAM_EINVAL);
  VT_VALID(vmm);
  size_t requested = 0;
  VT_OK(vram_block_info(vmm, p, &requested, NULL));
  assert_int_equal(requested, 5 << 20);
  VT_OK(vram_free(vmm, p));
  VT_VALID(vmm);
  VT_OK(vram_pool_destroy(vmm));
}

/* Whatever call of the release path fails, empty_cache either gives everything back or
 * says that it could not: never VRAM_OK with memory still held. */
static void t_release_failure_reported(void **state) {
  (void)state;
  vram_source_kind kinds[] = {VRAM_SOURCE_SIM, VRAM_SOURCE_SIM_VMM};
  for (int k = 0; k < 2; k++) {
    int failures_seen = 0;
    for (uint64_t fail_at = 1; fail_at <= 8; fail_at++) {
      vram_options_t o;
      vram_options_init(&o);
      o.source = kinds[k];
      o.sim_capacity = 1 * VT_GiB;
      o.fault_fail_at = fail_at;
      vram_pool_t *pool = NULL;
      VT_OK(vram_pool_create(&pool, &o));
      void *p = NULL;
      if (vram_malloc(pool, 5 << 20, NULL, &p) == VRAM_OK) VT_OK(vram_free(pool, p));
      VT_VALID(pool);
      int rc = vram_empty_cache(pool);
      VT_VALID(pool);
      int64_t held = vt_stats(pool).reserved_bytes.current;
      if (rc == VRAM_OK) assert_int_equal(held, 0);
      else failures_seen++;
      VT_OK(vram_pool_destroy(pool));
    }
    assert_true(failures_seen > 0); /* some fail_at did land in the release path */
  }
}

/* Virtual memory keeps idle granules mapped while the pool holds at most its allocated peak
 * plus 1/64 (granules.c): a request that lands on unmapped space then maps without first
 * unmapping what is idle. Past that allowance idle granules are recycled before the pool
 * maps more. */
static void t_vmm_idle_allowance(void **state) {
  (void)state;
  vram_pool_t *pool = make_pool(VRAM_SOURCE_SIM_VMM);
  void *a = NULL, *b = NULL, *guard = NULL, *c = NULL, *d = NULL;
  VT_OK(vram_malloc(pool, 630 * VT_MiB, NULL, &a));
  VT_OK(vram_malloc(pool, 10 * VT_MiB, NULL, &b));
  VT_OK(vram_malloc(pool, 2 * VT_MiB, NULL, &guard)); /* keeps b's hole apart from the tail */
  VT_VALID(pool);
  assert_ptr_equal(b, (char *)a + 630 * VT_MiB);
  assert_ptr_equal(guard, (char *)a + 640 * VT_MiB);
  VT_OK(vram_free(pool, b)); /* 5 idle granules; allocated peak 642 MiB */
  VT_VALID(pool);
  vram_stats_t before = vt_stats(pool);
  assert_int_equal(before.reserved_bytes.current, 642 * VT_MiB);

  /* 12 MiB does not fit b's hole: 6 new granules, and 654 MiB held is within the
   * allowance of 644 + 644/64 MiB, so b's granules stay mapped. */
  VT_OK(vram_malloc(pool, 12 * VT_MiB, NULL, &c));
  VT_VALID(pool);
  assert_ptr_equal(c, (char *)a + 642 * VT_MiB);
  vram_stats_t kept = vt_stats(pool);
  assert_int_equal(kept.reserved_bytes.current, 654 * VT_MiB);
  assert_int_equal(kept.num_device_free, before.num_device_free);

  /* With a and c freed, 640 MiB of the low end is idle. 650 MiB does not fit there and
   * would hold 1292 MiB against an allowance of 652 + 652/64: idle granules go back
   * first, down to the allowance. */
  VT_OK(vram_free(pool, c));
  VT_OK(vram_free(pool, a));
  VT_VALID(pool);
  VT_OK(vram_malloc(pool, 650 * VT_MiB, NULL, &d));
  VT_VALID(pool);
  vram_stats_t recycled = vt_stats(pool);
  assert_true(recycled.num_device_free > kept.num_device_free);
  assert_true((size_t)recycled.reserved_bytes.current >= 652 * VT_MiB);
  assert_true((size_t)recycled.reserved_bytes.current <= 652 * VT_MiB + 652 * VT_MiB / 64 + 2 * VT_MiB);

  VT_OK(vram_free(pool, d));
  VT_OK(vram_free(pool, guard));
  VT_VALID(pool);
  VT_OK(vram_pool_destroy(pool));
}

/* Tight placement on fixed segments: a large request past the threshold gets a segment of
 * its own size instead of a cut of a bigger fully free one, the bigger one goes back when
 * keeping it would raise the peak, and where no segment can be had it is cut after all. */
static vram_pool_t *make_tight_pool(double threshold, size_t limit) {
  vram_options_t o;
  vram_options_init(&o);
  o.source = VRAM_SOURCE_SIM;
  o.sim_capacity = 1 * VT_GiB;
  o.tight_threshold = threshold;
  o.limit_bytes = limit;
  o.large_blocks = VRAM_LARGE_FIXED; /* tight placement is for fixed large segments */
  return vt_pool_from(&o);
}

/* Allocate 20 MiB, free it, allocate 4 MiB; returns whether the 4 MiB request got a segment
 * of its own (a device allocation) rather than a cut of the cached one. Addresses cannot
 * tell: the source may hand the released range out again. Checked after every call. */
static int small_after_big_gets_own_segment(vram_pool_t *pool, void **second) {
  void *first = NULL;
  VT_OK(vram_malloc(pool, 20 * VT_MiB, NULL, &first));
  VT_VALID(pool);
  VT_OK(vram_free(pool, first));
  VT_VALID(pool);
  uint64_t device_allocs = vt_stats(pool).num_device_alloc;
  VT_OK(vram_malloc(pool, 4 * VT_MiB, NULL, second));
  VT_VALID(pool);
  return vt_stats(pool).num_device_alloc != device_allocs;
}

static void t_tight_threshold(void **state) {
  (void)state;
  void *p = NULL;

  /* Default (1 = never): the cached 20 MiB segment is cut, no second device call. */
  vram_pool_t *loose = make_tight_pool(1.0, 0);
  assert_false(small_after_big_gets_own_segment(loose, &p));
  vram_stats_t s = vt_stats(loose);
  assert_int_equal(s.num_device_alloc, 1);
  assert_int_equal(s.reserved_bytes.current, 20 * VT_MiB);
  VT_OK(vram_free(loose, p));
  VT_OK(vram_pool_destroy(loose));

  /* Always tight: a 4 MiB segment of its own; keeping the 20 MiB one beside it would raise
   * the peak, so it went back. */
  vram_pool_t *tight = make_tight_pool(0.0, 0);
  assert_true(small_after_big_gets_own_segment(tight, &p));
  s = vt_stats(tight);
  assert_int_equal(s.num_device_alloc, 2);
  assert_int_equal(s.num_device_free, 1);
  assert_int_equal(s.reserved_bytes.current, 4 * VT_MiB);
  assert_int_equal(s.reserved_bytes.peak, 20 * VT_MiB);
  size_t requested = 0;
  VT_OK(vram_block_info(tight, p, &requested, NULL));
  assert_int_equal(requested, 4 * VT_MiB);
  VT_OK(vram_free(tight, p));
  VT_VALID(tight);
  VT_OK(vram_pool_destroy(tight));

  /* Always tight, but a 21 MiB limit leaves no room for a second segment: cut after all. */
  vram_pool_t *capped = make_tight_pool(0.0, 21 * VT_MiB);
  assert_false(small_after_big_gets_own_segment(capped, &p));
  s = vt_stats(capped);
  /* Past half the limit the 20 MiB went to a virtual range, where under a limit every
   * granule is a mapping of its own: ten, and none for the 4 MiB. */
  assert_int_equal(s.num_device_alloc, 10);
  assert_int_equal(s.num_ooms, 0);
  VT_OK(vram_free(capped, p));
  VT_OK(vram_pool_destroy(capped));

  /* Half of a 1 GiB limit: 24 MiB is well under it, so the segment is cut as by default. */
  vram_pool_t *half = make_tight_pool(0.5, 1 * VT_GiB);
  assert_false(small_after_big_gets_own_segment(half, &p));
  VT_OK(vram_free(half, p));
  VT_OK(vram_pool_destroy(half));

  /* Under a 64 MiB limit, a 4 MiB block carved from the cached 20 MiB segment pins it, and
   * 48 MiB more do not fit; the report points at tight placement, with which they do. */
  for (int tight_on = 0; tight_on < 2; tight_on++) {
    vram_pool_t *pool = make_tight_pool(tight_on ? 0.0 : 1.0, 64 * VT_MiB);
    void *b4 = NULL, *b48 = NULL;
    assert_int_equal(small_after_big_gets_own_segment(pool, &b4), tight_on);
    if (tight_on) {
      VT_OK(vram_malloc(pool, 48 * VT_MiB, NULL, &b48));
      VT_OK(vram_free(pool, b48));
    } else {
      VT_EXPECT(vram_malloc(pool, 48 * VT_MiB, NULL, &b48), VRAM_ENOMEM);
      char report[2048];
      assert_true(vram_oom_report(pool, report, sizeof report) > 0);
      if (!strstr(report, "VRAMKIT_TIGHT_THRESHOLD=0"))
        fail_msg("the OOM report does not suggest tight placement:\n%s", report);
    }
    VT_VALID(pool);
    VT_OK(vram_free(pool, b4));
    VT_OK(vram_pool_destroy(pool));
  }

  /* Out of range or NaN: refused at creation. */
  vram_options_t o;
  vram_options_init(&o);
  o.source = VRAM_SOURCE_SIM;
  vram_pool_t *none = NULL;
  double bad[] = {-0.1, 1.5, NAN};
  for (int i = 0; i < 3; i++) {
    o.tight_threshold = bad[i];
    VT_EXPECT(vram_pool_create(&none, &o), VRAM_EINVAL);
    assert_null(none);
  }
}

static void t_device_count_auto(void **state) {
  (void)state;
  int n = 0;
  VT_OK(vram_device_count(VRAM_SOURCE_AUTO, &n));
  assert_true(n >= 1);
  VT_OK(vram_device_count(VRAM_SOURCE_SIM, &n));
  assert_int_equal(n, 8);
  VT_EXPECT(vram_device_count(VRAM_SOURCE_SIM, NULL), VRAM_EINVAL);
}

/* A preallocation the size of the device, a live block on the default stream, and a
 * request on another stream, with the source failing from call k on. Where the failure
 * lands in the borrow (the event recorded on the owner's stream, or the borrowing
 * stream's wait), the request fails with the source's error and nothing else changes. */
static void t_borrow_failure_changes_nothing(void **state) {
  (void)state;
  vram_source_kind kinds[] = {VRAM_SOURCE_SIM, VRAM_SOURCE_SIM_VMM};
  for (int k = 0; k < 2; k++) {
    int failed_borrows = 0;
    /* The creation makes one call on sim, one per mapping on sim:vmm. */
    for (uint64_t fail_at = 1; fail_at <= 48; fail_at++) {
      vram_options_t o;
      vram_options_init(&o);
      o.source = kinds[k];
      o.sim_capacity = 64 * VT_MiB;
      o.preallocate_bytes = 64 * VT_MiB;
      o.fault_fail_at = fail_at;
      o.fault_fail_every = 1;
      vram_pool_t *pool = NULL;
      if (vram_pool_create(&pool, &o) != VRAM_OK) continue; /* it landed in the creation */
      void *own = NULL, *other = NULL;
      VT_OK(vram_malloc(pool, 3 << 20, NULL, &own));
      vram_stats_t before = vt_stats(pool);
      int rc = vram_malloc(pool, 5 << 20, VT_STREAM(0x7001), &other);
      VT_VALID(pool);
      vram_stats_t after = vt_stats(pool);
      if (rc == VRAM_OK) {
        assert_int_equal(after.num_stream_borrows, 1);
        /* Its free records an event on the borrowing stream: if that call fails, the
         * block stays live, as after any failed cross-stream free. */
        if (vram_free(pool, other) != VRAM_OK) VT_OK(vram_block_info(pool, other, NULL, NULL));
      } else {
        assert_int_equal(rc, VRAM_EFAULT);
        failed_borrows++;
        assert_null(other);
        assert_int_equal(after.allocated_bytes.current, before.allocated_bytes.current);
        assert_int_equal(after.reserved_bytes.current, before.reserved_bytes.current);
        assert_int_equal(after.num_stream_borrows, 0);
      }
      size_t requested = 0;
      VT_OK(vram_block_info(pool, own, &requested, NULL));
      assert_int_equal(requested, 3 << 20);
      VT_OK(vram_free(pool, own));
      VT_VALID(pool);
      vram_pool_destroy_force(pool);
    }
    assert_true(failed_borrows > 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_prefetch_unsupported_off_managed),
      cmocka_unit_test(t_peer_access),
      cmocka_unit_test(t_release_failure_reported),
      cmocka_unit_test(t_vmm_idle_allowance),
      cmocka_unit_test(t_tight_threshold),
      cmocka_unit_test(t_device_count_auto),
      cmocka_unit_test(t_borrow_failure_changes_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

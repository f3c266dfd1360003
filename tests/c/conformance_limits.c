/* conformance_limits.c - conformance tests of preallocation, the hard limit and its OOM
 * report, the capacity and the OOM ladder, set_limit at run time, limits as fractions.
 * test_conformance.c says how the suite runs. */
#include "conformance.h"

void t_preallocate(void **state) {
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

/* A preallocation equal to a limit that is not a whole number of granules (90% and 90%,
 * say) holds what the limit allows, rounded down to the granule, instead of failing
 * because rounding up would pass the limit. */
void t_preallocate_at_limit(void **state) {
  (void)state;
  vram_options_t o;
  conf_opts(&o);
  o.preallocate_bytes = o.limit_bytes = 65 * VT_MiB + 512 * 1024;
  vram_pool_t *pool = conf_pool(&o);
  vram_stats_t s = vt_stats(pool);
  assert_true(s.reserved_bytes.current <= (int64_t)o.limit_bytes);
  assert_true(s.reserved_bytes.current > (int64_t)(o.limit_bytes - 2 * VT_MiB));
  void *p = conf_malloc(pool, 60 * VT_MiB, NULL);
  assert_int_equal(vt_stats(pool).num_device_alloc, s.num_device_alloc);
  conf_free(pool, p);
  conf_destroy(pool);
}

void t_preallocate_fraction(void **state) {
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

void t_hard_limit(void **state) {
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
void t_capacity_and_ladder(void **state) {
  (void)state;
  need_sim();
  vram_options_t o;
  conf_opts(&o);
  o.sim_capacity = 64 * VT_MiB;
  /* The ladder of fixed segments: virtual growth would reuse the mapped granules instead. */
  o.virtual_threshold = 1.0;
  o.large_blocks = VRAM_LARGE_FIXED;
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

void t_set_limit_runtime(void **state) {
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

void t_limit_fraction(void **state) {
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

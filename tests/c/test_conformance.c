/* test_conformance.c - one behaviour suite run against every memory source.
 *
 * The source comes from argv[1] (or $VRAMKIT_TEST_SOURCE): "sim", "sim:vmm", "cuda",
 * "vmm", "managed". CTest registers this program once per source. The GPU sources need
 * VRAMKIT_TEST_GPU=1 and a driver; without the variable every test is skipped (and the
 * program exits 77, which CTest reports as skipped). Tests that need fake stream handles,
 * a small device or a sim event delay run on the sim sources only.
 *
 * The tests live in one file per topic (conformance_*.c, declared in conformance.h); this
 * file holds the helpers they share and the list that runs them.
 *
 * Each test builds its own pool and runs the engine's full invariant checker
 * (`_vram_pool_is_valid`, through VT_VALID) after every operation. Covered: round trip,
 * 512-byte alignment, size 0, exact statistics on known sequences, peaks and their reset,
 * reuse of a freed block on its stream, coalescing, empty_cache, preallocation, the hard
 * limit and its OOM report, set_limit at run time, stream-ordered reuse, block_info,
 * for_each_block, summary and JSON statistics, and destroy with live blocks.
 */
#include "conformance.h"

vt_source g_src;

/* ---- helpers (declared in conformance.h) ------------------------------------------- */

void conf_opts(vram_options_t *o) {
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

vram_pool_t *conf_pool(const vram_options_t *o) {
  if (!g_src.runnable) skip();
  vram_pool_t *pool = NULL;
  VT_OK(vram_pool_create(&pool, o));
  assert_non_null(pool);
  track(pool, 1);
  VT_VALID(pool);
  return pool;
}

void conf_force(vram_pool_t *pool) {
  track(pool, 0);
  VT_OK(vram_pool_destroy_force(pool));
}

vram_pool_t *conf_pool_default(void) {
  vram_options_t o;
  conf_opts(&o);
  return conf_pool(&o);
}

void need_sim(void) {
  if (!g_src.runnable || !g_src.is_sim) skip();
}

/* The set-up of the cross-stream tests: a sim pool whose stream events complete at the
 * `event_delay`-th query (or when waited for), under `limit_bytes` (0: none). */
vram_pool_t *conf_pool_events(int event_delay, size_t limit_bytes) {
  need_sim();
  vram_options_t o;
  conf_opts(&o);
  o.sim_event_delay = event_delay;
  o.limit_bytes = limit_bytes;
  return conf_pool(&o);
}

void *conf_malloc(vram_pool_t *pool, size_t size, vram_stream_t stream) {
  void *p = NULL;
  VT_OK(vram_malloc(pool, size, stream, &p));
  VT_VALID(pool);
  assert_non_null(p);
  assert_int_equal((uintptr_t)p % 512, 0);
  return p;
}

void conf_free(vram_pool_t *pool, void *p) {
  VT_OK(vram_free(pool, p));
  VT_VALID(pool);
}

void conf_destroy(vram_pool_t *pool) {
  VT_VALID(pool);
  VT_OK(vram_pool_destroy(pool));
  track(pool, 0);
}

/* The block is live with these requested size and stream. */
void expect_info(vram_pool_t *pool, void *p, size_t req, vram_stream_t stream) {
  size_t r = 0;
  vram_stream_t s = VT_STREAM(0xdead);
  VT_OK(vram_block_info(pool, p, &r, &s));
  assert_int_equal(r, req);
  assert_ptr_equal(s, stream);
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
      cmocka_unit_test_teardown(t_preallocate_at_limit, teardown_pools),
      cmocka_unit_test_teardown(t_hard_limit, teardown_pools),
      cmocka_unit_test_teardown(t_capacity_and_ladder, teardown_pools),
      cmocka_unit_test_teardown(t_set_limit_runtime, teardown_pools),
      cmocka_unit_test_teardown(t_limit_fraction, teardown_pools),
      cmocka_unit_test_teardown(t_record_stream_waits, teardown_pools),
      cmocka_unit_test_teardown(t_active_peak_pending, teardown_pools),
      cmocka_unit_test_teardown(t_pending_drained, teardown_pools),
      cmocka_unit_test_teardown(t_other_stream_no_early_reuse, teardown_pools),
      cmocka_unit_test_teardown(t_release_threshold_zero, teardown_pools),
      cmocka_unit_test_teardown(t_borrow_preallocated, teardown_pools),
      cmocka_unit_test_teardown(t_borrow_under_limit, teardown_pools),
      cmocka_unit_test_teardown(t_preallocated_with_room_grows, teardown_pools),
      cmocka_unit_test_teardown(t_block_info, teardown_pools),
      cmocka_unit_test_teardown(t_for_each_block, teardown_pools),
      cmocka_unit_test_teardown(t_summary_and_json, teardown_pools),
      cmocka_unit_test_teardown(t_destroy_busy, teardown_pools),
      cmocka_unit_test_teardown(t_mem_info, teardown_pools),
      cmocka_unit_test_teardown(t_devices, teardown_pools),
      cmocka_unit_test_teardown(t_snapshot_tiles, teardown_pools),
  };
  char group[64];
  snprintf(group, sizeof group, "conformance[%s]", g_src.name);
  int failed = cmocka_run_group_tests_name(group, tests, NULL, NULL);
  if (failed) return 1;
  return g_src.runnable ? 0 : 77; /* 77: CTest's SKIP_RETURN_CODE */
}

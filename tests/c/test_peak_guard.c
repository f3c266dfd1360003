/* test_peak_guard.c - the peak guard of fixed segments (segment.c, guard_peak), on sim.
 *
 * Before a new fixed segment would raise the high-water mark, the guard gives cached
 * segments back instead. In a loop that alone made the pool pay driver calls every step:
 * a small segment and a large one go back to make room for a larger one, come back in the
 * next step, and push that one out. The guard now remembers the sizes it gave back and
 * lets the ceiling rise when one of them is asked for again, so such a loop settles; sizes
 * that never come back are still given back. What it gives back is the smallest idle
 * segment that covers its shortfall alone, else idle segments longest unused first; when
 * all of them together fall well short, the small segments stay.
 * Every step is followed by the invariant checker (vt_take, vt_give). */
#include "vt.h"
#include "pool/types.h" /* guard_ceiling */

static vram_pool_t *fixed_pool(void) {
  vram_options_t o;
  vram_options_init(&o);
  o.source = VRAM_SOURCE_SIM;
  o.sim_capacity = 8 * VT_GiB;
  o.large_blocks = VRAM_LARGE_FIXED;
  return vt_pool_from(&o);
}

static uint64_t source_calls(vram_pool_t *pool) {
  vram_stats_t s = vt_stats(pool);
  return s.num_device_alloc + s.num_device_free;
}

/* One step of the loop: a small block (its own 2 MiB small segment) and a 40 MiB block
 * live together, then a 41 MiB block that neither of their segments can hold. */
static void loop_step(vram_pool_t *pool) {
  void *small = vt_take(pool, 1 * VT_MiB), *large = vt_take(pool, 40 * VT_MiB);
  vt_give(pool, small);
  vt_give(pool, large);
  vt_give(pool, vt_take(pool, 41 * VT_MiB));
}

/* A pool that has been through the loop's first two steps. */
static vram_pool_t *pool_after_two_steps(void) {
  vram_pool_t *pool = fixed_pool();
  loop_step(pool);
  loop_step(pool);
  return pool;
}

/* The loop makes its calls in its first two steps and none after: before the guard kept
 * its ghosts it made six in every step. It still holds no more than it needs at once,
 * plus one small segment: 44 MiB, where keeping every segment would hold 84. */
static void t_a_loop_settles(void **state) {
  (void)state;
  vram_pool_t *pool = pool_after_two_steps();
  uint64_t settled = source_calls(pool);
  for (int step = 2; step < 10; step++) {
    loop_step(pool);
    assert_int_equal(source_calls(pool), settled);
  }
  vram_stats_t s = vt_stats(pool);
  assert_int_equal(s.reserved_bytes.peak, 44 * VT_MiB);
  VT_OK(vram_pool_destroy(pool));
}

/* Sizes that do not come back: each new largest block still makes the cached segments go
 * back first, so reserved memory is the one segment in use, as before. */
static void t_drifting_sizes_still_guarded(void **state) {
  (void)state;
  vram_pool_t *pool = pool_after_two_steps();
  for (size_t mib = 50; mib < 62; mib += 2) {
    uint64_t frees = vt_stats(pool).num_device_free;
    vt_give(pool, vt_take(pool, mib * VT_MiB));
    vram_stats_t s = vt_stats(pool);
    assert_true(s.num_device_free > frees);
    assert_int_equal(s.reserved_bytes.current, mib * VT_MiB);
    assert_int_equal(s.reserved_bytes.peak, mib * VT_MiB);
  }
  VT_OK(vram_pool_destroy(pool));
}

/* reset_peak_stats starts the guard again from the new peak: the ceiling a returning
 * size raised is forgotten with the peak it was measured against. */
static void t_reset_peak_lowers_the_ceiling(void **state) {
  (void)state;
  vram_pool_t *pool = pool_after_two_steps();
  assert_true(pool->guard_ceiling > 0);
  VT_OK(vram_empty_cache(pool));
  VT_OK(vram_reset_peak_stats(pool));
  assert_int_equal(pool->guard_ceiling, 0);
  VT_VALID(pool);
  /* The loop settles again from an empty pool. */
  loop_step(pool);
  loop_step(pool);
  uint64_t settled = source_calls(pool);
  loop_step(pool);
  assert_int_equal(source_calls(pool), settled);
  VT_OK(vram_pool_destroy(pool));
}

/* A new 2 MiB small segment at the peak: the guard gives back the idle 8 MiB segment, the
 * smallest that covers it, not the 100 MiB one that has been unused longest (GPT-2 over
 * six lengths gave back 1.6 GB that way, and asked for it again). */
static void t_the_smallest_segment_that_covers_it_goes_back(void **state) {
  (void)state;
  vram_pool_t *pool = fixed_pool();
  void *big = vt_take(pool, 100 * VT_MiB), *mid = vt_take(pool, 8 * VT_MiB);
  void *small[3] = {vt_take(pool, 1 * VT_MiB), vt_take(pool, 1 * VT_MiB)};
  vt_give(pool, big);
  vt_give(pool, mid);
  vram_stats_t before = vt_stats(pool);
  small[2] = vt_take(pool, 1 * VT_MiB); /* the small segment is full: a second one */
  vram_stats_t after = vt_stats(pool);
  assert_int_equal(after.num_device_free, before.num_device_free + 1);
  assert_int_equal(after.reserved_bytes.peak, before.reserved_bytes.peak);
  assert_int_equal(after.reserved_bytes.current,
                   before.reserved_bytes.current + 2 * VT_MiB - 8 * VT_MiB);
  /* The 100 MiB segment is still there: a block of that size makes no call. */
  uint64_t calls = source_calls(pool);
  vt_give(pool, vt_take(pool, 100 * VT_MiB));
  assert_int_equal(source_calls(pool), calls);
  for (int i = 0; i < 3; i++) vt_give(pool, small[i]);
  VT_OK(vram_pool_destroy(pool));
}

/* Idle segments that cannot cover the shortfall all go back, except small segments whose
 * total is under a quarter of what the large ones leave short: a new peak hundreds of
 * times their size is hardly lower without them, and small blocks soon ask for them again
 * (GPT-2 over six lengths on fixed segments: five small segments given back when its
 * longest sequence arrived, asked for again in step 10). */
static void idle_small_and_large(vram_pool_t *pool) {
  void *small = vt_take(pool, 1 * VT_MiB), *large = vt_take(pool, 4 * VT_MiB);
  vt_give(pool, small);
  vt_give(pool, large);
}

static void t_small_segments_stay_when_they_would_hardly_lower_the_peak(void **state) {
  (void)state;
  vram_pool_t *pool = fixed_pool();
  idle_small_and_large(pool);
  vram_stats_t before = vt_stats(pool);
  void *huge = vt_take(pool, 200 * VT_MiB);
  vram_stats_t after = vt_stats(pool);
  assert_int_equal(after.num_device_free, before.num_device_free + 1); /* the 4 MiB one */
  assert_int_equal(after.reserved_bytes.current, 2 * VT_MiB + 200 * VT_MiB);
  uint64_t calls = source_calls(pool);
  vt_give(pool, vt_take(pool, 1 * VT_MiB)); /* into the small segment kept */
  assert_int_equal(source_calls(pool), calls);
  vt_give(pool, huge);
  VT_OK(vram_pool_destroy(pool));
}

static void t_small_segments_go_when_they_lower_the_peak_much(void **state) {
  (void)state;
  vram_pool_t *pool = fixed_pool();
  idle_small_and_large(pool);
  vram_stats_t before = vt_stats(pool);
  void *block = vt_take(pool, 8 * VT_MiB); /* 8 MiB short; the small one is half of 4 */
  vram_stats_t after = vt_stats(pool);
  assert_int_equal(after.num_device_free, before.num_device_free + 2);
  assert_int_equal(after.reserved_bytes.current, 8 * VT_MiB);
  vt_give(pool, block);
  VT_OK(vram_pool_destroy(pool));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_a_loop_settles),
      cmocka_unit_test(t_drifting_sizes_still_guarded),
      cmocka_unit_test(t_reset_peak_lowers_the_ceiling),
      cmocka_unit_test(t_the_smallest_segment_that_covers_it_goes_back),
      cmocka_unit_test(t_small_segments_stay_when_they_would_hardly_lower_the_peak),
      cmocka_unit_test(t_small_segments_go_when_they_lower_the_peak_much),
  };
  return cmocka_run_group_tests_name("peak_guard", tests, NULL, NULL);
}

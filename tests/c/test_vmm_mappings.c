/* test_vmm_mappings.c - how a virtual-memory pool cuts what it maps into mappings (one
 * physical handle each), on sim:vmm, whose driver model refuses to unmap part of a
 * mapping as the CUDA driver does.
 *
 * Far from the cap (no limit, reserved memory within the virtual threshold's share of the
 * device) a run is mapped in pieces of up to 128 MiB that are kept; under a limit, past the
 * threshold, or with the threshold at 0, every granule is a mapping of its own, so that any
 * hole can give its memory back. Only whole idle mappings are unmapped, and a map that
 * fails part way gives back what it had mapped. Every step is followed by the invariant
 * checker (VT_VALID), which also checks where each mapping begins. */
#include "vt.h"

#define GRANULE (2 * VT_MiB)

static vram_pool_t *vmm_pool(size_t capacity, size_t limit, double threshold) {
  vram_options_t o;
  vram_options_init(&o);
  o.source = VRAM_SOURCE_SIM_VMM;
  o.sim_capacity = capacity;
  o.limit_bytes = limit;
  o.virtual_threshold = threshold;
  return vt_pool_from(&o);
}

/* No limit: 100 MiB is one mapping, reused as it is, and given back whole. */
static void t_far_from_the_cap_one_mapping(void **state) {
  (void)state;
  vram_pool_t *pool = vmm_pool(8 * VT_GiB, 0, 0.5);
  vt_give(pool, vt_take(pool, 100 * VT_MiB));
  vram_stats_t s = vt_stats(pool);
  assert_int_equal(s.num_device_alloc, 1);
  assert_int_equal(s.reserved_bytes.current, 100 * VT_MiB);
  /* Freed blocks leave their mapping in place: the next pass maps nothing. */
  vt_give(pool, vt_take(pool, 100 * VT_MiB));
  assert_int_equal(vt_stats(pool).num_device_alloc, 1);
  /* A hole behind a live block takes a request it holds, rather than the unmapped space
   * past that block. */
  void *a = vt_take(pool, 60 * VT_MiB), *b = vt_take(pool, 30 * VT_MiB), *guard = vt_take(pool, 4 * VT_MiB);
  vt_give(pool, a);
  vt_give(pool, b);
  vt_give(pool, vt_take(pool, 89 * VT_MiB));
  assert_int_equal(vt_stats(pool).num_device_alloc, 1);
  vt_give(pool, guard);
  VT_OK(vram_empty_cache(pool));
  VT_VALID(pool);
  s = vt_stats(pool);
  assert_int_equal(s.reserved_bytes.current, 0);
  assert_int_equal(s.num_device_free, 2); /* the one mapping, then the empty range */
  VT_OK(vram_pool_destroy(pool));
}

/* Pieces of up to 64 granules from where a run begins: 300 MiB is three. A run that
 * crosses a multiple of 64 granules is still one mapping when it is short enough. */
static void t_pieces_of_128_mib(void **state) {
  (void)state;
  vram_pool_t *pool = vmm_pool(8 * VT_GiB, 0, 0.5);
  void *p = vt_take(pool, 300 * VT_MiB);
  assert_int_equal(vt_stats(pool).num_device_alloc, 3);
  vt_give(pool, p);
  VT_OK(vram_pool_destroy(pool));

  pool = vmm_pool(8 * VT_GiB, 0, 0.5);
  void *below = vt_take(pool, 120 * VT_MiB); /* granules 0 to 59 */
  void *across = vt_take(pool, 20 * VT_MiB); /* 60 to 69, across granule 64 */
  VT_VALID(pool);
  assert_int_equal(vt_stats(pool).num_device_alloc, 2);
  vt_give(pool, below);
  vt_give(pool, across);
  VT_OK(vram_empty_cache(pool));
  VT_VALID(pool);
  assert_int_equal(vt_stats(pool).reserved_bytes.current, 0);
  VT_OK(vram_pool_destroy(pool));
}

/* A mapping partly in use stays; once its last block goes, it goes too. */
static void t_partly_used_mapping_stays(void **state) {
  (void)state;
  vram_pool_t *pool = vmm_pool(8 * VT_GiB, 0, 0.5);
  vt_give(pool, vt_take(pool, 100 * VT_MiB));
  void *small = vt_take(pool, 10 * VT_MiB); /* carved from the mapped free space */
  assert_int_equal(vt_stats(pool).num_device_alloc, 1);
  VT_OK(vram_empty_cache(pool));
  VT_VALID(pool);
  assert_int_equal(vt_stats(pool).reserved_bytes.current, 100 * VT_MiB);
  vt_give(pool, small);
  VT_OK(vram_empty_cache(pool));
  VT_VALID(pool);
  assert_int_equal(vt_stats(pool).reserved_bytes.current, 0);
  VT_OK(vram_pool_destroy(pool));
}

/* Far from the cap a small pool holds idle mappings up to a share of its allocated peak,
 * not two whole 128 MiB mappings: with two 64 MiB holes idle beside live blocks, a request
 * that fits neither maps at the end and takes both holes back, where a slack of 256 MiB
 * would have kept them (reserved 484 MiB over 356 live). */
static void t_small_pool_slack(void **state) {
  (void)state;
  vram_pool_t *pool = vmm_pool(8 * VT_GiB, 0, 0.5);
  void *b[6];
  for (int i = 0; i < 6; i++) b[i] = vt_take(pool, 64 * VT_MiB);
  assert_int_equal(vt_stats(pool).num_device_alloc, 6);
  vt_give(pool, b[1]);
  vt_give(pool, b[3]);
  void *big = vt_take(pool, 100 * VT_MiB);
  vram_stats_t s = vt_stats(pool);
  assert_int_equal(s.allocated_bytes.current, 356 * VT_MiB);
  assert_int_equal(s.reserved_bytes.current, 356 * VT_MiB);
  assert_int_equal(s.num_device_free, 2);
  vt_give(pool, big);
  for (int i = 0; i < 6; i++)
    if (i != 1 && i != 3) vt_give(pool, b[i]);
  VT_OK(vram_pool_destroy(pool));
}

/* Under a limit every granule is its own mapping: the hole around a small block goes back. */
static void t_under_a_limit_granules(void **state) {
  (void)state;
  vram_pool_t *pool = vmm_pool(8 * VT_GiB, 4 * VT_GiB, 0.5);
  vt_give(pool, vt_take(pool, 100 * VT_MiB));
  assert_int_equal(vt_stats(pool).num_device_alloc, 100 * VT_MiB / GRANULE);
  void *small = vt_take(pool, 10 * VT_MiB);
  VT_OK(vram_empty_cache(pool));
  VT_VALID(pool);
  assert_int_equal(vt_stats(pool).reserved_bytes.current, 10 * VT_MiB);
  vt_give(pool, small);
  VT_OK(vram_pool_destroy(pool));
}

/* With no limit, the device is the cap: past its threshold share, granules again. */
static void t_past_the_threshold_granules(void **state) {
  (void)state;
  vram_pool_t *pool = vmm_pool(1 * VT_GiB, 0, 0.5);
  void *a = vt_take(pool, 256 * VT_MiB); /* two pieces of 64 granules */
  assert_int_equal(vt_stats(pool).num_device_alloc, 2);
  void *b = vt_take(pool, 300 * VT_MiB); /* 556 MiB > 512 MiB: one mapping per granule */
  assert_int_equal(vt_stats(pool).num_device_alloc, 2 + 300 * VT_MiB / GRANULE);
  /* Near the cap a's two idle mappings count for the allowance like any idle granules: the
   * next large request, which would pass it, takes them back whole. */
  vt_give(pool, a);
  void *c = vt_take(pool, 400 * VT_MiB);
  assert_int_equal(vt_stats(pool).reserved_bytes.current, 700 * VT_MiB); /* b and c */
  vt_give(pool, b);
  vt_give(pool, c);
  VT_OK(vram_empty_cache(pool));
  VT_VALID(pool);
  assert_int_equal(vt_stats(pool).reserved_bytes.current, 0);
  VT_OK(vram_pool_destroy(pool));

  /* Threshold 0: granules from the start, the tight pool of earlier releases. */
  pool = vmm_pool(8 * VT_GiB, 0, 0.0);
  vt_give(pool, vt_take(pool, 100 * VT_MiB));
  assert_int_equal(vt_stats(pool).num_device_alloc, 100 * VT_MiB / GRANULE);
  VT_OK(vram_pool_destroy(pool));
}

/* The device holds 40 MiB under a 64 MiB limit: a 50 MiB request maps twenty granules,
 * fails on the next, and gives the twenty back, so that the memory is free for others and
 * a request that fits still succeeds. */
static void t_failed_map_gives_back(void **state) {
  (void)state;
  vram_pool_t *pool = vmm_pool(40 * VT_MiB, 64 * VT_MiB, 0.5);
  void *keep = vt_take(pool, 4 * VT_MiB);
  void *p = NULL;
  VT_EXPECT(vram_malloc(pool, 50 * VT_MiB, NULL, &p), VRAM_ENOMEM);
  VT_VALID(pool);
  vram_stats_t s = vt_stats(pool);
  assert_int_equal(s.reserved_bytes.current, 4 * VT_MiB);
  size_t requested = 0;
  VT_OK(vram_block_info(pool, keep, &requested, NULL));
  assert_int_equal(requested, 4 * VT_MiB);
  void *fits = vt_take(pool, 30 * VT_MiB);
  vt_give(pool, fits);
  vt_give(pool, keep);
  VT_OK(vram_pool_destroy(pool));
}

/* What empty_cache keeps mapped is exactly the granules that blocks in use touch: a
 * granule is idle when it lies wholly in free space, however the free space around it
 * was made. Granule by granule (threshold 0), so every idle granule can go. */
static void reserved_after_empty_cache(vram_pool_t *pool, size_t granules) {
  VT_OK(vram_empty_cache(pool));
  VT_VALID(pool);
  assert_int_equal(vt_stats(pool).reserved_bytes.current, granules * GRANULE);
}

static void t_idle_granules_are_those_in_free_space(void **state) {
  (void)state;
  vram_pool_t *pool = vmm_pool(8 * VT_GiB, 0, 0.0);
  char *a = vt_take(pool, 3 * VT_MiB);  /* [0, 3) MiB: granules 0 and 1 */
  char *b = vt_take(pool, 2 * VT_MiB);  /* [3, 5): 1 and 2 */
  char *c = vt_take(pool, 4 * VT_MiB);  /* [5, 9): 2, 3 and 4 */
  char *d = vt_take(pool, 2 * VT_MiB);  /* [9, 11): 4 and 5 */
  assert_ptr_equal(d, a + 9 * VT_MiB);
  reserved_after_empty_cache(pool, 6);
  vt_give(pool, b); /* its granules are shared with a and c: none is idle */
  reserved_after_empty_cache(pool, 6);
  vt_give(pool, c); /* [3, 9) free: granules 2 and 3 lie in it; 4 is d's too */
  reserved_after_empty_cache(pool, 4);
  char *e = vt_take(pool, 3 * VT_MiB / 2); /* [3, 4.5): granule 1 (a's too) and 2 again */
  assert_ptr_equal(e, a + 3 * VT_MiB);
  reserved_after_empty_cache(pool, 5);
  vt_give(pool, a); /* granule 0 only: 1 is e's */
  reserved_after_empty_cache(pool, 4);
  vt_give(pool, d);
  reserved_after_empty_cache(pool, 2);
  vt_give(pool, e);
  reserved_after_empty_cache(pool, 0);
  VT_OK(vram_pool_destroy(pool));
}

/* The same through a block placed at an address (vram_malloc_at): the free space in front
 * of it is split off, and for a moment two free blocks lie side by side. */
static void t_idle_granules_beside_a_placed_block(void **state) {
  (void)state;
  vram_pool_t *pool = vmm_pool(8 * VT_GiB, 0, 0.0);
  char *x = vt_take(pool, 8 * VT_MiB); /* granules 0 to 3, then all idle */
  vt_give(pool, x);
  VT_OK(vram_malloc_at(pool, x + 5 * VT_MiB, 2 * VT_MiB, NULL)); /* [5, 7): granules 2, 3 */
  VT_VALID(pool);
  reserved_after_empty_cache(pool, 2);
  char *y = vt_take(pool, 4 * VT_MiB); /* the hole in front: [0, 4), granules 0 and 1 */
  assert_ptr_equal(y, x);
  reserved_after_empty_cache(pool, 4);
  vt_give(pool, x + 5 * VT_MiB); /* free from 4 MiB on: granules 2 and 3 lie in it */
  reserved_after_empty_cache(pool, 2);
  vt_give(pool, y);
  reserved_after_empty_cache(pool, 0);
  VT_OK(vram_pool_destroy(pool));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_far_from_the_cap_one_mapping),
      cmocka_unit_test(t_pieces_of_128_mib),
      cmocka_unit_test(t_partly_used_mapping_stays),
      cmocka_unit_test(t_small_pool_slack),
      cmocka_unit_test(t_under_a_limit_granules),
      cmocka_unit_test(t_past_the_threshold_granules),
      cmocka_unit_test(t_failed_map_gives_back),
      cmocka_unit_test(t_idle_granules_are_those_in_free_space),
      cmocka_unit_test(t_idle_granules_beside_a_placed_block),
  };
  return cmocka_run_group_tests_name("vmm_mappings", tests, NULL, NULL);
}

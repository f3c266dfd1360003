/* test_malloc_at.c - putting a pool back into a layout it had: vram_malloc_at and
 * vram_segment_of.
 *
 * PyTorch's CUDA graph trees checkpoint a graph pool (which blocks are live, where) and
 * later restore it: every block live now is freed and every block of the checkpoint is
 * allocated again at its address. vram_malloc_at is that second half. The tests take a
 * layout, free it, claim it back in shuffled order and check each address, the statistics
 * and the invariants; refused claims (overlap, foreign range, wrong stream, bad arguments)
 * must change nothing. vram_segment_of answers which pool owns a live pointer, by the
 * pointer alone. Runs on the sim sources (argv[1]: "sim" or "sim:vmm", default "sim").
 */
#include "vt.h"

static vt_source g_src;

static vram_pool_t *new_pool(void) { return vt_pool_new(g_src.kind, 8 * VT_GiB); }

static int64_t allocated(vram_pool_t *pool) {
  vram_stats_t s;
  VT_OK(vram_get_stats(pool, &s));
  return s.allocated_bytes.current;
}

static void claim_back_a_freed_layout(void **state) {
  (void)state;
  vram_pool_t *pool = new_pool();
  vt_rng rng;
  vt_rng_seed(&rng, 7);
  enum { N = 40 };
  void *p[N];
  size_t size[N];
  for (int i = 0; i < N; i++) {
    size[i] = vt_rng_logsize(&rng, 100, 24 * VT_MiB);
    VT_OK(vram_malloc(pool, size[i], NULL, &p[i]));
  }
  int64_t live = allocated(pool);
  for (int i = 0; i < N; i++) VT_OK(vram_free(pool, p[i]));
  VT_VALID(pool);
  /* Shuffled, so that claims land inside free blocks, at their fronts and at their ends. */
  int order[N];
  for (int i = 0; i < N; i++) order[i] = i;
  for (int i = N - 1; i > 0; i--) {
    int j = (int)vt_rng_below(&rng, (uint64_t)i + 1), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  for (int k = 0; k < N; k++) {
    int i = order[k];
    VT_OK(vram_malloc_at(pool, p[i], size[i], NULL));
    VT_VALID(pool);
    size_t requested = 0;
    VT_OK(vram_block_info(pool, p[i], &requested, NULL));
    assert_int_equal(requested, size[i]);
  }
  assert_int_equal(allocated(pool), live);
  for (int i = 0; i < N; i++) VT_OK(vram_free(pool, p[i]));
  VT_VALID(pool);
  assert_int_equal(allocated(pool), 0);
  VT_OK(vram_pool_destroy(pool));
}

static void refused_claims_change_nothing(void **state) {
  (void)state;
  vram_pool_t *pool = new_pool();
  /* Three neighbours carved in order from one small segment; the middle one is freed. */
  enum { K = 64 * 1024 };
  void *a = NULL, *b = NULL, *c = NULL;
  VT_OK(vram_malloc(pool, K, NULL, &a));
  VT_OK(vram_malloc(pool, K, NULL, &b));
  VT_OK(vram_malloc(pool, K, NULL, &c));
  assert_ptr_equal(b, (char *)a + K);
  assert_ptr_equal(c, (char *)b + K);
  VT_OK(vram_free(pool, b));
  vram_stats_t before;
  VT_OK(vram_get_stats(pool, &before));
  char *base = (char *)b;
  /* Overlapping a live neighbour on either side, a live block itself. */
  VT_EXPECT(vram_malloc_at(pool, base, K + 512, NULL), VRAM_EBUSY);
  VT_EXPECT(vram_malloc_at(pool, base - 512, 1024, NULL), VRAM_EBUSY);
  VT_EXPECT(vram_malloc_at(pool, a, 512, NULL), VRAM_EBUSY);
  /* Memory the pool does not hold, another stream's arena, bad arguments. */
  VT_EXPECT(vram_malloc_at(pool, (void *)(uintptr_t)512, 512, NULL), VRAM_EFOREIGN);
  VT_EXPECT(vram_malloc_at(pool, base, 512, VT_STREAM(7)), VRAM_EFOREIGN);
  VT_EXPECT(vram_malloc_at(pool, base + 100, 512, NULL), VRAM_EINVAL);
  VT_EXPECT(vram_malloc_at(pool, base, 0, NULL), VRAM_EINVAL);
  VT_EXPECT(vram_malloc_at(NULL, base, 512, NULL), VRAM_EINVAL);
  VT_EXPECT(vram_malloc_at(pool, NULL, 512, NULL), VRAM_EINVAL);
  VT_VALID(pool);
  vram_stats_t after;
  VT_OK(vram_get_stats(pool, &after));
  assert_int_equal(after.allocated_bytes.current, before.allocated_bytes.current);
  assert_int_equal(after.reserved_bytes.current, before.reserved_bytes.current);
  assert_int_equal(after.allocation.current, before.allocation.current);
  /* The hole is still whole: a range in its middle can be claimed, then freed. */
  VT_OK(vram_malloc_at(pool, base + K / 4, K / 2, NULL));
  VT_VALID(pool);
  VT_EXPECT(vram_malloc_at(pool, base + K / 4, 512, NULL), VRAM_EBUSY);
  VT_OK(vram_free(pool, base + K / 4));
  VT_OK(vram_free(pool, a));
  VT_OK(vram_free(pool, c));
  VT_VALID(pool);
  VT_OK(vram_pool_destroy(pool));
}

/* A block just freed sits parked in its arena's cache, still in the pointer map: a claim
 * of it, or of a range across it, must see free memory. */
static void claims_see_parked_blocks_as_free(void **state) {
  (void)state;
  vram_pool_t *pool = new_pool();
  void *a = NULL, *b = NULL;
  VT_OK(vram_malloc(pool, 4096, NULL, &a));
  VT_OK(vram_malloc(pool, 4096, NULL, &b));
  VT_OK(vram_free(pool, b));  /* parked */
  VT_OK(vram_malloc_at(pool, b, 2048, NULL));
  VT_VALID(pool);
  VT_OK(vram_free(pool, b));
  VT_OK(vram_free(pool, a));  /* both parked or merged */
  VT_OK(vram_malloc_at(pool, a, 8192, NULL));
  VT_VALID(pool);
  void *next = NULL;
  VT_OK(vram_malloc(pool, 512, NULL, &next));
  assert_true((char *)next < (char *)a || (char *)next >= (char *)a + 8192);
  VT_OK(vram_free(pool, next));
  VT_OK(vram_free(pool, a));
  VT_OK(vram_pool_destroy(pool));
}

static void segment_of_answers_by_pointer(void **state) {
  (void)state;
  vram_pool_t *pool = new_pool(), *other = new_pool();
  void *small = NULL, *large = NULL;
  VT_OK(vram_malloc(pool, 1000, NULL, &small));
  VT_OK(vram_malloc(pool, 40 * VT_MiB, VT_STREAM(3), &large));
  void *base = NULL;
  size_t size = 0;
  VT_OK(vram_segment_of(pool, large, &base, &size));
  assert_true((char *)base <= (char *)large && (char *)large + 40 * VT_MiB <= (char *)base + size);
  VT_OK(vram_segment_of(pool, small, &base, NULL));
  assert_true((char *)base <= (char *)small);
  VT_EXPECT(vram_segment_of(other, small, &base, &size), VRAM_EFOREIGN);
  VT_EXPECT(vram_segment_of(pool, (char *)small + 512, NULL, NULL), VRAM_EFOREIGN);
  VT_EXPECT(vram_segment_of(pool, NULL, NULL, NULL), VRAM_EINVAL);
  VT_OK(vram_free(pool, small));
  VT_EXPECT(vram_segment_of(pool, small, NULL, NULL), VRAM_EFOREIGN);
  VT_OK(vram_free(pool, large));
  VT_VALID(pool);
  VT_OK(vram_pool_destroy(pool));
  VT_OK(vram_pool_destroy(other));
}

int main(int argc, char **argv) {
  if (!vt_source_pick(argc, argv, &g_src)) {
    fprintf(stderr, "unknown source\n");
    return 2;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(claim_back_a_freed_layout),
      cmocka_unit_test(refused_claims_change_nothing),
      cmocka_unit_test(claims_see_parked_blocks_as_free),
      cmocka_unit_test(segment_of_answers_by_pointer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_host_tables.c - the engine's host tables: hostmem itself (cache-line aligned, huge
 * pages past 2 MiB); a pool holding enough blocks that its pointer map and block slabs come
 * from huge pages, through growth, frees in a scattered order and reuse; and the free
 * index's order when a block changes size in place. */
#include "vt.h"
#include "pool/tlsf.h"
#include "prim/hostmem.h"

/* Zeroed, writable, on a 64-byte line, and on a 2 MiB boundary once large. */
static void t_hostmem(void **state) {
  (void)state;
  size_t sizes[] = {1, 4096, (2u << 20) - 1, 2u << 20, (3u << 20) + 123, 40u << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    unsigned char *p = _vram_host_zalloc(sizes[i]);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    if (sizes[i] >= (2u << 20)) assert_int_equal((uintptr_t)p % (2u << 20), 0);
    for (size_t off = 0; off < sizes[i]; off += 4096) assert_int_equal(p[off], 0);
    assert_int_equal(p[sizes[i] - 1], 0);
    memset(p, 0xab, sizes[i]);
    _vram_host_free(p, sizes[i]);
  }
  _vram_host_free(NULL, 40u << 20); /* a no-op, like free(NULL) */
}

/* Blocks in the pool: argv[1], by default enough that the pointer map passes 2 MiB (32,768
 * entries at a quarter full) and the block slabs reach their huge-page size. CTest passes
 * fewer to a build that runs the full invariant checker inside every call, where this test
 * is quadratic. */
static size_t g_many = 40000;

static void t_many_blocks(void **state) {
  (void)state;
  vram_pool_t *pool = vt_pool_new(VRAM_SOURCE_SIM, 4 * VT_GiB);
  void **blocks = calloc(g_many, sizeof *blocks);
  assert_non_null(blocks);
  for (size_t i = 0; i < g_many; i++) VT_OK(vram_malloc(pool, 512 + (i % 7) * 512, NULL, &blocks[i]));
  VT_VALID(pool);
  vram_stats_t full = vt_stats(pool);
  assert_int_equal(full.allocation.current, g_many);
  /* Free every third block (scattered holes), then fill the holes again. */
  for (size_t i = 0; i < g_many; i += 3) VT_OK(vram_free(pool, blocks[i]));
  VT_VALID(pool);
  for (size_t i = 0; i < g_many; i += 3) VT_OK(vram_malloc(pool, 512 + (i % 7) * 512, NULL, &blocks[i]));
  VT_VALID(pool);
  vram_stats_t again = vt_stats(pool);
  assert_int_equal(again.allocation.current, g_many);
  assert_int_equal(again.allocated_bytes.current, full.allocated_bytes.current);
  assert_int_equal(again.reserved_bytes.current, full.reserved_bytes.current); /* holes reused */
  for (size_t i = 0; i < g_many; i++) {
    size_t requested = 0;
    VT_OK(vram_block_info(pool, blocks[i], &requested, NULL));
    assert_int_equal(requested, 512 + (i % 7) * 512);
  }
  for (size_t i = g_many; i-- > 0;) VT_OK(vram_free(pool, blocks[i]));
  VT_VALID(pool);
  assert_int_equal(vt_stats(pool).allocation.current, 0);
  free(blocks);
  VT_OK(vram_pool_destroy(pool));
}

static bool count_block(void *ctx, const vram_block *b) {
  (void)b;
  ++*(size_t *)ctx;
  return true;
}

/* A block resized in place (a merge or a carve that keeps its bin) goes to the head of its
 * bin like a fresh insert; one that changes bin moves. A search that falls through to a
 * bin above its own takes that bin's smallest block, its head among equals. The index
 * stays consistent through all of it. */
static void t_free_index_resize(void **state) {
  (void)state;
  vram_tlsf index;
  _vram_tlsf_init(&index);
  vram_block a = {.size = 34 * VRAM_ALIGN}, b = {.size = 34 * VRAM_ALIGN};
  _vram_tlsf_insert(&index, &a);
  _vram_tlsf_insert(&index, &b);
  /* a and b sit in the bin of 34..35 units; a search for 31 units finds its own bin empty
   * and falls through to theirs. Equal sizes there, so the head. */
  assert_ptr_equal(_vram_tlsf_find(&index, 31 * VRAM_ALIGN), &b);
  _vram_tlsf_resize(&index, &a, 35 * VRAM_ALIGN); /* same bin, now its head */
  assert_ptr_equal(index.heads[a.bin_fl][a.bin_sl], &a);
  assert_ptr_equal(_vram_tlsf_find(&index, 31 * VRAM_ALIGN), &b); /* the smaller one */
  _vram_tlsf_resize(&index, &b, 36 * VRAM_ALIGN);                  /* another bin */
  assert_ptr_equal(_vram_tlsf_find(&index, 31 * VRAM_ALIGN), &a);
  _vram_tlsf_resize(&index, &b, 34 * VRAM_ALIGN);                  /* back, at the head */
  assert_ptr_equal(_vram_tlsf_find(&index, 31 * VRAM_ALIGN), &b);
  assert_true(_vram_tlsf_check(&index, count_block, &(size_t){0}));
  assert_int_equal(index.free_bytes, 69 * VRAM_ALIGN);
  _vram_tlsf_resize(&index, &a, 64 * VRAM_ALIGN); /* another bin */
  assert_ptr_equal(_vram_tlsf_find(&index, 31 * VRAM_ALIGN), &b);
  assert_ptr_equal(_vram_tlsf_find(&index, 60 * VRAM_ALIGN), &a);
  assert_true(_vram_tlsf_check(&index, count_block, &(size_t){0}));
  assert_int_equal(index.free_bytes, 98 * VRAM_ALIGN);
  size_t blocks = 0;
  assert_true(_vram_tlsf_check(&index, count_block, &blocks));
  assert_int_equal(blocks, 2);
  _vram_tlsf_remove(&index, &a);
  _vram_tlsf_remove(&index, &b);
  assert_true(_vram_tlsf_check(&index, count_block, &(size_t){0}));
  assert_int_equal(index.fl_bitmap, 0);
}

int main(int argc, char **argv) {
  if (argc > 1) g_many = strtoul(argv[1], NULL, 10);
  if (g_many == 0) {
    fprintf(stderr, "test_host_tables: the block count must be a positive number\n");
    return 2;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_hostmem),
      cmocka_unit_test(t_many_blocks),
      cmocka_unit_test(t_free_index_resize),
  };
  return cmocka_run_group_tests_name("host_tables", tests, NULL, NULL);
}

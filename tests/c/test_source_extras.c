/* test_source_extras.c - what only some sources offer: prefetch (managed) and peer access
 * (virtual memory). Elsewhere each is a clear VRAM_EUNSUPPORTED that changes nothing; on
 * sim:vmm peer access checks the device. The pool stays valid after every call. */
#include "vt.h"

static vram_pool_t *make_pool(vram_source_kind kind) {
  vram_options_t o;
  vram_options_init(&o);
  o.source = kind;
  o.sim_capacity = 1 * VT_GiB;
  vram_pool_t *pool = NULL;
  VT_OK(vram_pool_create(&pool, &o));
  VT_VALID(pool);
  return pool;
}

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_prefetch_unsupported_off_managed),
      cmocka_unit_test(t_peer_access),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

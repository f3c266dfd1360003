/* test_driver_faults.c - the GPU sources under failing driver calls, on the fake driver.
 *
 * For every k, the k-th call of the physical-memory path (allocate, create, map, set
 * access, unmap, release) fails while a pool on the cuda, vmm or managed source allocates,
 * frees and empties its cache. After every operation the pool must be valid, every live
 * block intact, and what the driver holds must be what the pool says it holds: a failure
 * part-way through a map leaves no mapping the pool does not know of (PyTorch's expandable
 * segments asserts on every later allocation after such a failure). The cuda source is
 * swept twice: far from its cap, and under a limit that makes it grow into virtual ranges
 * (vram_options_t.virtual_threshold), where it must also fall back to fixed segments on a
 * device without virtual memory management. Also: a block one stream borrows from another
 * stream's arena makes the driver order the two streams. Runs with LD_LIBRARY_PATH pointing
 * at the fake libcuda.so.1 (see CMakeLists.txt). */
#include <dlfcn.h>
#include <string.h>

#include "vt.h"

typedef struct fake_driver {
  void (*fail_call)(long n);
  long (*fault_pending)(void);
  size_t (*used_bytes)(void);
  size_t (*allocated_bytes)(void);
  size_t (*mapped_bytes)(void);
  void (*set_vmm_supported)(int yes);
  long (*stream_waits)(void **waiter, void **waited_on);
} fake_driver;

static fake_driver fake;

static void load_fake(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) fail_msg("the fake driver is not on LD_LIBRARY_PATH: %s", dlerror());
  *(void **)&fake.fail_call = dlsym(lib, "fake_cuda_fail_call");
  *(void **)&fake.fault_pending = dlsym(lib, "fake_cuda_fault_pending");
  *(void **)&fake.used_bytes = dlsym(lib, "fake_cuda_used_bytes");
  *(void **)&fake.allocated_bytes = dlsym(lib, "fake_cuda_allocated_bytes");
  *(void **)&fake.mapped_bytes = dlsym(lib, "fake_cuda_mapped_bytes");
  *(void **)&fake.set_vmm_supported = dlsym(lib, "fake_cuda_set_vmm_supported");
  *(void **)&fake.stream_waits = dlsym(lib, "fake_cuda_stream_waits");
  if (!fake.fail_call || !fake.fault_pending || !fake.used_bytes || !fake.allocated_bytes ||
      !fake.mapped_bytes || !fake.set_vmm_supported || !fake.stream_waits)
    fail_msg("libcuda.so.1 on the path is not the fake driver");
}

enum { MAX_LIVE = 32 };
typedef struct live_set {
  void *ptr[MAX_LIVE];
  size_t size[MAX_LIVE];
  int n;
} live_set;

/* Valid, every live block still answering with its size, and the driver holding exactly
 * what the pool counts as reserved: its allocations and its mapped granules (a handle the
 * driver refused to release after its unmap is counted by the source, not held as
 * reserved, so handles themselves are not compared). */
static void check(vram_pool_t *pool, const live_set *live) {
  VT_VALID(pool);
  for (int i = 0; i < live->n; i++) {
    size_t requested = 0;
    VT_OK(vram_block_info(pool, live->ptr[i], &requested, NULL));
    assert_int_equal(requested, live->size[i]);
  }
  int64_t reserved = vt_stats(pool).reserved_bytes.current;
  assert_int_equal(reserved, (int64_t)(fake.allocated_bytes() + fake.mapped_bytes()));
}

static void try_malloc(vram_pool_t *pool, live_set *live, size_t size) {
  void *p = NULL;
  int rc = vram_malloc(pool, size, NULL, &p);
  if (rc == VRAM_OK) {
    live->ptr[live->n] = p;
    live->size[live->n++] = size;
  } else if (rc != VRAM_ENOMEM && rc != VRAM_EDRIVER) {
    fail_msg("vram_malloc(%zu) under a driver fault returned %s", size, vram_errname(rc));
  }
  check(pool, live);
}

static void free_at(vram_pool_t *pool, live_set *live, int i) {
  VT_OK(vram_free(pool, live->ptr[i]));
  live->ptr[i] = live->ptr[--live->n];
  live->size[i] = live->size[live->n];
  check(pool, live);
}

/* A pool of `kind` on the fake driver. limit: 0 for none; a small one makes a cuda pool
 * with large blocks fixed grow into virtual ranges. */
static vram_pool_t *fake_pool(vram_source_kind kind, size_t limit, vram_large_blocks large) {
  vram_options_t o;
  vram_options_init(&o);
  o.source = kind;
  o.limit_bytes = limit;
  o.large_blocks = large;
  return vt_pool_from(&o);
}

static void sweep_large(vram_source_kind kind, size_t limit, vram_large_blocks large) {
  static const size_t sizes[] = {5 << 20, 300 << 10, 40 << 20, (1 << 20) + 1, 9 << 20, 3000};
  int fired = 0;
  for (long k = 1; k <= 40; k++) {
    vram_pool_t *pool = fake_pool(kind, limit, large);
    live_set live = {{0}, {0}, 0};
    fake.fail_call(k);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) try_malloc(pool, &live, sizes[i]);
    for (int i = live.n - 1; i >= 0; i -= 2) free_at(pool, &live, i);
    int rc = vram_empty_cache(pool);
    assert_true(rc == VRAM_OK || rc == VRAM_EDRIVER);
    check(pool, &live);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) try_malloc(pool, &live, sizes[i] * 2);
    if (fake.fault_pending() == 0) fired++;
    fake.fail_call(0);
    while (live.n) free_at(pool, &live, live.n - 1);
    VT_OK(vram_empty_cache(pool));
    check(pool, &live);
    assert_int_equal(vt_stats(pool).reserved_bytes.current, 0);
    VT_OK(vram_pool_destroy(pool));
    assert_int_equal(fake.mapped_bytes(), 0);
  }
  assert_true(fired >= 10); /* the sweep did reach into the scenario */
}

static void sweep(vram_source_kind kind, size_t limit) {
  sweep_large(kind, limit, VRAM_LARGE_VIRTUAL);
}

static void t_cuda(void **state) { (void)state; sweep(VRAM_SOURCE_CUDA, 0); }
/* Large blocks in fixed segments of their own (VRAMKIT_LARGE_BLOCKS=fixed). */
static void t_cuda_large_fixed(void **state) {
  (void)state;
  sweep_large(VRAM_SOURCE_CUDA, 0, VRAM_LARGE_FIXED);
}
static void t_vmm(void **state) { (void)state; sweep(VRAM_SOURCE_VMM, 0); }
/* Under a limit a vmm pool maps granule by granule: many more calls for a fault to hit. */
static void t_vmm_capped(void **state) { (void)state; sweep(VRAM_SOURCE_VMM, 96 << 20); }
static void t_managed(void **state) { (void)state; sweep(VRAM_SOURCE_MANAGED, 0); }
/* Past half of 96 MiB the cuda pool maps granules: its faults are the vmm source's too. */
static void t_cuda_virtual(void **state) { (void)state; sweep(VRAM_SOURCE_CUDA, 96 << 20); }

/* Everything freed, the cache emptied and checked, the pool gone and nothing left mapped. */
static void drain_and_destroy(vram_pool_t *pool, live_set *live) {
  while (live->n) free_at(pool, live, live->n - 1);
  VT_OK(vram_empty_cache(pool));
  check(pool, live);
  VT_OK(vram_pool_destroy(pool));
  assert_int_equal(fake.mapped_bytes(), 0);
}

/* Past the threshold a cuda pool's large request lands in a virtual range; on a device
 * without virtual memory management it gets a fixed segment instead, and the pool stays
 * on fixed segments from then on. */
static void t_cuda_virtual_or_fixed(void **state) {
  (void)state;
  for (int supported = 1; supported >= 0; supported--) {
    fake.set_vmm_supported(supported);
    /* Large blocks fixed below the threshold. */
    vram_pool_t *pool = fake_pool(VRAM_SOURCE_CUDA, 96 << 20, VRAM_LARGE_FIXED);
    live_set live = {{0}, {0}, 0};
    try_malloc(pool, &live, 40 << 20);
    try_malloc(pool, &live, 20 << 20); /* 40 + 20 > 48 */
    assert_int_equal(live.n, 2);
    assert_int_equal(vt_in_virtual(pool, live.ptr[0]), 0);
    assert_int_equal(vt_in_virtual(pool, live.ptr[1]), supported);
    assert_int_equal(fake.mapped_bytes(), supported ? (size_t)20 << 20 : 0);
    drain_and_destroy(pool, &live);
  }
  fake.set_vmm_supported(1);
}

/* The default (large blocks virtual) on a device without virtual memory management: every
 * large request gets a fixed segment, as with large blocks fixed, and nothing is mapped. */
static void t_cuda_default_without_vmm(void **state) {
  (void)state;
  for (int supported = 1; supported >= 0; supported--) {
    fake.set_vmm_supported(supported);
    vram_pool_t *pool = fake_pool(VRAM_SOURCE_CUDA, 0, VRAM_LARGE_VIRTUAL);
    live_set live = {{0}, {0}, 0};
    try_malloc(pool, &live, 40 << 20);
    try_malloc(pool, &live, 3 << 20);
    try_malloc(pool, &live, 4096);
    assert_int_equal(live.n, 3);
    assert_int_equal(vt_in_virtual(pool, live.ptr[0]), supported);
    assert_int_equal(vt_in_virtual(pool, live.ptr[1]), supported);
    assert_int_equal(vt_in_virtual(pool, live.ptr[2]), 0); /* small: a fixed 2 MiB segment */
    assert_int_equal(fake.mapped_bytes(), supported ? (size_t)44 << 20 : 0);
    drain_and_destroy(pool, &live);
  }
  fake.set_vmm_supported(1);
}

/* A request on another stream borrows from a preallocated pool (the default stream's
 * arena) whose limit keeps it from growing: before it gets the block, the driver is told to make its stream wait for an
 * event recorded on the default stream, where the block was last used. */
static void t_borrow_waits_on_owner_stream(void **state) {
  (void)state;
  vram_source_kind kinds[] = {VRAM_SOURCE_CUDA, VRAM_SOURCE_VMM, VRAM_SOURCE_MANAGED};
  for (int k = 0; k < 3; k++) {
    vram_options_t o;
    vram_options_init(&o);
    o.source = kinds[k];
    o.preallocate_bytes = o.limit_bytes = 64 << 20;
    vram_pool_t *pool = vt_pool_from(&o);
    void *s1 = (void *)(uintptr_t)0x6001, *waiter = NULL, *waited_on = (void *)1;
    long before = fake.stream_waits(NULL, NULL);
    void *p = NULL;
    VT_OK(vram_malloc(pool, 5 << 20, s1, &p));
    VT_VALID(pool);
    assert_int_equal(fake.stream_waits(&waiter, &waited_on), before + 1);
    assert_ptr_equal(waiter, s1);
    assert_null(waited_on);
    assert_int_equal(vt_stats(pool).num_stream_borrows, 1);
    VT_OK(vram_free(pool, p));
    VT_OK(vram_pool_destroy(pool));
  }
}

int main(void) {
  load_fake();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_cuda),
      cmocka_unit_test(t_cuda_large_fixed),
      cmocka_unit_test(t_vmm),
      cmocka_unit_test(t_vmm_capped),
      cmocka_unit_test(t_managed),
      cmocka_unit_test(t_cuda_virtual),
      cmocka_unit_test(t_cuda_virtual_or_fixed),
      cmocka_unit_test(t_cuda_default_without_vmm),
      cmocka_unit_test(t_borrow_waits_on_owner_stream),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

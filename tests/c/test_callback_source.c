/* test_callback_source.c - pools whose memory comes from the caller's functions
 * (vram_pool_create_with_callbacks) and pools that never split a segment
 * (vram_options_t.no_split): what PyTorch's MemPool(allocator=...) and MemPool(no_split=True)
 * become under vramkit.
 *
 * The callbacks here are a test double of an outside allocator (NCCL's ncclMemAlloc, say):
 * they hand out device-like addresses no page backs, count what is outstanding, remember
 * the stream they were given, and fail or misbehave on demand. Every segment the pool holds
 * must come from them and go back to them (free, empty_cache, destroy), their failures must
 * be the out-of-memory path with a report and no leak, and the engine's invariant checker
 * must pass after every step. Events and the device's figures come from the sim source the
 * options name. A no_split pool gives each block a segment of its own, the whole of it,
 * reuses a freed one whole for a request of its kind that fits, and gives it back on
 * empty_cache; the options it cannot serve are refused with their own codes.
 */
#include "vt.h"

/* ---- the outside allocator ---------------------------------------------------------- */
typedef struct fake_allocator {
  uintptr_t next;           /* the next address handed out */
  int allocs, frees;        /* calls that succeeded */
  size_t outstanding;       /* bytes handed out and not given back */
  size_t last_size;
  vram_stream_t last_stream;
  int fail;                 /* >0: refuse the next `fail` calls */
  int misalign;             /* hand out the next address off by 256 bytes */
  int bad_frees;            /* frees of an address or size never handed out */
  uintptr_t handed[64];     /* live allocations: address, size */
  size_t handed_size[64];
} fake_allocator;

static int fake_alloc(void *ctx, size_t size, int device, vram_stream_t stream, void **ptr) {
  fake_allocator *f = ctx;
  assert_int_equal(device, 0);
  if (f->fail > 0) {
    f->fail--;
    return 1;
  }
  for (int i = 0; i < 64; i++) {
    if (f->handed[i]) continue;
    uintptr_t addr = f->next + (f->misalign ? 256 : 0);
    f->misalign = 0;
    f->next += size + (4 << 20); /* gaps between allocations, as a real allocator leaves */
    f->handed[i] = addr;
    f->handed_size[i] = size;
    f->allocs++;
    f->outstanding += size;
    f->last_size = size;
    f->last_stream = stream;
    *ptr = (void *)addr;
    return 0;
  }
  return 1;
}

static void fake_free(void *ctx, void *ptr, size_t size, int device, vram_stream_t stream) {
  fake_allocator *f = ctx;
  (void)device;
  (void)stream;
  for (int i = 0; i < 64; i++) {
    if (f->handed[i] != (uintptr_t)ptr) continue;
    if (f->handed_size[i] != size) f->bad_frees++;
    f->handed[i] = 0;
    f->frees++;
    f->outstanding -= f->handed_size[i];
    return;
  }
  f->bad_frees++;
}

static vram_source_callbacks_t callbacks_of(fake_allocator *f) {
  memset(f, 0, sizeof *f);
  f->next = (uintptr_t)1 << 40;
  vram_source_callbacks_t cb = {.alloc = fake_alloc, .free = fake_free, .ctx = f};
  return cb;
}

static void sim_options(vram_options_t *o) {
  vram_options_init(o);
  o->source = VRAM_SOURCE_SIM;
  o->sim_capacity = VT_GiB;
  o->give_back = 0;
}

static vram_pool_t *callback_pool(fake_allocator *f, const vram_options_t *o) {
  vram_source_callbacks_t cb = callbacks_of(f);
  vram_pool_t *pool = NULL;
  VT_OK(vram_pool_create_with_callbacks(&pool, o, &cb));
  VT_VALID(pool);
  return pool;
}

static vram_stats_t stats_of(vram_pool_t *pool) {
  vram_stats_t s;
  VT_OK(vram_get_stats(pool, &s));
  return s;
}

/* ---- memory from callbacks ---------------------------------------------------------- */

static void segments_come_from_the_callbacks_and_go_back(void **state) {
  (void)state;
  fake_allocator f;
  vram_options_t o;
  sim_options(&o);
  vram_pool_t *pool = callback_pool(&f, &o);
  assert_int_equal(f.allocs, 0); /* nothing taken before the first request */
  void *small = NULL, *large = NULL;
  VT_OK(vram_malloc(pool, 1000, VT_STREAM(3), &small));
  assert_int_equal(f.allocs, 1);
  assert_int_equal(f.last_size, 2 * VT_MiB);
  assert_ptr_equal(f.last_stream, VT_STREAM(3)); /* the arena's stream is passed on */
  VT_OK(vram_malloc(pool, 5 * VT_MiB, NULL, &large));
  VT_VALID(pool);
  assert_int_equal(f.allocs, 2);
  assert_int_equal(f.last_size % (2 * VT_MiB), 0);
  vram_stats_t s = stats_of(pool);
  assert_int_equal(s.reserved_bytes.current, (int64_t)f.outstanding);
  assert_int_equal(s.allocated_bytes.current, 1024 + 5 * VT_MiB);
  assert_int_equal(s.num_device_alloc, 2);
  /* Freed blocks stay cached; empty_cache gives their segments back, each with its size. */
  VT_OK(vram_free(pool, large));
  VT_OK(vram_free(pool, small));
  assert_int_equal(f.frees, 0);
  VT_OK(vram_empty_cache(pool));
  VT_VALID(pool);
  assert_int_equal(f.frees, 2);
  assert_int_equal(f.outstanding, 0);
  assert_int_equal(f.bad_frees, 0);
  assert_int_equal(stats_of(pool).reserved_bytes.current, 0);
  /* Destroying a pool with cached segments gives them back too. */
  VT_OK(vram_malloc(pool, 3 * VT_MiB, NULL, &large));
  VT_OK(vram_free(pool, large));
  VT_OK(vram_pool_destroy(pool));
  assert_int_equal(f.outstanding, 0);
  assert_int_equal(f.bad_frees, 0);
}

static void the_source_figures_and_limits_still_apply(void **state) {
  (void)state;
  fake_allocator f;
  vram_options_t o;
  sim_options(&o);
  o.limit_bytes = 8 * VT_MiB;
  vram_pool_t *pool = callback_pool(&f, &o);
  size_t free_bytes = 0, total = 0;
  VT_OK(vram_mem_get_info(pool, &free_bytes, &total));
  assert_int_equal(total, VT_GiB); /* the sim source's device */
  vram_snapshot_segment_t segs[4];
  vram_snapshot_block_t blocks[4];
  size_t n_segs = 0, n_blocks = 0;
  void *p = NULL, *q = NULL;
  VT_OK(vram_malloc(pool, 6 * VT_MiB, NULL, &p));
  VT_OK(vram_snapshot(pool, segs, 4, &n_segs, blocks, 4, &n_blocks));
  assert_int_equal(n_segs, 1);
  assert_int_equal(segs[0].addr, (uintptr_t)1 << 40);
  /* The limit refuses growth before the callbacks are asked. */
  VT_EXPECT(vram_malloc(pool, 4 * VT_MiB, NULL, &q), VRAM_ENOMEM);
  assert_int_equal(f.allocs, 1);
  assert_int_equal(stats_of(pool).num_ooms, 1);
  VT_VALID(pool);
  VT_OK(vram_free(pool, p));
  VT_OK(vram_pool_destroy(pool));
  assert_int_equal(f.outstanding, 0);
}

static void a_failing_callback_is_out_of_memory(void **state) {
  (void)state;
  fake_allocator f;
  vram_options_t o;
  sim_options(&o);
  vram_pool_t *pool = callback_pool(&f, &o);
  void *keep = NULL, *p = NULL;
  VT_OK(vram_malloc(pool, 3 * VT_MiB, NULL, &keep));
  f.fail = 2; /* the first try and the ladder's retry */
  VT_EXPECT(vram_malloc(pool, 9 * VT_MiB, NULL, &p), VRAM_ENOMEM);
  assert_null(p);
  VT_VALID(pool);
  char report[2048];
  assert_true(vram_oom_report(pool, report, sizeof report) > 0);
  assert_non_null(strstr(report, "9.00 MiB"));
  vram_stats_t s = stats_of(pool);
  assert_int_equal(s.num_ooms, 1);
  assert_int_equal(s.reserved_bytes.current, (int64_t)f.outstanding);
  /* The live block is intact and the pool serves the next request. */
  size_t requested = 0;
  VT_OK(vram_block_info(pool, keep, &requested, NULL));
  assert_int_equal(requested, 3 * VT_MiB);
  VT_OK(vram_malloc(pool, 9 * VT_MiB, NULL, &p));
  VT_OK(vram_free(pool, p));
  /* A pointer the engine cannot use goes straight back and fails as a driver error. */
  f.misalign = 1;
  VT_EXPECT(vram_malloc(pool, 40 * VT_MiB, NULL, &p), VRAM_EDRIVER);
  VT_VALID(pool);
  assert_int_equal(f.bad_frees, 0);
  VT_OK(vram_free(pool, keep));
  VT_OK(vram_pool_destroy(pool));
  assert_int_equal(f.outstanding, 0);
}

/* Every source call of a scenario fails in turn (the fault wrapper outside the callback
 * source): the pool comes out valid each time and nothing stays with the allocator. */
static void every_failure_leaves_nothing_behind(void **state) {
  (void)state;
  for (uint64_t k = 1; k <= 12; k++) {
    fake_allocator f;
    vram_options_t o;
    sim_options(&o);
    o.fault_fail_at = k;
    vram_pool_t *pool = callback_pool(&f, &o);
    void *p[4] = {NULL};
    size_t sizes[4] = {1000, 3 * VT_MiB, 700 * VT_KiB, 12 * VT_MiB};
    for (int i = 0; i < 4; i++) {
      int rc = vram_malloc(pool, sizes[i], VT_STREAM(i % 2 + 1), &p[i]);
      assert_true(rc == VRAM_OK || rc == VRAM_EFAULT || rc == VRAM_ENOMEM);
      VT_VALID(pool);
    }
    for (int i = 0; i < 4; i++)
      if (p[i]) VT_OK(vram_free(pool, p[i]));
    (void)vram_empty_cache(pool);
    VT_VALID(pool);
    VT_OK(vram_pool_destroy(pool));
    assert_int_equal(f.bad_frees, 0);
    assert_int_equal(f.outstanding, 0);
  }
}

static void bad_callbacks_are_refused(void **state) {
  (void)state;
  fake_allocator f;
  vram_source_callbacks_t cb = callbacks_of(&f);
  vram_pool_t *pool = (vram_pool_t *)&f;
  VT_EXPECT(vram_pool_create_with_callbacks(&pool, NULL, NULL), VRAM_EINVAL);
  assert_null(pool);
  VT_EXPECT(vram_pool_create_with_callbacks(NULL, NULL, &cb), VRAM_EINVAL);
  vram_source_callbacks_t no_free = cb;
  no_free.free = NULL;
  VT_EXPECT(vram_pool_create_with_callbacks(&pool, NULL, &no_free), VRAM_EINVAL);
  vram_source_callbacks_t odd_unit = cb;
  odd_unit.granularity = 3 * VT_MiB;
  VT_EXPECT(vram_pool_create_with_callbacks(&pool, NULL, &odd_unit), VRAM_EINVAL);
  assert_null(pool);
  assert_int_equal(f.allocs, 0);
  /* A unit of the caller's: segments are multiples of it. */
  vram_options_t o;
  sim_options(&o);
  cb.granularity = 64 * VT_MiB;
  VT_OK(vram_pool_create_with_callbacks(&pool, &o, &cb));
  void *p = NULL;
  VT_OK(vram_malloc(pool, 5 * VT_MiB, NULL, &p));
  assert_int_equal(f.last_size, 64 * VT_MiB);
  VT_OK(vram_free(pool, p));
  VT_OK(vram_pool_destroy(pool));
  assert_int_equal(f.outstanding, 0);
}

/* ---- no_split -------------------------------------------------------------------------- */

static void no_split_gives_each_block_its_own_segment(void **state) {
  (void)state;
  vram_options_t o;
  sim_options(&o);
  o.no_split = 1;
  vram_pool_t *pool = vt_pool_from(&o);
  void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
  VT_OK(vram_malloc(pool, 1000, NULL, &a));
  VT_OK(vram_malloc(pool, 1000, NULL, &b));
  vram_stats_t s = stats_of(pool);
  assert_int_equal(s.segment.current, 2); /* the second does not share the first's */
  assert_int_equal(s.allocated_bytes.current, 4 * VT_MiB);
  assert_int_equal(s.requested_bytes.current, 2000);
  void *base = NULL;
  size_t size = 0;
  VT_OK(vram_segment_of(pool, a, &base, &size));
  assert_ptr_equal(base, a);
  assert_int_equal(size, 2 * VT_MiB);
  VT_OK(vram_malloc(pool, 3 * VT_MiB, NULL, &c));
  VT_VALID(pool);
  assert_int_equal(stats_of(pool).allocated_bytes.current, 8 * VT_MiB);
  /* Freed, it is cached whole and taken back whole by a smaller request of its kind. */
  VT_OK(vram_free(pool, c));
  VT_OK(vram_malloc(pool, 5 * VT_MiB / 2, NULL, &d));
  assert_ptr_equal(d, c);
  s = stats_of(pool);
  assert_int_equal(s.segment.current, 3);
  assert_int_equal(s.allocated_bytes.current, 8 * VT_MiB);
  assert_int_equal(s.num_device_alloc, 3);
  /* A large request never takes a small block (a segment of its own: the peak guard may
   * first give the idle small one back), and a small one takes a small block whole. */
  VT_OK(vram_free(pool, a));
  VT_OK(vram_malloc(pool, 3 * VT_MiB / 2, NULL, &c));
  VT_VALID(pool);
  assert_int_equal(stats_of(pool).num_device_alloc, 4);
  VT_OK(vram_segment_of(pool, c, &base, &size));
  assert_ptr_equal(base, c);
  assert_int_equal(size, 2 * VT_MiB);
  VT_OK(vram_free(pool, b));
  VT_OK(vram_malloc(pool, 500, NULL, &b));
  assert_int_equal(stats_of(pool).num_device_alloc, 4);
  assert_int_equal(stats_of(pool).allocated_bytes.current, 8 * VT_MiB);
  /* empty_cache gives the cached segment back; the live ones stay. */
  VT_OK(vram_empty_cache(pool));
  VT_VALID(pool);
  s = stats_of(pool);
  assert_int_equal(s.segment.current, 3);
  assert_int_equal(s.reserved_bytes.current, 2 * VT_MiB + 4 * VT_MiB + 2 * VT_MiB);
  VT_OK(vram_free(pool, b));
  VT_OK(vram_free(pool, c));
  VT_OK(vram_free(pool, d));
  VT_OK(vram_empty_cache(pool));
  assert_int_equal(stats_of(pool).reserved_bytes.current, 0);
  VT_OK(vram_pool_destroy(pool));
}

static void no_split_on_callbacks_is_one_call_a_block(void **state) {
  (void)state;
  fake_allocator f;
  vram_options_t o;
  sim_options(&o);
  o.no_split = 1;
  vram_pool_t *pool = callback_pool(&f, &o);
  void *p[6];
  for (int i = 0; i < 6; i++) VT_OK(vram_malloc(pool, 4096 * (size_t)(i + 1), NULL, &p[i]));
  VT_VALID(pool);
  assert_int_equal(f.allocs, 6);
  for (int i = 0; i < 6; i++) {
    void *base = NULL;
    VT_OK(vram_segment_of(pool, p[i], &base, NULL));
    assert_ptr_equal(base, p[i]); /* every block starts its own allocation */
    VT_OK(vram_free(pool, p[i]));
  }
  VT_OK(vram_pool_destroy(pool));
  assert_int_equal(f.frees, 6);
  assert_int_equal(f.outstanding, 0);
}

static void no_split_refuses_what_it_cannot_serve(void **state) {
  (void)state;
  vram_options_t o;
  sim_options(&o);
  o.no_split = 1;
  o.preallocate_bytes = 64 * VT_MiB;
  vram_pool_t *pool = NULL;
  VT_EXPECT(vram_pool_create(&pool, &o), VRAM_EINVAL);
  assert_null(pool);
  sim_options(&o);
  o.no_split = 1;
  o.source = VRAM_SOURCE_SIM_VMM;
  VT_EXPECT(vram_pool_create(&pool, &o), VRAM_EUNSUPPORTED);
  assert_null(pool);
  /* A block claimed back at an address inside a free segment would be a cut of it. */
  sim_options(&o);
  o.no_split = 1;
  pool = vt_pool_from(&o);
  void *p = NULL;
  VT_OK(vram_malloc(pool, 6 * VT_MiB, NULL, &p));
  VT_OK(vram_free(pool, p));
  VT_EXPECT(vram_malloc_at(pool, (char *)p + VT_MiB, 4096, NULL), VRAM_EINVAL);
  VT_VALID(pool);
  VT_OK(vram_malloc_at(pool, p, 4096, NULL));
  assert_int_equal(stats_of(pool).allocated_bytes.current, 6 * VT_MiB);
  VT_OK(vram_free(pool, p));
  VT_OK(vram_pool_destroy(pool));
}

static void no_split_is_a_pool_option_by_its_variable(void **state) {
  (void)state;
  vram_options_t o;
  vram_options_init(&o);
  assert_int_equal(o.no_split, 0);
  const char *why = NULL;
  VT_OK(vram_options_set(&o, "VRAMKIT_NO_SPLIT", "on", &why));
  assert_int_equal(o.no_split, 1);
  VT_EXPECT(vram_options_set(&o, "VRAMKIT_NO_SPLIT", "sometimes", &why), VRAM_EENV);
  assert_non_null(strstr(why, "VRAMKIT_NO_SPLIT: 'sometimes' is not a switch"));
  assert_int_equal(o.no_split, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(segments_come_from_the_callbacks_and_go_back),
      cmocka_unit_test(the_source_figures_and_limits_still_apply),
      cmocka_unit_test(a_failing_callback_is_out_of_memory),
      cmocka_unit_test(every_failure_leaves_nothing_behind),
      cmocka_unit_test(bad_callbacks_are_refused),
      cmocka_unit_test(no_split_gives_each_block_its_own_segment),
      cmocka_unit_test(no_split_on_callbacks_is_one_call_a_block),
      cmocka_unit_test(no_split_refuses_what_it_cannot_serve),
      cmocka_unit_test(no_split_is_a_pool_option_by_its_variable),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_bad_input.c - bad input gets a clear, distinct error and loses nothing.
 *
 * Double free, foreign pointers, sizes no device can hold (out of memory, at once),
 * invalid devices, NULL arguments, bad VRAMKIT_* variables, vram_parse_size, and the
 * status-code strings. Every pool test keeps a few live blocks across the bad calls and,
 * after each error, runs the invariant checker and checks that every live block still
 * answers block_info with its size and stream and that no statistic moved.
 * Runs on the sim sources (argv[1]: "sim" or "sim:vmm", default "sim").
 */
#include <stdbool.h>

#include "vt.h"

static vt_source g_src;

/* A pool with a few live blocks and a snapshot of its statistics. */
typedef struct fixture {
  vram_pool_t *pool;
  enum { NLIVE = 6 } n;
  void *p[NLIVE];
  size_t req[NLIVE];
  vram_stream_t stream[NLIVE];
  vram_stats_t snap;
  int errors_seen;
  int last_error;
} fixture;

static void on_error(void *user, vram_pool_t *pool, int status, const char *message) {
  fixture *fx = (fixture *)user;
  (void)pool;
  fx->errors_seen++;
  fx->last_error = status;
  if (!message || !*message) fx->last_error = 12345; /* an error must say something */
}

static int fx_setup(void **state) {
  static const size_t sizes[NLIVE] = {512, 3000, 70000, 1 << 20, 3 << 20, 17 << 20};
  fixture *fx = calloc(1, sizeof *fx);
  if (!fx) return -1;
  vram_options_t o;
  memset(&o, 0, sizeof o);
  vram_options_init(&o);
  o.source = g_src.kind;
  o.sim_capacity = 1 * VT_GiB;
  if (vram_pool_create(&fx->pool, &o) != VRAM_OK) return -1;
  vram_set_error_callback(fx->pool, on_error, fx);
  for (int i = 0; i < NLIVE; i++) {
    fx->req[i] = sizes[i];
    fx->stream[i] = VT_STREAM(i % 2);
    if (vram_malloc(fx->pool, sizes[i], fx->stream[i], &fx->p[i]) != VRAM_OK) return -1;
  }
  if (vram_get_stats(fx->pool, &fx->snap) != VRAM_OK) return -1;
  *state = fx;
  return 0;
}

static int fx_teardown(void **state) {
  fixture *fx = (fixture *)*state;
  if (!fx) return 0;
  vram_pool_destroy_force(fx->pool);
  free(fx);
  return 0;
}

/* Nothing lost: valid pool, every live block as it was, statistics unchanged. */
static void fx_intact(fixture *fx) {
  VT_VALID(fx->pool);
  for (int i = 0; i < NLIVE; i++) {
    if (!fx->p[i]) continue;
    size_t r = 0;
    vram_stream_t s = VT_STREAM(0xbad);
    VT_OK(vram_block_info(fx->pool, fx->p[i], &r, &s));
    assert_int_equal(r, fx->req[i]);
    assert_ptr_equal(s, fx->stream[i]);
  }
  vram_stats_t now = vt_stats(fx->pool);
#define SAME_STAT(name, doc)                                                              \
  assert_int_equal(now.name.current, fx->snap.name.current);                              \
  assert_int_equal(now.name.peak, fx->snap.name.peak);                                    \
  assert_int_equal(now.name.total, fx->snap.name.total);
  VRAM_STAT_LIST(SAME_STAT)
#undef SAME_STAT
#define SAME_COUNTER(name, doc) assert_int_equal(now.name, fx->snap.name);
  VRAM_COUNTER_LIST(SAME_COUNTER)
#undef SAME_COUNTER
  assert_int_equal(now.largest_free_block, fx->snap.largest_free_block);
  assert_int_equal(now.limit_bytes, fx->snap.limit_bytes);
}

/* Take a new snapshot after a deliberate, successful change. */
static void fx_resnap(fixture *fx) {
  VT_VALID(fx->pool);
  fx->snap = vt_stats(fx->pool);
}

/* ---- pool errors --------------------------------------------------------------------- */

static void t_double_free(void **state) {
  fixture *fx = (fixture *)*state;
  /* Between live neighbours (no coalescing possible at its address). */
  void *a = NULL, *b = NULL, *c = NULL;
  VT_OK(vram_malloc(fx->pool, 4096, NULL, &a));
  VT_VALID(fx->pool);
  VT_OK(vram_malloc(fx->pool, 4096, NULL, &b));
  VT_VALID(fx->pool);
  VT_OK(vram_malloc(fx->pool, 4096, NULL, &c));
  VT_VALID(fx->pool);
  VT_OK(vram_free(fx->pool, b));
  VT_VALID(fx->pool);
  fx_resnap(fx);
  int errs = fx->errors_seen;
  VT_EXPECT(vram_free(fx->pool, b), VRAM_EDOUBLEFREE);
  VT_VALID(fx->pool);
  fx_intact(fx);
  assert_int_equal(fx->errors_seen, errs + 1);
  assert_int_equal(fx->last_error, VRAM_EDOUBLEFREE);
  /* A freed large block alone in its segment, then a third time. */
  void *d = NULL;
  VT_OK(vram_malloc(fx->pool, 9 << 20, VT_STREAM(5), &d));
  VT_VALID(fx->pool);
  VT_OK(vram_free(fx->pool, d));
  VT_VALID(fx->pool);
  fx_resnap(fx);
  VT_EXPECT(vram_free(fx->pool, d), VRAM_EDOUBLEFREE);
  VT_VALID(fx->pool);
  fx_intact(fx);
  VT_EXPECT(vram_free(fx->pool, d), VRAM_EDOUBLEFREE);
  VT_VALID(fx->pool);
  fx_intact(fx);
  VT_EXPECT(vram_free(fx->pool, b), VRAM_EDOUBLEFREE);
  VT_VALID(fx->pool);
  fx_intact(fx);
  VT_OK(vram_free(fx->pool, a));
  VT_VALID(fx->pool);
  VT_OK(vram_free(fx->pool, c));
  VT_VALID(fx->pool);
  fx_resnap(fx);
}

/* A freed block merges with a free neighbour below it; freeing it again is still a double
 * free, not a foreign pointer: the pool did hand this address out. */
static void t_double_free_after_coalesce(void **state) {
  fixture *fx = (fixture *)*state;
  static const size_t sizes[] = {4096, 6 << 20};
  for (size_t i = 0; i < 2; i++) {
    void *a = NULL, *b = NULL, *c = NULL;
    VT_OK(vram_malloc(fx->pool, sizes[i], VT_STREAM(7), &a));
    VT_VALID(fx->pool);
    VT_OK(vram_malloc(fx->pool, sizes[i], VT_STREAM(7), &b));
    VT_VALID(fx->pool);
    VT_OK(vram_malloc(fx->pool, sizes[i], VT_STREAM(7), &c));
    VT_VALID(fx->pool);
    VT_OK(vram_free(fx->pool, a));
    VT_VALID(fx->pool);
    VT_OK(vram_free(fx->pool, b)); /* b merges into a's free block */
    VT_VALID(fx->pool);
    fx_resnap(fx);
    VT_EXPECT(vram_free(fx->pool, b), VRAM_EDOUBLEFREE);
    VT_VALID(fx->pool);
    fx_intact(fx);
    VT_EXPECT(vram_free(fx->pool, a), VRAM_EDOUBLEFREE);
    VT_VALID(fx->pool);
    fx_intact(fx);
    VT_OK(vram_free(fx->pool, c));
    VT_VALID(fx->pool);
    fx_resnap(fx);
  }
}

static void t_foreign(void **state) {
  fixture *fx = (fixture *)*state;
  int on_stack = 0;
  void *heap = malloc(64);
  assert_non_null(heap);
  void *bad[] = {
      (char *)fx->p[3] + 512,  /* inside a live 1 MiB block */
      (char *)fx->p[5] + 4096, /* inside a live 17 MiB block */
      (char *)fx->p[1] + 1,    /* unaligned, inside a live block */
      &on_stack,
      heap,
      (void *)(uintptr_t)512,
      (void *)(uintptr_t)-512,
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    VT_EXPECT(vram_free(fx->pool, bad[i]), VRAM_EFOREIGN);
    VT_VALID(fx->pool);
    fx_intact(fx);
    VT_EXPECT(vram_block_info(fx->pool, bad[i], NULL, NULL), VRAM_EFOREIGN);
    fx_intact(fx);
    VT_EXPECT(vram_record_stream(fx->pool, bad[i], VT_STREAM(9)), VRAM_EFOREIGN);
    VT_VALID(fx->pool);
    fx_intact(fx);
  }
  free(heap);
  /* A pointer from another pool is foreign to this one, and stays live in its own. (The
   * other pool is on another device: two sim pools of one device model two whole devices
   * and may hand out the same addresses.) */
  vram_options_t o;
  vram_options_init(&o);
  o.source = g_src.kind;
  o.device = 1;
  o.sim_capacity = 256 * VT_MiB;
  vram_pool_t *other = NULL;
  VT_OK(vram_pool_create(&other, &o));
  void *q = NULL;
  VT_OK(vram_malloc(other, 5000, NULL, &q));
  VT_VALID(other);
  VT_EXPECT(vram_free(fx->pool, q), VRAM_EFOREIGN);
  VT_VALID(fx->pool);
  fx_intact(fx);
  size_t r = 0;
  VT_OK(vram_block_info(other, q, &r, NULL));
  assert_int_equal(r, 5000);
  VT_EXPECT(vram_free(other, fx->p[0]), VRAM_EFOREIGN);
  VT_VALID(other);
  fx_intact(fx);
  VT_OK(vram_free(other, q));
  VT_VALID(other);
  VT_OK(vram_pool_destroy(other));
}

/* A size no device can hold is out of memory at once: the report names the size and the
 * device's capacity, the OOM counter counts it, and nothing else moves (no cached memory
 * goes back for it). */
static void t_too_big(void **state) {
  fixture *fx = (fixture *)*state;
  static const size_t sizes[] = {((size_t)1 << 48) + 1, (size_t)1 << 63, SIZE_MAX,
                                 SIZE_MAX - 100, SIZE_MAX - 510, SIZE_MAX - 511,
                                 SIZE_MAX - 512 + 1, SIZE_MAX / 2, (size_t)1 << 50,
                                 2 * VT_GiB, 1 * VT_GiB + 1};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    for (int on_stream = 0; on_stream < 2; on_stream++) {
      void *p = (void *)fx;
      vram_stream_t stream = on_stream ? VT_STREAM(3) : NULL;
      VT_EXPECT(vram_malloc(fx->pool, sizes[i], stream, &p), VRAM_ENOMEM);
      VT_VALID(fx->pool);
      assert_null(p);
      fx->snap.num_ooms++;
      fx_intact(fx);
      char report[2048];
      vram_oom_report(fx->pool, report, sizeof report);
      char bytes[64];
      snprintf(bytes, sizeof bytes, "(%zu bytes)", sizes[i]);
      if (!strstr(report, bytes) || !strstr(report, "more than device 0's capacity of 1.0 GiB"))
        fail_msg("malloc(%zu): the report names neither the size nor the capacity:\n%s",
                 sizes[i], report);
      if (!strstr(report, on_stream ? "on stream 0x3" : "on the default stream"))
        fail_msg("malloc(%zu): the report does not name the stream:\n%s", sizes[i], report);
    }
  }
}

/* An ordinary OOM report speaks of streams and remedies as a user knows them: the NULL
 * stream is the default stream, and the advice names no C function. */
static void t_oom_report_words(void **state) {
  fixture *fx = (fixture *)*state;
  void *p = NULL;
  VT_EXPECT(vram_malloc(fx->pool, 1 * VT_GiB, NULL, &p), VRAM_ENOMEM);
  VT_VALID(fx->pool);
  char report[2048];
  vram_oom_report(fx->pool, report, sizeof report);
  if (!strstr(report, "on the default stream") || strstr(report, "(nil)") ||
      strstr(report, "vram_"))
    fail_msg("the OOM report names a NULL stream or a C function:\n%s", report);
  if (!vt_mentions_size(report, 1 * VT_GiB))
    fail_msg("the OOM report does not name the size:\n%s", report);
  fx_resnap(fx); /* the ladder gave cached memory back */
  fx_intact(fx);
}

/* The error callback hears of every failing malloc and free, with a message. */
static void t_error_callback(void **state) {
  fixture *fx = (fixture *)*state;
  void *p = NULL;
  int errs = fx->errors_seen;
  VT_EXPECT(vram_free(fx->pool, (char *)fx->p[4] + 1024), VRAM_EFOREIGN);
  VT_VALID(fx->pool);
  assert_int_equal(fx->errors_seen, ++errs);
  assert_int_equal(fx->last_error, VRAM_EFOREIGN);
  VT_EXPECT(vram_malloc(fx->pool, 2 * VT_GiB, NULL, &p), VRAM_ENOMEM);
  VT_VALID(fx->pool);
  assert_int_equal(fx->errors_seen, ++errs);
  assert_int_equal(fx->last_error, VRAM_ENOMEM);
  fx_resnap(fx);
  VT_EXPECT(vram_malloc(fx->pool, SIZE_MAX, NULL, &p), VRAM_ENOMEM);
  VT_VALID(fx->pool);
  fx->snap.num_ooms++;
  fx_intact(fx);
  if (fx->errors_seen != errs + 1 || fx->last_error != VRAM_ENOMEM)
    fail_msg("malloc(SIZE_MAX) failed with VRAM_ENOMEM but the error callback was %s",
             fx->errors_seen == errs ? "not called" : "called with another status");
}

static void t_bad_device(void **state) {
  (void)state;
  static const int bad[] = {-1, -1000, 8, 1000, 1 << 30};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    vram_options_t o;
    vram_options_init(&o);
    o.source = g_src.kind;
    o.device = bad[i];
    vram_pool_t *pool = (vram_pool_t *)&o;
    VT_EXPECT(vram_pool_create(&pool, &o), VRAM_EDEVICE);
    assert_null(pool);
  }
  vram_options_t o;
  vram_options_init(&o);
  o.source = g_src.kind;
  o.device = 7;
  vram_pool_t *pool = NULL;
  VT_OK(vram_pool_create(&pool, &o));
  VT_VALID(pool);
  VT_OK(vram_pool_destroy(pool));
}

static void t_null_args(void **state) {
  fixture *fx = (fixture *)*state;
  vram_pool_t *pool = fx->pool;
  void *p = NULL;
  size_t a = 0, b = 0;
  vram_stats_t st;
  char buf[64];
  vram_options_t o;
  vram_options_init(&o);
  o.source = g_src.kind;
  vram_source_kind kind;
  int count = 0;
  double frac = 0;

  VT_EXPECT(vram_pool_create(NULL, &o), VRAM_EINVAL);
  VT_EXPECT(vram_malloc(NULL, 16, NULL, &p), VRAM_EINVAL);
  VT_EXPECT(vram_malloc(pool, 16, NULL, NULL), VRAM_EINVAL);
  VT_VALID(pool);
  fx_intact(fx);
  VT_EXPECT(vram_free(NULL, fx->p[0]), VRAM_EINVAL);
  VT_EXPECT(vram_record_stream(NULL, fx->p[0], NULL), VRAM_EINVAL);
  VT_EXPECT(vram_block_info(NULL, fx->p[0], &a, NULL), VRAM_EINVAL);
  VT_EXPECT(vram_empty_cache(NULL), VRAM_EINVAL);
  VT_EXPECT(vram_set_limit(NULL, 1 << 20, 0), VRAM_EINVAL);
  VT_EXPECT(vram_get_stats(NULL, &st), VRAM_EINVAL);
  VT_EXPECT(vram_get_stats(pool, NULL), VRAM_EINVAL);
  VT_EXPECT(vram_reset_peak_stats(NULL), VRAM_EINVAL);
  VT_EXPECT(vram_mem_get_info(NULL, &a, &b), VRAM_EINVAL);
  VT_EXPECT(vram_mem_get_info(pool, NULL, &b), VRAM_EINVAL);
  VT_EXPECT(vram_mem_get_info(pool, &a, NULL), VRAM_EINVAL);
  VT_EXPECT(vram_summary(NULL, buf, sizeof buf), VRAM_EINVAL);
  VT_EXPECT(vram_stats_json(NULL, buf, sizeof buf), VRAM_EINVAL);
  VT_EXPECT(vram_oom_report(NULL, buf, sizeof buf), VRAM_EINVAL);
  VT_EXPECT(vram_set_error_callback(NULL, NULL, NULL), VRAM_EINVAL);
  VT_EXPECT(vram_for_each_block(NULL, vt_collect_fn, NULL), VRAM_EINVAL);
  VT_EXPECT(vram_for_each_block(pool, NULL, NULL), VRAM_EINVAL);
  VT_EXPECT(vram_pool_destroy(NULL), VRAM_EINVAL);
  VT_EXPECT(vram_pool_destroy_force(NULL), VRAM_EINVAL);
  VT_EXPECT(vram_default_pool(0, NULL), VRAM_EINVAL);
  VT_EXPECT(vram_device_count(VRAM_SOURCE_SIM, NULL), VRAM_EINVAL);
  VT_EXPECT(vram_source_parse(NULL, &kind), VRAM_EINVAL);
  VT_EXPECT(vram_source_parse("sim", NULL), VRAM_EINVAL);
  VT_EXPECT(vram_options_from_env(NULL, NULL), VRAM_EINVAL);
  VT_EXPECT(vram_parse_size(NULL, 0, &a, &frac), VRAM_EINVAL);
  VT_EXPECT(vram_parse_size("1K", 0, NULL, &frac), VRAM_EINVAL);
  (void)count;
  fx_intact(fx);
  /* record_stream / block_info with a NULL pointer are refused, not crashes. */
  assert_int_not_equal(vram_record_stream(pool, NULL, NULL), VRAM_OK);
  assert_int_not_equal(vram_block_info(pool, NULL, &a, NULL), VRAM_OK);
  fx_intact(fx);
  /* A NULL callback unsets it. */
  VT_OK(vram_set_error_callback(pool, NULL, NULL));
  VT_EXPECT(vram_free(pool, (char *)fx->p[3] + 512), VRAM_EFOREIGN);
  VT_VALID(pool);
  VT_OK(vram_set_error_callback(pool, on_error, fx));
  fx_intact(fx);
}

static void t_bad_limit(void **state) {
  fixture *fx = (fixture *)*state;
  static const double bad[] = {-0.5, 1.5, -1e-9, 1e300};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    VT_EXPECT(vram_set_limit(fx->pool, 0, bad[i]), VRAM_EINVAL);
    VT_VALID(fx->pool);
    fx_intact(fx);
  }
  VT_EXPECT(vram_set_limit(fx->pool, 0, NAN), VRAM_EINVAL);
  VT_VALID(fx->pool);
  fx_intact(fx);
  vram_options_t o;
  vram_options_init(&o);
  o.source = g_src.kind;
  o.limit_fraction = 2.0;
  vram_pool_t *pool = NULL;
  VT_EXPECT(vram_pool_create(&pool, &o), VRAM_EINVAL);
  assert_null(pool);
  vram_options_init(&o);
  o.source = g_src.kind;
  o.preallocate_fraction = -0.25;
  VT_EXPECT(vram_pool_create(&pool, &o), VRAM_EINVAL);
  assert_null(pool);
}

/* Bad streams of calls on pending blocks: free and record_stream of a block waiting for
 * its events are double frees. */
static void t_pending_misuse(void **state) {
  fixture *fx = (fixture *)*state;
  void *p = NULL;
  VT_OK(vram_malloc(fx->pool, 8192, VT_STREAM(1), &p));
  VT_VALID(fx->pool);
  VT_OK(vram_record_stream(fx->pool, p, VT_STREAM(2)));
  VT_VALID(fx->pool);
  VT_OK(vram_free(fx->pool, p));
  VT_VALID(fx->pool);
  fx_resnap(fx);
  VT_EXPECT(vram_free(fx->pool, p), VRAM_EDOUBLEFREE);
  VT_VALID(fx->pool);
  fx_intact(fx);
  VT_EXPECT(vram_record_stream(fx->pool, p, VT_STREAM(3)), VRAM_EDOUBLEFREE);
  VT_VALID(fx->pool);
  fx_intact(fx);
  assert_int_not_equal(vram_block_info(fx->pool, p, NULL, NULL), VRAM_OK);
  fx_intact(fx);
}

/* ---- environment ------------------------------------------------------------------- */

static const char *const env_vars[] = {"VRAMKIT_SOURCE", "VRAMKIT_LIMIT",
                                       "VRAMKIT_PREALLOCATE", "VRAMKIT_RELEASE_THRESHOLD",
                                       "VRAMKIT_TIGHT_THRESHOLD", "VRAMKIT_SIM_CAPACITY"};

static void env_clear(void) {
  for (size_t i = 0; i < sizeof env_vars / sizeof env_vars[0]; i++) unsetenv(env_vars[i]);
}

static void t_bad_env(void **state) {
  (void)state;
  static const struct {
    const char *var, *value;
  } bad[] = {
      {"VRAMKIT_LIMIT", "abc"},          {"VRAMKIT_LIMIT", "12Q"},
      {"VRAMKIT_LIMIT", "-1G"},          {"VRAMKIT_LIMIT", "150%"},
      {"VRAMKIT_SOURCE", "nope"},
      {"VRAMKIT_SOURCE", "sim:nope"},    {"VRAMKIT_SIM_CAPACITY", "-5"},
      {"VRAMKIT_SIM_CAPACITY", "50%"},   {"VRAMKIT_SIM_CAPACITY", "lots"},
      {"VRAMKIT_PREALLOCATE", "150%"},   {"VRAMKIT_PREALLOCATE", "-10%"},
      {"VRAMKIT_PREALLOCATE", "1.5.3G"}, {"VRAMKIT_RELEASE_THRESHOLD", "x"},
      {"VRAMKIT_LIMIT", "99999999999999T"},
      {"VRAMKIT_TIGHT_THRESHOLD", "1.5"}, {"VRAMKIT_TIGHT_THRESHOLD", "-0.1"},
      {"VRAMKIT_TIGHT_THRESHOLD", "half"}, {"VRAMKIT_TIGHT_THRESHOLD", "0.5.5"},
      {"VRAMKIT_TIGHT_THRESHOLD", "nan"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    env_clear();
    assert_int_equal(setenv(bad[i].var, bad[i].value, 1), 0);
    /* A good value elsewhere must not be applied either when one is bad. */
    if (strcmp(bad[i].var, "VRAMKIT_SIM_CAPACITY") != 0)
      assert_int_equal(setenv("VRAMKIT_SIM_CAPACITY", "2G", 1), 0);
    vram_options_t o, copy;
    memset(&o, 0, sizeof o);
    vram_options_init(&o);
    o.limit_bytes = 12345 * 512;
    o.source = VRAM_SOURCE_SIM_VMM;
    memcpy(&copy, &o, sizeof o);
    const char *why = NULL;
    int rc = vram_options_from_env(&o, &why);
    if (rc != VRAM_EENV)
      fail_msg("%s=\"%s\": got %s, expected VRAM_EENV", bad[i].var, bad[i].value,
               vram_errname(rc));
    assert_non_null(why);
    if (!strstr(why, bad[i].var))
      fail_msg("%s=\"%s\": why = \"%s\" does not name the variable", bad[i].var, bad[i].value,
               why);
    assert_memory_equal(&o, &copy, sizeof o);
    /* why is optional. */
    VT_EXPECT(vram_options_from_env(&o, NULL), VRAM_EENV);
    assert_memory_equal(&o, &copy, sizeof o);
  }
  /* Good values are applied. */
  env_clear();
  setenv("VRAMKIT_SOURCE", "sim:vmm", 1);
  setenv("VRAMKIT_LIMIT", "50%", 1);
  setenv("VRAMKIT_SIM_CAPACITY", "1G", 1);
  setenv("VRAMKIT_PREALLOCATE", "64M", 1);
  setenv("VRAMKIT_RELEASE_THRESHOLD", "2MiB", 1);
  setenv("VRAMKIT_TIGHT_THRESHOLD", "90%", 1);
  vram_options_t o;
  vram_options_init(&o);
  const char *why = "untouched";
  VT_OK(vram_options_from_env(&o, &why));
  assert_int_equal(o.source, VRAM_SOURCE_SIM_VMM);
  assert_int_equal(o.limit_bytes, 0);
  assert_true(o.limit_fraction > 0.4999 && o.limit_fraction < 0.5001);
  assert_int_equal(o.sim_capacity, 1 * VT_GiB);
  assert_int_equal(o.preallocate_bytes, 64 * VT_MiB);
  assert_int_equal(o.release_threshold, 2 * VT_MiB);
  assert_true(o.tight_threshold > 0.8999 && o.tight_threshold < 0.9001);
  setenv("VRAMKIT_TIGHT_THRESHOLD", "0", 1);
  VT_OK(vram_options_from_env(&o, &why));
  assert_true(o.tight_threshold == 0.0);
  setenv("VRAMKIT_LIMIT", "256M", 1);
  VT_OK(vram_options_from_env(&o, &why));
  assert_int_equal(o.limit_bytes, 256 * VT_MiB);
  env_clear();
  /* No variables: nothing changes. */
  vram_options_t copy;
  memcpy(&copy, &o, sizeof o);
  VT_OK(vram_options_from_env(&o, NULL));
  assert_memory_equal(&o, &copy, sizeof o);
}

static void t_parse_size(void **state) {
  (void)state;
  static const struct {
    const char *text;
    size_t bytes;
  } good[] = {
      {"512", 512},
      {"0", 0},
      {"64K", 64 * VT_KiB},
      {"64KiB", 64 * VT_KiB},
      {"1.5G", 3 * VT_GiB / 2},
      {"2MiB", 2 * VT_MiB},
      {"2M", 2 * VT_MiB},
      {"80G", 80 * VT_GiB},
      {"1T", (size_t)1 << 40},
      {"0.5K", 512},
      {"8GB", 8 * VT_GiB},
      {"8gib", 8 * VT_GiB},
      {"512B", 512},
      {"1.0", 1},
      {"0.1G", 107374183}, /* a decimal of a unit rounds up to a whole byte */
      {"18446744073709551615", SIZE_MAX},
      {"1.125T", ((size_t)9 << 40) / 8},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    size_t bytes = 777;
    double frac = 0.77;
    int rc = vram_parse_size(good[i].text, 0, &bytes, &frac);
    if (rc != VRAM_OK) fail_msg("parse_size(\"%s\") = %s", good[i].text, vram_errname(rc));
    if (bytes != good[i].bytes)
      fail_msg("parse_size(\"%s\") = %zu, expected %zu", good[i].text, bytes, good[i].bytes);
    VT_OK(vram_parse_size(good[i].text, 1, &bytes, &frac));
    assert_int_equal(bytes, good[i].bytes);
  }
  size_t bytes = 1;
  double frac = 0;
  VT_OK(vram_parse_size("30%", 1, &bytes, &frac));
  assert_int_equal(bytes, 0);
  assert_true(fabs(frac - 0.30) < 1e-9);
  VT_OK(vram_parse_size("100%", 1, &bytes, &frac));
  assert_true(fabs(frac - 1.0) < 1e-9);
  bytes = 4242;
  frac = 0.25;
  VT_EXPECT(vram_parse_size("30%", 0, &bytes, &frac), VRAM_EINVAL);
  static const char *const junk[] = {
      "",     "junk", "12Q",  "K",    "-5",   "1.2.3", "5 K x", "%",
      "1e99", "99999999999999T", "18446744073709551616", "99999999999999999999999",
      "-10%", "nan",  "inf",
      /* One grammar: no hex, exponents, signs, spaces or fractions of a byte. */
      "0x10G", "1.5", "1e-300", "1E3", "5 G", "1G ", " 1G", "+1G", "-1G", ".5G", "5.G", "1Ki",
      "1.5B", "0%", "101%", "50 %", "1G\t", "1.0000000000000000001G",
  };
  for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
    bytes = 4242;
    frac = 0.25;
    int rc = vram_parse_size(junk[i], 1, &bytes, &frac);
    if (rc != VRAM_EINVAL)
      fail_msg("parse_size(\"%s\") = %s (bytes %zu), expected VRAM_EINVAL", junk[i],
               vram_errname(rc), bytes);
    if (!vram_parse_size_error(junk[i], 1)) fail_msg("no reason given for \"%s\"", junk[i]);
  }
  /* The reason says what is wrong, in words a user can act on. */
  static const struct {
    const char *text, *words;
  } why[] = {{"-1G", "negative"},     {"0x10G", "hexadecimal"}, {"1e-300", "exponent"},
             {"5 G", "spaces"},       {"1.5", "fraction of a byte"},
             {"30%", "percentage is not allowed"}, {"99999999999999T", "2^64"}};
  for (size_t i = 0; i < sizeof why / sizeof why[0]; i++) {
    const char *reason = vram_parse_size_error(why[i].text, 0);
    if (!reason || !strstr(reason, why[i].words))
      fail_msg("parse_size_error(\"%s\") = \"%s\", expected words \"%s\"", why[i].text,
               reason ? reason : "(null)", why[i].words);
  }
  assert_null(vram_parse_size_error("1.5G", 0));
}

/* ---- the sim's capacity ---------------------------------------------------------------- */

/* A pool of the picked sim source with this capacity, or the status of its creation. */
static int sim_pool(size_t capacity, vram_pool_t **pool) {
  vram_options_t o;
  vram_options_init(&o);
  o.source = g_src.kind;
  o.sim_capacity = capacity;
  *pool = (vram_pool_t *)&o; /* must come back NULL on failure */
  return vram_pool_create(pool, &o);
}

/* Capacities outside what the sim models are refused at creation with their own status;
 * every capacity inside it, up to the largest, serves large requests on two streams. */
static void t_sim_capacity_range(void **state) {
  (void)state;
  static const size_t refused[] = {0, VRAM_SIM_MAX_CAPACITY + 1, (size_t)1 << 63, SIZE_MAX};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    vram_pool_t *pool;
    int rc = sim_pool(refused[i], &pool);
    if (rc != VRAM_ESIMCAPACITY)
      fail_msg("sim_capacity %zu: %s, expected VRAM_ESIMCAPACITY", refused[i], vram_errname(rc));
    assert_null(pool);
  }
  assert_non_null(strstr(vram_strerror(VRAM_ESIMCAPACITY), "256 TiB"));
  static const size_t served[] = {(size_t)1 << 45, (size_t)1 << 46, (size_t)1 << 47,
                                  VRAM_SIM_MAX_CAPACITY};
  for (size_t i = 0; i < sizeof served / sizeof served[0]; i++) {
    size_t capacity = served[i];
    vram_pool_t *pool;
    VT_OK(sim_pool(capacity, &pool));
    size_t free_bytes = 0, total = 0;
    VT_OK(vram_mem_get_info(pool, &free_bytes, &total));
    assert_true(free_bytes == capacity && total == capacity);
    /* Large requests on two streams: two virtual ranges of 1.25 times the capacity. The
     * sim keeps a byte per mapped 2 MiB, so the sizes stay modest. */
    void *a = NULL, *b = NULL, *c = NULL;
    int rc = vram_malloc(pool, 16 * VT_GiB, NULL, &a);
    if (rc != VRAM_OK) {
      char report[2048];
      vram_oom_report(pool, report, sizeof report);
      fail_msg("capacity %zu: malloc(16 GiB): %s\n%s", capacity, vram_errname(rc), report);
    }
    VT_OK(vram_malloc(pool, 8 * VT_GiB, VT_STREAM(1), &b));
    VT_OK(vram_malloc(pool, 3 * VT_MiB, NULL, &c));
    VT_VALID(pool);
    VT_OK(vram_free(pool, a));
    VT_OK(vram_free(pool, b));
    VT_OK(vram_free(pool, c));
    VT_OK(vram_pool_destroy(pool));
  }
}

/* A statistic's total sums every increase: past INT64_MAX it stays there, never wrapping
 * to a negative figure. 2^16 + 1 blocks of 2^47 bytes, each freed before the next, on
 * fixed segments (one segment, cached: a source call once, no granule tables). */
static void t_stat_totals_saturate(void **state) {
  (void)state;
  if (g_src.kind != VRAM_SOURCE_SIM) skip();
  vram_options_t o;
  vram_options_init(&o);
  o.source = VRAM_SOURCE_SIM;
  o.sim_capacity = VRAM_SIM_MAX_CAPACITY;
  o.large_blocks = VRAM_LARGE_FIXED;
  o.virtual_threshold = 1.0;
  vram_pool_t *pool = vt_pool_from(&o);
  const size_t size = (size_t)1 << 47;
  for (int i = 0; i <= 1 << 16; i++) {
    void *p = NULL;
    VT_OK(vram_malloc(pool, size, NULL, &p));
    VT_OK(vram_free(pool, p));
  }
  VT_VALID(pool);
  vram_stats_t s = vt_stats(pool);
  assert_true(s.allocated_bytes.total == INT64_MAX);
  assert_true(s.requested_bytes.total == INT64_MAX);
  assert_true(s.active_bytes.total == INT64_MAX);
  assert_int_equal(s.allocated_bytes.current, 0);
  assert_int_equal(s.allocated_bytes.peak, (int64_t)size);
  assert_int_equal(s.allocation.total, (1 << 16) + 1);
  char text[8192];
  vram_summary(pool, text, sizeof text);
  if (!strstr(text, "8.00 EiB") || strstr(text, "| -")) fail_msg("totals:\n%s", text);
  VT_OK(vram_pool_destroy(pool));
}

/* ---- status strings and source names ------------------------------------------------- */

static void t_status_strings(void **state) {
  (void)state;
  static const struct {
    int code;
    const char *name, *text;
  } all[] = {
#define ROW(name, value, text) {value, #name, text},
      VRAM_STATUS_LIST(ROW)
#undef ROW
  };
  enum { N = sizeof all / sizeof all[0] };
  assert_true(N >= 15);
  for (int i = 0; i < N; i++) {
    const char *msg = vram_strerror(all[i].code), *name = vram_errname(all[i].code);
    assert_non_null(msg);
    assert_non_null(name);
    assert_string_equal(name, all[i].name);
    assert_string_equal(msg, all[i].text);
    assert_null(strstr(msg, "unknown"));
    for (int j = 0; j < i; j++) {
      assert_int_not_equal(all[i].code, all[j].code);
      assert_string_not_equal(msg, vram_strerror(all[j].code));
      assert_string_not_equal(name, vram_errname(all[j].code));
    }
  }
  static const int unknown[] = {1, 2, 100, VRAM_ETOOBIG, -18, -19, -1000, INT32_MIN, INT32_MAX};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    assert_true(vt_contains_ci(vram_strerror(unknown[i]), "unknown"));
    assert_true(vt_contains_ci(vram_errname(unknown[i]), "unknown"));
  }
}

static void t_source_names(void **state) {
  (void)state;
  static const struct {
    const char *text;
    vram_source_kind kind;
  } names[] = {{"sim", VRAM_SOURCE_SIM},         {"sim:cuda", VRAM_SOURCE_SIM},
               {"sim:vmm", VRAM_SOURCE_SIM_VMM}, {"cuda", VRAM_SOURCE_CUDA},
               {"vmm", VRAM_SOURCE_VMM},         {"managed", VRAM_SOURCE_MANAGED},
               {"auto", VRAM_SOURCE_AUTO}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    vram_source_kind k = (vram_source_kind)-1;
    VT_OK(vram_source_parse(names[i].text, &k));
    assert_int_equal(k, names[i].kind);
    const char *back = vram_source_name(k);
    assert_non_null(back);
    vram_source_kind k2 = (vram_source_kind)-1;
    VT_OK(vram_source_parse(back, &k2));
    assert_int_equal(k2, k);
  }
  static const char *const bad[] = {"", "nope", "SIMX", "sim:", "sim:vmmx", "cuda "};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    vram_source_kind k = VRAM_SOURCE_CUDA;
    VT_EXPECT(vram_source_parse(bad[i], &k), VRAM_EINVAL);
  }
  /* The spellings are exactly the names above, each parsed to its kind. */
  size_t n = 0;
  for (const char *name; (name = vram_source_spelling(n)) != NULL; n++) {
    vram_source_kind k = (vram_source_kind)-1;
    VT_OK(vram_source_parse(name, &k));
    bool listed = false;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
      listed |= strcmp(names[i].text, name) == 0 && names[i].kind == k;
    assert_true(listed);
  }
  assert_int_equal(n, sizeof names / sizeof names[0]);
}

/* Each source's host model: sim for the fixed sources, sim:vmm for vmm, and managed as
 * fixed segments throughout; every other option kept. */
static void t_host_models(void **state) {
  (void)state;
  static const struct {
    vram_source_kind source, model;
  } models[] = {{VRAM_SOURCE_CUDA, VRAM_SOURCE_SIM},         {VRAM_SOURCE_SIM, VRAM_SOURCE_SIM},
                {VRAM_SOURCE_MANAGED, VRAM_SOURCE_SIM},      {VRAM_SOURCE_VMM, VRAM_SOURCE_SIM_VMM},
                {VRAM_SOURCE_SIM_VMM, VRAM_SOURCE_SIM_VMM}, {VRAM_SOURCE_AUTO, VRAM_SOURCE_SIM}};
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
    vram_options_t o;
    vram_options_init(&o);
    o.source = models[i].source;
    o.limit_bytes = 3 * VT_MiB;
    o.tight_threshold = 0.25;
    VT_OK(vram_options_host_model(&o));
    assert_int_equal(o.source, models[i].model);
    assert_int_equal(o.limit_bytes, 3 * VT_MiB);
    assert_true(o.tight_threshold == 0.25);
    bool managed = models[i].source == VRAM_SOURCE_MANAGED;
    assert_int_equal(o.large_blocks, managed ? VRAM_LARGE_FIXED : VRAM_LARGE_VIRTUAL);
    assert_true(managed ? o.virtual_threshold == 1.0 : o.virtual_threshold < 1.0);
  }
  VT_EXPECT(vram_options_host_model(NULL), VRAM_EINVAL);
}

int main(int argc, char **argv) {
  if (!vt_source_pick(argc, argv, &g_src) || !g_src.is_sim) {
    fprintf(stderr, "test_bad_input: needs a sim source, got '%s'\n", g_src.name);
    return 2;
  }
  env_clear();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_host_models),
      cmocka_unit_test_setup_teardown(t_double_free, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(t_double_free_after_coalesce, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(t_foreign, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(t_too_big, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(t_oom_report_words, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(t_error_callback, fx_setup, fx_teardown),
      cmocka_unit_test(t_bad_device),
      cmocka_unit_test_setup_teardown(t_null_args, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(t_bad_limit, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(t_pending_misuse, fx_setup, fx_teardown),
      cmocka_unit_test(t_bad_env),
      cmocka_unit_test(t_parse_size),
      cmocka_unit_test(t_sim_capacity_range),
      cmocka_unit_test(t_stat_totals_saturate),
      cmocka_unit_test(t_status_strings),
      cmocka_unit_test(t_source_names),
  };
  char group[64];
  snprintf(group, sizeof group, "bad_input[%s]", g_src.name);
  return cmocka_run_group_tests_name(group, tests, NULL, NULL) ? 1 : 0;
}

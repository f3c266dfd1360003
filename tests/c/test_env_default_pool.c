/* test_env_default_pool.c - the process-wide default pools and the VRAMKIT_* variables.
 *
 * vram_default_pool(device) creates a device's pool on first use from the environment and
 * returns the same pool afterwards. With VRAMKIT_SOURCE=sim and VRAMKIT_SIM_CAPACITY=1G:
 * one pool per device, the capacity enforced, VRAMKIT_LIMIT and VRAMKIT_PREALLOCATE
 * applied; a bad variable makes vram_default_pool return VRAM_EENV (and creates nothing,
 * so a later call with a fixed environment succeeds); bad devices give VRAM_EDEVICE.
 * The tests run in order in one process: the default pools are process state.
 */
#include <string.h>

#include "vt.h"

static void env_reset(void) {
  unsetenv("VRAMKIT_LIMIT");
  unsetenv("VRAMKIT_PREALLOCATE");
  unsetenv("VRAMKIT_RELEASE_THRESHOLD");
  unsetenv("VRAMKIT_TIGHT_THRESHOLD");
  setenv("VRAMKIT_SOURCE", "sim", 1);
  setenv("VRAMKIT_SIM_CAPACITY", "1G", 1);
}

static void t_same_pool_and_capacity(void **state) {
  (void)state;
  env_reset();
  vram_pool_t *a = NULL, *b = NULL;
  VT_OK(vram_default_pool(0, &a));
  assert_non_null(a);
  VT_OK(vram_default_pool(0, &b));
  assert_ptr_equal(a, b);
  VT_VALID(a);
  assert_int_equal(vram_pool_source(a), VRAM_SOURCE_SIM);
  assert_int_equal(vram_pool_device(a), 0);
  size_t fr = 0, total = 0;
  VT_OK(vram_mem_get_info(a, &fr, &total));
  assert_int_equal(total, 1 * VT_GiB);
  void *p = NULL;
  VT_EXPECT(vram_malloc(a, 1 * VT_GiB + 1, NULL, &p), VRAM_ENOMEM);
  VT_VALID(a);
  VT_EXPECT(vram_malloc(a, 2 * VT_GiB, NULL, &p), VRAM_ENOMEM);
  VT_VALID(a);
  void *x = NULL, *y = NULL;
  VT_OK(vram_malloc(a, 600 * VT_MiB, NULL, &x));
  VT_VALID(a);
  VT_EXPECT(vram_malloc(a, 600 * VT_MiB, NULL, &y), VRAM_ENOMEM);
  VT_VALID(a);
  VT_OK(vram_free(a, x));
  VT_VALID(a);
  VT_OK(vram_malloc(a, 1 * VT_GiB, NULL, &y)); /* the whole device, after the ladder */
  VT_VALID(a);
  VT_OK(vram_free(a, y));
  VT_VALID(a);
  VT_OK(vram_empty_cache(a));
  VT_VALID(a);
  /* Changing the environment later does not touch the existing pool. */
  setenv("VRAMKIT_SIM_CAPACITY", "64M", 1);
  VT_OK(vram_default_pool(0, &b));
  assert_ptr_equal(a, b);
  VT_OK(vram_mem_get_info(b, &fr, &total));
  assert_int_equal(total, 1 * VT_GiB);
  env_reset();
}

static void t_bad_env(void **state) {
  (void)state;
  static const struct {
    const char *var, *value;
  } bad[] = {{"VRAMKIT_LIMIT", "abc"},
             {"VRAMKIT_SOURCE", "nope"},
             {"VRAMKIT_SIM_CAPACITY", "-5"},
             {"VRAMKIT_PREALLOCATE", "150%"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    env_reset();
    setenv(bad[i].var, bad[i].value, 1);
    vram_pool_t *p = NULL;
    int rc = vram_default_pool(1, &p);
    if (rc != VRAM_EENV)
      fail_msg("%s=%s: vram_default_pool = %s, expected VRAM_EENV", bad[i].var, bad[i].value,
               vram_errname(rc));
    /* The device-0 pool exists already: it is returned whatever the environment says. */
    vram_pool_t *zero = NULL;
    VT_OK(vram_default_pool(0, &zero));
    VT_VALID(zero);
  }
  /* With the environment fixed, device 1 gets its pool: a failure created nothing. */
  env_reset();
  vram_pool_t *one = NULL, *zero = NULL;
  VT_OK(vram_default_pool(1, &one));
  VT_OK(vram_default_pool(0, &zero));
  assert_non_null(one);
  assert_ptr_not_equal(one, zero);
  assert_int_equal(vram_pool_device(one), 1);
  void *p = NULL;
  VT_OK(vram_malloc(one, 5000, NULL, &p));
  VT_VALID(one);
  VT_OK(vram_free(one, p));
  VT_VALID(one);
}

static void t_limit_and_preallocate_from_env(void **state) {
  (void)state;
  env_reset();
  setenv("VRAMKIT_LIMIT", "256M", 1);
  vram_pool_t *p2 = NULL;
  VT_OK(vram_default_pool(2, &p2));
  vram_stats_t s = vt_stats(p2);
  assert_int_equal(s.limit_bytes, 256 * VT_MiB);
  void *p = NULL;
  VT_EXPECT(vram_malloc(p2, 300 * VT_MiB, NULL, &p), VRAM_ENOMEM);
  VT_VALID(p2);

  env_reset();
  setenv("VRAMKIT_LIMIT", "25%", 1);
  setenv("VRAMKIT_PREALLOCATE", "64M", 1);
  vram_pool_t *p3 = NULL;
  VT_OK(vram_default_pool(3, &p3));
  s = vt_stats(p3);
  assert_int_equal(s.limit_bytes, 256 * VT_MiB);
  assert_true(s.reserved_bytes.current >= (int64_t)(64 * VT_MiB));
  VT_OK(vram_malloc(p3, 32 * VT_MiB, NULL, &p));
  VT_VALID(p3);
  assert_int_equal(vt_stats(p3).num_device_alloc, s.num_device_alloc);
  VT_OK(vram_free(p3, p));
  VT_VALID(p3);
  env_reset();
}

static void t_bad_device(void **state) {
  (void)state;
  env_reset();
  vram_pool_t *p = NULL;
  VT_EXPECT(vram_default_pool(-1, &p), VRAM_EDEVICE);
  VT_EXPECT(vram_default_pool(8, &p), VRAM_EDEVICE);
  VT_EXPECT(vram_default_pool(1000, &p), VRAM_EDEVICE);
  VT_EXPECT(vram_default_pool(0, NULL), VRAM_EINVAL);
}

/* vram_options_set parses exactly as the environment does, and rejects what it would. */
static void t_options_set(void **state) {
  (void)state;
  vram_options_t o, before;
  vram_options_init(&o);
  const char *why = NULL;
  VT_OK(vram_options_set(&o, "VRAMKIT_SOURCE", "sim:vmm", &why));
  assert_int_equal(o.source, VRAM_SOURCE_SIM_VMM);
  VT_OK(vram_options_set(&o, "VRAMKIT_LIMIT", "30%", &why));
  assert_true(o.limit_bytes == 0 && o.limit_fraction > 0.299 && o.limit_fraction < 0.301);
  VT_OK(vram_options_set(&o, "VRAMKIT_SIM_CAPACITY", "2G", &why));
  assert_int_equal(o.sim_capacity, 2 * VT_GiB);
  before = o;
  VT_EXPECT(vram_options_set(&o, "VRAMKIT_SIM_CAPACITY", "0", &why), VRAM_EENV);
  assert_non_null(strstr(why, "VRAMKIT_SIM_CAPACITY"));
  VT_EXPECT(vram_options_set(&o, "VRAMKIT_PREALLOCATE", "150%", &why), VRAM_EENV);
  assert_non_null(strstr(why, "VRAMKIT_PREALLOCATE"));
  VT_EXPECT(vram_options_set(&o, "VRAMKIT_NOPE", "1", &why), VRAM_EINVAL);
  VT_EXPECT(vram_options_set(NULL, "VRAMKIT_LIMIT", "1G", &why), VRAM_EINVAL);
  assert_memory_equal(&o, &before, sizeof o);
}

/* Every refusal names the variable and quotes its value; VRAMKIT_LIMIT=0 is refused (it
 * would read as no limit) with the way to ask for none; VRAMKIT_LEAK_REPORT is a switch. */
static void t_refusals_quote_the_value(void **state) {
  (void)state;
  static const struct {
    const char *var, *value, *words;
  } bad[] = {{"VRAMKIT_LIMIT", "abc", "not a limit"},
             {"VRAMKIT_LIMIT", "0", "leave it unset"},
             {"VRAMKIT_LIMIT", "-1G", "negative"},
             {"VRAMKIT_PREALLOCATE", "18446744073709551616", "2^64"},
             {"VRAMKIT_SIM_CAPACITY", "0", "more than 0"},
             {"VRAMKIT_LEAK_REPORT", "abc", "switch"},
             {"VRAMKIT_SOURCE", "nope", "not a source"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    env_reset();
    setenv(bad[i].var, bad[i].value, 1);
    vram_options_t o;
    vram_options_init(&o);
    const char *why = NULL;
    char quoted[64];
    snprintf(quoted, sizeof quoted, "'%s'", bad[i].value);
    VT_EXPECT(vram_options_from_env(&o, &why), VRAM_EENV);
    if (!why || strncmp(why, bad[i].var, strlen(bad[i].var)) != 0 || !strstr(why, quoted) ||
        !strstr(why, bad[i].words))
      fail_msg("%s=%s: why = \"%s\"", bad[i].var, bad[i].value, why ? why : "(null)");
    unsetenv(bad[i].var);
  }
  static const char *const switches[] = {"on", "TRUE", "yes", "off", "False", "no", "1", "0"};
  for (size_t i = 0; i < sizeof switches / sizeof switches[0]; i++) {
    env_reset();
    setenv("VRAMKIT_LEAK_REPORT", switches[i], 1);
    vram_options_t o;
    vram_options_init(&o);
    if (vram_options_from_env(&o, NULL) != VRAM_OK)
      fail_msg("VRAMKIT_LEAK_REPORT=%s refused", switches[i]);
  }
  unsetenv("VRAMKIT_LEAK_REPORT");
  env_reset();
}

/* One table of the variables: names once each, pool options marked, a help for each; a name
 * that is not an option is refused naming the nearest one. */
static void t_variable_table(void **state) {
  (void)state;
  const char *name, *help;
  int pool_option, options = 0, publish_dir = -1;
  size_t n = 0;
  for (; (name = vram_env_variable(n, &help, &pool_option)); n++) {
    assert_int_equal(strncmp(name, "VRAMKIT_", 8), 0);
    assert_true(help && *help);
    for (size_t j = 0; j < n; j++) assert_string_not_equal(name, vram_env_variable(j, NULL, NULL));
    options += pool_option;
    if (strcmp(name, "VRAMKIT_PUBLISH_DIR") == 0) publish_dir = pool_option;
    if (strcmp(name, "VRAMKIT_LIMIT") == 0) assert_non_null(strstr(help, "0 is refused"));
  }
  assert_int_equal(options, 13); /* the give-back settings and no_split are pool options too */
  assert_int_equal(publish_dir, 0);
  vram_options_t o;
  vram_options_init(&o);
  const char *why = NULL;
  VT_EXPECT(vram_options_set(&o, "VRAMKIT_LIMT", "1G", &why), VRAM_EINVAL);
  assert_non_null(strstr(why, "VRAMKIT_LIMIT"));
  VT_EXPECT(vram_options_set(&o, "VRAMKIT_PUBLISH_DIR", "/tmp", &why), VRAM_EINVAL);
}

/* A default pool made with explicit options (vramkit.configure) ignores the environment,
 * is the one vram_default_pool returns afterwards, and cannot be made twice. */
static void t_default_pool_create(void **state) {
  (void)state;
  env_reset();
  setenv("VRAMKIT_LIMIT", "1M", 1); /* must not apply: the options below say otherwise */
  vram_options_t o;
  vram_options_init(&o);
  o.device = 5;
  o.source = VRAM_SOURCE_SIM_VMM;
  o.sim_capacity = 512 * VT_MiB;
  vram_pool_t *made = NULL, *again = NULL;
  VT_OK(vram_default_pool_create(&o, &made));
  VT_VALID(made);
  assert_int_equal(vram_pool_source(made), VRAM_SOURCE_SIM_VMM);
  assert_int_equal(vt_stats(made).limit_bytes, 0);
  VT_OK(vram_default_pool(5, &again));
  assert_ptr_equal(again, made);
  VT_EXPECT(vram_default_pool_create(&o, &again), VRAM_EBUSY);
  o.device = -2;
  VT_EXPECT(vram_default_pool_create(&o, &again), VRAM_EDEVICE);
  VT_EXPECT(vram_default_pool_create(NULL, &again), VRAM_EINVAL);
  env_reset();
}

int main(void) {
  env_reset();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_same_pool_and_capacity),
      cmocka_unit_test(t_bad_env),
      cmocka_unit_test(t_limit_and_preallocate_from_env),
      cmocka_unit_test(t_bad_device),
      cmocka_unit_test(t_options_set),
      cmocka_unit_test(t_refusals_quote_the_value),
      cmocka_unit_test(t_variable_table),
      cmocka_unit_test(t_default_pool_create),
  };
  return cmocka_run_group_tests_name("env_default_pool", tests, NULL, NULL) ? 1 : 0;
}

/* test_giveback.c - neighbours that give cached memory back (issue 39), on a sim device
 * that several processes share (VRAMKIT_SIM_SHARED).
 *
 * Each test forks a "holder" (A: takes 48 MiB of a 64 MiB shared sim in 8 MiB blocks,
 * frees four of them and keeps two live) and an "asker" (B: asks for 36 MiB, more than the
 * 16 MiB the device has free). The parent starts them, stops or kills A where the test
 * says, and collects what each reports through a pipe. Every shared file goes to a
 * temporary folder (VRAMKIT_PUBLISH_DIR) under a name of its own. alarm() keeps a test
 * that would hang from hanging: no test measures time.
 *
 *   test_giveback [SOURCE]     sim (default) or sim:vmm
 */
#define _GNU_SOURCE
#include "vt.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "obs/shared_file.h"
#include "pool/options.h"
#include "source/sim_shared.h"

#define CAPACITY (64 * VT_MiB)
#define BLOCK (8 * VT_MiB)
#define HELD_BLOCKS 6
#define ASK (36 * VT_MiB)

static vram_source_kind source = VRAM_SOURCE_SIM;
static char folder[256];
static char shared_name[64];

/* What a child reports to the parent. */
typedef struct outcome {
  int rc;              /* the call the role is about: B's malloc, A's checks */
  int cause;           /* B: the cause of its OOM (vram_oom_cause), -1 when none */
  int pid;
  int history_to_pid;  /* A: the pid its history's give-back events name (0: none) */
  uint64_t history_given; /* A: the bytes those events say it gave */
  uint64_t free_before; /* B: free on the shared device before it asked */
  uint64_t requests, received, given_bytes, given_count, wait_us;
  char report[2048];   /* B: the OOM report when it failed */
} outcome;

typedef struct child {
  pid_t pid;
  int control; /* parent -> child: one byte to go on */
  int reports; /* child -> parent: "ready", then the outcome */
} child;

/* ---- the children */

/* How the next child spawned makes its pools (a fork inherits them as they are then): from
 * the environment, as a default pool, or not; then these {name, value} options through
 * vram_options_set, as a private pool of the Python package takes its keywords. */
static bool child_reads_env = true;
static const char *const (*child_options)[2];

static vram_pool_t *child_pool(void) {
  vram_options_t o;
  vram_options_init(&o);
  if (child_reads_env && vram_options_from_env(&o, NULL) != VRAM_OK) return NULL;
  for (size_t i = 0; child_options && child_options[i][0]; i++)
    if (vram_options_set(&o, child_options[i][0], child_options[i][1], NULL) != VRAM_OK)
      return NULL;
  o.source = source;
  o.sim_capacity = CAPACITY;
  vram_pool_t *pool = NULL;
  return vram_pool_create(&pool, &o) == VRAM_OK ? pool : NULL;
}

static void fill_stats(vram_pool_t *pool, outcome *out) {
  vram_stats_t s;
  vram_get_stats(pool, &s);
  out->pid = (int)getpid();
  out->requests = s.giveback_requests;
  out->received = s.giveback_received_bytes;
  out->given_bytes = s.giveback_given_bytes;
  out->given_count = s.giveback_given_count;
  out->wait_us = s.giveback_wait_us;
}

static void say(int fd, const void *what, size_t n) {
  if (write(fd, what, n) != (ssize_t)n) _exit(90);
}

/* A: 48 MiB held, 32 MiB of it freed (idle cache), two blocks live. Waits for the parent,
 * then checks that the live blocks are intact: still live at their sizes, the pool valid,
 * each freed once without complaint. */
static int holder_main(int control, int reports) {
  vram_pool_t *pool = child_pool();
  if (!pool || vram_history_start(pool, 4096, 0) != VRAM_OK) return 10;
  void *p[HELD_BLOCKS];
  for (int i = 0; i < HELD_BLOCKS; i++)
    if (vram_malloc(pool, BLOCK, NULL, &p[i]) != VRAM_OK) return 11;
  for (int i = 1; i < HELD_BLOCKS - 1; i++)
    if (vram_free(pool, p[i]) != VRAM_OK) return 12;
  say(reports, "R", 1);
  char go;
  if (read(control, &go, 1) != 1) return 13;
  outcome out = {0};
  size_t requested = 0;
  int live[2] = {0, HELD_BLOCKS - 1};
  for (int k = 0; k < 2; k++) {
    vram_stream_t stream = NULL;
    if (vram_block_info(pool, p[live[k]], &requested, &stream) != VRAM_OK ||
        requested != BLOCK)
      out.rc = 14;
  }
  if (!_vram_pool_is_valid(pool)) out.rc = 15;
  fill_stats(pool, &out);
  static vram_event_t events[4096];
  size_t count = 0;
  vram_history_read(pool, events, 4096, &count, NULL, NULL);
  for (size_t i = 0; i < count; i++)
    if (events[i].kind == VRAM_EVENT_GIVE_BACK) {
      out.history_to_pid = (int)events[i].addr;
      out.history_given += events[i].size;
    }
  for (int k = 0; k < 2; k++)
    if (vram_free(pool, p[live[k]]) != VRAM_OK) out.rc = 16;
  if (vram_pool_destroy(pool) != VRAM_OK) out.rc = 17;
  say(reports, &out, sizeof out);
  return 0;
}

/* B: asks for more than the device has free. With GIVEBACK_TEST_WAIT_FOR_ROOM set, a
 * refused request is made again once the device has room (a late neighbour's give-back). */
static int asker_main(int control, int reports) {
  (void)control;
  vram_pool_t *pool = child_pool();
  if (!pool) return 20;
  outcome out = {0};
  size_t total = 0, free_bytes = 0;
  vram_mem_get_info(pool, &free_bytes, &total);
  out.free_before = free_bytes;
  void *p = NULL;
  out.rc = vram_malloc(pool, ASK, NULL, &p);
  vram_oom_info_t info;
  out.cause = vram_oom_info(pool, &info) == VRAM_OK ? info.cause : -1;
  if (out.rc == VRAM_ENOMEM) vram_oom_report(pool, out.report, sizeof out.report);
  fill_stats(pool, &out);
  if (out.rc == VRAM_ENOMEM && getenv("GIVEBACK_TEST_WAIT_FOR_ROOM")) {
    while (vram_mem_get_info(pool, &free_bytes, &total) == VRAM_OK && free_bytes < ASK)
      usleep(1000);
    out.rc = vram_malloc(pool, ASK, NULL, &p);
    vram_stats_t s;
    vram_get_stats(pool, &s);
    out.received = s.giveback_received_bytes; /* the late bytes are the device's, not B's */
  }
  if (p && vram_free(pool, p) != VRAM_OK) out.rc = 22;
  if (vram_pool_destroy(pool) != VRAM_OK) out.rc = 23;
  say(reports, &out, sizeof out);
  return 0;
}

/* Churn: pools made, filled, left with idle cache and destroyed, over and over, each in the
 * group: a pool may be destroyed while this process's watcher gives back from it. */
#define CHURN_POOLS 300
static int churn_main(int control, int reports) {
  say(reports, "R", 1);
  char go;
  if (read(control, &go, 1) != 1) return 30;
  outcome out = {0};
  for (int k = 0; k < CHURN_POOLS && !out.rc; k++) {
    vram_pool_t *pool = child_pool();
    if (!pool) return 31;
    void *p[HELD_BLOCKS] = {0};
    for (int i = 0; i < HELD_BLOCKS; i++)
      if (vram_malloc(pool, BLOCK, NULL, &p[i]) != VRAM_OK) p[i] = NULL;
    if (k == 0) say(reports, "S", 1); /* started: the asker may go */
    for (int i = 0; i < HELD_BLOCKS; i++)
      if (p[i] && vram_free(pool, p[i]) != VRAM_OK) out.rc = 32;
    if (vram_pool_destroy(pool) != VRAM_OK) out.rc = 33;
  }
  say(reports, &out, sizeof out);
  return 0;
}

/* Pester: asks for more than is free, again and again, while the churn goes on. */
#define PESTER_ASKS 200
static int pester_main(int control, int reports) {
  vram_pool_t *pool = child_pool();
  if (!pool) return 40;
  say(reports, "R", 1);
  char go;
  if (read(control, &go, 1) != 1) return 41;
  outcome out = {0};
  for (int k = 0; k < PESTER_ASKS && !out.rc; k++) {
    void *p = NULL;
    if (vram_malloc(pool, ASK, NULL, &p) == VRAM_OK) {
      if (vram_free(pool, p) != VRAM_OK) out.rc = 42;
      vram_empty_cache(pool);
    }
  }
  fill_stats(pool, &out);
  if (vram_pool_destroy(pool) != VRAM_OK) out.rc = 43;
  say(reports, &out, sizeof out);
  return 0;
}

/* ---- the parent */

static child spawn(int (*role)(int, int), const char *const *env) {
  int to_child[2], from_child[2];
  assert_int_equal(pipe(to_child), 0);
  assert_int_equal(pipe(from_child), 0);
  child c = {fork(), to_child[1], from_child[0]};
  assert_true(c.pid >= 0);
  if (c.pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failing test leaves no child behind */
    close(to_child[1]);
    close(from_child[0]);
    setenv("VRAMKIT_SIM_SHARED", shared_name, 1);
    for (; env && *env; env++) {
      char kv[256];
      snprintf(kv, sizeof kv, "%s", *env);
      char *eq = strchr(kv, '=');
      *eq = 0;
      setenv(kv, eq + 1, 1);
    }
    _exit(role(to_child[0], from_child[1]));
  }
  close(to_child[0]);
  close(from_child[1]);
  return c;
}

static void read_all(int fd, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    assert_true(r > 0);
    got += (size_t)r;
  }
}

static void wait_ready(child *c) {
  char r = 0;
  read_all(c->reports, &r, 1);
  assert_int_equal(r, 'R');
}

static outcome finish(child *c) {
  outcome out;
  char go = 'g';
  assert_int_equal(write(c->control, &go, 1), 1);
  read_all(c->reports, &out, sizeof out);
  if (out.report[0]) fprintf(stderr, "(the child's OOM report)\n%s\n", out.report);
  int status = 0;
  assert_int_equal(waitpid(c->pid, &status, 0), c->pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  close(c->control);
  close(c->reports);
  return out;
}

static void end_by_signal(child *c) {
  kill(c->pid, SIGKILL);
  int status = 0;
  assert_int_equal(waitpid(c->pid, &status, 0), c->pid);
  close(c->control);
  close(c->reports);
}

/* A holds its memory, then B asks; both finish and report. */
static void run_pair(const char *const *a_env, const char *const *b_env, outcome *oa,
                     outcome *ob) {
  child a = spawn(holder_main, a_env);
  wait_ready(&a);
  child b = spawn(asker_main, b_env);
  *ob = finish(&b);
  *oa = finish(&a);
}

/* Each test: its own shared sim and group, removed after it. */
static int setup(void **state) {
  (void)state;
  static int n;
  snprintf(shared_name, sizeof shared_name, "gbtest-%d-%d", (int)getpid(), ++n);
  alarm(60);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char group[128];
  _vram_sim_shared_remove(shared_name, 0);
  snprintf(group, sizeof group, "sim.%s.0.group", shared_name);
  _vram_shared_file_remove(group);
  alarm(0);
  return 0;
}

/* ---- the tests */

static void test_neighbour_gives_back(void **state) {
  (void)state;
  outcome oa, ob;
  run_pair(NULL, NULL, &oa, &ob);
  assert_int_equal(ob.free_before, CAPACITY - HELD_BLOCKS * BLOCK); /* the shared free */
  VT_OK(ob.rc);
  assert_int_equal(ob.requests, 1);
  assert_true(ob.received >= ASK - ob.free_before);
  VT_OK(oa.rc); /* A's live blocks intact */
  assert_true(oa.given_bytes >= ASK - ob.free_before);
  assert_int_equal(oa.given_count, 1);
  assert_int_equal(oa.given_bytes, ob.received);
  assert_true(oa.given_bytes < 4 * BLOCK); /* what was asked, not all it had idle */
  assert_int_equal(oa.history_to_pid, ob.pid); /* A's history: gave N bytes to B */
  assert_int_equal(oa.history_given, oa.given_bytes);
}

/* Over its soft limit, a neighbour asked gives back all its idle memory. */
static void test_over_its_soft_limit_a_neighbour_gives_all_it_can(void **state) {
  (void)state;
  const char *const soft[] = {"VRAMKIT_SOFT_LIMIT=16M", NULL};
  outcome oa, ob;
  run_pair(soft, NULL, &oa, &ob);
  VT_OK(ob.rc);
  VT_OK(oa.rc);
  assert_int_equal(oa.given_bytes, 4 * BLOCK);
}

static void test_opted_out_neighbour_keeps_its_cache(void **state) {
  (void)state;
  const char *const opt_out[] = {"VRAMKIT_GIVE_BACK=0", NULL};
  outcome oa, ob;
  run_pair(opt_out, NULL, &oa, &ob);
  VT_EXPECT(ob.rc, VRAM_ENOMEM);
  assert_int_equal(ob.requests, 0);
  assert_int_equal(ob.wait_us, 0);
  assert_null(strstr(ob.report, "Give-back"));
  VT_OK(oa.rc);
  assert_int_equal(oa.given_bytes, 0);
}

static void test_dead_neighbours_memory_is_reclaimed(void **state) {
  (void)state;
  child a = spawn(holder_main, NULL);
  wait_ready(&a);
  end_by_signal(&a); /* killed holding 48 MiB, reaped */
  child b = spawn(asker_main, NULL);
  outcome ob = finish(&b);
  VT_OK(ob.rc);
  assert_int_equal(ob.requests, 0); /* nobody to ask: the dead member's bytes came back */
}

static void test_stopped_neighbour_costs_the_timeout_only(void **state) {
  (void)state;
  child a = spawn(holder_main, NULL);
  wait_ready(&a);
  kill(a.pid, SIGSTOP);
  /* kill() returns before the stop takes hold: wait until it has, or the watcher may
   * still answer the request that follows. */
  int stopped = 0;
  assert_int_equal(waitpid(a.pid, &stopped, WUNTRACED), a.pid);
  assert_true(WIFSTOPPED(stopped));
  const char *const short_wait[] = {"VRAMKIT_GIVE_BACK_TIMEOUT=100", NULL};
  child b = spawn(asker_main, short_wait);
  outcome ob = finish(&b);
  end_by_signal(&a);
  VT_EXPECT(ob.rc, VRAM_ENOMEM);
  assert_int_equal(ob.requests, 1);
  assert_int_equal(ob.received, 0);
  assert_true(ob.wait_us >= 100 * 1000); /* the whole timeout, waited for nobody */
  char want[64];
  snprintf(want, sizeof want, "pid %d", (int)a.pid);
  assert_non_null(strstr(ob.report, "Give-back: asked 1 vramkit neighbour"));
  assert_non_null(strstr(ob.report, want));
  assert_non_null(strstr(ob.report, "did not answer within 100 ms"));
}

static void test_late_answer_is_not_counted(void **state) {
  (void)state;
  const char *const late[] = {"VRAMKIT_TEST_GIVE_BACK_DELAY=500", NULL};
  child a = spawn(holder_main, late);
  wait_ready(&a);
  const char *const short_wait[] = {"VRAMKIT_GIVE_BACK_TIMEOUT=20", "GIVEBACK_TEST_WAIT_FOR_ROOM=1",
                                    NULL};
  child b = spawn(asker_main, short_wait);
  outcome ob = finish(&b);
  outcome oa = finish(&a);
  VT_OK(ob.rc); /* the second request, once the late bytes were on the device */
  assert_int_equal(ob.requests, 1);
  assert_int_equal(ob.received, 0);
  assert_non_null(strstr(ob.report, "did not answer within 20 ms"));
  VT_OK(oa.rc);
  assert_true(oa.given_bytes > 0);
}

static void test_slow_answer_within_the_timeout(void **state) {
  (void)state;
  const char *const slow[] = {"VRAMKIT_TEST_GIVE_BACK_DELAY=20", NULL};
  child a = spawn(holder_main, slow);
  wait_ready(&a);
  const char *const long_wait[] = {"VRAMKIT_GIVE_BACK_TIMEOUT=10000", NULL};
  child b = spawn(asker_main, long_wait);
  outcome ob = finish(&b);
  outcome oa = finish(&a);
  VT_OK(ob.rc);
  assert_int_equal(ob.received, oa.given_bytes);
  VT_OK(oa.rc);
}

/* The group limit: together A and B may hold 56 MiB. A holds 48, so B's 36 passes it
 * although the device has room for 16 more: refused with the group-limit cause while A
 * keeps its cache; served once A gives back. */
static void test_group_limit_refuses_past_it(void **state) {
  (void)state;
  const char *const opted_out[] = {"VRAMKIT_GIVE_BACK=0", "VRAMKIT_GROUP_LIMIT=56M", NULL};
  const char *const limited[] = {"VRAMKIT_GROUP_LIMIT=56M", NULL};
  outcome oa, ob;
  run_pair(opted_out, limited, &oa, &ob);
  VT_EXPECT(ob.rc, VRAM_ENOMEM);
  assert_int_equal(ob.cause, VRAM_OOM_GROUP_LIMIT);
  assert_non_null(strstr(ob.report, "cause: group_limit: every vramkit process on this device "
                                    "together may reserve 56.0 MiB"));
  VT_OK(oa.rc);
}

static void test_group_limit_after_give_back(void **state) {
  (void)state;
  const char *const limited[] = {"VRAMKIT_GROUP_LIMIT=56M", NULL};
  outcome oa, ob;
  run_pair(limited, limited, &oa, &ob);
  VT_OK(ob.rc);
  assert_true(oa.given_bytes >= 28 * VT_MiB); /* 48 + 36 - 56 */
  VT_OK(oa.rc);
}

/* Bad values are refused by name, before any pool, by vram_options_from_env and
 * vram_options_set alike; a pool of a shared sim with a bad name is not made. */
static void test_bad_values_are_refused(void **state) {
  (void)state;
  static const char *const bad[][2] = {
      {"VRAMKIT_SIM_SHARED", "../up"},        {"VRAMKIT_SIM_SHARED", ""},
      {"VRAMKIT_GIVE_BACK", "maybe"},         {"VRAMKIT_GIVE_BACK_TIMEOUT", "-1"},
      {"VRAMKIT_GIVE_BACK_TIMEOUT", "20000"}, {"VRAMKIT_GIVE_BACK_TIMEOUT", "1.5"},
      {"VRAMKIT_GROUP_LIMIT", "0"},           {"VRAMKIT_GROUP_LIMIT", "150%"},
      {"VRAMKIT_SOFT_LIMIT", "-8G"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (!*bad[i][1]) continue; /* an empty value is unset, as every variable reads it */
    setenv(bad[i][0], bad[i][1], 1);
    vram_options_t o;
    vram_options_init(&o);
    const char *why = NULL;
    VT_EXPECT(vram_options_from_env(&o, &why), VRAM_EENV);
    assert_non_null(why);
    assert_non_null(strstr(why, bad[i][0]));
    unsetenv(bad[i][0]);
    if (strcmp(bad[i][0], "VRAMKIT_SIM_SHARED") == 0) {
      setenv(bad[i][0], bad[i][1], 1); /* a setting of the device, not of the pool */
      o.source = source;
      vram_pool_t *pool = NULL;
      VT_EXPECT(vram_pool_create(&pool, &o), VRAM_EENV);
      assert_null(pool);
      unsetenv(bad[i][0]);
      continue;
    }
    vram_options_t before;
    memcpy(&before, &o, sizeof o);
    why = NULL;
    VT_EXPECT(vram_options_set(&o, bad[i][0], bad[i][1], &why), VRAM_EENV);
    assert_non_null(why);
    assert_non_null(strstr(why, bad[i][0]));
    assert_memory_equal(&o, &before, sizeof o); /* unchanged */
  }
}

/* run_pair with A's pool made as a private one (its `a_options` through vram_options_set,
 * no environment read, `a_env` set all the same) and B's a default one with `b_options`. */
typedef const char *const option_list[][2];
static void run_pair_by_options(option_list *a_options, const char *const *a_env,
                                option_list *b_options, outcome *oa, outcome *ob) {
  child_options = a_options ? *a_options : NULL;
  child_reads_env = false;
  child a = spawn(holder_main, a_env);
  child_options = b_options ? *b_options : NULL;
  child_reads_env = true;
  wait_ready(&a);
  child b = spawn(asker_main, NULL);
  child_options = NULL;
  *ob = finish(&b);
  *oa = finish(&a);
}

/* The give-back settings are options: set through vram_options_set, with no environment,
 * they act as the variables do; a pool whose options did not come from the environment
 * ignores the variables. */
static void test_opted_out_by_its_options(void **state) {
  (void)state;
  static option_list off = {{"VRAMKIT_GIVE_BACK", "off"}, {NULL, NULL}};
  outcome oa, ob;
  run_pair_by_options(&off, NULL, NULL, &oa, &ob);
  VT_EXPECT(ob.rc, VRAM_ENOMEM);
  assert_int_equal(ob.requests, 0);
  VT_OK(oa.rc);
  assert_int_equal(oa.given_bytes, 0);
}

static void test_a_pool_not_made_from_the_environment_ignores_its_variables(void **state) {
  (void)state;
  const char *const opt_out[] = {"VRAMKIT_GIVE_BACK=0", NULL};
  outcome oa, ob;
  run_pair_by_options(NULL, opt_out, NULL, &oa, &ob);
  VT_OK(ob.rc);
  assert_true(oa.given_bytes > 0);
}

static void test_soft_limit_by_its_options(void **state) {
  (void)state;
  static option_list soft = {{"VRAMKIT_SOFT_LIMIT", "16M"}, {NULL, NULL}};
  outcome oa, ob;
  run_pair_by_options(&soft, NULL, NULL, &oa, &ob);
  VT_OK(ob.rc);
  assert_int_equal(oa.given_bytes, 4 * BLOCK); /* all it held idle, not what was asked */
}

/* 87.5% of the 64 MiB device: the 56 MiB of test_group_limit_refuses_past_it. */
static void test_group_limit_as_a_share_by_its_options(void **state) {
  (void)state;
  static option_list off = {{"VRAMKIT_GIVE_BACK", "0"}, {NULL, NULL}};
  static option_list share = {{"VRAMKIT_GROUP_LIMIT", "87.5%"}, {NULL, NULL}};
  outcome oa, ob;
  run_pair_by_options(&off, NULL, &share, &oa, &ob);
  VT_EXPECT(ob.rc, VRAM_ENOMEM);
  assert_int_equal(ob.cause, VRAM_OOM_GROUP_LIMIT);
  assert_non_null(strstr(ob.report, "together may reserve 56.0 MiB"));
  VT_OK(oa.rc);
}

/* Fields set out of range by hand (the table never gives them) make no pool. */
static void test_options_out_of_range_make_no_pool(void **state) {
  (void)state;
  for (int k = 0; k < 4; k++) {
    vram_options_t o;
    vram_options_init(&o);
    o.source = source;
    o.sim_capacity = CAPACITY;
    if (k == 0) o.give_back_timeout_ms = VRAM_GIVE_BACK_TIMEOUT_MAX_MS + 1;
    if (k == 1) o.group_limit_fraction = 1.5;
    if (k == 2) o.soft_limit_fraction = -0.25;
    if (k == 3) o.soft_limit_fraction = NAN;
    vram_pool_t *pool = NULL;
    VT_EXPECT(vram_pool_create(&pool, &o), VRAM_EINVAL);
    assert_null(pool);
  }
  vram_pool_t *pool = NULL; /* the device is as it was: a good pool is made */
  vram_options_t o;
  vram_options_init(&o);
  o.source = source;
  o.sim_capacity = CAPACITY;
  VT_OK(vram_pool_create(&pool, &o));
  VT_OK(vram_pool_destroy(pool));
}

/* A pool destroyed while its process's watcher is giving back from it: the watcher lets
 * go of it first, and neither process fails. */
static void test_pool_destroyed_while_its_watcher_gives_back(void **state) {
  (void)state;
  const char *const short_wait[] = {"VRAMKIT_GIVE_BACK_TIMEOUT=20", NULL};
  child churn = spawn(churn_main, NULL);
  wait_ready(&churn);
  child pester = spawn(pester_main, short_wait);
  wait_ready(&pester);
  char go = 'g';
  assert_int_equal(write(churn.control, &go, 1), 1);
  char started = 0;
  read_all(churn.reports, &started, 1);
  assert_int_equal(started, 'S');
  outcome op = finish(&pester);
  outcome oc;
  read_all(churn.reports, &oc, sizeof oc);
  int status = 0;
  assert_int_equal(waitpid(churn.pid, &status, 0), churn.pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  close(churn.control);
  close(churn.reports);
  VT_OK(oc.rc);
  VT_OK(op.rc);
}

static void remove_folder(void) {
  DIR *d = opendir(folder);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char path[600];
    snprintf(path, sizeof path, "%s/%s", folder, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(folder);
}

int main(int argc, char **argv) {
  vt_source src;
  if (!vt_source_pick(argc, argv, &src) || !src.is_sim) {
    fprintf(stderr, "test_giveback: a sim source, sim or sim:vmm\n");
    return 2;
  }
  source = src.kind;
  snprintf(folder, sizeof folder, "/tmp/vramkit-giveback-XXXXXX");
  if (!mkdtemp(folder)) return 2;
  setenv("VRAMKIT_PUBLISH_DIR", folder, 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_neighbour_gives_back, setup, teardown),
      cmocka_unit_test_setup_teardown(test_over_its_soft_limit_a_neighbour_gives_all_it_can, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_opted_out_neighbour_keeps_its_cache, setup, teardown),
      cmocka_unit_test_setup_teardown(test_dead_neighbours_memory_is_reclaimed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stopped_neighbour_costs_the_timeout_only, setup, teardown),
      cmocka_unit_test_setup_teardown(test_late_answer_is_not_counted, setup, teardown),
      cmocka_unit_test_setup_teardown(test_slow_answer_within_the_timeout, setup, teardown),
      cmocka_unit_test_setup_teardown(test_group_limit_refuses_past_it, setup, teardown),
      cmocka_unit_test_setup_teardown(test_group_limit_after_give_back, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_values_are_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_opted_out_by_its_options, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_a_pool_not_made_from_the_environment_ignores_its_variables, setup, teardown),
      cmocka_unit_test_setup_teardown(test_soft_limit_by_its_options, setup, teardown),
      cmocka_unit_test_setup_teardown(test_group_limit_as_a_share_by_its_options, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_options_out_of_range_make_no_pool, setup, teardown),
      cmocka_unit_test_setup_teardown(test_pool_destroyed_while_its_watcher_gives_back, setup,
                                      teardown),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  remove_folder();
  return failed;
}

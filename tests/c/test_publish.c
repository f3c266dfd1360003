/* test_publish.c - the published per-process record and the OOM report's neighbours.
 *
 * The record is process-wide state, opened once: a test that needs a fresh process (another
 * directory, publishing off, a record left by a killed process) runs this binary again as a
 * child ("child SOURCE hang|exit"), with the environment it needs. Every record goes to
 * temporary directories, never /dev/shm.
 *
 *   test_publish          the sim tests
 *   test_publish nvml     the neighbours through the fake driver and fake NVML (run with
 *                         both doubles first on LD_LIBRARY_PATH)
 */
#define _GNU_SOURCE
#include "vt.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "obs/publish.h"

static char base_dir[256]; /* mkdtemp'd; the parent's records go to base_dir/pub */
static char pub_dir[300];
static char self_exe[1024]; /* this binary's path: exec'd by name, so that its comm is ours */

/* ---- the child: a pool, 4 MiB allocated and freed (so cached free), then exit or hang */
static int child_main(const char *source, const char *mode) {
  vram_options_t o;
  vram_options_init(&o);
  /* As a default pool: its give-back settings (VRAMKIT_GIVE_BACK) are the environment's. */
  if (vram_options_from_env(&o, NULL) != VRAM_OK) return 2;
  if (vram_source_parse(source, &o.source) != VRAM_OK) return 2;
  o.sim_capacity = (size_t)1 << 30;
  vram_pool_t *pool = NULL;
  if (vram_pool_create(&pool, &o) != VRAM_OK) return 3;
  void *p = NULL;
  if (vram_malloc(pool, 4 << 20, NULL, &p) != VRAM_OK || vram_free(pool, p) != VRAM_OK) return 4;
  char dir[300], path[400];
  _vram_publish_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/%d.rec", dir, (int)getpid());
  printf("ready %d\n", access(path, F_OK) == 0);
  fflush(stdout);
  if (strcmp(mode, "hang") == 0)
    for (;;) pause();
  return vram_pool_destroy(pool) == VRAM_OK ? 0 : 5;
}

typedef struct child {
  pid_t pid;
  int out;  /* its stdout */
  int had_record;
} child;

/* Starts the child with extra "NAME=value" settings (value "" unsets) and waits for its
 * "ready" line; stderr goes to err_path when given. */
static child spawn(const char *source, const char *mode, const char *const *env,
                   const char *err_path) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  child c = {fork(), fds[0], -1};
  assert_true(c.pid >= 0);
  if (c.pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failing test leaves no child hanging */
    dup2(fds[1], 1);
    if (err_path) {
      int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(e, 2);
    }
    for (; env && *env; env++) {
      char kv[512];
      snprintf(kv, sizeof kv, "%s", *env);
      char *eq = strchr(kv, '=');
      *eq = 0;
      if (eq[1]) setenv(kv, eq + 1, 1);
      else unsetenv(kv);
    }
    execl(self_exe, "test_publish", "child", source, mode, (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  char line[64] = "";
  ssize_t n = read(c.out, line, sizeof line - 1);
  if (n > 0) {
    line[n] = 0;
    sscanf(line, "ready %d", &c.had_record);
  }
  return c;
}

static int finish(child *c) {
  int status = 0;
  waitpid(c->pid, &status, 0);
  close(c->out);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void record_path(char *buf, size_t cap, const char *dir, int pid) {
  snprintf(buf, cap, "%s/%d.rec", dir, pid);
}

/* This process's record, mapped read-only. */
static const vram_process_record *map_record(const char *dir, int pid) {
  char path[400];
  record_path(path, sizeof path, dir, pid);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return NULL;
  void *m = mmap(NULL, sizeof(vram_process_record), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  return m == MAP_FAILED ? NULL : m;
}

/* A device slot of a record, read as every reader reads it (pread, two alike copies). */
static vram_device_record read_slot(const vram_process_record *r, int device) {
  char path[400];
  record_path(path, sizeof path, pub_dir, r->pid);
  int fd = open(path, O_RDONLY);
  assert_true(fd >= 0);
  vram_device_record d;
  assert_int_equal(_vram_record_read_device(fd, device, &d), 0);
  close(fd);
  return d;
}

static void expect_slot_equals_stats(vram_pool_t *pool, const vram_process_record *r) {
  vram_stats_t s = vt_stats(pool);
  vram_device_record d = read_slot(r, 0);
  assert_int_equal(d.in_use, 1);
  assert_int_equal(d.allocated_bytes, (uint64_t)s.allocated_bytes.current);
  assert_int_equal(d.reserved_bytes, (uint64_t)s.reserved_bytes.current);
  assert_int_equal(d.active_bytes, (uint64_t)s.active_bytes.current);
  assert_int_equal(d.cached_free_bytes, (uint64_t)(s.reserved_bytes.current - s.active_bytes.current));
  assert_int_equal(d.peak_allocated_bytes, (uint64_t)s.allocated_bytes.peak);
  assert_int_equal(d.peak_reserved_bytes, (uint64_t)s.reserved_bytes.peak);
}

/* ---- the sim tests ------------------------------------------------------------------ */

static void test_record_fields(void **state) {
  vram_pool_t *pool = vt_pool_new(VRAM_SOURCE_SIM, (size_t)1 << 30);
  struct stat st;
  assert_int_equal(stat(pub_dir, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0700);
  char path[400];
  record_path(path, sizeof path, pub_dir, (int)getpid());
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600);
  assert_int_equal(st.st_size, sizeof(vram_process_record));
  const vram_process_record *r = map_record(pub_dir, (int)getpid());
  assert_non_null(r);
  assert_true(r->magic == VRAM_RECORD_MAGIC);
  assert_int_equal(r->version, VRAM_RECORD_VERSION);
  assert_int_equal(r->record_size, sizeof *r);
  assert_int_equal(r->pid, getpid());
  assert_int_equal(r->uid, geteuid());
  assert_true(r->start_ticks > 0);
  assert_string_equal(r->name, "test_publish");
  assert_string_equal(r->cmdline, ""); /* no opt-in */
  assert_int_equal(r->n_devices, 1);
  vram_device_record d = read_slot(r, 0);
  assert_string_equal(d.source, "sim");
  assert_string_equal(d.uuid, "");
  assert_int_equal(d.capacity_bytes, (size_t)1 << 30);

  vt_rng rng;
  vt_rng_seed(&rng, 7);
  void *live[16] = {NULL};
  for (int i = 0; i < 400; i++) {
    int k = (int)vt_rng_below(&rng, 16);
    if (live[k]) {
      VT_OK(vram_free(pool, live[k]));
      live[k] = NULL;
    } else {
      VT_OK(vram_malloc(pool, vt_rng_logsize(&rng, 256, 8 << 20), NULL, &live[k]));
    }
    VT_VALID(pool);
    expect_slot_equals_stats(pool, r);
  }
  for (int k = 0; k < 16; k++) VT_OK(vram_free(pool, live[k]));
  VT_OK(vram_set_limit(pool, 512 << 20, 0));
  VT_VALID(pool);
  void *big = NULL;
  VT_EXPECT(vram_malloc(pool, 600 << 20, NULL, &big), VRAM_ENOMEM);
  VT_VALID(pool);
  d = read_slot(r, 0);
  vram_stats_t s = vt_stats(pool);
  assert_int_equal(d.limit_bytes, 512 << 20);
  assert_int_equal(d.num_ooms, s.num_ooms);
  assert_true(d.num_ooms >= 1);
  assert_int_equal(d.num_alloc_retries, s.num_alloc_retries);
  VT_OK(vram_empty_cache(pool));
  VT_VALID(pool);
  d = read_slot(r, 0);
  s = vt_stats(pool);
  assert_int_equal(d.largest_free_block, s.largest_free_block);
  /* ... with the cache it was measured in, the pair a reader's fragmentation is of. */
  assert_int_equal(d.largest_of_cached_bytes, d.cached_free_bytes);
  assert_true(d.largest_free_block <= d.largest_of_cached_bytes);
  assert_int_equal(d.reserved_bytes, (uint64_t)s.reserved_bytes.current);
  assert_true(d.updated_ns > 0);

  /* A second pool of the same device publishes nothing: one writer per slot. */
  vram_pool_t *second = vt_pool_new(VRAM_SOURCE_SIM, (size_t)1 << 30);
  void *p = NULL;
  VT_OK(vram_malloc(second, 1 << 20, NULL, &p));
  VT_VALID(second);
  expect_slot_equals_stats(pool, r);
  VT_OK(vram_free(second, p));
  VT_OK(vram_pool_destroy(second));
  VT_OK(vram_pool_destroy(pool));
  assert_int_equal(read_slot(r, 0).in_use, 0);
  assert_int_equal(r->n_devices, 0);
  munmap((void *)r, sizeof *r);
}

/* The child publishes while it lives and its record is gone once it exits; a forked
 * child of a publishing process gets a record of its own and leaves the parent's alone. */
static void test_removed_at_exit(void **state) {
  const char *env[] = {NULL};
  child c = spawn("sim", "exit", env, NULL);
  assert_int_equal(c.had_record, 1);
  assert_int_equal(finish(&c), 0);
  char path[400];
  record_path(path, sizeof path, pub_dir, c.pid);
  assert_int_equal(access(path, F_OK), -1);

  vram_pool_t *pool = vt_pool_new(VRAM_SOURCE_SIM, (size_t)1 << 30); /* the parent publishes */
  pid_t f = fork();
  if (f == 0) {
    vram_pool_t *mine = NULL;
    char own[400];
    record_path(own, sizeof own, pub_dir, (int)getpid());
    vram_options_t o;
    vram_options_init(&o);
    o.source = VRAM_SOURCE_SIM;
    int ok = vram_pool_create(&mine, &o) == VRAM_OK && access(own, F_OK) == 0;
    if (mine) vram_pool_destroy(mine);
    exit(ok ? 0 : 1); /* exit, not _exit: the record goes with the atexit handlers */
  }
  int status = 0;
  waitpid(f, &status, 0);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  record_path(path, sizeof path, pub_dir, f);
  assert_int_equal(access(path, F_OK), -1);
  record_path(path, sizeof path, pub_dir, (int)getpid());
  assert_int_equal(access(path, F_OK), 0);
  VT_OK(vram_pool_destroy(pool));
}

static void test_publish_off(void **state) {
  char dir[400];
  snprintf(dir, sizeof dir, "%s/off", base_dir);
  char env_dir[450];
  snprintf(env_dir, sizeof env_dir, "VRAMKIT_PUBLISH_DIR=%s", dir);
  const char *env[] = {env_dir, "VRAMKIT_PUBLISH=0", NULL};
  child c = spawn("sim", "exit", env, NULL);
  assert_int_equal(c.had_record, 0);
  assert_int_equal(finish(&c), 0);
  assert_int_equal(access(dir, F_OK), -1); /* not even the directory */
}

/* The child's stderr, whole. */
static void read_text(const char *path, char *text, size_t cap) {
  int fd = open(path, O_RDONLY);
  ssize_t n = fd >= 0 ? read(fd, text, cap - 1) : 0;
  if (fd >= 0) close(fd);
  text[n > 0 ? n : 0] = 0;
}

/* VRAMKIT_PUBLISH takes the usual spellings of off; a value it cannot read leaves
 * publishing on with one line naming the variable and quoting the value. */
static void test_publish_switch(void **state) {
  (void)state;
  static const char *const offs[] = {"off", "false", "NO", "0"};
  char dir[400], env_dir[450], env_pub[64], err[450], text[1024];
  for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
    snprintf(dir, sizeof dir, "%s/off_%zu", base_dir, i);
    snprintf(env_dir, sizeof env_dir, "VRAMKIT_PUBLISH_DIR=%s", dir);
    snprintf(env_pub, sizeof env_pub, "VRAMKIT_PUBLISH=%s", offs[i]);
    const char *env[] = {env_dir, env_pub, NULL};
    child c = spawn("sim", "exit", env, NULL);
    if (c.had_record) fail_msg("VRAMKIT_PUBLISH=%s left publishing on", offs[i]);
    assert_int_equal(finish(&c), 0);
    assert_int_equal(access(dir, F_OK), -1);
  }
  snprintf(dir, sizeof dir, "%s/maybe", base_dir);
  snprintf(env_dir, sizeof env_dir, "VRAMKIT_PUBLISH_DIR=%s", dir);
  snprintf(err, sizeof err, "%s/maybe.stderr", base_dir);
  const char *env[] = {env_dir, "VRAMKIT_PUBLISH=maybe", NULL};
  child c = spawn("sim", "exit", env, err);
  assert_int_equal(c.had_record, 1);
  assert_int_equal(finish(&c), 0);
  read_text(err, text, sizeof text);
  assert_non_null(strstr(text, "VRAMKIT_PUBLISH='maybe'"));
  assert_ptr_equal(strchr(text, '\n'), text + strlen(text) - 1); /* one line */
}

/* vram_records_dir names the folder the writers use: the variable when set and not empty,
 * else /dev/shm/vramkit-<euid>; a buffer too small for it gets nothing, not a prefix. */
static void test_records_dir(void **state) {
  (void)state;
  char *saved = strdup(getenv("VRAMKIT_PUBLISH_DIR"));
  char got[256], want[64];
  setenv("VRAMKIT_PUBLISH_DIR", "/tmp/some/folder", 1);
  assert_int_equal(vram_records_dir(got, sizeof got), 0);
  assert_string_equal(got, "/tmp/some/folder");
  assert_int_equal(vram_records_dir(got, 8), -1);
  assert_string_equal(got, "");
  setenv("VRAMKIT_PUBLISH_DIR", "", 1);
  snprintf(want, sizeof want, "/dev/shm/vramkit-%u", (unsigned)geteuid());
  assert_int_equal(vram_records_dir(got, sizeof got), 0);
  assert_string_equal(got, want);
  unsetenv("VRAMKIT_PUBLISH_DIR");
  assert_int_equal(vram_records_dir(got, sizeof got), 0);
  assert_string_equal(got, want);
  assert_int_equal(vram_records_dir(NULL, 10), -1);
  setenv("VRAMKIT_PUBLISH_DIR", saved, 1);
  free(saved);
}

/* A VRAMKIT_PUBLISH_DIR too long for the path buffer is refused, not cut short: cut after
 * the slashes, "DIR////...//sub" would be DIR itself, another folder. */
static void test_long_publish_dir(void **state) {
  (void)state;
  char dir[400], err[450], text[1024], path[500];
  snprintf(dir, sizeof dir, "%s/long", base_dir);
  snprintf(err, sizeof err, "%s/long.stderr", base_dir);
  assert_int_equal(mkdir(dir, 0700), 0);
  size_t length = strlen(dir) + 4200;
  char *long_dir = malloc(length + 1);
  assert_non_null(long_dir);
  snprintf(long_dir, length + 1, "%s%4196s", dir, "sub");
  for (char *p = long_dir + strlen(dir); *p == ' '; p++) *p = '/';
  char *saved = strdup(getenv("VRAMKIT_PUBLISH_DIR"));
  setenv("VRAMKIT_PUBLISH_DIR", long_dir, 1); /* too long for spawn's settings: inherited */
  const char *env[] = {"VRAMKIT_PUBLISH=", NULL};
  child c = spawn("sim", "exit", env, err);
  setenv("VRAMKIT_PUBLISH_DIR", saved, 1);
  free(saved);
  free(long_dir);
  assert_int_equal(c.had_record, 0);
  assert_int_equal(finish(&c), 0);
  record_path(path, sizeof path, dir, c.pid);
  assert_int_equal(access(path, F_OK), -1);
  read_text(err, text, sizeof text);
  assert_non_null(strstr(text, "VRAMKIT_PUBLISH_DIR"));
}

/* A directory open to others, or another user's, is refused with one line on stderr; the
 * child's allocations succeed all the same. */
static void refused_dir(const char *name, mode_t mode, int chown_to) {
  char dir[400], err[450], env_dir[450];
  snprintf(dir, sizeof dir, "%s/%s", base_dir, name);
  snprintf(err, sizeof err, "%s/%s.stderr", base_dir, name);
  assert_int_equal(mkdir(dir, 0700), 0);
  assert_int_equal(chmod(dir, mode), 0);
  if (chown_to >= 0 && chown(dir, (uid_t)chown_to, (gid_t)-1) != 0) {
    rmdir(dir);
    return; /* not root: another user's directory cannot be made here */
  }
  snprintf(env_dir, sizeof env_dir, "VRAMKIT_PUBLISH_DIR=%s", dir);
  const char *env[] = {env_dir, "VRAMKIT_PUBLISH=", NULL};
  child c = spawn("sim", "exit", env, err);
  assert_int_equal(c.had_record, 0);
  assert_int_equal(finish(&c), 0);
  char text[1024] = "";
  int fd = open(err, O_RDONLY);
  ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  text[n > 0 ? n : 0] = 0;
  assert_non_null(strstr(text, "refusing"));
  assert_non_null(strstr(text, dir));
  assert_ptr_equal(strchr(text, '\n'), text + strlen(text) - 1); /* one line */
  char path[500];
  record_path(path, sizeof path, dir, c.pid);
  assert_int_equal(access(path, F_OK), -1);
}

static void test_refused_dirs(void **state) {
  refused_dir("open", 0777, -1);
  refused_dir("group", 0750, -1);
  refused_dir("foreign", 0700, geteuid() == 0 ? 12345 : -1);
}

/* The fake driver's GPU, as its records and NVML name it. */
#define FAKE_UUID "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"

/* A record for `pid` as if that process published it, on the fake GPU. */
static vram_process_record planted(int pid, uint64_t start_ticks, const char *name,
                                   uint64_t reserved, uint64_t allocated) {
  vram_process_record r;
  memset(&r, 0, sizeof r);
  r.magic = VRAM_RECORD_MAGIC;
  r.version = VRAM_RECORD_VERSION;
  r.record_size = sizeof r;
  r.pid = pid;
  r.uid = geteuid();
  r.start_ticks = start_ticks;
  snprintf(r.name, sizeof r.name, "%s", name);
  r.n_devices = 1;
  r.devices[0].in_use = 1;
  snprintf(r.devices[0].source, sizeof r.devices[0].source, "cuda");
  snprintf(r.devices[0].uuid, sizeof r.devices[0].uuid, "%s", FAKE_UUID);
  r.devices[0].reserved_bytes = reserved;
  r.devices[0].allocated_bytes = r.devices[0].active_bytes = allocated;
  r.devices[0].cached_free_bytes = reserved - allocated;
  r.devices[0].peak_reserved_bytes = reserved; /* a pool's peaks: the reader checks them */
  r.devices[0].peak_allocated_bytes = allocated;
  return r;
}

static void plant(const char *dir, int pid, uint64_t start_ticks, const char *name,
                  uint64_t reserved, uint64_t allocated) {
  vram_process_record r = planted(pid, start_ticks, name, reserved, allocated);
  char path[400];
  record_path(path, sizeof path, dir, pid);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, &r, sizeof r), (ssize_t)sizeof r);
  close(fd);
}

static uint64_t start_ticks_of(int pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')') + 1;
  for (int field = 3; field < 22; field++) p = strchr(p + 1, ' ');
  return strtoull(p, NULL, 10);
}

/* A child that only sleeps (as `uid` when it is not -1): a live process to write records
 * for. Its start time is read once it runs as what it will be. */
static pid_t sleeper(int uid) {
  int ready[2];
  assert_int_equal(pipe(ready), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (uid >= 0 && setuid((uid_t)uid) != 0) _exit(1);
    if (write(ready[1], "r", 1) != 1) _exit(1);
    for (;;) pause();
  }
  char c;
  close(ready[1]);
  assert_int_equal(read(ready[0], &c, 1), 1);
  close(ready[0]);
  return pid;
}

static void end_child(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* The OOM report of a fresh pool on the fake GPU asked for more than its limit. */
static void oom_report(char *buf, size_t cap) {
  vram_options_t o;
  vram_options_init(&o);
  o.source = VRAM_SOURCE_CUDA;
  o.limit_bytes = 64 << 20;
  vram_pool_t *pool = vt_pool_from(&o);
  void *p = NULL;
  VT_EXPECT(vram_malloc(pool, 128 << 20, NULL, &p), VRAM_ENOMEM);
  VT_VALID(pool);
  assert_true(vram_oom_report(pool, buf, cap) > 0);
  VT_OK(vram_pool_destroy(pool));
}

/* A record planted for a live process of ours, as it started, is named with its cached
 * free memory; the same record with another start time (a reused pid) is not, and goes. */
static void test_planted_neighbour(void **state) {
  pid_t child = sleeper(-1);
  plant(pub_dir, child, start_ticks_of(child), "planted", 3ull << 30, 2ull << 30);
  char report[4096], want[64];
  oom_report(report, sizeof report);
  snprintf(want, sizeof want, "pid %d (planted)", (int)child);
  assert_non_null(strstr(report, want));
  assert_non_null(strstr(report, "reserved 3.00 GiB, 1.00 GiB cached free it could give back"));
  plant(pub_dir, child, start_ticks_of(child) + 1, "reused", 3ull << 30, 2ull << 30);
  oom_report(report, sizeof report);
  assert_null(strstr(report, want));
  char path[400];
  record_path(path, sizeof path, pub_dir, child);
  assert_int_equal(access(path, F_OK), -1); /* a dead process's record: deleted */
  end_child(child);
}

/* A record may claim any pid with its true start time; one that names a process of another
 * user is not believed, and not deleted either (its process lives). */
static void test_spoofed_record(void **state) {
  pid_t other = geteuid() == 0 ? sleeper(65534) : 1;
  plant(pub_dir, other, start_ticks_of(other), "spoofed", 70ull << 30, 1ull << 30);
  char report[4096], path[400];
  oom_report(report, sizeof report);
  assert_null(strstr(report, "spoofed"));
  vram_process_record r;
  char why[160];
  int dfd = vram_records_open(pub_dir, why, sizeof why);
  assert_true(dfd >= 0);
  char name[32];
  snprintf(name, sizeof name, "%d.rec", (int)other);
  assert_int_equal(vram_record_read(dfd, name, &r, NULL, why, sizeof why), VRAM_RECORD_SKIPPED);
  assert_non_null(strstr(why, "runs as another user"));
  close(dfd);
  record_path(path, sizeof path, pub_dir, other);
  assert_int_equal(access(path, F_OK), 0);
  unlink(path);
  if (other != 1) end_child(other);
}

/* A record whose figures no pool writes (more active than reserved) is a live process's
 * file, but not a claim the OOM report repeats: skipped with the contradiction, and kept. */
static void test_contradicting_figures(void **state) {
  pid_t child = sleeper(-1);
  plant(pub_dir, child, start_ticks_of(child), "contradicts", 1ull << 30, 3ull << 30);
  char report[4096], path[400], why[160], name[32];
  oom_report(report, sizeof report);
  assert_null(strstr(report, "contradicts"));
  int dfd = vram_records_open(pub_dir, why, sizeof why);
  assert_true(dfd >= 0);
  snprintf(name, sizeof name, "%d.rec", (int)child);
  vram_process_record r;
  assert_int_equal(vram_record_read(dfd, name, &r, NULL, why, sizeof why), VRAM_RECORD_SKIPPED);
  assert_string_equal(why, "device slot 0's figures contradict each other (active > reserved), "
                           "which no pool writes");
  close(dfd);
  record_path(path, sizeof path, pub_dir, child);
  assert_int_equal(access(path, F_OK), 0); /* its process lives: not ours to delete */
  unlink(path);
  end_child(child);
}

/* Names are the writers' words: a terminal escape or a newline in one is shown escaped,
 * and forges no line of the report. */
static void test_names_are_escaped(void **state) {
  pid_t child = sleeper(-1);
  plant(pub_dir, child, start_ticks_of(child), "x\x1b[2J\ncause: forged", 3ull << 30, 2ull << 30);
  char report[4096];
  oom_report(report, sizeof report);
  assert_null(strchr(report, '\x1b'));
  assert_null(strstr(report, "\ncause: forged"));
  assert_non_null(strstr(report, "(x\\x1b[2J\\x0acause: forged)"));
  char path[400];
  record_path(path, sizeof path, pub_dir, child);
  unlink(path);
  end_child(child);
}

/* A neighbour that truncates and rewrites its record in a loop while this process runs out
 * of memory again and again: the reader sees whole records or none, and never dies of it
 * (through a mapping, a load past the new end of the file is SIGBUS). */
static void test_truncated_under_the_reader(void **state) {
  pid_t writer = fork();
  assert_true(writer >= 0);
  if (writer == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    vram_process_record r = planted(getpid(), start_ticks_of(getpid()), "truncator", 3ull << 30,
                                    2ull << 30);
    char path[400];
    record_path(path, sizeof path, pub_dir, getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    for (;;) {
      if (pwrite(fd, &r, sizeof r, 0) != (ssize_t)sizeof r) _exit(1);
      if (ftruncate(fd, 0) != 0 || ftruncate(fd, 700) != 0 || ftruncate(fd, 0) != 0) _exit(1);
    }
  }
  vram_options_t o;
  vram_options_init(&o);
  o.source = VRAM_SOURCE_CUDA;
  o.limit_bytes = 64 << 20;
  vram_pool_t *pool = vt_pool_from(&o);
  int reports = getenv("VT_TRUNCATE_REPORTS") ? atoi(getenv("VT_TRUNCATE_REPORTS")) : 100000;
  for (int i = 0; i < reports; i++) {
    void *p = NULL;
    VT_EXPECT(vram_malloc(pool, 128 << 20, NULL, &p), VRAM_ENOMEM);
  }
  VT_VALID(pool);
  vram_stats_t s = vt_stats(pool);
  assert_int_equal(s.num_ooms, (uint64_t)reports);
  VT_OK(vram_pool_destroy(pool));
  end_child(writer);
  char path[400];
  record_path(path, sizeof path, pub_dir, writer);
  unlink(path);
}

/* Garbage in the directory: a wrong size, a wrong magic, a symlink, a directory, a fifo,
 * a name that is no pid. The writer and the reader carry on. */
static void test_corrupt_files(void **state) {
  char path[400];
  snprintf(path, sizeof path, "%s/999999.rec", pub_dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_int_equal(write(fd, "garbage", 7), 7);
  close(fd);
  pid_t child = sleeper(-1);
  plant(pub_dir, child, start_ticks_of(child), "badmagic", 1 << 20, 0);
  record_path(path, sizeof path, pub_dir, child);
  fd = open(path, O_WRONLY);
  assert_int_equal(pwrite(fd, "XXXXXXXX", 8, 0), 8);
  close(fd);
  snprintf(path, sizeof path, "%s/2.rec", pub_dir);
  assert_int_equal(symlink("/etc/passwd", path), 0);
  snprintf(path, sizeof path, "%s/3.rec", pub_dir);
  assert_int_equal(mkdir(path, 0700), 0);
  snprintf(path, sizeof path, "%s/4.rec", pub_dir);
  assert_int_equal(mkfifo(path, 0600), 0);
  snprintf(path, sizeof path, "%s/notapid.rec", pub_dir);
  fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  close(fd);
  char report[4096];
  oom_report(report, sizeof report);
  assert_null(strstr(report, "badmagic"));
  assert_int_equal(_vram_publish_sweep(), 0); /* none of them is a dead process's record */
  char child_name[32];
  snprintf(child_name, sizeof child_name, "%d.rec", (int)child);
  const char *names[] = {"999999.rec", child_name, "2.rec", "4.rec", "notapid.rec"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", pub_dir, names[i]);
    unlink(path);
  }
  snprintf(path, sizeof path, "%s/3.rec", pub_dir);
  rmdir(path);
  end_child(child);
}

/* A live vramkit child on the same GPU is a neighbour with its cached free memory; killed,
 * its record stays (no atexit), is ignored by the report and cleaned by it. */
static void test_killed_child(void **state) {
  /* Opted out of give-back, the child keeps its cache through the parent's OOM ladder, so
   * the report still finds it there (test_giveback covers giving it). */
  const char *env[] = {"VRAMKIT_GIVE_BACK=0", NULL};
  child c = spawn("cuda", "hang", env, NULL);
  assert_int_equal(c.had_record, 1);
  char report[4096], want[64];
  oom_report(report, sizeof report);
  snprintf(want, sizeof want, "pid %d (test_publish)", (int)c.pid);
  assert_non_null(strstr(report, want));
  assert_non_null(strstr(report, "4.00 MiB cached free it could give back"));
  kill(c.pid, SIGKILL);
  assert_int_equal(finish(&c), 128 + SIGKILL);
  char path[400];
  record_path(path, sizeof path, pub_dir, c.pid);
  assert_int_equal(access(path, F_OK), 0); /* stale: the process died without cleaning */
  oom_report(report, sizeof report);
  assert_null(strstr(report, want));
  assert_int_equal(access(path, F_OK), -1);
}

/* A sim device is its process's own: another process's sim pool is no neighbour of it. */
static void test_sim_has_no_neighbours(void **state) {
  const char *env[] = {NULL};
  child c = spawn("sim", "hang", env, NULL);
  assert_int_equal(c.had_record, 1);
  vram_pool_t *pool = vt_pool_new(VRAM_SOURCE_SIM, (size_t)64 << 20);
  void *p = NULL;
  VT_EXPECT(vram_malloc(pool, 128 << 20, NULL, &p), VRAM_ENOMEM);
  VT_VALID(pool);
  char report[4096];
  assert_true(vram_oom_report(pool, report, sizeof report) > 0);
  assert_null(strstr(report, "Other processes"));
  VT_OK(vram_pool_destroy(pool));
  kill(c.pid, SIGKILL);
  finish(&c);
}

/* ---- through the doubles of the driver and NVML ----------------------------------------- */

static void test_nvml_neighbours(void **state) {
  /* A vramkit child on the same (fake) GPU, and processes only NVML knows. */
  const char *env[] = {NULL};
  child c = spawn("cuda", "hang", env, NULL);
  assert_int_equal(c.had_record, 1);
  char procs[256];
  snprintf(procs, sizeof procs, "4242:bigjob:5368709120,%d:trainer:67108864,4343:hidden:-,%d:self:1",
           (int)c.pid, (int)getpid());
  setenv("FAKE_NVML_PROCS", procs, 1);
  vram_options_t o;
  vram_options_init(&o);
  o.source = VRAM_SOURCE_CUDA;
  o.limit_bytes = 64 << 20;
  vram_pool_t *pool = vt_pool_from(&o);
  void *p = NULL;
  VT_EXPECT(vram_malloc(pool, 128 << 20, NULL, &p), VRAM_ENOMEM);
  VT_VALID(pool);
  char report[4096], want[160];
  vram_oom_report(pool, report, sizeof report);
  assert_non_null(strstr(report, "Other processes on this GPU: pid 4242 (bigjob) 5.00 GiB;"));
  snprintf(want, sizeof want, "pid %d (trainer) 64.00 MiB, vramkit: reserved", (int)c.pid);
  assert_non_null(strstr(report, want));
  assert_non_null(strstr(report, "pid 4343 (hidden).")); /* NVML gave no figure */
  snprintf(want, sizeof want, "pid %d ", (int)getpid());
  assert_null(strstr(report, want)); /* not itself */
  VT_OK(vram_pool_destroy(pool));
  /* The record names the GPU as NVML does. */
  const vram_process_record *r = map_record(pub_dir, c.pid);
  assert_non_null(r);
  assert_string_equal(read_slot(r, 0).uuid, "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
  munmap((void *)r, sizeof *r);
  kill(c.pid, SIGKILL);
  finish(&c);
  unsetenv("FAKE_NVML_PROCS");
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "child") == 0) return child_main(argv[2], argv[3]);
  ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
  if (n <= 0) return 1;
  self_exe[n] = 0;
  snprintf(base_dir, sizeof base_dir, "%s/vramkit-publish-XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(base_dir)) return 1;
  snprintf(pub_dir, sizeof pub_dir, "%s/pub", base_dir);
  setenv("VRAMKIT_PUBLISH_DIR", pub_dir, 1); /* children inherit it */
  unsetenv("VRAMKIT_PUBLISH");
  int failed;
  if (argc > 1 && strcmp(argv[1], "nvml") == 0) {
    setenv("VRAMKIT_TEST_GPU", "1", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nvml_neighbours),   cmocka_unit_test(test_planted_neighbour),
        cmocka_unit_test(test_spoofed_record),    cmocka_unit_test(test_names_are_escaped),
        cmocka_unit_test(test_contradicting_figures),
        cmocka_unit_test(test_corrupt_files),     cmocka_unit_test(test_killed_child),
        cmocka_unit_test(test_truncated_under_the_reader),
    };
    failed = cmocka_run_group_tests(tests, NULL, NULL);
  } else {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_record_fields),   cmocka_unit_test(test_removed_at_exit),
        cmocka_unit_test(test_publish_off),     cmocka_unit_test(test_refused_dirs),
        cmocka_unit_test(test_sim_has_no_neighbours), cmocka_unit_test(test_publish_switch),
        cmocka_unit_test(test_long_publish_dir),
        cmocka_unit_test(test_records_dir),
    };
    failed = cmocka_run_group_tests(tests, NULL, NULL);
  }
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", base_dir);
  if (system(cmd) != 0) failed++;
  return failed;
}

/* publish.c - writes this process's shared-memory record (vramkit_record.h).
 *
 * The record is created at the first pool that claims a slot: the directory is checked
 * (ours, no group or other permissions: a record says how a process uses memory, and a
 * directory someone else controls could swap files under us), the file is created afresh
 * with O_EXCL and O_NOFOLLOW, its pages are reserved with posix_fallocate (a full tmpfs
 * would otherwise kill the process with SIGBUS at the first store, not fail a call), and it
 * is mapped shared. The header is written before the magic, so that a reader never takes a
 * half-made record for a valid one. atexit unlinks it.
 *
 * fork: a child must not write into its parent's record, nor unlink it at its exit. The
 * child handler replaces the inherited mapping with private anonymous memory at the same
 * address (pools copied into the child keep writing, to nobody) and forgets the record, so
 * that a pool the child creates opens a record of the child's own.
 */
#define _GNU_SOURCE
#include "obs/publish.h"
#include "pool/options.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { PUB_UNTRIED = 0, PUB_ON = 1, PUB_OFF = -1 };

static pthread_mutex_t pub_lock = PTHREAD_MUTEX_INITIALIZER;
static int pub_state = PUB_UNTRIED;
static vram_process_record *pub_rec;
static pid_t pub_pid;            /* the process that made pub_rec: only it unlinks */
static char pub_path[4096];
static bool pub_hooks_installed;

static void pub_warn(const char *what, const char *path, int err) {
  fprintf(stderr, "vramkit: not publishing memory state (VRAMKIT_PUBLISH=0 silences this): %s %s%s%s\n",
          what, path, err ? ": " : "", err ? strerror(err) : "");
}

int _vram_publish_dir(char *buf, size_t cap) {
  const char *dir = getenv("VRAMKIT_PUBLISH_DIR");
  int n = dir && *dir ? snprintf(buf, cap, "%s", dir)
                      : snprintf(buf, cap, "/dev/shm/vramkit-%u", (unsigned)geteuid());
  if (n >= 0 && (size_t)n < cap) return 0;
  /* Cut short, the name would be another folder's: name none rather than the wrong one. */
  buf[0] = 0;
  return -1;
}


static void fill_header(vram_process_record *r, bool with_cmdline) {
  r->version = VRAM_RECORD_VERSION;
  r->record_size = (uint32_t)sizeof *r;
  r->pid = (int32_t)getpid();
  r->uid = (uint32_t)geteuid();
  r->start_ticks = _vram_process_start_ticks(getpid());
  size_t n = _vram_read_proc("/proc/self/comm", r->name, sizeof r->name);
  while (n && r->name[n - 1] == '\n') r->name[--n] = 0;
  if (with_cmdline) {
    /* Arguments are NUL-separated; the record keeps them space-separated. */
    n = _vram_read_proc("/proc/self/cmdline", r->cmdline, sizeof r->cmdline);
    for (size_t i = 0; n && i + 1 < n; i++)
      if (!r->cmdline[i]) r->cmdline[i] = ' ';
  }
  __atomic_thread_fence(__ATOMIC_RELEASE);
  __atomic_store_n(&r->magic, VRAM_RECORD_MAGIC, __ATOMIC_RELEASE);
}

/* The directory, made if missing and refused unless it is ours and closed to others.
 * Returns a descriptor for openat, or -1 after one line on stderr that starts with
 * `refusal` (what stays off). Shared with the other files of the folder (the shared sim,
 * the give-back group), which follow the same trust rules. */
int _vram_private_dir_open(const char *dir, const char *refusal) {
  const char *why = NULL;
  int err = 0;
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
    why = "cannot create";
    err = errno;
  }
  int dfd = why ? -1 : open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  if (why) {
  } else if (dfd < 0) {
    why = "cannot open";
    err = errno;
  } else if (fstat(dfd, &st) != 0 || !S_ISDIR(st.st_mode)) {
    why = "not a directory:";
  } else if (st.st_uid != geteuid()) {
    why = "refusing a directory another user owns:";
  } else if (st.st_mode & 077) {
    why = "refusing a directory open to group or others (want mode 0700):";
  } else {
    return dfd;
  }
  fprintf(stderr, "vramkit: %s: %s %s%s%s\n", refusal, why, dir, err ? ": " : "",
          err ? strerror(err) : "");
  if (dfd >= 0) close(dfd);
  return -1;
}

static int open_dir(const char *dir) {
  return _vram_private_dir_open(dir, "not publishing memory state (VRAMKIT_PUBLISH=0 silences this)");
}

/* "<pid>.rec", created fresh: a stale file of our pid is a dead process's (pids are
 * reused), and O_EXCL with O_NOFOLLOW makes sure the file we map is the one we made. */
static int create_file(int dfd, const char *name) {
  int fd = openat(dfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST && unlinkat(dfd, name, 0) == 0)
    fd = openat(dfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  return fd;
}

static void unlink_at_exit(void) {
  if (pub_rec && pub_pid == getpid()) unlink(pub_path);
}

static void forget_in_child(void) {
  if (pub_rec) {
    /* Same address, private memory: stale slot pointers in copied pools stay valid. */
    void *p = mmap(pub_rec, sizeof *pub_rec, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    (void)p;
  }
  pub_rec = NULL;
  pub_state = PUB_UNTRIED;
  pthread_mutex_init(&pub_lock, NULL);
}

static void fork_prepare(void) { pthread_mutex_lock(&pub_lock); }
static void fork_parent(void) { pthread_mutex_unlock(&pub_lock); }

/* With pub_lock held: open the record, or decide that publishing is off. */
static void open_record(void) {
  const char *env = getenv("VRAMKIT_PUBLISH");
  bool with_cmdline = env && strcmp(env, "cmdline") == 0;
  int on = 1;
  /* A value it cannot read leaves publishing as it is by default: a warning, never an error
   * (publishing must not make an allocation fail). */
  if (env && *env && !with_cmdline && _vram_parse_switch(env, &on) != 0)
    fprintf(stderr, "vramkit: warning: VRAMKIT_PUBLISH='%.120s' is not 0/1, off/on, false/true, "
                    "no/yes or cmdline; publishing stays on\n", env);
  pub_state = PUB_OFF;
  if (!on) return;
  char dir[4000], name[32];
  if (_vram_publish_dir(dir, sizeof dir) != 0) {
    fprintf(stderr, "vramkit: not publishing memory state: VRAMKIT_PUBLISH_DIR is %zu characters "
                    "long, more than the %zu a folder name may have\n",
            strlen(getenv("VRAMKIT_PUBLISH_DIR")), sizeof dir - 1);
    return;
  }
  int dfd = open_dir(dir);
  if (dfd < 0) return;
  snprintf(name, sizeof name, "%d.rec", (int)getpid());
  snprintf(pub_path, sizeof pub_path, "%s/%s", dir, name);
  int fd = create_file(dfd, name);
  if (fd < 0) {
    pub_warn("cannot create", pub_path, errno);
    close(dfd);
    return;
  }
  int err = 0;
  if (ftruncate(fd, (off_t)sizeof(vram_process_record)) != 0) err = errno;
  else err = posix_fallocate(fd, 0, (off_t)sizeof(vram_process_record));
  void *map = MAP_FAILED;
  if (!err) {
    map = mmap(NULL, sizeof(vram_process_record), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) err = errno;
  }
  close(fd);
  if (err) {
    pub_warn("cannot size or map", pub_path, err);
    unlinkat(dfd, name, 0);
    close(dfd);
    return;
  }
  close(dfd);
  pub_rec = map;
  pub_pid = getpid();
  fill_header(pub_rec, with_cmdline);
  if (!pub_hooks_installed) {
    pub_hooks_installed = true;
    atexit(unlink_at_exit);
    pthread_atfork(fork_prepare, fork_parent, forget_in_child);
  }
  pub_state = PUB_ON;
  /* Now and then a process died without its atexit (killed): clear what it left. */
  _vram_publish_sweep();
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* With pub_lock held: highest in-use slot + 1. */
static void update_n_devices(void) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < VRAM_RECORD_MAX_DEVICES; i++)
    if (pub_rec->devices[i].in_use) n = i + 1;
  __atomic_store_n(&pub_rec->n_devices, n, __ATOMIC_RELEASE);
}

vram_device_record *_vram_publish_claim(int device, const char *source, const char *uuid) {
  if (device < 0 || device >= VRAM_RECORD_MAX_DEVICES) return NULL;
  vram_device_record *d = NULL;
  pthread_mutex_lock(&pub_lock);
  if (pub_state == PUB_UNTRIED) open_record();
  if (pub_state == PUB_ON && !pub_rec->devices[device].in_use) {
    d = &pub_rec->devices[device];
    uint64_t seq = d->seq;
    __atomic_store_n(&d->seq, seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    size_t from = offsetof(vram_device_record, device);
    memset((char *)d + from, 0, sizeof *d - from);
    d->device = device;
    d->in_use = 1;
    snprintf(d->source, sizeof d->source, "%s", source ? source : "");
    snprintf(d->uuid, sizeof d->uuid, "%s", uuid ? uuid : "");
    d->updated_ns = now_ns();
    __atomic_store_n(&d->seq, seq + 2, __ATOMIC_RELEASE);
    update_n_devices();
  }
  pthread_mutex_unlock(&pub_lock);
  return d;
}

void _vram_publish_release(vram_device_record *d) {
  if (!d) return;
  pthread_mutex_lock(&pub_lock);
  /* A pool copied into a forked child holds a slot of memory no longer published. */
  bool ours = pub_rec && d >= pub_rec->devices && d < pub_rec->devices + VRAM_RECORD_MAX_DEVICES;
  uint64_t seq = d->seq;
  __atomic_store_n(&d->seq, seq + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  size_t from = offsetof(vram_device_record, in_use);
  memset((char *)d + from, 0, sizeof *d - from);
  __atomic_store_n(&d->seq, seq + 2, __ATOMIC_RELEASE);
  if (ours) update_n_devices();
  pthread_mutex_unlock(&pub_lock);
}

void _vram_publish_store_slow(vram_device_record *d, const vram_publish_slow *v) {
  uint64_t seq = __atomic_load_n(&d->seq, __ATOMIC_RELAXED);
  __atomic_store_n(&d->seq, seq + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  d->allocated_bytes = v->allocated;
  d->reserved_bytes = v->reserved;
  d->active_bytes = v->active;
  d->cached_free_bytes = v->reserved - v->active;
  d->largest_free_block = v->largest_free;
  d->largest_of_cached_bytes = v->largest_of_cached;
  d->peak_allocated_bytes = v->peak_allocated;
  d->peak_reserved_bytes = v->peak_reserved;
  d->num_ooms = v->num_ooms;
  d->num_alloc_retries = v->num_alloc_retries;
  d->limit_bytes = v->limit;
  d->capacity_bytes = v->capacity;
  d->givable_bytes = v->givable;
  d->given_back_bytes = v->given_back;
  d->given_back_count = v->given_back_count;
  d->group_limit_bytes = v->group_limit;
  d->updated_ns = now_ns();
  __atomic_store_n(&d->seq, seq + 2, __ATOMIC_RELEASE);
}

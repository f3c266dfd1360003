/* shared_file.c - the files several processes of one user map together, and their member
 * tables (shared_file.h). */
#define _GNU_SOURCE
#include "obs/shared_file.h"
#include "obs/publish.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* How long a joiner waits for the maker of a file to size it and write its header: the
 * maker does a few system calls, so this only matters when the maker died half-way. */
#define MAKER_WAIT_NS (2ull * 1000 * 1000 * 1000)
#define MAKER_POLL_NS (1000 * 1000)

static void refuse(const char *refusal, const char *what, const char *name, int err) {
  fprintf(stderr, "vramkit: %s: %s %s%s%s\n", refusal, what, name, err ? ": " : "",
          err ? strerror(err) : "");
}

static int open_folder(const char *refusal) {
  char dir[4000];
  if (_vram_publish_dir(dir, sizeof dir) != 0) {
    refuse(refusal, "the folder name is too long:", "VRAMKIT_PUBLISH_DIR", 0);
    return -1;
  }
  return _vram_private_dir_open(dir, refusal);
}

static void *map_new(int dfd, int fd, const char *name, size_t size, const char *refusal) {
  int err = ftruncate(fd, (off_t)size) != 0 ? errno : posix_fallocate(fd, 0, (off_t)size);
  void *map = err ? MAP_FAILED : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map != MAP_FAILED) return map;
  refuse(refusal, "cannot size or map", name, err ? err : errno);
  unlinkat(dfd, name, 0);
  return NULL;
}

/* Another process made the file: it must be this user's, closed to others, and reach
 * `size` bytes with the magic written within the maker's wait. */
static void *map_existing(int fd, const char *name, size_t size, uint64_t magic,
                          const char *refusal) {
  struct stat st;
  for (uint64_t waited = 0;; waited += MAKER_POLL_NS) {
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 077)) {
      refuse(refusal, "refusing a file that is not this user's alone (want mode 0600):", name, 0);
      return NULL;
    }
    if ((size_t)st.st_size == size) break;
    /* Empty: the maker has not sized it yet. Any other size: another version's file. */
    if (st.st_size != 0 || waited >= MAKER_WAIT_NS) {
      refuse(refusal, "a file of another size or version:", name, 0);
      return NULL;
    }
    nanosleep(&(struct timespec){0, MAKER_POLL_NS}, NULL);
  }
  void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    refuse(refusal, "cannot map", name, errno);
    return NULL;
  }
  for (uint64_t waited = 0; waited < MAKER_WAIT_NS; waited += MAKER_POLL_NS) {
    uint64_t seen = __atomic_load_n((uint64_t *)map, __ATOMIC_ACQUIRE);
    if (seen == magic) return map;
    if (seen) break;
    nanosleep(&(struct timespec){0, MAKER_POLL_NS}, NULL);
  }
  refuse(refusal, "a file of another kind or version, or whose maker died:", name, 0);
  munmap(map, size);
  return NULL;
}

void *_vram_shared_file_open(const char *name, size_t size, uint64_t magic, const char *refusal,
                             bool *created) {
  int dfd = open_folder(refusal);
  if (dfd < 0) return NULL;
  void *map = NULL;
  int flags = O_RDWR | O_NOFOLLOW | O_CLOEXEC;
  int fd = openat(dfd, name, flags | O_CREAT | O_EXCL, 0600);
  *created = fd >= 0;
  if (fd < 0 && errno == EEXIST) fd = openat(dfd, name, flags);
  if (fd < 0) refuse(refusal, "cannot open", name, errno);
  else if (*created) map = map_new(dfd, fd, name, size, refusal);
  else map = map_existing(fd, name, size, magic, refusal);
  if (fd >= 0) close(fd);
  close(dfd);
  return map;
}

void _vram_shared_file_close(void *map, size_t size) {
  if (map) munmap(map, size);
}

int _vram_shared_file_remove(const char *name) {
  char dir[4000], path[4200];
  if (_vram_publish_dir(dir, sizeof dir) != 0) return -1;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return unlink(path);
}

/* ---- member tables */

/* This process's start time, read again after a fork (the child is another process). */
static uint64_t own_start_ticks(void) {
  static pid_t cached_pid;
  static uint64_t cached_ticks;
  pid_t self = getpid();
  if (__atomic_load_n(&cached_pid, __ATOMIC_ACQUIRE) != self) {
    __atomic_store_n(&cached_ticks, _vram_process_start_ticks(self), __ATOMIC_RELAXED);
    __atomic_store_n(&cached_pid, self, __ATOMIC_RELEASE);
  }
  return __atomic_load_n(&cached_ticks, __ATOMIC_RELAXED);
}

int _vram_member_claim(void *entries, size_t count, size_t stride) {
  uint64_t ticks = own_start_ticks();
  for (size_t i = 0; i < count; i++) {
    vram_member_id *id = (vram_member_id *)((char *)entries + i * stride);
    int32_t expected = 0;
    if (!atomic_compare_exchange_strong(&id->pid, &expected, -1)) continue;
    atomic_store(&id->start_ticks, ticks);
    atomic_store(&id->pid, (int32_t)getpid());
    return (int)i;
  }
  return -1;
}

bool _vram_member_other_alive(vram_member_id *id) {
  int32_t pid = atomic_load(&id->pid);
  uint64_t ticks = atomic_load(&id->start_ticks);
  return pid > 0 && ticks && pid != (int32_t)getpid() && _vram_process_alive(pid, ticks);
}

bool _vram_member_take_dead(vram_member_id *id) {
  int32_t pid = atomic_load(&id->pid);
  uint64_t ticks = atomic_load(&id->start_ticks);
  if (pid <= 0 || !ticks || pid == (int32_t)getpid() || _vram_process_alive(pid, ticks))
    return false;
  return atomic_compare_exchange_strong(&id->pid, &pid, -1);
}

void _vram_member_free(vram_member_id *id) {
  atomic_store(&id->start_ticks, 0);
  atomic_store(&id->pid, 0);
}

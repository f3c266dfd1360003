/* publish_read.c - reads the records other processes publish (vramkit_record.h): the
 * seqlock copy, the checks that make a file in the directory a record worth believing, the
 * sweep of dead processes' records, and the peers on one GPU for the OOM report.
 *
 * Nothing here trusts the directory's contents: a file is opened with O_NOFOLLOW, must be a
 * regular file of this user of exactly the record's size, named after the pid it holds,
 * with the right magic and version, and its process must be alive with the start time it
 * recorded (else the pid was reused). Anything else is skipped; only a dead process's
 * record of this user is deleted. The writer's own process never fails for what it finds.
 */
#define _GNU_SOURCE
#include "obs/publish.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A writer's update is a handful of stores: a few thousand tries cover any preemption
 * short of a writer that died mid-update. */
#define READ_TRIES 4096

int _vram_record_read_device(const vram_device_record *src, vram_device_record *out) {
  for (int i = 0; i < READ_TRIES; i++) {
    uint64_t s1 = __atomic_load_n(&src->seq, __ATOMIC_ACQUIRE);
    if (s1 & 1) continue;
    memcpy(out, (const void *)src, sizeof *out);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    uint64_t s2 = __atomic_load_n(&src->seq, __ATOMIC_RELAXED);
    if (s1 == s2) {
      out->seq = s1;
      return 0;
    }
  }
  return -1;
}

/* Field 22 of /proc/<pid>/stat: the start time in clock ticks, which with the pid names a
 * process for good (a reused pid has another start time); 0 if the process is gone. The
 * name may hold spaces and parentheses, so fields are counted from the last ')'. */
uint64_t _vram_process_start_ticks(int pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  if (!p) return 0;
  p++;
  for (int field = 3; field <= 22 && *p; field++) {
    while (*p == ' ') p++;
    if (field == 22) return strtoull(p, NULL, 10);
    while (*p && *p != ' ') p++;
  }
  return 0;
}

/* A process is the record's when its pid lives with the recorded start time. A zombie
 * (killed, not yet reaped) still has its /proc entry: it holds no memory, so it is dead. */
static bool record_alive(const vram_process_record *r) {
  if (r->pid <= 0) return false;
  if (kill(r->pid, 0) != 0 && errno == ESRCH) return false;
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)r->pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    char *p = n > 0 ? (buf[n] = 0, strrchr(buf, ')')) : NULL;
    if (p && (p[2] == 'Z' || p[2] == 'X')) return false;
  }
  uint64_t ticks = _vram_process_start_ticks(r->pid);
  return ticks != 0 && ticks == r->start_ticks;
}

typedef enum { REC_BAD, REC_DEAD, REC_LIVE } rec_kind;

/* Maps `name` of the directory if it is a record of this user; what it is. *out is the
 * mapping (to munmap) for DEAD and LIVE. */
static rec_kind open_record_file(int dfd, const char *name, vram_process_record **out) {
  *out = NULL;
  char *end = NULL;
  long pid = strtol(name, &end, 10);
  if (pid <= 0 || !end || strcmp(end, ".rec") != 0) return REC_BAD;
  int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return REC_BAD;
  struct stat st;
  void *map = MAP_FAILED;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
      st.st_size == (off_t)sizeof(vram_process_record))
    map = mmap(NULL, sizeof(vram_process_record), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return REC_BAD;
  vram_process_record *r = map;
  if (__atomic_load_n(&r->magic, __ATOMIC_ACQUIRE) != VRAM_RECORD_MAGIC ||
      r->version != VRAM_RECORD_VERSION || r->record_size != sizeof *r || r->pid != pid) {
    munmap(map, sizeof *r);
    return REC_BAD;
  }
  *out = r;
  return record_alive(r) ? REC_LIVE : REC_DEAD;
}

static DIR *open_publish_dir(void) {
  char dir[4096];
  _vram_publish_dir(dir, sizeof dir);
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) return NULL;
  struct stat st;
  /* Records in a directory others control could be anybody's words: not read. */
  if (fstat(dfd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077)) {
    close(dfd);
    return NULL;
  }
  DIR *d = fdopendir(dfd);
  if (!d) close(dfd);
  return d;
}

int _vram_publish_sweep(void) {
  DIR *d = open_publish_dir();
  if (!d) return 0;
  int removed = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    vram_process_record *r;
    rec_kind k = open_record_file(dirfd(d), e->d_name, &r);
    if (r) munmap(r, sizeof *r);
    if (k == REC_DEAD && unlinkat(dirfd(d), e->d_name, 0) == 0) removed++;
  }
  closedir(d);
  return removed;
}

static bool slot_matches(const vram_device_record *s, const char *uuid, int device) {
  if (!s->in_use) return false;
  if (uuid && *uuid) return strncmp(s->uuid, uuid, sizeof s->uuid) == 0;
  return s->uuid[0] == 0 && s->device == device && strncmp(s->source, "sim", 3) == 0;
}

int _vram_publish_peers(const char *uuid, int device, vram_record_peer *out, int max) {
  DIR *d = open_publish_dir();
  if (!d) return 0;
  int n = 0, self = (int)getpid();
  struct dirent *e;
  while (n < max && (e = readdir(d))) {
    vram_process_record *r;
    rec_kind k = open_record_file(dirfd(d), e->d_name, &r);
    if (k == REC_DEAD) unlinkat(dirfd(d), e->d_name, 0);
    if (k == REC_LIVE && r->pid != self) {
      uint32_t nd = __atomic_load_n(&r->n_devices, __ATOMIC_ACQUIRE);
      if (nd > VRAM_RECORD_MAX_DEVICES) nd = VRAM_RECORD_MAX_DEVICES;
      for (uint32_t i = 0; i < nd && n < max; i++) {
        vram_device_record copy;
        if (_vram_record_read_device(&r->devices[i], &copy) != 0) continue;
        copy.source[sizeof copy.source - 1] = 0;
        copy.uuid[sizeof copy.uuid - 1] = 0;
        if (!slot_matches(&copy, uuid, device)) continue;
        out[n].pid = r->pid;
        memcpy(out[n].name, r->name, sizeof out[n].name);
        out[n].name[sizeof out[n].name - 1] = 0;
        out[n].device = copy;
        n++;
      }
    }
    if (r) munmap(r, sizeof *r);
  }
  closedir(d);
  return n;
}

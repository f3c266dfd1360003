/* publish_read.c - reads the records other processes publish (vramkit_record.h): the one
 * reader behind the OOM report's neighbours, `vramkit top`, `vramkit export` and the Python
 * package's vramkit.records, so that every reader believes and refuses the same files.
 *
 * Nothing here trusts the directory's contents. The folder must be ours, not a symbolic
 * link, and closed to group and others; a file is opened with O_NOFOLLOW and must be a
 * regular file of this user, closed to others, named after the pid it holds, with the right
 * magic, version and size; its process must be alive, with the start time and the user the
 * record claims (else the pid was reused, or the record speaks for a process it does not
 * belong to); its device slots must hold figures that agree as a pool's do. Only a record of
 * this user whose process is gone is deleted.
 *
 * Records are read with pread into the caller's memory, never mapped: a file can shrink at
 * any moment (another process truncates it), and a load through a mapping past the new end
 * kills the reader with SIGBUS. A device slot is taken only when two reads of it, one after
 * the other, are byte for byte the same with an even sequence: the writer makes the sequence
 * odd before its first store and even after its last, so a copy that saw any store of an
 * update in progress differs from the next one in its sequence at least.
 */
#define _GNU_SOURCE
#include "obs/publish.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* A writer holds a slot's sequence odd for a handful of stores under its pool's lock. A
 * reader spins a while, then sleeps briefly between tries, and past that takes the writer
 * for stopped (a debugger, SIGSTOP, killed mid-update) and calls the slot busy. */
#define SPIN_TRIES 256
#define SLEEP_TRIES 20
#define SLEEP_NS 500000L

static void say(char *why, size_t cap, const char *fmt, ...) {
  if (!why || !cap) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, cap, fmt, ap);
  va_end(ap);
}

/* pread until `len` bytes or the end of the file; the count read, -1 on an error. */
static ssize_t read_at(int fd, void *buf, size_t len, off_t at) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = pread(fd, (char *)buf + got, len - got, at + (off_t)got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) break;
    got += (size_t)n;
  }
  return (ssize_t)got;
}

size_t _vram_read_proc(const char *path, char *buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, cap - 1);
  close(fd);
  if (n < 0) n = 0;
  buf[n] = 0;
  return (size_t)n;
}

/* What /proc says of a running process: its start time in clock ticks since boot (field
 * 22 of stat: with the pid it names a process for good), its effective uid, and whether it
 * is a zombie (killed, not yet reaped: it holds no memory any more). */
typedef struct proc_identity {
  uint64_t start_ticks; /* 0: no such process */
  uint32_t euid;
  bool has_euid, zombie;
} proc_identity;

static proc_identity identify(int pid) {
  proc_identity id = {0};
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  if (!_vram_read_proc(path, buf, sizeof buf)) return id;
  /* The name (field 2) may hold spaces and parentheses: fields count from the last ')'. */
  char *p = strrchr(buf, ')');
  if (!p || !p[1]) return id;
  id.zombie = p[2] == 'Z' || p[2] == 'X';
  p++;
  for (int field = 3; field <= 22 && *p; field++) {
    while (*p == ' ') p++;
    if (field == 22) id.start_ticks = strtoull(p, NULL, 10);
    while (*p && *p != ' ') p++;
  }
  snprintf(path, sizeof path, "/proc/%d/status", pid);
  char status[4096];
  if (_vram_read_proc(path, status, sizeof status)) {
    /* "Uid:\treal\teffective\tsaved\tfs" */
    const char *uid = strstr(status, "\nUid:");
    unsigned real, effective;
    if (uid && sscanf(uid + 5, "%u %u", &real, &effective) == 2) {
      id.euid = effective;
      id.has_euid = true;
    }
  }
  return id;
}

uint64_t _vram_process_start_ticks(int pid) { return identify(pid).start_ticks; }

bool _vram_process_alive(int pid, uint64_t start_ticks) {
  if (pid <= 0) return false;
  proc_identity id = identify(pid);
  return id.start_ticks && id.start_ticks == start_ticks && !id.zombie;
}

int _vram_record_read_device(int fd, int index, vram_device_record *out) {
  off_t at = (off_t)offsetof(vram_process_record, devices) + (off_t)index * (off_t)sizeof *out;
  vram_device_record first, second;
  vram_device_record *prev = &first, *next = &second;
  if (read_at(fd, prev, sizeof *prev, at) != (ssize_t)sizeof *prev) return -1;
  for (int i = 0; i < SPIN_TRIES + SLEEP_TRIES; i++) {
    if (i >= SPIN_TRIES) nanosleep(&(struct timespec){0, SLEEP_NS}, NULL);
    if (read_at(fd, next, sizeof *next, at) != (ssize_t)sizeof *next) return -1;
    if (!(next->seq & 1) && memcmp(prev, next, sizeof *next) == 0) {
      *out = *next;
      return 0;
    }
    vram_device_record *t = prev;
    prev = next;
    next = t;
  }
  *out = *prev; /* what identifies the slot, for a "busy" answer */
  return -1;
}

/* The pid a record's file name holds ("<pid>.rec"), or 0. */
static long pid_of_name(const char *name) {
  char *end = NULL;
  errno = 0;
  long pid = strtol(name, &end, 10);
  if (errno || pid <= 0 || pid > INT32_MAX || end == name || name[0] == '+' || name[0] == ' ' ||
      strcmp(end, ".rec") != 0)
    return 0;
  return pid;
}

/* The checks of the record's own header, with the file's owner and the bytes read. */
static vram_record_verdict check_header(const vram_process_record *r, ssize_t got, long pid,
                                        uid_t owner, char *why, size_t cap) {
  const size_t header = offsetof(vram_process_record, devices);
  if (got < (ssize_t)header) {
    say(why, cap, "too short for a record (%zd bytes, the header needs %zu)", got, header);
  } else if (r->magic == 0) {
    say(why, cap, "not initialised yet (a process is creating it)");
  } else if (r->magic != VRAM_RECORD_MAGIC) {
    say(why, cap, "not a vramkit record (magic %#018llx)", (unsigned long long)r->magic);
  } else if (r->version != VRAM_RECORD_VERSION) {
    say(why, cap, "record version %u; this reader knows version %u", r->version,
        VRAM_RECORD_VERSION);
  } else if (r->record_size != sizeof *r || got < (ssize_t)sizeof *r) {
    say(why, cap, "record of %u bytes in a file of %zd; version %u records are %zu",
        r->record_size, got, VRAM_RECORD_VERSION, sizeof *r);
  } else if (r->uid != owner) {
    say(why, cap, "the record claims uid %u in a file of uid %u", r->uid, (unsigned)owner);
  } else if (r->pid != pid) {
    say(why, cap, "the record's pid %d is not its file's name", r->pid);
  } else {
    return VRAM_RECORD_LIVE;
  }
  return VRAM_RECORD_SKIPPED;
}

/* Whether the process the record names is the one running under its pid. */
static vram_record_verdict check_process(const vram_process_record *r, char *why, size_t cap) {
  proc_identity id = identify(r->pid);
  if (!id.start_ticks || id.zombie) {
    say(why, cap, "process %d has exited", r->pid);
    return VRAM_RECORD_EXITED;
  }
  if (id.start_ticks != r->start_ticks) {
    say(why, cap, "process %d has exited (its pid now names another process)", r->pid);
    return VRAM_RECORD_EXITED;
  }
  if (!id.has_euid || id.euid != r->uid) {
    /* A record this user wrote for a process that is not this user's: it proves nothing
     * about that process, and is not ours to delete for it either. */
    say(why, cap, "process %d runs as another user, not as the record's uid %u", r->pid, r->uid);
    return VRAM_RECORD_SKIPPED;
  }
  return VRAM_RECORD_LIVE;
}

/* Whether a stable copy of a slot holds what every store of a writer leaves together (the
 * pool's own counters: allocated within active within reserved, the cache their difference,
 * each peak at or above its figure, a device ordinal). A slot that does not was not written
 * by a pool: its figures would be shown as a neighbour's claim, or overflow a reader's
 * arithmetic, so the record is refused, naming the first contradiction. */
static bool device_plausible(const vram_device_record *d, uint32_t index, char *why, size_t cap) {
  if (!d->in_use) return true; /* a released slot is zeroed but for what identifies it */
  const char *broken = NULL;
  if (d->device < 0) broken = "a negative device";
  else if (d->allocated_bytes > d->active_bytes) broken = "allocated > active";
  else if (d->active_bytes > d->reserved_bytes) broken = "active > reserved";
  else if (d->cached_free_bytes != d->reserved_bytes - d->active_bytes)
    broken = "cached != reserved - active";
  else if (d->peak_allocated_bytes < d->allocated_bytes) broken = "peak allocated < allocated";
  else if (d->peak_reserved_bytes < d->reserved_bytes) broken = "peak reserved < reserved";
  else if (d->givable_bytes > d->reserved_bytes) broken = "givable > reserved";
  else if (d->largest_free_block > d->reserved_bytes) broken = "largest free > reserved";
  else if (d->largest_free_block > d->largest_of_cached_bytes)
    broken = "largest free > the cache it was measured in";
  if (!broken) return true;
  say(why, cap, "device slot %u's figures contradict each other (%s), which no pool writes",
      index, broken);
  return false;
}

/* Each device slot in use, copied consistently; a slot that never held still is kept with
 * what identifies it, its figures zeroed, and its bit set in *busy. SKIPPED (with why) when a
 * stable slot's figures are not a pool's. */
static vram_record_verdict read_devices(int fd, vram_process_record *r, uint32_t *busy, char *why,
                                        size_t cap) {
  uint32_t n = r->n_devices < VRAM_RECORD_MAX_DEVICES ? r->n_devices : VRAM_RECORD_MAX_DEVICES;
  r->n_devices = n;
  for (uint32_t i = 0; i < n; i++) {
    vram_device_record *d = &r->devices[i];
    if (_vram_record_read_device(fd, (int)i, d) != 0) {
      size_t from = offsetof(vram_device_record, allocated_bytes);
      memset((char *)d + from, 0, sizeof *d - from);
      *busy |= 1u << i;
    } else if (!device_plausible(d, i, why, cap)) {
      return VRAM_RECORD_SKIPPED;
    }
    d->source[sizeof d->source - 1] = 0;
    d->uuid[sizeof d->uuid - 1] = 0;
  }
  memset(&r->devices[n], 0, (VRAM_RECORD_MAX_DEVICES - n) * sizeof r->devices[0]);
  return VRAM_RECORD_LIVE;
}

vram_record_verdict vram_record_read(int dir_fd, const char *name, vram_process_record *out,
                                     uint32_t *busy, char *why, size_t why_cap) {
  say(why, why_cap, "%s", "");
  memset(out, 0, sizeof *out);
  if (busy) *busy = 0;
  long pid = pid_of_name(name);
  if (!pid) {
    say(why, why_cap, "not a record's name (<pid>.rec)");
    return VRAM_RECORD_SKIPPED;
  }
  int fd = openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return VRAM_RECORD_GONE; /* its process exited meanwhile */
    say(why, why_cap, "%s",
        errno == EACCES ? "not readable by this user (another user's record)"
        : errno == ELOOP ? "a symbolic link" : strerror(errno));
    return VRAM_RECORD_SKIPPED;
  }
  struct stat st;
  vram_record_verdict v = VRAM_RECORD_SKIPPED;
  if (fstat(fd, &st) != 0) {
    say(why, why_cap, "%s", strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    say(why, why_cap, "not a regular file");
  } else if (st.st_uid != geteuid()) {
    say(why, why_cap, "owned by uid %u, not by this user (%u)", (unsigned)st.st_uid,
        (unsigned)geteuid());
  } else {
    ssize_t got = read_at(fd, out, sizeof *out, 0);
    if (got < 0) say(why, why_cap, "cannot be read (%s)", strerror(errno));
    else v = check_header(out, got, pid, st.st_uid, why, why_cap);
    if (v == VRAM_RECORD_LIVE && (st.st_mode & 077)) {
      /* The writer makes records 0600: one open to others is not one it made. */
      say(why, why_cap, "open to group or others (mode %04o, want 0600)",
          (unsigned)(st.st_mode & 07777));
      v = VRAM_RECORD_SKIPPED;
    }
    if (v == VRAM_RECORD_LIVE) v = check_process(out, why, why_cap);
    out->name[sizeof out->name - 1] = 0;
    out->cmdline[sizeof out->cmdline - 1] = 0;
    if (v == VRAM_RECORD_LIVE) {
      uint32_t ignored = 0;
      v = read_devices(fd, out, busy ? busy : &ignored, why, why_cap);
    }
  }
  close(fd);
  return v;
}

int vram_records_dir(char *buf, size_t cap) {
  if (!buf || !cap) return -1;
  return _vram_publish_dir(buf, cap);
}

int vram_records_open(const char *dir, char *why, size_t why_cap) {
  char path[4096];
  say(why, why_cap, "%s", "");
  int named = dir ? snprintf(path, sizeof path, "%s", dir) : _vram_publish_dir(path, sizeof path);
  if (named < 0 || (size_t)named >= sizeof path) {
    /* Cut short, the name would be another folder's. */
    say(why, why_cap, "the folder's name is too long (%zu bytes at most)", sizeof path - 1);
    errno = ENAMETOOLONG;
    return -1;
  }
  int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) {
    int err = errno;
    say(why, why_cap, "%s", err == ELOOP || err == ENOTDIR ? "a symbolic link or not a folder; "
                                                             "its records are not read"
                                                           : strerror(err));
    errno = err;
    return -1;
  }
  /* Records in a folder others control could be anybody's words: not read, not cleaned. */
  struct stat st;
  if (fstat(dfd, &st) != 0) {
    say(why, why_cap, "%s", strerror(errno));
  } else if (st.st_uid != geteuid()) {
    say(why, why_cap, "owned by uid %u, not by this user; its records are not read",
        (unsigned)st.st_uid);
  } else if (st.st_mode & 077) {
    say(why, why_cap, "open to group or others (mode %04o, want 0700); its records are not read",
        (unsigned)(st.st_mode & 07777));
  } else {
    return dfd;
  }
  close(dfd);
  errno = EPERM;
  return -1;
}

/* Calls fn for every live record of the folder, deleting those of exited processes. */
typedef void (*record_fn)(void *user, const vram_process_record *r, uint32_t busy);

static int for_each_record(record_fn fn, void *user) {
  int dfd = vram_records_open(NULL, NULL, 0);
  if (dfd < 0) return 0;
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return 0;
  }
  int removed = 0;
  static _Thread_local vram_process_record r;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!pid_of_name(e->d_name)) continue;
    uint32_t busy = 0;
    vram_record_verdict v = vram_record_read(dirfd(d), e->d_name, &r, &busy, NULL, 0);
    if (v == VRAM_RECORD_EXITED && unlinkat(dirfd(d), e->d_name, 0) == 0) removed++;
    if (v == VRAM_RECORD_LIVE && fn) fn(user, &r, busy);
  }
  closedir(d);
  return removed;
}

int _vram_publish_sweep(void) { return for_each_record(NULL, NULL); }

typedef struct peer_search {
  const char *uuid;
  int self, n, max;
  vram_record_peer *out;
} peer_search;

/* The same GPU is the same UUID; without one (a sim device, a driver that gave none)
 * nothing says two processes share a device. */
static bool slot_matches(const vram_device_record *s, const char *uuid) {
  return s->in_use && uuid && *uuid && strncmp(s->uuid, uuid, sizeof s->uuid) == 0;
}

static void add_peer(void *user, const vram_process_record *r, uint32_t busy) {
  peer_search *s = user;
  if (r->pid == s->self) return;
  for (uint32_t i = 0; i < r->n_devices && s->n < s->max; i++) {
    if ((busy >> i) & 1 || !slot_matches(&r->devices[i], s->uuid)) continue;
    vram_record_peer *p = &s->out[s->n++];
    p->pid = r->pid;
    memcpy(p->name, r->name, sizeof p->name);
    p->device = r->devices[i];
  }
}

int _vram_publish_peers(const char *uuid, vram_record_peer *out, int max) {
  peer_search s = {uuid, (int)getpid(), 0, max, out};
  for_each_record(add_peer, &s);
  return s.n;
}

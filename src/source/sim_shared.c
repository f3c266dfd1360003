/* sim_shared.c - the shared sim's file (sim_shared.h): a header (magic, version, capacity),
 * the total every member holds, and one entry per member (pid, start time, bytes held).
 *
 * The total moves by compare-and-swap ("reserve if total + n <= capacity"), so two
 * processes never both take the last bytes; a member's own entry moves after it. A member
 * found dead has its bytes taken off the total by whoever finds it first (one CAS on its
 * entry). Between a member's two stores a kill would leave its last bytes in the total
 * only: the window is two instructions, and the sim is for tests. */
#include "source/sim_shared.h"
#include "obs/shared_file.h"
#include "vramkit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIM_SHARED_MAGIC 0x3153524853525655ull /* "UVRSHRS1" as bytes, little-endian */
#define SIM_SHARED_VERSION 1u
#define SIM_SHARED_MEMBERS 64
#define SIM_SHARED_NAME_MAX 64

typedef struct sim_shared_member {
  vram_member_id id;
  _Atomic uint64_t held;
} sim_shared_member;

typedef struct sim_shared_file {
  _Atomic uint64_t magic;
  uint32_t version, file_size;
  uint64_t capacity;
  _Atomic uint64_t total;
  sim_shared_member members[SIM_SHARED_MEMBERS];
} sim_shared_file;

struct vram_sim_shared {
  sim_shared_file *file;
  sim_shared_member *self;
  char device_name[SIM_SHARED_NAME_MAX + 24];
};

const char *_vram_sim_shared_name_error(const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n > SIM_SHARED_NAME_MAX) return "a name has 1 to 64 characters";
  if (strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") != n)
    return "a name has only letters, digits, '_', '.' and '-'";
  if (!strcmp(name, ".") || !strcmp(name, "..")) return "'.' and '..' name folders";
  return NULL;
}

static void file_name(char *buf, size_t cap, const char *name, int device) {
  snprintf(buf, cap, "%s.%d.sim", name, device);
}

static void reclaim_dead(sim_shared_file *f) {
  for (int i = 0; i < SIM_SHARED_MEMBERS; i++) {
    sim_shared_member *m = &f->members[i];
    if (!_vram_member_take_dead(&m->id)) continue;
    atomic_fetch_sub(&f->total, atomic_exchange(&m->held, 0));
    _vram_member_free(&m->id);
  }
}

int _vram_sim_shared_join(const char *name, int device, size_t capacity, vram_sim_shared **out) {
  if (_vram_sim_shared_name_error(name)) return VRAM_EENV;
  vram_sim_shared *s = calloc(1, sizeof *s);
  if (!s) return VRAM_EHOSTMEM;
  char fname[SIM_SHARED_NAME_MAX + 24];
  file_name(fname, sizeof fname, name, device);
  snprintf(s->device_name, sizeof s->device_name, "sim.%s.%d", name, device);
  bool created = false;
  s->file = _vram_shared_file_open(fname, sizeof *s->file, SIM_SHARED_MAGIC,
                                   "cannot share the sim device (VRAMKIT_SIM_SHARED)", &created);
  if (!s->file) {
    free(s);
    return VRAM_EIO;
  }
  if (created) {
    s->file->version = SIM_SHARED_VERSION;
    s->file->file_size = (uint32_t)sizeof *s->file;
    s->file->capacity = capacity;
    atomic_store(&s->file->magic, SIM_SHARED_MAGIC);
  }
  int index = -1;
  if (s->file->version == SIM_SHARED_VERSION && s->file->file_size == sizeof *s->file) {
    index = _vram_member_claim(s->file->members, SIM_SHARED_MEMBERS, sizeof(sim_shared_member));
    if (index < 0) {
      reclaim_dead(s->file);
      index = _vram_member_claim(s->file->members, SIM_SHARED_MEMBERS, sizeof(sim_shared_member));
    }
  }
  if (index < 0) {
    fprintf(stderr, "vramkit: cannot share the sim device %s: its file is of another version "
                    "or has no free member entry\n", s->device_name);
    _vram_shared_file_close(s->file, sizeof *s->file);
    free(s);
    return VRAM_EIO;
  }
  s->self = &s->file->members[index];
  atomic_store(&s->self->held, 0);
  *out = s;
  return VRAM_OK;
}

void _vram_sim_shared_leave(vram_sim_shared *s) {
  if (!s) return;
  atomic_fetch_sub(&s->file->total, atomic_exchange(&s->self->held, 0));
  _vram_member_free(&s->self->id);
  _vram_shared_file_close(s->file, sizeof *s->file);
  free(s);
}

size_t _vram_sim_shared_capacity(const vram_sim_shared *s) { return s->file->capacity; }

size_t _vram_sim_shared_free(const vram_sim_shared *s) {
  uint64_t total = atomic_load(&s->file->total);
  return total < s->file->capacity ? s->file->capacity - total : 0;
}

static bool try_take(sim_shared_file *f, uint64_t bytes) {
  uint64_t total = atomic_load(&f->total);
  do {
    if (bytes > f->capacity || total > f->capacity - bytes) return false;
  } while (!atomic_compare_exchange_weak(&f->total, &total, total + bytes));
  return true;
}

int _vram_sim_shared_take(vram_sim_shared *s, size_t bytes) {
  if (!try_take(s->file, bytes)) {
    reclaim_dead(s->file);
    if (!try_take(s->file, bytes)) return VRAM_ENOMEM;
  }
  atomic_fetch_add(&s->self->held, bytes);
  return VRAM_OK;
}

void _vram_sim_shared_give(vram_sim_shared *s, size_t bytes) {
  atomic_fetch_sub(&s->self->held, bytes);
  atomic_fetch_sub(&s->file->total, bytes);
}

void _vram_sim_shared_device_name(const vram_sim_shared *s, char *buf, size_t cap) {
  snprintf(buf, cap, "%s", s->device_name);
}

int _vram_sim_shared_remove(const char *name, int device) {
  char fname[SIM_SHARED_NAME_MAX + 24];
  if (_vram_sim_shared_name_error(name)) return -1;
  file_name(fname, sizeof fname, name, device);
  return _vram_shared_file_remove(fname);
}

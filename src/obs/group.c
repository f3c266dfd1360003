/* group.c - the give-back group's shared file and its futex words (group.h). */
#define _GNU_SOURCE
#include "obs/group.h"
#include "obs/publish.h"

#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define VRAM_GROUP_MAGIC 0x3150524753525655ull /* "UVRSGRP1" as bytes, little-endian */
#define VRAM_GROUP_VERSION 1u

void _vram_group_file_name(const char *device_name, char *buf, size_t cap) {
  size_t n = strlen(device_name);
  bool plain = n > 0 && n <= VRAM_GROUP_NAME_MAX && device_name[0] != '.' &&
               strspn(device_name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                   "0123456789_.-:") == n;
  if (plain) snprintf(buf, cap, "%s.group", device_name);
  else buf[0] = 0;
}

vram_group_file *_vram_group_open(const char *device_name) {
  char name[VRAM_GROUP_NAME_MAX + 8];
  _vram_group_file_name(device_name, name, sizeof name);
  if (!name[0]) return NULL;
  bool created = false;
  vram_group_file *g = _vram_shared_file_open(
      name, sizeof *g, VRAM_GROUP_MAGIC,
      "no give-back group for this device", &created);
  if (!g) return NULL;
  if (created) {
    g->version = VRAM_GROUP_VERSION;
    g->file_size = (uint32_t)sizeof *g;
    atomic_store(&g->magic, VRAM_GROUP_MAGIC);
  }
  if (g->version != VRAM_GROUP_VERSION || g->file_size != sizeof *g) {
    fprintf(stderr, "vramkit: no give-back group: %s is of another version\n", name);
    _vram_shared_file_close(g, sizeof *g);
    return NULL;
  }
  return g;
}

/* Off the total what the entry holds, and the entry freed. */
static void release_entry(vram_group_file *g, vram_group_member *m) {
  atomic_store(&m->opted_in, 0u);
  atomic_fetch_sub(&g->reserved_total, atomic_exchange(&m->reserved, 0));
  _vram_member_free(&m->id);
}

bool _vram_group_clear_if_dead(vram_group_file *g, int member) {
  if (!_vram_member_take_dead(&g->members[member].id)) return false;
  release_entry(g, &g->members[member]);
  return true;
}

void _vram_group_clear_dead(vram_group_file *g) {
  for (int i = 0; i < VRAM_GROUP_MEMBERS; i++) _vram_group_clear_if_dead(g, i);
}

static bool try_take(vram_group_file *g, uint64_t bytes, uint64_t limit) {
  uint64_t total = atomic_load(&g->reserved_total);
  do {
    if (limit && (bytes > limit || total > limit - bytes)) return false;
  } while (!atomic_compare_exchange_weak(&g->reserved_total, &total, total + bytes));
  return true;
}

bool _vram_group_take(vram_group_file *g, int member, uint64_t bytes, uint64_t limit) {
  if (!try_take(g, bytes, limit)) {
    _vram_group_clear_dead(g);
    if (!try_take(g, bytes, limit)) return false;
  }
  atomic_fetch_add(&g->members[member].reserved, bytes);
  return true;
}

void _vram_group_give(vram_group_file *g, int member, uint64_t bytes) {
  atomic_fetch_sub(&g->members[member].reserved, bytes);
  atomic_fetch_sub(&g->reserved_total, bytes);
}

int _vram_group_join(vram_group_file *g, bool opted_in) {
  _vram_group_clear_dead(g);
  int i = _vram_member_claim(g->members, VRAM_GROUP_MEMBERS, sizeof g->members[0]);
  if (i < 0) return -1;
  vram_group_member *m = &g->members[i];
  /* The entry's figures restart; a watcher answers from now on, not an old request. */
  atomic_store(&m->reserved, 0);
  atomic_store(&m->idle, 0);
  atomic_store(&m->given_bytes, 0);
  atomic_store(&m->given_count, 0);
  atomic_store(&m->asked_count, 0);
  atomic_store(&m->group_limit, 0);
  atomic_store(&m->answered, atomic_load(&g->request_seq));
  size_t n = _vram_read_proc("/proc/self/comm", m->name, sizeof m->name);
  while (n && m->name[n - 1] == '\n') m->name[--n] = 0;
  atomic_store(&m->opted_in, opted_in ? 1u : 0u);
  return i;
}

void _vram_group_leave(vram_group_file *g, int member) { release_entry(g, &g->members[member]); }

static long futex(_Atomic uint32_t *word, int op, uint32_t value, const struct timespec *timeout) {
  /* No FUTEX_PRIVATE_FLAG: the waiters are in other processes. */
  return syscall(SYS_futex, (uint32_t *)word, op, value, timeout, NULL, 0);
}

uint32_t _vram_group_post(vram_group_file *g, int member, uint64_t bytes) {
  atomic_store(&g->request_bytes, bytes);
  atomic_store(&g->request_member, member);
  uint32_t seq = atomic_fetch_add(&g->request_seq, 1) + 1;
  futex(&g->request_seq, FUTEX_WAKE, INT_MAX, NULL);
  return seq;
}

bool _vram_group_wait_answers(vram_group_file *g, uint32_t seen, uint64_t timeout_ns) {
  struct timespec t = {(time_t)(timeout_ns / 1000000000u), (long)(timeout_ns % 1000000000u)};
  long rc = futex(&g->answer_seq, FUTEX_WAIT, seen, &t);
  return rc == 0 || atomic_load(&g->answer_seq) != seen;
}

void _vram_group_wait_request(vram_group_file *g, uint32_t seen) {
  futex(&g->request_seq, FUTEX_WAIT, seen, NULL);
}

void _vram_group_answer(vram_group_file *g, int member, uint32_t seq, uint64_t bytes) {
  vram_group_member *m = &g->members[member];
  if (bytes) {
    atomic_fetch_add(&m->given_bytes, bytes);
    atomic_fetch_add(&m->given_count, 1);
  }
  atomic_fetch_add(&m->asked_count, 1);
  atomic_store(&m->answered, seq);
  atomic_fetch_add(&g->answer_seq, 1);
  futex(&g->answer_seq, FUTEX_WAKE, INT_MAX, NULL);
}

/* giveback.c - the pool's side of the give-back group (giveback.h): joining, the watcher
 * that answers neighbours, and the request of the OOM ladder's last step.
 *
 * Locks: gb_lock (this file's lists) is taken before a pool's lock, never after: the
 * watcher holds it while it gives back, so that a pool cannot be destroyed under it; the
 * asker holds only its pool's lock and takes no other while it waits. Two processes that
 * run out at once each wait for the other's watcher, which waits for the other's pool lock:
 * both time out (their give_back_timeout_ms) and fail, as they would have without a group.
 *
 * A pool's settings are its options' (vram_options_t: give_back, give_back_timeout_ms, the
 * group and soft limits), which vram_options_from_env fills from the VRAMKIT_* variables
 * for the default pools; this file reads no environment but its tests' delay. */
#define _GNU_SOURCE
#include "pool/giveback.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "obs/escape.h"
#include "obs/format.h"
#include "obs/group.h"
#include "pool/call.h"
#include "pool/events.h"
#include "pool/granules.h"
#include "pool/options.h"
#include "pool/pending.h"
#include "pool/placement.h"
#include "pool/published.h"

/* A group this process belongs to, with its pools in it. Never freed: the watcher and
 * askers read it without gb_lock. */
typedef struct gb_group {
  char device_name[VRAM_GROUP_NAME_MAX + 1];
  vram_group_file *file;
  bool watcher_started;
  uint32_t watcher_seen; /* the request_seq the watcher starts from: read before it runs,
                            so that no request made after the join goes unanswered */
  unsigned test_delay_ms; /* VRAMKIT_TEST_GIVE_BACK_DELAY: a late neighbour, for tests */
  struct vram_giveback *pools;
  struct gb_group *next;
} gb_group;

/* A pool's membership: its entry in the group file, and its last request's outcome. Its
 * source's counting wrapper holds it too, and frees it when the source closes. */
typedef struct vram_giveback {
  gb_group *group;
  int member;
  pid_t pid; /* the process that joined: a forked child's copy is not a member */
  bool attached; /* in the group: false once the pool left */
  bool opted_in;
  uint64_t timeout_ms;
  uint64_t group_limit;
  uint64_t soft_limit; /* over it, a request takes all idle memory */
  vram_pool_t *pool;
  struct vram_giveback *next;
  vram_giveback_outcome last;
} vram_giveback;

static pthread_mutex_t gb_lock = PTHREAD_MUTEX_INITIALIZER;
static gb_group *groups;
static bool fork_hooks_installed;

static void fork_prepare(void) { pthread_mutex_lock(&gb_lock); }
static void fork_parent(void) { pthread_mutex_unlock(&gb_lock); }
/* The child has no watcher and is no member: it starts with no group. */
static void fork_child(void) {
  groups = NULL;
  pthread_mutex_init(&gb_lock, NULL);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- the watcher */

typedef struct give_back_call {
  uint64_t want;
  uint64_t soft_limit; /* the answering pool's */
  int asker_pid;
  size_t given;
} give_back_call;

/* What a request takes: the bytes asked; all idle memory from a pool over its soft limit,
 * which holds more than it said it would need. */
static int give_back_locked(vram_pool_t *pool, void *arg) {
  give_back_call *c = arg;
  _vram_pending_drain(pool, false); /* completed frees only: a watcher never waits on a stream */
  uint64_t soft = c->soft_limit;
  bool over_soft = soft && (uint64_t)pool->stats.reserved_bytes.current > soft;
  c->given = _vram_release_cached(pool, over_soft ? SIZE_MAX : c->want ? c->want : 1, NULL);
  if (c->given) {
    pool->stats.giveback_given_bytes += c->given;
    pool->stats.giveback_given_count++;
    _vram_note(pool, VRAM_EVENT_GIVE_BACK, (uint64_t)c->asker_pid, c->given, c->want, NULL, 0);
  }
  _vram_pool_publish_slow(pool);
  return VRAM_OK;
}

/* Every pool of this process in the group that gives back answers request `seq`. */
static void serve(gb_group *grp, uint32_t seq) {
  vram_group_file *g = grp->file;
  int asker = atomic_load(&g->request_member);
  int asker_pid = asker >= 0 && asker < VRAM_GROUP_MEMBERS ? atomic_load(&g->members[asker].id.pid) : 0;
  if (asker_pid == (int)getpid()) return; /* a pool of ours asked: it never asks its own */
  give_back_call c = {.want = atomic_load(&g->request_bytes), .asker_pid = asker_pid};
  pthread_mutex_lock(&gb_lock);
  for (vram_giveback *gb = grp->pools; gb; gb = gb->next) {
    if (!gb->opted_in) continue;
    c.given = 0;
    c.soft_limit = gb->soft_limit;
    locked_call(gb->pool, give_back_locked, &c, NULL);
    _vram_group_answer(g, gb->member, seq, c.given);
  }
  pthread_mutex_unlock(&gb_lock);
}

static void *watcher_main(void *arg) {
  gb_group *grp = arg;
  uint32_t seen = grp->watcher_seen;
  for (;;) {
    _vram_group_wait_request(grp->file, seen);
    uint32_t seq = atomic_load(&grp->file->request_seq);
    if (seq == seen) continue;
    seen = seq;
    if (grp->test_delay_ms)
      nanosleep(&(struct timespec){grp->test_delay_ms / 1000, (long)(grp->test_delay_ms % 1000) * 1000000}, NULL);
    serve(grp, seq);
  }
  return NULL;
}

/* With gb_lock held. Signals stay with the program's threads. */
static void start_watcher(gb_group *grp) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t thread;
  grp->watcher_seen = atomic_load(&grp->file->request_seq);
  if (pthread_create(&thread, &attr, watcher_main, grp) == 0) grp->watcher_started = true;
  else fprintf(stderr, "vramkit: no give-back watcher for %s: cannot start a thread\n", grp->device_name);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* ---- joining and leaving */

/* With gb_lock held: the group of `name`, opened on first use; NULL if it cannot be. */
static gb_group *group_of(const char *name) {
  for (gb_group *grp = groups; grp; grp = grp->next)
    if (!strcmp(grp->device_name, name)) return grp;
  vram_group_file *file = _vram_group_open(name);
  gb_group *grp = file ? calloc(1, sizeof *grp) : NULL;
  if (!grp) return NULL;
  snprintf(grp->device_name, sizeof grp->device_name, "%s", name);
  grp->file = file;
  const char *delay = getenv("VRAMKIT_TEST_GIVE_BACK_DELAY");
  if (delay) grp->test_delay_ms = (unsigned)strtoul(delay, NULL, 10);
  grp->next = groups;
  groups = grp;
  return grp;
}

/* A limit of the options in bytes, a share of the card resolved; 0: none. */
static uint64_t limit_of(const vram_pool_t *pool, size_t bytes, double fraction) {
  return bytes ? bytes : (uint64_t)(fraction * (double)pool->device_total);
}

static bool is_share(double fraction) { return fraction >= 0 && fraction <= 1; } /* NaN: no */

/* The pool's give-back options (vram_options_t: the option table parsed them from text);
 * VRAM_EINVAL for values out of range, which only a caller setting the fields can give. */
static int read_settings(const vram_pool_t *pool, vram_giveback *gb) {
  const vram_options_t *o = &pool->opts;
  if (o->give_back_timeout_ms > VRAM_GIVE_BACK_TIMEOUT_MAX_MS ||
      !is_share(o->group_limit_fraction) || !is_share(o->soft_limit_fraction))
    return VRAM_EINVAL;
  gb->opted_in = o->give_back != 0;
  gb->timeout_ms = o->give_back_timeout_ms;
  gb->group_limit = limit_of(pool, o->group_limit_bytes, o->group_limit_fraction);
  gb->soft_limit = limit_of(pool, o->soft_limit_bytes, o->soft_limit_fraction);
  return VRAM_OK;
}

/* The source's counting (source/source.h): every byte of the pool's device memory in its
 * entry and the group's total as it is taken, and growth past the group limit refused. */
static bool count_take(void *user, size_t bytes) {
  vram_giveback *gb = user;
  if (!gb->attached || gb->pid != getpid()) return true;
  return _vram_group_take(gb->group->file, gb->member, bytes, gb->group_limit);
}
static void count_give(void *user, size_t bytes) {
  vram_giveback *gb = user;
  if (gb->attached && gb->pid == getpid()) _vram_group_give(gb->group->file, gb->member, bytes);
}
static void count_close(void *user) { free(user); }

/* With gb_lock held: the pool's source counts for the group from now on; what the pool
 * already holds (a preallocation) is counted at once. */
static int count_through_source(vram_pool_t *pool, vram_giveback *gb) {
  vram_fault_plan plan = {.count_user = gb, .count_take = count_take, .count_give = count_give,
                          .count_close = count_close};
  int rc = _vram_fault_wrap(pool->src, pool->src_state, &plan, &pool->src, &pool->src_state);
  if (!rc) _vram_group_take(gb->group->file, gb->member, (uint64_t)pool->stats.reserved_bytes.current, 0);
  return rc;
}

static void device_name(const vram_pool_t *pool, char *buf, size_t cap) {
  buf[0] = 0;
  if (pool->src->xGroupName) pool->src->xGroupName(pool->src_state, buf, cap);
  else if (pool->src->xDeviceUuid) pool->src->xDeviceUuid(pool->src_state, buf, cap);
}

int _vram_giveback_join(vram_pool_t *pool) {
  vram_giveback *gb = calloc(1, sizeof *gb);
  if (!gb) return VRAM_EHOSTMEM;
  int rc = read_settings(pool, gb);
  char name[VRAM_GROUP_NAME_MAX + 1];
  device_name(pool, name, sizeof name);
  static atomic_bool said;
  if (!rc && !name[0] && (gb->group_limit || gb->soft_limit) && !atomic_exchange(&said, true))
    /* Said once, not left silent: a limit the user set that nothing can apply. */
    fprintf(stderr, "vramkit: the group and soft limits apply to a device other processes "
                    "share (a GPU, or a sim named by VRAMKIT_SIM_SHARED); this pool's %s "
                    "source has none: ignored\n", vram_source_name(pool->opts.source));
  if (rc || !name[0]) {
    free(gb);
    return rc;
  }
  pthread_mutex_lock(&gb_lock);
  if (!fork_hooks_installed) {
    fork_hooks_installed = true;
    pthread_atfork(fork_prepare, fork_parent, fork_child);
  }
  gb_group *grp = group_of(name);
  gb->member = grp ? _vram_group_join(grp->file, gb->opted_in) : -1;
  if (grp && gb->member < 0)
    fprintf(stderr, "vramkit: no give-back for this pool: the group of %s is full\n", name);
  if (gb->member >= 0) {
    gb->group = grp;
    gb->pid = getpid();
    gb->pool = pool;
    gb->attached = true;
    atomic_store(&grp->file->members[gb->member].group_limit, gb->group_limit);
  }
  if (gb->member >= 0 && count_through_source(pool, gb) != VRAM_OK) {
    _vram_group_leave(grp->file, gb->member);
    gb->member = -1;
  }
  if (gb->member >= 0) {
    gb->next = grp->pools;
    grp->pools = gb;
    pool->giveback = gb;
    if (gb->opted_in && !grp->watcher_started) start_watcher(grp);
  } else {
    free(gb);
  }
  pthread_mutex_unlock(&gb_lock);
  return VRAM_OK;
}

void _vram_giveback_leave(vram_pool_t *pool) {
  vram_giveback *gb = pool->giveback;
  if (!gb) return;
  if (gb->pid != getpid()) { /* a forked child's copy: the entry is the parent's */
    pool->giveback = NULL;
    return;
  }
  /* Under gb_lock: the watcher may be giving back from this pool now, and reads its
   * membership until it lets go. */
  pthread_mutex_lock(&gb_lock);
  pool->giveback = NULL;
  for (vram_giveback **p = &gb->group->pools; *p; p = &(*p)->next)
    if (*p == gb) {
      *p = gb->next;
      break;
    }
  gb->attached = false;
  _vram_group_leave(gb->group->file, gb->member);
  pthread_mutex_unlock(&gb_lock);
  /* gb itself goes when the source closes (count_close): its segments go back after this. */
}

void _vram_giveback_note_usage(vram_pool_t *pool) {
  vram_giveback *gb = pool->giveback;
  if (!gb || gb->pid != getpid()) return;
  vram_group_member *m = &gb->group->file->members[gb->member];
  size_t idle = pool->idle_bytes;
  if (pool->has_virtual) idle += _vram_granules_idle_total(pool) * pool->granularity;
  atomic_store(&m->idle, idle); /* reserved: the source counts it (count_take) */
}

/* ---- asking */

/* The members worth asking: the other live processes that give back. Every one is asked,
 * whatever its entry says it holds: those figures move at segment changes and releases
 * only (a free, or a mapping into a reserved range, publishes nothing to the group), and a
 * member with nothing idle answers at once with nothing. Dead members' entries are
 * cleared on the way. */
static int pick(vram_giveback *gb, vram_group_member **asked, uint64_t *before) {
  vram_group_file *g = gb->group->file;
  int n = 0;
  for (int i = 0; i < VRAM_GROUP_MEMBERS; i++) {
    vram_group_member *m = &g->members[i];
    if (i == gb->member) continue;
    if (_vram_group_clear_if_dead(g, i)) continue;
    if (!atomic_load(&m->opted_in) || !_vram_member_other_alive(&m->id)) continue;
    before[n] = atomic_load(&m->given_bytes);
    asked[n++] = m;
  }
  return n;
}

/* Until every member asked answered request `seq` or died, or timeout_ms passed. */
static void wait_answers(vram_group_file *g, vram_group_member **asked, int n, uint32_t seq,
                         uint64_t timeout_ms) {
  uint64_t deadline = now_ns() + timeout_ms * 1000000u;
  for (;;) {
    uint32_t seen = atomic_load(&g->answer_seq);
    bool all = true;
    for (int i = 0; i < n && all; i++)
      all = _vram_group_answered(asked[i], seq) || !_vram_member_other_alive(&asked[i]->id);
    uint64_t now = now_ns();
    if (all || now >= deadline) return;
    _vram_group_wait_answers(g, seen, deadline - now);
  }
}

static uint64_t collect(vram_giveback *gb, vram_group_member **asked, const uint64_t *before,
                        int n, uint32_t seq) {
  vram_giveback_outcome *out = &gb->last;
  uint64_t received = 0;
  for (int i = 0; i < n; i++) {
    vram_group_member *m = asked[i];
    uint64_t given = atomic_load(&m->given_bytes) - before[i];
    received += given;
    if (out->count == VRAM_GIVEBACK_MAX_LISTED) continue;
    vram_giveback_answer *a = &out->list[out->count++];
    a->pid = atomic_load(&m->id.pid);
    a->given_bytes = given;
    a->answered = _vram_group_answered(m, seq);
    char name[sizeof m->name];
    memcpy(name, m->name, sizeof name);
    name[sizeof name - 1] = 0;
    _vram_escape_text(a->name, sizeof a->name, name, strlen(name));
  }
  return received;
}

bool _vram_giveback_ask(vram_pool_t *pool, size_t rounded) {
  vram_giveback *gb = pool->giveback;
  if (!gb || gb->pid != getpid()) return false;
  memset(&gb->last, 0, sizeof gb->last);
  vram_group_member *asked[VRAM_GROUP_MEMBERS];
  uint64_t before[VRAM_GROUP_MEMBERS];
  int n = pick(gb, asked, before);
  if (!n) return false;
  /* The room the request has: the device's free memory, under the group limit if set. */
  size_t free_bytes = 0, total = 0;
  if (pool->src->xMemInfo(pool->src_state, &free_bytes, &total) != VRAM_OK) free_bytes = 0;
  uint64_t group_total = atomic_load(&gb->group->file->reserved_total);
  if (gb->group_limit) {
    uint64_t under = gb->group_limit > group_total ? gb->group_limit - group_total : 0;
    if (under < free_bytes) free_bytes = under;
  }
  /* Asked with room to spare: memory the device calls free is not all a mapping can have
   * (the driver's own tables, a mapping rounded to the pool's unit), and an answer that
   * leaves the request a few megabytes short fails it as surely as none. */
  uint64_t margin = rounded / 32 > 2 * pool->granularity ? rounded / 32 : 2 * pool->granularity;
  uint64_t want = (rounded > free_bytes ? rounded - free_bytes : rounded) + margin;
  want = (want + pool->granularity - 1) & ~((uint64_t)pool->granularity - 1);
  vram_group_file *g = gb->group->file;
  pool->stats.giveback_requests++;
  uint64_t asked_at = now_ns();
  uint32_t seq = _vram_group_post(g, gb->member, want);
  wait_answers(g, asked, n, seq, gb->timeout_ms);
  pool->stats.giveback_wait_us += (now_ns() - asked_at) / 1000u;
  uint64_t received = collect(gb, asked, before, n, seq);
  pool->stats.giveback_received_bytes += received;
  gb->last.fresh = true;
  gb->last.wanted_bytes = want;
  gb->last.received_bytes = received;
  gb->last.timeout_ms = gb->timeout_ms;
  gb->last.asked = n;
  return received > 0;
}

const vram_giveback_outcome *_vram_giveback_outcome(vram_pool_t *pool) {
  vram_giveback *gb = pool->giveback;
  if (!gb || !gb->last.fresh) return NULL;
  gb->last.fresh = false;
  return &gb->last;
}

bool _vram_giveback_group_figures(const vram_pool_t *pool, uint64_t *limit, uint64_t *reserved) {
  const vram_giveback *gb = pool->giveback;
  if (!gb || gb->pid != getpid()) return false;
  *limit = gb->group_limit;
  *reserved = atomic_load(&gb->group->file->reserved_total);
  return true;
}

void _vram_giveback_publish_figures(const vram_pool_t *pool, uint64_t *givable, uint64_t *limit) {
  const vram_giveback *gb = pool->giveback;
  *givable = *limit = 0;
  if (!gb || gb->pid != getpid()) return;
  *givable = atomic_load(&gb->group->file->members[gb->member].idle);
  *limit = gb->group_limit;
}

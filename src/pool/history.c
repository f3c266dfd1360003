/* history.c - the public calls of memory history: start, stop, read, annotate, the
 * process-wide context function, and the C leak report of VRAMKIT_LEAK_REPORT=1.
 *
 * The recorder itself is obs/history.c; this file owns its lifetime on the pool and the
 * flags that route malloc and free to their recording paths (events.h). The leak report
 * uses the same machinery: a pool created with VRAMKIT_LEAK_REPORT=1 keeps a context per
 * live block from its first allocation, the id of a C stack (obs/leaks.c) unless contexts
 * were asked for with a function set, and prints the blocks never freed at exit. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "obs/leaks.h"
#include "pool/call.h"
#include "pool/events.h"
#include "pool/options.h"

/* ---- the context function, process-wide */

static _Atomic(vram_context_fn) g_context_fn;
static void *_Atomic g_context_user;

void vram_set_context_fn(vram_context_fn fn, void *user) {
  atomic_store(&g_context_user, user);
  atomic_store(&g_context_fn, fn);
}

uint64_t _vram_context_current(unsigned flags, void *call_site) {
  if (flags & VRAM_REC_CONTEXTS) {
    vram_context_fn fn = atomic_load(&g_context_fn);
    if (fn) return fn(atomic_load(&g_context_user));
  }
  if (flags & VRAM_REC_LEAKS) return _vram_backtrace_capture(call_site);
  return 0;
}

void _vram_emit(vram_pool_t *pool, int kind, uint64_t addr, uint64_t size, uint64_t requested,
                vram_stream_t stream, uint64_t context) {
  vram_history *h = pool->history;
  _vram_history_record(h, (unsigned)kind, addr, size, requested, _vram_stream_id(stream),
                       context ? context : h->call_context);
}

/* ---- start, stop, read, annotate */

typedef struct start_call {
  size_t max_entries;
  unsigned flags;
  vram_history *fresh; /* made outside the lock, used if the pool has none */
} start_call;

static int start_locked(vram_pool_t *pool, void *arg) {
  start_call *c = arg;
  if (!pool->history) {
    pool->history = c->fresh;
    c->fresh = NULL;
  }
  vram_history *h = pool->history;
  unsigned kept = atomic_load(&pool->history_flags) & VRAM_REC_POOL_BITS;
  unsigned leaks = kept & VRAM_REC_LEAKS;
  bool contexts = c->flags & (VRAM_HISTORY_CONTEXTS | VRAM_HISTORY_FREE_CONTEXTS);
  size_t entries = c->max_entries ? c->max_entries : VRAM_HISTORY_DEFAULT_ENTRIES;
  bool same_ring = (c->flags & VRAM_HISTORY_KEEP) && h->mode != VRAM_HREC_OFF && h->cap == entries;
  int rc = (contexts || leaks) ? _vram_ctx_keep(&h->contexts) : VRAM_OK;
  if (!rc && !same_ring) rc = _vram_history_begin(h, c->max_entries, pool->opts.device);
  if (rc) return rc;
  /* A kept ring keeps the contexts of the blocks it saw allocated, for their frees and
   * for snapshots, though no new ones are asked for. */
  if (!contexts && !leaks && !same_ring) _vram_ctx_drop(&h->contexts);
  unsigned recorded = VRAM_REC_EVENTS | (contexts ? VRAM_REC_CONTEXTS : 0) |
                      (c->flags & VRAM_HISTORY_FREE_CONTEXTS ? VRAM_REC_FREE_CONTEXTS : 0);
  atomic_store(&pool->history_flags, recorded | kept);
  return VRAM_OK;
}

int vram_history_start(vram_pool_t *pool, size_t max_entries, unsigned flags) {
  const unsigned known = VRAM_HISTORY_CONTEXTS | VRAM_HISTORY_FREE_CONTEXTS | VRAM_HISTORY_KEEP;
  if (!pool || (flags & ~known)) return VRAM_EINVAL;
  if (max_entries > VRAM_HISTORY_MAX_ENTRIES) return VRAM_EHOSTMEM;
  start_call c = {max_entries, flags, NULL};
  int rc = _vram_history_new(&c.fresh);
  if (rc) return rc;
  rc = locked_call(pool, start_locked, &c, NULL);
  _vram_history_free(c.fresh);
  return rc;
}

static int stop_locked(vram_pool_t *pool, void *arg) {
  vram_history *h = pool->history;
  if (!h) return VRAM_OK;
  unsigned kept = atomic_load(&pool->history_flags) & VRAM_REC_POOL_BITS;
  /* Blocks allocated while recording keep their contexts after the stop, as PyTorch's keep
   * their stacks, so a snapshot taken later still says where each came from. That needs
   * the table kept true: malloc and free stay on their recording path (without events),
   * frees drop their entries and blocks allocated from now on get none, until the next
   * start. */
  unsigned keep = _vram_ctx_kept(&h->contexts) ? VRAM_REC_KEEP : 0;
  atomic_store(&pool->history_flags, kept | keep);
  _vram_history_end(h);
  return VRAM_OK;
}

int vram_history_stop(vram_pool_t *pool) {
  if (!pool) return VRAM_EINVAL;
  return locked_call(pool, stop_locked, NULL, NULL);
}

typedef struct read_call {
  vram_event_t *out;
  size_t cap, *count, *total;
  uint64_t *dropped;
} read_call;

static int read_locked(vram_pool_t *pool, void *arg) {
  read_call *c = arg;
  if (pool->history) {
    _vram_history_copy(pool->history, c->out, c->cap, c->count, c->total, c->dropped);
    return VRAM_OK;
  }
  if (c->count) *c->count = 0;
  if (c->total) *c->total = 0;
  if (c->dropped) *c->dropped = 0;
  return VRAM_OK;
}

int vram_history_read(vram_pool_t *pool, vram_event_t *out, size_t cap, size_t *count,
                      size_t *total, uint64_t *dropped) {
  if (!pool || (!out && cap)) return VRAM_EINVAL;
  read_call c = {out, cap, count, total, dropped};
  return locked_call(pool, read_locked, &c, NULL);
}

static int annotate_locked(vram_pool_t *pool, void *arg) {
  _vram_note(pool, VRAM_EVENT_ANNOTATE, 0, 0, 0, NULL, *(const uint64_t *)arg);
  return VRAM_OK;
}

int vram_history_annotate(vram_pool_t *pool, uint64_t context) {
  if (!pool) return VRAM_EINVAL;
  return locked_call(pool, annotate_locked, &context, NULL);
}

/* ---- the C leak report */

static pthread_mutex_t g_leak_lock = PTHREAD_MUTEX_INITIALIZER;
static vram_pool_t **g_leak_pools;
static size_t g_n_leak_pools, g_cap_leak_pools;
static bool g_atexit_done;

static void report_at_exit(void) {
  pthread_mutex_lock(&g_leak_lock);
  for (size_t i = 0; i < g_n_leak_pools; i++) _vram_leak_report_pool(g_leak_pools[i]);
  pthread_mutex_unlock(&g_leak_lock);
}

/* A switch (options.h): on turns the report on, off or "" leaves it off; anything else is
 * a bad variable, which vram_options_from_env names before a default pool gets here. */
static int leak_report_wanted(bool *on) {
  const char *v = getenv("VRAMKIT_LEAK_REPORT");
  int wanted = 0;
  *on = false;
  if (!v || !*v) return VRAM_OK;
  if (_vram_parse_switch(v, &wanted) != 0) return VRAM_EENV;
  *on = wanted;
  return VRAM_OK;
}

int _vram_history_attach_env(vram_pool_t *pool) {
  bool on;
  int rc = leak_report_wanted(&on);
  if (rc || !on) return rc;
  vram_history *h = NULL;
  rc = _vram_history_new(&h);
  if (!rc) rc = _vram_ctx_keep(&h->contexts);
  pthread_mutex_lock(&g_leak_lock);
  if (!rc && g_n_leak_pools == g_cap_leak_pools) {
    size_t cap = g_cap_leak_pools ? 2 * g_cap_leak_pools : 8;
    vram_pool_t **grown = realloc(g_leak_pools, cap * sizeof *grown);
    if (grown) {
      g_leak_pools = grown;
      g_cap_leak_pools = cap;
    } else {
      rc = VRAM_EHOSTMEM;
    }
  }
  if (!rc) {
    g_leak_pools[g_n_leak_pools++] = pool;
    if (!g_atexit_done) g_atexit_done = atexit(report_at_exit) == 0;
    pool->history = h;
    atomic_fetch_or(&pool->history_flags, VRAM_REC_LEAKS);
  }
  pthread_mutex_unlock(&g_leak_lock);
  if (rc) _vram_history_free(h);
  return rc;
}

void _vram_history_detach(vram_pool_t *pool) {
  if (atomic_load(&pool->history_flags) & VRAM_REC_LEAKS) {
    pthread_mutex_lock(&g_leak_lock);
    for (size_t i = 0; i < g_n_leak_pools; i++)
      if (g_leak_pools[i] == pool) {
        g_leak_pools[i] = g_leak_pools[--g_n_leak_pools];
        break;
      }
    pthread_mutex_unlock(&g_leak_lock);
  }
  atomic_store(&pool->history_flags, 0);
  _vram_history_free(pool->history);
  pool->history = NULL;
}

typedef struct leak_call {
  vram_leak_entry *entries;
  size_t cap, n;
} leak_call;

static int collect_leaks_locked(vram_pool_t *pool, void *arg) {
  leak_call *c = arg;
  const vram_ctx_table *t = &pool->history->contexts;
  for (vram_arena *a = pool->arenas; a; a = a->next)
    for (vram_segment *s = a->segments; s; s = s->next)
      for (vram_block *b = s->first; b; b = b->addr_next)
        if (b->state == VRAM_BLOCK_LIVE && c->n < c->cap)
          c->entries[c->n++] = (vram_leak_entry){_vram_ctx_get(t, b->addr), b->size, b->requested};
  return VRAM_OK;
}

void _vram_leak_report_pool(vram_pool_t *pool) {
  if (!(atomic_load(&pool->history_flags) & VRAM_REC_LEAKS) || !pool->history) return;
  size_t live = (size_t)pool->stats.allocation.current;
  if (!live) return;
  leak_call c = {calloc(live, sizeof *c.entries), live, 0};
  if (!c.entries) return;
  locked_call(pool, collect_leaks_locked, &c, NULL);
  _vram_leak_report(stderr, pool->opts.device, c.entries, c.n);
  free(c.entries);
}

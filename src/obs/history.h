/* history.h - the memory-history recorder: a ring of events and a side table of the
 * contexts of live blocks, fed by the pool (which calls down into it, under its lock) and
 * read back by the public history calls.
 *
 * The recorder knows events, addresses and context ids, nothing of the pool's blocks or
 * segments. Writing an event costs a tick read and a store of one entry: times are kept as
 * raw ticks (the TSC where it is invariant) and turned into CLOCK_MONOTONIC microseconds
 * when read, from two anchors taken at start and at stop (or at the read), so the hot path
 * never calls into the kernel's clock. */
#ifndef VRAM_OBS_HISTORY_H
#define VRAM_OBS_HISTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramkit.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

/* The largest ring vram_history_start accepts (entries of 56 bytes: 56 GiB). */
#define VRAM_HISTORY_MAX_ENTRIES ((size_t)1 << 30)
#define VRAM_HISTORY_DEFAULT_ENTRIES ((size_t)100000)

/* Context ids of live blocks, by block address: open addressing, linear probing. */
typedef struct vram_ctx_slot {
  uint64_t addr; /* 0 = empty */
  uint64_t context;
} vram_ctx_slot;

typedef struct vram_ctx_table {
  vram_ctx_slot *slots;
  size_t mask, count;
} vram_ctx_table;

typedef struct vram_history {
  vram_event_t *ring;
  size_t cap;          /* entries in the ring; 0 while not recording events */
  size_t next;         /* where the next event goes */
  uint64_t written;    /* events recorded since the start */
  bool recording;      /* events are written */
  bool use_tsc;        /* ticks are TSC counts, else CLOCK_MONOTONIC nanoseconds */
  /* Anchors: tick and CLOCK_MONOTONIC ns at start, and at stop once stopped. */
  uint64_t tick0, ns0, tick1, ns1;
  bool stopped;
  vram_ctx_table contexts; /* empty (no slots) unless contexts are kept */
} vram_history;

/* A recorder with no ring and no context table yet. VRAM_EHOSTMEM if none can be made. */
int _vram_history_new(vram_history **out);
void _vram_history_free(vram_history *h);
/* Record into a fresh ring of max_entries (0: the default), clearing what was held.
 * VRAM_EHOSTMEM when the ring cannot be had (the old one is kept then, stopped). */
int _vram_history_begin(vram_history *h, size_t max_entries);
/* Stop writing events; what was recorded stays readable. */
void _vram_history_end(vram_history *h);
/* Copy up to cap events, oldest first, times converted. */
void _vram_history_copy(const vram_history *h, vram_event_t *out, size_t cap, size_t *count,
                        size_t *total, uint64_t *dropped);

/* The context table: keep (allocate) or drop it, set, look up and take out entries. A set
 * that finds no host memory loses that one context, never the allocation. */
int _vram_ctx_keep(vram_ctx_table *t);
void _vram_ctx_drop(vram_ctx_table *t);
void _vram_ctx_set(vram_ctx_table *t, uint64_t addr, uint64_t context);
uint64_t _vram_ctx_get(const vram_ctx_table *t, uint64_t addr);
uint64_t _vram_ctx_take(vram_ctx_table *t, uint64_t addr);
static inline bool _vram_ctx_kept(const vram_ctx_table *t) { return t->slots != NULL; }

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t _vram_monotonic_ns(void);

/* The current tick. */
static inline uint64_t _vram_history_tick(const vram_history *h) {
#if defined(__x86_64__)
  if (__builtin_expect(h->use_tsc, 1)) return __rdtsc();
#endif
  return _vram_monotonic_ns();
}

/* The slot of the next event, with its time set; the oldest event is overwritten when the
 * ring is full (counted as dropped when read). Only while h->recording. */
static inline vram_event_t *_vram_history_slot(vram_history *h, uint64_t tick) {
  vram_event_t *e = &h->ring[h->next];
  h->next = h->next + 1 == h->cap ? 0 : h->next + 1;
  h->written++;
  e->time_us = tick;
  return e;
}

static inline void _vram_history_put(vram_history *h, uint64_t tick, int kind, uint64_t addr,
                                     uint64_t size, uint64_t requested, uint64_t stream,
                                     uint64_t context, int device) {
  vram_event_t *e = _vram_history_slot(h, tick);
  e->addr = addr;
  e->size = size;
  e->requested = requested;
  e->stream = stream;
  e->context = context;
  e->device = device;
  e->kind = kind;
}

#endif /* VRAM_OBS_HISTORY_H */

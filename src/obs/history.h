/* history.h - the memory-history recorder: a ring of events and a side table of the
 * contexts of live blocks, fed by the pool (which calls down into it, under its lock) and
 * read back by the public history calls.
 *
 * The recorder knows events, addresses and context ids, nothing of the pool's blocks or
 * segments. Writing an event costs a tick read and a store of one 32-byte slot (one slot
 * for both events of a same-stream free), expanded to vram_event_t when read: times are kept as
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

/* The largest ring vram_history_start accepts: 2^30 events (a slot of 32 bytes each, and
 * as much again reserved for the rare events whose fields do not fit in one: 64 GiB). */
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

/* One ring slot: half a vram_event_t, so that recording writes a cache line per two
 * events instead of one per event. The packed word holds the kind, the device, size minus
 * requested, an index into the recorder's stream table and the context id; an event whose
 * fields do not fit sets VRAM_HSLOT_WIDE and keeps them in the side slot of the same index.
 * A same-stream free (requested and completed at one tick) takes one slot of kind
 * VRAM_HSLOT_FREE_PAIR, read back as its two events. */
typedef struct vram_hslot {
  uint64_t tick, addr, size, word;
} vram_hslot;

typedef struct vram_hwide {
  uint64_t requested, stream, context;
  int32_t device, pad_;
} vram_hwide;

#define VRAM_HSLOT_FREE_PAIR 15u /* above every vram_event_kind */
#define VRAM_HSLOT_KIND_BITS 4
#define VRAM_HSLOT_WIDE ((uint64_t)1 << 4)
#define VRAM_HSLOT_STREAM_SHIFT 5 /* 4 bits: 0 = stream 0, else streams[index - 1] */
#define VRAM_HSLOT_STREAMS 15
#define VRAM_HSLOT_DEVICE_SHIFT 9 /* 8 bits */
#define VRAM_HSLOT_SLACK_SHIFT 17 /* 27 bits: size - requested */
#define VRAM_HSLOT_SLACK_LIMIT ((uint64_t)1 << 27)
#define VRAM_HSLOT_CONTEXT_SHIFT 44 /* 20 bits */
#define VRAM_HSLOT_CONTEXT_LIMIT ((uint64_t)1 << 20)

/* The fields the hot path touches come first, in one cache line. */
typedef struct vram_history {
  vram_hslot *ring;
  size_t cap;          /* slots in the ring (= max_entries); 0 while not recording */
  size_t next;         /* where the next slot goes */
  uint64_t written;    /* events recorded since the start */
  uint64_t slots;      /* slots written since the start */
  uint64_t stream_last; /* the stream last packed, and its index: most events repeat it */
  uint64_t stream_last_index;
  bool recording;      /* events are written */
  bool use_tsc;        /* ticks are TSC counts, else CLOCK_MONOTONIC nanoseconds */
  bool stopped;
  vram_hwide *wide;    /* cap side slots, touched only by wide events */
  /* Anchors: tick and CLOCK_MONOTONIC ns at start, and at stop once stopped. */
  uint64_t tick0, ns0, tick1, ns1;
  uint64_t streams[VRAM_HSLOT_STREAMS]; /* the stream table, filled from the start on */
  unsigned n_streams;
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

/* The packed word of an event that does not fit the common case (a new stream, a large
 * context, slack or device), writing its side slot where it must go wide. */
uint64_t _vram_history_pack_slow(vram_history *h, size_t i, unsigned kind, uint64_t slack,
                                 uint64_t requested, uint64_t stream, uint64_t context,
                                 int device);

/* Record one event (kind VRAM_HSLOT_FREE_PAIR: a same-stream free's two events) in the next
 * slot; the oldest slot is overwritten when the ring is full (its events counted as
 * dropped when read). Only while h->recording. */
static inline void _vram_history_put(vram_history *h, uint64_t tick, unsigned kind,
                                     uint64_t addr, uint64_t size, uint64_t requested,
                                     uint64_t stream, uint64_t context, int device) {
  size_t i = h->next;
  vram_hslot *s = &h->ring[i];
  h->next = i + 1 == h->cap ? 0 : i + 1;
  h->slots++;
  h->written += kind == VRAM_HSLOT_FREE_PAIR ? 2 : 1;
  uint64_t slack = size - requested, word;
  uint64_t sindex = stream == 0 ? 0 : stream == h->stream_last ? h->stream_last_index : ~0ull;
  if (__builtin_expect(slack < VRAM_HSLOT_SLACK_LIMIT && context < VRAM_HSLOT_CONTEXT_LIMIT &&
                           (unsigned)device < 256u && sindex != ~0ull, 1))
    word = kind | sindex << VRAM_HSLOT_STREAM_SHIFT | (uint64_t)device << VRAM_HSLOT_DEVICE_SHIFT |
           slack << VRAM_HSLOT_SLACK_SHIFT | context << VRAM_HSLOT_CONTEXT_SHIFT;
  else
    word = _vram_history_pack_slow(h, i, kind, slack, requested, stream, context, device);
  s->tick = tick;
  s->addr = addr;
  s->size = size;
  s->word = word;
}

#endif /* VRAM_OBS_HISTORY_H */

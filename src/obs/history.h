/* history.h - the memory-history recorder: a ring of events and a side table of the
 * contexts of live blocks, fed by the pool (which calls down into it, under its lock) and
 * read back by the public history calls.
 *
 * The recorder knows events, addresses and context ids, nothing of the pool's blocks or
 * segments. Writing an event costs a tick read and a store of one 32-byte slot (one slot
 * for both events of a same-stream free), expanded to vram_event_t when read. Times are
 * kept as raw ticks and turned into CLOCK_MONOTONIC microseconds when read, from two
 * anchors taken at start and at stop (or at the read): ticks are TSC counts where the TSC
 * is invariant or the kernel's clock runs on it, so that the hot path does not call into
 * the kernel's clock, and CLOCK_MONOTONIC nanoseconds (a clock_gettime per event)
 * elsewhere. */
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

/* How a recorder records: not at all, with TSC ticks, or with CLOCK_MONOTONIC nanoseconds
 * as ticks. One byte, so that an event tests one value for both "recording?" and "which
 * clock?". */
enum { VRAM_HREC_OFF = 0, VRAM_HREC_TSC = 1, VRAM_HREC_NS = 2 };

/* The fields the hot path touches come first, in one cache line. */
typedef struct vram_history {
  vram_hslot *cur;      /* where the next slot goes */
  vram_hslot *end;      /* ring + cap */
  uint64_t pairs;       /* FREE_PAIR slots written since the start: events = slots + pairs */
  uint64_t word0;       /* the packed word's stream and device bits for stream 0 */
  uint64_t stream_last; /* the stream last packed (never 0), and its stream and device bits */
  uint64_t stream_word;
  uint64_t slack_limit; /* VRAM_HSLOT_SLACK_LIMIT, or 0 where the device does not fit a slot */
  uint8_t mode;         /* VRAM_HREC_*: OFF unless events are written */
  bool use_tsc;         /* ticks are TSC counts, else CLOCK_MONOTONIC nanoseconds */
  bool stopped;
  int device;           /* the pool's device, for the events that go wide */
  vram_hslot *ring;
  size_t cap;           /* slots in the ring (= max_entries); 0 until the first start */
  uint64_t wraps;       /* times the ring wrapped since the start: slots = wraps * cap + index */
  vram_hwide *wide;     /* cap side slots, touched only by wide events */
  /* Anchors: tick and CLOCK_MONOTONIC ns at start, and at stop once stopped. */
  uint64_t tick0, ns0, tick1, ns1;
  uint64_t streams[VRAM_HSLOT_STREAMS]; /* the stream table, filled from the start on */
  unsigned n_streams;
  vram_ctx_table contexts; /* empty (no slots) unless contexts are kept */
  /* The context of the allocation, free or empty_cache under way (0: none), for the
   * segment and out-of-memory events it causes, which carry it as PyTorch's do. */
  uint64_t call_context;
} vram_history;

/* A recorder with no ring and no context table yet. VRAM_EHOSTMEM if none can be made. */
int _vram_history_new(vram_history **out);
void _vram_history_free(vram_history *h);
/* Record the events of `device` into a fresh ring of max_entries (0: the default),
 * clearing what was held. VRAM_EHOSTMEM when the ring cannot be had (the old one is kept
 * then, stopped). */
int _vram_history_begin(vram_history *h, size_t max_entries, int device);
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

static inline bool _vram_history_recording(const vram_history *h) {
  return h->mode != VRAM_HREC_OFF;
}

/* The packed word of an event that does not fit the common case (a new stream, a large
 * context or slack, a device above 255), writing its side slot where it must go wide. */
uint64_t _vram_history_pack_slow(vram_history *h, const vram_hslot *s, unsigned kind,
                                 uint64_t slack, uint64_t requested, uint64_t stream,
                                 uint64_t context);
/* The ring's first slot, once the last one is taken. */
vram_hslot *_vram_history_wrap(vram_history *h);

/* Write one event (kind VRAM_HSLOT_FREE_PAIR: a same-stream free's two events) into the
 * next slot; the oldest slot is overwritten when the ring is full (its events counted as
 * dropped when read). Only while recording. The common event (stream 0 or the stream last
 * seen, small slack and context) costs a few loads, a compare per field and four stores:
 * the stream and device bits come precomputed. */
static inline void _vram_history_put(vram_history *h, uint64_t tick, unsigned kind,
                                     uint64_t addr, uint64_t size, uint64_t requested,
                                     uint64_t stream, uint64_t context) {
  vram_hslot *s = h->cur, *n = s + 1;
  if (__builtin_expect(n == h->end, 0)) n = _vram_history_wrap(h);
  h->cur = n;
  h->pairs += kind == VRAM_HSLOT_FREE_PAIR;
  uint64_t slack = size - requested, bits, word;
  if (__builtin_expect(stream == 0, 1)) bits = h->word0;
  else if (stream == h->stream_last) bits = h->stream_word;
  else goto slow;
  if (__builtin_expect(slack < h->slack_limit && context < VRAM_HSLOT_CONTEXT_LIMIT, 1)) {
    word = bits | kind | slack << VRAM_HSLOT_SLACK_SHIFT | context << VRAM_HSLOT_CONTEXT_SHIFT;
  } else {
  slow:
    word = _vram_history_pack_slow(h, s, kind, slack, requested, stream, context);
  }
  s->tick = tick;
  s->addr = addr;
  s->size = size;
  s->word = word;
}

/* The TSC (read where mode is VRAM_HREC_TSC, set only where it is invariant). */
static inline uint64_t _vram_tsc(void) {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return 0;
#endif
}

/* Record one event, its tick read now, if the recorder records. */
static inline void _vram_history_record(vram_history *h, unsigned kind, uint64_t addr,
                                        uint64_t size, uint64_t requested, uint64_t stream,
                                        uint64_t context) {
  uint64_t tick;
  if (__builtin_expect(h->mode == VRAM_HREC_TSC, 1)) tick = _vram_tsc();
  else if (h->mode == VRAM_HREC_OFF) return;
  else tick = _vram_monotonic_ns();
  _vram_history_put(h, tick, kind, addr, size, requested, stream, context);
}

#endif /* VRAM_OBS_HISTORY_H */

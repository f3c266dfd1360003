/* history.c - the memory-history recorder (history.h): the event ring of packed slots and
 * their expansion to vram_event_t, the tick clock and its conversion to CLOCK_MONOTONIC
 * microseconds, and the context side table. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "obs/history.h"
#include "prim/hostmem.h"

uint64_t _vram_monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The TSC serves as a clock only where it ticks at one rate whatever the core does
 * (CPUID 0x80000007, EDX bit 8: "invariant TSC", /proc/cpuinfo's nonstop_tsc), or where
 * the kernel keeps CLOCK_MONOTONIC on it (its clocksource is "tsc", which it picks only
 * for a TSC it found in step across CPUs and drops if that stops holding): virtual
 * machines often hide the CPUID bit and still run their clock on the TSC. Elsewhere each
 * event asks the kernel, through clock_gettime: +51 ns on the C alloc+free pair here
 * (vDSO over the TSC), where two TSC reads cost about 10. */
static bool tsc_is_invariant(void) {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000007u) return false;
  __get_cpuid(0x80000007u, &a, &b, &c, &d);
  return (d >> 8) & 1;
#else
  return false;
#endif
}

static bool kernel_clock_is_tsc(void) {
#if defined(__x86_64__)
  FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "re");
  if (!f) return false;
  char name[16];
  bool tsc = fgets(name, sizeof name, f) && strcmp(name, "tsc\n") == 0;
  fclose(f);
  return tsc;
#else
  return false;
#endif
}

/* Asked once per process: 1 TSC, 2 not. */
static bool tsc_usable(void) {
  static _Atomic int known;
  int k = atomic_load_explicit(&known, memory_order_relaxed);
  if (!k) {
    k = tsc_is_invariant() || kernel_clock_is_tsc() ? 1 : 2;
    atomic_store_explicit(&known, k, memory_order_relaxed);
  }
  return k == 1;
}

/* The recorder and its ring come from hostmem (prim/hostmem.h): on whole cache lines, so
 * that the hot fields share one and no slot straddles two (malloc's 16-byte alignment
 * would split every other slot's stores), and a large ring on huge pages. */
int _vram_history_new(vram_history **out) {
  vram_history *h = _vram_host_zalloc(sizeof *h);
  if (!h) return VRAM_EHOSTMEM;
  h->use_tsc = tsc_usable();
  *out = h;
  return VRAM_OK;
}

void _vram_history_free(vram_history *h) {
  if (!h) return;
  _vram_host_free(h->ring, h->cap * sizeof *h->ring);
  free(h->wide);
  _vram_ctx_drop(&h->contexts);
  _vram_host_free(h, sizeof *h);
}

static void anchor(const vram_history *h, uint64_t *tick, uint64_t *ns) {
  *tick = h->use_tsc ? _vram_tsc() : _vram_monotonic_ns();
  *ns = _vram_monotonic_ns();
}

_Static_assert(VRAM_EVENT_GIVE_BACK < VRAM_HSLOT_FREE_PAIR, "event kinds fit the slot's kind bits");
_Static_assert(sizeof(vram_hslot) == 32 && sizeof(vram_hwide) == 32, "slots of half an event");
_Static_assert(offsetof(vram_history, mode) < 64, "the fields an event touches fit one line");

/* The side slots are reserved with the ring but, written only by wide events, mostly never
 * touched (so never resident): a ring whose events all go wide still holds max_entries. */
int _vram_history_begin(vram_history *h, size_t max_entries, int device) {
  if (!max_entries) max_entries = VRAM_HISTORY_DEFAULT_ENTRIES;
  if (max_entries > VRAM_HISTORY_MAX_ENTRIES) return VRAM_EHOSTMEM;
  vram_hslot *ring = _vram_host_zalloc(max_entries * sizeof *ring);
  vram_hwide *wide = malloc(max_entries * sizeof *wide);
  if (!ring || !wide) {
    _vram_host_free(ring, max_entries * sizeof *ring);
    free(wide);
    _vram_history_end(h);
    return VRAM_EHOSTMEM;
  }
  _vram_host_free(h->ring, h->cap * sizeof *h->ring);
  free(h->wide);
  h->ring = ring;
  h->wide = wide;
  h->cap = max_entries;
  h->cur = ring;
  h->end = ring + max_entries;
  h->pairs = h->wraps = 0;
  h->n_streams = 0;
  h->device = device;
  /* A device that does not fit the packed word's 8 bits sends every event wide. */
  bool fits = (unsigned)device < 256u;
  h->word0 = fits ? (uint64_t)device << VRAM_HSLOT_DEVICE_SHIFT : 0;
  h->slack_limit = fits ? VRAM_HSLOT_SLACK_LIMIT : 0;
  h->stream_last = 0;
  h->stream_word = 0;
  h->stopped = false;
  anchor(h, &h->tick0, &h->ns0);
  h->mode = h->use_tsc ? VRAM_HREC_TSC : VRAM_HREC_NS;
  return VRAM_OK;
}

vram_hslot *_vram_history_wrap(vram_history *h) {
  h->wraps++;
  return h->ring;
}

uint64_t _vram_history_pack_slow(vram_history *h, const vram_hslot *s, unsigned kind,
                                 uint64_t slack, uint64_t requested, uint64_t stream,
                                 uint64_t context) {
  size_t i = (size_t)(s - h->ring);
  int device = h->device;
  uint64_t sindex = ~0ull;
  if (stream == 0) sindex = 0;
  for (unsigned k = 0; k < h->n_streams && sindex == ~0ull; k++)
    if (h->streams[k] == stream) sindex = k + 1;
  if (sindex == ~0ull && h->n_streams < VRAM_HSLOT_STREAMS) {
    h->streams[h->n_streams++] = stream;
    sindex = h->n_streams;
  }
  bool device_fits = (unsigned)device < 256u;
  uint64_t bits = sindex << VRAM_HSLOT_STREAM_SHIFT | (uint64_t)device << VRAM_HSLOT_DEVICE_SHIFT;
  if (sindex != 0 && sindex != ~0ull && device_fits) {
    h->stream_last = stream;
    h->stream_word = bits;
  }
  if (slack < VRAM_HSLOT_SLACK_LIMIT && context < VRAM_HSLOT_CONTEXT_LIMIT && device_fits &&
      sindex != ~0ull)
    return kind | bits | slack << VRAM_HSLOT_SLACK_SHIFT | context << VRAM_HSLOT_CONTEXT_SHIFT;
  h->wide[i] = (vram_hwide){requested, stream, context, device, 0};
  return kind | VRAM_HSLOT_WIDE;
}

void _vram_history_end(vram_history *h) {
  if (h->mode == VRAM_HREC_OFF) return;
  h->mode = VRAM_HREC_OFF;
  h->stopped = true;
  anchor(h, &h->tick1, &h->ns1);
}

/* Ticks to CLOCK_MONOTONIC microseconds, by the line through the two anchors. */
static uint64_t to_us(uint64_t tick, uint64_t t0, uint64_t n0, double ns_per_tick) {
  double ns = (double)n0 + ((double)(int64_t)(tick - t0)) * ns_per_tick;
  return ns > 0 ? (uint64_t)(ns / 1000.0) : 0;
}

/* Slot i's event, time still in ticks; a FREE_PAIR slot gives its FREE_REQUESTED half,
 * the caller turns it into the FREE_COMPLETED one. */
static vram_event_t expand(const vram_history *h, size_t i) {
  const vram_hslot *s = &h->ring[i];
  uint64_t w = s->word;
  unsigned kind = (unsigned)(w & ((1u << VRAM_HSLOT_KIND_BITS) - 1));
  vram_event_t e = {.time_us = s->tick, .addr = s->addr, .size = s->size};
  e.kind = kind == VRAM_HSLOT_FREE_PAIR ? VRAM_EVENT_FREE_REQUESTED : (int32_t)kind;
  if (w & VRAM_HSLOT_WIDE) {
    const vram_hwide *x = &h->wide[i];
    e.requested = x->requested;
    e.stream = x->stream;
    e.context = x->context;
    e.device = x->device;
    return e;
  }
  unsigned sindex = (unsigned)(w >> VRAM_HSLOT_STREAM_SHIFT) & 15u;
  e.stream = sindex ? h->streams[sindex - 1] : 0;
  e.device = (int32_t)((w >> VRAM_HSLOT_DEVICE_SHIFT) & 255u);
  e.requested = s->size - ((w >> VRAM_HSLOT_SLACK_SHIFT) & (VRAM_HSLOT_SLACK_LIMIT - 1));
  e.context = w >> VRAM_HSLOT_CONTEXT_SHIFT;
  return e;
}

static unsigned slot_events(const vram_history *h, size_t i) {
  return (h->ring[i].word & ((1u << VRAM_HSLOT_KIND_BITS) - 1)) == VRAM_HSLOT_FREE_PAIR ? 2 : 1;
}

/* The index of the next slot to be written (0 before the first start). */
static size_t next_index(const vram_history *h) {
  return h->ring ? (size_t)(h->cur - h->ring) : 0;
}

/* The oldest slot holding one of the last `held` events, and whether its first event (the
 * requested half of a pair) fell out of the window: found walking back from the newest. */
static size_t oldest_slot(const vram_history *h, size_t held, bool *skip_first) {
  size_t next = next_index(h);
  size_t valid = h->wraps ? h->cap : next, seen = 0, i = next;
  *skip_first = false;
  for (size_t k = 0; k < valid && seen < held; k++) {
    i = i == 0 ? h->cap - 1 : i - 1;
    seen += slot_events(h, i);
  }
  *skip_first = seen > held;
  return i;
}

void _vram_history_copy(const vram_history *h, vram_event_t *out, size_t cap, size_t *count,
                        size_t *total, uint64_t *dropped) {
  uint64_t written = h->wraps * h->cap + next_index(h) + h->pairs; /* events: slots + pairs */
  size_t held = written < h->cap ? (size_t)written : h->cap;
  size_t n = held < cap ? held : cap;
  if (count) *count = n;
  if (total) *total = held;
  if (dropped) *dropped = written - held;
  if (!n) return;
  uint64_t t1 = h->tick1, n1 = h->ns1;
  if (!h->stopped) anchor(h, &t1, &n1);
  double ns_per_tick = 1.0;
  if (h->use_tsc && t1 > h->tick0) ns_per_tick = (double)(n1 - h->ns0) / (double)(t1 - h->tick0);
  bool skip;
  size_t j = oldest_slot(h, held, &skip), o = 0;
  uint64_t last_us = 0;
  while (o < n) {
    vram_event_t e = expand(h, j);
    e.time_us = h->use_tsc ? to_us(e.time_us, h->tick0, h->ns0, ns_per_tick) : e.time_us / 1000u;
    /* The tick is read without a barrier, so the event after a lock handed between threads
     * can hold a tick a little older than the one before it; its call was under way at that
     * one's time, which is then its time too. */
    if (e.time_us < last_us) e.time_us = last_us;
    last_us = e.time_us;
    bool pair = slot_events(h, j) == 2;
    if (!skip) out[o++] = e;
    if (pair && o < n) {
      e.kind = VRAM_EVENT_FREE_COMPLETED;
      out[o++] = e;
    }
    skip = false;
    if (++j == h->cap) j = 0;
  }
}

/* ---- the context side table */

#define CTX_INITIAL_SLOTS 4096

static inline size_t ctx_hash(uint64_t addr, size_t mask) {
  return (size_t)((addr >> 9) * 0x9E3779B97F4A7C15ull >> 20) & mask;
}

int _vram_ctx_keep(vram_ctx_table *t) {
  if (t->slots) return VRAM_OK;
  t->slots = calloc(CTX_INITIAL_SLOTS, sizeof *t->slots);
  if (!t->slots) return VRAM_EHOSTMEM;
  t->mask = CTX_INITIAL_SLOTS - 1;
  t->count = 0;
  return VRAM_OK;
}

void _vram_ctx_drop(vram_ctx_table *t) {
  free(t->slots);
  t->slots = NULL;
  t->mask = t->count = 0;
}

static void ctx_place(vram_ctx_slot *slots, size_t mask, uint64_t addr, uint64_t context) {
  size_t i = ctx_hash(addr, mask);
  while (slots[i].addr && slots[i].addr != addr) i = (i + 1) & mask;
  slots[i].addr = addr;
  slots[i].context = context;
}

/* Kept at most half full, so that probes stay short. */
static bool ctx_grow(vram_ctx_table *t) {
  size_t cap = (t->mask + 1) * 2;
  vram_ctx_slot *slots = calloc(cap, sizeof *slots);
  if (!slots) return false;
  for (size_t i = 0; i <= t->mask; i++)
    if (t->slots[i].addr) ctx_place(slots, cap - 1, t->slots[i].addr, t->slots[i].context);
  free(t->slots);
  t->slots = slots;
  t->mask = cap - 1;
  return true;
}

void _vram_ctx_set(vram_ctx_table *t, uint64_t addr, uint64_t context) {
  if (!t->slots || !addr) return;
  if (!context) {
    _vram_ctx_take(t, addr);
    return;
  }
  if ((t->count + 1) * 2 > t->mask + 1 && !ctx_grow(t)) return;
  size_t i = ctx_hash(addr, t->mask);
  while (t->slots[i].addr && t->slots[i].addr != addr) i = (i + 1) & t->mask;
  if (!t->slots[i].addr) t->count++;
  t->slots[i].addr = addr;
  t->slots[i].context = context;
}

uint64_t _vram_ctx_get(const vram_ctx_table *t, uint64_t addr) {
  if (!t->slots || !addr) return 0;
  for (size_t i = ctx_hash(addr, t->mask);; i = (i + 1) & t->mask) {
    if (t->slots[i].addr == addr) return t->slots[i].context;
    if (!t->slots[i].addr) return 0;
  }
}

/* Backward-shift deletion: no tombstones, so lookups stay as short as the load allows. */
uint64_t _vram_ctx_take(vram_ctx_table *t, uint64_t addr) {
  if (!t->slots || !addr) return 0;
  size_t i = ctx_hash(addr, t->mask);
  while (t->slots[i].addr != addr) {
    if (!t->slots[i].addr) return 0;
    i = (i + 1) & t->mask;
  }
  uint64_t context = t->slots[i].context;
  t->count--;
  for (size_t j = (i + 1) & t->mask;; j = (j + 1) & t->mask) {
    if (!t->slots[j].addr) break;
    size_t home = ctx_hash(t->slots[j].addr, t->mask);
    /* Move j into the hole at i unless its home lies cyclically in (i, j]. */
    bool stays = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    t->slots[i] = t->slots[j];
    i = j;
  }
  t->slots[i].addr = 0;
  t->slots[i].context = 0;
  return context;
}

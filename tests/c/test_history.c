/* test_history.c - memory history on the sim sources: every event kind with its fields,
 * cross-stream frees completing later, vmm granule maps, OOM with the device's free
 * memory, the ring's overflow and short reads, stop and start, contexts taken outside the
 * lock, the recorder's slots for every device and its times kept in order, and bad input.
 * The invariant checker runs after every operation. */
#include <time.h>

#include "obs/history.h"
#include "vt.h"

enum { CAP = 4096 };
static vram_event_t g_ev[CAP];

/* The recorded events, oldest first; their count. */
static size_t read_all(vram_pool_t *pool) {
  size_t count = 0, total = 0;
  uint64_t dropped = 0;
  VT_OK(vram_history_read(pool, g_ev, CAP, &count, &total, &dropped));
  VT_VALID(pool);
  assert_int_equal(count, total);
  return count;
}

/* Index of the first event of `kind` at or after `from` (and at addr unless addr is 0). */
static long find(size_t n, size_t from, int kind, uint64_t addr) {
  for (size_t i = from; i < n; i++)
    if (g_ev[i].kind == kind && (!addr || g_ev[i].addr == addr)) return (long)i;
  return -1;
}

static void *xmalloc(vram_pool_t *pool, size_t size, vram_stream_t stream) {
  void *p = NULL;
  VT_OK(vram_malloc(pool, size, stream, &p));
  VT_VALID(pool);
  return p;
}

static void xfree(vram_pool_t *pool, void *p) {
  VT_OK(vram_free(pool, p));
  VT_VALID(pool);
}

static vram_pool_t *sim_pool(vram_source_kind kind, size_t capacity, int event_delay) {
  vram_options_t o;
  vram_options_init(&o);
  o.source = kind;
  o.sim_capacity = capacity;
  o.sim_event_delay = event_delay;
  o.device = 3;
  return vt_pool_from(&o);
}

static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void t_event_kinds(void **state) {
  (void)state;
  vram_pool_t *pool = sim_pool(VRAM_SOURCE_SIM, 4 * VT_GiB, 0);
  uint64_t before = now_us();
  VT_OK(vram_history_start(pool, 0, 0));
  VT_VALID(pool);
  vram_stream_t s = VT_STREAM(0x77);
  void *a = xmalloc(pool, 1000, s);
  void *b = xmalloc(pool, 3 * VT_MiB, NULL);
  xfree(pool, a);
  VT_OK(vram_history_annotate(pool, 4242));
  VT_VALID(pool);
  xfree(pool, b);
  VT_OK(vram_empty_cache(pool));
  VT_VALID(pool);
  size_t ns = 0, nb = 0;
  VT_OK(vram_snapshot(pool, NULL, 0, &ns, NULL, 0, &nb));
  VT_VALID(pool);
  uint64_t after = now_us();
  size_t n = read_all(pool);
  /* Times: monotonic, within the test's span. */
  for (size_t i = 0; i < n; i++) {
    assert_true(g_ev[i].time_us + 1 >= before && g_ev[i].time_us <= after + 1);
    if (i) assert_true(g_ev[i].time_us >= g_ev[i - 1].time_us);
    assert_int_equal(g_ev[i].device, 3);
  }
  long seg = find(n, 0, VRAM_EVENT_SEGMENT_ALLOC, 0);
  long al = find(n, 0, VRAM_EVENT_ALLOC, (uintptr_t)a);
  assert_true(seg >= 0 && al > seg); /* the segment came first */
  assert_int_equal(g_ev[seg].stream, 0x77);
  assert_int_equal(g_ev[al].size, 1024);
  assert_int_equal(g_ev[al].requested, 1000);
  assert_int_equal(g_ev[al].stream, 0x77);
  long fr = find(n, (size_t)al, VRAM_EVENT_FREE_REQUESTED, (uintptr_t)a);
  long fc = find(n, (size_t)al, VRAM_EVENT_FREE_COMPLETED, (uintptr_t)a);
  assert_true(fr > al && fc == fr + 1); /* same stream: reusable at once */
  assert_int_equal(g_ev[fc].requested, 1000);
  long an = find(n, 0, VRAM_EVENT_ANNOTATE, 0);
  assert_true(an > fc);
  assert_int_equal(g_ev[an].context, 4242);
  long bl = find(n, 0, VRAM_EVENT_ALLOC, (uintptr_t)b);
  assert_true(bl >= 0);
  assert_int_equal(g_ev[bl].stream, 0);
  long ec = find(n, 0, VRAM_EVENT_EMPTY_CACHE, 0);
  long sf = find(n, (size_t)(ec < 0 ? 0 : ec), VRAM_EVENT_SEGMENT_FREE, 0);
  assert_true(ec > an && sf > ec);
  long sn = find(n, 0, VRAM_EVENT_SNAPSHOT, 0);
  assert_int_equal(sn, (long)n - 1);
  /* Every segment that came was given back, byte for byte. */
  uint64_t got = 0, back = 0;
  for (size_t i = 0; i < n; i++) {
    if (g_ev[i].kind == VRAM_EVENT_SEGMENT_ALLOC) got += g_ev[i].size;
    if (g_ev[i].kind == VRAM_EVENT_SEGMENT_FREE) back += g_ev[i].size;
  }
  assert_true(got > 0);
  assert_int_equal(got, back);
  VT_OK(vram_pool_destroy(pool));
}

/* A free seen by another stream completes when its event does. */
static void t_pending_free(void **state) {
  (void)state;
  vram_pool_t *pool = sim_pool(VRAM_SOURCE_SIM, 4 * VT_GiB, 1000000);
  VT_OK(vram_history_start(pool, 0, 0));
  void *p = xmalloc(pool, 8192, NULL);
  VT_OK(vram_record_stream(pool, p, VT_STREAM(0x99)));
  VT_VALID(pool);
  xfree(pool, p);
  size_t n = read_all(pool);
  long fr = find(n, 0, VRAM_EVENT_FREE_REQUESTED, (uintptr_t)p);
  assert_true(fr >= 0);
  assert_int_equal(find(n, 0, VRAM_EVENT_FREE_COMPLETED, (uintptr_t)p), -1);
  void *q = xmalloc(pool, 100, NULL); /* still waiting: no completion yet */
  n = read_all(pool);
  assert_int_equal(find(n, 0, VRAM_EVENT_FREE_COMPLETED, (uintptr_t)p), -1);
  VT_OK(vram_empty_cache(pool)); /* waits for every pending free */
  VT_VALID(pool);
  n = read_all(pool);
  long fc = find(n, 0, VRAM_EVENT_FREE_COMPLETED, (uintptr_t)p);
  assert_true(fc > fr);
  assert_int_equal(g_ev[fc].size, 8192);
  assert_int_equal(g_ev[fc].requested, 8192);
  assert_true(find(n, 0, VRAM_EVENT_EMPTY_CACHE, 0) < fc);
  xfree(pool, q);
  VT_OK(vram_pool_destroy(pool));
}

/* Virtual memory: granule maps and unmaps with their ranges, no whole segments. */
static void t_vmm_map_unmap(void **state) {
  (void)state;
  vram_pool_t *pool = sim_pool(VRAM_SOURCE_SIM_VMM, 4 * VT_GiB, 0);
  VT_OK(vram_history_start(pool, 0, 0));
  void *p = xmalloc(pool, 5 * VT_MiB, NULL);
  xfree(pool, p);
  VT_OK(vram_empty_cache(pool));
  VT_VALID(pool);
  size_t n = read_all(pool);
  assert_int_equal(find(n, 0, VRAM_EVENT_SEGMENT_ALLOC, 0), -1);
  uint64_t mapped = 0, unmapped = 0;
  long first_map = find(n, 0, VRAM_EVENT_SEGMENT_MAP, 0);
  long al = find(n, 0, VRAM_EVENT_ALLOC, (uintptr_t)p);
  assert_true(first_map >= 0 && first_map < al);
  for (size_t i = 0; i < n; i++) {
    if (g_ev[i].kind == VRAM_EVENT_SEGMENT_MAP) {
      mapped += g_ev[i].size;
      assert_true(g_ev[i].addr <= (uintptr_t)p || g_ev[i].addr >= (uintptr_t)p + 5 * VT_MiB ||
                  g_ev[i].addr % (2 * VT_MiB) == 0);
    }
    if (g_ev[i].kind == VRAM_EVENT_SEGMENT_UNMAP) unmapped += g_ev[i].size;
  }
  assert_true(mapped >= 6 * VT_MiB && mapped % (2 * VT_MiB) == 0);
  assert_int_equal(mapped, unmapped);
  assert_int_equal(vt_stats(pool).reserved_bytes.current, 0);
  VT_OK(vram_pool_destroy(pool));
}

/* A refused request: its size, and the device's free memory at that moment. */
static void t_oom(void **state) {
  (void)state;
  vram_pool_t *pool = sim_pool(VRAM_SOURCE_SIM, 64 * VT_MiB, 0);
  VT_OK(vram_history_start(pool, 0, 0));
  void *held = xmalloc(pool, 20 * VT_MiB, NULL);
  size_t fr = 0, total = 0;
  VT_OK(vram_mem_get_info(pool, &fr, &total));
  void *p = NULL;
  VT_EXPECT(vram_malloc(pool, 50 * VT_MiB, NULL, &p), VRAM_ENOMEM);
  VT_VALID(pool);
  VT_EXPECT(vram_malloc(pool, 100 * VT_GiB, NULL, &p), VRAM_ENOMEM); /* more than it holds */
  VT_VALID(pool);
  size_t n = read_all(pool);
  long o1 = find(n, 0, VRAM_EVENT_OOM, 0);
  assert_true(o1 >= 0);
  assert_int_equal(g_ev[o1].size, 50 * VT_MiB);
  assert_int_equal(g_ev[o1].requested, 50 * VT_MiB);
  assert_int_equal(g_ev[o1].addr, fr);
  long o2 = find(n, (size_t)o1 + 1, VRAM_EVENT_OOM, 0);
  assert_true(o2 > o1);
  assert_int_equal(g_ev[o2].requested, 100 * VT_GiB);
  xfree(pool, held);
  VT_OK(vram_pool_destroy(pool));
}

/* A ring of 8: the newest 8 are kept, the rest counted; short reads give the oldest. */
static void t_overflow_and_short_read(void **state) {
  (void)state;
  vram_pool_t *pool = sim_pool(VRAM_SOURCE_SIM, 4 * VT_GiB, 0);
  VT_OK(vram_history_start(pool, 8, 0));
  void *p[10];
  for (int i = 0; i < 10; i++) p[i] = xmalloc(pool, 512 * (size_t)(i + 1), NULL);
  size_t count = 0, total = 0;
  uint64_t dropped = 0;
  vram_event_t ev[8];
  VT_OK(vram_history_read(pool, ev, 8, &count, &total, &dropped));
  VT_VALID(pool);
  assert_int_equal(count, 8);
  assert_int_equal(total, 8);
  /* 10 allocations and the one segment they share: 11 events, the oldest 3 overwritten. */
  assert_int_equal(dropped, 3);
  for (int i = 0; i < 8; i++) {
    assert_int_equal(ev[i].kind, VRAM_EVENT_ALLOC);
    assert_int_equal(ev[i].addr, (uintptr_t)p[i + 2]);
  }
  vram_event_t two[2];
  VT_OK(vram_history_read(pool, two, 2, &count, &total, NULL));
  assert_int_equal(count, 2);
  assert_int_equal(total, 8);
  assert_int_equal(two[0].addr, (uintptr_t)p[2]);
  assert_int_equal(two[1].addr, (uintptr_t)p[3]);
  VT_OK(vram_history_read(pool, NULL, 0, &count, &total, &dropped)); /* sizes only */
  assert_int_equal(count, 0);
  assert_int_equal(total, 8);
  /* Stop: readable, nothing more recorded. Start: cleared. */
  VT_OK(vram_history_stop(pool));
  VT_VALID(pool);
  for (int i = 0; i < 10; i++) xfree(pool, p[i]);
  VT_OK(vram_history_read(pool, ev, 8, &count, &total, &dropped));
  assert_int_equal(total, 8);
  assert_int_equal(ev[7].addr, (uintptr_t)p[9]);
  VT_OK(vram_history_start(pool, 8, 0));
  VT_VALID(pool);
  VT_OK(vram_history_read(pool, ev, 8, &count, &total, &dropped));
  assert_int_equal(total, 0);
  assert_int_equal(dropped, 0);
  VT_OK(vram_history_stop(pool));
  VT_OK(vram_history_stop(pool)); /* twice is fine */
  VT_VALID(pool);
  VT_OK(vram_pool_destroy(pool));
}

/* The context function runs outside the lock: it may call into the same pool. */
static vram_pool_t *g_ctx_pool;
static uint64_t g_ctx_calls;

static uint64_t context_fn(void *user) {
  vram_stats_t s;
  VT_OK(vram_get_stats(g_ctx_pool, &s)); /* would deadlock under the pool's lock */
  return (uint64_t)(uintptr_t)user + ++g_ctx_calls;
}

/* A sim pool whose allocations get context ids from `base` + 1 on. */
static vram_pool_t *pool_with_contexts(uint64_t base) {
  vram_pool_t *pool = sim_pool(VRAM_SOURCE_SIM, 4 * VT_GiB, 0);
  g_ctx_pool = pool;
  g_ctx_calls = 0;
  vram_set_context_fn(context_fn, (void *)(uintptr_t)base);
  return pool;
}

static void t_contexts(void **state) {
  (void)state;
  vram_pool_t *pool = pool_with_contexts(1000);
  void *before = xmalloc(pool, 4096, NULL); /* not recording: no call */
  assert_int_equal(g_ctx_calls, 0);
  VT_OK(vram_history_start(pool, 0, 0)); /* no contexts asked for: no call */
  void *plain = xmalloc(pool, 4096, NULL);
  assert_int_equal(g_ctx_calls, 0);
  VT_OK(vram_history_start(pool, 0, VRAM_HISTORY_CONTEXTS));
  VT_VALID(pool);
  void *a = xmalloc(pool, 10000, NULL);
  void *b = xmalloc(pool, 2 * VT_MiB, VT_STREAM(5));
  assert_int_equal(g_ctx_calls, 2);
  size_t n = read_all(pool);
  assert_int_equal(g_ev[find(n, 0, VRAM_EVENT_ALLOC, (uintptr_t)a)].context, 1001);
  assert_int_equal(g_ev[find(n, 0, VRAM_EVENT_ALLOC, (uintptr_t)b)].context, 1002);
  /* The snapshot shows each live block's context. */
  size_t ns = 0, nb = 0;
  VT_OK(vram_snapshot(pool, NULL, 0, &ns, NULL, 0, &nb));
  vram_snapshot_segment_t *segs = calloc(ns, sizeof *segs);
  vram_snapshot_block_t *blocks = calloc(nb, sizeof *blocks);
  VT_OK(vram_snapshot(pool, segs, ns, &ns, blocks, nb, &nb));
  VT_VALID(pool);
  int seen = 0;
  for (size_t i = 0; i < nb; i++) {
    if (blocks[i].addr == (uintptr_t)a) seen += blocks[i].context == 1001;
    if (blocks[i].addr == (uintptr_t)b) seen += blocks[i].context == 1002;
    if (blocks[i].addr == (uintptr_t)before || blocks[i].addr == (uintptr_t)plain)
      assert_int_equal(blocks[i].context, 0);
  }
  assert_int_equal(seen, 2);
  free(segs);
  free(blocks);
  VT_TILES(pool);
  xfree(pool, a);
  n = read_all(pool);
  assert_int_equal(g_ev[find(n, 0, VRAM_EVENT_FREE_COMPLETED, (uintptr_t)a)].context, 1001);
  /* A block reusing a's address gets its own context. */
  void *c = xmalloc(pool, 10000, NULL);
  n = read_all(pool);
  long ca = find(n, (size_t)find(n, 0, VRAM_EVENT_FREE_COMPLETED, (uintptr_t)a), VRAM_EVENT_ALLOC, (uintptr_t)c);
  assert_true(ca >= 0);
  assert_int_equal(g_ev[ca].context, 1003);
  vram_set_context_fn(NULL, NULL);
  void *d = xmalloc(pool, 64, NULL);
  n = read_all(pool);
  assert_int_equal(g_ev[find(n, 0, VRAM_EVENT_ALLOC, (uintptr_t)d)].context, 0);
  VT_OK(vram_history_stop(pool));
  xfree(pool, b);
  xfree(pool, c);
  xfree(pool, d);
  xfree(pool, before);
  xfree(pool, plain);
  VT_OK(vram_pool_destroy(pool));
}

/* The context a snapshot gives the block at addr (-1: no such block). */
static int64_t snapshot_context(vram_pool_t *pool, void *addr) {
  size_t ns = 0, nb = 0;
  VT_OK(vram_snapshot(pool, NULL, 0, &ns, NULL, 0, &nb));
  vram_snapshot_segment_t *segs = calloc(ns, sizeof *segs);
  vram_snapshot_block_t *blocks = calloc(nb, sizeof *blocks);
  VT_OK(vram_snapshot(pool, segs, ns, &ns, blocks, nb, &nb));
  VT_VALID(pool);
  int64_t found = -1;
  for (size_t i = 0; i < nb; i++)
    if (blocks[i].addr == (uintptr_t)addr && blocks[i].state == VRAM_SNAPSHOT_ACTIVE_ALLOCATED)
      found = (int64_t)blocks[i].context;
  free(segs);
  free(blocks);
  return found;
}

static size_t count_kind(size_t n, int kind) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += g_ev[i].kind == kind;
  return k;
}

/* After a stop, live blocks keep the contexts they were allocated with (a snapshot taken
 * later still says where they came from); a freed block's context goes, and a block that
 * reuses its address has none. Only a snapshot that fills its arrays is an event. */
static void t_contexts_after_stop(void **state) {
  (void)state;
  vram_pool_t *pool = pool_with_contexts(2000);
  VT_OK(vram_history_start(pool, 0, VRAM_HISTORY_CONTEXTS));
  void *a = xmalloc(pool, 10000, NULL);
  void *b = xmalloc(pool, 3 * VT_MiB, NULL);
  size_t n = read_all(pool);
  size_t snaps = count_kind(n, VRAM_EVENT_SNAPSHOT);
  size_t ns = 0, nb = 0;
  VT_OK(vram_snapshot(pool, NULL, 0, &ns, NULL, 0, &nb)); /* totals only: no snapshot */
  assert_int_equal(count_kind(read_all(pool), VRAM_EVENT_SNAPSHOT), snaps);
  assert_int_equal(snapshot_context(pool, a), 2001);      /* a filled one: one event */
  assert_int_equal(count_kind(read_all(pool), VRAM_EVENT_SNAPSHOT), snaps + 1);

  VT_OK(vram_history_stop(pool));
  VT_VALID(pool);
  assert_int_equal(snapshot_context(pool, a), 2001);
  assert_int_equal(snapshot_context(pool, b), 2002);
  xfree(pool, a);
  void *c = xmalloc(pool, 10000, NULL); /* not recording: no context, whatever address */
  assert_int_equal(g_ctx_calls, 2);
  assert_int_equal(snapshot_context(pool, c), 0);
  assert_int_equal(snapshot_context(pool, b), 2002);
  vram_set_context_fn(NULL, NULL);
  xfree(pool, b);
  xfree(pool, c);
  VT_OK(vram_pool_destroy(pool));
}

/* With VRAM_HISTORY_FREE_CONTEXTS a free's events carry the free's own context; a start
 * with VRAM_HISTORY_KEEP on a pool recording into a ring of that size keeps the ring, its
 * entries and the contexts of live blocks, and changes only what is recorded next. */
static void t_free_contexts_and_a_kept_ring(void **state) {
  (void)state;
  vram_pool_t *pool = pool_with_contexts(3000);
  VT_OK(vram_history_start(pool, 1000, VRAM_HISTORY_CONTEXTS | VRAM_HISTORY_FREE_CONTEXTS));
  void *a = xmalloc(pool, 10000, NULL); /* 3001 */
  xfree(pool, a);                       /* 3002: the free's own */
  size_t n = read_all(pool);
  assert_int_equal(g_ev[find(n, 0, VRAM_EVENT_ALLOC, (uintptr_t)a)].context, 3001);
  assert_int_equal(g_ev[find(n, 0, VRAM_EVENT_FREE_REQUESTED, (uintptr_t)a)].context, 3002);
  assert_int_equal(g_ev[find(n, 0, VRAM_EVENT_FREE_COMPLETED, (uintptr_t)a)].context, 3002);
  void *b = xmalloc(pool, 4096, NULL); /* 3003 */
  size_t before = read_all(pool);
  /* Kept: contexts of allocations only from now on; nothing recorded is lost. */
  VT_OK(vram_history_start(pool, 1000, VRAM_HISTORY_CONTEXTS | VRAM_HISTORY_KEEP));
  VT_VALID(pool);
  assert_int_equal(read_all(pool), before);
  assert_int_equal(snapshot_context(pool, b), 3003);
  xfree(pool, b); /* no call: the allocation's context */
  assert_int_equal(g_ctx_calls, 3);
  n = read_all(pool);
  /* b may take a's address: its free is the one after the events kept above. */
  assert_int_equal(g_ev[find(n, before, VRAM_EVENT_FREE_REQUESTED, (uintptr_t)b)].context, 3003);
  /* Kept with no contexts asked for: a live block keeps its own. */
  void *c = xmalloc(pool, 4096, NULL); /* 3004 */
  VT_OK(vram_history_start(pool, 1000, VRAM_HISTORY_KEEP));
  void *d = xmalloc(pool, 4096, NULL);
  assert_int_equal(g_ctx_calls, 4);
  assert_int_equal(snapshot_context(pool, c), 3004);
  assert_int_equal(snapshot_context(pool, d), 0);
  n = read_all(pool);
  assert_true(find(n, 0, VRAM_EVENT_ALLOC, (uintptr_t)a) >= 0);
  /* A ring of another size is a new ring, as is a start without the flag. */
  VT_OK(vram_history_start(pool, 500, VRAM_HISTORY_KEEP));
  assert_int_equal(read_all(pool), 0);
  xfree(pool, c);
  VT_OK(vram_history_start(pool, 500, 0));
  assert_int_equal(read_all(pool), 0);
  xfree(pool, d);
  VT_EXPECT(vram_history_start(pool, 500, 8u), VRAM_EINVAL);
  vram_set_context_fn(NULL, NULL);
  VT_OK(vram_pool_destroy(pool));
}

/* As PyTorch's: the segment, map and out-of-memory events an allocation causes carry its
 * context; memory given back carries the context of the call that gave it back under
 * VRAM_HISTORY_FREE_CONTEXTS (a free, empty_cache); a segment given back otherwise that
 * of the call that made it. Events outside those calls carry none. */
static void t_segment_events_carry_their_call(void **state) {
  (void)state;
  vram_pool_t *pool = pool_with_contexts(4000);
  VT_OK(vram_history_start(pool, 1000, VRAM_HISTORY_CONTEXTS));
  void *small = xmalloc(pool, 1000, NULL);   /* 4001: a small segment */
  void *large = xmalloc(pool, 3 * VT_MiB, NULL); /* 4002: granules mapped */
  xfree(pool, small);
  xfree(pool, large);
  VT_OK(vram_empty_cache(pool));
  void *p = NULL;
  VT_EXPECT(vram_malloc(pool, 100 * VT_GiB, NULL, &p), VRAM_ENOMEM); /* 4003 */
  VT_VALID(pool);
  assert_int_equal(g_ctx_calls, 3);
  size_t n = read_all(pool);
  long made = find(n, 0, VRAM_EVENT_SEGMENT_ALLOC, 0);
  assert_true(made >= 0);
  assert_int_equal(g_ev[made].context, 4001);
  assert_int_equal(g_ev[find(n, 0, VRAM_EVENT_SEGMENT_FREE, g_ev[made].addr)].context, 4001);
  assert_int_equal(g_ev[find(n, 0, VRAM_EVENT_SEGMENT_MAP, 0)].context, 4002);
  assert_int_equal(g_ev[find(n, 0, VRAM_EVENT_SEGMENT_UNMAP, 0)].context, 0);
  assert_int_equal(g_ev[find(n, 0, VRAM_EVENT_OOM, 0)].context, 4003);
  assert_int_equal(snapshot_context(pool, small), -1); /* a layout read: of no call */
  VT_OK(vram_history_start(pool, 1000, VRAM_HISTORY_CONTEXTS));
  small = xmalloc(pool, 1000, NULL); /* 4004: its segment is the call's, in snapshots too */
  vram_snapshot_segment_t segs[8];
  vram_snapshot_block_t blocks[64];
  size_t ns = 0, nb = 0;
  VT_OK(vram_snapshot(pool, segs, 8, &ns, blocks, 64, &nb));
  assert_true(ns >= 1 && ns <= 8 && nb <= 64);
  int named = 0;
  for (size_t i = 0; i < ns; i++)
    if (segs[i].addr <= (uintptr_t)small && (uintptr_t)small < segs[i].addr + segs[i].size)
      named += segs[i].context == 4004;
  assert_int_equal(named, 1);
  xfree(pool, small);
  VT_OK(vram_empty_cache(pool));
  n = read_all(pool);
  assert_int_equal(g_ev[find(n, 0, VRAM_EVENT_SNAPSHOT, 0)].context, 0);

  VT_OK(vram_history_start(pool, 1000, VRAM_HISTORY_CONTEXTS | VRAM_HISTORY_FREE_CONTEXTS));
  small = xmalloc(pool, 1000, NULL);     /* 4005 */
  large = xmalloc(pool, 3 * VT_MiB, NULL); /* 4006 */
  xfree(pool, small);                    /* 4007 */
  xfree(pool, large);                    /* 4008 */
  VT_OK(vram_empty_cache(pool));         /* 4009 */
  VT_VALID(pool);
  n = read_all(pool);
  assert_int_equal(g_ev[find(n, 0, VRAM_EVENT_SEGMENT_ALLOC, 0)].context, 4005);
  assert_int_equal(g_ev[find(n, 0, VRAM_EVENT_SEGMENT_MAP, 0)].context, 4006);
  assert_int_equal(g_ev[find(n, 0, VRAM_EVENT_SEGMENT_FREE, 0)].context, 4009);
  assert_int_equal(g_ev[find(n, 0, VRAM_EVENT_SEGMENT_UNMAP, 0)].context, 4009);
  VT_OK(vram_pool_destroy(pool));

  /* A pool that gives memory back at free (release threshold 0): the free's own. */
  vram_options_t o;
  vram_options_init(&o);
  o.source = VRAM_SOURCE_SIM;
  o.sim_capacity = 4 * VT_GiB;
  o.release_threshold = 0;
  pool = g_ctx_pool = vt_pool_from(&o);
  VT_OK(vram_history_start(pool, 1000, VRAM_HISTORY_CONTEXTS | VRAM_HISTORY_FREE_CONTEXTS));
  small = xmalloc(pool, 1000, NULL); /* 4010 */
  xfree(pool, small);                /* 4011 */
  n = read_all(pool);
  assert_int_equal(g_ev[find(n, 0, VRAM_EVENT_SEGMENT_FREE, 0)].context, 4011);
  vram_set_context_fn(NULL, NULL);
  VT_OK(vram_pool_destroy(pool));
}

/* The ring keeps packed slots (a same-stream free is one slot, wide fields aside) and
 * expands them when read: a fixed run of operations read back through rings of every small
 * size gives exactly the tail of the run read through a ring that holds it all, a free's
 * pair split at the ring's edge included, with the overwritten events counted. */
static uint64_t g_wide_calls;

static uint64_t wide_context_fn(void *user) {
  (void)user;
  g_wide_calls++; /* small ids fit a slot, large ones go to the side slots */
  return g_wide_calls % 3 == 0 ? 0xFEDCBA9876543210ull + g_wide_calls : g_wide_calls;
}

static size_t run_mixed(vram_pool_t *pool, size_t max_entries, vram_event_t *out, size_t cap,
                        uint64_t *dropped) {
  g_wide_calls = 0;
  vram_set_context_fn(wide_context_fn, NULL);
  VT_OK(vram_history_start(pool, max_entries, VRAM_HISTORY_CONTEXTS));
  for (int i = 0; i < 24; i++) {
    /* 20 made-up streams: more than the stream table holds, so some go wide. */
    vram_stream_t st = (i % 4 == 3) ? NULL : (vram_stream_t)(uintptr_t)(0x1000 + 0x100 * (i % 20));
    void *p = xmalloc(pool, 512 * (size_t)(i + 1) + 3, st);
    if (i % 5 == 0) VT_OK(vram_history_annotate(pool, i % 2 ? 7 : UINT64_MAX - (uint64_t)i));
    xfree(pool, p);
  }
  size_t count = 0, total = 0;
  VT_OK(vram_history_read(pool, out, cap, &count, &total, dropped));
  VT_OK(vram_history_stop(pool));
  vram_set_context_fn(NULL, NULL);
  assert_int_equal(count, total);
  return count;
}

static void t_packed_slots(void **state) {
  (void)state;
  static vram_event_t all[512], part[16];
  vram_pool_t *pool = sim_pool(VRAM_SOURCE_SIM, 4 * VT_GiB, 0);
  uint64_t dropped = 0;
  /* The pool settles in its first runs (segments made, the peak guard's ceiling found);
   * later runs repeat, event for event. */
  size_t settled = run_mixed(pool, 0, all, 512, &dropped);
  for (int run = 0; run < 8; run++) {
    size_t again = run_mixed(pool, 0, all, 512, &dropped);
    if (again == settled) break;
    settled = again;
  }
  uint64_t before = now_us();
  size_t n = run_mixed(pool, 0, all, 512, &dropped);
  uint64_t after = now_us();
  assert_int_equal(n, settled);
  assert_int_equal(dropped, 0);
  size_t frees = 0, wide_ctx = 0, streams = 0;
  for (size_t i = 0; i < n; i++) {
    assert_true(all[i].time_us >= before && all[i].time_us <= after);
    if (i) assert_true(all[i].time_us >= all[i - 1].time_us);
    assert_int_equal(all[i].device, 3);
    if (all[i].kind == VRAM_EVENT_ALLOC && all[i].context > 0xFFFFFFFFull) wide_ctx++;
    if (all[i].kind == VRAM_EVENT_ALLOC && all[i].stream >= 0x1000 + 0x100 * 15) streams++;
    if (all[i].kind == VRAM_EVENT_ALLOC) assert_int_equal(all[i].requested % 512, 3);
    if (all[i].kind != VRAM_EVENT_FREE_REQUESTED) continue;
    /* A same-stream free: its two events, back to back, alike but for the kind. */
    frees++;
    assert_true(i + 1 < n);
    vram_event_t a = all[i], b = all[i + 1];
    assert_int_equal(b.kind, VRAM_EVENT_FREE_COMPLETED);
    b.kind = a.kind;
    assert_memory_equal(&a, &b, sizeof a);
    long alloc = (long)i; /* its allocation: the last one at that address */
    while (--alloc >= 0 && !(all[alloc].kind == VRAM_EVENT_ALLOC && all[alloc].addr == a.addr)) {}
    assert_true(alloc >= 0);
    assert_int_equal(a.requested, all[alloc].requested);
    assert_int_equal(a.stream, all[alloc].stream);
    assert_int_equal(a.context, all[alloc].context);
  }
  assert_int_equal(frees, 24);
  assert_true(wide_ctx >= 8 && streams >= 1);
  for (size_t k = 1; k <= 16; k++) {
    size_t got = run_mixed(pool, k, part, 16, &dropped);
    assert_int_equal(got, k);
    assert_int_equal(dropped, n - k);
    for (size_t i = 0; i < k; i++) {
      vram_event_t x = part[i], y = all[n - k + i];
      x.time_us = y.time_us = 0;
      assert_memory_equal(&x, &y, sizeof x);
    }
  }
  VT_VALID(pool);
  VT_OK(vram_pool_destroy(pool));
}

/* The recorder itself, below the pool: the same events read back exact for a device that
 * fits the packed word (255 the last) and for ones past it, whose events all go to the
 * side slots; a slack or a context too large for a slot goes wide alone. And a tick older
 * than the one before it (a lock handed between threads, the TSC read without a barrier)
 * reads back at that one's time, so that times never go backwards. */
static void t_recorder(void **state) {
  (void)state;
  vram_history *h = NULL;
  VT_OK(_vram_history_new(&h));
  const int devices[] = {0, 3, 255, 256, 300};
  for (size_t d = 0; d < sizeof devices / sizeof *devices; d++) {
    VT_OK(_vram_history_begin(h, 6, devices[d]));
    _vram_history_record(h, VRAM_EVENT_ALLOC, 0x1000, 1024, 1000, 0, 5);
    _vram_history_record(h, VRAM_HSLOT_FREE_PAIR, 0x1000, 1024, 1000, 0x77, 5);
    _vram_history_record(h, VRAM_EVENT_ALLOC, 0x2000, (uint64_t)1 << 30, 1, 0x77, 0);
    _vram_history_record(h, VRAM_EVENT_ALLOC, 0x3000, 512, 512, 0x77, (uint64_t)1 << 40);
    _vram_history_record(h, VRAM_EVENT_FREE_REQUESTED, 0x3000, 512, 512, 0x88, 9);
    _vram_history_end(h);
    vram_event_t ev[8];
    size_t count = 0, total = 0;
    uint64_t dropped = 9;
    _vram_history_copy(h, ev, 8, &count, &total, &dropped);
    assert_int_equal(count, 6);
    assert_int_equal(total, 6);
    assert_int_equal(dropped, 0);
    const vram_event_t want[6] = {
        {.kind = VRAM_EVENT_ALLOC, .addr = 0x1000, .size = 1024, .requested = 1000, .context = 5},
        {.kind = VRAM_EVENT_FREE_REQUESTED, .addr = 0x1000, .size = 1024, .requested = 1000,
         .stream = 0x77, .context = 5},
        {.kind = VRAM_EVENT_FREE_COMPLETED, .addr = 0x1000, .size = 1024, .requested = 1000,
         .stream = 0x77, .context = 5},
        {.kind = VRAM_EVENT_ALLOC, .addr = 0x2000, .size = (uint64_t)1 << 30, .requested = 1,
         .stream = 0x77},
        {.kind = VRAM_EVENT_ALLOC, .addr = 0x3000, .size = 512, .requested = 512,
         .stream = 0x77, .context = (uint64_t)1 << 40},
        {.kind = VRAM_EVENT_FREE_REQUESTED, .addr = 0x3000, .size = 512, .requested = 512,
         .stream = 0x88, .context = 9},
    };
    for (size_t i = 0; i < 6; i++) {
      vram_event_t x = want[i], y = ev[i];
      x.device = devices[d];
      if (i) assert_true(y.time_us >= ev[i - 1].time_us);
      x.time_us = y.time_us = 0;
      assert_memory_equal(&x, &y, sizeof x);
    }
  }
  /* Ticks out of order: the later slot's older tick reads back at the earlier one's time. */
  VT_OK(_vram_history_begin(h, 4, 3));
  uint64_t t = h->tick0, late = h->use_tsc ? 3000000000u : 1000000000u;
  _vram_history_put(h, t + late, VRAM_EVENT_ALLOC, 0x1000, 512, 512, 0, 0);
  _vram_history_put(h, t + 1, VRAM_HSLOT_FREE_PAIR, 0x1000, 512, 512, 0, 0);
  _vram_history_end(h);
  vram_event_t ev[4];
  size_t count = 0;
  _vram_history_copy(h, ev, 4, &count, NULL, NULL);
  assert_int_equal(count, 3);
  assert_true(ev[0].time_us > 0);
  assert_int_equal(ev[1].time_us, ev[0].time_us);
  assert_int_equal(ev[2].time_us, ev[0].time_us);
  _vram_history_free(h);
}

static void t_bad_input(void **state) {
  (void)state;
  vram_event_t ev[4];
  size_t count = 7, total = 7;
  uint64_t dropped = 7;
  VT_EXPECT(vram_history_start(NULL, 0, 0), VRAM_EINVAL);
  VT_EXPECT(vram_history_stop(NULL), VRAM_EINVAL);
  VT_EXPECT(vram_history_read(NULL, ev, 4, &count, &total, &dropped), VRAM_EINVAL);
  VT_EXPECT(vram_history_annotate(NULL, 1), VRAM_EINVAL);
  VT_EXPECT(vram_snapshot(NULL, NULL, 0, NULL, NULL, 0, NULL), VRAM_EINVAL);
  vram_pool_t *pool = sim_pool(VRAM_SOURCE_SIM, 4 * VT_GiB, 0);
  void *p = xmalloc(pool, 4096, NULL);
  /* Never started: nothing held, and no error. */
  VT_OK(vram_history_read(pool, ev, 4, &count, &total, &dropped));
  assert_int_equal(count + total + dropped, 0);
  VT_OK(vram_history_stop(pool));
  VT_OK(vram_history_annotate(pool, 5));
  VT_VALID(pool);
  VT_EXPECT(vram_history_read(pool, NULL, 4, &count, &total, &dropped), VRAM_EINVAL);
  VT_VALID(pool);
  VT_EXPECT(vram_snapshot(pool, NULL, 1, &count, NULL, 0, &total), VRAM_EINVAL);
  VT_EXPECT(vram_snapshot(pool, NULL, 0, &count, NULL, 1, &total), VRAM_EINVAL);
  VT_VALID(pool);
  VT_EXPECT(vram_history_start(pool, SIZE_MAX, 0), VRAM_EHOSTMEM);
  VT_VALID(pool);
  VT_EXPECT(vram_history_start(pool, (size_t)1 << 40, 0), VRAM_EHOSTMEM);
  VT_EXPECT(vram_history_start(pool, 0, 0x80u), VRAM_EINVAL);
  VT_VALID(pool);
  /* None of that started anything. */
  xfree(pool, p);
  VT_OK(vram_history_read(pool, ev, 4, &count, &total, &dropped));
  assert_int_equal(total, 0);
  /* A failed start while recording keeps what was recorded. */
  VT_OK(vram_history_start(pool, 4, 0));
  p = xmalloc(pool, 4096, NULL);
  VT_EXPECT(vram_history_start(pool, SIZE_MAX / 2, 0), VRAM_EHOSTMEM);
  VT_VALID(pool);
  VT_OK(vram_history_read(pool, ev, 4, &count, &total, &dropped));
  assert_true(total >= 1);
  xfree(pool, p);
  /* All out pointers NULL. */
  VT_OK(vram_history_read(pool, NULL, 0, NULL, NULL, NULL));
  VT_OK(vram_snapshot(pool, NULL, 0, NULL, NULL, 0, NULL));
  VT_VALID(pool);
  VT_OK(vram_pool_destroy(pool));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_event_kinds),   cmocka_unit_test(t_pending_free),
      cmocka_unit_test(t_vmm_map_unmap), cmocka_unit_test(t_oom),
      cmocka_unit_test(t_overflow_and_short_read), cmocka_unit_test(t_contexts),
      cmocka_unit_test(t_contexts_after_stop), cmocka_unit_test(t_free_contexts_and_a_kept_ring),
      cmocka_unit_test(t_segment_events_carry_their_call),
      cmocka_unit_test(t_packed_slots),  cmocka_unit_test(t_recorder),
      cmocka_unit_test(t_bad_input),
  };
  return cmocka_run_group_tests_name("history", tests, NULL, NULL);
}

/* test_threads.c - eight threads hammering one shared pool.
 *
 * Each thread has its own stream handle (sim) and a private list of live blocks; it
 * mallocs random sizes (log-uniform 1 B..4 MiB), frees, records its blocks on a
 * neighbour's stream now and then, and occasionally calls empty_cache, reset_peak and
 * get_stats, which take the same lock. After every operation the thread runs the
 * invariant checker (under the pool lock); after each malloc it checks, through
 * block_info, that the block carries its requested size and its stream: a block handed
 * to two threads at once would show the other thread's values. Every few thousand
 * operations all threads meet at a barrier and one of them checks the whole pool: the
 * invariant checker, for_each_block against the union of the threads' lists, no overlap
 * between any two live blocks, and the statistics. At the end everything is freed: zero
 * allocated, counters equal to the sums of the threads' counts, pool valid.
 * Source: argv[1] ("sim" or "sim:vmm"); VRAMKIT_TEST_OPS sets the operations per thread.
 */
#include "vt.h"

#include <pthread.h>

enum { NTHREADS = 8, TLIVE = 48, CHECK_EVERY = 2500 };

typedef struct tstate {
  int id;
  vram_pool_t *pool;
  vram_stream_t stream;
  uint64_t ops;
  vt_blk live[TLIVE];
  size_t nlive;
  uint64_t mallocs, frees, ooms;
  int64_t sum_req;
  char error[256]; /* first failure, reported by main (cmocka asserts are not thread-safe) */
} tstate;

static pthread_barrier_t barrier;
static tstate threads[NTHREADS];
static volatile int any_error;
static char check_error[256];

#define T_FAIL(t, ...)                                                                    \
  do {                                                                                    \
    if (!(t)->error[0]) snprintf((t)->error, sizeof (t)->error, __VA_ARGS__);             \
    any_error = 1;                                                                        \
  } while (0)

/* Run by one thread while the others wait at the barrier. */
static void check_all(vram_pool_t *pool) {
  if (check_error[0]) return;
  if (!_vram_pool_is_valid(pool)) {
    snprintf(check_error, sizeof check_error, "_vram_pool_is_valid failed");
    return;
  }
  size_t total = 0;
  int64_t sum_req = 0, sum_round = 0;
  for (int t = 0; t < NTHREADS; t++) {
    total += threads[t].nlive;
    for (size_t i = 0; i < threads[t].nlive; i++) {
      sum_req += (int64_t)threads[t].live[i].req;
      sum_round += (int64_t)vt_round512(threads[t].live[i].req);
    }
  }
  vt_blkset set = {NULL, 0, 0};
  vram_for_each_block(pool, vt_collect_fn, &set);
  if (set.n > 1) qsort(set.v, set.n, sizeof *set.v, vt_blk_cmp);
  if (set.n != total)
    snprintf(check_error, sizeof check_error, "for_each_block: %zu blocks, threads hold %zu",
             set.n, total);
  for (size_t i = 1; i < set.n && !check_error[0]; i++)
    if ((uintptr_t)set.v[i - 1].ptr + set.v[i - 1].size > (uintptr_t)set.v[i].ptr)
      snprintf(check_error, sizeof check_error, "live blocks %p and %p overlap",
               set.v[i - 1].ptr, set.v[i].ptr);
  for (int t = 0; t < NTHREADS && !check_error[0]; t++)
    for (size_t i = 0; i < threads[t].nlive; i++) {
      vt_blk key = threads[t].live[i];
      const vt_blk *b = bsearch(&key, set.v, set.n, sizeof *set.v, vt_blk_cmp);
      if (!b || b->req != key.req || b->stream != key.stream) {
        snprintf(check_error, sizeof check_error, "thread %d's block %p missing or changed", t,
                 key.ptr);
        break;
      }
    }
  free(set.v);
  vram_stats_t s;
  vram_get_stats(pool, &s);
  if (!check_error[0] && (s.requested_bytes.current != sum_req ||
                          s.allocated_bytes.current != sum_round ||
                          s.allocation.current != (int64_t)total))
    snprintf(check_error, sizeof check_error,
             "stats requested %lld allocated %lld blocks %lld; threads %lld %lld %zu",
             (long long)s.requested_bytes.current, (long long)s.allocated_bytes.current,
             (long long)s.allocation.current, (long long)sum_req, (long long)sum_round, total);
}

static void *worker(void *arg) {
  tstate *t = (tstate *)arg;
  vt_rng rng;
  vt_rng_seed(&rng, 4242 + (uint64_t)t->id);
  for (uint64_t op = 1; op <= t->ops; op++) {
    uint64_t r = vt_rng_below(&rng, 1000);
    if (r < 500 && t->nlive < TLIVE) {
      size_t size = vt_rng_logsize(&rng, 1, 4 << 20);
      void *p = NULL;
      int rc = vram_malloc(t->pool, size, t->stream, &p);
      if (rc == VRAM_ENOMEM) {
        t->ooms++;
      } else if (rc != VRAM_OK || !p || (uintptr_t)p % 512) {
        T_FAIL(t, "thread %d: malloc(%zu) = %s, %p", t->id, size, vram_errname(rc), p);
      } else {
        size_t req = 0;
        vram_stream_t s = NULL;
        rc = vram_block_info(t->pool, p, &req, &s);
        if (rc || req != size || s != t->stream)
          T_FAIL(t, "thread %d: fresh block %p shows %s req %zu stream %p (want %zu %p)", t->id,
                 p, vram_errname(rc), req, s, size, t->stream);
        for (size_t i = 0; i < t->nlive; i++) {
          uintptr_t a = (uintptr_t)p, b = (uintptr_t)t->live[i].ptr;
          if (a < b + t->live[i].req && b < a + size)
            T_FAIL(t, "thread %d: %p overlaps its own %p", t->id, p, t->live[i].ptr);
        }
        t->live[t->nlive++] = (vt_blk){p, size, vt_round512(size), t->stream};
        t->mallocs++;
        t->sum_req += (int64_t)size;
      }
    } else if (r < 960 && t->nlive) {
      size_t i = (size_t)vt_rng_below(&rng, t->nlive);
      vt_blk b = t->live[i];
      size_t req = 0;
      vram_stream_t s = NULL;
      int rc = vram_block_info(t->pool, b.ptr, &req, &s);
      if (rc || req != b.req || s != b.stream)
        T_FAIL(t, "thread %d: block %p changed under it (%s, %zu, %p)", t->id, b.ptr,
               vram_errname(rc), req, s);
      if (vt_rng_below(&rng, 8) == 0) {
        vram_stream_t other = threads[(t->id + 1) % NTHREADS].stream;
        rc = vram_record_stream(t->pool, b.ptr, other);
        if (rc) T_FAIL(t, "thread %d: record_stream = %s", t->id, vram_errname(rc));
      }
      rc = vram_free(t->pool, b.ptr);
      if (rc) T_FAIL(t, "thread %d: free(%p) = %s", t->id, b.ptr, vram_errname(rc));
      t->live[i] = t->live[--t->nlive];
      t->frees++;
      t->sum_req -= (int64_t)b.req;
    } else if (r < 970) {
      int rc = vram_empty_cache(t->pool);
      if (rc) T_FAIL(t, "thread %d: empty_cache = %s", t->id, vram_errname(rc));
    } else if (r < 975) {
      int rc = vram_reset_peak_stats(t->pool);
      if (rc) T_FAIL(t, "thread %d: reset_peak = %s", t->id, vram_errname(rc));
    } else if (r < 990) {
      vram_stats_t s;
      int rc = vram_get_stats(t->pool, &s);
      if (rc || s.allocated_bytes.current < 0 || s.reserved_bytes.current < s.allocated_bytes.current)
        T_FAIL(t, "thread %d: inconsistent stats", t->id);
    } else {
      char buf[512];
      if (vram_stats_json(t->pool, buf, sizeof buf) <= 0)
        T_FAIL(t, "thread %d: stats_json failed", t->id);
    }
    /* The checker takes the pool lock: it sees the pool between other threads' calls. */
    if (!_vram_pool_is_valid(t->pool)) T_FAIL(t, "thread %d: invalid pool after op %llu", t->id,
                                               (unsigned long long)op);
    if (op % CHECK_EVERY == 0) {
      if (pthread_barrier_wait(&barrier) == PTHREAD_BARRIER_SERIAL_THREAD) check_all(t->pool);
      pthread_barrier_wait(&barrier);
    }
  }
  for (size_t i = 0; i < t->nlive; i++) {
    int rc = vram_free(t->pool, t->live[i].ptr);
    if (rc) T_FAIL(t, "thread %d: final free = %s", t->id, vram_errname(rc));
    t->frees++;
    t->sum_req -= (int64_t)t->live[i].req;
  }
  t->nlive = 0;
  return NULL;
}

static const char *g_source = "sim";

static void t_eight_threads(void **state) {
  (void)state;
  vram_source_kind kind;
  VT_OK(vram_source_parse(g_source, &kind));
  vram_options_t o;
  vram_options_init(&o);
  o.source = kind;
  o.sim_capacity = 2 * VT_GiB; /* 8 x 48 x up to 4 MiB can exceed it: some OOMs happen */
  o.sim_event_delay = 2;
  vram_pool_t *pool = NULL;
  VT_OK(vram_pool_create(&pool, &o));
  uint64_t ops = 25000;
  const char *env = getenv("VRAMKIT_TEST_OPS");
  if (env && *env) ops = strtoull(env, NULL, 10);
  ops = (ops + CHECK_EVERY - 1) / CHECK_EVERY * CHECK_EVERY;
  assert_int_equal(pthread_barrier_init(&barrier, NULL, NTHREADS), 0);
  pthread_t tid[NTHREADS];
  for (int i = 0; i < NTHREADS; i++) {
    memset(&threads[i], 0, sizeof threads[i]);
    threads[i].id = i;
    threads[i].pool = pool;
    threads[i].stream = VT_STREAM(0x100 + i);
    threads[i].ops = ops;
  }
  for (int i = 0; i < NTHREADS; i++)
    assert_int_equal(pthread_create(&tid[i], NULL, worker, &threads[i]), 0);
  for (int i = 0; i < NTHREADS; i++) assert_int_equal(pthread_join(tid[i], NULL), 0);
  pthread_barrier_destroy(&barrier);
  for (int i = 0; i < NTHREADS; i++)
    if (threads[i].error[0]) fail_msg("%s", threads[i].error);
  if (check_error[0]) fail_msg("pool check at a barrier: %s", check_error);
  assert_false(any_error);

  VT_VALID(pool);
  uint64_t mallocs = 0, frees = 0, ooms = 0;
  for (int i = 0; i < NTHREADS; i++) {
    mallocs += threads[i].mallocs;
    frees += threads[i].frees;
    ooms += threads[i].ooms;
    assert_int_equal(threads[i].sum_req, 0);
  }
  vram_stats_t s = vt_stats(pool);
  assert_int_equal(s.num_mallocs, mallocs);
  assert_int_equal(s.num_frees, frees);
  assert_int_equal(mallocs, frees);
  assert_int_equal(s.num_ooms, ooms);
  assert_true(mallocs > (uint64_t)NTHREADS * ops / 4);
  assert_int_equal(s.allocated_bytes.current, 0);
  assert_int_equal(s.requested_bytes.current, 0);
  assert_int_equal(s.allocation.current, 0);
  assert_true(s.allocated_bytes.peak > 0);
  VT_OK(vram_empty_cache(pool));
  VT_VALID(pool);
  s = vt_stats(pool);
  assert_int_equal(s.active_bytes.current, 0);
  assert_int_equal(s.reserved_bytes.current, 0);
  VT_OK(vram_pool_destroy(pool));
}

int main(int argc, char **argv) {
  if (argc > 1) g_source = argv[1];
  const struct CMUnitTest tests[] = {cmocka_unit_test(t_eight_threads)};
  char group[64];
  snprintf(group, sizeof group, "threads[%s]", g_source);
  return cmocka_run_group_tests_name(group, tests, NULL, NULL) ? 1 : 0;
}

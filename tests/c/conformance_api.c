/* conformance_api.c - conformance tests of the calls about the pool: block_info,
 * for_each_block, the summary and the JSON statistics, destroy with live blocks,
 * mem_get_info and device counts. test_conformance.c says how the suite runs. */
#include "conformance.h"

/* A tiny JSON validator: one value, then only white space. Returns 1 if valid. */
typedef struct json_cur {
  const char *p;
  int depth;
} json_cur;

static void json_ws(json_cur *c) {
  while (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r') c->p++;
}

static int json_value(json_cur *c);

static int json_string(json_cur *c) {
  if (*c->p != '"') return 0;
  c->p++;
  while (*c->p && *c->p != '"') {
    if ((unsigned char)*c->p < 0x20) return 0;
    if (*c->p == '\\') {
      c->p++;
      if (*c->p == 'u') {
        for (int i = 1; i <= 4; i++)
          if (!isxdigit((unsigned char)c->p[i])) return 0;
        c->p += 4;
      } else if (!strchr("\"\\/bfnrt", *c->p) || !*c->p) {
        return 0;
      }
    }
    c->p++;
  }
  if (*c->p != '"') return 0;
  c->p++;
  return 1;
}

static int json_number(json_cur *c) {
  const char *s = c->p;
  if (*c->p == '-') c->p++;
  if (!isdigit((unsigned char)*c->p)) return 0;
  if (*c->p == '0') c->p++;
  else
    while (isdigit((unsigned char)*c->p)) c->p++;
  if (*c->p == '.') {
    c->p++;
    if (!isdigit((unsigned char)*c->p)) return 0;
    while (isdigit((unsigned char)*c->p)) c->p++;
  }
  if (*c->p == 'e' || *c->p == 'E') {
    c->p++;
    if (*c->p == '+' || *c->p == '-') c->p++;
    if (!isdigit((unsigned char)*c->p)) return 0;
    while (isdigit((unsigned char)*c->p)) c->p++;
  }
  return c->p > s;
}

static int json_value(json_cur *c) {
  json_ws(c);
  if (++c->depth > 64) return 0;
  int ok = 0;
  if (*c->p == '{' || *c->p == '[') {
    char close = *c->p == '{' ? '}' : ']';
    int is_obj = close == '}';
    c->p++;
    json_ws(c);
    if (*c->p == close) {
      c->p++;
      ok = 1;
    } else {
      for (;;) {
        if (is_obj) {
          json_ws(c);
          if (!json_string(c)) break;
          json_ws(c);
          if (*c->p != ':') break;
          c->p++;
        }
        if (!json_value(c)) break;
        json_ws(c);
        if (*c->p == ',') {
          c->p++;
          continue;
        }
        if (*c->p == close) {
          c->p++;
          ok = 1;
        }
        break;
      }
    }
  } else if (*c->p == '"') {
    ok = json_string(c);
  } else if (!strncmp(c->p, "true", 4)) {
    c->p += 4, ok = 1;
  } else if (!strncmp(c->p, "false", 5)) {
    c->p += 5, ok = 1;
  } else if (!strncmp(c->p, "null", 4)) {
    c->p += 4, ok = 1;
  } else {
    ok = json_number(c);
  }
  c->depth--;
  return ok;
}

static int json_is_single_object(const char *text) {
  json_cur c = {text, 0};
  json_ws(&c);
  if (*c.p != '{') return 0;
  if (!json_value(&c)) return 0;
  json_ws(&c);
  return *c.p == '\0';
}

void t_block_info(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_default();
  vram_stream_t s = g_src.is_sim ? VT_STREAM(0x77) : NULL;
  void *a = conf_malloc(pool, 12345, NULL);
  void *b = conf_malloc(pool, 5 << 20, s);
  expect_info(pool, a, 12345, NULL);
  expect_info(pool, b, 5 << 20, s);
  size_t r = 0;
  VT_OK(vram_block_info(pool, a, &r, NULL)); /* out arguments are optional */
  assert_int_equal(r, 12345);
  VT_OK(vram_block_info(pool, b, NULL, NULL));
  conf_free(pool, a);
  assert_int_not_equal(vram_block_info(pool, a, &r, NULL), VRAM_OK);
  VT_VALID(pool);
  expect_info(pool, b, 5 << 20, s);
  conf_free(pool, b);
  conf_destroy(pool);
}

void t_for_each_block(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_default();
  enum { N = 24 };
  void *p[N];
  size_t req[N];
  vt_rng rng;
  vt_rng_seed(&rng, 7);
  for (int i = 0; i < N; i++) {
    req[i] = vt_rng_logsize(&rng, 1, 8 << 20);
    vram_stream_t s = g_src.is_sim ? VT_STREAM(1 + i % 3) : NULL;
    p[i] = conf_malloc(pool, req[i], s);
  }
  for (int i = 0; i < N; i += 3) conf_free(pool, p[i]);
  vt_blkset set = vt_collect(pool);
  assert_int_equal(set.n, N - (N + 2) / 3);
  int64_t sum = 0;
  for (int i = 0; i < N; i++) {
    const vt_blk *b = vt_blkset_find(&set, p[i]);
    if (i % 3 == 0) {
      assert_null(b);
      continue;
    }
    assert_non_null(b);
    assert_int_equal(b->req, req[i]);
    assert_int_equal(b->size, vt_round512(req[i]));
    assert_ptr_equal(b->stream, g_src.is_sim ? VT_STREAM(1 + i % 3) : NULL);
    sum += (int64_t)b->size;
  }
  for (size_t i = 1; i < set.n; i++) /* distinct and not overlapping */
    assert_true((uintptr_t)set.v[i - 1].ptr + set.v[i - 1].size <= (uintptr_t)set.v[i].ptr);
  vt_blkset_free(&set);
  assert_int_equal(vt_stats(pool).allocated_bytes.current, sum);
  for (int i = 0; i < N; i++)
    if (i % 3) conf_free(pool, p[i]);
  set = vt_collect(pool);
  assert_int_equal(set.n, 0);
  vt_blkset_free(&set);
  conf_destroy(pool);
}

void t_summary_and_json(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_default();
  void *a = conf_malloc(pool, 3 << 20, NULL);
  void *b = conf_malloc(pool, 1536, NULL);
  vram_stats_t s = vt_stats(pool);
  assert_int_equal(s.allocated_bytes.current, (3 << 20) + 1536);

  char small[8];
  int need = vram_summary(pool, small, sizeof small);
  assert_true(need > (int)sizeof small);
  assert_int_equal(strlen(small), sizeof small - 1);
  char *text = malloc((size_t)need + 1);
  assert_non_null(text);
  assert_int_equal(vram_summary(pool, text, (size_t)need + 1), need);
  assert_int_equal(strlen(text), (size_t)need);
  assert_true(vt_contains_ci(text, "allocated"));
  assert_true(vt_contains_ci(text, "reserved"));
  free(text);
  VT_VALID(pool);

  need = vram_stats_json(pool, small, sizeof small);
  assert_true(need > (int)sizeof small);
  assert_int_equal(strlen(small), sizeof small - 1);
  char *json = malloc((size_t)need + 1);
  assert_non_null(json);
  assert_int_equal(vram_stats_json(pool, json, (size_t)need + 1), need);
  assert_int_equal(strlen(json), (size_t)need);
  if (!json_is_single_object(json)) fail_msg("stats_json is not one JSON object:\n%s", json);
#define CHECK_KEY(name, doc) assert_non_null(strstr(json, "\"" #name "\""));
  VRAM_STAT_LIST(CHECK_KEY)
  VRAM_COUNTER_LIST(CHECK_KEY)
#undef CHECK_KEY
  char num[32];
  snprintf(num, sizeof num, "%lld", (long long)s.allocated_bytes.current);
  assert_non_null(strstr(json, num));
  free(json);
  VT_VALID(pool);
  conf_free(pool, a);
  conf_free(pool, b);
  conf_destroy(pool);
}

void t_destroy_busy(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_default();
  void *a = conf_malloc(pool, 4000, NULL);
  void *b = conf_malloc(pool, 6 << 20, NULL);
  vram_stats_t before = vt_stats(pool);
  VT_EXPECT(vram_pool_destroy(pool), VRAM_EBUSY);
  VT_VALID(pool);
  vram_stats_t after = vt_stats(pool);
  assert_int_equal(after.reserved_bytes.current, before.reserved_bytes.current);
  assert_int_equal(after.num_device_free, before.num_device_free);
  expect_info(pool, a, 4000, NULL);
  expect_info(pool, b, 6 << 20, NULL);
  void *c = conf_malloc(pool, 1 << 20, NULL);
  conf_free(pool, a);
  VT_EXPECT(vram_pool_destroy(pool), VRAM_EBUSY);
  VT_VALID(pool);
  conf_free(pool, b);
  conf_free(pool, c);
  conf_destroy(pool);

  /* destroy_force frees live blocks (the sanitizer build checks that nothing leaks). */
  pool = conf_pool_default();
  for (int i = 0; i < 10; i++) (void)conf_malloc(pool, (size_t)(i + 1) * 300000, NULL);
  conf_force(pool);
}

void t_mem_info(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_default();
  size_t fr = 0, total = 0;
  VT_OK(vram_mem_get_info(pool, &fr, &total));
  assert_true(total > 0);
  assert_true(fr <= total);
  if (g_src.is_sim) {
    assert_int_equal(total, 4 * VT_GiB);
    void *p = conf_malloc(pool, 100 * VT_MiB, NULL);
    size_t fr2 = 0, total2 = 0;
    VT_OK(vram_mem_get_info(pool, &fr2, &total2));
    assert_int_equal(total2, total);
    assert_true(fr2 + (size_t)vt_stats(pool).reserved_bytes.current <= total);
    assert_true(fr2 <= fr - 100 * VT_MiB);
    conf_free(pool, p);
  }
  conf_destroy(pool);
}

void t_devices(void **state) {
  (void)state;
  need_sim();
  int count = 0;
  VT_OK(vram_device_count(g_src.kind, &count));
  assert_int_equal(count, 8);
  vram_options_t o;
  conf_opts(&o);
  o.device = 7;
  vram_pool_t *pool = conf_pool(&o);
  assert_int_equal(vram_pool_device(pool), 7);
  void *p = conf_malloc(pool, 1000, NULL);
  conf_free(pool, p);
  conf_destroy(pool);
}

/* The state vram_snapshot reports for the block at p (-1: not the start of any block). */
static int snapshot_state(vram_pool_t *pool, void *p, uint64_t *requested) {
  size_t ns = 0, nb = 0;
  VT_OK(vram_snapshot(pool, NULL, 0, &ns, NULL, 0, &nb));
  vram_snapshot_segment_t *segs = calloc(ns, sizeof *segs);
  vram_snapshot_block_t *blocks = calloc(nb, sizeof *blocks);
  VT_OK(vram_snapshot(pool, segs, ns, &ns, blocks, nb, &nb));
  int state = -1;
  for (size_t i = 0; i < nb; i++)
    if (blocks[i].addr == (uint64_t)(uintptr_t)p) {
      state = blocks[i].state;
      if (requested) *requested = blocks[i].requested;
    }
  free(segs);
  free(blocks);
  return state;
}

/* Blocks tile every segment of the snapshot, in every state, on every source; the states
 * and totals agree with the statistics (vt.h); a cap too small returns the totals only. */
void t_snapshot_tiles(void **state) {
  (void)state;
  vram_pool_t *pool = conf_pool_default();
  VT_TILES(pool);
  static const size_t sizes[] = {1000, 4096, 700 << 10, 3 << 20, 5000, 33 << 20, 512};
  enum { N = sizeof sizes / sizeof *sizes };
  void *p[N];
  for (int i = 0; i < N; i++) {
    /* A made-up stream handle only where no real driver sees it (as above). */
    p[i] = conf_malloc(pool, sizes[i], i % 2 && g_src.is_sim ? VT_STREAM(0x2001) : NULL);
    VT_TILES(pool);
  }
  uint64_t req = 0;
  assert_int_equal(snapshot_state(pool, p[3], &req), VRAM_SNAPSHOT_ACTIVE_ALLOCATED);
  assert_int_equal(req, sizes[3]);
  for (int i = 0; i < N; i += 2) {
    conf_free(pool, p[i]);
    VT_TILES(pool);
  }
  /* Eleven small blocks, all freed but the sixth (the last one freed is parked in its
   * arena's cache): the segment reads as free, used, free, as PyTorch's snapshot reads. */
  void *small[11];
  for (int i = 0; i < 11; i++) small[i] = conf_malloc(pool, 512, NULL);
  for (int i = 0; i < 11; i++)
    if (i != 5) conf_free(pool, small[i]);
  VT_TILES(pool);
  assert_int_equal(snapshot_state(pool, small[5], NULL), VRAM_SNAPSHOT_ACTIVE_ALLOCATED);
  assert_int_equal(snapshot_state(pool, small[6], NULL), VRAM_SNAPSHOT_INACTIVE);
  for (int i = 7; i < 11; i++) /* inside the one free block after it */
    assert_int_equal(snapshot_state(pool, small[i], NULL), -1);
  conf_free(pool, small[5]);
  VT_TILES(pool);
  /* The block just freed is parked in its arena's cache or merged: inactive either way. */
  int st = snapshot_state(pool, p[N - 1], NULL);
  assert_true(st == VRAM_SNAPSHOT_INACTIVE || st == -1);
  /* Totals only when a cap is short; the arrays are not written. */
  size_t ns = 0, nb = 0;
  VT_OK(vram_snapshot(pool, NULL, 0, &ns, NULL, 0, &nb));
  assert_true(ns >= 1 && nb >= ns);
  vram_snapshot_segment_t seg = {.addr = 12345};
  vram_snapshot_block_t blk = {.addr = 6789};
  size_t ns2 = 0, nb2 = 0;
  VT_OK(vram_snapshot(pool, &seg, 1, &ns2, &blk, nb > 1 ? 1 : 0, &nb2));
  assert_int_equal(ns2, ns);
  assert_int_equal(nb2, nb);
  if (nb > 1) assert_int_equal(blk.addr, 6789);
  if (g_src.is_sim) {
    /* A cross-stream free waits, and shows as pending until its event completes. */
    vram_pool_t *ev = conf_pool_events(1000, 0);
    void *q = conf_malloc(ev, 8192, NULL);
    VT_OK(vram_record_stream(ev, q, VT_STREAM(0x3003)));
    conf_free(ev, q);
    assert_int_equal(snapshot_state(ev, q, &req), VRAM_SNAPSHOT_ACTIVE_PENDING_FREE);
    assert_int_equal(req, 8192);
    VT_TILES(ev);
    VT_OK(vram_empty_cache(ev));
    VT_TILES(ev);
    conf_destroy(ev);
  }
  for (int i = 1; i < N; i += 2) {
    conf_free(pool, p[i]);
    VT_TILES(pool);
  }
  VT_OK(vram_empty_cache(pool));
  VT_TILES(pool);
  conf_destroy(pool);
}

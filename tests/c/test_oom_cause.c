/* test_oom_cause.c - the OOM report's cause line: "  cause: <kind>: <sentence>", right
 * after the headline, with exactly one kind; and the figures it is written from
 * (vram_oom_info_t, vram_oom_info, vram_oom_classify), checked beside the text.
 *
 * Two layers. The formatter is a pure function of a snapshot, so every boundary and every
 * precedence between the kinds is planted there directly (numbers a real pool would take
 * long to reach). Then one real pool per kind: on sim with a capacity and a limit for
 * fragmentation, limit and live, and through the fake driver for others, where a second
 * pool in this process holds device memory the way another process would (the fake
 * driver's capacity is process-wide; sim's is per pool, so sim cannot plant a neighbour).
 * After each real OOM the pool must be valid and its live blocks untouched.
 *
 *   test_oom_cause          the formatter and the sim pools
 *   test_oom_cause cuda     others, through the fake driver (on LD_LIBRARY_PATH first)
 */
#include "vt.h"

#include "obs/format.h"

/* ---- the formatter, on planted snapshots ---------------------------------------------- */

/* A fixed-segment snapshot of device 0 on "sim" with these figures; the rest zero. */
typedef struct planted {
  size_t total, device_free, limit, reserved, allocated, cached, largest, granularity;
} planted;

static vram_pool_snapshot plant(planted p) {
  vram_pool_snapshot snap;
  memset(&snap, 0, sizeof snap);
  snap.device = 0;
  snap.source_name = "sim";
  snap.tight_threshold = 1.0;
  snap.virtual_threshold = 1.0;
  snap.device_total = p.total;
  snap.device_free = p.device_free;
  snap.cached_free = p.cached;
  snap.stats.limit_bytes = p.limit;
  snap.stats.reserved_bytes.current = (int64_t)p.reserved;
  snap.stats.allocated_bytes.current = (int64_t)p.allocated;
  snap.stats.largest_free_block = p.largest;
  snap.granularity = p.granularity;
  snap.stats.fragmentation = p.cached ? 1.0 - (double)p.largest / (double)p.cached : 0.0;
  return snap;
}

/* The report of a request of `size` against the planted figures. */
static void report_of(planted p, size_t size, size_t max_request, char *buf, size_t cap) {
  vram_pool_snapshot snap = plant(p);
  vram_oom_request req = {.size = size, .stream = NULL, .max_request = max_request};
  vram_oom_info_t info;
  _vram_oom_info_fill(&snap, &req, &info);
  int n = _vram_format_oom_report(&snap, &req, &info, buf, cap);
  assert_true(n > 0);
  assert_true((size_t)n < cap);
  assert_int_equal((size_t)n, strlen(buf));
}

/* The cause line is the second line, names `kind`, and is the only cause line. */
static void expect_cause(const char *report, const char *kind) {
  const char *second = strchr(report, '\n');
  char want[64];
  snprintf(want, sizeof want, "\n  cause: %s: ", kind);
  if (!second || strncmp(second, want, strlen(want)) != 0)
    fail_msg("expected the cause '%s' on the second line:\n%s", kind, report);
  if (strstr(second + strlen(want), "  cause: "))
    fail_msg("more than one cause line:\n%s", report);
}

static void expect_text(const char *report, const char *text) {
  if (!strstr(report, text)) fail_msg("the report lacks '%s':\n%s", text, report);
}

static void expect_no_text(const char *report, const char *text) {
  if (strstr(report, text)) fail_msg("the report says '%s':\n%s", text, report);
}

static void t_planted_fragmentation(void **state) {
  (void)state;
  char report[4096];
  /* 30 MiB cached in pieces of 10 MiB, 4 MiB left on a 64 MiB device, 20 MiB asked. */
  planted p = {.total = 64 * VT_MiB, .device_free = 4 * VT_MiB, .reserved = 60 * VT_MiB,
               .allocated = 30 * VT_MiB, .cached = 30 * VT_MiB, .largest = 10 * VT_MiB};
  report_of(p, 20 * VT_MiB, 0, report, sizeof report);
  expect_cause(report, "fragmentation");
  expect_text(report, "30.0 MiB is cached free and the pool may reserve 4.0 MiB more");
  expect_text(report, "the largest free block is 10.0 MiB");
  /* The lines that were there before stay. */
  expect_text(report, "largest free block 10.00 MiB, fragmentation 66.7%");
  expect_text(report, "try the vmm source");
  /* Cached free below the request, but with the room the device leaves it is enough: a
   * source that maps memory where it is needed would serve it, so still fragmentation. */
  p.cached = 12 * VT_MiB;
  p.largest = 6 * VT_MiB;
  p.allocated = 48 * VT_MiB;
  p.device_free = 8 * VT_MiB;
  report_of(p, 16 * VT_MiB, 0, report, sizeof report);
  expect_cause(report, "fragmentation");
}

/* A limit in the way, but the memory already reserved would serve the request if it were
 * in one piece: fragmentation comes first (its fixes cost no memory). */
static void t_fragmentation_before_limit(void **state) {
  (void)state;
  char report[4096];
  planted p = {.total = 1 * VT_GiB, .device_free = 984 * VT_MiB, .limit = 64 * VT_MiB,
               .reserved = 40 * VT_MiB, .allocated = 8 * VT_MiB, .cached = 32 * VT_MiB,
               .largest = 32 * VT_MiB};
  report_of(p, 40 * VT_MiB, 0, report, sizeof report);
  expect_cause(report, "fragmentation");
  /* What the pool may still reserve is bounded by the limit, not by the device. */
  expect_text(report, "32.0 MiB is cached free and the pool may reserve 24.0 MiB more");
  /* The older advice about the limit stays: reserved + request is over it. */
  expect_text(report, "The limit of 64.00 MiB is what refused it");
}

static void t_planted_limit(void **state) {
  (void)state;
  char report[4096];
  planted p = {.total = 1 * VT_GiB, .device_free = 984 * VT_MiB, .limit = 64 * VT_MiB,
               .reserved = 40 * VT_MiB, .allocated = 40 * VT_MiB};
  report_of(p, 40 * VT_MiB, 0, report, sizeof report);
  expect_cause(report, "limit");
  expect_text(report, "the limit of 64.0 MiB refused it");
  expect_text(report, "the device has 984.0 MiB free");
  /* Reserved plus the request less the limit: room for a segment of the request's size. */
  char raise[96];
  snprintf(raise, sizeof raise, "raise the limit by 16.0 MiB (%zu bytes)", 16 * VT_MiB);
  expect_text(report, raise);
}

static void t_planted_live(void **state) {
  (void)state;
  char report[4096];
  /* More than the whole device, no limit. */
  planted p = {.total = 64 * VT_MiB, .device_free = 24 * VT_MiB, .reserved = 40 * VT_MiB,
               .allocated = 40 * VT_MiB};
  report_of(p, 40 * VT_MiB, 0, report, sizeof report);
  expect_cause(report, "live");
  expect_text(report, "live memory 40.0 MiB plus the request 40.0 MiB is 80.0 MiB, more than "
                      "the device's 64.0 MiB");
  /* More than the limit, and the device has no room for it either: raising the limit
   * alone would not do, so the live memory is what is too much. */
  planted q = {.total = 8 * VT_GiB, .device_free = 1 * VT_GiB, .limit = 4 * VT_GiB,
               .reserved = 3 * VT_GiB, .allocated = 3 * VT_GiB};
  report_of(q, 2 * VT_GiB, 0, report, sizeof report);
  expect_cause(report, "live");
  expect_text(report, "more than the limit of 4.0 GiB, and the device has only 1.0 GiB free");
  /* A request past what the device could ever hold. */
  report_of(p, (size_t)1 << 50, 64 * VT_MiB, report, sizeof report);
  expect_cause(report, "live");
  expect_text(report, "the request alone (1.0 PiB) is more than the device can hold");
  expect_text(report, "No memory setting can serve a request this large");
  /* SIZE_MAX: the sums saturate instead of wrapping into a small number. */
  report_of(p, SIZE_MAX, 0, report, sizeof report);
  expect_cause(report, "live");
}

static void t_planted_others(void **state) {
  (void)state;
  char report[4096];
  /* 8 GiB device, we reserve 1 GiB, 1 GiB is free: 6 GiB is someone else's. */
  planted p = {.total = 8 * VT_GiB, .device_free = 1 * VT_GiB, .reserved = 1 * VT_GiB,
               .allocated = 1 * VT_GiB};
  report_of(p, 2 * VT_GiB, 0, report, sizeof report);
  expect_cause(report, "others");
  expect_text(report, "other processes hold 6.0 GiB of the device's 8.0 GiB");
  expect_text(report, "free on the device 1.0 GiB plus cached free 0 B cannot serve the "
                      "request 2.0 GiB");
  /* A limit that live memory stays under does not change it. */
  p.limit = 4 * VT_GiB;
  report_of(p, 2 * VT_GiB, 0, report, sizeof report);
  expect_cause(report, "others");
}

/* The boundaries between kinds, one byte apart. */
static void t_planted_boundaries(void **state) {
  (void)state;
  char report[4096];
  /* allocated + request == reserved + device free: everything fits, so placement failed. */
  planted p = {.total = 8 * VT_GiB, .device_free = 1 * VT_GiB, .reserved = 1 * VT_GiB,
               .allocated = 1 * VT_GiB};
  report_of(p, 1 * VT_GiB, 0, report, sizeof report);
  expect_cause(report, "fragmentation");
  report_of(p, 1 * VT_GiB + 1, 0, report, sizeof report);
  expect_cause(report, "others");
  /* allocated + request == device total: others; one byte more: live. */
  report_of(p, 7 * VT_GiB, 0, report, sizeof report);
  expect_cause(report, "others");
  report_of(p, 7 * VT_GiB + 1, 0, report, sizeof report);
  expect_cause(report, "live");
  /* allocated + request == limit with room on the device: fragmentation; one more: limit. */
  planted q = {.total = 8 * VT_GiB, .device_free = 6 * VT_GiB, .limit = 2 * VT_GiB,
               .reserved = 1 * VT_GiB + 512 * VT_MiB, .allocated = 1 * VT_GiB,
               .cached = 512 * VT_MiB, .largest = 256 * VT_MiB};
  report_of(q, 1 * VT_GiB, 0, report, sizeof report);
  expect_cause(report, "fragmentation");
  report_of(q, 1 * VT_GiB + 1, 0, report, sizeof report);
  expect_cause(report, "limit");
}

/* A cap below one segment: no placement can help, so it is not fragmentation, and the
 * advice is the cap, not the batch size. */
static void t_planted_granularity(void **state) {
  (void)state;
  char report[4096];
  planted p = {.total = 1 * VT_MiB, .device_free = 1 * VT_MiB, .limit = 1 * VT_MiB,
               .granularity = 2 * VT_MiB};
  report_of(p, 512, 0, report, sizeof report);
  expect_cause(report, "granularity");
  expect_text(report, "the limit of 1.0 MiB is smaller than the smallest segment the pool maps "
                      "(2.0 MiB): no request fits under it");
  expect_text(report, "Raise the limit to at least one segment, 2.0 MiB (VRAMKIT_LIMIT)");
  expect_no_text(report, "not in one piece");
  expect_no_text(report, "Reduce the batch size");
  /* No limit, a sim of 1 KiB. */
  planted k = {.total = 1 * VT_KiB, .device_free = 1 * VT_KiB, .granularity = 2 * VT_MiB};
  report_of(k, 1, 0, report, sizeof report);
  expect_cause(report, "granularity");
  expect_text(report, "the device's capacity of 1.0 KiB is smaller than the smallest segment");
  expect_text(report, "(VRAMKIT_SIM_CAPACITY)");
  /* A cap of several segments with less than one left above what is reserved, and too
   * little cached to make up the rest. */
  planted q = {.total = 3 * VT_MiB, .device_free = 1 * VT_MiB, .reserved = 2 * VT_MiB,
               .allocated = 3 * VT_MiB / 2, .cached = VT_MiB / 2, .largest = VT_MiB / 2,
               .granularity = 2 * VT_MiB};
  report_of(q, 1 * VT_MiB, 0, report, sizeof report);
  expect_cause(report, "granularity");
  expect_text(report, "of the 1.0 MiB it may still reserve, 0 B can be mapped, which with the "
                      "512.0 KiB cached free is less than the request of 1.0 MiB");
  /* Whole segments that cover it keep it fragmentation. */
  q.device_free = q.total - q.reserved + 2 * VT_MiB;
  q.total += 2 * VT_MiB;
  report_of(q, 1 * VT_MiB, 0, report, sizeof report);
  expect_cause(report, "fragmentation");
}

/* The sum the live cause shows reads true: enough digits for a + b = c and for c against
 * the bound, exact bytes where no unit can show the difference. */
static void t_planted_sum_digits(void **state) {
  (void)state;
  char report[4096];
  planted p = {.total = 1536 * VT_MiB, .reserved = 1536 * VT_MiB, .allocated = 1536 * VT_MiB,
               .granularity = 2 * VT_MiB};
  report_of(p, 59 * VT_MiB / 2, 0, report, sizeof report);
  expect_cause(report, "live");
  expect_text(report, "live memory 1.50 GiB plus the request 0.03 GiB is 1.53 GiB, more than "
                      "the device's 1.50 GiB");
  p.allocated -= 100;
  report_of(p, 101, 0, report, sizeof report);
  expect_cause(report, "live");
  expect_text(report, "live memory 1610612636 bytes plus the request 101 bytes is 1610612737 "
                      "bytes, more than the device's 1610612736 bytes");
}

/* A request just past the device is no miscomputed size: the advice is the capacity. */
static void t_planted_above_capacity(void **state) {
  (void)state;
  char report[4096];
  planted p = {.total = 512 * VT_MiB, .device_free = 512 * VT_MiB, .granularity = 2 * VT_MiB};
  report_of(p, 900 * VT_MiB, 512 * VT_MiB, report, sizeof report);
  expect_cause(report, "live");
  expect_text(report, "more than device 0's capacity of 512.0 MiB");
  expect_text(report, "The request alone is more than this device's capacity of 512.0 MiB");
  expect_text(report, "VRAMKIT_SIM_CAPACITY");
  expect_no_text(report, "No memory setting can serve");
  expect_no_text(report, "negative number");
}

/* Each cause has its name, the report's word; past the range, none. */
static void t_cause_names(void **state) {
  (void)state;
  const char *names[] = {"preallocate", "fragmentation", "granularity", "limit",
                         "live",        "others",        "group_limit"};
  for (int c = 0; c < VRAM_OOM_CAUSE_COUNT; c++)
    assert_string_equal(vram_oom_cause_name(c), names[c]);
  assert_null(vram_oom_cause_name(VRAM_OOM_CAUSE_COUNT));
  assert_null(vram_oom_cause_name(-1));
  /* vram_oom_classify on figures alone, as a snapshot gives them: 30 MiB cached free in
   * pieces, the device nearly full, 20 MiB asked. */
  vram_oom_info_t in = {.requested = 20 * VT_MiB, .capacity = 64 * VT_MiB,
                        .device_free = 4 * VT_MiB, .reserved = 60 * VT_MiB,
                        .allocated = 30 * VT_MiB, .cached_free = 30 * VT_MiB,
                        .largest_free_block = 10 * VT_MiB, .granularity = 2 * VT_MiB};
  vram_oom_classify(&in);
  assert_int_equal(in.cause, VRAM_OOM_FRAGMENTATION);
  in.allocated = 50 * VT_MiB;
  vram_oom_classify(&in);
  assert_int_equal(in.cause, VRAM_OOM_LIVE);
  assert_int_equal(in.shortfall, 6 * VT_MiB);
  /* A group limit the processes of the device together would pass, while the device and
   * the pool's own limit have room. */
  vram_oom_info_t group = {.requested = 36 * VT_MiB, .capacity = 64 * VT_MiB,
                           .device_free = 16 * VT_MiB, .granularity = 2 * VT_MiB,
                           .group_limit = 56 * VT_MiB, .group_reserved = 48 * VT_MiB};
  vram_oom_classify(&group);
  assert_int_equal(group.cause, VRAM_OOM_GROUP_LIMIT);
  group.group_limit = 0;
  vram_oom_classify(&group);
  assert_int_equal(group.cause, VRAM_OOM_OTHERS);
}

/* A report too long for its buffer is cut, never overrun, and its length still says so. */
static void t_short_buffer(void **state) {
  (void)state;
  planted p = {.total = 64 * VT_MiB, .device_free = 24 * VT_MiB, .reserved = 40 * VT_MiB,
               .allocated = 40 * VT_MiB};
  vram_pool_snapshot snap = plant(p);
  vram_oom_request req = {.size = 40 * VT_MiB};
  vram_oom_info_t info;
  _vram_oom_info_fill(&snap, &req, &info);
  char full[4096], cut[100];
  int n = _vram_format_oom_report(&snap, &req, &info, full, sizeof full);
  memset(cut, 'x', sizeof cut);
  assert_int_equal(_vram_format_oom_report(&snap, &req, &info, cut, 64), n);
  assert_int_equal(strlen(cut), 63);
  assert_int_equal(cut[64], 'x');
  assert_memory_equal(cut, full, 63);
}

/* Sizes at and past 2^63 are printed as the unsigned figures they are: no wrapped negative
 * number, no negation of INT64_MIN (UBSan), in the summary and in the report. */
static void t_sizes_past_int64(void **state) {
  (void)state;
  const size_t half = (size_t)1 << 63;
  planted p = {.total = half, .device_free = half, .limit = half, .reserved = 0};
  vram_pool_snapshot snap = plant(p);
  char text[8192];
  int n = _vram_format_summary(&snap, text, sizeof text);
  assert_true(n > 0 && (size_t)n < sizeof text);
  if (strstr(text, "--") && strstr(text, "-9")) fail_msg("a wrapped size:\n%s", text);
  expect_text(text, "| limit                    |       8.00 EiB |");
  snap.stats.limit_bytes = SIZE_MAX;
  _vram_format_summary(&snap, text, sizeof text);
  expect_text(text, "| limit                    |      16.00 EiB |");
  /* The report's figures: capacity, free and limit at 2^63, a request of 2^63 + 1. */
  report_of(p, half + 1, 0, text, sizeof text);
  expect_text(text, "tried to allocate 8.00 EiB (9223372036854775809 bytes)");
  expect_text(text, "device capacity 8.00 EiB, free on device 8.00 EiB, limit 8.00 EiB");
  assert_null(strstr(text, "-9"));
}

/* A size just under a unit's boundary is printed in the next unit, as the figure rounds:
 * 1 GiB less 512 bytes is "1.00 GiB" in the summary and "1.0 GiB" in the report's cause,
 * never "1024.00 MiB". */
static void t_sizes_at_a_unit_boundary(void **state) {
  (void)state;
  const size_t limit = ((size_t)1 << 30) - 512;
  planted p = {.total = 80 * ((size_t)1 << 30), .device_free = 79 * ((size_t)1 << 30),
               .limit = limit, .reserved = 1022 * VT_MiB, .allocated = 1022 * VT_MiB};
  vram_pool_snapshot snap = plant(p);
  char text[8192];
  _vram_format_summary(&snap, text, sizeof text);
  expect_text(text, "| limit                    |       1.00 GiB |");
  report_of(p, 8 * VT_MiB, 0, text, sizeof text);
  expect_text(text, "the limit of 1.0 GiB refused it");
  expect_text(text, "limit 1.00 GiB;");
  assert_null(strstr(text, "1024.0"));
  /* Below the rounding point the smaller unit stays. */
  snap.stats.limit_bytes = ((size_t)1 << 30) - 8 * VT_MiB;
  _vram_format_summary(&snap, text, sizeof text);
  expect_text(text, "| limit                    |    1016.00 MiB |");
}

/* ---- real pools ----------------------------------------------------------------------- */

/* The pool's current report, which must be non-empty. */
static void pool_report(vram_pool_t *pool, char *buf, size_t cap) {
  int n = vram_oom_report(pool, buf, cap);
  assert_true(n > 0);
  assert_true((size_t)n < cap);
}

/* Each live block is still there with the size it was asked for. */
static void expect_intact(vram_pool_t *pool, void **blocks, const size_t *sizes, int count) {
  VT_VALID(pool);
  for (int i = 0; i < count; i++) {
    if (!blocks[i]) continue;
    size_t requested = 0;
    VT_OK(vram_block_info(pool, blocks[i], &requested, NULL));
    assert_int_equal(requested, sizes[i]);
  }
}

static void free_all(vram_pool_t *pool, void **blocks, int count) {
  for (int i = 0; i < count; i++)
    if (blocks[i]) VT_OK(vram_free(pool, blocks[i]));
  VT_VALID(pool);
}

/* A 60 MiB segment carved into six 10 MiB blocks, every other one freed: 30 MiB cached in
 * three pieces, 4 MiB left on the 64 MiB device, and 20 MiB asked for. */
/* n blocks of `size` in a row, every other one freed: holes of `size` between live ones. */
static void carve_every_other(vram_pool_t *pool, int n, size_t size, void **blocks,
                              size_t *sizes) {
  for (int i = 0; i < n; i++) {
    sizes[i] = size;
    VT_OK(vram_malloc(pool, sizes[i], NULL, &blocks[i]));
  }
  for (int i = 1; i < n; i += 2) {
    VT_OK(vram_free(pool, blocks[i]));
    blocks[i] = NULL;
  }
}

static void t_sim_fragmentation(void **state) {
  (void)state;
  /* Fixed segments only: with large blocks virtual (the default) or virtual growth past
   * half the device, a virtual range would serve the request (test_virtual_growth.c). */
  vram_options_t o;
  vram_options_init(&o);
  o.source = VRAM_SOURCE_SIM;
  o.sim_capacity = 64 * VT_MiB;
  o.virtual_threshold = 1.0;
  o.large_blocks = VRAM_LARGE_FIXED;
  vram_pool_t *pool = vt_pool_from(&o);
  void *whole = NULL;
  VT_OK(vram_malloc(pool, 60 * VT_MiB, NULL, &whole));
  VT_OK(vram_free(pool, whole)); /* its segment stays cached */
  void *blocks[6];
  size_t sizes[6];
  carve_every_other(pool, 6, 10 * VT_MiB, blocks, sizes);
  assert_int_equal(vt_stats(pool).reserved_bytes.current, 60 * VT_MiB);
  void *p = NULL;
  VT_EXPECT(vram_malloc(pool, 20 * VT_MiB, NULL, &p), VRAM_ENOMEM);
  assert_null(p);
  expect_intact(pool, blocks, sizes, 6);
  char report[4096];
  pool_report(pool, report, sizeof report);
  expect_cause(report, "fragmentation");
  expect_text(report, "30.0 MiB is cached free and the pool may reserve 4.0 MiB more");
  expect_text(report, "the largest free block is 10.0 MiB");
  /* The pool goes on: a request that fits a freed piece is served. */
  VT_OK(vram_malloc(pool, 10 * VT_MiB, NULL, &p));
  VT_OK(vram_free(pool, p));
  free_all(pool, blocks, 6);
  VT_OK(vram_pool_destroy(pool));
}

/* A preallocation that fragments, on both sim sources: the report says so, and does not
 * send the user to the vmm source or to tight placement, which a preallocation's one
 * region, mapped whole on every source, does not benefit from; the figures say how much is
 * preallocated. */
static void t_sim_preallocated_fragmentation(void **state) {
  (void)state;
  vram_source_kind kinds[] = {VRAM_SOURCE_SIM, VRAM_SOURCE_SIM_VMM};
  for (int k = 0; k < 2; k++) {
    vram_options_t o;
    vram_options_init(&o);
    o.source = kinds[k];
    o.sim_capacity = 60 * VT_MiB;
    o.preallocate_bytes = 60 * VT_MiB;
    vram_pool_t *pool = vt_pool_from(&o);
    void *blocks[6];
    size_t sizes[6];
    carve_every_other(pool, 6, 10 * VT_MiB, blocks, sizes);
    void *p = NULL;
    VT_EXPECT(vram_malloc(pool, 20 * VT_MiB, NULL, &p), VRAM_ENOMEM);
    expect_intact(pool, blocks, sizes, 6);
    char report[4096];
    pool_report(pool, report, sizeof report);
    expect_cause(report, "fragmentation");
    expect_text(report, "leave VRAMKIT_PREALLOCATE unset");
    expect_no_text(report, "VRAMKIT_SOURCE=vmm");
    expect_no_text(report, "VRAMKIT_TIGHT_THRESHOLD");
    vram_oom_info_t info;
    VT_OK(vram_oom_info(pool, &info));
    assert_int_equal(info.preallocated, 60 * VT_MiB);
    free_all(pool, blocks, 6);
    VT_OK(vram_pool_destroy(pool));
  }
}

/* Virtual memory under a limit, its free bytes in holes smaller than a granule: the granules
 * cannot move, so the cached memory does not serve the request as one piece, and the
 * report's largest free block says so (the statistics' figure counts all cached memory of
 * virtual segments as one piece, which the report must not repeat). */
static void t_sim_vmm_holes_inside_granules(void **state) {
  (void)state;
  vram_options_t o;
  vram_options_init(&o);
  o.source = VRAM_SOURCE_SIM_VMM;
  o.sim_capacity = 1 * VT_GiB;
  o.limit_bytes = 16 * VT_MiB;
  vram_pool_t *pool = vt_pool_from(&o);
  enum { N = 10 };
  void *blocks[N];
  size_t sizes[N];
  carve_every_other(pool, N, 3 * VT_MiB / 2, blocks, sizes);
  void *p = NULL;
  VT_EXPECT(vram_malloc(pool, 4 * VT_MiB, NULL, &p), VRAM_ENOMEM);
  expect_intact(pool, blocks, sizes, N);
  vram_oom_info_t info;
  VT_OK(vram_oom_info(pool, &info));
  assert_true(info.cached_free >= 4 * VT_MiB);
  assert_true(info.largest_free_block < 4 * VT_MiB);
  free_all(pool, blocks, N);
  VT_OK(vram_pool_destroy(pool));
}

/* A 64 MiB limit on a 1 GiB device: 40 MiB held, 40 MiB more asked. */
static void t_sim_limit(void **state) {
  (void)state;
  vram_options_t o;
  vram_options_init(&o);
  o.source = VRAM_SOURCE_SIM;
  o.sim_capacity = 1 * VT_GiB;
  o.limit_bytes = 64 * VT_MiB;
  vram_pool_t *pool = vt_pool_from(&o);
  void *blocks[1];
  size_t sizes[1] = {40 * VT_MiB};
  vram_oom_info_t info;
  /* No OOM yet: nothing to read, and the struct says nothing stale. */
  VT_EXPECT(vram_oom_info(pool, &info), VRAM_EINVAL);
  VT_EXPECT(vram_oom_info(pool, NULL), VRAM_EINVAL);
  VT_OK(vram_malloc(pool, sizes[0], NULL, &blocks[0]));
  void *p = NULL;
  VT_EXPECT(vram_malloc(pool, 40 * VT_MiB, NULL, &p), VRAM_ENOMEM);
  /* The figures the report is written from, exact where the text rounds. */
  VT_OK(vram_oom_info(pool, &info));
  assert_int_equal(info.cause, VRAM_OOM_LIMIT);
  assert_string_equal(vram_oom_cause_name(info.cause), "limit");
  assert_int_equal(info.requested, 40 * VT_MiB);
  assert_int_equal(info.limit, 64 * VT_MiB);
  assert_int_equal(info.capacity, 1 * VT_GiB);
  assert_int_equal(info.allocated, 40 * VT_MiB);
  assert_int_equal(info.raise_limit_by, 16 * VT_MiB);
  assert_int_equal(info.source, VRAM_SOURCE_SIM);
  expect_intact(pool, blocks, sizes, 1);
  char report[4096];
  pool_report(pool, report, sizeof report);
  expect_cause(report, "limit");
  expect_text(report, "the limit of 64.0 MiB refused it");
  expect_text(report, "the device has 984.0 MiB free; raise the limit by 16.0 MiB");
  /* Raised by that much, the same request fits. */
  VT_OK(vram_set_limit(pool, 80 * VT_MiB, 0.0));
  VT_OK(vram_malloc(pool, 40 * VT_MiB, NULL, &p));
  VT_OK(vram_free(pool, p));
  free_all(pool, blocks, 1);
  VT_OK(vram_pool_destroy(pool));
}

/* A 64 MiB device, no limit: 40 MiB live and 40 MiB more asked; then the same under a
 * limit the device cannot honour either. */
static void t_sim_live(void **state) {
  (void)state;
  vram_pool_t *pool = vt_pool_new(VRAM_SOURCE_SIM, 64 * VT_MiB);
  void *blocks[2] = {NULL, NULL};
  size_t sizes[2] = {40 * VT_MiB, 8 * VT_MiB};
  VT_OK(vram_malloc(pool, sizes[0], NULL, &blocks[0]));
  void *p = NULL;
  VT_EXPECT(vram_malloc(pool, 40 * VT_MiB, NULL, &p), VRAM_ENOMEM);
  expect_intact(pool, blocks, sizes, 2);
  char report[4096];
  pool_report(pool, report, sizeof report);
  expect_cause(report, "live");
  expect_text(report, "is 80.0 MiB, more than the device's 64.0 MiB");
  VT_OK(vram_malloc(pool, sizes[1], NULL, &blocks[1]));
  expect_intact(pool, blocks, sizes, 2);
  free_all(pool, blocks, 2);
  VT_OK(vram_pool_destroy(pool));
}

static void t_sim_vmm_live(void **state) {
  (void)state;
  /* The virtual-memory model has no fragmentation to speak of: live memory is the cause. */
  vram_pool_t *pool = vt_pool_new(VRAM_SOURCE_SIM_VMM, 64 * VT_MiB);
  void *blocks[1];
  size_t sizes[1] = {40 * VT_MiB};
  VT_OK(vram_malloc(pool, sizes[0], NULL, &blocks[0]));
  void *p = NULL;
  VT_EXPECT(vram_malloc(pool, 30 * VT_MiB, NULL, &p), VRAM_ENOMEM);
  expect_intact(pool, blocks, sizes, 1);
  char report[4096];
  pool_report(pool, report, sizeof report);
  expect_cause(report, "live");
  free_all(pool, blocks, 1);
  VT_OK(vram_pool_destroy(pool));
}

/* A sim of 1 KiB and a 1-byte request, on both models: the cap is below one segment. */
static void t_sim_below_segment(void **state) {
  (void)state;
  vram_source_kind kinds[] = {VRAM_SOURCE_SIM, VRAM_SOURCE_SIM_VMM};
  for (int k = 0; k < 2; k++) {
    vram_pool_t *pool = vt_pool_new(kinds[k], 1 * VT_KiB);
    void *p = NULL;
    VT_EXPECT(vram_malloc(pool, 1, NULL, &p), VRAM_ENOMEM);
    VT_VALID(pool);
    char report[4096];
    pool_report(pool, report, sizeof report);
    expect_cause(report, "granularity");
    expect_text(report, "the device's capacity of 1.0 KiB is smaller than the smallest segment "
                        "the pool maps (2.0 MiB)");
    VT_OK(vram_pool_destroy(pool));
  }
}

/* A preallocation larger than the device: the creation fails, and its report, with no
 * pool left to ask, is the thread's creation report; a creation that works clears it. */
static void t_preallocate_report(void **state) {
  (void)state;
  vram_source_kind kinds[] = {VRAM_SOURCE_SIM, VRAM_SOURCE_SIM_VMM};
  for (int k = 0; k < 2; k++) {
    vram_options_t o;
    vram_options_init(&o);
    o.source = kinds[k];
    o.sim_capacity = 80 * VT_GiB;
    o.preallocate_bytes = 100 * VT_GiB;
    vram_pool_t *pool = NULL;
    VT_EXPECT(vram_pool_create(&pool, &o), VRAM_ENOMEM);
    assert_null(pool);
    char report[4096];
    int n = vram_pool_create_report(report, sizeof report);
    assert_true(n > 0 && (size_t)n < sizeof report);
    assert_int_equal(vram_pool_create_report(NULL, 0), n);
    expect_cause(report, "preallocate");
    expect_text(report, "could not preallocate 100.00 GiB (107374182400 bytes) when creating "
                        "the pool");
    expect_text(report, "the preallocation of 100.0 GiB is more than the device's capacity of "
                        "80.0 GiB");
    expect_text(report, "Lower VRAMKIT_PREALLOCATE");
    vram_oom_info_t info;
    VT_OK(vram_pool_create_oom_info(&info));
    assert_int_equal(info.cause, VRAM_OOM_PREALLOCATE);
    assert_true(info.preallocate);
    assert_int_equal(info.requested, 100 * VT_GiB);
    assert_int_equal(info.capacity, 80 * VT_GiB);
    /* Under a limit, and past anything a device holds. */
    o.limit_bytes = 8 * VT_GiB;
    o.preallocate_bytes = 10 * VT_GiB;
    VT_EXPECT(vram_pool_create(&pool, &o), VRAM_ENOMEM);
    vram_pool_create_report(report, sizeof report);
    expect_text(report, "the preallocation of 10.0 GiB is more than the limit of 8.0 GiB");
    o.limit_bytes = 0;
    o.preallocate_bytes = SIZE_MAX;
    VT_EXPECT(vram_pool_create(&pool, &o), VRAM_ENOMEM);
    vram_pool_create_report(report, sizeof report);
    expect_cause(report, "preallocate");
    o.preallocate_bytes = 1 * VT_GiB;
    pool = vt_pool_from(&o);
    assert_int_equal(vram_pool_create_report(report, sizeof report), 0);
    assert_string_equal(report, "");
    VT_EXPECT(vram_pool_create_oom_info(&info), VRAM_EINVAL);
    VT_OK(vram_pool_destroy(pool));
  }
}

/* ---- others, through the fake driver -------------------------------------------------- */

/* A second pool on the same fake GPU holds 6 GiB of its 8 GiB: to the first pool that is
 * memory another process holds. 1 GiB live and 2 GiB more asked would fit the device. */
static void t_fake_driver_others(void **state) {
  (void)state;
  vram_options_t o;
  vram_options_init(&o);
  o.source = VRAM_SOURCE_CUDA;
  vram_pool_t *neighbour = NULL;
  if (vram_pool_create(&neighbour, &o) != VRAM_OK) skip(); /* no fake driver on the path */
  vram_pool_t *pool = vt_pool_from(&o);
  void *theirs = NULL;
  VT_OK(vram_malloc(neighbour, 6 * VT_GiB, NULL, &theirs));
  void *blocks[1];
  size_t sizes[1] = {1 * VT_GiB};
  VT_OK(vram_malloc(pool, sizes[0], NULL, &blocks[0]));
  void *p = NULL;
  VT_EXPECT(vram_malloc(pool, 2 * VT_GiB, NULL, &p), VRAM_ENOMEM);
  expect_intact(pool, blocks, sizes, 1);
  char report[4096];
  pool_report(pool, report, sizeof report);
  expect_cause(report, "others");
  expect_text(report, "other processes hold 6.0 GiB of the device's 8.0 GiB");
  /* Once the neighbour lets go, the same request fits. */
  VT_OK(vram_free(neighbour, theirs));
  VT_OK(vram_empty_cache(neighbour));
  VT_OK(vram_malloc(pool, 2 * VT_GiB, NULL, &p));
  VT_OK(vram_free(pool, p));
  free_all(pool, blocks, 1);
  VT_OK(vram_pool_destroy(pool));
  VT_OK(vram_pool_destroy(neighbour));
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "cuda") == 0) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(t_fake_driver_others)};
    return cmocka_run_group_tests(tests, NULL, NULL);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_planted_fragmentation), cmocka_unit_test(t_fragmentation_before_limit),
      cmocka_unit_test(t_planted_limit),         cmocka_unit_test(t_planted_live),
      cmocka_unit_test(t_planted_others),        cmocka_unit_test(t_planted_boundaries),
      cmocka_unit_test(t_planted_granularity),   cmocka_unit_test(t_planted_sum_digits),
      cmocka_unit_test(t_planted_above_capacity),
      cmocka_unit_test(t_cause_names),
      cmocka_unit_test(t_short_buffer),          cmocka_unit_test(t_sizes_past_int64),
      cmocka_unit_test(t_sizes_at_a_unit_boundary),
      cmocka_unit_test(t_sim_fragmentation),     cmocka_unit_test(t_sim_preallocated_fragmentation),
      cmocka_unit_test(t_sim_vmm_holes_inside_granules),
      cmocka_unit_test(t_sim_limit),             cmocka_unit_test(t_sim_live),
      cmocka_unit_test(t_sim_vmm_live),          cmocka_unit_test(t_sim_below_segment),
      cmocka_unit_test(t_preallocate_report),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

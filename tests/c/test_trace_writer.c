/* test_trace_writer.c - the library's trace writer (vram_trace_writer_*, vramkit.h) through
 * its public calls: what it writes the reader reads back op for op; what the reader would
 * refuse is refused with its own status and leaves no file behind; a full device is an
 * error at put or close, never a trace cut short in silence. */
#include "vt.h"

#include <sys/stat.h>
#include <unistd.h>

/* A fresh path in /tmp with no file at it yet; the caller unlinks what gets written. */
static const char *fresh_path(void) {
  static char path[64];
  snprintf(path, sizeof path, "/tmp/vt_trace_out_XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  unlink(path);
  return path;
}

static int file_exists(const char *path) {
  struct stat info;
  return stat(path, &info) == 0;
}

static vram_trace_writer_t *open_writer(const char *path, const char *header) {
  char error[256];
  vram_trace_writer_t *w = NULL;
  int rc = vram_trace_writer_open(path, header, &w, error, sizeof error);
  if (rc != VRAM_OK) fail_msg("open: %s", error);
  return w;
}

static vram_trace_op_t make_op(int is_alloc, uint64_t id, uint64_t size, uint64_t stream,
                               uint64_t time_us) {
  vram_trace_op_t op;
  memset(&op, 0, sizeof op);
  op.is_alloc = (uint8_t)is_alloc;
  op.id = id;
  op.size = is_alloc ? size : 0;
  op.stream = stream;
  op.time_us = time_us;
  return op;
}

static uint64_t next_random(uint64_t *state) {
  *state ^= *state << 13;
  *state ^= *state >> 7;
  *state ^= *state << 17;
  return *state;
}

/* Random allocations and frees (some of IDs never allocated), numbers up to 2^64 - 1. */
static size_t random_ops(vram_trace_op_t *ops, size_t count, uint64_t seed) {
  uint64_t live[256];
  size_t live_count = 0, n = 0;
  uint64_t state = seed;
  while (n < count) {
    uint64_t r = next_random(&state);
    uint64_t big = next_random(&state) >> (r % 64);
    if (live_count < 256 && (live_count == 0 || r % 3 != 0)) {
      uint64_t id = (next_random(&state) >> 1) | 1; /* never 2^64 - 1 */
      int taken = 0;
      for (size_t i = 0; i < live_count; i++) taken |= live[i] == id;
      if (taken) continue;
      live[live_count++] = id;
      ops[n] = make_op(1, id, big, r % 7 ? r % 5 : UINT64_MAX, next_random(&state));
    } else if (r % 17 == 0) {
      ops[n] = make_op(0, 2 * (r >> 2), 0, r % 5, big); /* even: never allocated */
    } else {
      size_t which = (size_t)(r >> 8) % live_count;
      ops[n] = make_op(0, live[which], 0, r % 5, big);
      live[which] = live[--live_count];
    }
    n++;
  }
  return n;
}

static void t_round_trip_of_random_ops(void **state) {
  (void)state;
  enum { COUNT = 5000 };
  static vram_trace_op_t ops[COUNT];
  random_ops(ops, COUNT, 0x9e3779b97f4a7c15ull);
  const char *path = fresh_path();
  vram_trace_writer_t *w = open_writer(path, "random ops\tfrom the test");
  for (size_t i = 0; i < COUNT; i++) assert_int_equal(vram_trace_writer_put(w, &ops[i]), VRAM_OK);
  assert_int_equal(vram_trace_writer_ops(w), COUNT);
  char error[256];
  assert_int_equal(vram_trace_writer_close(w, error, sizeof error), VRAM_OK);

  vram_trace_reader_t *r = NULL;
  assert_int_equal(vram_trace_reader_open(path, 0, &r, error, sizeof error), VRAM_OK);
  vram_trace_op_t got;
  for (size_t i = 0; i < COUNT; i++) {
    assert_int_equal(vram_trace_reader_next(r, &got), 1);
    assert_int_equal(got.is_alloc, ops[i].is_alloc);
    assert_int_equal(got.id, ops[i].id);
    if (got.is_alloc) assert_int_equal(got.size, ops[i].size);
    assert_int_equal(got.stream, ops[i].stream);
    assert_int_equal(got.time_us, ops[i].time_us);
    assert_int_equal(got.line, i + 2);
  }
  assert_int_equal(vram_trace_reader_next(r, &got), 0);
  vram_trace_reader_close(r);
  unlink(path);
}

static void t_headers(void **state) {
  (void)state;
  char error[256];
  const char *path = fresh_path();
  vram_trace_writer_t *w = NULL;
  static const char *const refused[] = {"two\nlines", "carriage\rreturn", "bell\a", "\x7f",
                                        "caf\xc3\xa9"};
  for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
    assert_int_equal(vram_trace_writer_open(path, refused[i], &w, error, sizeof error),
                     VRAM_EINVAL);
    assert_null(w);
    assert_non_null(strstr(error, "trace header has"));
    assert_false(file_exists(path));
  }
  /* The longest header the reader's line holds is written and read back; one more byte
   * is refused. */
  char header[VRAM_TRACE_HEADER_MAX + 2];
  memset(header, 'h', VRAM_TRACE_HEADER_MAX + 1);
  header[VRAM_TRACE_HEADER_MAX + 1] = '\0';
  assert_int_equal(vram_trace_writer_open(path, header, &w, error, sizeof error), VRAM_EINVAL);
  assert_non_null(strstr(error, "at most"));
  assert_false(file_exists(path));
  header[VRAM_TRACE_HEADER_MAX] = '\0';
  const char *const accepted[] = {"", header};
  for (size_t i = 0; i < 2; i++) {
    w = open_writer(path, accepted[i]);
    vram_trace_op_t op = make_op(1, 1, 4096, 0, 0);
    assert_int_equal(vram_trace_writer_put(w, &op), VRAM_OK);
    assert_int_equal(vram_trace_writer_close(w, error, sizeof error), VRAM_OK);
    vram_trace_reader_t *r = NULL;
    if (vram_trace_reader_open(path, 0, &r, error, sizeof error) != VRAM_OK)
      fail_msg("reader: %s", error);
    assert_int_equal(vram_trace_reader_next(r, &op), 1);
    assert_int_equal(vram_trace_reader_next(r, &op), 0);
    vram_trace_reader_close(r);
    unlink(path);
  }
}

/* Each op the reader would refuse: its status, sticky, and no file left. */
static void t_refused_ops_leave_no_file(void **state) {
  (void)state;
  static const struct {
    vram_trace_op_t bad;
    int status;
    const char *message;
  } cases[] = {
      {{.is_alloc = 1, .id = UINT64_MAX, .size = 1}, VRAM_EINVAL, "out of range"},
      {{.is_alloc = 0, .id = UINT64_MAX}, VRAM_EINVAL, "out of range"},
      {{.is_alloc = 2, .id = 3}, VRAM_EINVAL, "not 0 or 1"},
      {{.is_alloc = 1, .id = 7, .size = 1}, VRAM_ETRACE, "allocated again while still live"},
  };
  char error[256];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *path = fresh_path();
    vram_trace_writer_t *w = open_writer(path, "refusals");
    vram_trace_op_t op = make_op(1, 7, 4096, 0, 0);
    assert_int_equal(vram_trace_writer_put(w, &op), VRAM_OK);
    op = make_op(0, 99, 0, 0, 1); /* a free of an ID never allocated is written */
    assert_int_equal(vram_trace_writer_put(w, &op), VRAM_OK);
    assert_int_equal(vram_trace_writer_put(w, &cases[i].bad), cases[i].status);
    assert_non_null(strstr(vram_trace_writer_error(w), cases[i].message));
    op = make_op(0, 7, 0, 0, 2);
    assert_int_equal(vram_trace_writer_put(w, &op), cases[i].status); /* sticky */
    assert_int_equal(vram_trace_writer_close(w, error, sizeof error), cases[i].status);
    assert_non_null(strstr(error, cases[i].message));
    assert_false(file_exists(path));
  }
  /* An ID freed may be allocated again. */
  const char *path = fresh_path();
  vram_trace_writer_t *w = open_writer(path, "reuse");
  vram_trace_op_t ops[] = {make_op(1, 7, 1, 0, 0), make_op(0, 7, 0, 0, 1),
                           make_op(1, 7, 2, 0, 2)};
  for (size_t i = 0; i < 3; i++) assert_int_equal(vram_trace_writer_put(w, &ops[i]), VRAM_OK);
  assert_int_equal(vram_trace_writer_close(w, error, sizeof error), VRAM_OK);
  assert_true(file_exists(path));
  unlink(path);
  /* Discarding removes what was written. */
  w = open_writer(path, "discarded");
  assert_int_equal(vram_trace_writer_put(w, &ops[0]), VRAM_OK);
  vram_trace_writer_discard(w);
  assert_false(file_exists(path));
}

static void t_full_device_and_bad_paths(void **state) {
  (void)state;
  char error[256];
  vram_trace_writer_t *w = NULL;
  if (file_exists("/dev/full")) {
    w = open_writer("/dev/full", "to a full device");
    int status = VRAM_OK;
    for (uint64_t i = 0; i < 200000 && status == VRAM_OK; i++) {
      vram_trace_op_t op = make_op(1, i, i * 4096 + 17, i % 3, i * 1000003);
      status = vram_trace_writer_put(w, &op);
    }
    int closed = vram_trace_writer_close(w, error, sizeof error);
    assert_int_equal(status == VRAM_OK ? closed : status, VRAM_EIO);
    assert_int_equal(closed, VRAM_EIO);
    assert_non_null(strstr(error, "/dev/full"));
    assert_true(file_exists("/dev/full")); /* a device is never removed */
  }
  assert_int_equal(vram_trace_writer_open("/nonexistent-dir/t.trace.gz", "x", &w, error,
                                          sizeof error), VRAM_EIO);
  assert_null(w);
  assert_non_null(strstr(error, "cannot open for writing"));
  assert_int_equal(vram_trace_writer_open(NULL, "x", &w, error, sizeof error), VRAM_EINVAL);
  assert_int_equal(vram_trace_writer_put(NULL, NULL), VRAM_EINVAL);
  assert_int_equal(vram_trace_writer_close(NULL, error, sizeof error), VRAM_EINVAL);
  vram_trace_writer_discard(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_round_trip_of_random_ops),
      cmocka_unit_test(t_headers),
      cmocka_unit_test(t_refused_ops_leave_no_file),
      cmocka_unit_test(t_full_device_and_bad_paths),
  };
  return cmocka_run_group_tests_name("trace_writer", tests, NULL, NULL);
}

/* test_trace_reader.c - the library's trace reader (vram_trace_reader_*, vramkit.h) through
 * its public calls: ops, slots and unmatched frees as the grammar defines them, the limit
 * on ops, errors that stay, and the cases around line ends. The corpus of bad files that
 * every reader must refuse alike is checked through the command (tools/check_cli.cmake)
 * and the Python package; this file checks what only the API shows. */
#include "vt.h"

#include <unistd.h>

/* Write `size` bytes into a new temporary file; the caller unlinks it. */
static char *temp_trace(const char *text, size_t size) {
  static char path[64];
  snprintf(path, sizeof path, "/tmp/vt_trace_XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, size), (ssize_t)size);
  close(fd);
  return path;
}

#define TRACE(literal) temp_trace(literal, sizeof literal - 1)

static vram_trace_reader_t *open_ok(const char *path, uint64_t max_ops) {
  char error[256];
  vram_trace_reader_t *r = NULL;
  int rc = vram_trace_reader_open(path, max_ops, &r, error, sizeof error);
  if (rc != VRAM_OK) fail_msg("open: %s", error);
  return r;
}

static void t_ops_slots_and_unmatched_frees(void **state) {
  (void)state;
  char *path = TRACE("# vramkit-trace v1 test\n"
                     "# a comment\n\n"
                     "f 99 0 1\n"            /* from before the recording */
                     "a 5 100 7 2\n"
                     "a 6 200 7 3\n"
                     "f 5 7 4\n"
                     "\ta 8 300 9 5 \r\n"    /* blanks around, CRLF */
                     "f 6 7 6");             /* no end of line at the end */
  vram_trace_reader_t *r = open_ok(path, 0);
  vram_trace_op_t op;
  static const struct {
    int is_alloc, matched;
    uint64_t id, size, stream, line;
    uint32_t slot;
  } want[] = {{0, 0, 99, 0, 0, 4, 0},   {1, 0, 5, 100, 7, 5, 0}, {1, 0, 6, 200, 7, 6, 1},
              {0, 1, 5, 100, 7, 7, 0},  {1, 0, 8, 300, 9, 8, 0}, {0, 1, 6, 200, 7, 9, 1}};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    assert_int_equal(vram_trace_reader_next(r, &op), 1);
    assert_int_equal(op.is_alloc, want[i].is_alloc);
    assert_int_equal(op.matched, want[i].matched);
    assert_int_equal(op.id, want[i].id);
    assert_int_equal(op.size, want[i].size);
    assert_int_equal(op.stream, want[i].stream);
    assert_int_equal(op.line, want[i].line);
    assert_int_equal(op.slot, want[i].slot); /* slot 0 comes back after block 5's free */
  }
  assert_int_equal(vram_trace_reader_next(r, &op), 0);
  assert_int_equal(vram_trace_reader_next(r, &op), 0);
  assert_int_equal(vram_trace_reader_live(r), 1); /* block 8 is never freed */
  assert_string_equal(vram_trace_reader_error(r), "");
  vram_trace_reader_close(r);
  unlink(path);
}

static void t_limit_on_ops(void **state) {
  (void)state;
  char *path = TRACE("# vramkit-trace v1\na 0 1 0 1\nf 0 0 2\na 1 1 0 3\n");
  vram_trace_reader_t *r = open_ok(path, 2);
  vram_trace_op_t op;
  assert_int_equal(vram_trace_reader_next(r, &op), 1);
  assert_int_equal(vram_trace_reader_next(r, &op), 1);
  assert_int_equal(vram_trace_reader_next(r, &op), VRAM_ELIMIT);
  assert_non_null(strstr(vram_trace_reader_error(r), ":4: the trace has more than 2 ops"));
  vram_trace_reader_close(r);
  r = open_ok(path, 3);
  for (int i = 0; i < 3; i++) assert_int_equal(vram_trace_reader_next(r, &op), 1);
  assert_int_equal(vram_trace_reader_next(r, &op), 0);
  vram_trace_reader_close(r);
  unlink(path);
}

static void t_errors_stay(void **state) {
  (void)state;
  static const char text[] = "# vramkit-trace v1\na 0 1 0 1\na 1 1\0 0 1\na 2 1 0 1\n";
  char *path = temp_trace(text, sizeof text - 1);
  vram_trace_reader_t *r = open_ok(path, 0);
  vram_trace_op_t op;
  assert_int_equal(vram_trace_reader_next(r, &op), 1);
  assert_int_equal(vram_trace_reader_next(r, &op), VRAM_ETRACE);
  char first[512];
  snprintf(first, sizeof first, "%s", vram_trace_reader_error(r));
  assert_non_null(strstr(first, ":3: a NUL byte ('\\x00') at column 6"));
  assert_int_equal(vram_trace_reader_next(r, &op), VRAM_ETRACE); /* not line 4's op */
  assert_string_equal(vram_trace_reader_error(r), first);
  vram_trace_reader_close(r);
  unlink(path);
}

static void t_open_failures(void **state) {
  (void)state;
  char error[256];
  vram_trace_reader_t *r = (vram_trace_reader_t *)&error; /* must come back NULL */
  assert_int_equal(vram_trace_reader_open("/nonexistent/x.trace", 0, &r, error, sizeof error),
                   VRAM_EIO);
  assert_null(r);
  assert_non_null(strstr(error, "/nonexistent/x.trace: cannot open"));
  char *path = TRACE("");
  assert_int_equal(vram_trace_reader_open(path, 0, &r, error, sizeof error), VRAM_ETRACE);
  assert_non_null(strstr(error, "empty file"));
  unlink(path);
  path = TRACE("# vramkit-trace\x01v1\n");
  assert_int_equal(vram_trace_reader_open(path, 0, &r, error, sizeof error), VRAM_ETRACE);
  assert_non_null(strstr(error, ":1: a control byte ('\\x01')"));
  unlink(path);
  assert_int_equal(vram_trace_reader_open(NULL, 0, &r, error, sizeof error), VRAM_EINVAL);
  assert_int_equal(vram_trace_reader_next(NULL, NULL), VRAM_EINVAL);
  vram_trace_reader_close(NULL);
}

/* The longest line allowed reads; one byte more is refused. */
static void t_line_length(void **state) {
  (void)state;
  char text[2 * VRAM_TRACE_LINE_MAX + 64];
  int n = snprintf(text, sizeof text, "# vramkit-trace v1\n#");
  memset(text + n, 'x', VRAM_TRACE_LINE_MAX - 2);
  n += VRAM_TRACE_LINE_MAX - 2;
  n += snprintf(text + n, sizeof text - (size_t)n, "\na 0 1 0 1\n");
  char *path = temp_trace(text, (size_t)n);
  vram_trace_reader_t *r = open_ok(path, 0);
  vram_trace_op_t op;
  assert_int_equal(vram_trace_reader_next(r, &op), 1);
  vram_trace_reader_close(r);
  unlink(path);
  n = snprintf(text, sizeof text, "# vramkit-trace v1\n#");
  memset(text + n, 'x', VRAM_TRACE_LINE_MAX - 1);
  n += VRAM_TRACE_LINE_MAX - 1;
  text[n++] = '\n';
  path = temp_trace(text, (size_t)n);
  r = open_ok(path, 0);
  assert_int_equal(vram_trace_reader_next(r, &op), VRAM_ETRACE);
  assert_non_null(strstr(vram_trace_reader_error(r), ":2: line longer than 4095 bytes"));
  vram_trace_reader_close(r);
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_ops_slots_and_unmatched_frees),
      cmocka_unit_test(t_limit_on_ops),
      cmocka_unit_test(t_errors_stay),
      cmocka_unit_test(t_open_failures),
      cmocka_unit_test(t_line_length),
  };
  return cmocka_run_group_tests_name("trace_reader", tests, NULL, NULL);
}

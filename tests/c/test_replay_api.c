/* test_replay_api.c - the library's replay (vram_replay_*, vramkit.h) through its public
 * calls: the figures of a pass, an out-of-memory counted with its report kept, the
 * bisection for the smallest capacity, and errors as statuses with a message. The
 * command's printing of the same results is checked in tools/check_cli.cmake. */
#include "vt.h"

#include <unistd.h>

static char *temp_trace(const char *text) {
  static char path[64];
  snprintf(path, sizeof path, "/tmp/vt_replay_XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  return path;
}

/* Two 8 MiB blocks live together, then one 16 MiB block after both are freed. */
static const char two_then_one[] = "# vramkit-trace v1\n"
                                   "a 1 8388608 0 1\n"
                                   "a 2 8388608 0 2\n"
                                   "f 1 0 3\n"
                                   "f 2 0 4\n"
                                   "a 3 16777216 0 5\n"
                                   "f 3 0 6\n";

/* The trace `text` replayed on sim with the smallest capacity searched. */
static void replay_on_sim_with_min_capacity(const char *text, vram_replay_result *r) {
  char *path = temp_trace(text);
  vram_replay_options opts;
  vram_replay_options_init(&opts, NULL);
  opts.pool.source = VRAM_SOURCE_SIM;
  opts.min_capacity = 1;
  assert_int_equal(vram_replay_run(&opts, path, 0, r), VRAM_OK);
  unlink(path);
}

static void t_figures_of_a_pass(void **state) {
  (void)state;
  vram_replay_result r;
  replay_on_sim_with_min_capacity(two_then_one, &r);
  assert_int_equal(r.ops, 6);
  assert_int_equal(r.peak_live_bytes, 16u << 20);
  assert_true(r.peak_reserved_bytes >= 16u << 20);
  assert_int_equal(r.ooms, 0);
  assert_int_equal(r.source, VRAM_SOURCE_SIM);
  assert_true(r.device_calls > 0);
  assert_int_equal(r.have_min_capacity, 1);
  assert_true(r.min_capacity_bytes >= 16u << 20);
  assert_true(r.min_capacity_bytes <= r.peak_reserved_bytes);
  assert_int_equal(r.min_capacity_source, VRAM_SOURCE_SIM);
}

/* One 100-byte block fits nothing up to four times its size: the pool's first segment is
 * 2 MiB, which the search reaches through the replay's own peak reserved. */
static void t_smallest_capacity_of_a_trace_smaller_than_a_segment(void **state) {
  (void)state;
  vram_replay_result r;
  replay_on_sim_with_min_capacity("# vramkit-trace v1\na 1 100 0 1\nf 1 0 2\n", &r);
  assert_int_equal(r.peak_live_bytes, 100);
  assert_int_equal(r.have_min_capacity, 1);
  assert_int_equal(r.min_capacity_bytes, 2u << 20);
}

/* Nothing live (zero-byte blocks): any capacity holds it, so the search has nothing to
 * find, not a smallest capacity of 0 bytes. */
static void t_no_smallest_capacity_of_nothing_live(void **state) {
  (void)state;
  vram_replay_result r;
  replay_on_sim_with_min_capacity("# vramkit-trace v1\na 1 0 0 1\nf 1 0 2\n", &r);
  assert_int_equal(r.peak_live_bytes, 0);
  assert_int_equal(r.have_min_capacity, -3);
}

static void t_oom_counted_with_its_report(void **state) {
  (void)state;
  char *path = temp_trace(two_then_one);
  vram_replay_options opts;
  vram_replay_options_init(&opts, NULL);
  opts.pool.source = VRAM_SOURCE_SIM;
  opts.capacity = 10u << 20;
  vram_replay_result r;
  assert_int_equal(vram_replay_run(&opts, path, 0, &r), VRAM_OK);
  assert_int_equal(r.ooms, 2);
  assert_int_equal(r.first_oom_op, 1);
  assert_int_equal(r.first_oom_size, 8u << 20);
  assert_non_null(strstr(r.first_oom_report, "out of memory"));
  assert_true(vram_replay_pool_made(&r)); /* out of memory mid-way: the pool ran */
  /* A preallocation past the capacity: the pool is never made, one OOM at its creation. */
  opts.pool.preallocate_bytes = 64u << 20;
  assert_int_equal(vram_replay_run(&opts, path, 0, &r), VRAM_OK);
  assert_int_equal(r.ooms, 1);
  assert_int_equal(r.first_oom_op, -1);
  assert_false(vram_replay_pool_made(&r));
  unlink(path);
}

static void t_errors_are_statuses(void **state) {
  (void)state;
  vram_replay_options opts;
  vram_replay_options_init(&opts, NULL);
  opts.pool.source = VRAM_SOURCE_SIM;
  vram_replay_result r;
  assert_int_equal(vram_replay_run(&opts, "/nonexistent/x.trace", 0, &r), VRAM_EIO);
  assert_non_null(strstr(r.error, "/nonexistent/x.trace"));
  char *path = temp_trace("not a trace\n");
  assert_int_equal(vram_replay_run(&opts, path, 0, &r), VRAM_ETRACE);
  unlink(path);
  path = temp_trace(two_then_one);
  assert_int_equal(vram_replay_run(&opts, path, 3, &r), VRAM_ELIMIT);
  opts.capacity = (uint64_t)VRAM_SIM_MAX_CAPACITY * 2;
  assert_int_equal(vram_replay_run(&opts, path, 0, &r), VRAM_ESIMCAPACITY);
  assert_true(r.failed_creating);
  assert_false(vram_replay_pool_made(&r));
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_figures_of_a_pass),
      cmocka_unit_test(t_smallest_capacity_of_a_trace_smaller_than_a_segment),
      cmocka_unit_test(t_no_smallest_capacity_of_nothing_live),
      cmocka_unit_test(t_oom_counted_with_its_report),
      cmocka_unit_test(t_errors_are_statuses),
  };
  return cmocka_run_group_tests_name("replay_api", tests, NULL, NULL);
}

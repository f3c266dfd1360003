/* test_placement.c - the placement policy's questions (src/pool/placement.h) answered for
 * given figures; test_source_extras.c has tight placement carried out by a pool on sim.
 *
 * The questions are pure functions of a pool's figures, so each answer is checked at the
 * edges that decide it: tight placement gives a request its own segment only past the
 * threshold's share of the cap and only when the free segment is bigger than its own; the
 * mapped allowance of virtual memory is the allocated peak plus its slack, or the
 * high-water mark if that is more. */
#include "vt.h"
#include "pool/placement.h"

static void t_tight_only_past_the_threshold(void **state) {
  (void)state;
  size_t cap = 1000 * VT_MiB, own = 100 * VT_MiB;
  /* reserved + own against threshold * cap: 400 + 100 is not past half of 1000. */
  assert_false(_vram_place_tight_takes_own(200 * VT_MiB, own, 400 * VT_MiB, cap, 0.5));
  assert_true(_vram_place_tight_takes_own(200 * VT_MiB, own, 401 * VT_MiB, cap, 0.5));
  /* Threshold 0: always, once the segment is bigger; threshold 1 never past a full cap. */
  assert_true(_vram_place_tight_takes_own(200 * VT_MiB, own, 0, cap, 0.0));
  assert_false(_vram_place_tight_takes_own(200 * VT_MiB, own, 900 * VT_MiB, cap, 1.0));
}

static void t_tight_never_for_a_segment_no_bigger(void **state) {
  (void)state;
  size_t cap = 1000 * VT_MiB, own = 100 * VT_MiB;
  assert_false(_vram_place_tight_takes_own(own, own, 900 * VT_MiB, cap, 0.0));
  assert_false(_vram_place_tight_takes_own(own - VT_MiB, own, 900 * VT_MiB, cap, 0.0));
  assert_true(_vram_place_tight_takes_own(own + VT_MiB, own, 900 * VT_MiB, cap, 0.0));
}

static void t_allowance_is_the_peak_and_its_slack_or_the_high_water_mark(void **state) {
  (void)state;
  size_t slack_of_64m = (64 * VT_MiB) >> VRAM_VMM_SLACK_SHIFT;
  /* The current allocation with the request, when it is past the allocated peak. */
  assert_int_equal(_vram_place_allowance_of(64 * VT_MiB, 32 * VT_MiB, 0, 0),
                   64 * VT_MiB + slack_of_64m);
  /* The allocated peak, when it is more. */
  assert_int_equal(_vram_place_allowance_of(16 * VT_MiB, 64 * VT_MiB, 0, 0),
                   64 * VT_MiB + slack_of_64m);
  /* The high-water mark of reserved memory, when that is more still. */
  assert_int_equal(_vram_place_allowance_of(16 * VT_MiB, 64 * VT_MiB, 80 * VT_MiB, 0),
                   80 * VT_MiB);
  /* A slack of at least min_slack (far from the cap: two mappings of the largest size). */
  assert_int_equal(_vram_place_allowance_of(64 * VT_MiB, 32 * VT_MiB, 0, 256 * VT_MiB),
                   320 * VT_MiB);
  assert_int_equal(_vram_place_allowance_of(64 * VT_MiB, 32 * VT_MiB, 400 * VT_MiB, 256 * VT_MiB),
                   400 * VT_MiB);
  size_t big = (size_t)64 << 30; /* past the floor, the proportional slack */
  assert_int_equal(_vram_place_allowance_of(big, 0, 0, 256 * VT_MiB),
                   big + (big >> VRAM_VMM_SLACK_SHIFT));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_tight_only_past_the_threshold),
      cmocka_unit_test(t_tight_never_for_a_segment_no_bigger),
      cmocka_unit_test(t_allowance_is_the_peak_and_its_slack_or_the_high_water_mark),
  };
  return cmocka_run_group_tests_name("placement", tests, NULL, NULL);
}

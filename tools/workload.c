/* workload.c - the random allocation workload of `vramkit bench random`.
 *
 * Every draw happens in a fixed order, because the point of this file is to reproduce bit
 * for bit the op sequence that other allocators were measured on (see workload.h).
 */
#include "workload.h"

#include <math.h>
#include <stdlib.h>

uint64_t workload_next(workload_rng_t *rng) {
  uint64_t x = rng->state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  rng->state = x;
  return x;
}

double workload_unit(workload_rng_t *rng) {
  /* 53 random bits scaled by 2^-53: every double in [0, 1) on that grid equally likely. */
  return (double)(workload_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

size_t workload_log_uniform(workload_rng_t *rng, size_t lo, size_t hi) {
  double log_lo = log((double)lo), log_hi = log((double)hi);
  return (size_t)exp(log_lo + (log_hi - log_lo) * workload_unit(rng));
}

size_t workload_make_random(workload_op_t *ops, size_t random_ops, uint32_t max_live,
                            size_t min_size, size_t max_size, uint64_t seed) {
  uint32_t *free_slots = malloc(sizeof *free_slots * (max_live ? max_live : 1));
  uint32_t *live_slots = malloc(sizeof *live_slots * (max_live ? max_live : 1));
  if (!free_slots || !live_slots) {
    free(free_slots);
    free(live_slots);
    return 0;
  }
  workload_rng_t rng = {seed};
  /* Stacked so that slot 0 is handed out first, as in the sequence the comparison used. */
  uint32_t free_count = max_live, live_count = 0;
  for (uint32_t i = 0; i < max_live; i++) free_slots[i] = max_live - 1 - i;

  size_t written = 0;
  for (; written < random_ops; written++) {
    /* The coin is tossed only when both choices are open, so the draw count matches. */
    int allocate = live_count == 0 ? 1 : free_count == 0 ? 0 : workload_unit(&rng) < 0.5;
    workload_op_t *op = &ops[written];
    if (allocate) {
      uint32_t slot = free_slots[--free_count];
      op->slot = slot;
      op->is_alloc = 1;
      op->size = workload_log_uniform(&rng, min_size, max_size);
      live_slots[live_count++] = slot;
    } else {
      uint32_t victim = (uint32_t)(workload_unit(&rng) * live_count);
      uint32_t slot = live_slots[victim];
      live_slots[victim] = live_slots[--live_count];
      free_slots[free_count++] = slot;
      op->slot = slot;
      op->is_alloc = 0;
      op->size = 0;
    }
  }
  while (live_count) {
    workload_op_t *op = &ops[written++];
    op->slot = live_slots[--live_count];
    op->is_alloc = 0;
    op->size = 0;
  }
  free(free_slots);
  free(live_slots);
  return written;
}

/* workload.h - the random allocation workload of vramkit's benchmarks.
 *
 * The operation sequence that PyTorch's allocator and cudaMallocAsync were measured on (the
 * figures in reference.c): an xorshift64 generator, log-uniform sizes, at most max_live
 * blocks live, a fair coin between allocate and free while neither limit binds, then a
 * drain of what is still live. Keeping the sequence identical is what makes our ns per op
 * and reserved/live comparable with theirs.
 */
#ifndef VRAMKIT_TOOLS_WORKLOAD_H
#define VRAMKIT_TOOLS_WORKLOAD_H

#include <stddef.h>
#include <stdint.h>

/* The reference workload: 200,000 random ops, <= 1,000 live, 256 B .. 32 MiB, seed 42. */
#define WORKLOAD_RANDOM_OPS 200000
#define WORKLOAD_RANDOM_MAX_LIVE 1000
#define WORKLOAD_RANDOM_MIN_SIZE ((size_t)256)
#define WORKLOAD_RANDOM_MAX_SIZE ((size_t)32 << 20)
#define WORKLOAD_RANDOM_SEED 42

typedef struct workload_rng {
  uint64_t state;
} workload_rng_t;

typedef struct workload_op {
  uint32_t slot;    /* which live block: unique among live blocks, < max_live */
  uint32_t is_alloc;
  size_t size;      /* bytes to allocate; 0 for a free */
} workload_op_t;

/* xorshift64 (shifts 13, 7, 17); the seed must be non-zero. */
uint64_t workload_next(workload_rng_t *rng);
/* A double in [0, 1) from the top 53 bits. */
double workload_unit(workload_rng_t *rng);
/* A size drawn log-uniformly from [lo, hi]. */
size_t workload_log_uniform(workload_rng_t *rng, size_t lo, size_t hi);

/* Fill ops (room for random_ops + max_live entries) and return how many were written:
 * random_ops decisions followed by the frees that drain the blocks still live. Returns 0
 * if host memory for the bookkeeping runs out. */
size_t workload_make_random(workload_op_t *ops, size_t random_ops, uint32_t max_live,
                            size_t min_size, size_t max_size, uint64_t seed);

#endif

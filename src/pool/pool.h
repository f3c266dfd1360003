/* pool.h - private interface of the allocator engine, for the library's own files and the
 * white-box tests. Users include vramkit.h only. */
#ifndef VRAM_POOL_H
#define VRAM_POOL_H

#include "vramkit.h"

/* Full invariant check of a pool: every block, segment, free index, hash entry and
 * statistic agrees with every other. Returns 1 if valid; otherwise prints the first
 * broken invariant to stderr and returns 0. Takes the pool lock. At VRAM_DEBUG >= 3 the
 * engine runs it after every public operation and aborts on failure. */
int _vram_pool_is_valid(vram_pool_t *pool);
/* The same check with the lock already held (check.c); true if valid. */
_Bool _vram_pool_check_locked(vram_pool_t *pool);

/* A limit (or a preallocation) in bytes from its two spellings: bytes when non-zero, else a
 * fraction of the device (0: none). VRAM_EINVAL for a fraction outside 0..1. */
int _vram_pool_limit_from(const vram_pool_t *pool, size_t bytes, double fraction,
                          size_t *out);

/* A pool of the process's own, for a replay on a host model: vram_pool_create, but the
 * simulated device is never one shared with other processes (VRAMKIT_SIM_SHARED), and the
 * pool reads no leak-report variable, publishes no record for `vramkit top` and joins no
 * give-back group, so that a replay's figures depend on its options alone. */
int _vram_pool_create_private(vram_pool_t **out, const vram_options_t *opts);

#endif /* VRAM_POOL_H */

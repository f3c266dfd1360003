/* snapshot.h - what the pool tells its observers: statistics with their derived fields,
 * and the snapshot that src/obs formats (obs/format.h). Called with the lock held. */
#ifndef VRAM_SNAPSHOT_H
#define VRAM_SNAPSHOT_H

#include "obs/format.h"
#include "pool/types.h"

/* The pool's statistics with the derived ones (active, largest free block, ...) filled. */
void _vram_pool_fill_stats(const vram_pool_t *pool, vram_stats_t *out);
/* Everything a summary or an OOM report shows; with `ask_device`, the device's free memory
 * too (one call into the source). */
void _vram_pool_snapshot(const vram_pool_t *pool, bool ask_device, vram_pool_snapshot *out);
/* Free bytes of the pool: all of them, and the most one request could get. */
size_t _vram_pool_cached_free(const vram_pool_t *pool);
size_t _vram_pool_largest_free(const vram_pool_t *pool);

#endif /* VRAM_SNAPSHOT_H */

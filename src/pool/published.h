/* published.h - the pool's side of the published record (obs/publish.h): a pool claims its
 * device's slot at creation, stores its counters there at every malloc and free (one
 * predictable test when publishing is off, plain stores under a sequence counter when on),
 * everything at the slow events (segment changes, OOM, empty_cache, set_limit, peak reset),
 * and gives the slot back at destroy. Also the OOM report's neighbours. All with the pool's
 * lock held, except open and close. */
#ifndef VRAM_POOL_PUBLISHED_H
#define VRAM_POOL_PUBLISHED_H

#include "obs/format.h"
#include "obs/publish.h"
#include "pool/types.h"

/* After malloc and free moved the counters. */
VRAM_HOT void _vram_pool_publish_hot(vram_pool_t *pool) {
  vram_device_record *d = pool->published;
  if (d) {
    const vram_stats_t *s = &pool->stats;
    _vram_publish_store_hot(d, (uint64_t)s->allocated_bytes.current,
                            (uint64_t)s->reserved_bytes.current,
                            (uint64_t)s->allocated_bytes.current + pool->pending_bytes,
                            (uint64_t)s->allocated_bytes.peak, (uint64_t)s->reserved_bytes.peak);
  }
}

/* Every field, for the slow events. */
void _vram_pool_publish_slow(vram_pool_t *pool);
/* Claim the device's slot (pool create) and give it back (destroy); no lock needed then. */
void _vram_pool_publish_open(vram_pool_t *pool);
void _vram_pool_publish_close(vram_pool_t *pool);

/* The other processes on the pool's GPU, for the OOM report: NVML's list by UUID on a real
 * device, the records of vramkit processes everywhere (sim: records only). Calls nothing of
 * the pool: reads its device, source and slot, then the directory and NVML. */
void _vram_pool_neighbours(const vram_pool_t *pool, vram_neighbours *out);

#endif /* VRAM_POOL_PUBLISHED_H */

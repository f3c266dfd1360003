/* history.c - the public entry points of memory history and snapshots (first cut: the
 * calls exist and answer "nothing recorded" so that callers can build against them). */
#include "pool/types.h"

int vram_history_start(vram_pool_t *pool, size_t max_entries, unsigned flags) {
  return pool ? VRAM_OK : VRAM_EINVAL;
}

int vram_history_stop(vram_pool_t *pool) { return pool ? VRAM_OK : VRAM_EINVAL; }

int vram_history_read(vram_pool_t *pool, vram_event_t *out, size_t cap, size_t *count,
                      size_t *total, uint64_t *dropped) {
  if (!pool || (!out && cap)) return VRAM_EINVAL;
  if (count) *count = 0;
  if (total) *total = 0;
  if (dropped) *dropped = 0;
  return VRAM_OK;
}

int vram_history_annotate(vram_pool_t *pool, uint64_t context) {
  return pool ? VRAM_OK : VRAM_EINVAL;
}

void vram_set_context_fn(vram_context_fn fn, void *user) {}

int vram_snapshot(vram_pool_t *pool, vram_snapshot_segment_t *segments, size_t segment_cap,
                  size_t *n_segments, vram_snapshot_block_t *blocks, size_t block_cap,
                  size_t *n_blocks) {
  if (!pool || (!segments && segment_cap) || (!blocks && block_cap)) return VRAM_EINVAL;
  if (n_segments) *n_segments = 0;
  if (n_blocks) *n_blocks = 0;
  return VRAM_OK;
}

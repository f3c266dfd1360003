/* pending.h - frees of blocks used on other streams (vram_record_stream): each waits for
 * an event per extra stream before its memory can be reused. */
#ifndef VRAM_PENDING_H
#define VRAM_PENDING_H

#include "pool/kinds.h"

/* Note that block `b` (live) is also used on `stream`. */
int _vram_pending_add_use(vram_block *b, vram_stream_t stream);
/* Free live block `b`, which has extra streams: record one event per stream; the block
 * waits for all of them. On failure nothing changes and the block stays live. */
int _vram_pending_free(vram_pool_t *pool, vram_block *b);
/* Retire pending frees whose events completed; with `wait`, wait for all of them. */
void _vram_pending_drain(vram_pool_t *pool, bool wait);
/* A free block of arena `owner` is about to go to a request on `stream`: work queued on
 * `stream` from now on waits for the work queued on the owner's stream so far (the block's
 * last users), and *uses (the caller's, to hang on the block once taken) makes the block's
 * free wait for `stream` before the owner's stream reuses it. */
int _vram_pending_borrow(vram_pool_t *pool, const vram_arena *owner, vram_stream_t stream,
                         vram_stream_uses **uses);
/* Drop what is left (events that failed to synchronize) and the spare events (teardown). */
void _vram_pending_destroy(vram_pool_t *pool);

/* The stream a live or pending block belongs to: its arena's, or the stream that borrowed
 * it from another arena. */
static inline vram_stream_t _vram_block_stream(const vram_block *b) {
  return b->uses && b->uses->borrowed ? b->uses->streams[0] : b->segment->arena->stream;
}

/* While blocks wait on events, active memory exceeds allocated memory, and only then can a
 * malloc take active memory past the allocated peak: note the derived peaks there. */
static inline void _vram_active_peaks_note(vram_pool_t *pool) {
  int64_t bytes = pool->stats.allocated_bytes.current + (int64_t)pool->pending_bytes;
  int64_t blocks = pool->stats.allocation.current + (int64_t)pool->pending_blocks;
  if (bytes > pool->active_bytes_peak) pool->active_bytes_peak = bytes;
  if (blocks > pool->active_peak) pool->active_peak = blocks;
  if (!pool->split_stats) return; /* the kinds' shares are kept only with split_stats */
  for (int i = 0; i < 2; i++) {
    vram_kind_counts *k = &pool->kinds[i];
    int64_t kb = k->allocated_bytes.current + (int64_t)k->pending_bytes;
    int64_t kn = k->allocation.current + (int64_t)k->pending_blocks;
    if (kb > k->active_bytes_peak) k->active_bytes_peak = kb;
    if (kn > k->active_peak) k->active_peak = kn;
  }
}

#endif /* VRAM_PENDING_H */

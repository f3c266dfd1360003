/* layout.c - vram_snapshot: every segment of the pool with the blocks that tile it.
 *
 * Free memory is reported as PyTorch's snapshots report it: one inactive block between two
 * blocks in use, however many free and parked blocks the engine keeps there (a parked block
 * merges with its neighbours on the next allocation that misses it; the user sees no seam).
 *
 * Fixed segments are reported whole. A virtual-memory segment is a large reserved range of
 * which only some granules are mapped; each run of mapped granules is reported as one
 * expandable segment, tiled by the blocks over it (a free block that reaches into unmapped
 * granules is cut at the run's ends; blocks in use always lie on mapped granules). */
#include <stdlib.h>

#include "pool/call.h"
#include "pool/events.h"

typedef struct layout {
  vram_snapshot_segment_t *segs;
  vram_snapshot_block_t *blocks;
  size_t n_segs, n_blocks;
  bool fill;
  const vram_ctx_table *contexts; /* NULL when none are kept */
  int device;
  uint64_t free_end; /* the end of the inactive block just reported in this segment, or 0 */
} layout;

static void begin_segment(layout *l, const vram_segment *s, uint64_t addr, uint64_t size,
                          bool expandable) {
  if (l->fill)
    l->segs[l->n_segs] = (vram_snapshot_segment_t){.addr = addr, .size = size,
                                                   .stream = _vram_stream_id(s->arena->stream),
                                                   .first_block = l->n_blocks,
                                                   .device = l->device,
                                                   .is_expandable = expandable,
                                                   .context = s->context};
  l->n_segs++;
  l->free_end = 0;
}

static void end_segment(layout *l) {
  if (l->fill) {
    vram_snapshot_segment_t *s = &l->segs[l->n_segs - 1];
    s->n_blocks = l->n_blocks - s->first_block;
  }
}

/* Parked blocks are free memory to the user, so they are inactive like free ones; free
 * address neighbours read as one block. */
static void add_block(layout *l, const vram_block *b, uint64_t addr, uint64_t size) {
  bool inactive = b->state != VRAM_BLOCK_LIVE && b->state != VRAM_BLOCK_PENDING;
  if (inactive && l->free_end == addr) {
    if (l->fill) l->blocks[l->n_blocks - 1].size += size;
    l->free_end = addr + size;
    return;
  }
  l->free_end = inactive ? addr + size : 0;
  if (l->fill) {
    vram_snapshot_block_t *o = &l->blocks[l->n_blocks];
    *o = (vram_snapshot_block_t){.addr = addr, .size = size, .state = VRAM_SNAPSHOT_INACTIVE};
    if (b->state == VRAM_BLOCK_LIVE || b->state == VRAM_BLOCK_PENDING) {
      o->state = b->state == VRAM_BLOCK_LIVE ? VRAM_SNAPSHOT_ACTIVE_ALLOCATED
                                             : VRAM_SNAPSHOT_ACTIVE_PENDING_FREE;
      o->requested = b->requested;
      o->context = l->contexts ? _vram_ctx_get(l->contexts, b->addr) : 0;
    }
  }
  l->n_blocks++;
}

/* The runs of mapped granules of a virtual segment, each with the blocks over it. */
static void add_virtual_segment(layout *l, const vram_segment *s, size_t G) {
  const vram_block *b = s->first;
  for (size_t g = 0; g < s->gran_hwm;) {
    if (!((s->gran_mapped[g / 64] >> (g % 64)) & 1)) {
      g++;
      continue;
    }
    size_t e = g + 1;
    while (e < s->gran_hwm && ((s->gran_mapped[e / 64] >> (e % 64)) & 1)) e++;
    uint64_t lo = s->addr + g * G, hi = s->addr + e * G;
    begin_segment(l, s, lo, hi - lo, true);
    while (b && b->addr + b->size <= lo) b = b->addr_next;
    for (; b && b->addr < hi; b = b->addr_next) {
      uint64_t from = b->addr > lo ? b->addr : lo, end = b->addr + b->size;
      add_block(l, b, from, (end < hi ? end : hi) - from);
      if (end > hi) break; /* it reaches the next run too */
    }
    end_segment(l);
    g = e;
  }
}

static void walk(const vram_pool_t *pool, layout *l) {
  for (const vram_arena *a = pool->arenas; a; a = a->next)
    for (const vram_segment *s = a->segments; s; s = s->next) {
      if (s->gran_mapped) {
        add_virtual_segment(l, s, pool->granularity);
        continue;
      }
      begin_segment(l, s, s->addr, s->size, false);
      for (const vram_block *b = s->first; b; b = b->addr_next) add_block(l, b, b->addr, b->size);
      end_segment(l);
    }
}

typedef struct snapshot_call {
  vram_snapshot_segment_t *segs;
  vram_snapshot_block_t *blocks;
  size_t seg_cap, block_cap, *n_segs, *n_blocks;
} snapshot_call;

static int by_addr(const void *a, const void *b) {
  uint64_t x = ((const vram_snapshot_segment_t *)a)->addr;
  uint64_t y = ((const vram_snapshot_segment_t *)b)->addr;
  return x < y ? -1 : x > y;
}

static int snapshot_locked(vram_pool_t *pool, void *arg) {
  snapshot_call *c = arg;
  const vram_history *h = pool->history;
  layout l = {c->segs, c->blocks, 0, 0, false,
              h && _vram_ctx_kept(&h->contexts) ? &h->contexts : NULL, pool->opts.device, 0};
  walk(pool, &l);
  if (c->n_segs) *c->n_segs = l.n_segs;
  if (c->n_blocks) *c->n_blocks = l.n_blocks;
  /* A call that only asks for the totals (or whose arrays are too small) took no
   * snapshot: only the call that fills the arrays is recorded as one. */
  if (l.n_segs > c->seg_cap || l.n_blocks > c->block_cap) return VRAM_OK;
  _vram_note(pool, VRAM_EVENT_SNAPSHOT, 0, (uint64_t)pool->stats.reserved_bytes.current,
             (uint64_t)pool->stats.allocated_bytes.current, NULL, 0);
  l.n_segs = l.n_blocks = 0;
  l.fill = true;
  walk(pool, &l);
  /* Segments in address order; each keeps its own run of blocks. */
  if (l.n_segs > 1) qsort(c->segs, l.n_segs, sizeof *c->segs, by_addr);
  return VRAM_OK;
}

int vram_snapshot(vram_pool_t *pool, vram_snapshot_segment_t *segments, size_t segment_cap,
                  size_t *n_segments, vram_snapshot_block_t *blocks, size_t block_cap,
                  size_t *n_blocks) {
  if (!pool || (!segments && segment_cap) || (!blocks && block_cap)) return VRAM_EINVAL;
  snapshot_call c = {segments, blocks, segment_cap, block_cap, n_segments, n_blocks};
  return locked_call(pool, snapshot_locked, &c, NULL);
}

/* pending.c - cross-stream frees waiting for events, and the spare events they reuse.
 *
 * A block used on other streams (vram_record_stream) cannot be reused when it is freed: the
 * work queued on those streams may still read it. One event is recorded on each of them,
 * the block becomes PENDING, and it is merged back once every event has completed. The
 * list is drained when an allocation misses, now and then while others hit, and before
 * memory goes back to the source.
 *
 * A block lent from one stream's arena to a request on another is ordered the same way:
 * the borrowing stream waits for the owner's work before it uses the block, and the block
 * lists the borrowing stream, so that its free waits for it. */
#include <stdlib.h>

#include "pool/block.h"
#include "pool/events.h"
#include "pool/pending.h"

static int event_take(vram_pool_t *pool, void **event) {
  if (pool->n_spare_events) {
    *event = pool->spare_events[--pool->n_spare_events];
    return VRAM_OK;
  }
  return pool->src->xEventCreate(pool->src_state, event);
}

static void event_give(vram_pool_t *pool, void *event) {
  if (pool->n_spare_events == pool->cap_spare_events) {
    size_t cap = pool->cap_spare_events ? pool->cap_spare_events * 2 : 16;
    void **grown = realloc(pool->spare_events, cap * sizeof *grown);
    if (!grown) {
      pool->src->xEventDestroy(pool->src_state, event);
      return;
    }
    pool->spare_events = grown;
    pool->cap_spare_events = cap;
  }
  pool->spare_events[pool->n_spare_events++] = event;
}

static void pending_finish_block(vram_pool_t *pool, vram_block *b) {
  _vram_ptrmap_remove(&pool->ptrs, b->addr);
  pool->pending_bytes -= b->size;
  pool->pending_blocks--;
  _vram_kind_of(pool, b->segment)->pending_bytes -= b->size;
  _vram_kind_of(pool, b->segment)->pending_blocks--;
  _vram_note_free_completed(pool, b->addr, b->size, b->requested, _vram_block_stream(b));
  free(b->uses);
  b->uses = NULL;
  _vram_block_make_free(pool, b);
}

void _vram_pending_drain(vram_pool_t *pool, bool wait) {
  vram_pending **link = &pool->pending_head;
  vram_pending *last = NULL;
  if (wait) pool->num_sync_all_streams++;
  while (*link) {
    vram_pending *p = *link;
    int done = wait ? (pool->src->xEventSynchronize(pool->src_state, p->event) == VRAM_OK)
                    : (pool->src->xEventQuery(pool->src_state, p->event) == 1);
    if (wait && done) pool->stats.num_sync_waits++;
    if (!done) {
      last = p;
      link = &p->next;
      continue;
    }
    *link = p->next;
    pool->pending_count--;
    event_give(pool, p->event);
    vram_block *b = p->block;
    free(p);
    if (--b->events_left == 0) pending_finish_block(pool, b);
  }
  pool->pending_tail = last;
}

int _vram_pending_free(vram_pool_t *pool, vram_block *b) {
  int n = b->uses->count;
  vram_pending *entries[n];
  int rc = VRAM_OK, made = 0;
  for (; made < n; made++) {
    vram_pending *p = malloc(sizeof *p);
    void *event = NULL;
    if (!p) { rc = VRAM_EHOSTMEM; break; }
    rc = event_take(pool, &event);
    if (!rc) rc = pool->src->xEventRecord(pool->src_state, event, b->uses->streams[made]);
    if (rc) {
      if (event) event_give(pool, event);
      free(p);
      break;
    }
    p->block = b;
    p->event = event;
    p->next = NULL;
    entries[made] = p;
  }
  if (rc) {
    for (int i = 0; i < made; i++) {
      event_give(pool, entries[i]->event);
      free(entries[i]);
    }
    return rc;
  }
  for (int i = 0; i < n; i++) {
    if (pool->pending_tail) pool->pending_tail->next = entries[i];
    else pool->pending_head = entries[i];
    pool->pending_tail = entries[i];
  }
  pool->pending_count += (size_t)n;
  pool->pending_bytes += b->size;
  pool->pending_blocks++;
  _vram_kind_of(pool, b->segment)->pending_bytes += b->size;
  _vram_kind_of(pool, b->segment)->pending_blocks++;
  b->state = VRAM_BLOCK_PENDING;
  b->events_left = (uint32_t)n;
  return VRAM_OK;
}

int _vram_pending_add_use(vram_block *b, vram_stream_t stream) {
  vram_stream_uses *u = b->uses;
  for (int i = 0; u && i < u->count; i++)
    if (u->streams[i] == stream) return VRAM_OK;
  if (!u || u->count == u->capacity) {
    int cap = u ? u->capacity * 2 : 2;
    vram_stream_uses *grown = realloc(u, sizeof *u + (size_t)cap * sizeof(vram_stream_t));
    if (!grown) return VRAM_EHOSTMEM;
    if (!u) {
      grown->count = 0;
      grown->borrowed = false;
    }
    grown->capacity = cap;
    b->uses = u = grown;
  }
  u->streams[u->count++] = stream;
  return VRAM_OK;
}

int _vram_pending_borrow(vram_pool_t *pool, const vram_arena *owner, vram_stream_t stream,
                         vram_stream_uses **uses) {
  vram_stream_uses *u = malloc(sizeof *u + 2 * sizeof(vram_stream_t));
  if (!u) return VRAM_EHOSTMEM;
  void *event = NULL;
  int rc = event_take(pool, &event);
  if (!rc) rc = pool->src->xEventRecord(pool->src_state, event, owner->stream);
  /* The wait holds the event as it was recorded now: the event may be recorded again. */
  if (!rc) rc = pool->src->xStreamWaitEvent(pool->src_state, stream, event);
  if (event) event_give(pool, event);
  if (rc) {
    free(u);
    return rc;
  }
  u->count = 1;
  u->capacity = 2;
  u->borrowed = true;
  u->streams[0] = stream;
  *uses = u;
  return VRAM_OK;
}

void _vram_pending_destroy(vram_pool_t *pool) {
  _vram_pending_drain(pool, true);
  vram_pending *p = pool->pending_head;
  while (p) { /* events that failed to synchronize: drop them */
    vram_pending *next = p->next;
    pool->src->xEventDestroy(pool->src_state, p->event);
    free(p);
    p = next;
  }
  pool->pending_head = pool->pending_tail = NULL;
  for (size_t i = 0; i < pool->n_spare_events; i++)
    pool->src->xEventDestroy(pool->src_state, pool->spare_events[i]);
  free(pool->spare_events);
  pool->spare_events = NULL;
  pool->n_spare_events = pool->cap_spare_events = 0;
}

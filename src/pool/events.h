/* events.h - how the pool tells the history recorder (obs/history.h) what happens.
 *
 * The pool is the observed side: it hands addresses, sizes, streams and context ids down to
 * the recorder and never the other way. malloc and free take their recording path only when
 * pool->history_flags says so (pool.c); the rarer events below check pool->history, which
 * is NULL while nothing records. All of these run with the pool's lock held. */
#ifndef VRAM_EVENTS_H
#define VRAM_EVENTS_H

#include "obs/history.h"
#include "pool/types.h"

/* Bits of pool->history_flags. */
#define VRAM_REC_EVENTS 1u   /* events go to the ring */
#define VRAM_REC_CONTEXTS 2u /* the user's context function is called at each allocation */
#define VRAM_REC_LEAKS 4u    /* VRAMKIT_LEAK_REPORT: C stacks kept for the report at exit */
#define VRAM_REC_KEEP 8u     /* after a stop: no events, but the contexts of live blocks are
                                kept true (frees drop theirs, new blocks get none) */
#define VRAM_REC_KINDS 16u   /* split_stats: malloc and free take the recording path, which
                                keeps the small and large shares, so that pools without them
                                pay not even a branch for them */
#define VRAM_REC_FREE_CONTEXTS 32u /* ... and at each free, for the free's own event */
/* The bits a history start or stop keeps: they belong to the pool, not to the recording. */
#define VRAM_REC_POOL_BITS (VRAM_REC_LEAKS | VRAM_REC_KINDS)

static inline uint64_t _vram_stream_id(vram_stream_t stream) { return (uint64_t)(uintptr_t)stream; }

/* history.c: record one event (when the ring records). */
void _vram_emit(vram_pool_t *pool, int kind, uint64_t addr, uint64_t size, uint64_t requested,
                vram_stream_t stream, uint64_t context);

static inline void _vram_note(vram_pool_t *pool, int kind, uint64_t addr, uint64_t size,
                              uint64_t requested, vram_stream_t stream, uint64_t context) {
  if (__builtin_expect(pool->history != NULL, 0))
    _vram_emit(pool, kind, addr, size, requested, stream, context);
}

/* The context of the call under way, while one records (else 0). */
static inline uint64_t _vram_call_context(const vram_pool_t *pool) {
  return pool->history ? pool->history->call_context : 0;
}

/* Set (then clear, with 0) the context the events of the locked call under way carry. */
static inline void _vram_call_context_set(vram_pool_t *pool, uint64_t context) {
  if (pool->history) pool->history->call_context = context;
}

/* history.c: the context of an allocation about to be made, called outside the lock:
 * the user's function where contexts were asked for, else a C stack in leak mode. */
uint64_t _vram_context_current(unsigned flags, void *call_site);

/* A block became live: keep its context and record it. */
static inline void _vram_note_alloc(vram_pool_t *pool, vram_history *h, uint64_t addr,
                                    uint64_t size, uint64_t requested, vram_stream_t stream,
                                    uint64_t context) {
  (void)pool;
  if (_vram_ctx_kept(&h->contexts)) _vram_ctx_set(&h->contexts, addr, context);
  _vram_history_record(h, VRAM_EVENT_ALLOC, addr, size, requested, _vram_stream_id(stream),
                       context);
}

/* A block was freed: reusable at once (same stream) or once its events complete (pending:
 * the completion comes from _vram_note_free_completed). A same-stream free's two events
 * share one tick and one ring slot. Without a context table there is no call to make. */
static inline void _vram_note_free(vram_pool_t *pool, vram_history *h, uint64_t addr,
                                   uint64_t size, uint64_t requested, vram_stream_t stream,
                                   bool pending) {
  (void)pool;
  uint64_t context = 0;
  if (_vram_ctx_kept(&h->contexts))
    context = pending ? _vram_ctx_get(&h->contexts, addr) : _vram_ctx_take(&h->contexts, addr);
  if (h->call_context) context = h->call_context; /* the free's own, under context="all" */
  _vram_history_record(h, pending ? VRAM_EVENT_FREE_REQUESTED : VRAM_HSLOT_FREE_PAIR, addr, size,
                       requested, _vram_stream_id(stream), context);
}

/* A pending free's events completed. */
static inline void _vram_note_free_completed(vram_pool_t *pool, uint64_t addr, uint64_t size,
                                             uint64_t requested, vram_stream_t stream) {
  vram_history *h = pool->history;
  if (__builtin_expect(h == NULL, 1)) return;
  uint64_t context = _vram_ctx_take(&h->contexts, addr);
  _vram_history_record(h, VRAM_EVENT_FREE_COMPLETED, addr, size, requested,
                       _vram_stream_id(stream), context);
}

/* history.c: at pool creation, VRAMKIT_LEAK_REPORT=1 gives the pool a recorder that keeps
 * the C stack of each live block, for the report printed at exit; at teardown the
 * recorder goes. _vram_leak_report_pool prints the pool's report now (a forced destroy). */
int _vram_history_attach_env(vram_pool_t *pool);
void _vram_history_detach(vram_pool_t *pool);
void _vram_leak_report_pool(vram_pool_t *pool);

#endif /* VRAM_EVENTS_H */

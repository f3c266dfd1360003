/* fault.c - a source wrapper that makes chosen calls fail (SQLite's test VFS idea).
 *
 * Wraps any source table: every fallible call that changes device state (alloc, free,
 * reserve, unreserve, map, unmap, event record, stream wait) is numbered from 1; call
 * number fail_at fails with VRAM_EFAULT without reaching the inner source, and after it every
 * fail_every-th call fails too. The engine must come out of each failure valid with every
 * live block intact; the tests sweep fail_at over every call of a scenario.
 *
 * The same wrapper counts device memory for whoever asks (the give-back group, which needs
 * every byte a pool takes as it takes it, and refuses growth past a group limit): each
 * segment or mapping is offered to count_take before the inner source sees it, and what
 * goes back is told to count_give. */
#include <stdbool.h>
#include <stdlib.h>

#include "source/forward.h"

typedef struct fault_state {
  vram_inner_source in;      /* first: the forwarders of forward.h read it */
  vram_fault_plan plan;
  uint64_t calls;
  vram_source_methods table; /* the wrapper's own methods, with inner's optional holes */
} fault_state;

static bool fault_now(fault_state *f) {
  uint64_t n = ++f->calls;
  if (!f->plan.fail_at || n < f->plan.fail_at) return false;
  if (n == f->plan.fail_at) return true;
  return f->plan.fail_every && (n - f->plan.fail_at) % f->plan.fail_every == 0;
}

static void fault_close(void *state) {
  fault_state *f = state;
  f->in.inner->xClose(f->in.inner_state);
  if (f->plan.count_close) f->plan.count_close(f->plan.count_user);
  free(f);
}

/* The device bytes of a segment or mapping of `size`: the source rounds it to its unit. */
static size_t device_bytes(fault_state *f, size_t size) {
  size_t unit = f->in.inner->xGranularity(f->in.inner_state);
  return (size + unit - 1) & ~(unit - 1);
}
static bool count_take(fault_state *f, size_t size) {
  return !f->plan.count_take || f->plan.count_take(f->plan.count_user, device_bytes(f, size));
}
static void count_give(fault_state *f, size_t size) {
  if (f->plan.count_give) f->plan.count_give(f->plan.count_user, device_bytes(f, size));
}
static size_t fault_granularity(void *state) {
  fault_state *f = state;
  return f->in.inner->xGranularity(f->in.inner_state);
}
static int fault_alloc(void *state, size_t size, vram_stream_t stream, uintptr_t *addr) {
  fault_state *f = state;
  if (fault_now(f)) return VRAM_EFAULT;
  if (!count_take(f, size)) return VRAM_ENOMEM;
  int rc = f->in.inner->xAlloc(f->in.inner_state, size, stream, addr);
  if (rc) count_give(f, size);
  return rc;
}
static int fault_free(void *state, uintptr_t addr, size_t size, vram_stream_t stream) {
  fault_state *f = state;
  if (fault_now(f)) return VRAM_EFAULT;
  int rc = f->in.inner->xFree(f->in.inner_state, addr, size, stream);
  if (!rc) count_give(f, size);
  return rc;
}
static int fault_reserve(void *state, size_t size, uintptr_t *addr) {
  fault_state *f = state;
  return fault_now(f) ? VRAM_EFAULT : f->in.inner->xReserve(f->in.inner_state, size, addr);
}
static int fault_unreserve(void *state, uintptr_t addr, size_t size) {
  fault_state *f = state;
  return fault_now(f) ? VRAM_EFAULT : f->in.inner->xUnreserve(f->in.inner_state, addr, size);
}
static int fault_map(void *state, uintptr_t addr, size_t size) {
  fault_state *f = state;
  if (fault_now(f)) return VRAM_EFAULT;
  if (!count_take(f, size)) return VRAM_ENOMEM;
  int rc = f->in.inner->xMap(f->in.inner_state, addr, size);
  if (rc) count_give(f, size);
  return rc;
}
static int fault_unmap(void *state, uintptr_t addr, size_t size) {
  fault_state *f = state;
  if (fault_now(f)) return VRAM_EFAULT;
  int rc = f->in.inner->xUnmap(f->in.inner_state, addr, size);
  if (!rc) count_give(f, size);
  return rc;
}
static int fault_enable_peer(void *state, int peer) {
  fault_state *f = state;
  return f->in.inner->xEnablePeer(f->in.inner_state, peer);
}
static int fault_prefetch(void *state, uintptr_t addr, size_t size, int to_device,
                          vram_stream_t stream) {
  fault_state *f = state;
  return f->in.inner->xPrefetch(f->in.inner_state, addr, size, to_device, stream);
}
static int fault_event_record(void *state, void *event, vram_stream_t stream) {
  fault_state *f = state;
  return fault_now(f) ? VRAM_EFAULT : f->in.inner->xEventRecord(f->in.inner_state, event, stream);
}
static int fault_stream_wait_event(void *state, vram_stream_t stream, void *event) {
  fault_state *f = state;
  return fault_now(f) ? VRAM_EFAULT : f->in.inner->xStreamWaitEvent(f->in.inner_state, stream, event);
}

/* Who is on the device is a question, not an allocation: never a planted failure. */



int _vram_fault_wrap(const vram_source_methods *inner, void *inner_state,
                     const vram_fault_plan *plan, const vram_source_methods **out_methods,
                     void **out_state) {
  fault_state *f = calloc(1, sizeof *f);
  if (!f) return VRAM_EHOSTMEM;
  f->in.inner = inner;
  f->in.inner_state = inner_state;
  f->plan = *plan;
  f->table = (vram_source_methods){
      .zName = inner->zName,
      .is_vmm = inner->is_vmm,
      .xClose = fault_close,
      .xGranularity = fault_granularity,
      .xAlloc = inner->xAlloc ? fault_alloc : NULL,
      .xFree = inner->xFree ? fault_free : NULL,
      .xReserve = inner->xReserve ? fault_reserve : NULL,
      .xUnreserve = inner->xUnreserve ? fault_unreserve : NULL,
      .xMap = inner->xMap ? fault_map : NULL,
      .xUnmap = inner->xUnmap ? fault_unmap : NULL,
      .xEnablePeer = inner->xEnablePeer ? fault_enable_peer : NULL,
      .xPrefetch = inner->xPrefetch ? fault_prefetch : NULL,
      .xEventRecord = fault_event_record,
      .xStreamWaitEvent = fault_stream_wait_event,
      VRAM_FORWARDED_METHODS(inner),
  };
  *out_methods = &f->table;
  *out_state = f;
  return VRAM_OK;
}

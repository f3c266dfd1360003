/* callback.c - a source whose segments come from the caller's functions
 * (vram_source_callbacks_t): the memory of a PyTorch MemPool made with an allocator of its
 * own (NCCL's or NVSHMEM's symmetric memory, a CUDAPluggableAllocator), or of any program
 * that owns its device memory, as RMM's callback_memory_resource takes it.
 *
 * Only segments come from the callbacks. Everything else a pool needs of a source (events
 * to order streams, the device's free and total memory, who else is on it) is the inner
 * source's, the one the pool's options name, which this wrapper owns and closes: on a GPU
 * the callbacks' memory lives on the same device as the driver's, and on sim the tests
 * drive it without one. No virtual memory: the callbacks hand out whole allocations, so a
 * pool on them holds fixed segments only.
 *
 * A failing alloc is the device refusing memory (VRAM_ENOMEM: the pool's OOM ladder and
 * report follow); a pointer the engine cannot use (NULL, or not aligned to a block) goes
 * back at once and fails the call as a driver error would. */
#include <stdlib.h>

#include "source/forward.h"

#define CALLBACK_DEFAULT_UNIT ((size_t)2 << 20) /* the driver's segment rounding */
#define CALLBACK_ALIGN 512                      /* the engine's block alignment */

typedef struct callback_state {
  vram_inner_source in; /* first: the forwarders of forward.h read it */
  vram_source_callbacks_t cb;
  int device;
  vram_source_methods table;
} callback_state;

static void callback_close(void *state) {
  callback_state *c = state;
  c->in.inner->xClose(c->in.inner_state);
  free(c);
}

static size_t callback_granularity(void *state) {
  callback_state *c = state;
  return c->cb.granularity ? c->cb.granularity : CALLBACK_DEFAULT_UNIT;
}

static int callback_alloc(void *state, size_t size, vram_stream_t stream, uintptr_t *addr) {
  callback_state *c = state;
  void *ptr = NULL;
  if (c->cb.alloc(c->cb.ctx, size, c->device, stream, &ptr) != 0) return VRAM_ENOMEM;
  if (!ptr) return VRAM_ENOMEM;
  if ((uintptr_t)ptr % CALLBACK_ALIGN) {
    c->cb.free(c->cb.ctx, ptr, size, c->device, stream);
    return VRAM_EDRIVER;
  }
  *addr = (uintptr_t)ptr;
  return VRAM_OK;
}

static int callback_free(void *state, uintptr_t addr, size_t size, vram_stream_t stream) {
  callback_state *c = state;
  c->cb.free(c->cb.ctx, (void *)addr, size, c->device, stream);
  return VRAM_OK;
}

int _vram_callback_wrap(const vram_source_methods *inner, void *inner_state, int device,
                        const vram_source_callbacks_t *callbacks,
                        const vram_source_methods **out_methods, void **out_state) {
  callback_state *c = calloc(1, sizeof *c);
  if (!c) return VRAM_EHOSTMEM;
  c->in.inner = inner;
  c->in.inner_state = inner_state;
  c->cb = *callbacks;
  c->device = device;
  c->table = (vram_source_methods){
      .zName = "callback",
      .is_vmm = 0,
      .xClose = callback_close,
      .xGranularity = callback_granularity,
      .xAlloc = callback_alloc,
      .xFree = callback_free,
      .xEventRecord = _vram_forward_event_record,
      .xStreamWaitEvent = _vram_forward_stream_wait_event,
      VRAM_FORWARDED_METHODS(inner),
  };
  *out_methods = &c->table;
  *out_state = c;
  return VRAM_OK;
}

/* cuda.c - the `cuda` source: fixed device segments from cuMemAlloc / cuMemFree, and the
 * virtual ranges the engine grows into near the cap (vram_options_t.virtual_threshold).
 *
 * The source `sim` models. Segments are whole driver allocations, rounded by the engine to
 * xGranularity (2 MiB, the size the driver itself rounds large allocations to, so asking for
 * less would only hide the waste). The virtual methods are the vmm source's, on a vmm state
 * opened on first use: a pool that never nears its cap never touches the virtual memory
 * API. Where the device or driver lacks it, or maps in another unit than 2 MiB, they answer
 * VRAM_EUNSUPPORTED and the engine stays on fixed segments. Device, context, memory
 * information and events come from the shared helpers in prim/cuda_driver.c.
 */
#include <stdlib.h>

#include "prim/cuda_driver.h"
#include "source/source.h"

#define VRAM_CUDA_SEGMENT_UNIT ((size_t)2 << 20)

typedef struct cuda_state {
  vram_cuda_device dev; /* first: the shared event and info helpers take the state as it */
  void *vmm;            /* the vmm source's state, once a virtual range was asked for */
  int vmm_status;       /* VRAM_OK until opening it failed: then why, for every later ask */
} cuda_state;

static int cuda_open(const vram_source_config *cfg, void **state) {
  cuda_state *s = calloc(1, sizeof *s);
  if (!s) return VRAM_EHOSTMEM;
  int st = _vram_cuda_device_open(&s->dev, cfg ? cfg->device : 0);
  if (st != VRAM_OK) {
    free(s);
    return st;
  }
  *state = s;
  return VRAM_OK;
}

static void cuda_close(void *state) {
  cuda_state *s = state;
  if (!s) return;
  if (s->vmm) _vram_source_vmm.xClose(s->vmm);
  _vram_cuda_device_close(&s->dev);
  free(s);
}

static size_t cuda_granularity(void *state) {
  (void)state;
  return VRAM_CUDA_SEGMENT_UNIT;
}

static int cuda_alloc(void *state, size_t size, vram_stream_t stream, uintptr_t *addr) {
  cuda_state *s = state;
  (void)stream; /* cuMemAlloc serves every stream */
  vram_cuda_scope sc;
  CUdeviceptr p = 0;
  if (size == 0) return VRAM_EINVAL;
  int st = _vram_cuda_enter(&s->dev, &sc);
  if (st != VRAM_OK) return st;
  st = _vram_cuda_status(s->dev.api->cuMemAlloc(&p, size), "cuMemAlloc_v2");
  _vram_cuda_leave(&s->dev, &sc);
  if (st == VRAM_OK) *addr = (uintptr_t)p;
  return st;
}

static int cuda_free(void *state, uintptr_t addr, size_t size, vram_stream_t stream) {
  cuda_state *s = state;
  vram_cuda_scope sc;
  (void)size; /* the driver knows the size of its own allocations */
  (void)stream;
  int st = _vram_cuda_enter(&s->dev, &sc);
  if (st != VRAM_OK) return st;
  st = _vram_cuda_status(s->dev.api->cuMemFree((CUdeviceptr)addr), "cuMemFree_v2");
  _vram_cuda_leave(&s->dev, &sc);
  return st;
}

/* The vmm state behind the virtual methods, opened on first use; NULL with *status set when
 * this device cannot have one (tried once). */
static void *virtual_state(cuda_state *s, int *status) {
  if (!s->vmm && s->vmm_status == VRAM_OK) {
    vram_source_config cfg = {.device = s->dev.ordinal};
    void *v = NULL;
    int st = _vram_source_vmm.xOpen(&cfg, &v);
    /* One rounding unit for both families: the engine's granularity is the segment unit. */
    if (st == VRAM_OK && _vram_source_vmm.xGranularity(v) != VRAM_CUDA_SEGMENT_UNIT) {
      _vram_source_vmm.xClose(v);
      _vram_cuda_set_error("cuda", "virtual memory maps in another unit than 2 MiB");
      st = VRAM_EUNSUPPORTED;
    }
    if (st != VRAM_OK) {
      /* Anything that stops virtual memory here means fixed segments for this pool. */
      s->vmm_status = VRAM_EUNSUPPORTED;
    } else {
      s->vmm = v;
    }
  }
  *status = s->vmm ? VRAM_OK : s->vmm_status;
  return s->vmm;
}

static int cuda_reserve(void *state, size_t size, uintptr_t *addr) {
  int st;
  void *v = virtual_state(state, &st);
  return v ? _vram_source_vmm.xReserve(v, size, addr) : st;
}

static int cuda_unreserve(void *state, uintptr_t addr, size_t size) {
  int st;
  void *v = virtual_state(state, &st);
  return v ? _vram_source_vmm.xUnreserve(v, addr, size) : st;
}

static int cuda_map(void *state, uintptr_t addr, size_t size) {
  int st;
  void *v = virtual_state(state, &st);
  return v ? _vram_source_vmm.xMap(v, addr, size) : st;
}

static int cuda_unmap(void *state, uintptr_t addr, size_t size) {
  int st;
  void *v = virtual_state(state, &st);
  return v ? _vram_source_vmm.xUnmap(v, addr, size) : st;
}

/* Peers reach fixed segments through the context's peer access (cuCtxEnablePeerAccess, the
 * caller's); virtual ranges need each mapping opened to them, which the vmm state does for
 * what it maps now and later. */
static int cuda_enable_peer(void *state, int peer) {
  int st;
  void *v = virtual_state(state, &st);
  return v ? _vram_source_vmm.xEnablePeer(v, peer) : st;
}

const vram_source_methods _vram_source_cuda = {
  .zName = "cuda",
  .is_vmm = 0,
  .xOpen = cuda_open,
  .xClose = cuda_close,
  .xGranularity = cuda_granularity,
  .xMemInfo = _vram_cuda_mem_info,
  .xAlloc = cuda_alloc,
  .xFree = cuda_free,
  .xReserve = cuda_reserve,
  .xUnreserve = cuda_unreserve,
  .xMap = cuda_map,
  .xUnmap = cuda_unmap,
  .xEnablePeer = cuda_enable_peer,
  .xEventCreate = _vram_cuda_event_create,
  .xEventDestroy = _vram_cuda_event_destroy,
  .xEventRecord = _vram_cuda_event_record,
  .xEventQuery = _vram_cuda_event_query,
  .xEventSynchronize = _vram_cuda_event_synchronize,
  .xStreamWaitEvent = _vram_cuda_stream_wait_event,
    .xDeviceUuid = _vram_source_device_uuid,
    .xProcesses = _vram_source_processes,
};

/* cuda.c - the `cuda` source: fixed device segments from cuMemAlloc / cuMemFree.
 *
 * The simplest GPU source and the one `sim` models. Segments are whole driver allocations,
 * rounded by the engine to xGranularity (2 MiB, the size the driver itself rounds large
 * allocations to, so asking for less would only hide the waste). Device, context, memory
 * information and events come from the shared helpers in prim/cuda_driver.c.
 */
#include <stdlib.h>

#include "prim/cuda_driver.h"
#include "source/source.h"

#define VRAM_CUDA_SEGMENT_UNIT ((size_t)2 << 20)

typedef struct cuda_state {
  vram_cuda_device dev; /* first: the shared event and info helpers take the state as it */
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
  _vram_cuda_device_close(&s->dev);
  free(s);
}

static size_t cuda_granularity(void *state) {
  (void)state;
  return VRAM_CUDA_SEGMENT_UNIT;
}

static int cuda_alloc(void *state, size_t size, uintptr_t *addr) {
  cuda_state *s = state;
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

static int cuda_free(void *state, uintptr_t addr, size_t size) {
  cuda_state *s = state;
  vram_cuda_scope sc;
  (void)size; /* the driver knows the size of its own allocations */
  int st = _vram_cuda_enter(&s->dev, &sc);
  if (st != VRAM_OK) return st;
  st = _vram_cuda_status(s->dev.api->cuMemFree((CUdeviceptr)addr), "cuMemFree_v2");
  _vram_cuda_leave(&s->dev, &sc);
  return st;
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
  .xReserve = NULL,
  .xUnreserve = NULL,
  .xMap = NULL,
  .xUnmap = NULL,
  .xEnablePeer = NULL,
  .xEventCreate = _vram_cuda_event_create,
  .xEventDestroy = _vram_cuda_event_destroy,
  .xEventRecord = _vram_cuda_event_record,
  .xEventQuery = _vram_cuda_event_query,
  .xEventSynchronize = _vram_cuda_event_synchronize,
};

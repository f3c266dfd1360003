/* managed.c - the `managed` source: fixed segments of unified memory (cuMemAllocManaged)
 * that prefer to live on the device and migrate to the host under pressure.
 *
 * Each new segment is advised to prefer the device and to be accessed by it (so its pages
 * stay mapped there and the GPU faults less), and, when the configuration asks, prefetched
 * to the device at once so that first use does not pay page faults. The advice and the
 * prefetch need a device that accesses managed memory concurrently with the host (Pascal
 * and later on Linux); elsewhere the segments are plain managed memory.
 */
#include <stdlib.h>

#include "prim/cuda_driver.h"
#include "source/managed.h"
#include "source/source.h"

#define VRAM_MANAGED_SEGMENT_UNIT ((size_t)2 << 20)

typedef struct managed_state {
  vram_cuda_device dev; /* first: the shared event and info helpers take the state as it */
  int concurrent;       /* CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS */
  int prefetch;         /* prefetch new segments to the device */
} managed_state;

static int managed_open(const vram_source_config *cfg, void **state) {
  managed_state *s = calloc(1, sizeof *s);
  if (!s) return VRAM_EHOSTMEM;
  int st = _vram_cuda_device_open(&s->dev, cfg ? cfg->device : 0);
  if (st != VRAM_OK) {
    free(s);
    return st;
  }
  int has_managed = 0;
  if (!s->dev.api->cuMemAllocManaged) {
    _vram_cuda_set_error("managed", "the driver lacks cuMemAllocManaged");
    st = VRAM_EUNSUPPORTED;
    goto fail;
  }
  st = _vram_cuda_device_attribute(&s->dev, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, &has_managed);
  if (st != VRAM_OK) goto fail;
  if (!has_managed) {
    _vram_cuda_set_error("managed", "the device cannot allocate managed memory");
    st = VRAM_EUNSUPPORTED;
    goto fail;
  }
  st = _vram_cuda_device_attribute(&s->dev, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
                                   &s->concurrent);
  if (st != VRAM_OK) goto fail;
  s->prefetch = cfg ? cfg->managed_prefetch : 1;
  *state = s;
  return VRAM_OK;

fail:
  _vram_cuda_device_close(&s->dev);
  free(s);
  return st;
}

static void managed_close(void *state) {
  managed_state *s = state;
  if (!s) return;
  _vram_cuda_device_close(&s->dev);
  free(s);
}

static size_t managed_granularity(void *state) {
  (void)state;
  return VRAM_MANAGED_SEGMENT_UNIT;
}

static int managed_alloc(void *state, size_t size, vram_stream_t stream, uintptr_t *addr) {
  managed_state *s = state;
  (void)stream;
  const vram_cuda_api *a = s->dev.api;
  vram_cuda_scope sc;
  CUdeviceptr p = 0;
  if (size == 0) return VRAM_EINVAL;
  int st = _vram_cuda_enter(&s->dev, &sc);
  if (st != VRAM_OK) return st;
  /* ATTACH_GLOBAL: any stream on any device may touch the segment, as the engine hands
   * its blocks to whichever stream asks. */
  st = _vram_cuda_status(a->cuMemAllocManaged(&p, size, CU_MEM_ATTACH_GLOBAL),
                         "cuMemAllocManaged");
  if (st != VRAM_OK) goto out;
  if (s->concurrent) {
    /* A segment whose advice or prefetch fails is given back: a half-advised segment
     * would behave unlike every other one, and the failure means something is wrong. */
    st = _vram_cuda_mem_advise(&s->dev, p, size, CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                               s->dev.ordinal);
    if (st == VRAM_OK)
      st = _vram_cuda_mem_advise(&s->dev, p, size, CU_MEM_ADVISE_SET_ACCESSED_BY,
                                 s->dev.ordinal);
    if (st == VRAM_OK && s->prefetch)
      st = _vram_cuda_mem_prefetch(&s->dev, p, size, s->dev.ordinal, NULL);
    if (st != VRAM_OK) {
      a->cuMemFree(p);
      goto out;
    }
  }
  *addr = (uintptr_t)p;
out:
  _vram_cuda_leave(&s->dev, &sc);
  return st;
}

static int managed_free(void *state, uintptr_t addr, size_t size, vram_stream_t stream) {
  managed_state *s = state;
  vram_cuda_scope sc;
  (void)size;
  (void)stream;
  int st = _vram_cuda_enter(&s->dev, &sc);
  if (st != VRAM_OK) return st;
  st = _vram_cuda_status(s->dev.api->cuMemFree((CUdeviceptr)addr), "cuMemFree_v2");
  _vram_cuda_leave(&s->dev, &sc);
  return st;
}

int _vram_managed_prefetch(void *state, uintptr_t addr, size_t size, int to_device,
                           vram_stream_t stream) {
  managed_state *s = state;
  vram_cuda_scope sc;
  if (!s || size == 0) return VRAM_EINVAL;
  if (!s->concurrent) {
    _vram_cuda_set_error("managed prefetch",
                         "the device cannot access managed memory concurrently");
    return VRAM_EUNSUPPORTED;
  }
  int st = _vram_cuda_enter(&s->dev, &sc);
  if (st != VRAM_OK) return st;
  st = _vram_cuda_mem_prefetch(&s->dev, (CUdeviceptr)addr, size,
                               to_device ? s->dev.ordinal : CU_DEVICE_CPU, (CUstream)stream);
  _vram_cuda_leave(&s->dev, &sc);
  return st;
}

const vram_source_methods _vram_source_managed = {
  .zName = "managed",
  .is_vmm = 0,
  .xOpen = managed_open,
  .xClose = managed_close,
  .xGranularity = managed_granularity,
  .xMemInfo = _vram_cuda_mem_info,
  .xAlloc = managed_alloc,
  .xFree = managed_free,
  .xReserve = NULL,
  .xUnreserve = NULL,
  .xMap = NULL,
  .xUnmap = NULL,
  .xEnablePeer = NULL,
  .xPrefetch = _vram_managed_prefetch,
  .xEventCreate = _vram_cuda_event_create,
  .xEventDestroy = _vram_cuda_event_destroy,
  .xEventRecord = _vram_cuda_event_record,
  .xEventQuery = _vram_cuda_event_query,
  .xEventSynchronize = _vram_cuda_event_synchronize,
  .xStreamWaitEvent = _vram_cuda_stream_wait_event,
    .xDeviceUuid = _vram_source_device_uuid,
    .xProcesses = _vram_source_processes,
};

/* registry.c - which source table serves each vram_source_kind, and device counts. */
#include "prim/cuda_driver.h"
#include "source/source.h"


const vram_source_methods *_vram_source_for(vram_source_kind kind) {
  switch (kind) {
    case VRAM_SOURCE_SIM: return &_vram_source_sim;
    case VRAM_SOURCE_SIM_VMM: return &_vram_source_sim_vmm;
    case VRAM_SOURCE_CUDA: return &_vram_source_cuda;
    case VRAM_SOURCE_VMM: return &_vram_source_vmm;
    case VRAM_SOURCE_MANAGED: return &_vram_source_managed;
    default: return NULL;
  }
}

int vram_device_count(vram_source_kind kind, int *count) {
  if (!count) return VRAM_EINVAL;
  *count = 0;
  /* AUTO counts the devices of the source a pool would get: sim where no driver is. */
  int rc = _vram_resolve_source(kind, &kind);
  if (rc) return rc;
  if (kind == VRAM_SOURCE_SIM || kind == VRAM_SOURCE_SIM_VMM) {
    *count = VRAM_SIM_DEVICES;
    return VRAM_OK;
  }
  const vram_cuda_api *cu;
  rc = _vram_cuda_load(&cu, NULL);
  if (rc) return rc;
  int n = 0;
  rc = _vram_cuda_status(cu->cuDeviceGetCount(&n), "cuDeviceGetCount");
  if (!rc) *count = n;
  return rc;
}

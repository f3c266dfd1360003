/* registry.c - which source table serves each vram_source_kind, what AUTO means, and how
 * many devices a kind can serve. */
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

/* Devices the driver sees; an error when there is no driver. */
static int cuda_device_count(int *count) {
  const vram_cuda_api *cu;
  int rc = _vram_cuda_load(&cu, NULL);
  if (rc) return rc;
  int n = 0;
  rc = _vram_cuda_status(cu->cuDeviceGetCount(&n), "cuDeviceGetCount");
  if (!rc) *count = n;
  return rc;
}

/* AUTO means: a real GPU source if the driver opens and sees a device, else sim. The GPU
 * default is the fixed-segment cuda source (the README explains the measurements behind
 * it). */
int _vram_resolve_source(vram_source_kind kind, vram_source_kind *resolved) {
  if (kind != VRAM_SOURCE_AUTO) {
    if (kind < VRAM_SOURCE_AUTO || kind > VRAM_SOURCE_MANAGED) return VRAM_EINVAL;
    *resolved = kind;
    return VRAM_OK;
  }
  int count = 0;
  *resolved = (cuda_device_count(&count) == VRAM_OK && count > 0) ? VRAM_SOURCE_CUDA
                                                                   : VRAM_SOURCE_SIM;
  return VRAM_OK;
}

int _vram_source_device_count(vram_source_kind kind, int *count) {
  int rc = _vram_resolve_source(kind, &kind);
  if (rc) return rc;
  if (kind == VRAM_SOURCE_SIM || kind == VRAM_SOURCE_SIM_VMM) {
    *count = VRAM_SIM_DEVICES;
    return VRAM_OK;
  }
  return cuda_device_count(count);
}

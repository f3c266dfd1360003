/* device_identity.c - which GPU a source's device is, and who else runs on it: the UUID
 * the driver gives the device and the processes NVML lists there, for the sources on the
 * CUDA driver (cuda, vmm, managed), whose state begins with their vram_cuda_device. The
 * pool asks its source (source.h), never the driver or NVML itself. */
#include "prim/cuda_driver.h"
#include "source/source.h"

void _vram_source_device_uuid(void *state, char *buf, size_t cap) {
  const vram_cuda_device *dev = state;
  if (_vram_cuda_device_uuid(dev->ordinal, buf, cap) != VRAM_OK && cap) buf[0] = 0;
}

int _vram_source_processes(void *state, vram_nvml_process *out, int max, const char **why) {
  char uuid[48];
  _vram_source_device_uuid(state, uuid, sizeof uuid);
  vram_nvml_gpu gpu;
  return _vram_nvml_processes(uuid, out, max, &gpu, why);
}

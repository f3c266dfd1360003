/* nvml.h - the few NVML calls vramkit makes, with libnvidia-ml.so.1 opened at run time like
 * the CUDA driver (no build-time dependency): the processes holding memory on one GPU,
 * named by UUID, and the GPU's memory totals. Used by the OOM report's neighbours.
 *
 * NVML's pids are the host's: inside a container with its own pid namespace they differ
 * from the pids of /proc and of the records, and names may be unavailable. */
#ifndef VRAM_PRIM_NVML_H
#define VRAM_PRIM_NVML_H

#include <stddef.h>
#include <stdint.h>

#define VRAM_NVML_NOT_AVAILABLE UINT64_MAX /* usedGpuMemory NVML could not tell */

typedef struct vram_nvml_process {
  unsigned pid;
  uint64_t used_bytes;   /* VRAM_NVML_NOT_AVAILABLE when NVML does not say */
  char name[64];         /* nvmlSystemGetProcessName's basename, or "" */
} vram_nvml_process;

typedef struct vram_nvml_gpu {
  uint64_t total, free, used;   /* nvmlDeviceGetMemoryInfo */
  int n_processes;              /* all of them, even past the caller's room */
} vram_nvml_gpu;

/* The compute processes on the GPU `uuid` ("GPU-..."). Fills at most `max` entries of
 * `out` and *gpu; returns how many were written (>= 0), else -1 with *why (static text: NVML missing, a symbol
 * missing, init or a call failing, with NVML's own message). Thread-safe; NVML is
 * initialised once and left so for the process's life. */
int _vram_nvml_processes(const char *uuid, vram_nvml_process *out, int max, vram_nvml_gpu *gpu,
                         const char **why);

#endif /* VRAM_PRIM_NVML_H */

/* vmm_probe.h - what the two driver probes (vmm_cost.c, vmm_remap.c) share: a failing
 * driver call stops the probe with its name, a microsecond clock, and the set-up of
 * device 0 for physical allocations (primary context, pinned device memory, read-write
 * access from the device itself). Header-only: each probe is one file built by hand with
 * the CUDA toolkit's cuda.h, as its header says. */
#ifndef VRAM_BENCH_VMM_PROBE_H
#define VRAM_BENCH_VMM_PROBE_H

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define GRANULE ((size_t)2 << 20)

static const char *probe_error_name(CUresult r) {
  const char *s = "?";
  cuGetErrorName(r, &s);
  return s;
}

#define CHECK(call)                                                                    \
  do {                                                                                 \
    CUresult r_ = (call);                                                              \
    if (r_ != CUDA_SUCCESS) {                                                          \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,              \
              probe_error_name(r_));                                                   \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Make device 0's primary context current (the caller releases it) and describe the memory
 * the probes map. Returns the device. */
static CUdevice probe_open(CUmemAllocationProp *prop, CUmemAccessDesc *access) {
  CUdevice dev;
  CUcontext ctx;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  *prop = (CUmemAllocationProp){0};
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = 0;
  *access = (CUmemAccessDesc){{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  return dev;
}

#endif /* VRAM_BENCH_VMM_PROBE_H */

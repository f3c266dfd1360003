/* vmm_remap.c - does access set on a virtual range survive cuMemUnmap, so that a granule
 * mapped again at the same address needs no second cuMemSetAccess? And what do the calls
 * cost when a physical handle is kept and mapped again instead of released and created?
 *
 * Needs the CUDA toolkit's cuda.h. Build and run from the repository root on the GPU:
 *
 *   gcc -std=c11 -O2 -I/usr/local/cuda/include bench/vmm_remap.c \
 *       -L/usr/local/cuda/lib64/stubs -lcuda -o /tmp/vmm_remap && /tmp/vmm_remap
 *
 * Holds at most 64 MiB. Prints one line per finding. */
#define _POSIX_C_SOURCE 199309L
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define GRANULE ((size_t)2 << 20)
#define N 32

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static const char *name(CUresult r) {
  const char *s = "?";
  cuGetErrorName(r, &s);
  return s;
}

#define MUST(call)                                                             \
  do {                                                                         \
    CUresult r_ = (call);                                                      \
    if (r_ != CUDA_SUCCESS) {                                                  \
      printf("FAILED %s: %s (line %d)\n", #call, name(r_), __LINE__);          \
      return 1;                                                                \
    }                                                                          \
  } while (0)

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  MUST(cuInit(0));
  MUST(cuDeviceGet(&dev, 0));
  MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
  MUST(cuCtxSetCurrent(ctx));
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CUdeviceptr va;
  MUST(cuMemAddressReserve(&va, N * GRANULE, GRANULE, 0, 0));

  /* 1. Access before any mapping. */
  CUresult r = cuMemSetAccess(va, N * GRANULE, &access, 1);
  printf("setaccess on an unmapped range: %s\n", name(r));

  /* 2. Map, set access, unmap, map a new handle at the same address, use it without
   *    setting access again. */
  CUmemGenericAllocationHandle h[N];
  for (int k = 0; k < N; k++) MUST(cuMemCreate(&h[k], GRANULE, &prop, 0));
  MUST(cuMemMap(va, GRANULE, 0, h[0], 0));
  MUST(cuMemSetAccess(va, GRANULE, &access, 1));
  MUST(cuMemsetD8(va, 1, GRANULE));
  MUST(cuCtxSynchronize());
  MUST(cuMemUnmap(va, GRANULE));
  MUST(cuMemMap(va, GRANULE, 0, h[1], 0));
  r = cuMemsetD8(va, 2, GRANULE);
  CUresult s = cuCtxSynchronize();
  printf("remapped granule used without setaccess: memset %s, sync %s\n", name(r), name(s));
  if (r != CUDA_SUCCESS || s != CUDA_SUCCESS) {
    printf("context is %s after the fault; stopping\n", name(cuCtxSynchronize()));
    return 0;
  }
  MUST(cuMemUnmap(va, GRANULE));

  /* 3. Costs, N granules side by side, handles kept. */
  double t0 = now_us();
  for (int k = 0; k < N; k++) MUST(cuMemMap(va + k * GRANULE, GRANULE, 0, h[k], 0));
  double t1 = now_us();
  MUST(cuMemSetAccess(va, N * GRANULE, &access, 1));
  double t2 = now_us();
  MUST(cuMemsetD8(va, 3, N * GRANULE));
  MUST(cuCtxSynchronize());
  double t3 = now_us();
  for (int k = 0; k < N; k++) MUST(cuMemUnmap(va + k * GRANULE, GRANULE));
  double t4 = now_us();
  /* again, reversed handles, no setaccess */
  for (int k = 0; k < N; k++) MUST(cuMemMap(va + k * GRANULE, GRANULE, 0, h[N - 1 - k], 0));
  double t5 = now_us();
  r = cuMemsetD8(va, 4, N * GRANULE);
  s = cuCtxSynchronize();
  double t6 = now_us();
  printf("per granule: map %.1f us, setaccess (one call, %d mappings) %.1f us per mapping, "
         "unmap %.1f us\n", (t1 - t0) / N, N, (t2 - t1) / N, (t4 - t3) / N);
  printf("remap of kept handles without setaccess: map %.1f us per granule; use: memset %s, "
         "sync %s (%.0f us)\n", (t5 - t4) / N, name(r), name(s), t6 - t5);
  for (int k = 0; k < N; k++) cuMemUnmap(va + k * GRANULE, GRANULE);
  double t7 = now_us();
  for (int k = 0; k < N; k++) MUST(cuMemRelease(h[k]));
  double t8 = now_us();
  printf("release %.1f us per handle\n", (t8 - t7) / N);
  MUST(cuMemAddressFree(va, N * GRANULE));
  return 0;
}

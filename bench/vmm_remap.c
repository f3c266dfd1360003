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
#include "vmm_probe.h"

#define N 32

int main(void) {
  CUmemAllocationProp prop;
  CUmemAccessDesc access;
  probe_open(&prop, &access);
  CUdeviceptr va;
  CHECK(cuMemAddressReserve(&va, N * GRANULE, GRANULE, 0, 0));

  /* 1. Access before any mapping. */
  CUresult r = cuMemSetAccess(va, N * GRANULE, &access, 1);
  printf("setaccess on an unmapped range: %s\n", probe_error_name(r));

  /* 2. Map, set access, unmap, map a new handle at the same address, use it without
   *    setting access again. */
  CUmemGenericAllocationHandle h[N];
  for (int k = 0; k < N; k++) CHECK(cuMemCreate(&h[k], GRANULE, &prop, 0));
  CHECK(cuMemMap(va, GRANULE, 0, h[0], 0));
  CHECK(cuMemSetAccess(va, GRANULE, &access, 1));
  CHECK(cuMemsetD8(va, 1, GRANULE));
  CHECK(cuCtxSynchronize());
  CHECK(cuMemUnmap(va, GRANULE));
  CHECK(cuMemMap(va, GRANULE, 0, h[1], 0));
  r = cuMemsetD8(va, 2, GRANULE);
  CUresult s = cuCtxSynchronize();
  printf("remapped granule used without setaccess: memset %s, sync %s\n", probe_error_name(r), probe_error_name(s));
  if (r != CUDA_SUCCESS || s != CUDA_SUCCESS) {
    printf("context is %s after the fault; stopping\n", probe_error_name(cuCtxSynchronize()));
    return 0;
  }
  CHECK(cuMemUnmap(va, GRANULE));

  /* 3. Costs, N granules side by side, handles kept. */
  double t0 = now_us();
  for (int k = 0; k < N; k++) CHECK(cuMemMap(va + k * GRANULE, GRANULE, 0, h[k], 0));
  double t1 = now_us();
  CHECK(cuMemSetAccess(va, N * GRANULE, &access, 1));
  double t2 = now_us();
  CHECK(cuMemsetD8(va, 3, N * GRANULE));
  CHECK(cuCtxSynchronize());
  double t3 = now_us();
  for (int k = 0; k < N; k++) CHECK(cuMemUnmap(va + k * GRANULE, GRANULE));
  double t4 = now_us();
  /* again, reversed handles, no setaccess */
  for (int k = 0; k < N; k++) CHECK(cuMemMap(va + k * GRANULE, GRANULE, 0, h[N - 1 - k], 0));
  double t5 = now_us();
  r = cuMemsetD8(va, 4, N * GRANULE);
  s = cuCtxSynchronize();
  double t6 = now_us();
  printf("per granule: map %.1f us, setaccess (one call, %d mappings) %.1f us per mapping, "
         "unmap %.1f us\n", (t1 - t0) / N, N, (t2 - t1) / N, (t4 - t3) / N);
  printf("remap of kept handles without setaccess: map %.1f us per granule; use: memset %s, "
         "sync %s (%.0f us)\n", (t5 - t4) / N, probe_error_name(r), probe_error_name(s), t6 - t5);
  for (int k = 0; k < N; k++) cuMemUnmap(va + k * GRANULE, GRANULE);
  double t7 = now_us();
  for (int k = 0; k < N; k++) CHECK(cuMemRelease(h[k]));
  double t8 = now_us();
  printf("release %.1f us per handle\n", (t8 - t7) / N);
  CHECK(cuMemAddressFree(va, N * GRANULE));
  return 0;
}

/* vmm_cost.c - what the CUDA driver charges for the calls a virtual-memory pool makes, by
 * size: one physical handle of N bytes (cuMemCreate + cuMemMap + cuMemSetAccess, then
 * cuMemUnmap + cuMemRelease) against N / 2 MiB handles of one granule each mapped side by
 * side with one cuMemSetAccess, the cost of moving one granule to another address (unmap,
 * map, access), and cuMemAlloc + cuMemFree of the same N. It first asks whether part of a
 * handle can be mapped on its own (a nonzero offset into it): if it could, one handle could
 * back a run whose granules are later unmapped one by one. The vmm source's
 * mapping policy (docs/performance.md) rests on these figures.
 *
 * Needs the CUDA toolkit's cuda.h. Build and run from the repository root on the GPU:
 *
 *   gcc -std=c11 -O2 -I/usr/local/cuda/include bench/vmm_cost.c \
 *       -L/usr/local/cuda/lib64/stubs -lcuda -o /tmp/vmm_cost && /tmp/vmm_cost
 *
 * Never holds more than 512 MiB at a time. Prints one line per size, microseconds per
 * call sequence (median of REPS). */
#define _POSIX_C_SOURCE 199309L
#include "vmm_probe.h"

#define REPS 9
#define MAX_GRANULES 256

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v) {
  qsort(v, REPS, sizeof *v, cmp_double);
  return v[REPS / 2];
}

int main(void) {
  CUmemAllocationProp prop;
  CUmemAccessDesc access;
  CUdevice dev = probe_open(&prop, &access);
  CUdeviceptr range;
  /* One granule past the largest size: where a moved granule goes. */
  CHECK(cuMemAddressReserve(&range, (MAX_GRANULES + 1) * GRANULE, GRANULE, 0, 0));

  {
    CUmemGenericAllocationHandle two;
    CHECK(cuMemCreate(&two, 2 * GRANULE, &prop, 0));
    CUresult r = cuMemMap(range, GRANULE, GRANULE, two, 0);
    printf("map of the second granule of a 2-granule handle (offset %zu): %s\n", GRANULE,
           probe_error_name(r));
    if (r == CUDA_SUCCESS) CHECK(cuMemUnmap(range, GRANULE));
    CHECK(cuMemRelease(two));
    /* And whether one unmap may span two neighbouring mappings. */
    CUmemGenericAllocationHandle h2[2];
    for (int k = 0; k < 2; k++) {
      CHECK(cuMemCreate(&h2[k], GRANULE, &prop, 0));
      CHECK(cuMemMap(range + k * GRANULE, GRANULE, 0, h2[k], 0));
    }
    r = cuMemUnmap(range, 2 * GRANULE);
    printf("one unmap over two neighbouring mappings: %s\n", probe_error_name(r));
    if (r != CUDA_SUCCESS)
      for (int k = 0; k < 2; k++) CHECK(cuMemUnmap(range + k * GRANULE, GRANULE));
    for (int k = 0; k < 2; k++) CHECK(cuMemRelease(h2[k]));
  }
  printf("%8s %10s %10s %10s %10s %10s %10s | %12s %12s | %10s | %10s %10s\n", "MiB",
         "create", "map", "setaccess", "unmap", "release", "one-handle", "per-granule", "(map side)",
         "move-one", "cuMemAlloc", "cuMemFree");
  size_t sizes_mib[] = {2, 4, 8, 16, 32, 64, 128, 256, 512};
  for (size_t si = 0; si < sizeof sizes_mib / sizeof *sizes_mib; si++) {
    size_t size = sizes_mib[si] << 20, n = size / GRANULE;
    if (n > MAX_GRANULES) break;
    double create[REPS], map[REPS], setacc[REPS], unmap[REPS], release[REPS], whole[REPS];
    double per_gran[REPS], per_gran_map[REPS], move[REPS];
    double alloc[REPS], dfree[REPS];
    for (int r = 0; r < REPS; r++) {
      /* One handle for the whole size. */
      CUmemGenericAllocationHandle h;
      double t0 = now_us();
      CHECK(cuMemCreate(&h, size, &prop, 0));
      double t1 = now_us();
      CHECK(cuMemMap(range, size, 0, h, 0));
      double t2 = now_us();
      CHECK(cuMemSetAccess(range, size, &access, 1));
      double t3 = now_us();
      CHECK(cuMemsetD8(range, 1, size)); /* touch it, as a kernel would */
      CHECK(cuCtxSynchronize());
      double t4 = now_us();
      CHECK(cuMemUnmap(range, size));
      double t5 = now_us();
      CHECK(cuMemRelease(h));
      double t6 = now_us();
      create[r] = t1 - t0;
      map[r] = t2 - t1;
      setacc[r] = t3 - t2;
      unmap[r] = t5 - t4;
      release[r] = t6 - t5;
      whole[r] = (t3 - t0) + (t6 - t4);

      /* One handle per granule, one access call for the run. */
      CUmemGenericAllocationHandle hs[MAX_GRANULES];
      t0 = now_us();
      for (size_t k = 0; k < n; k++) {
        CHECK(cuMemCreate(&hs[k], GRANULE, &prop, 0));
        CHECK(cuMemMap(range + k * GRANULE, GRANULE, 0, hs[k], 0));
      }
      CHECK(cuMemSetAccess(range, size, &access, 1));
      t1 = now_us();
      CHECK(cuMemsetD8(range, 1, size));
      CHECK(cuCtxSynchronize());
      t2 = now_us();
      for (size_t k = 0; k < n; k++) {
        CHECK(cuMemUnmap(range + k * GRANULE, GRANULE));
        CHECK(cuMemRelease(hs[k]));
      }
      t3 = now_us();
      per_gran_map[r] = t1 - t0;
      per_gran[r] = (t1 - t0) + (t3 - t2);

      /* A granule of the run moved past its end: unmap, map again elsewhere, access. */
      CUmemGenericAllocationHandle one;
      CHECK(cuMemCreate(&one, GRANULE, &prop, 0));
      CHECK(cuMemMap(range, GRANULE, 0, one, 0));
      CHECK(cuMemSetAccess(range, GRANULE, &access, 1));
      t0 = now_us();
      CHECK(cuMemUnmap(range, GRANULE));
      CHECK(cuMemMap(range + size, GRANULE, 0, one, 0));
      CHECK(cuMemSetAccess(range + size, GRANULE, &access, 1));
      t1 = now_us();
      CHECK(cuMemUnmap(range + size, GRANULE));
      CHECK(cuMemRelease(one));
      move[r] = t1 - t0;

      /* The cuda source's pair. */
      CUdeviceptr p;
      t0 = now_us();
      CHECK(cuMemAlloc(&p, size));
      t1 = now_us();
      CHECK(cuMemsetD8(p, 1, size));
      CHECK(cuCtxSynchronize());
      t2 = now_us();
      CHECK(cuMemFree(p));
      t3 = now_us();
      alloc[r] = t1 - t0;
      dfree[r] = t3 - t2;
    }
    printf("%8zu %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f | %12.1f %12.1f | %10.1f |"
           " %10.1f %10.1f\n",
           sizes_mib[si], median(create), median(map), median(setacc), median(unmap),
           median(release), median(whole), median(per_gran), median(per_gran_map), median(move), median(alloc), median(dfree));
    fflush(stdout);
  }
  CHECK(cuMemAddressFree(range, (MAX_GRANULES + 1) * GRANULE));
  CHECK(cuDevicePrimaryCtxRelease(dev));
  return 0;
}

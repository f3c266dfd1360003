/* peer_access.c - on a machine of two GPUs: memory of a vmm pool on device 0 is read by
 * device 1 once vram_enable_peer_access(pool, 1) was called, both for blocks mapped before
 * the call and after it; and the default pools of both devices are independent.
 *
 * Needs the CUDA toolkit's cuda.h (it drives the copies itself). Build from the repo root:
 *
 *   gcc -std=c11 -O1 -Iinclude -I/usr/local/cuda/include tests/gpu/peer_access.c \
 *       build/libvramkit_static.a -L/usr/local/cuda/lib64/stubs -lcuda -ldl -lpthread -lm \
 *       -o /tmp/peer_access && /tmp/peer_access
 *
 * Prints one line per check; exits 0 when all pass, 77 when fewer than two devices or no
 * peer access between them, 1 otherwise. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramkit.h"

#define SIZE ((size_t)8 << 20)

static int failures;

static void report(int ok, const char *what) {
  printf("%s  %s\n", ok ? "OK  " : "FAIL", what);
  if (!ok) failures++;
}

/* Fill `src` (device 0 memory) with `byte` from device 0, copy it into a device 1 buffer
 * from device 1's context, and read that back to the host. */
static int seen_from_device1(CUcontext ctx0, CUcontext ctx1, void *src, unsigned char byte) {
  unsigned char *host = malloc(SIZE);
  CUdeviceptr dst = 0;
  int ok = host != NULL;
  ok = ok && cuCtxSetCurrent(ctx0) == CUDA_SUCCESS;
  ok = ok && cuMemsetD8((CUdeviceptr)src, byte, SIZE) == CUDA_SUCCESS;
  ok = ok && cuCtxSynchronize() == CUDA_SUCCESS;
  ok = ok && cuCtxSetCurrent(ctx1) == CUDA_SUCCESS;
  ok = ok && cuMemAlloc(&dst, SIZE) == CUDA_SUCCESS;
  ok = ok && cuMemcpyDtoD(dst, (CUdeviceptr)src, SIZE) == CUDA_SUCCESS;
  ok = ok && cuMemcpyDtoH(host, dst, SIZE) == CUDA_SUCCESS;
  for (size_t i = 0; ok && i < SIZE; i += 4096) ok = host[i] == byte && host[SIZE - 1 - i] == byte;
  if (dst) cuMemFree(dst);
  free(host);
  return ok;
}

int main(void) {
  int count = 0, can = 0;
  CUdevice d0, d1;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&count) != CUDA_SUCCESS || count < 2) {
    printf("SKIP  fewer than two devices\n");
    return 77;
  }
  cuDeviceGet(&d0, 0);
  cuDeviceGet(&d1, 1);
  if (cuDeviceCanAccessPeer(&can, d1, d0) != CUDA_SUCCESS || !can) {
    printf("SKIP  device 1 cannot access device 0\n");
    return 77;
  }
  CUcontext ctx0, ctx1;
  cuDevicePrimaryCtxRetain(&ctx0, d0);
  cuDevicePrimaryCtxRetain(&ctx1, d1);

  vram_options_t o;
  vram_options_init(&o);
  o.source = VRAM_SOURCE_VMM;
  o.device = 0;
  vram_pool_t *pool = NULL;
  report(vram_pool_create(&pool, &o) == VRAM_OK, "vmm pool on device 0");
  void *before = NULL, *after = NULL;
  report(vram_malloc(pool, SIZE, NULL, &before) == VRAM_OK, "block mapped before peer access");
  report(vram_enable_peer_access(pool, 1) == VRAM_OK, "vram_enable_peer_access(pool, 1)");
  report(vram_malloc(pool, SIZE, NULL, &after) == VRAM_OK, "block mapped after peer access");
  report(seen_from_device1(ctx0, ctx1, before, 0x5A), "device 1 reads the earlier block");
  report(seen_from_device1(ctx0, ctx1, after, 0xC3), "device 1 reads the later block");
  report(vram_enable_peer_access(pool, 7) == VRAM_EDEVICE, "a device that does not exist");
  vram_free(pool, before);
  vram_free(pool, after);
  report(vram_pool_destroy(pool) == VRAM_OK, "pool destroyed");

  /* One default pool per device, each on its own device's memory. */
  vram_pool_t *p0 = NULL, *p1 = NULL;
  void *a = NULL, *b = NULL;
  report(vram_default_pool(0, &p0) == VRAM_OK && vram_default_pool(1, &p1) == VRAM_OK && p0 != p1,
         "default pools of devices 0 and 1 differ");
  report(vram_malloc(p0, SIZE, NULL, &a) == VRAM_OK && vram_malloc(p1, SIZE, NULL, &b) == VRAM_OK,
         "allocation on each");
  CUdevice owner = -1;
  cuCtxSetCurrent(ctx1);
  report(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)b) ==
                 CUDA_SUCCESS && owner == 1,
         "device 1's block lives on device 1");
  vram_stats_t s0, s1;
  vram_get_stats(p0, &s0);
  vram_get_stats(p1, &s1);
  report(s0.allocated_bytes.current == (int64_t)SIZE && s1.allocated_bytes.current == (int64_t)SIZE,
         "each pool counts only its own block");
  vram_free(p0, a);
  vram_free(p1, b);
  printf("%s\n", failures ? "FAILED" : "ALL OK");
  return failures ? 1 : 0;
}

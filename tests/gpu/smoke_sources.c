/* smoke_sources.c - a GPU smoke test of the three driver-backed sources (cuda, vmm,
 * managed), called through their function tables with no engine above them.
 *
 * Not part of CMake's default build (it needs a GPU). Build and run from the repo root:
 *
 *   gcc -std=c11 -Wall -Wextra -O1 -Iinclude -Isrc tests/gpu/smoke_sources.c \
 *       src/prim/cuda_driver.c src/source/cuda.c src/source/vmm.c src/source/managed.c \
 *       -ldl -lpthread -o /tmp/smoke_sources && /tmp/smoke_sources
 *
 * or against the built library objects instead of the four sources:
 *   ... tests/gpu/smoke_sources.c build/libvramkit_static.a -ldl -lpthread -lm ...
 *
 * Prints OK or FAIL per step; exits 0 when all pass, 77 (skipped) when no driver loads,
 * 1 otherwise. It writes no device memory (no kernels); managed memory is written and read
 * from the host only, around prefetches to the device and back.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "prim/cuda_driver.h"
#include "source/managed.h"
#include "source/source.h"

static int failures;

/* The library's vram_errname lives in another layer; the smoke test needs only the list. */
static const char *vram_errname_local(int status) {
#define VRAM_X_NAME(name, value, text) \
  if (status == value) return #name;
  VRAM_STATUS_LIST(VRAM_X_NAME)
#undef VRAM_X_NAME
  return "?";
}
static const vram_cuda_api *api;

static void step(const char *src, const char *what, int ok, int status) {
  if (ok)
    printf("OK    %-8s %s\n", src, what);
  else {
    failures++;
    printf("FAIL  %-8s %s (status %d %s; %s)\n", src, what, status, vram_errname_local(status),
           _vram_cuda_last_error());
  }
}

/* ------------------------------------------------------------------------------------- */
static CUcontext current_ctx(void) {
  CUcontext c = NULL;
  api->cuCtxGetCurrent(&c);
  return c;
}

static void check_events(const vram_source_methods *m, void *st) {
  void *ev = NULL;
  int r = m->xEventCreate(st, &ev);
  step(m->zName, "event create", r == VRAM_OK && ev, r);
  if (r != VRAM_OK) return;
  r = m->xEventRecord(st, ev, NULL);
  step(m->zName, "event record (default stream)", r == VRAM_OK, r);
  r = m->xEventQuery(st, ev);
  step(m->zName, "event query (0 or 1)", r == 0 || r == 1, r);
  r = m->xEventSynchronize(st, ev);
  step(m->zName, "event synchronize", r == VRAM_OK, r);
  r = m->xEventQuery(st, ev);
  step(m->zName, "event query after sync == 1", r == 1, r);
  r = m->xEventRecord(st, ev, NULL); /* recorded many times, as the engine does */
  step(m->zName, "event re-record", r == VRAM_OK, r);
  r = m->xEventSynchronize(st, ev);
  step(m->zName, "event re-synchronize", r == VRAM_OK, r);
  m->xEventDestroy(st, ev);
  step(m->zName, "event destroy", 1, 0);
}

typedef struct thread_arg {
  const vram_source_methods *m;
  void *st;
  int ok;
  int ctx_untouched;
} thread_arg;

/* A fresh host thread has no current context: the source must make its own current and
 * leave the thread as it found it. */
static void *other_thread(void *p) {
  thread_arg *t = p;
  void *ev = NULL;
  size_t f = 0, tot = 0;
  t->ok = t->m->xMemInfo(t->st, &f, &tot) == VRAM_OK && tot > 0 &&
          t->m->xEventCreate(t->st, &ev) == VRAM_OK &&
          t->m->xEventRecord(t->st, ev, NULL) == VRAM_OK &&
          t->m->xEventSynchronize(t->st, ev) == VRAM_OK && t->m->xEventQuery(t->st, ev) == 1;
  if (ev) t->m->xEventDestroy(t->st, ev);
  t->ctx_untouched = current_ctx() == NULL;
  return NULL;
}

static void check_thread(const vram_source_methods *m, void *st) {
  thread_arg t = {m, st, 0, 0};
  pthread_t th;
  if (pthread_create(&th, NULL, other_thread, &t) != 0) {
    step(m->zName, "calls from another thread", 0, 0);
    return;
  }
  pthread_join(th, NULL);
  step(m->zName, "info+events from a thread with no context", t.ok, 0);
  step(m->zName, "that thread's context left unset", t.ctx_untouched, 0);
}

static void *open_source(const vram_source_methods *m, int prefetch) {
  vram_source_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.device = 0;
  cfg.managed_prefetch = prefetch;
  void *st = NULL;
  int r = m->xOpen(&cfg, &st);
  step(m->zName, "open device 0", r == VRAM_OK && st, r);
  if (r != VRAM_OK) return NULL;
  size_t g = m->xGranularity(st);
  printf("      %-8s granularity %zu\n", m->zName, g);
  step(m->zName, "granularity is a power of two >= 64 KiB", g >= 65536 && !(g & (g - 1)), 0);
  size_t f = 0, tot = 0;
  r = m->xMemInfo(st, &f, &tot);
  printf("      %-8s mem info: free %zu MiB, total %zu MiB\n", m->zName, f >> 20, tot >> 20);
  step(m->zName, "mem info", r == VRAM_OK && tot > 0 && f <= tot, r);
  return st;
}

static void check_bad_device(const vram_source_methods *m) {
  vram_source_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.device = 999;
  void *st = NULL;
  int r = m->xOpen(&cfg, &st);
  step(m->zName, "open device 999 -> VRAM_EDEVICE", r == VRAM_EDEVICE, r);
}

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

/* Information only, never a failure: what the engine's hot and cold paths cost here. */
static void timings(const vram_source_methods *m, void *st, uintptr_t base, size_t g) {
  void *ev = NULL;
  if (m->xEventCreate(st, &ev) != VRAM_OK) return;
  m->xEventRecord(st, ev, NULL);
  m->xEventSynchronize(st, ev);
  double t0 = now_ns();
  for (int i = 0; i < 10000; i++) m->xEventQuery(st, ev);
  double t1 = now_ns();
  printf("      %-8s event query, no context current (push+pop each): %.0f ns\n", m->zName,
         (t1 - t0) / 10000);
  /* Every GPU source's state begins with its vram_cuda_device. */
  CUcontext ctx = ((vram_cuda_device *)st)->ctx, popped;
  api->cuCtxPushCurrent(ctx);
  t0 = now_ns();
  for (int i = 0; i < 10000; i++) m->xEventQuery(st, ev);
  t1 = now_ns();
  api->cuCtxPopCurrent(&popped);
  printf("      %-8s event query, its context already current: %.0f ns\n", m->zName,
         (t1 - t0) / 10000);
  t0 = now_ns();
  for (int i = 0; i < 1000; i++) m->xEventRecord(st, ev, NULL);
  t1 = now_ns();
  printf("      %-8s event record: %.0f ns\n", m->zName, (t1 - t0) / 1000);
  m->xEventSynchronize(st, ev);
  m->xEventDestroy(st, ev);
  if (!m->is_vmm) return;
  for (int n = 1; n <= 8; n *= 8) {
    t0 = now_ns();
    for (int i = 0; i < 20; i++) {
      m->xMap(st, base, n * g);
      m->xUnmap(st, base, n * g);
    }
    t1 = now_ns();
    printf("      %-8s map+unmap of %d granule(s): %.0f ns\n", m->zName, n, (t1 - t0) / 20);
  }
}

/* ------------------------------------------------------------------------------------- */
static void test_fixed(const vram_source_methods *m) {
  check_bad_device(m);
  void *st = open_source(m, 1);
  if (!st) return;
  uintptr_t p = 0, q = 0;
  size_t g = m->xGranularity(st);
  int r = m->xAlloc(st, 2 * g, NULL, &p);
  step(m->zName, "alloc 2 granules", r == VRAM_OK && p != 0, r);
  r = m->xAlloc(st, 64 * g, NULL, &q);
  step(m->zName, "alloc 64 granules", r == VRAM_OK && q != 0, r);
  r = m->xAlloc(st, 0, NULL, &q) == VRAM_EINVAL ? VRAM_OK : VRAM_EDRIVER;
  step(m->zName, "alloc 0 -> VRAM_EINVAL", r == VRAM_OK, r);
  r = m->xAlloc(st, (size_t)1 << 50, NULL, &q) == VRAM_ENOMEM ? VRAM_OK : VRAM_EDRIVER;
  if (m == &_vram_source_cuda) /* never ask managed memory for more than the card has */
    step(m->zName, "alloc 1 PiB -> VRAM_ENOMEM", r == VRAM_OK, r);

  if (m == &_vram_source_managed && p) {
    /* Host writes, a round trip device -> host, and the bytes survive. */
    unsigned char *h = (unsigned char *)p;
    for (size_t i = 0; i < 2 * g; i += 4096) h[i] = (unsigned char)(i >> 12);
    int a = _vram_managed_prefetch(st, p, 2 * g, 1, NULL);
    step(m->zName, "prefetch to device", a == VRAM_OK, a);
    int b = _vram_managed_prefetch(st, p, 2 * g, 0, NULL);
    step(m->zName, "prefetch to host", b == VRAM_OK, b);
    void *ev = NULL;
    m->xEventCreate(st, &ev);
    m->xEventRecord(st, ev, NULL);
    m->xEventSynchronize(st, ev);
    m->xEventDestroy(st, ev);
    int same = 1;
    for (size_t i = 0; i < 2 * g; i += 4096) same &= h[i] == (unsigned char)(i >> 12);
    step(m->zName, "host bytes intact after the round trip", same, 0);
  }

  r = m->xFree(st, p, 2 * g, NULL);
  step(m->zName, "free 2 granules", r == VRAM_OK, r);
  r = m->xFree(st, q, 64 * g, NULL);
  step(m->zName, "free 64 granules", r == VRAM_OK, r);
  check_events(m, st);
  check_thread(m, st);
  step(m->zName, "main thread's context left unset", current_ctx() == NULL, 0);
  timings(m, st, 0, g);
  m->xClose(st);
  step(m->zName, "close", 1, 0);
}

static void test_vmm(void) {
  const vram_source_methods *m = &_vram_source_vmm;
  check_bad_device(m);
  void *st = open_source(m, 0);
  if (!st) return;
  size_t g = m->xGranularity(st);
  size_t f0 = 0, f1 = 0, tot = 0;
  uintptr_t base = 0;
  int r = m->xReserve(st, 16 * g, &base);
  step("vmm", "reserve 16 granules", r == VRAM_OK && base && !(base & (g - 1)), r);
  if (r != VRAM_OK) goto out;
  m->xMemInfo(st, &f0, &tot);

  r = m->xMap(st, base, 3 * g);
  step("vmm", "map 3 granules", r == VRAM_OK, r);
  m->xMemInfo(st, &f1, &tot);
  printf("      vmm      device free fell by %zu MiB after mapping 3 granules\n",
         (f0 - f1) >> 20);
  r = m->xMap(st, base + g, g);
  step("vmm", "map of a mapped granule -> VRAM_EINVAL", r == VRAM_EINVAL, r);
  r = m->xUnmap(st, base + g, g);
  step("vmm", "unmap middle granule", r == VRAM_OK, r);
  r = m->xUnmap(st, base + g, g);
  step("vmm", "unmap it again -> VRAM_EINVAL", r == VRAM_EINVAL, r);
  r = m->xUnmap(st, base, g);
  step("vmm", "unmap first granule", r == VRAM_OK, r);
  r = m->xUnmap(st, base + 2 * g, g);
  step("vmm", "unmap third granule", r == VRAM_OK, r);
  r = m->xMap(st, base + 1, g);
  step("vmm", "unaligned map -> VRAM_EINVAL", r == VRAM_EINVAL, r);

  /* A map failing on its third granule must undo the first two. Occupy granule 2 behind
   * the source's back so that its cuMemMap fails. */
  {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h = 0;
    CUcontext ctx = NULL;
    CUdevice dev;
    api->cuDeviceGet(&dev, 0);
    api->cuDevicePrimaryCtxRetain(&ctx, dev);
    api->cuCtxPushCurrent(ctx);
    int ok = api->cuMemCreate(&h, g, &prop, 0) == CUDA_SUCCESS &&
             api->cuMemMap((CUdeviceptr)(base + 6 * g), g, 0, h, 0) == CUDA_SUCCESS;
    step("vmm", "(set-up) occupy granule 6 directly", ok, 0);
    size_t fa = 0, fb = 0;
    m->xMemInfo(st, &fa, &tot);
    r = m->xMap(st, base + 4 * g, 3 * g);
    step("vmm", "map failing on granule 3 of 3 -> driver error", r == VRAM_EDRIVER, r);
    printf("      vmm      (expected) %s\n", _vram_cuda_last_error());
    m->xMemInfo(st, &fb, &tot);
    step("vmm", "... device free memory unchanged by it", fa == fb, 0);
    r = m->xMap(st, base + 4 * g, 2 * g);
    step("vmm", "... and its first two granules map again", r == VRAM_OK, r);
    r = m->xUnmap(st, base + 4 * g, 2 * g);
    step("vmm", "... and unmap", r == VRAM_OK, r);
    api->cuMemUnmap((CUdeviceptr)(base + 6 * g), g);
    api->cuMemRelease(h);
    api->cuCtxPopCurrent(&ctx);
    api->cuDevicePrimaryCtxRelease(dev);
  }

  r = m->xEnablePeer(st, 0);
  step("vmm", "enable peer = own device (no-op)", r == VRAM_OK, r);
  int count = 0;
  api->cuDeviceGetCount(&count);
  if (count > 1) {
    r = m->xEnablePeer(st, 1);
    step("vmm", "enable peer 1", r == VRAM_OK || r == VRAM_EUNSUPPORTED, r);
  } else {
    r = m->xEnablePeer(st, 1);
    step("vmm", "enable peer 1 on a 1-GPU host -> VRAM_EDEVICE", r == VRAM_EDEVICE, r);
  }

  r = m->xMap(st, base + 8 * g, 8 * g);
  step("vmm", "map 8 granules at the end", r == VRAM_OK, r);
  r = m->xUnmap(st, base + 10 * g, 3 * g);
  step("vmm", "unmap 3 of them in the middle", r == VRAM_OK, r);
  timings(m, st, base, g);
  r = m->xUnreserve(st, base, 16 * g);
  step("vmm", "unreserve with 5 granules still mapped", r == VRAM_OK, r);
  m->xMemInfo(st, &f1, &tot);
  printf("      vmm      device free after unreserve: %zu MiB (before maps: %zu MiB)\n",
         f1 >> 20, f0 >> 20);
  step("vmm", "every granule returned", f1 == f0, 0);

  check_events(m, st);
  check_thread(m, st);
  step("vmm", "main thread's context left unset", current_ctx() == NULL, 0);
out:
  m->xClose(st);
  step("vmm", "close", 1, 0);
}

int main(void) {
  const char *why = NULL;
  int r = _vram_cuda_load(&api, &why);
  if (r != VRAM_OK) {
    printf("SKIP  driver   load: status %d, %s\n", r, why);
    return r == VRAM_ENODRIVER ? 77 : 1;
  }
  printf("OK    driver   load (driver version %d, advise %s, prefetch %s)\n",
         api->driver_version, api->cuMemAdvise_v2 ? "v2" : "v1",
         api->cuMemPrefetchAsync_v2 ? "v2" : "v1");
  test_fixed(&_vram_source_cuda);
  test_vmm();
  test_fixed(&_vram_source_managed);
  printf("%s: %d failure(s)\n", failures ? "FAIL" : "OK", failures);
  return failures ? 1 : 0;
}

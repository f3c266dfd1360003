/* cuda_driver.c - opens the CUDA driver (libcuda.so.1) at run time, resolves its entry
 * points into one table, and gives the GPU sources their shared device, context, error and
 * event helpers. Nothing here allocates policy: it is the thin floor under src/source/.
 */
#define _GNU_SOURCE /* dlopen's RTLD_* on strict C11 builds */
#include "prim/cuda_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------
 * Errors. The message lives per thread: sources run under their pool's lock, but two pools
 * (two devices) fail independently, and a shared buffer would mix their texts.
 * ------------------------------------------------------------------------------------- */
static _Thread_local char tls_error[512];

void _vram_cuda_set_error(const char *what, const char *message) {
  snprintf(tls_error, sizeof tls_error, "%s: %s", what ? what : "cuda",
           message ? message : "");
}

const char *_vram_cuda_last_error(void) { return tls_error; }

static const vram_cuda_api *loaded_api; /* set once by load_once, read-only afterwards */

int _vram_cuda_status(CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return VRAM_OK;
  const char *name = NULL, *text = NULL;
  /* The driver's own strings, when it is loaded; both calls are pure look-ups. */
  if (loaded_api) {
    if (loaded_api->cuGetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
    if (loaded_api->cuGetErrorString(r, &text) != CUDA_SUCCESS) text = NULL;
  }
  if (name && text)
    snprintf(tls_error, sizeof tls_error, "%s: %s (%s)", what, name, text);
  else
    snprintf(tls_error, sizeof tls_error, "%s: CUresult %d", what, (int)r);
  return r == CUDA_ERROR_OUT_OF_MEMORY ? VRAM_ENOMEM : VRAM_EDRIVER;
}

/* ---------------------------------------------------------------------------------------
 * Loading. pthread_once makes the first caller load and every other caller wait for it;
 * the result (table or failure and its text) is then fixed for the life of the process.
 * ------------------------------------------------------------------------------------- */
static pthread_once_t load_once_flag = PTHREAD_ONCE_INIT;
static vram_cuda_api api_table;
static int load_result = VRAM_ENODRIVER;
static char load_why[384];
static void *lib_handle;

/* Resolve the first of `names` (NULL-terminated) the library exports into *slot.
 * dlerror() is cleared before each dlsym so that the text kept is this lookup's own. */
static int resolve(void *slot, const char *const *names, int required) {
  const char *err = NULL;
  for (; *names; names++) {
    dlerror();
    void *p = dlsym(lib_handle, *names);
    if (p) {
      /* POSIX guarantees a function pointer has the size and representation of void *;
       * memcpy avoids the object-to-function pointer cast ISO C does not define. */
      memcpy(slot, &p, sizeof p);
      return 0;
    }
    err = dlerror();
  }
  memset(slot, 0, sizeof(void *));
  if (required) {
    snprintf(load_why, sizeof load_why, "libcuda.so.1 lacks a required entry point: %s",
             err ? err : "(no dlerror text)");
    return -1;
  }
  return 0;
}

#define VRAM_NAMES(...) ((const char *const[]){__VA_ARGS__, NULL})
#define VRAM_NEED(field, ...) \
  if (resolve(&api_table.field, VRAM_NAMES(__VA_ARGS__), 1)) goto fail
#define VRAM_WANT(field, ...) resolve(&api_table.field, VRAM_NAMES(__VA_ARGS__), 0)

static void load_once(void) {
  dlerror();
  lib_handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib_handle) {
    const char *err = dlerror();
    snprintf(load_why, sizeof load_why, "cannot open libcuda.so.1 (no NVIDIA driver?): %s",
             err ? err : "unknown dlopen error");
    load_result = VRAM_ENODRIVER;
    return;
  }

  /* Versioned names first: the unversioned symbols keep their old ABIs for binaries built
   * against old headers (e.g. cuMemAlloc took a 32-bit size once). Never the _ptsz forms:
   * a NULL stream must mean the legacy default stream, as in the public API. */
  VRAM_NEED(cuInit, "cuInit");
  VRAM_NEED(cuDriverGetVersion, "cuDriverGetVersion");
  VRAM_NEED(cuGetErrorString, "cuGetErrorString");
  VRAM_NEED(cuGetErrorName, "cuGetErrorName");
  VRAM_NEED(cuDeviceGet, "cuDeviceGet");
  VRAM_NEED(cuDeviceGetCount, "cuDeviceGetCount");
  VRAM_NEED(cuDeviceGetAttribute, "cuDeviceGetAttribute");
  VRAM_NEED(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  VRAM_NEED(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2",
            "cuDevicePrimaryCtxRelease");
  VRAM_NEED(cuCtxGetCurrent, "cuCtxGetCurrent");
  VRAM_NEED(cuCtxSetCurrent, "cuCtxSetCurrent");
  VRAM_NEED(cuCtxPushCurrent, "cuCtxPushCurrent_v2");
  VRAM_NEED(cuCtxPopCurrent, "cuCtxPopCurrent_v2");
  VRAM_NEED(cuMemAlloc, "cuMemAlloc_v2");
  VRAM_NEED(cuMemFree, "cuMemFree_v2");
  VRAM_NEED(cuMemGetInfo, "cuMemGetInfo_v2");
  VRAM_NEED(cuEventCreate, "cuEventCreate");
  VRAM_NEED(cuEventRecord, "cuEventRecord");
  VRAM_NEED(cuEventQuery, "cuEventQuery");
  VRAM_NEED(cuEventSynchronize, "cuEventSynchronize");
  VRAM_NEED(cuEventDestroy, "cuEventDestroy_v2");
  VRAM_NEED(cuStreamWaitEvent, "cuStreamWaitEvent");

  VRAM_WANT(cuDeviceGetUuid, "cuDeviceGetUuid_v2", "cuDeviceGetUuid");
  VRAM_WANT(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer");
  VRAM_WANT(cuMemAddressReserve, "cuMemAddressReserve");
  VRAM_WANT(cuMemAddressFree, "cuMemAddressFree");
  VRAM_WANT(cuMemCreate, "cuMemCreate");
  VRAM_WANT(cuMemRelease, "cuMemRelease");
  VRAM_WANT(cuMemMap, "cuMemMap");
  VRAM_WANT(cuMemUnmap, "cuMemUnmap");
  VRAM_WANT(cuMemSetAccess, "cuMemSetAccess");
  VRAM_WANT(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
  VRAM_WANT(cuMemAllocManaged, "cuMemAllocManaged");
  /* Only one form of each is kept, the newest, so callers test a single pointer. */
  VRAM_WANT(cuMemAdvise_v2, "cuMemAdvise_v2");
  if (!api_table.cuMemAdvise_v2) VRAM_WANT(cuMemAdvise_v1, "cuMemAdvise");
  VRAM_WANT(cuMemPrefetchAsync_v2, "cuMemPrefetchAsync_v2");
  if (!api_table.cuMemPrefetchAsync_v2)
    VRAM_WANT(cuMemPrefetchAsync_v1, "cuMemPrefetchAsync");

  CUresult r = api_table.cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char *name = NULL, *text = NULL;
    if (api_table.cuGetErrorName(r, &name) != CUDA_SUCCESS) name = "?";
    if (api_table.cuGetErrorString(r, &text) != CUDA_SUCCESS) text = "?";
    snprintf(load_why, sizeof load_why, "cuInit failed: %s (%s)", name, text);
    goto fail;
  }
  if (api_table.cuDriverGetVersion(&api_table.driver_version) != CUDA_SUCCESS)
    api_table.driver_version = 0;

  load_why[0] = '\0';
  load_result = VRAM_OK;
  loaded_api = &api_table;
  return;

fail:
  /* Keep nothing of a half-resolved driver: a later caller sees only the failure. */
  memset(&api_table, 0, sizeof api_table);
  dlclose(lib_handle);
  lib_handle = NULL;
  load_result = VRAM_ENODRIVER;
}

#undef VRAM_NEED
#undef VRAM_WANT
#undef VRAM_NAMES

int _vram_cuda_load(const vram_cuda_api **out, const char **why) {
  pthread_once(&load_once_flag, load_once);
  if (out) *out = load_result == VRAM_OK ? &api_table : NULL;
  if (why) *why = load_why;
  if (load_result != VRAM_OK) _vram_cuda_set_error("libcuda", load_why);
  return load_result;
}

/* ---------------------------------------------------------------------------------------
 * Devices and contexts.
 *
 * Why the primary context: it is the one the runtime API (PyTorch, CuPy, Numba) uses, so
 * pointers we hand out live in the caller's context and no extra context eats memory.
 *
 * Why push/pop guarded by a get: a source method may be called from any host thread, and
 * that thread may have no context, or another device's, current. Setting ours and leaving
 * it would silently move the caller's thread to our device (the runtime reads the current
 * context as "the device"), so we must restore. cuCtxGetCurrent is a thread-local read;
 * in the common case (the caller already works on this device's primary context) it is
 * the only cost, and otherwise one push and one pop restore exactly the caller's stack,
 * including contexts the caller pushed itself. Caching "current" in our own thread-local
 * would be cheaper still but wrong as soon as the caller switches contexts behind us.
 * ------------------------------------------------------------------------------------- */
int _vram_cuda_device_open(vram_cuda_device *d, int ordinal) {
  const vram_cuda_api *api;
  memset(d, 0, sizeof *d);
  int st = _vram_cuda_load(&api, NULL);
  if (st != VRAM_OK) return st;
  int count = 0;
  st = _vram_cuda_status(api->cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (st != VRAM_OK) return st;
  if (ordinal < 0 || ordinal >= count) {
    char msg[96];
    snprintf(msg, sizeof msg, "device %d requested, %d present", ordinal, count);
    _vram_cuda_set_error("cuda device", msg);
    return VRAM_EDEVICE;
  }
  CUdevice dev;
  st = _vram_cuda_status(api->cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  if (st != VRAM_OK) return st;
  CUcontext ctx = NULL;
  st = _vram_cuda_status(api->cuDevicePrimaryCtxRetain(&ctx, dev),
                         "cuDevicePrimaryCtxRetain");
  if (st != VRAM_OK) return st;
  d->api = api;
  d->ordinal = ordinal;
  d->dev = dev;
  d->ctx = ctx;
  return VRAM_OK;
}

void _vram_cuda_device_close(vram_cuda_device *d) {
  if (!d->api) return;
  /* The retain count is per process: releasing drops only our reference, and the context
   * lives on while the runtime or another pool still holds it. */
  d->api->cuDevicePrimaryCtxRelease(d->dev);
  d->api = NULL;
  d->ctx = NULL;
}

int _vram_cuda_device_attribute(vram_cuda_device *d, int attrib, int *value) {
  *value = 0;
  return _vram_cuda_status(d->api->cuDeviceGetAttribute(value, attrib, d->dev),
                           "cuDeviceGetAttribute");
}

int _vram_cuda_enter(vram_cuda_device *d, vram_cuda_scope *scope) {
  CUcontext cur = NULL;
  scope->pushed = 0;
  if (d->api->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == d->ctx) return VRAM_OK;
  int st = _vram_cuda_status(d->api->cuCtxPushCurrent(d->ctx), "cuCtxPushCurrent_v2");
  if (st == VRAM_OK) scope->pushed = 1;
  return st;
}

void _vram_cuda_leave(vram_cuda_device *d, vram_cuda_scope *scope) {
  if (!scope->pushed) return;
  CUcontext popped = NULL;
  d->api->cuCtxPopCurrent(&popped);
  scope->pushed = 0;
}

int _vram_cuda_mem_info(void *state, size_t *free_bytes, size_t *total_bytes) {
  vram_cuda_device *d = state;
  vram_cuda_scope sc;
  size_t f = 0, t = 0;
  int st = _vram_cuda_enter(d, &sc);
  if (st != VRAM_OK) return st;
  st = _vram_cuda_status(d->api->cuMemGetInfo(&f, &t), "cuMemGetInfo_v2");
  _vram_cuda_leave(d, &sc);
  if (st != VRAM_OK) return st;
  if (free_bytes) *free_bytes = f;
  if (total_bytes) *total_bytes = t;
  return VRAM_OK;
}

int _vram_cuda_mem_advise(vram_cuda_device *d, CUdeviceptr ptr, size_t size, int advice,
                          int device_or_cpu) {
  const vram_cuda_api *a = d->api;
  if (a->cuMemAdvise_v2) {
    CUmemLocation loc;
    loc.type = device_or_cpu == CU_DEVICE_CPU ? CU_MEM_LOCATION_TYPE_HOST
                                              : CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = device_or_cpu == CU_DEVICE_CPU ? 0 : device_or_cpu;
    return _vram_cuda_status(a->cuMemAdvise_v2(ptr, size, advice, loc), "cuMemAdvise_v2");
  }
  if (a->cuMemAdvise_v1)
    return _vram_cuda_status(a->cuMemAdvise_v1(ptr, size, advice, device_or_cpu),
                             "cuMemAdvise");
  _vram_cuda_set_error("cuMemAdvise", "not exported by this driver");
  return VRAM_EUNSUPPORTED;
}

int _vram_cuda_mem_prefetch(vram_cuda_device *d, CUdeviceptr ptr, size_t size,
                            int device_or_cpu, CUstream stream) {
  const vram_cuda_api *a = d->api;
  if (a->cuMemPrefetchAsync_v2) {
    CUmemLocation loc;
    loc.type = device_or_cpu == CU_DEVICE_CPU ? CU_MEM_LOCATION_TYPE_HOST
                                              : CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = device_or_cpu == CU_DEVICE_CPU ? 0 : device_or_cpu;
    return _vram_cuda_status(a->cuMemPrefetchAsync_v2(ptr, size, loc, 0, stream),
                             "cuMemPrefetchAsync_v2");
  }
  if (a->cuMemPrefetchAsync_v1)
    return _vram_cuda_status(a->cuMemPrefetchAsync_v1(ptr, size, device_or_cpu, stream),
                             "cuMemPrefetchAsync");
  _vram_cuda_set_error("cuMemPrefetchAsync", "not exported by this driver");
  return VRAM_EUNSUPPORTED;
}

/* ---------------------------------------------------------------------------------------
 * Events. Record needs the context current (a NULL stream means the current context's
 * legacy stream); query and synchronize would work without it, but the guard costs one
 * thread-local read when the context is already current, so every call takes it alike.
 * ------------------------------------------------------------------------------------- */
int _vram_cuda_event_create(void *state, void **event) {
  vram_cuda_device *d = state;
  vram_cuda_scope sc;
  CUevent ev = NULL;
  int st = _vram_cuda_enter(d, &sc);
  if (st != VRAM_OK) return st;
  st = _vram_cuda_status(d->api->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING),
                         "cuEventCreate");
  _vram_cuda_leave(d, &sc);
  if (st == VRAM_OK) *event = ev;
  return st;
}

void _vram_cuda_event_destroy(void *state, void *event) {
  vram_cuda_device *d = state;
  vram_cuda_scope sc;
  if (!event) return;
  int st = _vram_cuda_enter(d, &sc);
  /* cuEventDestroy is safe on a pending event: the driver frees it once it completes. */
  d->api->cuEventDestroy((CUevent)event);
  if (st == VRAM_OK) _vram_cuda_leave(d, &sc);
}

int _vram_cuda_event_record(void *state, void *event, vram_stream_t stream) {
  vram_cuda_device *d = state;
  vram_cuda_scope sc;
  int st = _vram_cuda_enter(d, &sc);
  if (st != VRAM_OK) return st;
  st = _vram_cuda_status(d->api->cuEventRecord((CUevent)event, (CUstream)stream),
                         "cuEventRecord");
  _vram_cuda_leave(d, &sc);
  return st;
}

int _vram_cuda_event_query(void *state, void *event) {
  vram_cuda_device *d = state;
  vram_cuda_scope sc;
  int st = _vram_cuda_enter(d, &sc);
  if (st != VRAM_OK) return st;
  CUresult r = d->api->cuEventQuery((CUevent)event);
  _vram_cuda_leave(d, &sc);
  if (r == CUDA_SUCCESS) return 1;
  if (r == CUDA_ERROR_NOT_READY) return 0;
  return _vram_cuda_status(r, "cuEventQuery");
}

int _vram_cuda_event_synchronize(void *state, void *event) {
  vram_cuda_device *d = state;
  vram_cuda_scope sc;
  int st = _vram_cuda_enter(d, &sc);
  if (st != VRAM_OK) return st;
  st = _vram_cuda_status(d->api->cuEventSynchronize((CUevent)event), "cuEventSynchronize");
  _vram_cuda_leave(d, &sc);
  return st;
}

int _vram_cuda_stream_wait_event(void *state, vram_stream_t stream, void *event) {
  vram_cuda_device *d = state;
  vram_cuda_scope sc;
  int st = _vram_cuda_enter(d, &sc);
  if (st != VRAM_OK) return st;
  st = _vram_cuda_status(d->api->cuStreamWaitEvent((CUstream)stream, (CUevent)event, 0),
                         "cuStreamWaitEvent");
  _vram_cuda_leave(d, &sc);
  return st;
}

/* ---------------------------------------------------------------------------------------
 * The device's UUID, formatted as NVML prints it so that the two can be matched.
 * ------------------------------------------------------------------------------------- */
int _vram_cuda_device_uuid(int ordinal, char *buf, size_t cap) {
  if (cap) buf[0] = 0;
  const vram_cuda_api *api;
  int rc = _vram_cuda_load(&api, NULL);
  if (rc) return rc;
  if (!api->cuDeviceGetUuid) return VRAM_EUNSUPPORTED;
  CUdevice dev;
  rc = _vram_cuda_status(api->cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  if (rc) return rc;
  CUuuid id;
  rc = _vram_cuda_status(api->cuDeviceGetUuid(&id, dev), "cuDeviceGetUuid");
  if (rc) return rc;
  const unsigned char *b = (const unsigned char *)id.bytes;
  snprintf(buf, cap,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
           b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
           b[15]);
  return VRAM_OK;
}

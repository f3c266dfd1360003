/* fake_cuda.c - a test double of the CUDA driver, built as libcuda.so.1 for the CPU tests.
 *
 * CI has no GPU, yet src/prim (dlopen, contexts, errors) and the cuda, vmm and managed
 * sources deserve the conformance suite too. This library exports the driver entry points
 * vramkit resolves and models what matters to them: device memory as addresses with a
 * capacity (nothing is ever dereferenced), contexts that must be current for memory calls
 * (so a missing push or pop shows up as an error), events that report "not ready" once, and
 * the virtual-memory calls with the driver's rules (map only reserved, unmapped granules
 * with a handle of that size, from its start; unmap only whole mappings; set access only on
 * mapped ranges; free a reservation only when nothing in it is mapped). It is a model for
 * tests, not an emulator.
 *
 * For fault injection it exports fake_cuda_fail_call(n): the n-th call from now of the
 * physical-memory path (cuMemAlloc, cuMemAllocManaged, cuMemCreate, cuMemMap,
 * cuMemSetAccess, cuMemUnmap, cuMemRelease) fails; fake_cuda_used_bytes(),
 * fake_cuda_allocated_bytes() and fake_cuda_mapped_bytes() tell what is held, allocated and
 * mapped, so a test can check that a failure left nothing behind that the pool does not
 * account for. fake_cuda_set_vmm_supported(0) makes the device say it has no virtual
 * memory management, as old GPUs and some virtualised ones do. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef struct {
  int type, id;
} CUmemLocation;

enum {
  SUCCESS = 0,
  ERROR_INVALID_VALUE = 1,
  ERROR_OUT_OF_MEMORY = 2,
  ERROR_INVALID_DEVICE = 101,
  ERROR_INVALID_CONTEXT = 201,
  ERROR_NOT_FOUND = 500,
  ERROR_NOT_READY = 600,
};

#define DEVICES 2
#define CAPACITY ((size_t)8 << 30) /* per device */
#define GRANULE ((size_t)2 << 20)
#define MAX_RANGES 4096

/* A range of device addresses: an allocation, a reservation, or a physical handle. */
typedef struct range {
  int kind; /* 0 free slot, 1 allocation, 2 reservation, 3 handle */
  int device;
  CUdeviceptr addr; /* allocation / reservation; for a handle: where it is mapped, or 0 */
  size_t size;
  uint8_t *mapped;  /* reservation: one byte per granule, the handle mapped there (index+1) */
} range;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static range ranges[MAX_RANGES];
static size_t used[DEVICES];
static CUdeviceptr next_addr = 0x100000000000ull;
static int contexts[DEVICES]; /* the primary contexts are the addresses of these */
static int retained[DEVICES];
static __thread CUcontext current;
static __thread CUcontext stack[16];
static __thread int depth;

static long fail_countdown; /* 0: no fault planned */

/* Called by each physical-memory entry point, under the lock: true when this call fails. */
static int injected_fault(void) {
  return fail_countdown > 0 && --fail_countdown == 0;
}

FAKE_EXPORT void fake_cuda_fail_call(long n) {
  pthread_mutex_lock(&lock);
  fail_countdown = n;
  pthread_mutex_unlock(&lock);
}

/* The planned fault has not fired yet (0 once it did, or when none was planned). */
FAKE_EXPORT long fake_cuda_fault_pending(void) {
  pthread_mutex_lock(&lock);
  long n = fail_countdown;
  pthread_mutex_unlock(&lock);
  return n;
}

/* Physical memory in use on device 0: allocations and handles. */
FAKE_EXPORT size_t fake_cuda_used_bytes(void) {
  pthread_mutex_lock(&lock);
  size_t n = used[0];
  pthread_mutex_unlock(&lock);
  return n;
}

/* Device 0's cuMemAlloc and cuMemAllocManaged allocations (handles not included). */
FAKE_EXPORT size_t fake_cuda_allocated_bytes(void) {
  size_t bytes = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_RANGES; i++)
    if (ranges[i].kind == 1 && ranges[i].device == 0) bytes += ranges[i].size;
  pthread_mutex_unlock(&lock);
  return bytes;
}

FAKE_EXPORT size_t fake_cuda_mapped_bytes(void) {
  size_t bytes = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_RANGES; i++)
    if (ranges[i].kind == 2)
      for (size_t g = 0; g < ranges[i].size / GRANULE; g++) bytes += ranges[i].mapped[g] ? GRANULE : 0;
  pthread_mutex_unlock(&lock);
  return bytes;
}

typedef struct fake_event {
  int queries_left;
  CUstream recorded_on;
} fake_event;

/* cuStreamWaitEvent's calls: how many, and the last one's streams (the waiting stream and
 * the one its event was last recorded on), for the tests of blocks lent across streams. */
static long stream_waits;
static CUstream last_waiter, last_waited_on;

FAKE_EXPORT long fake_cuda_stream_waits(CUstream *waiter, CUstream *waited_on) {
  pthread_mutex_lock(&lock);
  long n = stream_waits;
  if (waiter) *waiter = last_waiter;
  if (waited_on) *waited_on = last_waited_on;
  pthread_mutex_unlock(&lock);
  return n;
}

static int current_device(void) {
  for (int d = 0; d < DEVICES; d++)
    if (current == &contexts[d]) return d;
  return -1;
}

static range *new_range(int kind, int device, CUdeviceptr addr, size_t size) {
  for (int i = 0; i < MAX_RANGES; i++)
    if (!ranges[i].kind) {
      ranges[i] = (range){kind, device, addr, size, NULL};
      return &ranges[i];
    }
  return NULL;
}

static range *find_range(int kind, CUdeviceptr addr) {
  for (int i = 0; i < MAX_RANGES; i++)
    if (ranges[i].kind == kind && ranges[i].addr == addr) return &ranges[i];
  return NULL;
}

static range *reservation_holding(CUdeviceptr addr, size_t size) {
  for (int i = 0; i < MAX_RANGES; i++)
    if (ranges[i].kind == 2 && addr >= ranges[i].addr && addr + size <= ranges[i].addr + ranges[i].size)
      return &ranges[i];
  return NULL;
}

static CUdeviceptr take_addresses(size_t size) {
  CUdeviceptr a = next_addr;
  next_addr += (size + GRANULE - 1) / GRANULE * GRANULE + GRANULE; /* a gap between ranges */
  return a;
}

/* ---- initialisation, devices, errors */

FAKE_EXPORT CUresult cuInit(unsigned flags) { return flags ? ERROR_INVALID_VALUE : SUCCESS; }
FAKE_EXPORT CUresult cuDriverGetVersion(int *v) { *v = 13000; return SUCCESS; }
FAKE_EXPORT CUresult cuGetErrorString(CUresult e, const char **s) {
  *s = e == ERROR_OUT_OF_MEMORY ? "out of memory (fake driver)" : "error (fake driver)";
  return SUCCESS;
}
FAKE_EXPORT CUresult cuGetErrorName(CUresult e, const char **s) {
  *s = e == ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_FAKE";
  return SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetCount(int *n) { *n = DEVICES; return SUCCESS; }
FAKE_EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  if (ordinal < 0 || ordinal >= DEVICES) return ERROR_INVALID_DEVICE;
  *d = ordinal;
  return SUCCESS;
}
/* A fixed UUID per device, bytes 0x10*ordinal + i, so that two processes on the fake
 * driver share a GPU as NVML's double (fake_nvml.c) sees it. */
FAKE_EXPORT CUresult cuDeviceGetUuid_v2(char uuid[16], CUdevice d) {
  if (d < 0 || d >= DEVICES) return ERROR_INVALID_DEVICE;
  for (int i = 0; i < 16; i++) uuid[i] = (char)(0x10 * d + i);
  return SUCCESS;
}
/* Every attribute asked (concurrent managed access, VMM support...) is "yes", but VMM
 * support while a test has turned it off. */
#define ATTRIBUTE_VMM_SUPPORTED 102
static int vmm_supported = 1;
FAKE_EXPORT void fake_cuda_set_vmm_supported(int yes) {
  pthread_mutex_lock(&lock);
  vmm_supported = yes;
  pthread_mutex_unlock(&lock);
}
FAKE_EXPORT CUresult cuDeviceGetAttribute(int *v, int attribute, CUdevice d) {
  if (d < 0 || d >= DEVICES) return ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&lock);
  *v = attribute == ATTRIBUTE_VMM_SUPPORTED ? vmm_supported : 1;
  pthread_mutex_unlock(&lock);
  return SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer) {
  if (d < 0 || d >= DEVICES || peer < 0 || peer >= DEVICES) return ERROR_INVALID_DEVICE;
  *can = d != peer;
  return SUCCESS;
}

/* ---- contexts */

FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  if (d < 0 || d >= DEVICES) return ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&lock);
  retained[d]++;
  pthread_mutex_unlock(&lock);
  *c = &contexts[d];
  return SUCCESS;
}
FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  if (d < 0 || d >= DEVICES) return ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&lock);
  int rc = retained[d] > 0 ? (retained[d]--, SUCCESS) : ERROR_INVALID_CONTEXT;
  pthread_mutex_unlock(&lock);
  return rc;
}
FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return SUCCESS; }
FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext c) { current = c; return SUCCESS; }
FAKE_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) {
  if (depth == 16) return ERROR_INVALID_VALUE;
  stack[depth++] = current;
  current = c;
  return SUCCESS;
}
FAKE_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c) {
  if (!depth) return ERROR_INVALID_CONTEXT;
  if (c) *c = current;
  current = stack[--depth];
  return SUCCESS;
}

/* ---- memory: allocations */

static CUresult alloc_on_current(CUdeviceptr *p, size_t size) {
  int d = current_device();
  if (d < 0) return ERROR_INVALID_CONTEXT;
  if (!size) return ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  size_t rounded = (size + GRANULE - 1) / GRANULE * GRANULE;
  CUresult rc = SUCCESS;
  if (injected_fault() || rounded > CAPACITY - used[d]) {
    rc = ERROR_OUT_OF_MEMORY;
  } else {
    CUdeviceptr a = take_addresses(rounded);
    if (!new_range(1, d, a, rounded)) {
      rc = ERROR_OUT_OF_MEMORY;
    } else {
      used[d] += rounded;
      *p = a;
    }
  }
  pthread_mutex_unlock(&lock);
  return rc;
}

FAKE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) { return alloc_on_current(p, size); }
FAKE_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned flags) {
  return alloc_on_current(p, size);
}
FAKE_EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  if (current_device() < 0) return ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&lock);
  range *r = find_range(1, p);
  CUresult rc = ERROR_INVALID_VALUE;
  if (r) {
    used[r->device] -= r->size;
    r->kind = 0;
    rc = SUCCESS;
  }
  pthread_mutex_unlock(&lock);
  return rc;
}
FAKE_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
  int d = current_device();
  if (d < 0) return ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&lock);
  *free_bytes = CAPACITY - used[d];
  *total = CAPACITY;
  pthread_mutex_unlock(&lock);
  return SUCCESS;
}
static CUresult managed_range_ok(CUdeviceptr p, size_t size) {
  if (current_device() < 0) return ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&lock);
  CUresult rc = ERROR_INVALID_VALUE;
  for (int i = 0; i < MAX_RANGES; i++)
    if (ranges[i].kind == 1 && p >= ranges[i].addr && p + size <= ranges[i].addr + ranges[i].size)
      rc = SUCCESS;
  pthread_mutex_unlock(&lock);
  return rc;
}
FAKE_EXPORT CUresult cuMemAdvise_v2(CUdeviceptr p, size_t size, int advice, CUmemLocation loc) {
  return managed_range_ok(p, size);
}
FAKE_EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t size, CUmemLocation loc,
                                           unsigned flags, CUstream s) {
  return managed_range_ok(p, size);
}

/* ---- memory: virtual address ranges and physical handles */

FAKE_EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const void *prop, int option) {
  *g = GRANULE;
  return SUCCESS;
}
FAKE_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t alignment,
                                         CUdeviceptr hint, unsigned long long flags) {
  if (!size || size % GRANULE || (alignment && GRANULE % alignment && alignment % GRANULE))
    return ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  CUresult rc = ERROR_OUT_OF_MEMORY;
  uint8_t *mapped = calloc(size / GRANULE, 1);
  CUdeviceptr a = take_addresses(size);
  range *r = mapped ? new_range(2, -1, a, size) : NULL;
  if (r) {
    r->mapped = mapped;
    *p = a;
    rc = SUCCESS;
  } else {
    free(mapped);
  }
  pthread_mutex_unlock(&lock);
  return rc;
}
FAKE_EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
  pthread_mutex_lock(&lock);
  range *r = find_range(2, p);
  CUresult rc = ERROR_INVALID_VALUE;
  if (r && r->size == size) {
    rc = SUCCESS;
    for (size_t g = 0; g < size / GRANULE; g++)
      if (r->mapped[g]) rc = ERROR_INVALID_VALUE; /* still mapped */
    if (rc == SUCCESS) {
      free(r->mapped);
      r->kind = 0;
    }
  }
  pthread_mutex_unlock(&lock);
  return rc;
}
FAKE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const void *prop,
                                 unsigned long long flags) {
  int d = current_device();
  if (d < 0) return ERROR_INVALID_CONTEXT;
  if (!size || size % GRANULE) return ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  CUresult rc = ERROR_OUT_OF_MEMORY;
  if (!injected_fault() && size <= CAPACITY - used[d]) {
    range *r = new_range(3, d, 0, size);
    if (r) {
      used[d] += size;
      *h = (CUmemGenericAllocationHandle)(r - ranges) + 1;
      rc = SUCCESS;
    }
  }
  pthread_mutex_unlock(&lock);
  return rc;
}
static range *handle_range(CUmemGenericAllocationHandle h) {
  return h >= 1 && h <= MAX_RANGES && ranges[h - 1].kind == 3 ? &ranges[h - 1] : NULL;
}
FAKE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  pthread_mutex_lock(&lock);
  range *r = handle_range(h);
  CUresult rc = ERROR_INVALID_VALUE;
  if (r && !injected_fault()) { /* the memory goes once the handle is released and unmapped */
    used[r->device] -= r->size;
    r->kind = 0;
    rc = SUCCESS;
  }
  pthread_mutex_unlock(&lock);
  return rc;
}
FAKE_EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset,
                              CUmemGenericAllocationHandle h, unsigned long long flags) {
  pthread_mutex_lock(&lock);
  range *res = reservation_holding(p, size), *hr = handle_range(h);
  CUresult rc = ERROR_INVALID_VALUE;
  if (!injected_fault() && res && hr && !offset && hr->size == size && !hr->addr &&
      (p - res->addr) % GRANULE == 0) {
    size_t g0 = (p - res->addr) / GRANULE, n = size / GRANULE;
    rc = SUCCESS;
    for (size_t g = g0; g < g0 + n; g++)
      if (res->mapped[g]) rc = ERROR_INVALID_VALUE;
    if (rc == SUCCESS) {
      memset(res->mapped + g0, 1, n);
      hr->addr = p;
    }
  }
  pthread_mutex_unlock(&lock);
  return rc;
}
FAKE_EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
  pthread_mutex_lock(&lock);
  range *res = reservation_holding(p, size);
  CUresult rc = ERROR_INVALID_VALUE;
  if (!injected_fault() && res && (p - res->addr) % GRANULE == 0 && size % GRANULE == 0) {
    size_t g0 = (p - res->addr) / GRANULE, n = size / GRANULE;
    rc = SUCCESS;
    for (size_t g = g0; g < g0 + n; g++)
      if (!res->mapped[g]) rc = ERROR_INVALID_VALUE;
    for (int i = 0; i < MAX_RANGES; i++) /* whole mappings only, as the driver says */
      if (ranges[i].kind == 3 && ranges[i].addr && ranges[i].addr < p + size &&
          ranges[i].addr + ranges[i].size > p &&
          (ranges[i].addr < p || ranges[i].addr + ranges[i].size > p + size))
        rc = ERROR_INVALID_VALUE;
    if (rc == SUCCESS) {
      memset(res->mapped + g0, 0, n);
      for (int i = 0; i < MAX_RANGES; i++) /* handles mapped inside leave their place */
        if (ranges[i].kind == 3 && ranges[i].addr >= p && ranges[i].addr < p + size) ranges[i].addr = 0;
    }
  }
  pthread_mutex_unlock(&lock);
  return rc;
}
FAKE_EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const void *desc, size_t count) {
  pthread_mutex_lock(&lock);
  range *res = reservation_holding(p, size);
  CUresult rc = res && count && !injected_fault() ? SUCCESS : ERROR_INVALID_VALUE;
  for (size_t g = 0; rc == SUCCESS && g < size / GRANULE; g++)
    if (!res->mapped[(p - res->addr) / GRANULE + g]) rc = ERROR_INVALID_VALUE;
  pthread_mutex_unlock(&lock);
  return rc;
}

/* ---- events: complete after one "not ready" */

FAKE_EXPORT CUresult cuEventCreate(CUevent *e, unsigned flags) {
  if (current_device() < 0) return ERROR_INVALID_CONTEXT;
  fake_event *ev = calloc(1, sizeof *ev);
  if (!ev) return ERROR_OUT_OF_MEMORY;
  *e = ev;
  return SUCCESS;
}
FAKE_EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
  if (current_device() < 0) return ERROR_INVALID_CONTEXT;
  ((fake_event *)e)->queries_left = 1;
  ((fake_event *)e)->recorded_on = s;
  return SUCCESS;
}
FAKE_EXPORT CUresult cuEventQuery(CUevent e) {
  fake_event *ev = e;
  if (ev->queries_left > 0) {
    ev->queries_left--;
    return ERROR_NOT_READY;
  }
  return SUCCESS;
}
FAKE_EXPORT CUresult cuEventSynchronize(CUevent e) {
  ((fake_event *)e)->queries_left = 0;
  return SUCCESS;
}
FAKE_EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
  if (current_device() < 0) return ERROR_INVALID_CONTEXT;
  if (!e || flags) return ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  stream_waits++;
  last_waiter = s;
  last_waited_on = ((fake_event *)e)->recorded_on;
  pthread_mutex_unlock(&lock);
  return SUCCESS;
}
FAKE_EXPORT CUresult cuEventDestroy_v2(CUevent e) {
  free(e);
  return SUCCESS;
}

/* cuda_driver.h - the CUDA driver API, opened at run time: its types, its entry points in
 * one table, and the device/context/event helpers the three GPU sources share.
 *
 * No CUDA toolkit is needed to build vramkit, so that it builds anywhere: the few
 * driver types, enums and constants used are declared here by hand, with the values of the
 * driver API's cuda.h, and `libcuda.so.1` is opened with dlopen on first use.
 *
 * Error text: driver failures go through _vram_cuda_status, which maps the CUresult to a
 * vram_status and keeps "call: CUDA_ERROR_NAME (driver's message)" in a per-thread buffer
 * that _vram_cuda_last_error returns, so callers above a source can explain a failure.
 */
#ifndef VRAM_PRIM_CUDA_DRIVER_H
#define VRAM_PRIM_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "vramkit.h"

/* ---------------------------------------------------------------------------------------
 * Driver types (ABI-identical to cuda.h; only what vramkit uses).
 * ------------------------------------------------------------------------------------- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr; /* the _v2 (64-bit) device pointer */
typedef struct CUctx_st *CUcontext;
typedef struct CUevent_st *CUevent;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUmemGenericAllocationHandle;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_DEINITIALIZED 4
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_NOT_SUPPORTED 801

#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_MEM_ATTACH_GLOBAL 0x1
#define CU_DEVICE_CPU ((CUdevice)-1)

#define CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY 83
#define CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS 89
#define CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102

#define CU_MEM_ADVISE_SET_PREFERRED_LOCATION 3
#define CU_MEM_ADVISE_SET_ACCESSED_BY 5

#define CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define CU_MEM_LOCATION_TYPE_HOST 0x2
#define CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define CU_MEM_HANDLE_TYPE_NONE 0x0
#define CU_MEM_ACCESS_FLAGS_PROT_NONE 0x0
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
#define CU_MEM_ALLOC_GRANULARITY_MINIMUM 0x0
#define CU_MEM_ALLOC_GRANULARITY_RECOMMENDED 0x1

typedef struct CUuuid {
  char bytes[16];
} CUuuid;

/* The driver's enums are C enums (int-sized); plain ints keep the layout and let us spell
 * the values above without declaring whole enum types. */
typedef struct CUmemLocation {
  int type; /* CU_MEM_LOCATION_TYPE_* */
  int id;   /* device ordinal for DEVICE; ignored for HOST */
} CUmemLocation;

typedef struct CUmemAllocationProp {
  int type;                 /* CU_MEM_ALLOCATION_TYPE_PINNED */
  int requestedHandleTypes; /* CU_MEM_HANDLE_TYPE_NONE */
  CUmemLocation location;
  void *win32HandleMetaData; /* must be NULL off Windows */
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc {
  CUmemLocation location;
  int flags; /* CU_MEM_ACCESS_FLAGS_PROT_* */
} CUmemAccessDesc;

/* ---------------------------------------------------------------------------------------
 * The entry-point table. Required entries are always non-NULL after a successful load;
 * entries marked optional are NULL when the installed driver lacks them, and the source
 * that needs them answers VRAM_EUNSUPPORTED.
 * ------------------------------------------------------------------------------------- */
typedef struct vram_cuda_api {
  /* Required. */
  CUresult (*cuInit)(unsigned int flags);
  CUresult (*cuDriverGetVersion)(int *version);
  CUresult (*cuGetErrorString)(CUresult error, const char **str);
  CUresult (*cuGetErrorName)(CUresult error, const char **str);
  CUresult (*cuDeviceGet)(CUdevice *dev, int ordinal);
  CUresult (*cuDeviceGetCount)(int *count);
  CUresult (*cuDeviceGetAttribute)(int *value, int attrib, CUdevice dev);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice dev); /* _v2 where exported */
  CUresult (*cuCtxGetCurrent)(CUcontext *ctx);
  CUresult (*cuCtxSetCurrent)(CUcontext ctx);
  CUresult (*cuCtxPushCurrent)(CUcontext ctx);  /* _v2 */
  CUresult (*cuCtxPopCurrent)(CUcontext *ctx);  /* _v2 */
  CUresult (*cuMemAlloc)(CUdeviceptr *dptr, size_t size);          /* _v2 */
  CUresult (*cuMemFree)(CUdeviceptr dptr);                         /* _v2 */
  CUresult (*cuMemGetInfo)(size_t *free_bytes, size_t *total_bytes); /* _v2 */
  CUresult (*cuEventCreate)(CUevent *event, unsigned int flags);
  CUresult (*cuEventRecord)(CUevent event, CUstream stream);
  CUresult (*cuEventQuery)(CUevent event);
  CUresult (*cuEventSynchronize)(CUevent event);
  CUresult (*cuEventDestroy)(CUevent event); /* _v2 */
  CUresult (*cuStreamWaitEvent)(CUstream stream, CUevent event, unsigned int flags);

  /* Optional: the device's UUID (the _v2 form where exported; same signature). */
  CUresult (*cuDeviceGetUuid)(CUuuid *uuid, CUdevice dev);

  /* Optional: peer access. */
  CUresult (*cuDeviceCanAccessPeer)(int *can, CUdevice dev, CUdevice peer);

  /* Optional: virtual memory management (CUDA 10.2+). */
  CUresult (*cuMemAddressReserve)(CUdeviceptr *ptr, size_t size, size_t alignment,
                                  CUdeviceptr addr, unsigned long long flags);
  CUresult (*cuMemAddressFree)(CUdeviceptr ptr, size_t size);
  CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *handle, size_t size,
                          const CUmemAllocationProp *prop, unsigned long long flags);
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle handle);
  CUresult (*cuMemMap)(CUdeviceptr ptr, size_t size, size_t offset,
                       CUmemGenericAllocationHandle handle, unsigned long long flags);
  CUresult (*cuMemUnmap)(CUdeviceptr ptr, size_t size);
  CUresult (*cuMemSetAccess)(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                             size_t count);
  CUresult (*cuMemGetAllocationGranularity)(size_t *granularity,
                                            const CUmemAllocationProp *prop, int option);

  /* Optional: managed memory. Exactly one of each advise/prefetch pair is set when the
   * driver has either: the _v2 forms (CUDA 12.2+) take a CUmemLocation, the old forms a
   * CUdevice (CU_DEVICE_CPU for the host). Call them through _vram_cuda_mem_advise and
   * _vram_cuda_mem_prefetch, which hide the difference. */
  CUresult (*cuMemAllocManaged)(CUdeviceptr *dptr, size_t size, unsigned int flags);
  CUresult (*cuMemAdvise_v2)(CUdeviceptr dptr, size_t count, int advice, CUmemLocation loc);
  CUresult (*cuMemAdvise_v1)(CUdeviceptr dptr, size_t count, int advice, CUdevice dev);
  CUresult (*cuMemPrefetchAsync_v2)(CUdeviceptr dptr, size_t count, CUmemLocation loc,
                                    unsigned int flags, CUstream stream);
  CUresult (*cuMemPrefetchAsync_v1)(CUdeviceptr dptr, size_t count, CUdevice dev,
                                    CUstream stream);

  int driver_version; /* from cuDriverGetVersion, e.g. 13000 */
} vram_cuda_api;

/* ---------------------------------------------------------------------------------------
 * cuda_driver.c: loading and errors.
 * ------------------------------------------------------------------------------------- */

/* Open libcuda.so.1 (once per process, thread-safe), resolve the table and call cuInit(0).
 * VRAM_OK and *out = the table; VRAM_ENODRIVER when the library, a required symbol or
 * cuInit is missing or fails. *why (if non-NULL) gets a static message either way ("" on
 * success); every later call returns the same result. */
int _vram_cuda_load(const vram_cuda_api **out, const char **why);

/* Map a CUresult to a vram_status: CUDA_SUCCESS -> VRAM_OK, CUDA_ERROR_OUT_OF_MEMORY ->
 * VRAM_ENOMEM, anything else -> VRAM_EDRIVER. On failure keeps "what: NAME (message)" as
 * this thread's last driver error. */
int _vram_cuda_status(CUresult r, const char *what);

/* This thread's last driver error message, "" if none. Valid until the thread's next
 * failing driver call. */
const char *_vram_cuda_last_error(void);

/* Record a message of our own as this thread's last driver error (e.g. "no peer access"). */
void _vram_cuda_set_error(const char *what, const char *message);

/* ---------------------------------------------------------------------------------------
 * cuda_driver.c: a device and its primary context.
 *
 * Every GPU source's state begins with a vram_cuda_device, so the event helpers below
 * serve directly as the sources' xEvent* methods.
 * ------------------------------------------------------------------------------------- */
typedef struct vram_cuda_device {
  const vram_cuda_api *api;
  int ordinal;
  CUdevice dev;
  CUcontext ctx; /* the device's primary context, retained while the source is open */
} vram_cuda_device;

/* Load the driver, check the ordinal (VRAM_EDEVICE if out of range) and retain the primary
 * context. On failure nothing is held. */
int _vram_cuda_device_open(vram_cuda_device *d, int ordinal);
/* The UUID of device `ordinal` as NVML and nvidia-smi print it, "GPU-" and 8-4-4-4-12
 * lowercase hex digits (41 characters and a NUL). "" in buf and VRAM_EUNSUPPORTED when the
 * driver lacks cuDeviceGetUuid; another status when the driver or the device fails. */
int _vram_cuda_device_uuid(int ordinal, char *buf, size_t cap);
/* Release the primary context retained by _vram_cuda_device_open. */
void _vram_cuda_device_close(vram_cuda_device *d);
/* One integer attribute of the device (CU_DEVICE_ATTRIBUTE_*). */
int _vram_cuda_device_attribute(vram_cuda_device *d, int attrib, int *value);

/* Make d's primary context current for the calling thread around one or more driver
 * calls. Both are cheap when it already is (one thread-local read in the driver). */
typedef struct vram_cuda_scope {
  int pushed; /* 1: we pushed d->ctx and must pop it */
} vram_cuda_scope;
int _vram_cuda_enter(vram_cuda_device *d, vram_cuda_scope *scope);
void _vram_cuda_leave(vram_cuda_device *d, vram_cuda_scope *scope);

/* Free and total memory of the device (cuMemGetInfo in its context). Signature of the
 * source table's xMemInfo: `state` must begin with a vram_cuda_device. */
int _vram_cuda_mem_info(void *state, size_t *free_bytes, size_t *total_bytes);

/* Advise or prefetch a managed range, hiding the v1/v2 driver signatures. device_or_cpu is
 * a device ordinal or CU_DEVICE_CPU. The caller has d's context current. */
int _vram_cuda_mem_advise(vram_cuda_device *d, CUdeviceptr ptr, size_t size, int advice,
                          int device_or_cpu);
int _vram_cuda_mem_prefetch(vram_cuda_device *d, CUdeviceptr ptr, size_t size,
                            int device_or_cpu, CUstream stream);

/* ---------------------------------------------------------------------------------------
 * cuda_driver.c: events, with the signatures of the source table's xEvent* methods.
 * `state` must begin with a vram_cuda_device. Events are created with
 * CU_EVENT_DISABLE_TIMING (timing makes record and query slower, and we never time).
 * ------------------------------------------------------------------------------------- */
int _vram_cuda_event_create(void *state, void **event);
void _vram_cuda_event_destroy(void *state, void *event);
int _vram_cuda_event_record(void *state, void *event, vram_stream_t stream);
/* 1 when complete, 0 while pending, negative vram_status on error. */
int _vram_cuda_event_query(void *state, void *event);
int _vram_cuda_event_synchronize(void *state, void *event);
/* Work queued on `stream` after this call waits for `event` (cuStreamWaitEvent). */
int _vram_cuda_stream_wait_event(void *state, vram_stream_t stream, void *event);

#endif /* VRAM_PRIM_CUDA_DRIVER_H */

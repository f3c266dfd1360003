/* source.h - the table of functions behind which every physical memory source sits.
 *
 * The engine (src/pool/) never calls the driver: it asks a source. A source is a
 * `static const vram_source_methods` table (SQLite's VFS style) plus an opaque state
 * returned by xOpen. Two families exist:
 *  - fixed segments (cuda, managed, sim): xAlloc/xFree hand out whole segments;
 *  - virtual memory (vmm, sim:vmm): xReserve/xUnreserve manage address ranges and
 *    xMap/xUnmap back granules of them with physical memory.
 * A fixed source may fill the virtual methods too (cuda, sim): its pools grow into virtual
 * ranges near their cap (vram_options_t.virtual_threshold), in the same rounding unit;
 * is_vmm says which family a pool starts in. A source fills what it supports and leaves the
 * rest NULL; `granularity` tells the engine the rounding unit of segments or mappings.
 * Events order reuse across streams.
 *
 * Every method returns a vram_status. A failing method must leave the source as it was
 * (a half-done map is undone before returning), so the engine can always retry later.
 */
#ifndef VRAM_SOURCE_H
#define VRAM_SOURCE_H

#include <stdbool.h>

#include "prim/nvml.h"
#include "vramkit.h"

#define VRAM_SIM_DEVICES 8 /* the sim models a machine of eight identical devices */

/* AUTO resolved: a GPU source where a driver sees a device, else sim (registry.c). */
int _vram_resolve_source(vram_source_kind kind, vram_source_kind *resolved);
/* Devices that the source of `kind` (AUTO resolved as a pool would be) can serve. */
int _vram_source_device_count(vram_source_kind kind, int *count);

typedef struct vram_source_config {
  int device;
  size_t sim_capacity;   /* sim: bytes of the simulated device */
  int sim_event_delay;   /* sim: queries before an event completes */
  int managed_prefetch;  /* managed: prefetch new segments to the device */
  int private_device;    /* sim: never a device shared with other processes */
} vram_source_config;

typedef struct vram_source_methods {
  const char *zName;
  int is_vmm; /* 1: reserve/map family; 0: fixed segments */
  int (*xOpen)(const vram_source_config *cfg, void **state);
  void (*xClose)(void *state);
  /* Rounding unit of segment sizes (fixed) or of mappings (vmm); a power of two. */
  size_t (*xGranularity)(void *state);
  int (*xMemInfo)(void *state, size_t *free_bytes, size_t *total_bytes);

  /* Fixed segments, for the arena of `stream` (the callback source passes it on). */
  int (*xAlloc)(void *state, size_t size, vram_stream_t stream, uintptr_t *addr);
  int (*xFree)(void *state, uintptr_t addr, size_t size, vram_stream_t stream);

  /* Virtual memory: reserve an address range; map/unmap granule-aligned pieces of it. */
  int (*xReserve)(void *state, size_t size, uintptr_t *addr);
  int (*xUnreserve)(void *state, uintptr_t addr, size_t size);
  int (*xMap)(void *state, uintptr_t addr, size_t size);
  int (*xUnmap)(void *state, uintptr_t addr, size_t size);
  /* Give another device access to every mapping made after this call (vmm only). */
  int (*xEnablePeer)(void *state, int peer_device);
  /* Move the pages of a range to the device (to_device != 0) or the host, ordered on
   * stream (managed only). */
  int (*xPrefetch)(void *state, uintptr_t addr, size_t size, int to_device, vram_stream_t stream);

  /* Events. An event handle is created once and recorded many times. */
  int (*xEventCreate)(void *state, void **event);
  void (*xEventDestroy)(void *state, void *event);
  int (*xEventRecord)(void *state, void *event, vram_stream_t stream);
  /* 1 when complete, 0 while pending, negative status on error. */
  int (*xEventQuery)(void *state, void *event);
  int (*xEventSynchronize)(void *state, void *event);
  /* Make work queued on `stream` from now on wait until `event` completes, without the
   * host waiting (a block of one stream's arena lent to another, pool.c). */
  int (*xStreamWaitEvent)(void *state, vram_stream_t stream, void *event);

  /* Who else is on the device, for the OOM report's neighbours; NULL where no other
   * process can be (sim: the device is this process's own). xDeviceUuid: the GPU as NVML
   * and other processes' records name it ("GPU-..."), "" when the driver gives none.
   * xProcesses: the compute processes NVML lists on it, how many were written to out (at
   * most max), or -1 with *why (static text). */
  void (*xDeviceUuid)(void *state, char *buf, size_t cap);
  int (*xProcesses)(void *state, vram_nvml_process *out, int max, const char **why);
  /* The device as the processes that share it name it, for the give-back group
   * (pool/giveback.h); "" where no other process shares it. NULL: xDeviceUuid's name. */
  void (*xGroupName)(void *state, char *buf, size_t cap);
} vram_source_methods;

/* device_identity.c: xDeviceUuid and xProcesses for the sources on the CUDA driver, whose
 * state starts with a vram_cuda_device. */
void _vram_source_device_uuid(void *state, char *buf, size_t cap);
int _vram_source_processes(void *state, vram_nvml_process *out, int max, const char **why);

/* The sources compiled into the library. */
extern const vram_source_methods _vram_source_sim;      /* fixed segments, host only */
extern const vram_source_methods _vram_source_sim_vmm;  /* vmm model, host only */
extern const vram_source_methods _vram_source_cuda;
extern const vram_source_methods _vram_source_vmm;
extern const vram_source_methods _vram_source_managed;

/* The table of a kind (AUTO is resolved by the caller), NULL if unknown. */
const vram_source_methods *_vram_source_for(vram_source_kind kind);

/* Wrap a source so that chosen calls fail with VRAM_EFAULT (tests, fault injection).
 * Counts every fallible call (alloc, free, reserve, map, unmap, event record, stream wait). */
typedef struct vram_fault_plan {
  uint64_t fail_at;    /* 1-based call number that fails; 0 = never */
  uint64_t fail_every; /* after fail_at, every n-th call fails too; 0 = only fail_at */
  /* Optional counting of device memory (NULL: none): count_take is offered the bytes of
   * each segment or mapping before the source makes it, and refuses it (the call then
   * fails with VRAM_ENOMEM) by returning false; count_give is told of each that went back
   * (and of one whose making failed); count_close runs when the wrapper closes. */
  void *count_user;
  bool (*count_take)(void *user, size_t bytes);
  void (*count_give)(void *user, size_t bytes);
  void (*count_close)(void *user);
} vram_fault_plan;
int _vram_fault_wrap(const vram_source_methods *inner, void *inner_state,
                     const vram_fault_plan *plan, const vram_source_methods **out_methods,
                     void **out_state);

/* callback.c: a source whose segments come from the caller's functions
 * (vram_source_callbacks_t), with everything else (events, memory figures, the device's
 * identity) asked of the inner source, which it owns from then on and closes. Fixed
 * segments only. */
int _vram_callback_wrap(const vram_source_methods *inner, void *inner_state, int device,
                        const vram_source_callbacks_t *callbacks,
                        const vram_source_methods **out_methods, void **out_state);

#endif /* VRAM_SOURCE_H */

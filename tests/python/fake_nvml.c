/* A fake NVML for the tests of vramkit's NVML wrapper and `vramkit top` on machines without a GPU.
 *
 * Built by the tests into a shared library and opened through VRAMKIT_NVML_LIBRARY, so the
 * wrapper's ctypes structs, its fallbacks to older calls and its error paths run against C
 * code with NVML's own signatures and struct layouts. Canned data: two GPUs, processes on the
 * first. Variants (compile-time, as a real driver exports a call or not):
 *   -DFAKE_NO_PROCESSES_V3 / -DFAKE_NO_PROCESSES_V2: no _v3 / _v2 process call
 *   -DFAKE_NO_MEMORY_V2: no nvmlDeviceGetMemoryInfo_v2 (drivers before 515)
 * At run time:
 *   FAKE_NVML_INIT_FAIL=1: nvmlInit fails as without a loaded driver
 *   FAKE_NVML_PROCESSES="gpu:pid:bytes,...": more compute processes (e.g. a test's child)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct fake_device *nvmlDevice_t;

enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
};

#define NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFull
#define GIB (1ull << 30)
#define MAX_PROCESSES 32

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

struct fake_process { unsigned int pid; unsigned long long used; };

struct fake_device {
  const char *uuid, *name;
  unsigned long long total, reserved, used;
  int utilization; /* -1: not supported */
  int n_processes;
  struct fake_process processes[MAX_PROCESSES];
};

static struct fake_device devices[2] = {
  {"GPU-11111111-2222-3333-4444-555555555555", "Fake H200", 140 * GIB, 1 * GIB, 10 * GIB, 37,
   2, {{4242, 3 * GIB}, {4343, NOT_AVAILABLE}}},
  {"GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", "Fake A100", 80 * GIB, 0, 0, -1, 0, {{0, 0}}},
};
static int initialised;

static void add_processes(void) {
  /* "gpu:pid:bytes,..." appended to the canned lists, once per init */
  const char *spec = getenv("FAKE_NVML_PROCESSES");
  while (spec && *spec) {
    unsigned gpu, pid;
    unsigned long long bytes;
    if (sscanf(spec, "%u:%u:%llu", &gpu, &pid, &bytes) == 3 && gpu < 2 &&
        devices[gpu].n_processes < MAX_PROCESSES) {
      struct fake_device *d = &devices[gpu];
      d->processes[d->n_processes].pid = pid;
      d->processes[d->n_processes].used = bytes;
      d->n_processes++;
      d->used += bytes;
    }
    spec = strchr(spec, ',');
    if (spec) spec++;
  }
}

nvmlReturn_t nvmlInit_v2(void) {
  const char *fail = getenv("FAKE_NVML_INIT_FAIL");
  if (fail && *fail == '1') return NVML_ERROR_DRIVER_NOT_LOADED;
  if (!initialised) add_processes();
  initialised = 1;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
  case NVML_SUCCESS: return "Success";
  case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
  case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
  case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
  case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
  default: return "Unknown Error";
  }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
  if (!initialised) return NVML_ERROR_UNINITIALIZED;
  *count = 2;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
  if (!initialised) return NVML_ERROR_UNINITIALIZED;
  if (index >= 2) return NVML_ERROR_INVALID_ARGUMENT;
  *device = &devices[index];
  return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(const char *text, char *out, unsigned int length) {
  if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  memcpy(out, text, strlen(text) + 1);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
  return copy_string(device->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
  return copy_string(device->name, name, length);
}

/* The first form counts the driver's reserve as used, as real drivers do. */
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
  memory->total = device->total;
  memory->used = device->used + device->reserved;
  memory->free = device->total - memory->used;
  return NVML_SUCCESS;
}

#ifndef FAKE_NO_MEMORY_V2
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
  if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  memory->total = device->total;
  memory->reserved = device->reserved;
  memory->used = device->used;
  memory->free = device->total - device->reserved - device->used;
  return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *rates) {
  if (device->utilization < 0) return NVML_ERROR_NOT_SUPPORTED;
  rates->gpu = (unsigned)device->utilization;
  rates->memory = 5;
  return NVML_SUCCESS;
}

/* NVML's protocol: with too small a count, say how many and fill nothing. */
#define FILL_PROCESSES(TYPE, EXTRA)                                                 \
  if (*count < (unsigned)device->n_processes) {                                     \
    *count = (unsigned)device->n_processes;                                         \
    return device->n_processes ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;       \
  }                                                                                 \
  for (int i = 0; i < device->n_processes; i++) {                                   \
    TYPE *info = &infos[i];                                                         \
    info->pid = device->processes[i].pid;                                           \
    info->usedGpuMemory = device->processes[i].used;                                \
    EXTRA                                                                           \
  }                                                                                 \
  *count = (unsigned)device->n_processes;                                           \
  return NVML_SUCCESS;

#define MIG_IDS info->gpuInstanceId = 0xFFFFFFFFu; info->computeInstanceId = 0xFFFFFFFFu;

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                  nvmlProcessInfo_v1_t *infos) {
  FILL_PROCESSES(nvmlProcessInfo_v1_t, )
}

#ifndef FAKE_NO_PROCESSES_V2
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
  FILL_PROCESSES(nvmlProcessInfo_t, MIG_IDS)
}
#endif

#ifndef FAKE_NO_PROCESSES_V3
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
  FILL_PROCESSES(nvmlProcessInfo_t, MIG_IDS)
}
#endif

/* nvml.c - opens NVML (libnvidia-ml.so.1) at run time and asks it who holds memory on a GPU.
 *
 * The processes call exists in three versions whose element structs differ in size (NVML
 * fills an array, so the stride must be the one of the version called):
 *   v1 {pid, usedGpuMemory}                                       16 bytes
 *   v2 {pid, usedGpuMemory, gpuInstanceId, computeInstanceId}     24 bytes
 *   v3 nvmlProcessInfo_t, the same four fields                    24 bytes
 * (the confidential-computing field is in nvmlProcessDetail_v1_t, another call's struct:
 * read at 32 bytes a v3 array gave an H200's second process a pid made of the first one's
 * byte count). The newest exported is resolved with the struct that goes with it. Tests load a double
 * (tests/c/fake_nvml.c, found first on LD_LIBRARY_PATH). */
#define _GNU_SOURCE
#include "prim/nvml.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_INSUFFICIENT_SIZE 7

typedef struct { unsigned long long total, free, used; } nvml_memory;
typedef struct { unsigned pid; unsigned long long used; } nvml_proc_v1;
typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } nvml_proc_v2;
_Static_assert(sizeof(nvml_proc_v1) == 16 && sizeof(nvml_proc_v2) == 24, "NVML process structs");

/* Resolved once; `procs` with `proc_size` the stride of its version. */
static struct {
  nvmlReturn_t (*init)(void);
  nvmlReturn_t (*shutdown)(void);
  const char *(*error_string)(nvmlReturn_t);
  nvmlReturn_t (*by_uuid)(const char *uuid, nvmlDevice_t *dev);
  nvmlReturn_t (*memory)(nvmlDevice_t dev, nvml_memory *m);
  nvmlReturn_t (*procs)(nvmlDevice_t dev, unsigned *count, void *infos);
  nvmlReturn_t (*process_name)(unsigned pid, char *name, unsigned length);
  size_t proc_size;
} nv;

static pthread_once_t nv_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t nv_lock = PTHREAD_MUTEX_INITIALIZER; /* one query at a time */
static int nv_ok;
static char nv_why[384];
static void *nv_lib;

/* The first of `names` exported, with dlerror cleared before each lookup so that the
 * message kept is this one's. */
static void *nv_sym(const char *const *names, const char **err) {
  for (; *names; names++) {
    dlerror();
    void *p = dlsym(nv_lib, *names);
    if (p) return p;
    *err = dlerror();
  }
  return NULL;
}

#define NV_RESOLVE(field, ...)                                                             \
  do {                                                                                     \
    const char *const names_[] = {__VA_ARGS__, NULL};                                      \
    void *p_ = nv_sym(names_, &err);                                                       \
    memcpy(&nv.field, &p_, sizeof p_);                                                     \
  } while (0)

static const char *nv_text(nvmlReturn_t r) {
  const char *t = nv.error_string ? nv.error_string(r) : NULL;
  return t ? t : "unknown NVML error";
}

static void nv_load(void) {
  dlerror();
  nv_lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!nv_lib) {
    const char *err = dlerror();
    snprintf(nv_why, sizeof nv_why, "cannot open libnvidia-ml.so.1: %s", err ? err : "unknown dlopen error");
    return;
  }
  const char *err = NULL;
  NV_RESOLVE(init, "nvmlInit_v2");
  NV_RESOLVE(shutdown, "nvmlShutdown");
  NV_RESOLVE(error_string, "nvmlErrorString");
  NV_RESOLVE(by_uuid, "nvmlDeviceGetHandleByUUID");
  NV_RESOLVE(memory, "nvmlDeviceGetMemoryInfo");
  NV_RESOLVE(process_name, "nvmlSystemGetProcessName");
  const struct { const char *name; size_t size; } versions[] = {
      {"nvmlDeviceGetComputeRunningProcesses_v3", sizeof(nvml_proc_v2)},
      {"nvmlDeviceGetComputeRunningProcesses_v2", sizeof(nvml_proc_v2)},
      {"nvmlDeviceGetComputeRunningProcesses", sizeof(nvml_proc_v1)}};
  for (size_t i = 0; i < sizeof versions / sizeof versions[0] && !nv.procs; i++) {
    NV_RESOLVE(procs, versions[i].name);
    nv.proc_size = versions[i].size;
  }
  if (!nv.init || !nv.by_uuid || !nv.memory || !nv.procs) {
    snprintf(nv_why, sizeof nv_why, "libnvidia-ml.so.1 lacks an entry point: %s",
             err ? err : "(no dlerror text)");
    return;
  }
  nvmlReturn_t r = nv.init();
  if (r != NVML_SUCCESS) {
    snprintf(nv_why, sizeof nv_why, "nvmlInit_v2: %s (%d)", nv_text(r), r);
    return;
  }
  nv_ok = 1;
}

/* The pid, used bytes and name of entry i of an array of the resolved version. */
static void nv_entry(const unsigned char *infos, int i, vram_nvml_process *out) {
  nvml_proc_v1 head; /* pid and usedGpuMemory lead every version, at the same offsets */
  memcpy(&head, infos + (size_t)i * nv.proc_size, sizeof head);
  out->pid = head.pid;
  out->used_bytes = head.used == ~0ull ? VRAM_NVML_NOT_AVAILABLE : head.used;
  out->name[0] = 0;
  char full[256];
  if (nv.process_name && nv.process_name(head.pid, full, sizeof full) == NVML_SUCCESS) {
    full[sizeof full - 1] = 0;
    const char *base = strrchr(full, '/');
    snprintf(out->name, sizeof out->name, "%.63s", base ? base + 1 : full);
  }
}

#define NV_MAX_PROCS 256

static int nv_query(const char *uuid, vram_nvml_process *out, int max, vram_nvml_gpu *gpu,
                    const char **why) {
  nvmlDevice_t dev;
  nvmlReturn_t r = nv.by_uuid(uuid, &dev);
  if (r != NVML_SUCCESS) {
    snprintf(nv_why, sizeof nv_why, "nvmlDeviceGetHandleByUUID(%s): %s", uuid, nv_text(r));
    *why = nv_why;
    return -1;
  }
  nvml_memory m = {0, 0, 0};
  if (nv.memory(dev, &m) == NVML_SUCCESS) {
    gpu->total = m.total;
    gpu->free = m.free;
    gpu->used = m.used;
  }
  static unsigned char infos[NV_MAX_PROCS * sizeof(nvml_proc_v2)]; /* under nv_lock */
  unsigned count = NV_MAX_PROCS;
  r = nv.procs(dev, &count, infos);
  if (r != NVML_SUCCESS && r != NVML_ERROR_INSUFFICIENT_SIZE) {
    snprintf(nv_why, sizeof nv_why, "nvmlDeviceGetComputeRunningProcesses: %s", nv_text(r));
    *why = nv_why;
    return -1;
  }
  /* Too many to list: NVML filled nothing, but says how many there are. */
  int filled = r == NVML_SUCCESS ? (int)(count < NV_MAX_PROCS ? count : NV_MAX_PROCS) : 0;
  gpu->n_processes = (int)count;
  int n = 0;
  for (int i = 0; i < filled && n < max; i++) nv_entry(infos, i, &out[n++]);
  return n;
}

int _vram_nvml_processes(const char *uuid, vram_nvml_process *out, int max, vram_nvml_gpu *gpu,
                         const char **why) {
  static const char *none = "";
  *why = none;
  memset(gpu, 0, sizeof *gpu);
  if (!uuid || !*uuid) {
    *why = "no GPU UUID for this device";
    return -1;
  }
  pthread_once(&nv_once, nv_load);
  if (!nv_ok) {
    *why = nv_why;
    return -1;
  }
  pthread_mutex_lock(&nv_lock);
  int n = nv_query(uuid, out, max, gpu, why);
  pthread_mutex_unlock(&nv_lock);
  return n;
}

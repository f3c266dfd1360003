/* fake_nvml.c - a test double of NVML, built as libnvidia-ml.so.1 beside the fake driver,
 * for the OOM report's neighbours on a CPU machine.
 *
 * Every GPU UUID starting with "GPU-" is known. Its compute processes come from the
 * environment at each call, so a test sets them after it knows the pids it wants listed:
 *   FAKE_NVML_PROCS="pid:name:bytes,pid:name:bytes,..."   (bytes "-" = not available)
 * FAKE_NVML_FAIL_INIT=1 makes nvmlInit_v2 fail. The processes call exists as _v3 and _v2,
 * both with 24-byte entries, as in a recent driver; vramkit must read _v3 at that stride,
 * or the pids after the first come out wrong (a 32-byte stride read an H200's second
 * process as part of a byte count). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
  unsigned pid;
  unsigned long long usedGpuMemory;
  unsigned gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2;

#define FAKE_DEVICE ((void *)0x6e766d6c)
#define MAX_PROCS 32

static struct {
  unsigned pid;
  unsigned long long used;
  char name[64];
} procs[MAX_PROCS];

/* Parses FAKE_NVML_PROCS; the number of processes. */
static int load_procs(void) {
  const char *env = getenv("FAKE_NVML_PROCS");
  int n = 0;
  char buf[2048];
  snprintf(buf, sizeof buf, "%s", env ? env : "");
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && n < MAX_PROCS;
       tok = strtok_r(NULL, ",", &save)) {
    char *name = strchr(tok, ':');
    char *bytes = name ? strchr(name + 1, ':') : NULL;
    if (!bytes) continue;
    *name++ = 0;
    *bytes++ = 0;
    procs[n].pid = (unsigned)strtoul(tok, NULL, 10);
    procs[n].used = strcmp(bytes, "-") == 0 ? ~0ull : strtoull(bytes, NULL, 10);
    snprintf(procs[n].name, sizeof procs[n].name, "%s", name);
    n++;
  }
  return n;
}

FAKE_EXPORT nvmlReturn_t nvmlInit_v2(void) {
  const char *fail = getenv("FAKE_NVML_FAIL_INIT");
  return fail && strcmp(fail, "1") == 0 ? 12 /* NVML_ERROR_LIBRARY_NOT_FOUND */ : 0;
}
FAKE_EXPORT nvmlReturn_t nvmlShutdown(void) { return 0; }
FAKE_EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
  return r == 7 ? "Insufficient Size (fake NVML)" : "error (fake NVML)";
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **dev) {
  if (!uuid || strncmp(uuid, "GPU-", 4) != 0) return 6; /* NVML_ERROR_NOT_FOUND */
  *dev = FAKE_DEVICE;
  return 0;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(void *dev, nvmlMemory_t *m) {
  if (dev != FAKE_DEVICE) return 2;
  m->total = 8ull << 30;
  m->used = 7ull << 30;
  m->free = m->total - m->used;
  return 0;
}

#define FILL(type)                                                                         \
  int n = load_procs();                                                                    \
  if (*count < (unsigned)n) {                                                              \
    *count = (unsigned)n;                                                                  \
    return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */                                           \
  }                                                                                        \
  type *out = infos;                                                                       \
  for (int i = 0; i < n; i++) {                                                            \
    memset(&out[i], 0, sizeof out[i]);                                                     \
    out[i].pid = procs[i].pid;                                                             \
    out[i].usedGpuMemory = procs[i].used;                                                  \
    out[i].gpuInstanceId = out[i].computeInstanceId = 0xFFFFFFFFu;                         \
  }                                                                                        \
  *count = (unsigned)n;                                                                    \
  return 0;

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *dev, unsigned *count,
                                                                 void *infos) {
  if (dev != FAKE_DEVICE) return 2;
  FILL(nvmlProcessInfo_v2) /* nvmlProcessInfo_t: the v2 fields */
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(void *dev, unsigned *count,
                                                                 void *infos) {
  if (dev != FAKE_DEVICE) return 2;
  FILL(nvmlProcessInfo_v2)
}

FAKE_EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned pid, char *name, unsigned length) {
  int n = load_procs();
  for (int i = 0; i < n; i++)
    if (procs[i].pid == pid) {
      snprintf(name, length, "/opt/bin/%s", procs[i].name);
      return 0;
    }
  return 6;
}

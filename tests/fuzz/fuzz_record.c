/* fuzz_record.c - vram_record_read, the one reader of the records other processes publish,
 * on any file. The input is the file's bytes; when its first byte is odd, the identity
 * fields are made this process's (pid, uid, start time) so that the reader goes past its
 * checks into the device slots, which is where a forged record does its work. The file is
 * then read from a folder of this process's own, as `vramkit top` and the OOM report read. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"
#include "obs/publish.h"
#include "vramkit.h"
#include "vramkit_record.h"

static char folder[256];
static uint64_t self_ticks;

static void setup(void) {
  const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(folder, sizeof folder, "%s/vramkit-fuzz-record-XXXXXX", tmp);
  if (!mkdtemp(folder)) abort();
  self_ticks = _vram_process_start_ticks(getpid());
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!folder[0]) setup();
  if (size == 0) return 0;
  uint8_t *file = malloc(size);
  if (!file) abort();
  memcpy(file, data, size);
  if (data[0] & 1) {
    int32_t pid = (int32_t)getpid();
    uint32_t uid = (uint32_t)geteuid();
#define PUT(field, value)                                                                  \
  if (size >= offsetof(vram_process_record, field) + sizeof(value))                         \
    memcpy(file + offsetof(vram_process_record, field), &(value), sizeof(value));
    PUT(pid, pid)
    PUT(uid, uid)
    PUT(start_ticks, self_ticks)
#undef PUT
  }
  char name[32], path[320];
  snprintf(name, sizeof name, "%d.rec", (int)getpid());
  snprintf(path, sizeof path, "%s/%s", folder, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || write(fd, file, size) != (ssize_t)size) abort();
  close(fd);
  free(file);
  int dir = open(folder, O_RDONLY | O_DIRECTORY);
  vram_process_record record;
  char why[256];
  uint32_t busy = 0;
  vram_record_verdict v = vram_record_read(dir, name, &record, &busy, why, sizeof why);
  if (v == VRAM_RECORD_LIVE &&
      (record.n_devices > VRAM_RECORD_MAX_DEVICES || record.name[sizeof record.name - 1])) {
    fprintf(stderr, "a live record with %u devices or an unterminated name\n", record.n_devices);
    abort();
  }
  if (v == VRAM_RECORD_SKIPPED && !why[0]) {
    fprintf(stderr, "skipped without a reason\n");
    abort();
  }
  close(dir);
  unlink(path);
  return 0;
}

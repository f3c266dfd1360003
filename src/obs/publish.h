/* publish.h - the process's shared-memory record (vramkit_record.h): opening it, a device
 * slot per pool, the seqlock stores of the hot path, and reading the records of other
 * processes for the OOM report's neighbours.
 *
 * One record per process, opened at the first pool that claims a slot; each device slot
 * belongs to the first pool of that device (later pools of the same device publish nothing,
 * since two writers on one slot would break the sequence protocol). Every failure turns
 * publishing off for the process with one line on stderr: an allocation never fails for it.
 */
#ifndef VRAM_OBS_PUBLISH_H
#define VRAM_OBS_PUBLISH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramkit.h"
#include "vramkit_record.h"

/* The slow-path fields of a slot, as the pool knows them at a segment change, an OOM,
 * empty_cache or set_limit. */
typedef struct vram_publish_slow {
  uint64_t allocated, reserved, active, peak_allocated, peak_reserved;
  uint64_t largest_free, largest_of_cached; /* the largest free block and the cache it is
                                              measured in, of one walk */
  uint64_t num_ooms, num_alloc_retries, limit, capacity;
  uint64_t givable, given_back, given_back_count, group_limit;
} vram_publish_slow;

/* The slot of `device` in this process's record, claimed for one pool, or NULL when
 * publishing is off, the device is past VRAM_RECORD_MAX_DEVICES, or another pool holds it.
 * `uuid` may be "" (sim). Thread-safe. */
vram_device_record *_vram_publish_claim(int device, const char *source, const char *uuid);
/* Give a claimed slot back (pool destroy): its figures are zeroed and in_use cleared. */
void _vram_publish_release(vram_device_record *slot);
/* Every field of a slot at once (slow path), with updated_ns. */
void _vram_publish_store_slow(vram_device_record *slot, const vram_publish_slow *v);

/* The hot path, under the pool's lock (one writer per slot): seq odd, plain stores, seq
 * even. The fences are compiler barriers on x86-64 and store barriers on aarch64; no
 * syscall, no branch. */
static inline void _vram_publish_store_hot(vram_device_record *d, uint64_t allocated,
                                           uint64_t reserved, uint64_t active,
                                           uint64_t peak_allocated, uint64_t peak_reserved) {
  uint64_t seq = __atomic_load_n(&d->seq, __ATOMIC_RELAXED);
  __atomic_store_n(&d->seq, seq + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  d->allocated_bytes = allocated;
  d->reserved_bytes = reserved;
  d->active_bytes = active;
  d->cached_free_bytes = reserved - active;
  d->peak_allocated_bytes = peak_allocated;
  d->peak_reserved_bytes = peak_reserved;
  __atomic_store_n(&d->seq, seq + 2, __ATOMIC_RELEASE);
}

/* A consistent copy of device slot `index` of the record open as `fd`, read with pread:
 * two reads in a row, alike byte for byte with an even seq. 0 on success, -1 when no stable
 * copy came after many tries (a writer stopped or killed mid-update leaves seq odd) or the
 * file ended first; *out then holds the last copy read, for what identifies the slot. */
int _vram_record_read_device(int fd, int index, vram_device_record *out);

/* The publish directory: $VRAMKIT_PUBLISH_DIR, else /dev/shm/vramkit-<uid>. -1 and buf ""
 * when it does not fit in cap: never a truncated name, which would be another folder. */
int _vram_publish_dir(char *buf, size_t cap);
/* The folder `dir`, made mode 0700 if missing, opened for openat when it is a directory of
 * this user closed to group and others; else -1, with one line on stderr that starts with
 * `refusal` (what stays off because of it). */
int _vram_private_dir_open(const char *dir, const char *refusal);
/* publish_read.c: the start time of a process (field 22 of its /proc stat), 0 if gone; the
 * record keeps its writer's, readers compare it to tell a live writer from a reused pid. */
uint64_t _vram_process_start_ticks(int pid);
/* publish_read.c: pid runs and is the process that started at start_ticks (not a zombie,
 * not a reused pid): what the shared files' member tables check before trusting an entry. */
bool _vram_process_alive(int pid, uint64_t start_ticks);
/* publish_read.c: a small /proc file read into buf, NUL-terminated; the length read, 0
 * when it cannot be read (the writer's own name and command line, the readers' checks). */
size_t _vram_read_proc(const char *path, char *buf, size_t cap);

/* One record of another live process of this user, for the neighbours. */
typedef struct vram_record_peer {
  int pid;
  char name[VRAM_RECORD_NAME_MAX];
  vram_device_record device; /* the slot that matched, copied consistently */
} vram_record_peer;

/* The live records in the publish directory (not this process's) with an in-use slot on
 * the GPU of `uuid` (none when it is ""). Dead processes' records, foreign, corrupt or torn
 * ones are skipped; dead ones of this user are deleted. Returns how many were written to
 * `out` (at most max). */
int _vram_publish_peers(const char *uuid, vram_record_peer *out, int max);

/* Delete the records of dead processes of this user in the publish directory. Returns how
 * many were removed. */
int _vram_publish_sweep(void);

#endif /* VRAM_OBS_PUBLISH_H */

/* vramkit_record.h - the per-process record every vramkit process publishes in shared
 * memory, the contract between the engine (which writes it) and the readers (`vramkit top`,
 * `vramkit export`, the OOM report's neighbours, any other tool). Public and stable:
 * names, types, sizes and offsets are fixed by version; a change bumps the version.
 * Little-endian, x86-64 / aarch64; C11, no other header of vramkit is needed.
 *
 * Where: $VRAMKIT_PUBLISH_DIR if set, else /dev/shm/vramkit-<uid>/ (created mode 0700,
 * owned by the user); one file per process, "<pid>.rec", mode 0600, created at the first
 * pool of the process, ftruncate'd to sizeof(vram_process_record), mmap'ed MAP_SHARED,
 * unlinked at exit (atexit). VRAMKIT_PUBLISH=0 turns it off; VRAMKIT_PUBLISH=cmdline also
 * stores the command line (off by default: command lines can hold secrets).
 *
 * A reader ignores (and may delete, if it is the same user) a record whose pid is not alive
 * or whose start_ticks differ from /proc/<pid>/stat's field 22 (pid reuse), and ignores
 * with a message any file whose magic, version or size is wrong.
 *
 * Consistency: per device a sequence counter. The writer (under the pool's lock) adds 1
 * (odd: writing), stores the fields with plain stores, adds 1 (even). A reader copies the
 * device's fields between two reads of seq and retries while seq is odd or changed. */
#ifndef VRAMKIT_RECORD_H
#define VRAMKIT_RECORD_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VRAM_RECORD_MAGIC 0x314345524d525655ull /* "UVRMREC1" as bytes, little-endian */
#define VRAM_RECORD_VERSION 3u /* 2: the give-back figures; 3: the cache the largest free
                                  block was measured in */
#define VRAM_RECORD_MAX_DEVICES 16
#define VRAM_RECORD_NAME_MAX 64
#define VRAM_RECORD_CMDLINE_MAX 512

typedef struct vram_device_record {
  uint64_t seq;                 /* even: stable; odd: being written */
  int32_t device;               /* the process's device ordinal (CUDA_VISIBLE_DEVICES applies) */
  int32_t in_use;               /* 1 once this device has a pool */
  char source[16];              /* "cuda", "vmm", "managed", "sim", "sim:vmm" */
  char uuid[48];                /* "GPU-xxxxxxxx-...", from cuDeviceGetUuid; "" on sim */
  uint64_t allocated_bytes;     /* current */
  uint64_t reserved_bytes;
  uint64_t active_bytes;
  uint64_t cached_free_bytes;   /* reserved - active: blocks waiting on a stream are not free */
  uint64_t largest_free_block;  /* as of the last slow-path event (segment change, OOM, empty_cache) */
  uint64_t peak_allocated_bytes;
  uint64_t peak_reserved_bytes;
  uint64_t num_ooms;
  uint64_t num_alloc_retries;
  uint64_t limit_bytes;         /* 0 = none */
  uint64_t capacity_bytes;      /* the device's total memory */
  uint64_t updated_ns;          /* CLOCK_MONOTONIC of the last slow-path update (allocated, reserved,
                                   active and the peaks are stored at every alloc and free) */
  uint64_t givable_bytes;       /* of cached_free, in whole idle segments or granules: what a
                                   neighbour's request could get back (slow path) */
  uint64_t given_back_bytes;    /* given back to neighbours that asked, in all */
  uint64_t given_back_count;    /* times it gave some back */
  uint64_t group_limit_bytes;   /* VRAMKIT_GROUP_LIMIT in force, 0 = none */
  uint64_t largest_of_cached_bytes; /* the cached free bytes largest_free_block was measured
                                   in (slow path): fragmentation is 1 - largest_free_block /
                                   this, the two figures of one moment; cached_free_bytes
                                   moves at every alloc and free, the largest block does not */
} vram_device_record;           /* 216 bytes */

typedef struct vram_process_record {
  uint64_t magic;               /* VRAM_RECORD_MAGIC */
  uint32_t version;             /* VRAM_RECORD_VERSION */
  uint32_t record_size;         /* sizeof(vram_process_record) */
  int32_t pid;
  uint32_t uid;
  uint64_t start_ticks;         /* /proc/self/stat field 22 */
  char name[VRAM_RECORD_NAME_MAX];       /* /proc/self/comm */
  char cmdline[VRAM_RECORD_CMDLINE_MAX]; /* only with VRAMKIT_PUBLISH=cmdline, else "" */
  uint32_t n_devices;           /* highest device with in_use + 1 */
  uint32_t reserved_;
  vram_device_record devices[VRAM_RECORD_MAX_DEVICES];
} vram_process_record;          /* 4,072 bytes */

/* The layout is the contract: a compiler or a field change that moves it fails here. */
#if !defined(__cplusplus)
_Static_assert(sizeof(vram_device_record) == 216, "vram_device_record must be 216 bytes");
_Static_assert(sizeof(vram_process_record) == 4072, "vram_process_record must be 4,072 bytes");
#else
static_assert(sizeof(vram_device_record) == 216, "vram_device_record must be 216 bytes");
static_assert(sizeof(vram_process_record) == 4072, "vram_process_record must be 4,072 bytes");
#endif

#ifdef __cplusplus
}
#endif

#endif /* VRAMKIT_RECORD_H */

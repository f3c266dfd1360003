/* vramkit.h - the public C API of vramkit, a caching GPU memory allocator.
 *
 * This is the only header a user includes. Everything here is C11 and needs no CUDA
 * toolkit: device pointers are plain `void *`, streams are the driver's `CUstream`
 * passed as an opaque `vram_stream_t` (NULL is the legacy default stream).
 *
 * Conventions:
 *  - every call returns a `vram_status`: 0 on success, a negative code on failure;
 *  - the caller owns option structs and fills them with `vram_options_init`;
 *  - a pool is per device and is safe to use from many threads (one lock per pool);
 *  - `vram_pool_destroy` refuses to free under the user: live blocks give VRAM_EBUSY. */
#ifndef VRAMKIT_H
#define VRAMKIT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define VRAM_API
#else
#define VRAM_API __attribute__((visibility("default")))
#endif

#define VRAMKIT_VERSION "0.1.0"

/* ---------------------------------------------------------------------------------------
 * Status codes. One X-macro list generates the enum, vram_strerror and vram_errname.
 * ------------------------------------------------------------------------------------- */
#define VRAM_STATUS_LIST(X)                                                                \
  X(VRAM_OK, 0, "success")                                                                 \
  X(VRAM_ENOMEM, -1, "out of device memory")                                               \
  X(VRAM_EINVAL, -2, "invalid argument")                                                   \
  X(VRAM_EDOUBLEFREE, -3, "pointer was already freed")                                     \
  X(VRAM_EFOREIGN, -4, "pointer was not allocated by this pool")                           \
  X(VRAM_EDEVICE, -6, "invalid device ordinal")                                            \
  X(VRAM_ENODRIVER, -7, "CUDA driver not available")                                       \
  X(VRAM_EDRIVER, -8, "CUDA driver call failed")                                           \
  X(VRAM_EBUSY, -9, "pool still has live allocations")                                     \
  X(VRAM_EENV, -10, "bad VRAMKIT_* environment variable")                                  \
  X(VRAM_ETRACE, -11, "malformed trace line")                                              \
  X(VRAM_EIO, -12, "input/output error")                                                   \
  X(VRAM_EHOSTMEM, -13, "out of host memory for allocator metadata")                       \
  X(VRAM_EUNSUPPORTED, -14, "operation not supported by this memory source")               \
  X(VRAM_EFAULT, -15, "injected fault")                                                    \
  X(VRAM_ESIMCAPACITY, -16, "sim capacity outside what the sim models (1 byte to 256 TiB)") \
  X(VRAM_ELIMIT, -17, "input past a limit set for reading it")

typedef enum vram_status {
#define VRAM_X_ENUM(name, value, text) name = value,
  VRAM_STATUS_LIST(VRAM_X_ENUM)
#undef VRAM_X_ENUM
} vram_status;

/* No call returns -5 any more: a size no device can hold is VRAM_ENOMEM, like any other
 * request the device cannot serve. The name stays so that code written against it builds. */
#define VRAM_ETOOBIG (-5)

/* Human-readable message and symbolic name of a status code ("unknown status" if none). */
VRAM_API const char *vram_strerror(int status);
VRAM_API const char *vram_errname(int status);

/* ---------------------------------------------------------------------------------------
 * Options.
 * ------------------------------------------------------------------------------------- */
typedef void *vram_stream_t; /* a CUstream; NULL is the default stream */

typedef enum vram_source_kind {
  VRAM_SOURCE_AUTO = 0, /* best source available: a GPU source if a driver is found, else sim */
  VRAM_SOURCE_SIM,      /* host-only model of cuMemAlloc's fixed segments ("sim", "sim:cuda") */
  VRAM_SOURCE_SIM_VMM,  /* host-only model of the virtual-memory source ("sim:vmm") */
  VRAM_SOURCE_CUDA,     /* cuMemAlloc / cuMemFree */
  VRAM_SOURCE_VMM,      /* cuMemAddressReserve + cuMemCreate + cuMemMap, grows in place */
  VRAM_SOURCE_MANAGED   /* cuMemAllocManaged with advice and prefetch */
} vram_source_kind;

/* Where a fixed-segment source (cuda, sim) puts large requests (vram_options_t.large_blocks). */
typedef enum vram_large_blocks {
  VRAM_LARGE_FIXED = 0, /* segments of their own size, virtual only past virtual_threshold */
  VRAM_LARGE_VIRTUAL    /* virtual ranges from the first one, as on the vmm source (default) */
} vram_large_blocks;

/* Parse "sim", "sim:cuda", "sim:vmm", "cuda", "vmm", "managed", "auto". */
VRAM_API int vram_source_parse(const char *text, vram_source_kind *out);
VRAM_API const char *vram_source_name(vram_source_kind kind);
/* The names vram_source_parse accepts, from index 0 until NULL. */
VRAM_API const char *vram_source_spelling(size_t index);

typedef struct vram_options {
  int device;                   /* device ordinal (default 0) */
  vram_source_kind source;      /* where physical memory comes from */
  /* Modes. Sizes are bytes; a fraction in (0, 1] is of the device's total memory and is
   * used when the byte value is 0. */
  size_t preallocate_bytes;     /* reserve this much up front (TensorFlow's default mode) */
  double preallocate_fraction;
  size_t limit_bytes;           /* hard limit on reserved memory; 0 = none */
  double limit_fraction;
  size_t release_threshold;     /* cached free memory kept when releasing; SIZE_MAX = keep all */
  /* Tight placement, for fixed large segments (managed; cuda and sim with large_blocks
   * VRAM_LARGE_FIXED). Once reserved memory would pass this share of the cap (the limit,
   * else the device's total memory), a large request is not carved from a fully free
   * cached segment bigger than the segment it would get of its own: it gets its own, and
   * cached segments go back first if that would raise the peak. Fewer bytes for more
   * driver calls, like PyTorch's max_split_size_mb. In [0, 1]; 0 = always, 1 = never
   * (default). */
  double tight_threshold;
  /* Virtual growth, for fixed segments whose source can also map virtual memory (cuda, sim).
   * Once reserved memory would pass this share of the cap (the limit, else the device's
   * total memory), an arena's large requests are carved from a reserved virtual range whose
   * granules are mapped where live blocks are, as on the vmm source; its fixed large
   * segments stop taking new blocks, drain, and go back when the range needs their memory.
   * Far from the cap a pool runs on fixed segments alone; near it, it fits as tightly as vmm.
   * In [0, 1]; 0 = from the first large request, 1 = never (with large_blocks fixed: fixed
   * segments only, every block shareable by CUDA IPC). Default 0.5.
   * On the vmm sources with no limit, the share of the device's memory up to which runs are
   * mapped in pieces of up to 128 MiB and kept; past it, or under any limit, every 2 MiB
   * granule is its own mapping and moves to where live blocks are (0: always). */
  double virtual_threshold;
  /* Large requests of a fixed-segment source whose source can also map virtual memory
   * (cuda, sim). VRAM_LARGE_VIRTUAL (default): virtual ranges from the first large request,
   * mapped as on the vmm source (pieces of up to 128 MiB kept while no limit is set and
   * reserved memory is within virtual_threshold of the device, 2 MiB granules that move
   * to where live blocks are past it or under a limit); small requests keep their fixed
   * 2 MiB segments, shareable by CUDA IPC, and blocks on virtual ranges are not.
   * VRAM_LARGE_FIXED: fixed segments of their own size, virtual growth only past
   * virtual_threshold (every large block shareable by CUDA IPC until then). */
  vram_large_blocks large_blocks;
  /* Capacity of the sim device (default VRAM_SIM_DEFAULT_CAPACITY, 80 GiB): from 1 byte to
   * VRAM_SIM_MAX_CAPACITY (2^48 bytes, 256 TiB, the most any device addresses). Outside
   * that range, 0 included, vram_pool_create on a sim source fails with VRAM_ESIMCAPACITY
   * and makes no pool. A capacity below one 2 MiB segment is accepted, but no request fits
   * it. */
  size_t sim_capacity;
  int sim_event_delay;          /* sim: queries before a recorded event completes (default 0) */
  /* Fault injection (tests): the source call numbered fail_at (1-based) fails, and every
   * fail_every-th call after it fails too when fail_every > 0. 0 disables. */
  uint64_t fault_fail_at;
  uint64_t fault_fail_every;
  int managed_prefetch;         /* managed: prefetch new ranges to the device (default 1) */
  /* Keep the statistics of small and large segments apart as blocks come and go, for
   * vram_get_split_stats (PyTorch's small_pool and large_pool rows). It costs every malloc
   * and free a few counter updates, as PyTorch's allocator pays for its own rows, so it is
   * off unless asked for: default vram_set_split_stats_default()'s setting, itself 0 until
   * set (the Python package sets it, since its statistics speak PyTorch's vocabulary). */
  int split_stats;
  /* Give-back (issue 39): the pool joins the group of the vramkit processes of its user on
   * its device (a GPU, or a sim that VRAMKIT_SIM_SHARED shares), whose members ask each
   * other for idle cached memory before they fail. vram_options_from_env fills these from
   * VRAMKIT_GIVE_BACK, VRAMKIT_GIVE_BACK_TIMEOUT, VRAMKIT_GROUP_LIMIT and VRAMKIT_SOFT_LIMIT;
   * a pool reads no environment for them itself. Out of range (a timeout past 10000 ms, a
   * fraction outside [0, 1]), vram_pool_create fails with VRAM_EINVAL and makes no pool. */
  int give_back;                 /* answer the neighbours' requests (default 1); 0: never,
                                    and counted on by nobody (the pool still asks) */
  unsigned give_back_timeout_ms; /* a pool about to fail waits this long for answers, 0 to
                                    10000 (default 250) */
  size_t group_limit_bytes;      /* what the group's members reserve together; 0 = none */
  double group_limit_fraction;
  size_t soft_limit_bytes;       /* asked while holding more, the pool gives back all its
                                    idle memory, else only what was asked; 0 = none */
  double soft_limit_fraction;
  /* Never split a segment (PyTorch's MemPool(no_split=True)): each request gets a segment
   * of its own, 2 MiB for a request up to 1 MiB, else its size rounded to the source's
   * unit, and the block is the whole segment (allocated_bytes counts all of it). A freed
   * block is cached whole and taken back, whole, by a later request of its kind (small or
   * large) that it fits, the smallest such first; vram_empty_cache gives it back. Such a
   * pool holds fixed segments only: large_blocks and virtual_threshold do not apply. With
   * preallocation, vram_pool_create fails with VRAM_EINVAL; on a virtual-memory source (vmm,
   * sim:vmm), with VRAM_EUNSUPPORTED. Default 0. */
  int no_split;
} vram_options_t;

#define VRAM_SIM_MAX_CAPACITY ((size_t)1 << 48)
#define VRAM_SIM_DEFAULT_CAPACITY ((size_t)80 << 30) /* an 80 GiB card, as an H100 */

/* Fill defaults: device 0, AUTO source, grow on demand, no limit, keep all cache. */
VRAM_API void vram_options_init(vram_options_t *opts);

/* Overlay the VRAMKIT_* environment variables on opts: VRAMKIT_SOURCE, VRAMKIT_LIMIT,
 * VRAMKIT_PREALLOCATE, VRAMKIT_RELEASE_THRESHOLD, VRAMKIT_TIGHT_THRESHOLD,
 * VRAMKIT_VIRTUAL_THRESHOLD, VRAMKIT_LARGE_BLOCKS (fixed or virtual), VRAMKIT_SIM_CAPACITY,
 * VRAMKIT_GIVE_BACK (a switch), VRAMKIT_GIVE_BACK_TIMEOUT (milliseconds), VRAMKIT_NO_SPLIT
 * (a switch), VRAMKIT_GROUP_LIMIT, VRAMKIT_SOFT_LIMIT (sizes as vram_parse_size reads them;
 * LIMIT, PREALLOCATE and the two give-back limits also take a percentage such as "50%"; 0
 * is refused for the limits, since it would read as "no limit": leave them unset for none;
 * the two thresholds are fractions such as 0.9 or percentages such as 90%), checks
 * VRAMKIT_SIM_SHARED (a name), and checks VRAMKIT_LEAK_REPORT (a switch: 0/1, off/on,
 * false/true, no/yes). A bad value returns
 * VRAM_EENV and leaves opts unchanged; *why (if non-NULL) then points to a message that names
 * the variable and quotes the value ("VRAMKIT_LIMIT: '-1G' is not a limit: ..."), kept per
 * thread until that thread's next refusal. The first call in a process warns on stderr about
 * each VRAMKIT_* name that vramkit does not read, naming the nearest one it does. */
VRAM_API int vram_options_from_env(vram_options_t *opts, const char **why);
/* That warning alone, for a tool that reads the variables but makes no pool: once per
 * process, whichever of the two comes first. */
VRAM_API void vram_options_warn_unknown(void);

/* Set one option by its variable's name ("VRAMKIT_LIMIT", ...) from text, as the
 * environment would: VRAM_EENV with *why on a bad value, VRAM_EINVAL for a name that is not
 * a pool option; opts is unchanged on failure. */
VRAM_API int vram_options_set(vram_options_t *opts, const char *name, const char *value,
                              const char **why);

/* The VRAMKIT_* variables vramkit reads, C, tools and Python alike: the name of entry
 * `index` (from 0), NULL past the last. *help (if non-NULL) says what it takes;
 * *pool_option (if non-NULL) is 1 for the pool options vram_options_set knows. */
VRAM_API const char *vram_env_variable(size_t index, const char **help, int *pool_option);

/* Parse a size. The one grammar of every size vramkit reads (options, variables, the
 * command line, Python):
 *
 *   size     := number [unit]          no spaces, signs, exponents or hexadecimal
 *   number   := digits ["." digits]    decimal, a digit on both sides of the point
 *   unit     := B | (K | M | G | T) [B | iB]     any case; K = 1024, M = 1024^2, ... T = 1024^4
 *   percent  := number "%"             only with allow_percent; more than 0, at most 100
 *
 * Without a unit (or with B) the number counts bytes and must be whole ("1.5" is refused);
 * with K/M/G/T a decimal is rounded up to a whole byte ("0.1G" is 107374183). More than
 * 2^64 - 1 bytes is refused. Examples: "512", "64K", "1.5G", "2MiB", "8GB", "30%".
 * Returns VRAM_EINVAL on anything else (vram_parse_size_error says why). With
 * allow_percent (fraction non-NULL), "30%" yields *fraction = 0.30 and *bytes = 0. */
VRAM_API int vram_parse_size(const char *text, int allow_percent, size_t *bytes,
                             double *fraction);
/* Why vram_parse_size refuses text: a short static phrase ("a size cannot be negative",
 * "spaces are not allowed"), or NULL when it accepts it. */
VRAM_API const char *vram_parse_size_error(const char *text, int allow_percent);

/* ---------------------------------------------------------------------------------------
 * Pools.
 * ------------------------------------------------------------------------------------- */
typedef struct vram_pool vram_pool_t;

VRAM_API int vram_pool_create(vram_pool_t **out, const vram_options_t *opts);

/* Memory from the caller's functions (RMM's callback_memory_resource, PyTorch's MemPool
 * with an allocator of its own): a pool made with vram_pool_create_with_callbacks takes
 * every segment from alloc and gives it back through free, and keeps its statistics,
 * history, limit and OOM report as any pool does. Its source (opts->source, AUTO resolved
 * as usual) still gives the events that order streams, the device's free and total memory
 * and its identity; no segment is taken from it. Such a pool holds fixed segments only.
 *
 * alloc: `size` bytes (a multiple of granularity) for use on `stream` of `device`; return 0
 * with *ptr set (512-byte aligned at least), anything else for a failure, which the pool
 * treats as the device being out of memory (the OOM ladder, then VRAM_ENOMEM with a
 * report; nothing leaks and the pool stays valid). A pointer that is NULL or not 512-byte
 * aligned is given back through free at once and the call fails with VRAM_EDRIVER.
 * free: a segment alloc gave, with its size, after the work queued on its stream is done.
 * Both are called with the pool's lock held: they must not call into the pool. */
typedef struct vram_source_callbacks {
  int (*alloc)(void *ctx, size_t size, int device, vram_stream_t stream, void **ptr);
  void (*free)(void *ctx, void *ptr, size_t size, int device, vram_stream_t stream);
  void *ctx;
  size_t granularity; /* segment sizes are multiples of it: a power of two, 0 = 2 MiB */
} vram_source_callbacks_t;

/* vram_pool_create on memory from callbacks: VRAM_EINVAL when callbacks, alloc or free is
 * NULL or the granularity is not a power of two. */
VRAM_API int vram_pool_create_with_callbacks(vram_pool_t **out, const vram_options_t *opts,
                                             const vram_source_callbacks_t *callbacks);
/* VRAM_EBUSY (and nothing freed) while blocks are live; vram_pool_destroy_force frees all. */
VRAM_API int vram_pool_destroy(vram_pool_t *pool);
VRAM_API int vram_pool_destroy_force(vram_pool_t *pool);

/* The process-wide pool of a device, created on first use from VRAMKIT_* variables. */
VRAM_API int vram_default_pool(int device, vram_pool_t **out);
/* Create the process-wide pool of opts->device now, with these options rather than the
 * environment's (what vramkit.configure() does). VRAM_EBUSY if it exists already. */
VRAM_API int vram_default_pool_create(const vram_options_t *opts, vram_pool_t **out);

/* Allocate `size` bytes usable on `stream`. Blocks are 512-byte aligned. Size 0 succeeds
 * with *out = NULL (as PyTorch does); vram_free(pool, NULL) is a no-op. On VRAM_ENOMEM the
 * pool's last OOM report (vram_oom_report) explains why. A size larger than the device
 * could ever hold (its capacity; for the managed source, 2^48 bytes) is VRAM_ENOMEM at
 * once, counted in num_ooms, and gives back no cached memory. */
VRAM_API int vram_malloc(vram_pool_t *pool, size_t size, vram_stream_t stream, void **out);
/* Free a block from this pool; no size needed. Work queued on the block's stream before the
 * free may still be running: the block is reused at once, but only by requests on that same
 * stream. Its memory serves another stream only after it has gone back to the source,
 * which first waits for the stream. A block marked with vram_record_stream waits, before
 * any reuse, for events recorded at free time on the other streams. A pointer into free
 * memory of the pool (a stale pointer, even one whose block has since merged with its
 * neighbours) is VRAM_EDOUBLEFREE; any other pointer the pool did not hand out, an
 * interior pointer of a live block included, is VRAM_EFOREIGN. */
VRAM_API int vram_free(vram_pool_t *pool, void *ptr);
/* Mark that `ptr` is used on `stream` too: its free then waits for that stream's work. */
VRAM_API int vram_record_stream(vram_pool_t *pool, void *ptr, vram_stream_t stream);
/* Size the block was asked for, and the stream it belongs to. */
VRAM_API int vram_block_info(vram_pool_t *pool, void *ptr, size_t *requested,
                             vram_stream_t *stream);
/* The segment holding the live block at `ptr`: its first address and size (for virtual
 * memory, the reserved range). VRAM_EFOREIGN when `ptr` is not a live block of this pool,
 * found by the pointer alone: a caller may ask several pools which one owns a pointer.
 * Either out pointer may be NULL. */
VRAM_API int vram_segment_of(vram_pool_t *pool, void *ptr, void **base, size_t *size);
/* Allocate the block of `size` bytes (rounded up to 512) that starts exactly at `ptr`, from
 * free memory this pool holds for `stream`; nothing is taken from the source. For callers
 * that put a pool back into a layout it had (PyTorch's CUDA graph trees restore a graph
 * pool to a checkpoint). VRAM_EBUSY if any byte of the range is in use, VRAM_EFOREIGN if
 * the pool holds no memory there for that stream, VRAM_EINVAL for a pointer not 512-byte
 * aligned or size 0; on failure nothing changes. Free the block with vram_free. In a
 * no_split pool the block is the whole free segment that starts at `ptr`; a `ptr` inside a
 * segment is VRAM_EINVAL. */
VRAM_API int vram_malloc_at(vram_pool_t *pool, void *ptr, size_t size, vram_stream_t stream);
/* Return every fully free cached segment to the driver. */
VRAM_API int vram_empty_cache(vram_pool_t *pool);
/* Change the hard limit (0 = none); a fraction in (0,1] of total memory if bytes == 0. */
VRAM_API int vram_set_limit(vram_pool_t *pool, size_t bytes, double fraction);
/* Managed source: move the pages of the first `size` bytes of the live block that starts
 * at `ptr` (size at most the block's) to the device (to_device != 0) or to the host,
 * ordered on `stream`. VRAM_EUNSUPPORTED on other sources. Asynchronous, like
 * cudaMemPrefetchAsync. */
VRAM_API int vram_prefetch(vram_pool_t *pool, void *ptr, size_t size, int to_device,
                           vram_stream_t stream);
/* Virtual-memory sources: let device `peer_device` access this pool's memory (what is
 * mapped now and what is mapped later). VRAM_EUNSUPPORTED on other sources. */
VRAM_API int vram_enable_peer_access(vram_pool_t *pool, int peer_device);
VRAM_API int vram_pool_device(const vram_pool_t *pool);
VRAM_API vram_source_kind vram_pool_source(const vram_pool_t *pool);

/* ---------------------------------------------------------------------------------------
 * Statistics. One X-macro list generates the struct, reset, the table and the JSON.
 * Each "stat" has current, peak and total (total = sum of all increases).
 * ------------------------------------------------------------------------------------- */
#define VRAM_STAT_LIST(X)                                                                  \
  X(allocated_bytes, "bytes handed out to callers (rounded block sizes)")                  \
  X(requested_bytes, "bytes callers asked for")                                            \
  X(reserved_bytes, "bytes held from the driver")                                          \
  X(active_bytes, "bytes allocated or waiting on a stream event")                          \
  X(allocation, "live blocks")                                                             \
  X(segment, "segments held from the driver")                                              \
  X(active, "blocks allocated or waiting on a stream event")

#define VRAM_COUNTER_LIST(X)                                                               \
  X(num_alloc_retries, "allocations that released cache and retried")                      \
  X(num_ooms, "allocations that failed with out of memory")                                \
  X(num_device_alloc, "source allocations (cuMemAlloc / map calls)")                       \
  X(num_device_free, "source releases (cuMemFree / unmap calls)")                          \
  X(num_sync_waits, "times the pool waited for a stream event")                            \
  X(num_mallocs, "vram_malloc calls that succeeded")                                       \
  X(num_frees, "vram_free calls that succeeded")                                           \
  X(num_stream_borrows, "allocations served from another stream's free memory")            \
  X(giveback_requests, "times this pool asked its neighbours to give cached memory back")  \
  X(giveback_received_bytes, "bytes neighbours gave back when this pool asked")            \
  X(giveback_wait_us, "microseconds this pool waited for its neighbours' answers")         \
  X(giveback_given_bytes, "bytes this pool gave back when a neighbour asked")              \
  X(giveback_given_count, "times this pool gave memory back to a neighbour")

typedef struct vram_stat {
  int64_t current, peak, total;
} vram_stat_t;

typedef struct vram_stats {
#define VRAM_X_STAT(name, doc) vram_stat_t name;
  VRAM_STAT_LIST(VRAM_X_STAT)
#undef VRAM_X_STAT
#define VRAM_X_COUNTER(name, doc) uint64_t name;
  VRAM_COUNTER_LIST(VRAM_X_COUNTER)
#undef VRAM_X_COUNTER
  size_t largest_free_block; /* largest block a request could get without growing; on
                              * virtual segments all their cached memory (granules move),
                              * which an OOM's figures (vram_oom_info) narrow to what the
                              * free blocks and the granules that may move really serve */
  double fragmentation;      /* 1 - largest_free_block / cached free bytes; 0 if none free */
  size_t limit_bytes;        /* hard limit in force, 0 = none */
} vram_stats_t;

VRAM_API int vram_get_stats(vram_pool_t *pool, vram_stats_t *out);
VRAM_API int vram_reset_peak_stats(vram_pool_t *pool);
/* The statistics split as PyTorch splits its caching allocator's pools: `small` is the
 * memory of small segments (2 MiB, carved for requests up to 1 MiB: PyTorch's small_pool),
 * `large` the rest (its large_pool); each field of vram_stats_t's stats is the sum of the
 * two. inactive_split counts the free blocks of segments that hold an allocated or
 * pending block (memory empty_cache cannot give back, PyTorch's "non-releasable"), and
 * inactive_split_bytes their bytes: both are read from the layout at the call, so their
 * current is exact while peak equals current and total is 0 (not tracked over time).
 * A pool in preallocate mode carves small requests from its large segments, so its small
 * figures stay 0. num_sync_all_streams counts the times the pool waited for every pending
 * free (the out-of-memory ladder, empty_cache, teardown). */
typedef struct vram_kind_stats {
#define VRAM_X_STAT(name, doc) vram_stat_t name;
  VRAM_STAT_LIST(VRAM_X_STAT)
#undef VRAM_X_STAT
  vram_stat_t inactive_split, inactive_split_bytes;
} vram_kind_stats_t;

typedef struct vram_split_stats {
  vram_kind_stats_t small, large;
  uint64_t num_sync_all_streams;
} vram_split_stats_t;

/* VRAM_EUNSUPPORTED for a pool made without vram_options_t.split_stats. */
VRAM_API int vram_get_split_stats(vram_pool_t *pool, vram_split_stats_t *out);
/* The split_stats that vram_options_init gives from now on, in this process (0 or 1). */
VRAM_API void vram_set_split_stats_default(int on);
/* Free and total memory of the device as the source sees it (sim: its capacity). */
VRAM_API int vram_mem_get_info(vram_pool_t *pool, size_t *free_bytes, size_t *total_bytes);
/* A text table in the spirit of torch.cuda.memory_summary(). Writes at most cap bytes
 * (NUL-terminated) and returns the length the full text needs, or a negative status. */
VRAM_API int vram_summary(vram_pool_t *pool, char *buf, size_t cap);
/* The same statistics as one JSON object. */
VRAM_API int vram_stats_json(vram_pool_t *pool, char *buf, size_t cap);
/* The report of the last OOM of this pool ("" if none), as vram_summary writes. */
VRAM_API int vram_oom_report(vram_pool_t *pool, char *buf, size_t cap);
/* Why a request ran out of memory: the engine's one classification (src/obs/stats.c says
 * the rules and their order), which the report's "cause:" line names. */
typedef enum vram_oom_cause {
  VRAM_OOM_PREALLOCATE,   /* the pool's up-front reservation (VRAMKIT_PREALLOCATE) */
  VRAM_OOM_FRAGMENTATION, /* the room is there, not in one piece */
  VRAM_OOM_GRANULARITY,   /* the room is there, not in whole segments */
  VRAM_OOM_LIMIT,         /* a limit refused it while the device had room */
  VRAM_OOM_LIVE,          /* live memory plus the request is more than the cap */
  VRAM_OOM_OTHERS,        /* other processes hold what is missing */
  VRAM_OOM_GROUP_LIMIT    /* every vramkit process on the device together would pass the
                             group limit (VRAMKIT_GROUP_LIMIT) */
} vram_oom_cause;
#define VRAM_OOM_CAUSE_COUNT 7
/* "preallocate", "fragmentation", ...; NULL for a value out of range. */
VRAM_API const char *vram_oom_cause_name(int cause);

/* Another process on the GPU at the OOM (NVML, and the records vramkit processes publish). */
#define VRAM_OOM_MAX_NEIGHBOURS 8
#define VRAM_OOM_UNKNOWN UINT64_MAX /* a figure nobody could give */
typedef struct vram_oom_neighbour {
  int pid;
  int is_vramkit;       /* it publishes a record: the three figures below are its own */
  char name[64];
  uint64_t used_bytes;  /* NVML's figure, or VRAM_OOM_UNKNOWN */
  uint64_t reserved_bytes, allocated_bytes, cached_free_bytes;
} vram_oom_neighbour_t;

/* The figures of an OOM, as the pool saw them, and the cause chosen from them: what the
 * report's text is written from, for programs that would otherwise parse it. */
typedef struct vram_oom_info {
  int cause;                   /* a vram_oom_cause */
  int device;
  vram_source_kind source;
  int preallocate;             /* the pool's creation failed, not a request */
  uint64_t requested;          /* bytes asked */
  uint64_t max_request;        /* nonzero: the most any request may be here (the request
                                * was more than the device could ever hold) */
  uint64_t capacity;           /* the device's capacity */
  uint64_t device_free;        /* free on the device, as the source says */
  uint64_t limit;              /* 0: none */
  uint64_t reserved, allocated, cached_free, largest_free_block;
  uint64_t granularity;        /* the smallest segment or mapping the pool takes */
  uint64_t may_reserve;        /* what the pool could still take: device free, under the limit */
  uint64_t raise_limit_by;     /* cause limit: what raising the limit needs; else 0 */
  uint64_t others_used;        /* the device less ours and free: other processes' */
  uint64_t shortfall;          /* cause live: how much live memory must shrink; else 0 */
  double fragmentation;        /* vram_stats_t.fragmentation */
  int neighbours_total;        /* other processes found, listed or not */
  int neighbours_count;        /* entries in neighbours */
  vram_oom_neighbour_t neighbours[VRAM_OOM_MAX_NEIGHBOURS];
  uint64_t group_limit;        /* VRAMKIT_GROUP_LIMIT in bytes; 0: none */
  uint64_t group_reserved;     /* what every vramkit process on the device reserves together
                                * (this pool included); 0 outside a give-back group */
  uint64_t preallocated;       /* bytes the pool holds for good since its creation
                                * (VRAMKIT_PREALLOCATE): one region, placed as asked; 0: none */
} vram_oom_info_t;

/* The figures of this pool's last OOM: VRAM_EINVAL (and *info zeroed) if it had none. */
VRAM_API int vram_oom_info(vram_pool_t *pool, vram_oom_info_t *info);
/* As vram_pool_create_report, the figures of this thread's last failed pool creation. */
VRAM_API int vram_pool_create_oom_info(vram_oom_info_t *info);
/* Choose info->cause (and raise_limit_by, others_used, shortfall) from the figures in it:
 * requested, max_request, preallocate, capacity, device_free, limit, reserved, allocated,
 * cached_free, granularity (0: 1). The engine's own rules, for figures read elsewhere (a
 * snapshot's). */
VRAM_API void vram_oom_classify(vram_oom_info_t *info);

/* Why this thread's last pool creation (or default pool's) failed: the OOM report of a
 * preallocation that did not fit (VRAM_ENOMEM, as vram_oom_report writes it), or the reason
 * its options were refused together (VRAM_EINVAL, VRAM_EUNSUPPORTED); "" otherwise. */
VRAM_API int vram_pool_create_report(char *buf, size_t cap);

/* Called (outside the pool lock) whenever a call on this pool fails, with the status and
 * a message (for OOM, the full report). */
typedef void (*vram_error_fn)(void *user, vram_pool_t *pool, int status, const char *message);
VRAM_API int vram_set_error_callback(vram_pool_t *pool, vram_error_fn fn, void *user);

/* Walk the live blocks (leak finding): fn is called under the pool lock for each; it must
 * not call back into the pool. */
typedef void (*vram_block_fn)(void *user, void *ptr, size_t requested, size_t size,
                              vram_stream_t stream);
VRAM_API int vram_for_each_block(vram_pool_t *pool, vram_block_fn fn, void *user);

/* ---------------------------------------------------------------------------------------
 * Memory history and snapshots: an event stream recorded per pool, contexts attached to
 * allocations, and the layout of every segment with the blocks that tile it.
 * ------------------------------------------------------------------------------------- */
typedef enum vram_event_kind {
  VRAM_EVENT_ALLOC = 1,         /* a block handed out: addr, size (block bytes), requested */
  VRAM_EVENT_FREE_REQUESTED,    /* vram_free called on it */
  VRAM_EVENT_FREE_COMPLETED,    /* reusable now (at once for a same-stream free; later, when
                                   its events complete, for a cross-stream one) */
  VRAM_EVENT_SEGMENT_ALLOC,     /* memory taken from the source: addr, size */
  VRAM_EVENT_SEGMENT_FREE,      /* memory returned to the source */
  VRAM_EVENT_SEGMENT_MAP,       /* vmm: physical granules mapped at addr, size bytes */
  VRAM_EVENT_SEGMENT_UNMAP,     /* vmm: granules unmapped */
  VRAM_EVENT_OOM,               /* a request failed: size/requested as asked, addr = the
                                   device's free bytes at that moment */
  VRAM_EVENT_EMPTY_CACHE,       /* vram_empty_cache ran */
  VRAM_EVENT_SNAPSHOT,          /* vram_snapshot was taken */
  VRAM_EVENT_ANNOTATE,          /* vram_history_annotate: context names the annotation */
  VRAM_EVENT_GIVE_BACK          /* a neighbour asked and the pool gave idle memory back:
                                   addr = the asking process's pid, size = bytes given,
                                   requested = bytes asked */
} vram_event_kind;

typedef struct vram_event {
  uint64_t time_us;    /* CLOCK_MONOTONIC, microseconds */
  uint64_t addr;
  uint64_t size;
  uint64_t requested;
  uint64_t stream;     /* the vram_stream_t as an integer; 0 = default stream */
  uint64_t context;    /* the caller's context id of the allocation (0 = none) */
  int32_t device;
  int32_t kind;        /* vram_event_kind */
} vram_event_t;

/* Flags of vram_history_start. */
#define VRAM_HISTORY_CONTEXTS 1u  /* call the context function at each allocation */
/* Call it at each free too: a free's event carries the free's own context, not the
 * allocation's (PyTorch's context="all", whose frees name where they were freed). */
#define VRAM_HISTORY_FREE_CONTEXTS 2u
/* A pool that records already, into a ring of the size asked, keeps the ring and what it
 * holds (and the contexts of its live blocks): only the flags change, as a second
 * torch.cuda.memory._record_memory_history() call changes what is recorded from then on. */
#define VRAM_HISTORY_KEEP 4u

/* The ring kept where a caller asks for every event (PyTorch's default max_entries,
 * sys.maxsize, for a trace that grows as it goes): the newest this many. A ring is reserved
 * whole at the start (its pages touched only as it fills), so none is unbounded. */
#define VRAM_HISTORY_EVERY_EVENT ((size_t)1 << 22)

/* Start recording this pool's events into a ring of max_entries (0 = 100,000; the oldest
 * entries are overwritten, and counted). Starting again clears the ring, unless
 * VRAM_HISTORY_KEEP finds it recording into a ring of that size. */
VRAM_API int vram_history_start(vram_pool_t *pool, size_t max_entries, unsigned flags);
VRAM_API int vram_history_stop(vram_pool_t *pool);
/* Copy up to cap recorded events, oldest first. *count = how many were copied;
 * *total = how many are held (call again with a larger buffer if > cap); *dropped = how
 * many were overwritten since the start. Any of the out pointers may be NULL except out
 * when cap > 0. Works while recording or after stop (until the next start). */
VRAM_API int vram_history_read(vram_pool_t *pool, vram_event_t *out, size_t cap,
                               size_t *count, size_t *total, uint64_t *dropped);
/* Record an ANNOTATE event carrying `context` (a user's mark or label id). */
VRAM_API int vram_history_annotate(vram_pool_t *pool, uint64_t context);

/* The function the pools call, outside their locks, at each allocation while a pool
 * records with VRAM_HISTORY_CONTEXTS, to get the allocation's context id (the Python layer
 * returns an id for the captured Python stack; 0 = none). Process-wide; NULL removes it. */
typedef uint64_t (*vram_context_fn)(void *user);
VRAM_API void vram_set_context_fn(vram_context_fn fn, void *user);

/* Snapshot: every segment of the pool with the blocks that tile it, in address order. */
enum vram_snapshot_block_state {
  VRAM_SNAPSHOT_INACTIVE = 0,         /* free (or parked in a cache): PyTorch's "inactive" */
  VRAM_SNAPSHOT_ACTIVE_ALLOCATED = 1, /* live */
  VRAM_SNAPSHOT_ACTIVE_PENDING_FREE = 2 /* freed, waiting on other streams */
};
typedef struct vram_snapshot_block {
  uint64_t addr, size, requested, context; /* requested and context 0 when inactive */
  int32_t state;                           /* enum vram_snapshot_block_state */
  int32_t reserved_;
} vram_snapshot_block_t;
typedef struct vram_snapshot_segment {
  uint64_t addr, size, stream;
  uint64_t first_block, n_blocks;  /* its blocks: blocks[first_block .. +n_blocks) */
  int32_t device, is_expandable;   /* is_expandable: a vmm range (mapped part only) */
  uint64_t context;                /* the history context of the call that made it, or 0 */
} vram_snapshot_segment_t;
/* Fill as many segments and blocks as fit. *n_segments and *n_blocks get the totals; when
 * either is above its cap nothing partial is returned: call again with larger arrays
 * (VRAM_ENOMEM is not used for this: the call returns VRAM_OK with the totals). */
VRAM_API int vram_snapshot(vram_pool_t *pool, vram_snapshot_segment_t *segments,
                           size_t segment_cap, size_t *n_segments,
                           vram_snapshot_block_t *blocks, size_t block_cap, size_t *n_blocks);

/* ---------------------------------------------------------------------------------------
 * Reading the records vramkit processes publish (their layout: vramkit_record.h). The OOM
 * report's neighbours, `vramkit top`, `vramkit export` and the Python package read through
 * these two calls, so that each believes and refuses the same files.
 * ------------------------------------------------------------------------------------- */
typedef enum vram_record_verdict {
  VRAM_RECORD_LIVE = 0,    /* a record of a live process of this user: *out is filled */
  VRAM_RECORD_EXITED = 1,  /* its process has exited, or its pid now names another one: the
                              file is this user's to delete */
  VRAM_RECORD_SKIPPED = 2, /* not a record to believe (foreign, corrupt, a link...): `why` */
  VRAM_RECORD_GONE = 3     /* removed before it could be read (its process exited) */
} vram_record_verdict;

struct vram_process_record;

/* Foreign text (a process name, a file name) made safe to print, as every report of the
 * engine shows it: the `len` bytes of `src` into dst, where control characters (C0 with
 * NUL, DEL and C1), a backslash, bytes that are not valid UTF-8 and the invisible
 * characters that steer what a reader sees (zero-width, line and paragraph separators,
 * bidirectional controls) become \xNN, byte by byte; other UTF-8 passes. The result is
 * NUL-terminated and cut only between whole characters or escapes: 4 * len + 1 bytes
 * always hold it. Returns the length written. */
VRAM_API size_t vram_escape_text(char *dst, size_t cap, const char *src, size_t len);

/* The folder records go to and are read from: $VRAMKIT_PUBLISH_DIR when set and not empty,
 * else /dev/shm/vramkit-<euid>. 0, or -1 with `buf` empty when the name does not fit in
 * `cap` bytes (cut short it would name another folder). */
VRAM_API int vram_records_dir(char *buf, size_t cap);

/* Opens the folder of records for reading: `dir`, or NULL for $VRAMKIT_PUBLISH_DIR, else
 * /dev/shm/vramkit-<uid>. A symbolic link, a folder of another user and one open to group or
 * others are refused. Returns a descriptor to close, or -1 with errno set (ENOENT: no
 * process has published yet) and the reason in `why`. */
VRAM_API int vram_records_open(const char *dir, char *why, size_t why_cap);

/* Reads the entry `name` ("<pid>.rec") of an open folder into *out, with pread: a file that
 * changes or shrinks meanwhile is read as it is or refused, never trusted. A live record
 * must be a regular file of this user, of this version and size, whose process runs now
 * with the start time and uid it claims. Each device slot in use is a consistent copy; a
 * slot that was being written on every try has its bit set in *busy (may be NULL) and its
 * figures zeroed. Text fields are NUL-terminated and foreign: escape them to show them. */
VRAM_API vram_record_verdict vram_record_read(int dir_fd, const char *name,
                                              struct vram_process_record *out, uint32_t *busy,
                                              char *why, size_t why_cap);

/* ---------------------------------------------------------------------------------------
 * Allocation traces (format v1), the files `vramkit replay` and `vramkit plot` read: gzip
 * (or plain) text; a first line "# vramkit-trace v1", optionally followed by blanks and
 * words describing the recording; then one line per event, "a ID SIZE STREAM T_US"
 * (allocate SIZE bytes on STREAM; ID names the block until it is freed) or
 * "f ID STREAM T_US" (free block ID), fields separated by blanks or tabs; lines starting
 * with '#' (after blanks) are comments; blank lines are allowed. Numbers are unsigned
 * decimal and fit in 64 bits; ID is below 2^64 - 1. A line ends with "\n" or "\r\n"
 * and holds printable ASCII, blanks and tabs only: any other byte (NUL included), a line
 * of more than VRAM_TRACE_LINE_MAX bytes, or an ID allocated again while live is an
 * error naming the file and the line. This reader is the only one: the command and the
 * Python package both read traces through it.
 * ------------------------------------------------------------------------------------- */
#define VRAM_TRACE_LINE_MAX 4096                  /* bytes of a line, its end included */
#define VRAM_TRACE_DEFAULT_MAX_OPS 20000000ull    /* the commands' default --max-ops */

typedef struct vram_trace_reader vram_trace_reader_t;

typedef struct vram_trace_op {
  uint64_t id;       /* the trace's block ID */
  uint64_t size;     /* allocation: bytes asked for; free: the size the block had (0 when
                        the ID was not live) */
  uint64_t stream;   /* the trace's opaque stream number */
  uint64_t time_us;  /* T_US as written */
  uint64_t line;     /* line number in the file, from 1 */
  uint32_t slot;     /* dense block number: unique among live blocks, reused after a free,
                        below the most blocks live at once; 0 for an unmatched free */
  uint8_t is_alloc;  /* 1 allocate, 0 free */
  uint8_t matched;   /* a free of a live ID (0: a block from before the recording) */
  uint8_t reserved_[2];
} vram_trace_op_t;

/* Open the trace at path for reading op by op; reading stops with VRAM_ELIMIT after
 * max_ops event lines (0 = no limit). The header is checked here. On failure *out is NULL
 * and error (if cap > 0) holds a message naming the file: VRAM_EIO (cannot open),
 * VRAM_ETRACE (not a v1 trace), VRAM_EHOSTMEM. Host memory while reading grows with the
 * blocks live at once, never with the length of the file. */
VRAM_API int vram_trace_reader_open(const char *path, uint64_t max_ops,
                                    vram_trace_reader_t **out, char *error, size_t cap);
/* The next event: 1 with *op filled, 0 at the end of the file, or a negative status
 * (VRAM_ETRACE, VRAM_EIO, VRAM_ELIMIT, VRAM_EHOSTMEM) whose message is
 * vram_trace_reader_error(); every later call returns the same status. */
VRAM_API int vram_trace_reader_next(vram_trace_reader_t *reader, vram_trace_op_t *op);
/* The last error's message ("file:line: what is wrong"), or "" if none. */
VRAM_API const char *vram_trace_reader_error(const vram_trace_reader_t *reader);
/* Blocks live now (at the end: those the trace never frees). */
VRAM_API uint64_t vram_trace_reader_live(const vram_trace_reader_t *reader);
VRAM_API void vram_trace_reader_close(vram_trace_reader_t *reader);

/* Writing a trace the reader above reads back op for op: gzip (plain text where the build
 * has no zlib; the reader reads both), whatever the path's name. The header line is
 * "# vramkit-trace v1 HEADER" (no blank after v1 when HEADER is empty); each op is written
 * from its is_alloc, id, size (allocations only), stream and time_us. Refused, with a
 * message naming the file: a header with a byte other than printable ASCII or a tab, or
 * longer than VRAM_TRACE_HEADER_MAX (VRAM_EINVAL, at open, before the file is made); an op
 * whose is_alloc is not 0 or 1 or whose id is 2^64 - 1 (VRAM_EINVAL); an allocation of an
 * ID still live (VRAM_ETRACE). A free of an ID that is not live is written (the reader
 * counts it unmatched). A failed write is VRAM_EIO. Every failure is sticky, and closing
 * a writer that failed removes the file it wrote (when a regular file), so a failure
 * never leaves a shorter trace that reads as whole. */
#define VRAM_TRACE_HEADER_MAX (VRAM_TRACE_LINE_MAX - 1 - 19) /* after "# vramkit-trace v1 " */

typedef struct vram_trace_writer vram_trace_writer_t;

/* Create (or truncate) the file at path and start it with the header line. VRAM_EINVAL,
 * VRAM_EIO (cannot create), VRAM_EHOSTMEM; on failure *out is NULL and error (if cap > 0)
 * holds the message. */
VRAM_API int vram_trace_writer_open(const char *path, const char *header,
                                    vram_trace_writer_t **out, char *error, size_t cap);
/* Append one op (the reader's struct; line, slot and matched are not read). VRAM_OK or the
 * sticky status, whose message is vram_trace_writer_error(). */
VRAM_API int vram_trace_writer_put(vram_trace_writer_t *writer, const vram_trace_op_t *op);
/* The last error's message ("file: what is wrong"), or "" if none. */
VRAM_API const char *vram_trace_writer_error(const vram_trace_writer_t *writer);
/* Ops written so far. */
VRAM_API uint64_t vram_trace_writer_ops(const vram_trace_writer_t *writer);
/* Flush, close and free: VRAM_OK only if the whole trace reached the file (a full disk is
 * VRAM_EIO here at the latest); otherwise the sticky or final status, the message in error
 * (if cap > 0), and the file removed. */
VRAM_API int vram_trace_writer_close(vram_trace_writer_t *writer, char *error, size_t cap);
/* Abandon the trace: close and free, removing the file. */
VRAM_API void vram_trace_writer_discard(vram_trace_writer_t *writer);

/* -------------------------------------------------------------------------------------
 * Replay: one trace through a fresh pool per pass, the loop `vramkit replay` runs, as a
 * call, so that the command and the Python package report one engine's figures. A trace
 * is loaded whole first (16 bytes an op, refused past max_ops), so that only the op loop
 * is under the clock. An allocation that runs out of memory is counted and skipped (its
 * free ignored); any other failure ends the replay with a negative status and a message
 * in result->error. Every pass ends by freeing what is left and checking that the pool got
 * every byte back. Nothing here reads the environment: the pool is opts->pool.
 * ------------------------------------------------------------------------------------- */
typedef struct vram_replay_trace vram_replay_trace_t;

typedef struct vram_replay_options {
  vram_options_t pool;     /* the pool each pass creates */
  uint64_t capacity;       /* nonzero: the limit and the sim device's capacity, in bytes */
  int repeat;              /* cold passes, each on a fresh pool; the best time counts (>= 1) */
  int warm;                /* also time a pass on a pool an untimed pass has filled */
  int baseline;            /* also time a hash-table insert or delete per op (a yardstick) */
  int min_capacity;        /* also bisect the smallest capacity with no out-of-memory */
  int64_t calls_after;     /* count the cold pass's source calls after this op; -1: not */
  int private_pools;       /* host-model pools of their own: no shared sim, record, env */
  /* Called on the last cold pass before its final frees (the command prints a summary). */
  void (*before_drain)(vram_pool_t *pool, void *context);
  void *context;
} vram_replay_options;

/* Turn `opts` into the options of its source's host model, on which placement, peaks and
 * the smallest cap are measured without a GPU: sim for cuda, managed and sim, sim:vmm for
 * vmm and sim:vmm; managed memory, which cannot reserve a virtual range, as fixed
 * segments throughout. The capacity and every other option stay. */
VRAM_API int vram_options_host_model(vram_options_t *opts);

/* Fill the options of `vramkit replay --repeat 1` on `pool` (vram_options_init's if NULL). */
VRAM_API void vram_replay_options_init(vram_replay_options *opts, const vram_options_t *pool);

typedef struct vram_replay_result {
  char name[256];                  /* the file name less its directory and ".trace.gz" */
  vram_source_kind source;         /* the source the pool ran on */
  uint64_t ops, skipped_frees;     /* ops replayed; frees of IDs not live then */
  uint64_t peak_live_bytes;        /* from the trace alone; UINT64_MAX when saturated */
  uint64_t peak_reserved_bytes, ooms, device_calls;    /* of the first cold pass */
  uint64_t device_calls_after, device_calls_warm;
  double ns_per_op, ns_per_op_warm, baseline_ns_per_op; /* best of the passes */
  /* 1 found, 0 not asked, -1 none up to the search's top (vram_replay_min_capacity),
   * -2 peak live past the sim's largest capacity, -3 nothing live: nothing to search. */
  int have_min_capacity;
  uint64_t min_capacity_bytes;
  vram_source_kind min_capacity_source; /* sim or sim:vmm: the source's host model */
  /* The first out-of-memory of the first cold pass: the op (-1: the pool's creation, its
   * preallocation), the bytes asked, and the pool's report of why. */
  int64_t first_oom_op;
  uint64_t first_oom_size;
  char first_oom_report[4096];
  vram_oom_info_t first_oom_info;  /* its figures (meaningful when ooms > 0) */
  int failed_creating;             /* the failure was vram_pool_create's (status returned) */
  char error[1024];                /* why a negative status was returned */
} vram_replay_result;

/* Load the trace at path (VRAM_EIO, VRAM_ETRACE, VRAM_ELIMIT past max_ops or 65535 streams,
 * VRAM_EHOSTMEM; the message in error). max_ops 0: no limit. */
VRAM_API int vram_replay_load(const char *path, uint64_t max_ops, vram_replay_trace_t **out,
                              char *error, size_t cap);
/* What the trace alone says: name, ops, skipped_frees, peak_live_bytes (the rest zeroed). */
VRAM_API void vram_replay_describe(const vram_replay_trace_t *trace, vram_replay_result *result);
/* 0 when the result's pool was never made (its preallocation did not fit, or the source
 * refused): no op ran, so it has no time per op; else 1. */
VRAM_API int vram_replay_pool_made(const vram_replay_result *result);
/* Peak reserved over peak live; 0 where none: no pool made, nothing live, ops refused. */
VRAM_API double vram_replay_reserved_over_live(const vram_replay_result *result);
/* Replay a loaded trace as opts ask; VRAM_OK even with out-of-memory (result->ooms). */
VRAM_API int vram_replay_trace(const vram_replay_trace_t *trace, const vram_replay_options *opts,
                               vram_replay_result *result);
/* The smallest capacity, to 1 MiB, under which the trace replays with no out-of-memory on
 * the host model of `pool`'s source family (sim for sim/cuda/managed, sim:vmm for vmm):
 * fills result's min_capacity fields. The search tops at 4x peak live, or at the peak
 * reserved of a replay already in `result` that had no out-of-memory where that is more
 * (a trace smaller than the pool's first segment), and at most the sim's largest capacity. */
VRAM_API int vram_replay_min_capacity(const vram_replay_trace_t *trace,
                                      const vram_options_t *pool, vram_replay_result *result);
VRAM_API void vram_replay_unload(vram_replay_trace_t *trace);
/* Load, replay and unload: one call for one trace. */
VRAM_API int vram_replay_run(const vram_replay_options *opts, const char *path,
                             uint64_t max_ops, vram_replay_result *result);

/* Number of devices the source kind can see (sim: 8). */
VRAM_API int vram_device_count(vram_source_kind kind, int *count);

#ifdef __cplusplus
}
#endif
#endif /* VRAMKIT_H */

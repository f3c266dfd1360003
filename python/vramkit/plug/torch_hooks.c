/* torch_hooks.c - what PyTorch's CUDAPluggableAllocator needs from vramkit, in plain C.
 *
 * Built into libvramkit_torch.so, which links the shared libvramkit: the pools these hooks
 * use are the same process-wide default pools that vramkit._core (also linked to
 * libvramkit) reports on, so vramkit.memory_stats() sees PyTorch's allocations.
 *
 * PyTorch does not check the pointer its alloc function returns: a NULL becomes a tensor at
 * address 0, and the first kernel on it destroys the process's CUDA context. A failed
 * allocation must therefore raise a C++ exception PyTorch translates (c10::OutOfMemoryError),
 * which C cannot do. So this library has no alloc function of its own: it offers
 * vramkit_torch_alloc(), which reports a failure as a status and a message, and the small
 * C++ library built from torch_oom.cpp against the installed PyTorch (vramkit/plug/_torch_build.py)
 * turns that into the exception. Everything else (free, empty_cache, the memory fraction,
 * record_stream) cannot fail in a way PyTorch could report, and lives here.
 *
 * These functions run with no GIL, on PyTorch's threads (autograd's among them): they never
 * abort, never print, and keep the last failure for vramkit.last_oom_report().
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stddef.h>
#include <sys/types.h>

#include "vramkit.h"

#define VRAMKIT_TORCH_API __attribute__((visibility("default")))

/* The outcomes of vramkit_torch_alloc(); torch_oom.cpp maps them to exceptions. */
enum { VRAMKIT_TORCH_OK = 0, VRAMKIT_TORCH_OOM = 1, VRAMKIT_TORCH_ERROR = 2 };

/* Enough for any single host; devices beyond it still work but are not emptied by
 * empty_cache nor searched by record_stream. */
#define MAX_DEVICES 64

/* Devices PyTorch has allocated on: empty_cache and record_stream visit only these, so
 * that no pool (and no preallocation) is created for a device PyTorch never used. */
static atomic_uchar device_used[MAX_DEVICES];

/* The last failure seen by a hook. Not thread-local: PyTorch's backward pass allocates on
 * autograd worker threads, yet the OOM surfaces in the thread that called backward(). */
static atomic_int last_status;
static atomic_int last_device = -1;
static atomic_int last_oom_device = -1;

static void note_failure(int device, int status) {
  atomic_store(&last_device, device);
  atomic_store(&last_status, status);
  if (status == VRAM_ENOMEM) atomic_store(&last_oom_device, device);
}

static int pool_of(int device, vram_pool_t **pool) {
  int rc = vram_default_pool(device, pool);
  if (rc != VRAM_OK) {
    note_failure(device, rc);
    return rc;
  }
  if (device >= 0 && device < MAX_DEVICES) atomic_store_explicit(&device_used[device], 1,
                                                                 memory_order_relaxed);
  return VRAM_OK;
}

/* A size as PyTorch's caching allocator writes it in its messages: bytes up to 1 KiB, then
 * KiB up to 1 MiB, MiB up to 1 GiB, and GiB above (no larger unit), each bound inclusive,
 * with two decimals. Users and tools compare these figures across allocators. */
static void format_size(char *buf, size_t cap, size_t bytes) {
  const double kib = 1024.0, mib = kib * 1024.0, gib = mib * 1024.0;
  if (bytes <= 1024) snprintf(buf, cap, "%zu bytes", bytes);
  else if (bytes <= ((size_t)1 << 20)) snprintf(buf, cap, "%.2f KiB", (double)bytes / kib);
  else if (bytes <= ((size_t)1 << 30)) snprintf(buf, cap, "%.2f MiB", (double)bytes / mib);
  else snprintf(buf, cap, "%.2f GiB", (double)bytes / gib);
}

/* The sentences PyTorch's own allocator opens its out-of-memory message with, with the
 * same figures, so that whoever reads or parses them (people, accelerate, Lightning, log
 * scrapers) finds them where PyTorch puts them. in_use is the device's used memory
 * (vramkit has no per-process figure); limit, when nonzero, is the memory fraction's cap;
 * private_allocated is what graph pools hold. Returns snprintf's count. */
VRAMKIT_TORCH_API int vramkit_torch_oom_head(char *msg, size_t cap, int device, size_t size,
                                             size_t total, size_t free_bytes, size_t limit,
                                             size_t allocated, size_t private_allocated,
                                             size_t reserved) {
  char want[32], cap_s[32], free_s[32], used_s[32], alloc_s[32], priv_s[32], unalloc_s[32],
      allowed_s[48] = "", private_s[96] = "";
  format_size(want, sizeof want, size);
  format_size(cap_s, sizeof cap_s, total);
  format_size(free_s, sizeof free_s, free_bytes);
  format_size(used_s, sizeof used_s, total > free_bytes ? total - free_bytes : 0);
  format_size(alloc_s, sizeof alloc_s, allocated + private_allocated);
  size_t held = allocated + private_allocated;
  format_size(unalloc_s, sizeof unalloc_s, reserved > held ? reserved - held : 0);
  if (limit) {
    char l[32];
    format_size(l, sizeof l, limit);
    snprintf(allowed_s, sizeof allowed_s, "%s allowed; ", l);
  }
  if (private_allocated) {
    format_size(priv_s, sizeof priv_s, private_allocated);
    snprintf(private_s, sizeof private_s, "with %s allocated in private pools (e.g., CUDA "
             "Graphs), ", priv_s);
  }
  return snprintf(msg, cap, "CUDA out of memory. Tried to allocate %s. GPU %d has a total "
                  "capacity of %s of which %s is free. Including non-PyTorch memory, this "
                  "process has %s memory in use. %sOf the allocated memory %s is allocated by "
                  "PyTorch, %sand %s is reserved by PyTorch but unallocated. vramkit's report "
                  "(cause and what to try) follows.\n", want, device, cap_s, free_s, used_s,
                  allowed_s, alloc_s, private_s, unalloc_s);
}

/* The message PyTorch's user sees. An out-of-memory one starts with PyTorch's own sentences
 * (vramkit_torch_oom_head, "CUDA out of memory." first: the words batch-size finders look
 * for), then the engine's report: sizes, limit, fragmentation, cause and what to try, where
 * PyTorch suggests expandable segments. Exported: the complete backend (torch_backend.cpp)
 * throws the same message, with the figures of its private pools too. */
VRAMKIT_TORCH_API void vramkit_torch_compose_message(char *msg, size_t cap, int status,
                                                   int device, size_t size, vram_pool_t *pool) {
  if (msg == NULL || cap == 0) return;
  char want[32];
  format_size(want, sizeof want, size);
  int n;
  if (status == VRAM_ENOMEM) {
    vram_stats_t s = {0};
    size_t free_bytes = 0, total = 0;
    if (pool) {
      vram_get_stats(pool, &s);
      vram_mem_get_info(pool, &free_bytes, &total);
    }
    n = vramkit_torch_oom_head(msg, cap, device, size, total, free_bytes, s.limit_bytes,
                               (size_t)s.allocated_bytes.current, 0,
                               (size_t)s.reserved_bytes.current);
  } else {
    n = snprintf(msg, cap, "vramkit could not allocate %s on CUDA device %d: %s (%s).", want,
                 device, vram_strerror(status), vram_errname(status));
  }
  if (n < 0 || (size_t)n >= cap || status != VRAM_ENOMEM || pool == NULL) return;
  vram_oom_report(pool, msg + n, cap - (size_t)n);
}

/* The default pool of `device` for the C++ backend (torch_backend.cpp), counted as used by
 * PyTorch like the pools these hooks reach. */
VRAMKIT_TORCH_API int vramkit_torch_pool(int device, vram_pool_t **pool) {
  return pool_of(device, pool);
}

/* Allocate `size` bytes on `device` for `stream`. On success *out is a block (NULL only for
 * size 0, as PyTorch's own allocator gives) and the result VRAMKIT_TORCH_OK; on failure
 * *out is untouched, `msg` holds the message and the result says whether it was out of
 * memory. Sizes come as PyTorch's size_t. */
VRAMKIT_TORCH_API int vramkit_torch_alloc(size_t size, int device, void *stream, void **out,
                                          char *msg, size_t msg_cap) {
  vram_pool_t *pool = NULL;
  int rc = pool_of(device, &pool);
  if (rc == VRAM_OK) {
    void *ptr = NULL;
    rc = vram_malloc(pool, size, (vram_stream_t)stream, &ptr);
    if (rc == VRAM_OK) {
      *out = ptr;
      return VRAMKIT_TORCH_OK;
    }
    note_failure(device, rc);
  }
  vramkit_torch_compose_message(msg, msg_cap, rc, device, size, pool);
  return rc == VRAM_ENOMEM ? VRAMKIT_TORCH_OOM : VRAMKIT_TORCH_ERROR;
}

/* void free_fn(void* ptr, size_t size, int device, cudaStream_t stream). The pool knows
 * the block's size and stream already. */
VRAMKIT_TORCH_API void vramkit_torch_free(void *ptr, size_t size, int device, void *stream) {
  vram_pool_t *pool = NULL;
  if (pool_of(device, &pool) != VRAM_OK) return;
  int rc = vram_free(pool, ptr);
  if (rc != VRAM_OK) note_failure(device, rc);
}

/* torch.cuda.empty_cache() -> set_reset_fn: void(void). */
VRAMKIT_TORCH_API void vramkit_torch_empty_cache(void) {
  for (int d = 0; d < MAX_DEVICES; d++) {
    if (!atomic_load_explicit(&device_used[d], memory_order_relaxed)) continue;
    vram_pool_t *pool = NULL;
    if (pool_of(d, &pool) != VRAM_OK) continue;
    int rc = vram_empty_cache(pool);
    if (rc != VRAM_OK) note_failure(d, rc);
  }
}

/* torch.cuda.set_per_process_memory_fraction() -> set_memory_fraction_fn: void(double, int).
 * The fraction becomes a hard limit on the memory the pool reserves, as in PyTorch. */
VRAMKIT_TORCH_API void vramkit_torch_set_memory_fraction(double fraction, int device) {
  vram_pool_t *pool = NULL;
  if (pool_of(device, &pool) != VRAM_OK) return;
  /* A fraction of 0 means no memory at all to PyTorch, while a limit of 0 bytes means no
   * limit to vramkit: ask for a limit of one byte instead, as vramkit's own
   * set_per_process_memory_fraction does. */
  int rc = vram_set_limit(pool, fraction == 0.0 ? 1 : 0, fraction);
  if (rc != VRAM_OK) note_failure(device, rc);
}

/* Tensor.record_stream() -> set_record_stream_fn: void(void *ptr, cudaStream_t). PyTorch
 * does not say which device the block is on: ask each pool PyTorch used until one owns it. */
VRAMKIT_TORCH_API void vramkit_torch_record_stream(void *ptr, void *stream) {
  for (int d = 0; d < MAX_DEVICES; d++) {
    if (!atomic_load_explicit(&device_used[d], memory_order_relaxed)) continue;
    vram_pool_t *pool = NULL;
    if (vram_default_pool(d, &pool) != VRAM_OK) continue;
    int rc = vram_record_stream(pool, ptr, (vram_stream_t)stream);
    if (rc == VRAM_OK) return;
    if (rc != VRAM_EFOREIGN) {
      note_failure(d, rc);
      return;
    }
  }
}

/* For the Python side: the status and device of the last failure (0 and -1 if none). */
VRAMKIT_TORCH_API int vramkit_torch_last_status(void) { return atomic_load(&last_status); }
VRAMKIT_TORCH_API int vramkit_torch_last_device(void) { return atomic_load(&last_device); }
/* The device of the last allocation that ran out of memory (-1 if none). */
VRAMKIT_TORCH_API int vramkit_torch_last_oom_device(void) {
  return atomic_load(&last_oom_device);
}

/* Whether PyTorch has allocated on a device through these hooks. */
VRAMKIT_TORCH_API int vramkit_torch_device_used(int device) {
  if (device < 0 || device >= MAX_DEVICES) return 0;
  return atomic_load_explicit(&device_used[device], memory_order_relaxed);
}

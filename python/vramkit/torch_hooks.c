/* torch_hooks.c - the C functions PyTorch's CUDAPluggableAllocator calls.
 *
 * Built into libvramkit_torch.so, which links the shared libvramkit: the pools these hooks
 * use are the same process-wide default pools that vramkit._core (also linked to
 * libvramkit) reports on, so vramkit.memory_stats() sees PyTorch's allocations.
 *
 * PyTorch calls these from C++ with no GIL and no way to raise a Python exception through
 * them, so they never abort and never print: on failure the alloc hook returns NULL (which
 * PyTorch turns into its own out-of-memory error) and records which device failed, so
 * vramkit.last_oom_report() can fetch the engine's report for it.
 */
#include <stdatomic.h>
#include <stddef.h>
#include <sys/types.h>

#include "vramkit.h"

#define VRAMKIT_TORCH_API __attribute__((visibility("default")))

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

static vram_pool_t *pool_of(int device) {
  vram_pool_t *pool = NULL;
  int rc = vram_default_pool(device, &pool);
  if (rc != VRAM_OK) {
    note_failure(device, rc);
    return NULL;
  }
  if (device >= 0 && device < MAX_DEVICES) atomic_store_explicit(&device_used[device], 1,
                                                                 memory_order_relaxed);
  return pool;
}

/* void* alloc_fn(ssize_t size, int device, cudaStream_t stream) */
VRAMKIT_TORCH_API void *vramkit_torch_malloc(ssize_t size, int device, void *stream) {
  if (size < 0) {
    note_failure(device, VRAM_EINVAL);
    return NULL;
  }
  vram_pool_t *pool = pool_of(device);
  if (pool == NULL) return NULL;
  void *ptr = NULL;
  int rc = vram_malloc(pool, (size_t)size, (vram_stream_t)stream, &ptr);
  if (rc != VRAM_OK) {
    note_failure(device, rc);
    return NULL;
  }
  return ptr;
}

/* void free_fn(void* ptr, ssize_t size, int device, cudaStream_t stream). The pool knows
 * the block's size and stream already. */
VRAMKIT_TORCH_API void vramkit_torch_free(void *ptr, ssize_t size, int device, void *stream) {
  vram_pool_t *pool = pool_of(device);
  if (pool == NULL) return;
  int rc = vram_free(pool, ptr);
  if (rc != VRAM_OK) note_failure(device, rc);
}

/* torch.cuda.empty_cache() -> set_reset_fn: void(void). */
VRAMKIT_TORCH_API void vramkit_torch_empty_cache(void) {
  for (int d = 0; d < MAX_DEVICES; d++) {
    if (!atomic_load_explicit(&device_used[d], memory_order_relaxed)) continue;
    vram_pool_t *pool = pool_of(d);
    if (pool != NULL) {
      int rc = vram_empty_cache(pool);
      if (rc != VRAM_OK) note_failure(d, rc);
    }
  }
}

/* torch.cuda.set_per_process_memory_fraction() -> set_memory_fraction_fn: void(double, int).
 * The fraction becomes a hard limit on the memory the pool reserves, as in PyTorch. */
VRAMKIT_TORCH_API void vramkit_torch_set_memory_fraction(double fraction, int device) {
  vram_pool_t *pool = pool_of(device);
  if (pool == NULL) return;
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

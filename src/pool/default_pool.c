/* default_pool.c - the process-wide pool of each device, created on first use from the
 * VRAMKIT_* environment, so that integrations (PyTorch's pluggable allocator hook, CuPy,
 * Numba) need no set-up code. The pools live until the process exits. */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "vramkit.h"

#define MAX_DEVICES 64

static pthread_mutex_t default_lock = PTHREAD_MUTEX_INITIALIZER;
static vram_pool_t *_Atomic default_pools[MAX_DEVICES];

/* Create the pool of a device under the lock unless it exists; opts NULL: from VRAMKIT_*. */
static int default_pool_make(int device, const vram_options_t *opts, bool must_be_new,
                             vram_pool_t **out) {
  pthread_mutex_lock(&default_lock);
  int rc = VRAM_OK;
  vram_pool_t *pool = default_pools[device];
  if (pool) {
    if (must_be_new) rc = VRAM_EBUSY;
  } else {
    vram_options_t o;
    if (opts) {
      o = *opts;
    } else {
      vram_options_init(&o);
      rc = vram_options_from_env(&o, NULL);
      o.device = device;
    }
    if (!rc) rc = vram_pool_create(&pool, &o);
    if (!rc) default_pools[device] = pool;
  }
  pthread_mutex_unlock(&default_lock);
  if (!rc) *out = pool;
  return rc;
}

int vram_default_pool(int device, vram_pool_t **out) {
  if (!out) return VRAM_EINVAL;
  if (device < 0 || device >= MAX_DEVICES) return VRAM_EDEVICE;
  vram_pool_t *pool = default_pools[device];
  if (pool) {
    *out = pool;
    return VRAM_OK;
  }
  return default_pool_make(device, NULL, false, out);
}

int vram_default_pool_create(const vram_options_t *opts, vram_pool_t **out) {
  if (!opts || !out) return VRAM_EINVAL;
  if (opts->device < 0 || opts->device >= MAX_DEVICES) return VRAM_EDEVICE;
  return default_pool_make(opts->device, opts, true, out);
}

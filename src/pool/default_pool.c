/* default_pool.c - the process-wide pool of each device, created on first use from the
 * VRAMKIT_* environment, so that integrations (PyTorch's pluggable allocator hook, CuPy,
 * Numba) need no set-up code. The pools live until the process exits. */
#include <pthread.h>
#include <stdlib.h>

#include "pool/internal.h"

#define MAX_DEVICES 64

static pthread_mutex_t default_lock = PTHREAD_MUTEX_INITIALIZER;
static vram_pool_t *_Atomic default_pools[MAX_DEVICES];

int vram_default_pool(int device, vram_pool_t **out) {
  if (!out) return VRAM_EINVAL;
  if (device < 0 || device >= MAX_DEVICES) return VRAM_EDEVICE;
  vram_pool_t *pool = default_pools[device];
  if (pool) {
    *out = pool;
    return VRAM_OK;
  }
  pthread_mutex_lock(&default_lock);
  int rc = VRAM_OK;
  pool = default_pools[device];
  if (!pool) {
    vram_options_t opts;
    vram_options_init(&opts);
    rc = vram_options_from_env(&opts, NULL);
    if (!rc) {
      opts.device = device;
      rc = vram_pool_create(&pool, &opts);
    }
    if (!rc) default_pools[device] = pool;
  }
  pthread_mutex_unlock(&default_lock);
  if (!rc) *out = pool;
  return rc;
}

/* call.h - the one way into a pool from a public entry point: locked_call takes the lock,
 * runs the work, checks every invariant at VRAM_DEBUG >= 3, and lets go. Shared by pool.c
 * and history.c, so that every public call runs under the same checks. */
#ifndef VRAM_CALL_H
#define VRAM_CALL_H

#include <stdio.h>
#include <stdlib.h>

#include "pool/pool.h"
#include "pool/types.h"

/* The error callback as it was when the failing call held the lock, called after unlocking
 * so that it may call back into the pool. */
typedef struct error_hook {
  vram_error_fn fn;
  void *user;
} error_hook;

#if VRAM_DEBUG >= 3
#define CHECK_POOL_LOCKED(pool)                                                            \
  do {                                                                                     \
    if (!_vram_pool_check_locked(pool)) {                                                  \
      fprintf(stderr, "vramkit: pool invariant broken at %s:%d\n", __FILE__, __LINE__);    \
      abort();                                                                             \
    }                                                                                      \
  } while (0)
#else
#define CHECK_POOL_LOCKED(pool) ((void)0)
#endif

typedef int (*locked_fn)(vram_pool_t *pool, void *arg);

/* Run fn(pool, arg) under the pool's lock and return what it returns. At VRAM_DEBUG >= 3
 * the whole pool is checked before the lock goes. When fn fails (a negative status) and
 * `hook` is given, the error callback is copied out for the caller to call unlocked.
 * Inlined with a known fn, it costs what the sequence written out would. */
VRAM_HOT int locked_call(vram_pool_t *pool, locked_fn fn, void *arg, error_hook *hook) {
  vram_lock_acquire(&pool->lock);
  int rc = fn(pool, arg);
  if (rc < 0 && hook) *hook = (error_hook){pool->on_error, pool->on_error_user};
  CHECK_POOL_LOCKED(pool);
  vram_lock_release(&pool->lock);
  return rc;
}

#endif /* VRAM_CALL_H */

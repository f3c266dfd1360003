/* lock.h - the pool's one lock: a test-and-test-and-set spin lock that yields.
 *
 * Why not a pthread mutex: an uncontended lock+unlock pair is on the hot path twice per
 * alloc+free pair, and the critical sections are tens of nanoseconds. A spin lock costs one
 * atomic exchange to take and a release store to drop. Under contention a waiter spins
 * briefly with a pause hint, then yields the CPU so that oversubscribed threads (8 threads
 * on 2 cores in the stress test) still make progress. */
#ifndef VRAM_LOCK_H
#define VRAM_LOCK_H

#include <sched.h>
#include <stdatomic.h>

typedef struct vram_lock {
  atomic_int held;
} vram_lock;

static inline void vram_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static inline void vram_lock_init(vram_lock *l) { atomic_init(&l->held, 0); }

static inline void vram_lock_acquire(vram_lock *l) {
  if (!atomic_exchange_explicit(&l->held, 1, memory_order_acquire)) return;
  for (;;) {
    for (int spin = 0; spin < 64; spin++) {
      if (!atomic_load_explicit(&l->held, memory_order_relaxed) &&
          !atomic_exchange_explicit(&l->held, 1, memory_order_acquire))
        return;
      vram_cpu_relax();
    }
    sched_yield();
  }
}

static inline void vram_lock_release(vram_lock *l) {
  atomic_store_explicit(&l->held, 0, memory_order_release);
}

#endif /* VRAM_LOCK_H */

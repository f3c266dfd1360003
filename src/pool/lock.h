/* lock.h - the pool's one lock: biased to the thread that made the pool, a spin lock for
 * every thread once a second thread takes it.
 *
 * Why biased: most pools are driven by one thread (the Python thread that runs the model,
 * or one worker per GPU), and an atomic exchange per call is a full barrier that drains the
 * store buffer: on the cached alloc+free pair that barrier is about half the time. (A
 * replay op, a chain of dependent loads, hides it.) While the lock is biased, its owner
 * enters with two plain stores and a load and leaves with one store. The first call from any other thread revokes the bias for good (lock.c): it asks
 * the owner to step aside, makes the kernel run a memory barrier on every thread of the
 * process (membarrier), waits for the owner to be out, and from then on every thread,
 * owner included, takes the spin lock. Without membarrier the lock is never biased.
 *
 * The spin lock: test-and-test-and-set that spins briefly with a pause hint, then yields,
 * so that oversubscribed threads (8 threads on 2 cores in the stress test) make progress.
 * Critical sections are tens of nanoseconds, so a mutex's sleeping would only cost. */
#ifndef VRAM_LOCK_H
#define VRAM_LOCK_H

#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

/* `owner` when no thread holds the bias: never biased, or revoked. */
#define VRAM_LOCK_UNBIASED ((uintptr_t)0)

typedef struct vram_lock {
  atomic_uintptr_t owner;   /* thread the lock is biased to, or VRAM_LOCK_UNBIASED */
  atomic_int owner_inside;  /* the owner holds the lock through its fast path */
  atomic_int revoking;      /* another thread is taking the bias away */
  atomic_int held;          /* the spin lock */
} vram_lock;

/* A number unique to the calling thread among live threads: its thread pointer, which one
 * instruction reads, unlike a thread-local variable in a shared library. */
static inline uintptr_t vram_thread_id(void) {
  uintptr_t tp;
#if defined(__x86_64__)
  __asm__("mov %%fs:0, %0" : "=r"(tp));
#elif defined(__aarch64__)
  __asm__("mrs %0, tpidr_el0" : "=r"(tp));
#else
  static _Thread_local char here;
  tp = (uintptr_t)&here;
#endif
  return tp;
}

static inline void vram_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* lock.c: a free lock, biased to the calling thread when the kernel offers membarrier. */
void _vram_lock_init(vram_lock *l);
/* lock.c: the spin lock, revoking the bias first when another thread holds it. */
void _vram_lock_acquire_slow(vram_lock *l);

/* tests/c/test_lock.c widens the owner's window between reading the bias and announcing
 * itself, where a revocation can slip in; in the library it is nothing. */
#ifndef VRAM_LOCK_RACE_WINDOW
#define VRAM_LOCK_RACE_WINDOW() ((void)0)
#endif

static inline void vram_lock_acquire(vram_lock *l) {
  if (atomic_load_explicit(&l->owner, memory_order_relaxed) == vram_thread_id()) {
    VRAM_LOCK_RACE_WINDOW();
    atomic_store_explicit(&l->owner_inside, 1, memory_order_relaxed);
    /* A compiler barrier only: the CPU may still let the load below pass the store above,
     * and a revoker's membarrier is what orders the two against its own store and load. */
    atomic_signal_fence(memory_order_seq_cst);
    if (!atomic_load_explicit(&l->revoking, memory_order_relaxed)) return;
    atomic_store_explicit(&l->owner_inside, 0, memory_order_release);
  }
  _vram_lock_acquire_slow(l);
}

/* While the owner is inside through its fast path the bias cannot be revoked (the revoker
 * waits for it to leave), so `owner` still names it: that is how release knows the way in. */
static inline void vram_lock_release(vram_lock *l) {
  if (atomic_load_explicit(&l->owner, memory_order_relaxed) == vram_thread_id())
    atomic_store_explicit(&l->owner_inside, 0, memory_order_release);
  else
    atomic_store_explicit(&l->held, 0, memory_order_release);
}

#endif /* VRAM_LOCK_H */

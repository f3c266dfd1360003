/* lock.c - the slow half of the pool lock: biasing it at creation, the spin lock, and
 * revoking the bias when a second thread arrives.
 *
 * Why revocation is safe (the asymmetric Dekker pattern of user-space RCU and of JVM biased
 * locking): the owner stores owner_inside = 1 and then loads `revoking`; a revoker stores
 * revoking = 1 and then loads owner_inside. Mutual exclusion needs one of the two to see the
 * other's store, and the owner's side has no fence, so its load may pass its store. The
 * revoker therefore calls membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) between its store and
 * its load: the kernel makes every running thread of the process execute a full barrier
 * (a thread not running passed one when it was switched out). If the owner's store came
 * before that barrier, the revoker's load sees 1 and waits; if after, the owner's load
 * comes after it too and sees revoking = 1, and the owner steps aside to the spin lock. The
 * revoker holds the spin lock throughout, so at most one revocation runs, and it marks the
 * lock unbiased before letting anyone else in. */
#include "pool/lock.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <time.h>

#if defined(__linux__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

static pthread_once_t membarrier_once = PTHREAD_ONCE_INIT;
static bool membarrier_registered;

#if defined(__linux__) && defined(SYS_membarrier)
static long membarrier_call(int cmd) { return syscall(SYS_membarrier, cmd, 0, 0); }

static void membarrier_register(void) {
  long offered = membarrier_call(MEMBARRIER_CMD_QUERY);
  membarrier_registered = offered > 0 &&
                          (offered & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
                          membarrier_call(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}

/* A full barrier on every thread of the process. A child of fork() may have lost the
 * registration, so register again once before giving up. */
static bool barrier_on_every_thread(void) {
  if (membarrier_call(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return true;
  return errno == EPERM && membarrier_call(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
         membarrier_call(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0;
}
#else
static void membarrier_register(void) { membarrier_registered = false; }
static bool barrier_on_every_thread(void) { return false; }
#endif

void _vram_lock_init(vram_lock *l) {
  pthread_once(&membarrier_once, membarrier_register);
  atomic_init(&l->owner, membarrier_registered ? vram_thread_id() : VRAM_LOCK_UNBIASED);
  atomic_init(&l->owner_inside, 0);
  atomic_init(&l->revoking, 0);
  atomic_init(&l->held, 0);
}

/* Wait for a flag another thread will clear: spin briefly with a pause hint, then yield,
 * so that oversubscribed threads still make progress. Acquire: what the clearing thread
 * wrote before clearing is visible after. */
static void wait_until_clear(atomic_int *flag) {
  for (int spin = 0; atomic_load_explicit(flag, memory_order_acquire); spin++) {
    if (spin < 64) vram_cpu_relax();
    else {
      sched_yield();
      spin = 0;
    }
  }
}

/* Test-and-test-and-set: the exchange only when the lock looked free. */
static void spin_acquire(atomic_int *held) {
  while (atomic_exchange_explicit(held, 1, memory_order_acquire)) wait_until_clear(held);
}

/* Called with the spin lock held and the bias on another thread. */
static void revoke_bias(vram_lock *l) {
  atomic_store_explicit(&l->revoking, 1, memory_order_seq_cst);
  if (!barrier_on_every_thread()) {
    /* Only a forked child whose registration cannot be renewed gets here (the lock was
     * biased because registration worked in its parent). A store buffer drains within
     * nanoseconds, so after a millisecond the owner's store is visible in practice,
     * though no architecture promises it. */
    struct timespec pause = {0, 1000000};
    nanosleep(&pause, NULL);
  }
  wait_until_clear(&l->owner_inside);
  atomic_store_explicit(&l->owner, VRAM_LOCK_UNBIASED, memory_order_relaxed);
}

void _vram_lock_acquire_slow(vram_lock *l) {
  spin_acquire(&l->held);
  /* Every holder of the spin lock checks; only the first after the bias finds it set. The
   * owner itself never does: it comes here only once `revoking` is set, and the revoker
   * holds the spin lock until the bias is gone. */
  if (atomic_load_explicit(&l->owner, memory_order_relaxed) != VRAM_LOCK_UNBIASED) revoke_bias(l);
}

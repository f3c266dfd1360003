/* test_lock.c - the pool lock on its own: biased to its creator, revoked by the first call
 * from another thread, and mutually exclusive throughout, including while the bias is
 * being taken away from an owner that is busy in the lock.
 *
 * Exclusion is checked with a plain (non-atomic) counter and a "someone is inside" flag
 * that each holder sets and clears: two holders at once show up as a flag already set, or
 * as lost increments. The race of interest (revocation against an owner entering through
 * its fast path) is timing-dependent, so it is run many times on fresh locks, with the
 * owner's window widened through the hook lock.h leaves for it. */
#include "vt.h"

/* Now and then the owner dawdles between seeing its bias and announcing itself inside: a
 * revoker that ignored the owner's check of `revoking` would let both in. */
static _Thread_local unsigned window_calls;
static void dawdle(void) {
  if (++window_calls % 8) return;
  for (int i = 0; i < 300; i++) __asm__ __volatile__("" ::: "memory");
}
#define VRAM_LOCK_RACE_WINDOW() dawdle()
#include "pool/lock.h"

#include <pthread.h>

enum { CONTENDERS = 3, ROUNDS = 200, INCREMENTS = 2000 };

typedef struct shared_state {
  vram_lock lock;
  pthread_barrier_t start;
  long counter;          /* guarded by lock; deliberately not atomic */
  volatile int inside;   /* set by each holder on entry, cleared on exit */
  atomic_int overlaps;   /* holders that found another one inside */
} shared_state;

static void critical_section(shared_state *s) {
  vram_lock_acquire(&s->lock);
  if (s->inside) atomic_fetch_add(&s->overlaps, 1);
  s->inside = 1;
  s->counter++;
  s->inside = 0;
  vram_lock_release(&s->lock);
}

static void *contender(void *arg) {
  shared_state *s = arg;
  pthread_barrier_wait(&s->start);
  for (int i = 0; i < INCREMENTS; i++) critical_section(s);
  return NULL;
}

/* The creator owns the bias when the kernel offers membarrier; either way the lock works. */
static void t_biased_to_creator(void **state) {
  (void)state;
  vram_lock lock;
  _vram_lock_init(&lock);
  uintptr_t owner = atomic_load(&lock.owner);
  assert_true(owner == vram_thread_id() || owner == VRAM_LOCK_UNBIASED);
  for (int i = 0; i < 3; i++) {
    vram_lock_acquire(&lock);
    /* The owner's way in leaves the spin lock alone. */
    if (owner != VRAM_LOCK_UNBIASED) assert_int_equal(atomic_load(&lock.held), 0);
    else assert_int_equal(atomic_load(&lock.held), 1);
    vram_lock_release(&lock);
    assert_int_equal(atomic_load(&lock.held), 0);
    assert_int_equal(atomic_load(&lock.owner_inside), 0);
  }
}

static void *take_once(void *arg) {
  vram_lock *lock = arg;
  vram_lock_acquire(lock);
  int held = atomic_load(&lock->held);
  vram_lock_release(lock);
  return (void *)(intptr_t)held;
}

/* A second thread's first call ends the bias; afterwards both threads, the old owner
 * included, go through the spin lock and leave it free. */
static void t_second_thread_revokes(void **state) {
  (void)state;
  vram_lock lock;
  _vram_lock_init(&lock);
  vram_lock_acquire(&lock);
  vram_lock_release(&lock);
  for (int round = 0; round < 2; round++) {
    pthread_t t;
    void *held_inside = NULL;
    assert_int_equal(pthread_create(&t, NULL, take_once, &lock), 0);
    assert_int_equal(pthread_join(t, &held_inside), 0);
    assert_int_equal((intptr_t)held_inside, 1);
    assert_int_equal(atomic_load(&lock.owner), VRAM_LOCK_UNBIASED);
    assert_int_equal(atomic_load(&lock.held), 0);
    vram_lock_acquire(&lock);
    assert_int_equal(atomic_load(&lock.held), 1);
    vram_lock_release(&lock);
    assert_int_equal(atomic_load(&lock.held), 0);
  }
}

/* The owner keeps entering and leaving while other threads arrive and revoke the bias:
 * no increment is lost and no two holders ever overlap. */
static void t_exclusion_during_revocation(void **state) {
  (void)state;
  for (int round = 0; round < ROUNDS; round++) {
    shared_state *s = calloc(1, sizeof *s);
    assert_non_null(s);
    _vram_lock_init(&s->lock);
    pthread_barrier_init(&s->start, NULL, CONTENDERS + 1);
    pthread_t threads[CONTENDERS];
    for (int i = 0; i < CONTENDERS; i++)
      assert_int_equal(pthread_create(&threads[i], NULL, contender, s), 0);
    /* The owner is already busy when the others are let go. */
    for (int i = 0; i < INCREMENTS / 4; i++) critical_section(s);
    pthread_barrier_wait(&s->start);
    for (int i = 0; i < INCREMENTS; i++) critical_section(s);
    for (int i = 0; i < CONTENDERS; i++) assert_int_equal(pthread_join(threads[i], NULL), 0);
    assert_int_equal(atomic_load(&s->overlaps), 0);
    assert_int_equal(s->counter, (long)(CONTENDERS + 1) * INCREMENTS + INCREMENTS / 4);
    assert_int_equal(atomic_load(&s->lock.owner), VRAM_LOCK_UNBIASED);
    assert_int_equal(atomic_load(&s->lock.held), 0);
    pthread_barrier_destroy(&s->start);
    free(s);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_biased_to_creator),
      cmocka_unit_test(t_second_thread_revokes),
      cmocka_unit_test(t_exclusion_during_revocation),
  };
  return cmocka_run_group_tests_name("lock", tests, NULL, NULL);
}

/* hashtab.h - a small open-addressing hash table from 64-bit keys to 32-bit values.
 *
 * Users: the trace reader (src/trace/reader.c) maps trace block ids to dense slots with
 * it, the command's trace loader maps stream numbers to indices, and
 * `vramkit replay --baseline` times one insert or delete per replayed op with it, the
 * yardstick the allocator's per-op cost is judged against (the aim: at most 8x it). That
 * second use is why everything here is inline: the baseline must be the bare table cost,
 * not the cost of a call. Linear probing with backward-shift deletion keeps probe runs
 * short without tombstones; the table never grows on its own: callers size it up front, or
 * call hashtab_reserve before each insert.
 */
#ifndef VRAMKIT_PRIM_HASHTAB_H
#define VRAMKIT_PRIM_HASHTAB_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define HASHTAB_EMPTY UINT64_MAX /* the one key value the table cannot hold */

typedef struct hashtab {
  uint64_t *keys;
  uint32_t *values;
  size_t mask;     /* capacity - 1; capacity is a power of two */
  unsigned shift;  /* 64 - log2(capacity), for Fibonacci hashing */
  size_t count;
} hashtab_t;

/* Room for at least max_count keys at a load factor of at most one half. 0 or -1. */
static inline int hashtab_init(hashtab_t *table, size_t max_count) {
  size_t capacity = 16;
  unsigned bits = 4;
  while (capacity < 2 * max_count) {
    capacity <<= 1;
    bits++;
  }
  table->keys = malloc(sizeof *table->keys * capacity);
  table->values = malloc(sizeof *table->values * capacity);
  if (!table->keys || !table->values) {
    free(table->keys);
    free(table->values);
    table->keys = NULL;
    table->values = NULL;
    return -1;
  }
  for (size_t i = 0; i < capacity; i++) table->keys[i] = HASHTAB_EMPTY;
  table->mask = capacity - 1;
  table->shift = 64 - bits;
  table->count = 0;
  return 0;
}

static inline void hashtab_close(hashtab_t *table) {
  free(table->keys);
  free(table->values);
  table->keys = NULL;
  table->values = NULL;
}

static inline void hashtab_clear(hashtab_t *table) {
  for (size_t i = 0; i <= table->mask; i++) table->keys[i] = HASHTAB_EMPTY;
  table->count = 0;
}

static inline size_t hashtab_home(const hashtab_t *table, uint64_t key) {
  /* Multiplying by 2^64 / phi spreads keys that differ only in low or high bits (block
   * addresses are 512-byte aligned) over the whole table. */
  return (size_t)((key * 0x9E3779B97F4A7C15ull) >> table->shift);
}

/* Index of key, or SIZE_MAX when absent. */
static inline size_t hashtab_find(const hashtab_t *table, uint64_t key) {
  for (size_t i = hashtab_home(table, key);; i = (i + 1) & table->mask) {
    if (table->keys[i] == key) return i;
    if (table->keys[i] == HASHTAB_EMPTY) return SIZE_MAX;
  }
}

/* Insert a key known to be absent. The caller keeps count within the size given to init. */
static inline void hashtab_insert(hashtab_t *table, uint64_t key, uint32_t value) {
  size_t i = hashtab_home(table, key);
  while (table->keys[i] != HASHTAB_EMPTY) i = (i + 1) & table->mask;
  table->keys[i] = key;
  table->values[i] = value;
  table->count++;
}

/* Room for one more key at a load of at most one half, rehashing into a table twice as
 * large when needed. 0 or -1 (out of memory; the table is unchanged). */
static inline int hashtab_reserve(hashtab_t *table) {
  size_t capacity = table->mask + 1;
  if ((table->count + 1) * 2 <= capacity) return 0;
  hashtab_t bigger;
  if (hashtab_init(&bigger, capacity) != 0) return -1;
  for (size_t i = 0; i < capacity; i++)
    if (table->keys[i] != HASHTAB_EMPTY) hashtab_insert(&bigger, table->keys[i], table->values[i]);
  hashtab_close(table);
  *table = bigger;
  return 0;
}

/* Remove the entry at index hole (from hashtab_find), pulling later entries of the same
 * probe run back so that no lookup ever stops early at the hole. */
static inline void hashtab_remove_at(hashtab_t *table, size_t hole) {
  size_t next = hole;
  for (;;) {
    next = (next + 1) & table->mask;
    uint64_t key = table->keys[next];
    if (key == HASHTAB_EMPTY) break;
    size_t home = hashtab_home(table, key);
    /* The entry may move into the hole only if its home is not cyclically in (hole, next]. */
    int home_after_hole = hole <= next ? (home > hole && home <= next)
                                       : (home > hole || home <= next);
    if (!home_after_hole) {
      table->keys[hole] = key;
      table->values[hole] = table->values[next];
      hole = next;
    }
  }
  table->keys[hole] = HASHTAB_EMPTY;
  table->count--;
}

/* Remove key if present; returns 1 if it was there. */
static inline int hashtab_remove(hashtab_t *table, uint64_t key) {
  size_t i = hashtab_find(table, key);
  if (i == SIZE_MAX) return 0;
  hashtab_remove_at(table, i);
  return 1;
}

#endif

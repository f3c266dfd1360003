/* group.h - the give-back group: the vramkit processes of one user on one device, and the
 * shared file through which they ask each other for idle cached memory (issue 39).
 *
 * The file "<device>.group" sits in the folder of the published records, under the same
 * trust rules (shared_file.h): only this user's processes can map it. <device> is the
 * GPU's UUID, or "sim.<name>.<device>" for a shared sim. Each member entry is one pool:
 * what it holds, what it could give back, what it gave, and the last request it answered.
 *
 * A request: the asker writes the bytes it wants and its entry, bumps request_seq and
 * wakes every watcher sleeping on that word (FUTEX_WAKE without FUTEX_PRIVATE_FLAG: the
 * word is in a shared mapping). Each watcher gives back what it can, stores request_seq in
 * its entry's `answered`, bumps answer_seq and wakes the asker, who sleeps on answer_seq
 * until every member it asked has answered, has died, or its time is up. Two askers at
 * once share the one request: each waits for answers at or past its own sequence, and the
 * bytes asked are the later one's. */
#ifndef VRAM_OBS_GROUP_H
#define VRAM_OBS_GROUP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "obs/shared_file.h"

#define VRAM_GROUP_MEMBERS 64
#define VRAM_GROUP_NAME_MAX 80

typedef struct vram_group_member {
  vram_member_id id;
  _Atomic uint32_t opted_in;     /* it gives back when asked (VRAMKIT_GIVE_BACK) */
  _Atomic uint32_t answered;     /* the request_seq it last answered */
  _Atomic uint64_t reserved;     /* bytes it holds from the device (exact: its source counts) */
  _Atomic uint64_t idle;         /* of them, in whole idle segments or granules: givable */
  _Atomic uint64_t given_bytes, given_count; /* what it gave back, all requests together */
  _Atomic uint64_t asked_count;  /* requests it answered */
  _Atomic uint64_t group_limit;  /* its VRAMKIT_GROUP_LIMIT in bytes, 0 = none */
  char name[64];                 /* its /proc comm, as the process wrote it (escape it) */
} vram_group_member;

typedef struct vram_group_file {
  _Atomic uint64_t magic;
  uint32_t version, file_size;
  _Atomic uint32_t request_seq;  /* futex word: watchers sleep on it */
  _Atomic uint32_t answer_seq;   /* futex word: askers sleep on it */
  _Atomic int32_t request_member;/* the asker's entry */
  uint32_t unused_;
  _Atomic uint64_t request_bytes;
  _Atomic uint64_t reserved_total; /* every member's reserved: what group limits compare */
  vram_group_member members[VRAM_GROUP_MEMBERS];
} vram_group_file;

/* Maps the group file of `device_name`, making it if needed; NULL (a line on stderr) when
 * it cannot. */
vram_group_file *_vram_group_open(const char *device_name);
/* Claims an entry for a pool of this process: its index, or -1 when the table is full
 * (after clearing dead members' entries). */
int _vram_group_join(vram_group_file *g, bool opted_in);
void _vram_group_leave(vram_group_file *g, int member);
/* Clears the entries of members that died, their bytes off the group's total. */
void _vram_group_clear_dead(vram_group_file *g);
/* Clears entry `member` if its process died (true then). */
bool _vram_group_clear_if_dead(vram_group_file *g, int member);

/* Entry `member` holds `bytes` more, if the group's total stays within `limit` (0: no
 * limit); false, and nothing held, if not (after clearing dead members' entries). */
bool _vram_group_take(vram_group_file *g, int member, uint64_t bytes, uint64_t limit);
void _vram_group_give(vram_group_file *g, int member, uint64_t bytes);

/* The asker: posts a request for `bytes` from entry `member` and wakes the watchers;
 * returns the request's sequence. */
uint32_t _vram_group_post(vram_group_file *g, int member, uint64_t bytes);
/* Entry `member` answered request `seq` (or a later one). */
static inline bool _vram_group_answered(vram_group_member *m, uint32_t seq) {
  return (int32_t)(atomic_load(&m->answered) - seq) >= 0;
}
/* Sleeps until answer_seq moves from `seen`, or `timeout_ns` passes; false on timeout. */
bool _vram_group_wait_answers(vram_group_file *g, uint32_t seen, uint64_t timeout_ns);
/* A watcher sleeps until request_seq moves from `seen` (no time limit). */
void _vram_group_wait_request(vram_group_file *g, uint32_t seen);
/* Entry `member` answers request `seq`, having given `bytes`. */
void _vram_group_answer(vram_group_file *g, int member, uint32_t seq, uint64_t bytes);

/* The group file's name for a device name: "" when it holds characters a file name must
 * not (then no group). */
void _vram_group_file_name(const char *device_name, char *buf, size_t cap);

#endif /* VRAM_OBS_GROUP_H */

/* shared_file.h - small files that several processes of one user map together (the shared
 * sim's capacity, the give-back group), in the folder of the published records and under
 * its trust rules (publish.c): the folder is this user's, mode 0700; a file is made afresh
 * with O_EXCL by the first process and must be this user's, mode 0600, of the expected size.
 *
 * Each file holds a table of members. An entry names a process by pid and start time, so a
 * pid reused by another process never passes for the member, and an entry whose process
 * died is cleared by whoever finds it: one compare-and-swap decides who, so what the dead
 * member held is taken back once. */
#ifndef VRAM_OBS_SHARED_FILE_H
#define VRAM_OBS_SHARED_FILE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The first fields of every member entry. pid 0: free; -1: being cleared or claimed. */
typedef struct vram_member_id {
  _Atomic int32_t pid;
  uint32_t unused_;
  _Atomic uint64_t start_ticks; /* 0 while the claimer is still writing the entry */
} vram_member_id;

/* The file `name` of the folder, `size` bytes, mapped shared. When this call made it,
 * *created is true and the caller fills it, then stores its magic (the first 8 bytes) with
 * release order; otherwise the call waits (bounded) for the maker's magic and checks it is
 * `magic`. NULL with one line on stderr that starts with `refusal` when it cannot. */
void *_vram_shared_file_open(const char *name, size_t size, uint64_t magic, const char *refusal,
                             bool *created);
void _vram_shared_file_close(void *map, size_t size);
/* Removes the file `name` of the folder (tests, cleaning up a shared sim). 0 or -1. */
int _vram_shared_file_remove(const char *name);

/* Claims a free entry of `entries` (count of them, `stride` bytes apart) for this process;
 * its index, or -1 when the table is full. The entry's other fields are the caller's. */
int _vram_member_claim(void *entries, size_t count, size_t stride);
/* The member of entry `id` is another live process (false: free, being claimed, ours, or
 * dead). */
bool _vram_member_other_alive(vram_member_id *id);
/* Entry `id` holds a process that died: takes it for clearing (true: the caller clears its
 * fields, then calls _vram_member_free). Only one of the processes that try gets true. */
bool _vram_member_take_dead(vram_member_id *id);
void _vram_member_free(vram_member_id *id);

#endif /* VRAM_OBS_SHARED_FILE_H */

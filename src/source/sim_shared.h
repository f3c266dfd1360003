/* sim_shared.h - a sim device that several processes share (VRAMKIT_SIM_SHARED=<name>):
 * its capacity and the bytes every process holds live in a small shared file, so that one
 * process's allocations leave less for the others, as on a real card. What the give-back
 * tests run on without a GPU. As with a CUDA context, a forked child must not use the pools
 * it copied from its parent: their bytes are counted in the parent's member entry. */
#ifndef VRAM_SIM_SHARED_H
#define VRAM_SIM_SHARED_H

#include <stddef.h>

typedef struct vram_sim_shared vram_sim_shared;

/* NULL when `name` is a valid shared sim name ([A-Za-z0-9_.-], 1 to 64 characters, not
 * "." or ".."), else why not. */
const char *_vram_sim_shared_name_error(const char *name);

/* Joins the shared sim `name` for `device`, making it with `capacity` bytes if it does not
 * exist yet (else its capacity is the maker's). VRAM_EENV for a bad name, VRAM_EIO when
 * the file cannot be made or trusted (a line on stderr says why), VRAM_EHOSTMEM. */
int _vram_sim_shared_join(const char *name, int device, size_t capacity, vram_sim_shared **out);
/* Leaves: what this member still holds goes back to the device. */
void _vram_sim_shared_leave(vram_sim_shared *s);

size_t _vram_sim_shared_capacity(const vram_sim_shared *s);
/* Free bytes on the device: the capacity less every member's. */
size_t _vram_sim_shared_free(const vram_sim_shared *s);
/* Holds `bytes` more if the device has them, after taking back what dead members held;
 * VRAM_ENOMEM if not. */
int _vram_sim_shared_take(vram_sim_shared *s, size_t bytes);
void _vram_sim_shared_give(vram_sim_shared *s, size_t bytes);
/* "sim.<name>.<device>": the device as the processes sharing it name it (the give-back
 * group's name). */
void _vram_sim_shared_device_name(const vram_sim_shared *s, char *buf, size_t cap);
/* The file of shared sim `name`, `device` removed (tests clean up with it). 0 or -1. */
int _vram_sim_shared_remove(const char *name, int device);

#endif /* VRAM_SIM_SHARED_H */

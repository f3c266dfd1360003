/* giveback.h - the pool's side of the give-back group (obs/group.h, issue 39): a pool
 * joins the group of its device when it is made, keeps its figures there, answers its
 * neighbours' requests from a watcher thread, and, on the OOM ladder's last step, asks
 * them to give idle cached memory back before it fails.
 *
 * The watcher: one thread per process and group, started when the first pool that gives
 * back (the give_back option, on by default) joins. It sleeps on the group's request word;
 * woken, it takes each of its pools' locks in turn only for the release of whole idle
 * segments and granules (the release of the OOM ladder and vram_empty_cache: never a
 * live block), up to the bytes asked, and answers. The asker waits for the answers with
 * its own lock held, at most its give_back_timeout_ms: a neighbour that died, is stopped
 * or answers late costs that much and no more.
 *
 * fork: the child is no member (its copied pools neither ask nor answer) and has no
 * watcher; a pool it makes joins afresh. */
#ifndef VRAM_POOL_GIVEBACK_H
#define VRAM_POOL_GIVEBACK_H

#include <stdbool.h>
#include <stddef.h>

#include "pool/types.h"

/* Joins the group of the pool's device, if other processes can share it (a GPU, a shared
 * sim), with the pool's give-back options. VRAM_EINVAL for options out of range (a timeout
 * past its maximum, a fraction outside [0, 1]); a group that cannot be opened leaves the
 * pool out of it (a line on stderr), never failing. */
int _vram_giveback_join(vram_pool_t *pool);
/* Leaves (pool destroy, lock not held). */
void _vram_giveback_leave(vram_pool_t *pool);
/* The OOM ladder's last step, lock held: asks the group for what a request of `rounded`
 * bytes lacks and waits for the answers; true when any memory came back (retry). */
bool _vram_giveback_ask(vram_pool_t *pool, size_t rounded);
/* The pool's idle bytes to its group entry (slow path, lock held). */
void _vram_giveback_note_usage(vram_pool_t *pool);
/* For the published record: the idle bytes a request could get back, and the group limit
 * (0, 0 outside a group). */
void _vram_giveback_publish_figures(const vram_pool_t *pool, uint64_t *givable, uint64_t *limit);
/* The group limit this pool is under (0: none) and what the group reserves; false outside
 * a group. */
bool _vram_giveback_group_figures(const vram_pool_t *pool, uint64_t *limit, uint64_t *reserved);
/* The outcome of the request the failing call just made, for the OOM report; NULL if it
 * made none. Marks it reported. */
const struct vram_giveback_outcome *_vram_giveback_outcome(vram_pool_t *pool);

#endif /* VRAM_POOL_GIVEBACK_H */

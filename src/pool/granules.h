/* granules.h - physical backing of virtual-memory segments (vmm and sim:vmm sources):
 * which granules of a reserved range are mapped, and which of those no block uses. */
#ifndef VRAM_GRANULES_H
#define VRAM_GRANULES_H

#include "pool/types.h"

int _vram_granules_init(vram_pool_t *pool, vram_segment *seg);
void _vram_granules_destroy(vram_segment *seg);
/* Count the granules of [addr, addr+size) that are not mapped yet. */
size_t _vram_granules_unmapped_in(const vram_pool_t *pool, const vram_segment *seg, uintptr_t addr,
                                  size_t size);
/* The front `size` bytes of free block b are about to become a block in use: map what of
 * them is unmapped, and their granules are no longer idle. b is still free and unsplit. */
int _vram_granules_acquire(vram_pool_t *pool, vram_block *b, size_t size);
/* Map what of [addr, addr+size) is unmapped and leave it idle (a preallocation). */
int _vram_granules_map(vram_pool_t *pool, vram_segment *seg, uintptr_t addr, size_t size);
/* Block b, in use, is about to be freed and merged with its free neighbours: the granules
 * that will lie wholly in free space become idle (mapped, unused). */
void _vram_granules_release(vram_pool_t *pool, vram_block *b);
/* Unmap up to `want` idle granules of the pool (all when want == SIZE_MAX), waiting for
 * their arenas' streams first. Returns the number unmapped; the first failure goes to
 * *first_error (if non-NULL and still 0). */
size_t _vram_granules_trim(vram_pool_t *pool, size_t want, int *first_error);
/* The same, leaving alone granules [g0, g1) of seg (a span about to be mapped); failures
 * leave granules mapped and idle, tried again later. With `remember`, each span unmapped
 * is told to the placement policy (_vram_place_map_ghost). */
size_t _vram_granules_trim_outside(vram_pool_t *pool, size_t want, vram_segment *seg, size_t g0,
                                   size_t g1, bool remember);
size_t _vram_granules_idle_total(const vram_pool_t *pool);
/* The lowest address at or after `addr` where `size` bytes fit inside [addr, addr+span)
 * on granules that are all mapped already, in *start; false if there is none. */
bool _vram_granules_mapped_window(vram_pool_t *pool, vram_segment *seg, uintptr_t addr,
                                  size_t span, size_t size, uintptr_t *start);
/* Unmap every mapped granule of a segment (pool teardown). */
void _vram_granules_unmap_all(vram_pool_t *pool, vram_segment *seg);
bool _vram_granules_check(vram_pool_t *pool, vram_segment *seg);

#endif /* VRAM_GRANULES_H */

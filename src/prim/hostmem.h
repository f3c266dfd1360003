/* hostmem.h - host memory for the engine's own large tables (block slabs, pointer map).
 *
 * At a million live blocks these tables pass 100 MB and every allocator call touches them
 * at random; with 4 KiB pages each touch also misses the TLB. Tables of 2 MiB and up are
 * therefore mapped on 2 MiB boundaries and offered to the kernel's transparent huge pages
 * (madvise), as jemalloc can for its metadata (opt.metadata_thp). Smaller ones come from
 * aligned_alloc. Either way a table starts on a 64-byte cache line.
 */
#ifndef VRAM_PRIM_HOSTMEM_H
#define VRAM_PRIM_HOSTMEM_H

#include <stddef.h>

/* `bytes` of zeroed host memory, or NULL. Free with _vram_host_free and the same size. */
void *_vram_host_zalloc(size_t bytes);
void _vram_host_free(void *p, size_t bytes);

#endif /* VRAM_PRIM_HOSTMEM_H */

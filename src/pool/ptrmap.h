/* ptrmap.h - device pointer to the block handed out there (ptrmap.c says how it works).
 *
 * Every vram_malloc and vram_free looks up, inserts or removes, so those are inline, in
 * ptrmap_inline.h; ptrmap.c keeps the rare work (creating, growing, destroying). */
#ifndef VRAM_PTRMAP_H
#define VRAM_PTRMAP_H

#include "pool/types.h"

int _vram_ptrmap_init(vram_ptrmap *m, size_t entries);
void _vram_ptrmap_destroy(vram_ptrmap *m);
int _vram_ptrmap_grow(vram_ptrmap *m);

#include "pool/ptrmap_inline.h"

#endif /* VRAM_PTRMAP_H */

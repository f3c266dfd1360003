/* tlsf.h - the free-block index of each arena and kind (tlsf.c says how it works).
 *
 * The per-call operations (insert, remove, resize, find) are inline, in tlsf_inline.h,
 * because they run several times per vram_malloc and vram_free; tlsf.c keeps the rest. */
#ifndef VRAM_TLSF_H
#define VRAM_TLSF_H

#include "pool/types.h"

void _vram_tlsf_init(vram_tlsf *t);
size_t _vram_tlsf_largest(const vram_tlsf *t);
/* Walk every block of the index; returns false if visit returns false. */
bool _vram_tlsf_check(const vram_tlsf *t, bool (*visit)(void *ctx, const vram_block *b), void *ctx);

#include "pool/tlsf_inline.h"

#endif /* VRAM_TLSF_H */

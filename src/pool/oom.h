/* oom.h - out of memory: count it and keep the report that says why (oom.c). Called with
 * the pool's lock held, or during its creation. */
#ifndef VRAM_OOM_H
#define VRAM_OOM_H

#include "pool/types.h"

/* A request of `requested` bytes failed; max_request nonzero when it is past what the
 * device could ever hold. The report goes to vram_oom_report. */
void _vram_note_oom(vram_pool_t *pool, size_t requested, vram_stream_t stream,
                    size_t max_request);
/* The preallocation of the pool's creation failed: the report goes to vram_oom_report and
 * to the creating thread's vram_pool_create_report, since the pool will not be made. */
void _vram_note_preallocate_oom(vram_pool_t *pool, size_t bytes);
/* A creation starts: the thread's creation report no longer applies. */
void _vram_create_report_clear(void);
/* A creation refused for its options: why, in words naming them, as the thread's creation
 * report (no out-of-memory figures go with it). */
void _vram_create_report_refusal(const char *why);

#endif /* VRAM_OOM_H */

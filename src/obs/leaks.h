/* leaks.h - the C leak report (VRAMKIT_LEAK_REPORT=1): C call stacks captured at
 * allocation and kept in one process-wide table, and the report that groups the blocks
 * never freed by the call site that made them. The pool hands the live blocks down as plain
 * records; nothing here knows the pool. */
#ifndef VRAM_OBS_LEAKS_H
#define VRAM_OBS_LEAKS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Context ids of captured C stacks carry this bit, so that a report tells them from the
 * ids a vram_set_context_fn function hands out. */
#define VRAM_BACKTRACE_ID_BIT ((uint64_t)1 << 62)

/* Capture the calling thread's stack, from `call_site` (the return address into the code
 * that called vram_malloc) outward, and return its id (0 when it cannot be kept). */
uint64_t _vram_backtrace_capture(void *call_site);

/* One block never freed. */
typedef struct vram_leak_entry {
  uint64_t context;
  uint64_t size, requested;
} vram_leak_entry;

/* Print the blocks grouped by call site, the most bytes first. */
void _vram_leak_report(FILE *out, int device, vram_leak_entry *entries, size_t n);

#endif /* VRAM_OBS_LEAKS_H */

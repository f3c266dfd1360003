/* hostmem.c - zeroed, cache-line aligned host tables, large ones on transparent huge pages (hostmem.h says why). */
#define _GNU_SOURCE
#include "prim/hostmem.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE_PAGE ((size_t)2 << 20)

static size_t huge_round(size_t bytes) { return (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1); }

void *_vram_host_zalloc(size_t bytes) {
  if (bytes < HUGE_PAGE) {
    /* Cache-line aligned, so that 64-byte records never straddle two lines. */
    size_t size = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, size ? size : 64);
    if (p) memset(p, 0, size);
    return p;
  }
  size_t size = huge_round(bytes);
  if (size < bytes) return NULL;
  /* Over-map by one huge page and trim both ends, so the table starts on a 2 MiB
   * boundary where the kernel can back it with huge pages. Anonymous maps come zeroed. */
  size_t span = size + HUGE_PAGE;
  char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return NULL;
  char *start = (char *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
  if (start > raw) munmap(raw, (size_t)(start - raw));
  char *end = start + size, *raw_end = raw + span;
  if (raw_end > end) munmap(end, (size_t)(raw_end - end));
#ifdef MADV_HUGEPAGE
  madvise(start, size, MADV_HUGEPAGE); /* advice only: a kernel without THP ignores it */
#endif
  return start;
}

void _vram_host_free(void *p, size_t bytes) {
  if (!p) return;
  if (bytes < HUGE_PAGE) {
    free(p);
    return;
  }
  munmap(p, huge_round(bytes));
}

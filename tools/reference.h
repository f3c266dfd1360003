/* reference.h - the figures of other allocators that the vramkit command prints beside its
 * own, kept in one table (reference.c) together with where they were measured. */
#ifndef VRAMKIT_TOOLS_REFERENCE_H
#define VRAMKIT_TOOLS_REFERENCE_H

#include <stdint.h>

/* Peak memory reserved from the driver over peak live bytes, for one workload, under
 * PyTorch's caching allocator in its default mode ("native") and with
 * expandable_segments:True, and under cudaMallocAsync; 0 where nothing was measured.
 * The figures belong to an op sequence, not to a name: ops and peak_live_bytes are those
 * of the sequence measured (as vram_replay_describe counts them for a trace), and they are
 * what a lookup matches, so that a renamed or edited file is never given another trace's
 * figures. */
typedef struct reference_figures {
  const char *workload;     /* what was measured: a data/traces name, or "random" */
  uint64_t ops;             /* its allocations and frees */
  uint64_t peak_live_bytes; /* its peak of bytes live at once */
  double native;
  double expandable;
  double malloc_async;
} reference_figures_t;

/* Where the figures come from, one line for the help and the tables that show them. */
extern const char reference_provenance[];

/* The figures measured on the op sequence with these ops and peak live bytes, or NULL if
 * none were: the sequence's name plays no part. */
const reference_figures_t *reference_lookup(uint64_t ops, uint64_t peak_live_bytes);

#endif

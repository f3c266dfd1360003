/* reference.h - the figures of other allocators that the vramkit command prints beside its
 * own, kept in one table (reference.c) together with where they were measured. */
#ifndef VRAMKIT_TOOLS_REFERENCE_H
#define VRAMKIT_TOOLS_REFERENCE_H

/* Peak memory reserved from the driver over peak live bytes, for one workload, under
 * PyTorch's caching allocator in its default mode ("native") and with
 * expandable_segments:True, and under cudaMallocAsync; 0 where nothing was measured. */
typedef struct reference_figures {
  const char *workload;   /* a trace's name (file name without .trace.gz), or "random" */
  double native;
  double expandable;
  double malloc_async;
} reference_figures_t;

/* Where the figures come from, one line for the help and the tables that show them. */
extern const char reference_provenance[];

/* The figures for a trace or workload name, or NULL if none were measured for it. */
const reference_figures_t *reference_lookup(const char *workload);

#endif

/* replay.h - what the replay's files share (replay.c runs passes, capacity.c bisects and
 * holds the calls around them): a loaded trace behind the public handle, and one pass's
 * scratch and settings. */
#ifndef VRAMKIT_REPLAY_REPLAY_H
#define VRAMKIT_REPLAY_REPLAY_H

#include "replay/load.h"
#include "vramkit.h"

#include <stddef.h>
#include <stdint.h>

struct vram_replay_trace {
  trace_t trace;
};

/* One pass: the pointer of each slot and the stream of each trace stream, and how the pass
 * runs. report, while set, receives the first OOM and is cleared by it. */
typedef struct _vram_replay_pass {
  void **blocks;
  vram_stream_t *streams;
  int stop_at_oom, warm;
  size_t calls_after;             /* SIZE_MAX: not asked */
  vram_replay_result *report;
  void (*before_drain)(vram_pool_t *pool, void *context);
  void *context;
  size_t failed_at;               /* SIZE_MAX unless an op failed other than by OOM */
  int failed_status;
  int private_pools;              /* host-model pools of their own (_vram_pool_create_private) */
} _vram_replay_pass;

/* What one pass measured. */
typedef struct _vram_replay_run {
  double ns_per_op;
  uint64_t device_calls;        /* source allocations and releases of the timed pass */
  uint64_t device_calls_after;  /* those of the cold pass after its first calls_after ops */
  uint64_t peak_reserved;
  uint64_t ooms;
  vram_source_kind source;
} _vram_replay_run;

int _vram_replay_pass_init(_vram_replay_pass *pass, const trace_t *trace);
void _vram_replay_pass_close(_vram_replay_pass *pass);
/* One replay of the whole trace on a fresh pool; a vram_status (OOMs are not failures). */
int _vram_replay_once(const trace_t *trace, const vram_options_t *options,
                      _vram_replay_pass *pass, _vram_replay_run *run,
                      vram_replay_result *result);

#endif

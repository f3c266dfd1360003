/* format.h - what src/obs formats: statistics as a text table and as JSON, and the OOM
 * report, each from a snapshot the pool fills under its lock (pool/snapshot.c). The
 * formatters read nothing else: obs sits below the pool and never reaches into it. */
#ifndef VRAM_OBS_FORMAT_H
#define VRAM_OBS_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramkit.h"

/* Another process holding memory on the pool's GPU (the OOM report's neighbours): from
 * NVML on a real device, from the published records (obs/publish.h) for vramkit processes
 * and on sim. */
#define VRAM_NEIGHBOUR_UNKNOWN UINT64_MAX /* NVML gave no figure (or no NVML) */
typedef struct vram_neighbour {
  int pid;
  char name[64];
  uint64_t used_bytes;       /* NVML's used memory of the process, or VRAM_NEIGHBOUR_UNKNOWN */
  bool is_vramkit;           /* it publishes a record: the figures below are its own */
  uint64_t reserved_bytes, allocated_bytes, cached_free_bytes;
} vram_neighbour;

typedef struct vram_neighbours {
  int count;                 /* entries in `list` */
  int total;                 /* all the processes found, listed or not */
  vram_neighbour list[VRAM_OOM_MAX_NEIGHBOURS];
  char note[192];            /* why NVML's view is missing, or "" */
} vram_neighbours;

/* The last request this pool made to its give-back group (pool/giveback.h), for the OOM
 * report: who was asked, who answered in time, and what each gave back. */
#define VRAM_GIVEBACK_MAX_LISTED 8
typedef struct vram_giveback_answer {
  int pid;
  char name[64];             /* escaped (obs/escape.h) */
  uint64_t given_bytes;      /* given back for this request */
  bool answered;             /* answered before the asker's time was up */
} vram_giveback_answer;

typedef struct vram_giveback_outcome {
  bool fresh;                /* made by the request that is failing now */
  uint64_t wanted_bytes, received_bytes, timeout_ms;
  int asked;                 /* members asked, listed or not */
  int count;                 /* entries in `list` */
  vram_giveback_answer list[VRAM_GIVEBACK_MAX_LISTED];
} vram_giveback_outcome;

/* One pool at one moment. */
typedef struct vram_pool_snapshot {
  int device;
  const char *source_name;  /* "sim", "cuda", ... */
  vram_source_kind source;
  bool is_vmm;              /* the source maps granules where they are needed */
  double tight_threshold;   /* vram_options_t.tight_threshold */
  bool fixed_large;         /* large requests get fixed segments, where tight placement acts */
  double virtual_threshold; /* vram_options_t.virtual_threshold; 1 where it cannot apply */
  bool grows_virtual;       /* fixed source whose pool went on to virtual ranges */
  vram_stats_t stats;       /* derived statistics filled in */
  size_t cached_free;       /* bytes reserved but not in use */
  size_t device_total;      /* the device's capacity */
  size_t device_free;       /* free on the device, as the source says (OOM report only) */
  size_t granularity;       /* the smallest segment or mapping the pool takes; 0: unknown */
  size_t preallocated;      /* bytes held for good since creation (VRAMKIT_PREALLOCATE), or 0 */
  const vram_neighbours *neighbours; /* OOM report only, NULL elsewhere or when none asked */
  const vram_giveback_outcome *giveback; /* OOM report only: the give-back just asked, or NULL */
} vram_pool_snapshot;

/* A request the pool refused. */
typedef struct vram_oom_request {
  size_t size;              /* bytes asked for */
  vram_stream_t stream;     /* NULL: the default stream */
  size_t max_request;       /* nonzero when size is more than the device could ever hold */
  bool preallocate;         /* the up-front reservation of the pool's creation failed */
} vram_oom_request;

/* Each returns the length of the full text, like snprintf, and writes at most cap bytes. */
int _vram_format_summary(const vram_pool_snapshot *snap, char *buf, size_t cap);
int _vram_format_stats_json(const vram_stats_t *s, char *buf, size_t cap);
/* The figures and cause of a refused request (vram_oom_info_t), from the snapshot taken at
 * the failure; the report is then written from them, so that text and figures agree. */
void _vram_oom_info_fill(const vram_pool_snapshot *snap, const vram_oom_request *req,
                         vram_oom_info_t *info);
int _vram_format_oom_report(const vram_pool_snapshot *snap, const vram_oom_request *req,
                            const vram_oom_info_t *info, char *buf, size_t cap);

#endif /* VRAM_OBS_FORMAT_H */

/* types.h - the engine's data structures, shared by the files of src/pool.
 *
 * Picture: a pool (one per device) holds arenas, one per stream. An arena holds two kinds
 * of segments kept apart: small (requests up to VRAM_SMALL_MAX, carved from 2 MiB
 * segments) and large. A segment is a run of device addresses from the source, divided
 * into blocks linked by address so that a freed block coalesces with its neighbours in
 * O(1) (block.h). Free blocks sit in a two-level segregated-fit index (tlsf.h) per arena
 * and kind; blocks handed out (live, pending, or parked in the arena's one-block cache) are
 * found from their pointer through an open-addressing hash (ptrmap.h). Segments come from
 * and go back to the source (segment.h); frees seen by other streams wait for events
 * (pending.h).
 *
 * Virtual-memory sources (vmm, sim:vmm) use the same blocks over one large reserved
 * address range per arena and kind; only the granules that live blocks touch are mapped
 * (granules.h keeps a use count and a mapped bit per granule).
 *
 * All metadata lives on the host. Everything here is guarded by the pool's one lock.
 */
#ifndef VRAM_TYPES_H
#define VRAM_TYPES_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

#include "vramkit.h"
#include "pool/lock.h"
#include "source/source.h"

#define VRAM_ALIGN ((size_t)512)               /* block alignment and size unit */
#define VRAM_SMALL_MAX ((size_t)1 << 20)       /* requests up to this go to small segments */
#define VRAM_SMALL_SEGMENT ((size_t)2 << 20)   /* size of one small segment */
/* Virtual memory: idle granules stay mapped while the pool holds at most its allocated peak
 * plus 1/2^this of it (placement.c, mapped_allowance). */
#define VRAM_VMM_SLACK_SHIFT 6
/* Fixed segments: how many sizes the peak guard remembers giving back (placement.c,
 * guard_peak). Few enough that sizes which do not come back are soon forgotten, enough for
 * a training loop's segments: see Note [How many ghosts] in docs/performance.md. */
#define VRAM_GUARD_GHOSTS 8
/* Virtual memory far from the cap: how many spans that the mapped allowance unmapped the
 * pool remembers (placement.c, Note [The kept regime's allowance]). */
#define VRAM_MAP_GHOSTS 16
/* Virtual memory far from the cap: granules per mapping at most, one physical handle each
 * (placement.h, _vram_place_map_unit): 128 MiB at 2 MiB granules, where a handle's cost is still
 * close to one granule's (bench/vmm_cost.c). */
#define VRAM_VMM_MAP_UNIT ((size_t)64)
/* Far from the cap the allowance's slack is at least two such mappings, but in a small pool
 * at most 1/2^this of its allocated peak (at least the granules below), doubled each
 * VRAM_VMM_TRIMS_PER_DOUBLING times the allowance takes back idle mappings of at least a
 * quarter of the slack (placement.c, kept_slack). */
#define VRAM_VMM_KEPT_SLACK_SHIFT 4
#define VRAM_VMM_KEPT_SLACK_MIN_GRANULES 16
#define VRAM_VMM_TRIMS_PER_DOUBLING 2
/* No device addresses more than this: larger requests are refused as out of memory before
 * any rounding, which could otherwise overflow. */
#define VRAM_MAX_REQUEST ((size_t)1 << 48)

/* Assertion levels, after mimalloc: 1 cheap, 2 more, 3 full invariant check per operation. */
#if VRAM_DEBUG >= 1
#include <assert.h>
#define vram_assert(x) assert(x)
#else
#define vram_assert(x) ((void)0)
#endif

typedef struct vram_block vram_block;
typedef struct vram_segment vram_segment;
typedef struct vram_arena vram_arena;
typedef struct vram_placement vram_placement;

/* CACHED: just freed and parked in its arena's one-block cache, not yet coalesced, so that
 * the next request of the same size on the same stream takes it back without touching the
 * free index (the alloc-free-alloc loop of a training step). It is free memory for the
 * statistics and for the user, but stays in the pointer map and in its segment's usage;
 * it is merged when another request misses, when the next free displaces it, and before
 * memory goes back to the source. */
enum vram_block_state {
  VRAM_BLOCK_FREE = 0,
  VRAM_BLOCK_LIVE = 1,
  VRAM_BLOCK_PENDING = 2,
  VRAM_BLOCK_CACHED = 3
};

/* Extra streams a live block is used on (vram_record_stream). Rare, so kept apart. A block
 * of one stream's arena lent to a request on another (pool.c, alloc_borrowed) lists that
 * stream first, and `borrowed` says so: the block's own stream is then streams[0]. */
typedef struct vram_stream_uses {
  int count, capacity;
  bool borrowed;
  vram_stream_t streams[];
} vram_stream_uses;

/* One cache line per block: a block is free or in use, never both, so the free-index links
 * share their bytes with what only a block in use needs. At a million live blocks every
 * struct a call touches is a cache miss; 64 aligned bytes make it one miss, not two. */
struct vram_block {
  uintptr_t addr;
  size_t size;                       /* multiple of VRAM_ALIGN */
  vram_block *addr_prev, *addr_next; /* address neighbours in the segment */
  vram_segment *segment;
  union {
    struct {                         /* FREE: links of the free index */
      vram_block *free_prev, *free_next;
    };
    struct {                         /* LIVE, PENDING, CACHED */
      size_t requested;              /* bytes asked for; 0 while parked */
      vram_stream_uses *uses;        /* other streams (record_stream), or NULL */
    };
  };
  uint8_t state;                     /* enum vram_block_state */
  uint8_t bin_fl, bin_sl;            /* free: the index bin it sits in (saves remapping) */
  uint32_t events_left;              /* pending: events still to complete */
};
_Static_assert(sizeof(vram_block) == 64, "a block is one cache line");

/* Free-block index: two-level segregated fit over sizes in VRAM_ALIGN units. */
#define VRAM_TLSF_SL_LOG2 4
#define VRAM_TLSF_SL_COUNT (1 << VRAM_TLSF_SL_LOG2)
#define VRAM_TLSF_FL_COUNT 48
typedef struct vram_tlsf {
  uint64_t fl_bitmap;
  uint32_t sl_bitmap[VRAM_TLSF_FL_COUNT];
  vram_block *heads[VRAM_TLSF_FL_COUNT][VRAM_TLSF_SL_COUNT];
  size_t free_bytes;  /* sum of the sizes of the blocks in the index */
} vram_tlsf;

/* What every malloc and free of a block reads comes first, in the segment's first cache
 * line (segments come from _vram_host_zalloc, 64-byte aligned): at a million live blocks
 * the segment is a miss behind the block's, and spread over two lines it would be two. */
struct vram_segment {
  size_t used_bytes;      /* bytes of live, pending and parked (cached) blocks */
  vram_tlsf *index;       /* the arena's free index and one-block cache for this kind: */
  vram_block **cached;    /* resolved once, not per call */
  uint64_t *gran_mapped;  /* virtual memory only (below), else NULL: what tells the kinds apart */
  bool is_small;
  bool keep;              /* preallocated: empty_cache and the ladder leave it alone */
  bool idle;              /* fixed sources: on the pool's list of fully free segments */
  uintptr_t addr;
  size_t size;            /* fixed: bytes held from the source; vmm: bytes reserved */
  vram_arena *arena;
  vram_segment *prev, *next;
  vram_block *first;      /* lowest-address block */
  vram_segment *idle_prev, *idle_next;
  /* Virtual memory only (NULL otherwise): bitmaps of the mapped granules (gran_mapped,
   * above) and of the idle ones, mapped and lying wholly in free space, so that no live,
   * pending or parked block touches them (granules.c). */
  uint64_t *gran_idle;
  uint64_t *gran_head;    /* first granule of each mapping (one physical handle each) */
  size_t n_granules;
  size_t gran_hwm;        /* granules at and above this index were never mapped */
  size_t mapped_granules;
  size_t idle_granules;
  uint64_t context;       /* the history context of the call that made it (0: none), which
                             its segment_free carries when the call freeing it has none */
};
_Static_assert(offsetof(vram_segment, idle) < 64, "a segment's hot fields share its first line");

struct vram_arena {
  vram_stream_t stream;
  vram_tlsf free_small, free_large;
  /* Virtual growth (vram_options_t.virtual_threshold): once the arena's large requests go
   * to a virtual range, the free blocks of its fixed large segments move here, where no
   * request looks except the last step before an out-of-memory; the segments drain. */
  vram_tlsf retired;
  bool grows_virtual;
  vram_segment *segments; /* doubly linked list, both kinds */
  vram_block *cached_small, *cached_large; /* the one-block caches, or NULL */
  /* On the pool's list of arenas whose caches a flush must look at (block.h). */
  bool cache_listed;
  vram_arena *cache_next;
  vram_arena *next;
  void *release_event;    /* recorded on `stream` before memory of this arena is released */
  uint64_t quiesced_at;   /* pool release epoch at which the stream was last waited for */
};

/* Pointer -> live, pending or parked block. Open addressing, linear probing, backward-shift
 * deletion; never more than a quarter full: VRAM_PTRMAP_SLOTS_PER_ENTRY slots per entry. */
#define VRAM_PTRMAP_SLOTS_PER_ENTRY 4
typedef struct vram_ptrmap_slot {
  uintptr_t key; /* 0 = empty */
  vram_block *value;
} vram_ptrmap_slot;

/* Key and value share a slot so that a lookup in a table far larger than the cache costs
 * one miss, not two. */
typedef struct vram_ptrmap {
  vram_ptrmap_slot *slots;
  size_t mask;     /* capacity - 1 */
  unsigned shift;  /* 64 - log2(capacity): keeps the top, well-mixed bits of the hash */
  size_t count;
} vram_ptrmap;

/* A cross-stream free waiting for an event (vram_record_stream). */
typedef struct vram_pending {
  vram_block *block;
  void *event;
  struct vram_pending *next;
} vram_pending;

/* Host structs come from slabs and go back to a free list: no malloc on the hot path. */
/* The share of the statistics of one kind of segment, small or large, PyTorch's two pools
 * (kinds.h keeps it, kinds.c reports it): what malloc, free, segments and pending frees
 * move, and the active peaks as the pool's own are kept. */
typedef struct vram_kind_counts {
  vram_stat_t allocated_bytes, requested_bytes, allocation, reserved_bytes, segment;
  size_t pending_bytes, pending_blocks;
  int64_t active_bytes_peak, active_peak;
} vram_kind_counts;

typedef struct vram_block_cache {
  vram_block *free_list;
  void **slabs;
  size_t n_slabs, slab_capacity;
} vram_block_cache;

struct vram_pool {
  /* What every malloc and free touches comes first, on as few cache lines as possible. */
  vram_lock lock;
  bool unified_index;      /* preallocate mode: small requests share the large index */
  bool split_stats;        /* vram_options_t.split_stats: malloc and free move kinds[] too */
  bool no_split;           /* vram_options_t.no_split: a block is its whole segment */
  size_t max_request;      /* larger requests can never be served (VRAM_ENOMEM at once) */
  unsigned pending_tick;   /* allocations since pending frees were last looked at */
  /* This pool's slot of the process's published record (pool/published.h), NULL when it
   * publishes nothing: malloc and free store their counters there. */
  struct vram_device_record *published;
  vram_arena *last_arena;  /* one-entry cache for the common single-stream case */
  /* Memory history (obs/history.h), NULL while nothing records. history_flags (VRAM_REC_*,
   * pool/events.h) is read outside the lock: nonzero sends malloc and free down the
   * recording path, so that with history off each costs one predictable branch. */
  atomic_uint history_flags;
  struct vram_history *history;
  vram_ptrmap ptrs;
  size_t pending_count;
  /* Blocks waiting on events (PENDING) are not allocated but still active. The active
   * statistics are derived from the allocated ones plus these (snapshot.c), so that malloc
   * and free move three counters, not five; the peaks cover the moments blocks waited. */
  size_t pending_bytes, pending_blocks;
  int64_t active_bytes_peak, active_peak;
  vram_block_cache blocks;
  vram_stats_t stats;

  vram_options_t opts;
  const vram_source_methods *src;
  void *src_state;
  size_t granularity;     /* source's segment / mapping unit, a power of two */
  unsigned granule_shift; /* its log2: granule indices are shifts (granules.c) */
  size_t device_total;    /* total device memory, for fractions */
  size_t kept_ceiling;    /* virtual_threshold of device_total, in bytes (placement.h) */
  size_t limit;           /* hard limit on reserved bytes; 0 = none */
  /* The pool's membership of its device's give-back group (pool/giveback.h), or NULL. */
  struct vram_giveback *giveback;

  vram_arena *arenas;
  /* Arenas whose one-block cache was filled since the last flush (block.h): a flush, which
   * the peak guard runs at every growth past the peak, visits these, not every arena. */
  vram_arena *cache_arenas;
  /* Stream -> arena, open addressing at most half full (NULL = empty slot), so that a
   * program with many streams pays one probe per arena switch, not a walk of the list.
   * What still walks every arena: an OOM's report, statistics and snapshots. */
  vram_arena **arena_slots;
  size_t arena_mask;        /* capacity - 1; 0 while no arena exists */
  size_t arena_count;
  /* The published record's cached and largest free bytes walk every arena; with many
   * arenas the walk runs on one call in arena_count / VRAM_PUBLISH_WALK_ARENAS
   * (published.c), and the calls between publish these last values. */
  size_t published_cached, published_largest;
  size_t publish_calls;
  /* Fixed sources: fully free segments, most recently freed at the head, so that release
   * gives back the longest-unused first without scanning every segment. */
  vram_segment *idle_head, *idle_tail;
  size_t idle_bytes;
  uint64_t release_epoch;
  /* The peak guard (placement.c): sizes of the segments it gave back lately, a ring (0 =
   * empty), and the ceiling it lets reserved memory reach since one came back (0 = the
   * peak). */
  size_t guard_ghosts[VRAM_GUARD_GHOSTS];
  unsigned guard_ghost_next;
  bool guard_releasing;
  size_t guard_ceiling;
  /* The mapped allowance far from the cap (placement.c): address spans it unmapped lately,
   * a ring ([0, 0) = empty), and the ceiling that mapping one of them again raised (0 =
   * none). */
  struct { uintptr_t lo, hi; } map_ghosts[VRAM_MAP_GHOSTS];
  unsigned map_ghost_next;
  size_t map_ceiling;
  unsigned kept_trims;    /* times the allowance took idle mappings back far from the cap */
  vram_pending *pending_head, *pending_tail;
  void **spare_events;    /* created events ready to record again */
  size_t n_spare_events, cap_spare_events;

  size_t vmm_reserve_size; /* virtual range reserved per vmm segment */
  /* The placement policy's table for the pool's memory mode (placement.h), which sets
   * has_virtual and unified_index, the mode as the hot path reads it. */
  const vram_placement *place;
  bool has_virtual;         /* a virtual range (granules.c) was reserved at some point */
  size_t keep_mapped;      /* vmm preallocation: granules never trimmed below this */
  size_t preallocated;     /* bytes held for good since creation (preallocate mode), or 0 */

  vram_error_fn on_error;
  void *on_error_user;
  char oom_report[2048];
  vram_oom_info_t oom_info;  /* the figures of the last OOM; cause -1: none yet */
  /* Cold: PyTorch's small and large rows (split_stats) and its count of waits. */
  vram_kind_counts kinds[2]; /* [1] small segments, [0] large ones */
  uint64_t num_sync_all_streams;
};

/* ---- statistics: an increase moves total and maybe peak; a decrease only current.
 * Current and peak stay below the capacity; total sums every increase for as long as the
 * pool lives, so it stops at INT64_MAX rather than wrapping to a negative figure. */
static inline void vram_stat_up(vram_stat_t *s, int64_t delta) {
  s->current += delta;
  if (__builtin_add_overflow(s->total, delta, &s->total)) s->total = INT64_MAX;
  if (s->current > s->peak) s->peak = s->current;
}
static inline void vram_stat_down(vram_stat_t *s, int64_t delta) { s->current -= delta; }

/* An active statistic from its allocated one: blocks waiting on events are active too, and
 * each block became active once, at its malloc; the peak is the higher of the allocated
 * peak and the one noted while blocks waited. */
static inline vram_stat_t vram_active_stat(const vram_stat_t *allocated, int64_t pending,
                                           int64_t waiting_peak) {
  vram_stat_t out = {allocated->current + pending,
                     allocated->peak > waiting_peak ? allocated->peak : waiting_peak,
                     allocated->total};
  return out;
}

/* The steps of a malloc or a free, written as functions in the headers of src/pool and
 * inlined into vram_malloc and vram_free, so that one call does not pay the register
 * saves of five. */
#define VRAM_HOT static inline __attribute__((always_inline))
/* The rare branch of a hot step, kept out of line so that the common one stays small. */
#define VRAM_NOINLINE __attribute__((noinline))

static inline size_t _vram_round_up(size_t n, size_t unit) { return (n + unit - 1) & ~(unit - 1); }


#endif /* VRAM_TYPES_H */

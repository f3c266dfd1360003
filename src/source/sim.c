/* sim.c - the host-only sources: "sim" models the cuda source (cuMemAlloc's fixed segments,
 * and the virtual ranges it grows into near its cap) and "sim:vmm" the virtual-memory
 * source (reserve, map and unmap at 2 MiB granularity). Both count one capacity.
 *
 * The sim is a real source, not a mock: it hands out device-like addresses that no host
 * page backs (never dereference them), enforces a capacity, rounds fixed segments up to
 * 2 MiB as the driver does, and checks the engine's use of it as the driver would (mapping a
 * mapped granule, unmapping an unmapped one, or unmapping part of a mapping is an error).
 * Events complete after a configurable number of queries, or at once when synchronized, so
 * cross-stream ordering can be tested. Every fragmentation figure of the project is
 * measured on it.
 *
 * With VRAMKIT_SIM_SHARED=<name> the capacity is one that several processes share
 * (sim_shared.h): every byte mapped or allocated is also taken from the shared total, and
 * mem_info reports the shared free. Without it, nothing here looks at the shared file. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "source/sim_shared.h"
#include "source/source.h"

#define SIM_GRANULE ((size_t)2 << 20)
/* Addresses far from host heaps. Each device gets 2^56 bytes of them: a pool reserves a
 * virtual range of 1.25 times the capacity per arena and kind, so at the largest capacity
 * (VRAM_SIM_MAX_CAPACITY, 2^48) some two hundred ranges fit, and the eight devices end
 * below 2^60. */
#define SIM_BASE ((uintptr_t)1 << 44)
#define SIM_DEVICE_SPAN ((uintptr_t)1 << 56)

typedef struct sim_range {
  uintptr_t addr;
  size_t size;
} sim_range;

/* A reserved virtual range of sim:vmm, with one byte per granule: GRANULE_UNMAPPED, or the
 * first granule of a mapping (one physical handle), or one that continues it. */
enum { GRANULE_UNMAPPED, GRANULE_HEAD, GRANULE_TAIL };
typedef struct sim_reservation {
  uintptr_t addr;
  size_t size;
  uint8_t *mapped;
  size_t n_mapped; /* granules mapped: unreserving a range of 2^48 bytes scans nothing */
} sim_reservation;

typedef struct sim_state {
  size_t capacity, used;
  int event_delay;
  uintptr_t next_addr, end_addr;
  sim_range *holes; /* freed address ranges, sorted by address, coalesced */
  size_t n_holes, cap_holes;
  sim_reservation *res;
  size_t n_res, cap_res;
  vram_sim_shared *shared; /* VRAMKIT_SIM_SHARED: the device other processes share; or NULL */
} sim_state;

typedef struct sim_event {
  int remaining;
} sim_event;

static int sim_open(const vram_source_config *cfg, void **out) {
  if (cfg->device < 0 || cfg->device >= VRAM_SIM_DEVICES) return VRAM_EDEVICE;
  /* Past the largest capacity the address space above and the granule tables of a
   * reserved range (one byte per 2 MiB of it) stop being what a sim can hold. */
  if (cfg->sim_capacity == 0 || cfg->sim_capacity > VRAM_SIM_MAX_CAPACITY)
    return VRAM_ESIMCAPACITY;
  sim_state *s = calloc(1, sizeof *s);
  if (!s) return VRAM_EHOSTMEM;
  s->capacity = cfg->sim_capacity;
  s->event_delay = cfg->sim_event_delay;
  s->next_addr = SIM_BASE + (uintptr_t)cfg->device * SIM_DEVICE_SPAN;
  s->end_addr = s->next_addr + SIM_DEVICE_SPAN;
  const char *shared_name = cfg->private_device ? NULL : getenv("VRAMKIT_SIM_SHARED");
  if (shared_name && *shared_name) {
    int rc = _vram_sim_shared_join(shared_name, cfg->device, s->capacity, &s->shared);
    if (rc) {
      free(s);
      return rc;
    }
    s->capacity = _vram_sim_shared_capacity(s->shared);
  }
  *out = s;
  return VRAM_OK;
}

static void sim_close(void *state) {
  sim_state *s = state;
  for (size_t i = 0; i < s->n_res; i++) free(s->res[i].mapped);
  free(s->res);
  free(s->holes);
  _vram_sim_shared_leave(s->shared);
  free(s);
}

static size_t sim_granularity(void *state) { return SIM_GRANULE; }

static int sim_mem_info(void *state, size_t *free_bytes, size_t *total_bytes) {
  sim_state *s = state;
  *free_bytes = s->shared ? _vram_sim_shared_free(s->shared) : s->capacity - s->used;
  *total_bytes = s->capacity;
  return VRAM_OK;
}

/* Device memory for `bytes` more: this process's count, and the shared one's too. */
static int device_take(sim_state *s, size_t bytes) {
  if (bytes > s->capacity - s->used) return VRAM_ENOMEM;
  if (s->shared) return _vram_sim_shared_take(s->shared, bytes);
  return VRAM_OK;
}

static void device_give(sim_state *s, size_t bytes) {
  if (s->shared) _vram_sim_shared_give(s->shared, bytes);
}

static void sim_group_name(void *state, char *buf, size_t cap) {
  sim_state *s = state;
  buf[0] = 0;
  if (s->shared) _vram_sim_shared_device_name(s->shared, buf, cap);
}

/* Address space: first fit among freed ranges, else the untouched end. */
static int space_take(sim_state *s, size_t size, uintptr_t *addr) {
  for (size_t i = 0; i < s->n_holes; i++) {
    if (s->holes[i].size < size) continue;
    *addr = s->holes[i].addr;
    s->holes[i].addr += size;
    s->holes[i].size -= size;
    if (!s->holes[i].size) {
      memmove(&s->holes[i], &s->holes[i + 1], (s->n_holes - i - 1) * sizeof *s->holes);
      s->n_holes--;
    }
    return VRAM_OK;
  }
  if (size > s->end_addr - s->next_addr) return VRAM_ENOMEM;
  *addr = s->next_addr;
  s->next_addr += size;
  return VRAM_OK;
}

static int space_give(sim_state *s, uintptr_t addr, size_t size) {
  size_t i = 0;
  while (i < s->n_holes && s->holes[i].addr < addr) i++;
  bool merge_prev = i > 0 && s->holes[i - 1].addr + s->holes[i - 1].size == addr;
  bool merge_next = i < s->n_holes && addr + size == s->holes[i].addr;
  if (merge_prev && merge_next) {
    s->holes[i - 1].size += size + s->holes[i].size;
    memmove(&s->holes[i], &s->holes[i + 1], (s->n_holes - i - 1) * sizeof *s->holes);
    s->n_holes--;
  } else if (merge_prev) {
    s->holes[i - 1].size += size;
  } else if (merge_next) {
    s->holes[i].addr = addr;
    s->holes[i].size += size;
  } else {
    if (s->n_holes == s->cap_holes) {
      size_t cap = s->cap_holes ? s->cap_holes * 2 : 16;
      sim_range *grown = realloc(s->holes, cap * sizeof *grown);
      if (!grown) return VRAM_EHOSTMEM;
      s->holes = grown;
      s->cap_holes = cap;
    }
    memmove(&s->holes[i + 1], &s->holes[i], (s->n_holes - i) * sizeof *s->holes);
    s->holes[i].addr = addr;
    s->holes[i].size = size;
    s->n_holes++;
  }
  return VRAM_OK;
}

static int sim_alloc(void *state, size_t size, vram_stream_t stream, uintptr_t *addr) {
  sim_state *s = state;
  (void)stream;
  if (!size) return VRAM_EINVAL;
  size_t rounded = (size + SIM_GRANULE - 1) & ~(SIM_GRANULE - 1);
  if (rounded < size) return VRAM_ENOMEM;
  int rc = device_take(s, rounded);
  if (rc) return rc;
  rc = space_take(s, rounded, addr);
  if (rc) {
    device_give(s, rounded);
    return rc;
  }
  s->used += rounded;
  return VRAM_OK;
}

static int sim_free(void *state, uintptr_t addr, size_t size, vram_stream_t stream) {
  sim_state *s = state;
  (void)stream;
  size_t rounded = (size + SIM_GRANULE - 1) & ~(SIM_GRANULE - 1);
  if (rounded > s->used) return VRAM_EINVAL;
  int rc = space_give(s, addr, rounded);
  if (rc) return rc;
  s->used -= rounded;
  device_give(s, rounded);
  return VRAM_OK;
}

/* ---- sim:vmm */

static sim_reservation *reservation_of(sim_state *s, uintptr_t addr, size_t size) {
  for (size_t i = 0; i < s->n_res; i++) {
    sim_reservation *r = &s->res[i];
    if (addr >= r->addr && addr + size <= r->addr + r->size) return r;
  }
  return NULL;
}

static int sim_reserve(void *state, size_t size, uintptr_t *addr) {
  sim_state *s = state;
  if (!size || size % SIM_GRANULE) return VRAM_EINVAL;
  if (s->n_res == s->cap_res) {
    size_t cap = s->cap_res ? s->cap_res * 2 : 8;
    sim_reservation *grown = realloc(s->res, cap * sizeof *grown);
    if (!grown) return VRAM_EHOSTMEM;
    s->res = grown;
    s->cap_res = cap;
  }
  uint8_t *mapped = calloc(size / SIM_GRANULE, 1);
  if (!mapped) return VRAM_EHOSTMEM;
  int rc = space_take(s, size, addr);
  if (rc) {
    free(mapped);
    return rc;
  }
  s->res[s->n_res++] = (sim_reservation){*addr, size, mapped, 0};
  return VRAM_OK;
}

static int sim_unreserve(void *state, uintptr_t addr, size_t size) {
  sim_state *s = state;
  for (size_t i = 0; i < s->n_res; i++) {
    sim_reservation *r = &s->res[i];
    if (r->addr != addr || r->size != size) continue;
    if (r->n_mapped) return VRAM_EINVAL; /* the driver refuses to free a mapped range */
    int rc = space_give(s, addr, size);
    if (rc) return rc;
    free(r->mapped);
    s->res[i] = s->res[--s->n_res];
    return VRAM_OK;
  }
  return VRAM_EINVAL;
}

/* The granules [*g0, *g0 + *n) of a reservation that [addr, addr+size) names, if it is a
 * granule-aligned range inside one reservation whose granules are all mapped (want_mapped)
 * or all unmapped; the driver refuses anything else, and so does the sim. */
static sim_reservation *granule_span(sim_state *s, uintptr_t addr, size_t size, bool want_mapped,
                                     size_t *g0, size_t *n) {
  sim_reservation *r = reservation_of(s, addr, size);
  if (!r || !size || (addr - r->addr) % SIM_GRANULE || size % SIM_GRANULE) return NULL;
  *g0 = (addr - r->addr) / SIM_GRANULE;
  *n = size / SIM_GRANULE;
  for (size_t g = *g0; g < *g0 + *n; g++)
    if ((r->mapped[g] != GRANULE_UNMAPPED) != want_mapped) return NULL;
  if (want_mapped) {
    /* Whole mappings only: the range starts one and the next granule does not go on one. */
    size_t end = *g0 + *n;
    if (r->mapped[*g0] != GRANULE_HEAD) return NULL;
    if (end < r->size / SIM_GRANULE && r->mapped[end] == GRANULE_TAIL) return NULL;
  }
  return r;
}

static int sim_map(void *state, uintptr_t addr, size_t size) {
  sim_state *s = state;
  size_t g0, n;
  sim_reservation *r = granule_span(s, addr, size, false, &g0, &n);
  if (!r) return VRAM_EINVAL;
  int rc = device_take(s, size);
  if (rc) return rc;
  r->mapped[g0] = GRANULE_HEAD;
  memset(r->mapped + g0 + 1, GRANULE_TAIL, n - 1);
  r->n_mapped += n;
  s->used += size;
  return VRAM_OK;
}

static int sim_unmap(void *state, uintptr_t addr, size_t size) {
  sim_state *s = state;
  size_t g0, n;
  sim_reservation *r = granule_span(s, addr, size, true, &g0, &n);
  if (!r) return VRAM_EINVAL;
  memset(r->mapped + g0, GRANULE_UNMAPPED, n);
  r->n_mapped -= n;
  s->used -= size;
  device_give(s, size);
  return VRAM_OK;
}

static int sim_enable_peer(void *state, int peer) {
  return peer >= 0 && peer < VRAM_SIM_DEVICES ? VRAM_OK : VRAM_EDEVICE;
}

/* ---- events */

static int sim_event_create(void *state, void **event) {
  sim_event *e = calloc(1, sizeof *e);
  if (!e) return VRAM_EHOSTMEM;
  *event = e;
  return VRAM_OK;
}

static void sim_event_destroy(void *state, void *event) { free(event); }

static int sim_event_record(void *state, void *event, vram_stream_t stream) {
  ((sim_event *)event)->remaining = ((sim_state *)state)->event_delay;
  return VRAM_OK;
}

static int sim_event_query(void *state, void *event) {
  sim_event *e = event;
  if (e->remaining <= 0) return 1;
  e->remaining--;
  return 0;
}

static int sim_event_synchronize(void *state, void *event) {
  ((sim_event *)event)->remaining = 0;
  return VRAM_OK;
}

/* The sim runs no work, so there is nothing to order; the wait is the driver's call that a
 * replay on the sim stands for. */
static int sim_stream_wait_event(void *state, vram_stream_t stream, void *event) {
  (void)state, (void)stream, (void)event;
  return VRAM_OK;
}

const vram_source_methods _vram_source_sim = {
    .zName = "sim",
    .is_vmm = 0,
    .xOpen = sim_open,
    .xClose = sim_close,
    .xGranularity = sim_granularity,
    .xMemInfo = sim_mem_info,
    .xAlloc = sim_alloc,
    .xFree = sim_free,
    .xReserve = sim_reserve,
    .xUnreserve = sim_unreserve,
    .xMap = sim_map,
    .xUnmap = sim_unmap,
    .xEventCreate = sim_event_create,
    .xEventDestroy = sim_event_destroy,
    .xEventRecord = sim_event_record,
    .xEventQuery = sim_event_query,
    .xEventSynchronize = sim_event_synchronize,
    .xStreamWaitEvent = sim_stream_wait_event,
    .xGroupName = sim_group_name,
};

const vram_source_methods _vram_source_sim_vmm = {
    .zName = "sim:vmm",
    .is_vmm = 1,
    .xOpen = sim_open,
    .xClose = sim_close,
    .xGranularity = sim_granularity,
    .xMemInfo = sim_mem_info,
    .xReserve = sim_reserve,
    .xUnreserve = sim_unreserve,
    .xMap = sim_map,
    .xUnmap = sim_unmap,
    .xEnablePeer = sim_enable_peer,
    .xEventCreate = sim_event_create,
    .xEventDestroy = sim_event_destroy,
    .xEventRecord = sim_event_record,
    .xEventQuery = sim_event_query,
    .xEventSynchronize = sim_event_synchronize,
    .xStreamWaitEvent = sim_stream_wait_event,
    .xGroupName = sim_group_name,
};

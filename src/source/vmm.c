/* vmm.c - the `vmm` source: reserved virtual ranges backed with physical memory
 * (cuMemAddressReserve + cuMemCreate + cuMemMap + cuMemSetAccess).
 *
 * One map call is one physical handle and one mapping of the whole range asked for. The
 * driver unmaps only whole mappings and maps no part of a handle on its own (a nonzero
 * offset is refused: bench/vmm_cost.c), so the engine decides the unit: granule-sized
 * mappings where it must give back any piece of what it mapped (the holes between live
 * blocks, near the cap), runs of up to 128 MiB where it keeps what it maps (granules.c).
 * An unmap names one or more whole mappings side by side. The table maps every granule's
 * address to its mapping (start, size, handle), in open addressing.
 *
 * Every method leaves the source exactly as it found it when it fails: a map releases the
 * handle it created; an unmap that fails on mapping k maps 0..k-1 back with their
 * still-held handles.
 *
 * Not locked: the engine calls a source under its pool's lock. Events, memory information
 * and context handling are the shared helpers of prim/cuda_driver.c.
 */
#include <stdlib.h>
#include <string.h>

#include "prim/cuda_driver.h"
#include "source/source.h"

#define VMM_MAX_ACCESS 64 /* own device plus peers: more than any single host has GPUs */

typedef struct vmm_slot {
  uintptr_t addr; /* granule address; 0 marks an empty slot (the driver never maps 0) */
  uintptr_t start; /* the mapping holding the granule: where it starts, its size, handle */
  size_t size;
  CUmemGenericAllocationHandle handle;
} vmm_slot;

typedef struct vmm_state {
  vram_cuda_device dev; /* first: the shared event and info helpers take the state as it */
  size_t gran;
  unsigned gran_shift;
  CUmemAllocationProp prop;
  CUmemAccessDesc access[VMM_MAX_ACCESS]; /* [0] is the own device */
  size_t n_access;
  vmm_slot *slots; /* capacity a power of two, load kept at or below one half */
  size_t cap;
  size_t count;
  uint64_t leaked_handles; /* handles the driver refused to release after their unmap */
} vmm_state;

/* ---------------------------------------------------------------------------------------
 * The granule table: linear probing with backward-shift deletion, so no tombstones pile
 * up through the long map/unmap churn of a pool's life.
 * ------------------------------------------------------------------------------------- */
static size_t slot_of(const vmm_state *s, uintptr_t addr) {
  /* Fibonacci hashing of the granule number: consecutive granules spread evenly. */
  uint64_t h = (uint64_t)(addr >> s->gran_shift) * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 32) & (s->cap - 1);
}

static vmm_slot *table_find(const vmm_state *s, uintptr_t addr) {
  if (!s->cap) return NULL;
  for (size_t i = slot_of(s, addr);; i = (i + 1) & (s->cap - 1)) {
    if (s->slots[i].addr == addr) return &s->slots[i];
    if (s->slots[i].addr == 0) return NULL;
  }
}

/* Never fails: callers reserve room with table_reserve before touching the driver. */
static void table_put(vmm_state *s, const vmm_slot *entry) {
  size_t i = slot_of(s, entry->addr);
  while (s->slots[i].addr != 0) i = (i + 1) & (s->cap - 1);
  s->slots[i] = *entry;
  s->count++;
}

static void table_remove(vmm_state *s, uintptr_t addr) {
  vmm_slot *hit = table_find(s, addr);
  if (!hit) return;
  size_t mask = s->cap - 1;
  size_t i = (size_t)(hit - s->slots);
  /* Pull later members of the probe run back over the hole while that keeps them
   * reachable from their home slot. */
  for (size_t j = (i + 1) & mask; s->slots[j].addr != 0; j = (j + 1) & mask) {
    size_t home = slot_of(s, s->slots[j].addr);
    if (((j - home) & mask) >= ((j - i) & mask)) {
      s->slots[i] = s->slots[j];
      i = j;
    }
  }
  s->slots[i] = (vmm_slot){0};
  s->count--;
}

/* Make room for `extra` more granules; VRAM_EHOSTMEM (table unchanged) if the host is
 * out of memory. */
static int table_reserve(vmm_state *s, size_t extra) {
  if (extra > SIZE_MAX / 4 - s->count) return VRAM_EHOSTMEM;
  size_t need = (s->count + extra) * 2;
  if (need <= s->cap) return VRAM_OK;
  size_t cap = s->cap ? s->cap : 64;
  while (cap < need) cap <<= 1;
  vmm_slot *old = s->slots;
  size_t old_cap = s->cap;
  vmm_slot *fresh = calloc(cap, sizeof *fresh);
  if (!fresh) return VRAM_EHOSTMEM;
  s->slots = fresh;
  s->cap = cap;
  s->count = 0;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i].addr) table_put(s, &old[i]);
  free(old);
  return VRAM_OK;
}

/* ---------------------------------------------------------------------------------------
 * Open and close.
 * ------------------------------------------------------------------------------------- */
static void vmm_close(void *state);

static int vmm_open(const vram_source_config *cfg, void **state) {
  vmm_state *s = calloc(1, sizeof *s);
  if (!s) return VRAM_EHOSTMEM;
  int st = _vram_cuda_device_open(&s->dev, cfg ? cfg->device : 0);
  if (st != VRAM_OK) {
    free(s);
    return st;
  }
  const vram_cuda_api *a = s->dev.api;
  if (!a->cuMemAddressReserve || !a->cuMemAddressFree || !a->cuMemCreate ||
      !a->cuMemRelease || !a->cuMemMap || !a->cuMemUnmap || !a->cuMemSetAccess ||
      !a->cuMemGetAllocationGranularity) {
    _vram_cuda_set_error("vmm", "the driver lacks the virtual memory entry points");
    st = VRAM_EUNSUPPORTED;
    goto fail;
  }
  int supported = 0;
  st = _vram_cuda_device_attribute(&s->dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                   &supported);
  if (st != VRAM_OK) goto fail;
  if (!supported) {
    _vram_cuda_set_error("vmm", "the device does not support virtual memory management");
    st = VRAM_EUNSUPPORTED;
    goto fail;
  }

  memset(&s->prop, 0, sizeof s->prop);
  s->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  s->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  s->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  s->prop.location.id = s->dev.ordinal;

  size_t rec = 0, min = 0;
  st = _vram_cuda_status(a->cuMemGetAllocationGranularity(&min, &s->prop,
                                                          CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                         "cuMemGetAllocationGranularity");
  if (st != VRAM_OK) goto fail;
  st = _vram_cuda_status(a->cuMemGetAllocationGranularity(&rec, &s->prop,
                                                          CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                         "cuMemGetAllocationGranularity");
  if (st != VRAM_OK) goto fail;
  /* The recommended unit is the fast one; the engine needs a power of two, and no unit
   * below the driver's minimum can be mapped at all. */
  s->gran = rec >= min ? rec : min;
  if (s->gran == 0 || (s->gran & (s->gran - 1)) != 0) s->gran = min;
  if (s->gran == 0 || (s->gran & (s->gran - 1)) != 0) {
    _vram_cuda_set_error("vmm", "the driver's mapping granularity is not a power of two");
    st = VRAM_EUNSUPPORTED;
    goto fail;
  }
  while (((size_t)1 << s->gran_shift) < s->gran) s->gran_shift++;

  s->access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  s->access[0].location.id = s->dev.ordinal;
  s->access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  s->n_access = 1;
  *state = s;
  return VRAM_OK;

fail:
  vmm_close(s);
  return st;
}

static size_t vmm_granularity(void *state) { return ((vmm_state *)state)->gran; }

/* ---------------------------------------------------------------------------------------
 * Mapping. Callers hold the context (vram_cuda_enter) around these helpers.
 * ------------------------------------------------------------------------------------- */

static int check_range(const vmm_state *s, uintptr_t addr, size_t size) {
  if (size == 0 || (addr & (s->gran - 1)) != 0 || (size & (s->gran - 1)) != 0 ||
      addr + size < addr)
    return VRAM_EINVAL;
  return VRAM_OK;
}

static void forget_mapping(vmm_state *s, uintptr_t start, size_t size) {
  for (uintptr_t g = start; g < start + size; g += s->gran) table_remove(s, g);
}

static int vmm_map(void *state, uintptr_t addr, size_t size) {
  vmm_state *s = state;
  const vram_cuda_api *a = s->dev.api;
  int st = check_range(s, addr, size);
  if (st != VRAM_OK) return st;
  size_t n = size >> s->gran_shift;
  /* Refuse a double map before creating anything: the driver would fail on it anyway,
   * but only after we had spent a handle. */
  for (size_t k = 0; k < n; k++)
    if (table_find(s, addr + k * s->gran)) {
      _vram_cuda_set_error("vmm map", "granule already mapped");
      return VRAM_EINVAL;
    }
  st = table_reserve(s, n);
  if (st != VRAM_OK) return st;

  vram_cuda_scope sc;
  st = _vram_cuda_enter(&s->dev, &sc);
  if (st != VRAM_OK) return st;
  CUmemGenericAllocationHandle h = 0;
  st = _vram_cuda_status(a->cuMemCreate(&h, size, &s->prop, 0), "cuMemCreate");
  if (st == VRAM_OK) {
    st = _vram_cuda_status(a->cuMemMap((CUdeviceptr)addr, size, 0, h, 0), "cuMemMap");
    if (st == VRAM_OK) {
      /* Access is a property of the virtual range; each call costs a page-table update
       * on every device named. */
      st = _vram_cuda_status(a->cuMemSetAccess((CUdeviceptr)addr, size, s->access, s->n_access),
                             "cuMemSetAccess");
      if (st != VRAM_OK) a->cuMemUnmap((CUdeviceptr)addr, size);
    }
    if (st != VRAM_OK && a->cuMemRelease(h) != CUDA_SUCCESS) s->leaked_handles++;
  }
  if (st == VRAM_OK)
    for (size_t k = 0; k < n; k++)
      table_put(s, &(vmm_slot){addr + k * s->gran, addr, size, h});
  _vram_cuda_leave(&s->dev, &sc);
  return st;
}

/* The mappings that tile [addr, addr + size) exactly, as their table entries in address
 * order (*out, malloc'ed), or VRAM_EINVAL if the range is not whole mappings. */
static int mappings_in(const vmm_state *s, uintptr_t addr, size_t size, vmm_slot **out,
                       size_t *n_out) {
  size_t n = 0, cap = 8;
  vmm_slot *list = malloc(cap * sizeof *list);
  if (!list) return VRAM_EHOSTMEM;
  for (uintptr_t at = addr; at < addr + size;) {
    const vmm_slot *m = table_find(s, at);
    if (!m || m->start != at || m->size > addr + size - at) {
      free(list);
      _vram_cuda_set_error("vmm unmap", m ? "part of a mapping" : "granule not mapped");
      return VRAM_EINVAL;
    }
    if (n == cap) {
      vmm_slot *more = realloc(list, 2 * cap * sizeof *list);
      if (!more) {
        free(list);
        return VRAM_EHOSTMEM;
      }
      list = more;
      cap *= 2;
    }
    list[n++] = *m;
    at += m->size;
  }
  *out = list;
  *n_out = n;
  return VRAM_OK;
}

static int vmm_unmap(void *state, uintptr_t addr, size_t size) {
  vmm_state *s = state;
  const vram_cuda_api *a = s->dev.api;
  int st = check_range(s, addr, size);
  if (st != VRAM_OK) return st;
  vmm_slot *maps;
  size_t n;
  st = mappings_in(s, addr, size, &maps, &n);
  if (st != VRAM_OK) return st;

  vram_cuda_scope sc;
  st = _vram_cuda_enter(&s->dev, &sc);
  if (st != VRAM_OK) {
    free(maps);
    return st;
  }
  size_t k;
  for (k = 0; k < n; k++) {
    st = _vram_cuda_status(a->cuMemUnmap((CUdeviceptr)maps[k].start, maps[k].size), "cuMemUnmap");
    if (st != VRAM_OK) break;
  }
  if (st != VRAM_OK) {
    /* Handles are released only after every unmap succeeded, so the ones already
     * unmapped can go back where they were. */
    for (size_t j = 0; j < k; j++) {
      a->cuMemMap((CUdeviceptr)maps[j].start, maps[j].size, 0, maps[j].handle, 0);
      a->cuMemSetAccess((CUdeviceptr)maps[j].start, maps[j].size, s->access, s->n_access);
    }
  } else {
    for (k = 0; k < n; k++) {
      /* The mapping is gone either way; a handle the driver will not release is counted
       * rather than reported, since the range is now exactly as the caller asked. */
      if (a->cuMemRelease(maps[k].handle) != CUDA_SUCCESS) s->leaked_handles++;
      forget_mapping(s, maps[k].start, maps[k].size);
    }
  }
  _vram_cuda_leave(&s->dev, &sc);
  free(maps);
  return st;
}

/* ---------------------------------------------------------------------------------------
 * Reservations.
 * ------------------------------------------------------------------------------------- */
static int vmm_reserve(void *state, size_t size, uintptr_t *addr) {
  vmm_state *s = state;
  if (size == 0 || (size & (s->gran - 1)) != 0) return VRAM_EINVAL;
  vram_cuda_scope sc;
  CUdeviceptr p = 0;
  int st = _vram_cuda_enter(&s->dev, &sc);
  if (st != VRAM_OK) return st;
  st = _vram_cuda_status(s->dev.api->cuMemAddressReserve(&p, size, s->gran, 0, 0),
                         "cuMemAddressReserve");
  _vram_cuda_leave(&s->dev, &sc);
  if (st == VRAM_OK) *addr = (uintptr_t)p;
  return st;
}

/* Mappings still inside [addr, addr + size), as their first granules, collected so that
 * unmapping them does not disturb the table walk. */
static int mapped_in(const vmm_state *s, uintptr_t addr, size_t size, vmm_slot **out,
                     size_t *n_out) {
  *out = NULL;
  *n_out = 0;
  if (s->count == 0) return VRAM_OK;
  vmm_slot *list = malloc(s->count * sizeof *list);
  if (!list) return VRAM_EHOSTMEM;
  size_t n = 0;
  for (size_t i = 0; i < s->cap; i++) {
    const vmm_slot *g = &s->slots[i];
    if (g->addr && g->addr == g->start && g->addr >= addr && g->addr - addr < size) list[n++] = *g;
  }
  *out = list;
  *n_out = n;
  return VRAM_OK;
}

static int vmm_unreserve(void *state, uintptr_t addr, size_t size) {
  vmm_state *s = state;
  int st = check_range(s, addr, size);
  if (st != VRAM_OK) return st;
  /* Whatever is still mapped inside goes first (a forced pool destroy need not unmap
   * block by block); the driver would refuse to free a range with live mappings. */
  vmm_slot *list;
  size_t n;
  st = mapped_in(s, addr, size, &list, &n);
  if (st != VRAM_OK) return st;
  for (size_t i = 0; i < n && st == VRAM_OK; i++) st = vmm_unmap(s, list[i].start, list[i].size);
  free(list);
  if (st != VRAM_OK) return st;
  vram_cuda_scope sc;
  st = _vram_cuda_enter(&s->dev, &sc);
  if (st != VRAM_OK) return st;
  st = _vram_cuda_status(s->dev.api->cuMemAddressFree((CUdeviceptr)addr, size),
                         "cuMemAddressFree");
  _vram_cuda_leave(&s->dev, &sc);
  return st;
}

/* ---------------------------------------------------------------------------------------
 * Peers. A peer is added to the access list of every later map, and given access to what
 * is mapped now, since a user enabling a peer means "let it read my tensors".
 * ------------------------------------------------------------------------------------- */
static int vmm_enable_peer(void *state, int peer) {
  vmm_state *s = state;
  const vram_cuda_api *a = s->dev.api;
  if (peer == s->dev.ordinal) return VRAM_OK;
  for (size_t i = 1; i < s->n_access; i++)
    if (s->access[i].location.id == peer) return VRAM_OK;
  if (!a->cuDeviceCanAccessPeer) {
    _vram_cuda_set_error("vmm peer", "the driver lacks cuDeviceCanAccessPeer");
    return VRAM_EUNSUPPORTED;
  }
  if (s->n_access == VMM_MAX_ACCESS) {
    _vram_cuda_set_error("vmm peer", "too many peers");
    return VRAM_EUNSUPPORTED;
  }
  int count = 0;
  int st = _vram_cuda_status(a->cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (st != VRAM_OK) return st;
  if (peer < 0 || peer >= count) {
    _vram_cuda_set_error("vmm peer", "no such device");
    return VRAM_EDEVICE;
  }
  CUdevice pdev;
  st = _vram_cuda_status(a->cuDeviceGet(&pdev, peer), "cuDeviceGet");
  if (st != VRAM_OK) return st;
  int can = 0;
  st = _vram_cuda_status(a->cuDeviceCanAccessPeer(&can, pdev, s->dev.dev),
                         "cuDeviceCanAccessPeer");
  if (st != VRAM_OK) return st;
  if (!can) {
    _vram_cuda_set_error("vmm peer", "the peer device cannot access this device's memory");
    return VRAM_EUNSUPPORTED;
  }

  CUmemAccessDesc desc;
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = peer;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  vram_cuda_scope sc;
  st = _vram_cuda_enter(&s->dev, &sc);
  if (st != VRAM_OK) return st;
  size_t i;
  for (i = 0; i < s->cap; i++) {
    const vmm_slot *m = &s->slots[i];
    if (!m->addr || m->addr != m->start) continue; /* once per mapping */
    st = _vram_cuda_status(a->cuMemSetAccess((CUdeviceptr)m->start, m->size, &desc, 1),
                           "cuMemSetAccess");
    if (st != VRAM_OK) break;
  }
  if (st != VRAM_OK) {
    /* Take back what was granted so the source is as before. */
    CUmemAccessDesc none = desc;
    none.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    for (size_t j = 0; j < i; j++)
      if (s->slots[j].addr && s->slots[j].addr == s->slots[j].start)
        a->cuMemSetAccess((CUdeviceptr)s->slots[j].start, s->slots[j].size, &none, 1);
  } else {
    s->access[s->n_access++] = desc;
  }
  _vram_cuda_leave(&s->dev, &sc);
  return st;
}

static void vmm_close(void *state) {
  vmm_state *s = state;
  if (!s) return;
  /* The engine unmaps and unreserves before closing; granules still mapped here belong to
   * ranges we no longer know, so their handles are released and the ranges leak only
   * virtual addresses, never memory. */
  if (s->dev.api && s->count) {
    vram_cuda_scope sc;
    if (_vram_cuda_enter(&s->dev, &sc) == VRAM_OK) {
      for (size_t i = 0; i < s->cap; i++)
        if (s->slots[i].addr && s->slots[i].addr == s->slots[i].start) {
          s->dev.api->cuMemUnmap((CUdeviceptr)s->slots[i].start, s->slots[i].size);
          s->dev.api->cuMemRelease(s->slots[i].handle);
        }
      _vram_cuda_leave(&s->dev, &sc);
    }
  }
  free(s->slots);
  _vram_cuda_device_close(&s->dev);
  free(s);
}

const vram_source_methods _vram_source_vmm = {
  .zName = "vmm",
  .is_vmm = 1,
  .xOpen = vmm_open,
  .xClose = vmm_close,
  .xGranularity = vmm_granularity,
  .xMemInfo = _vram_cuda_mem_info,
  .xAlloc = NULL,
  .xFree = NULL,
  .xReserve = vmm_reserve,
  .xUnreserve = vmm_unreserve,
  .xMap = vmm_map,
  .xUnmap = vmm_unmap,
  .xEnablePeer = vmm_enable_peer,
  .xEventCreate = _vram_cuda_event_create,
  .xEventDestroy = _vram_cuda_event_destroy,
  .xEventRecord = _vram_cuda_event_record,
  .xEventQuery = _vram_cuda_event_query,
  .xEventSynchronize = _vram_cuda_event_synchronize,
  .xStreamWaitEvent = _vram_cuda_stream_wait_event,
    .xDeviceUuid = _vram_source_device_uuid,
    .xProcesses = _vram_source_processes,
};

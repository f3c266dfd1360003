/* published.c - the pool's glue to its published record slot and the OOM report's
 * neighbours (published.h). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "obs/escape.h"
#include "pool/giveback.h"
#include "pool/published.h"
#include "pool/snapshot.h"

/* The device's UUID as its source gives it, "" where it has none (sim). */
static void device_uuid(const vram_pool_t *pool, char *buf, size_t cap) {
  buf[0] = 0;
  if (pool->src->xDeviceUuid) pool->src->xDeviceUuid(pool->src_state, buf, cap);
}

/* Arenas a publication may walk each time. The walk of cached and largest free bytes costs
 * a miss per arena, and a segment growth publishes: with thousands of streams (an arena
 * each) that walk, not the allocation, was the cost of every growth, so past this many
 * arenas it runs once per arena_count / VRAM_PUBLISH_WALK_ARENAS publications. The two
 * figures of the record may then lag by that many growths; the others are always current. */
#define VRAM_PUBLISH_WALK_ARENAS 64

static void free_figures(vram_pool_t *pool, size_t *cached, size_t *largest) {
  size_t every = pool->arena_count / VRAM_PUBLISH_WALK_ARENAS;
  if (every < 2 || pool->publish_calls++ % every == 0) {
    pool->published_cached = _vram_pool_cached_free(pool);
    pool->published_largest = _vram_pool_largest_free(pool);
  }
  *cached = pool->published_cached;
  *largest = pool->published_largest;
}

void _vram_pool_publish_slow(vram_pool_t *pool) {
  if (pool->giveback) _vram_giveback_note_usage(pool);
  vram_device_record *d = pool->published;
  if (!d) return;
  const vram_stats_t *s = &pool->stats;
  size_t cached, largest;
  free_figures(pool, &cached, &largest);
  vram_publish_slow v = {
      .allocated = (uint64_t)s->allocated_bytes.current,
      .reserved = (uint64_t)s->reserved_bytes.current,
      .active = (uint64_t)s->allocated_bytes.current + pool->pending_bytes,
      .peak_allocated = (uint64_t)s->allocated_bytes.peak,
      .peak_reserved = (uint64_t)s->reserved_bytes.peak,
      .largest_free = largest < cached ? largest : cached,
      .largest_of_cached = cached,
      .num_ooms = s->num_ooms,
      .num_alloc_retries = s->num_alloc_retries,
      .limit = pool->limit,
      .capacity = pool->device_total,
      .given_back = s->giveback_given_bytes,
      .given_back_count = s->giveback_given_count};
  _vram_giveback_publish_figures(pool, &v.givable, &v.group_limit);
  _vram_publish_store_slow(d, &v);
}

void _vram_pool_publish_open(vram_pool_t *pool) {
  char uuid[48] = "";
  device_uuid(pool, uuid, sizeof uuid);
  pool->published = _vram_publish_claim(pool->opts.device, pool->src->zName, uuid);
  _vram_pool_publish_slow(pool);
}

void _vram_pool_publish_close(vram_pool_t *pool) {
  _vram_publish_release(pool->published);
  pool->published = NULL;
}

static void from_peer(vram_neighbour *n, const vram_record_peer *p) {
  n->is_vramkit = true;
  n->reserved_bytes = p->device.reserved_bytes;
  n->allocated_bytes = p->device.allocated_bytes;
  n->cached_free_bytes = p->device.cached_free_bytes;
  if (!n->name[0]) _vram_escape_text(n->name, sizeof n->name, p->name, sizeof p->name);
}

/* Adds a neighbour if there is room; counts it either way. */
static vram_neighbour *add(vram_neighbours *out, int pid) {
  out->total++;
  if (out->count == VRAM_OOM_MAX_NEIGHBOURS) return NULL;
  vram_neighbour *n = &out->list[out->count++];
  memset(n, 0, sizeof *n);
  n->pid = pid;
  n->used_bytes = VRAM_NEIGHBOUR_UNKNOWN;
  return n;
}

#define MAX_PEERS 32
#define MAX_NVML 64

void _vram_pool_neighbours(const vram_pool_t *pool, vram_neighbours *out) {
  memset(out, 0, sizeof *out);
  /* A source that names no other process (sim: its device is this process's own) has
   * no neighbours. */
  if (!pool->src->xProcesses) return;
  char uuid[48] = "";
  if (pool->published) snprintf(uuid, sizeof uuid, "%s", pool->published->uuid);
  else device_uuid(pool, uuid, sizeof uuid);
  vram_record_peer peers[MAX_PEERS];
  int n_peers = _vram_publish_peers(uuid, peers, MAX_PEERS);
  bool used_peer[MAX_PEERS] = {false};
  int self = (int)getpid();
  static _Thread_local vram_nvml_process procs[MAX_NVML];
  const char *why = "";
  int n = pool->src->xProcesses(pool->src_state, procs, MAX_NVML, &why);
  if (n < 0) snprintf(out->note, sizeof out->note, "%s", why);
  for (int i = 0; i < n; i++) {
    if ((int)procs[i].pid == self) continue;
    vram_neighbour *nb = add(out, (int)procs[i].pid);
    if (!nb) continue;
    nb->used_bytes = procs[i].used_bytes == VRAM_NVML_NOT_AVAILABLE ? VRAM_NEIGHBOUR_UNKNOWN
                                                                     : procs[i].used_bytes;
    _vram_escape_text(nb->name, sizeof nb->name, procs[i].name, sizeof procs[i].name);
    for (int j = 0; j < n_peers; j++)
      if (peers[j].pid == nb->pid) {
        from_peer(nb, &peers[j]);
        used_peer[j] = true;
      }
  }
  /* vramkit processes NVML did not list: no NVML, or another pid namespace. */
  for (int j = 0; j < n_peers; j++) {
    if (used_peer[j]) continue;
    vram_neighbour *nb = add(out, peers[j].pid);
    if (nb) from_peer(nb, &peers[j]);
  }
}

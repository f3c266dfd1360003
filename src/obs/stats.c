/* stats.c - statistics as text and JSON, and the OOM report, formatted from snapshots.
 *
 * The table of vram_summary follows torch.cuda.memory_summary(): one row per statistic
 * with current, peak and total. Rows come from VRAM_STAT_LIST and VRAM_COUNTER_LIST, so a
 * statistic added there appears in the struct, the table and the JSON at once. Nothing
 * here knows the pool: each formatter reads the snapshot it is given (format.h), the OOM
 * report's neighbours (other processes on the GPU) included. */
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "obs/format.h"

/* Appends to a bounded buffer; tracks the length the full text needs. */
typedef struct text_out {
  char *buf;
  size_t cap, len;
} text_out;

static void out_printf(text_out *o, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t room = o->len < o->cap ? o->cap - o->len : 0;
  int n = vsnprintf(room ? o->buf + o->len : NULL, room, fmt, ap);
  va_end(ap);
  if (n > 0) o->len += (size_t)n;
}

static bool is_byte_stat(const char *name) { return strstr(name, "bytes") != NULL; }

static void human_size(char *buf, size_t cap, int64_t bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)(bytes < 0 ? -bytes : bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  snprintf(buf, cap, u ? "%s%.2f %s" : "%s%.0f %s", bytes < 0 ? "-" : "", v, units[u]);
}

int _vram_format_summary(const vram_pool_snapshot *snap, char *buf, size_t cap) {
  text_out o = {buf, cap, 0};
  if (cap) buf[0] = 0;
  const vram_stats_t s = snap->stats;
  char a[32], b[32], c[32];
  out_printf(&o, "|===========================================================================|\n");
  out_printf(&o, "|                  vramkit memory summary, device %-3d (%-8s)             |\n",
             snap->device, snap->source_name);
  out_printf(&o, "|---------------------------------------------------------------------------|\n");
  out_printf(&o, "| %-24s | %14s | %14s | %14s |\n", "metric", "current", "peak", "total");
  out_printf(&o, "|---------------------------------------------------------------------------|\n");
#define VRAM_X_ROW(name, doc)                                                              \
  if (is_byte_stat(#name)) {                                                               \
    human_size(a, sizeof a, s.name.current);                                               \
    human_size(b, sizeof b, s.name.peak);                                                  \
    human_size(c, sizeof c, s.name.total);                                                 \
  } else {                                                                                 \
    snprintf(a, sizeof a, "%lld", (long long)s.name.current);                             \
    snprintf(b, sizeof b, "%lld", (long long)s.name.peak);                                \
    snprintf(c, sizeof c, "%lld", (long long)s.name.total);                               \
  }                                                                                        \
  out_printf(&o, "| %-24s | %14s | %14s | %14s |\n", #name, a, b, c);
  VRAM_STAT_LIST(VRAM_X_ROW)
#undef VRAM_X_ROW
  out_printf(&o, "|---------------------------------------------------------------------------|\n");
#define VRAM_X_COUNT(name, doc) out_printf(&o, "| %-24s | %14llu | %-31s |\n", #name, (unsigned long long)s.name, "");
  VRAM_COUNTER_LIST(VRAM_X_COUNT)
#undef VRAM_X_COUNT
  out_printf(&o, "|---------------------------------------------------------------------------|\n");
  human_size(a, sizeof a, (int64_t)s.largest_free_block);
  out_printf(&o, "| %-24s | %14s | %-31s |\n", "largest_free_block", a, "");
  out_printf(&o, "| %-24s | %13.1f%% | %-31s |\n", "fragmentation", 100.0 * s.fragmentation,
             "1 - largest free / cached free");
  if (s.limit_bytes) human_size(a, sizeof a, (int64_t)s.limit_bytes);
  else snprintf(a, sizeof a, "none");
  out_printf(&o, "| %-24s | %14s | %-31s |\n", "limit", a, "");
  out_printf(&o, "|===========================================================================|\n");
  return (int)o.len;
}

int _vram_format_stats_json(const vram_stats_t *s, char *buf, size_t cap) {
  text_out o = {buf, cap, 0};
  if (cap) buf[0] = 0;
  out_printf(&o, "{");
#define VRAM_X_JSON(name, doc)                                                             \
  out_printf(&o, "\"%s\": {\"current\": %lld, \"peak\": %lld, \"total\": %lld}, ", #name,  \
             (long long)s->name.current, (long long)s->name.peak, (long long)s->name.total);
  VRAM_STAT_LIST(VRAM_X_JSON)
#undef VRAM_X_JSON
#define VRAM_X_JSON_COUNT(name, doc) out_printf(&o, "\"%s\": %llu, ", #name, (unsigned long long)s->name);
  VRAM_COUNTER_LIST(VRAM_X_JSON_COUNT)
#undef VRAM_X_JSON_COUNT
  out_printf(&o, "\"largest_free_block\": %zu, \"fragmentation\": %.6f, \"limit_bytes\": %zu}",
             s->largest_free_block, s->fragmentation, s->limit_bytes);
  return (int)o.len;
}

/* One decimal and no sign: a size a request names, whatever its magnitude. */
static void human_size_1(char *buf, size_t cap, size_t bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    u++;
  }
  snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

/* "the default stream" or "stream 0x...": a NULL stream is not a pointer to the user. */
static void stream_name(char *buf, size_t cap, vram_stream_t stream) {
  if (stream) snprintf(buf, cap, "stream %p", stream);
  else snprintf(buf, cap, "the default stream");
}

/* The other processes on the GPU, one clause each: NVML's used memory, and for vramkit
 * processes the cached free memory they could give back (their own empty_cache). */
static void format_neighbours(text_out *o, const vram_neighbours *nb) {
  if (!nb) return;
  if (!nb->count && !nb->note[0]) return;
  if (!nb->count) {
    out_printf(o, "  Other processes on this GPU: unknown (NVML: %s); no other vramkit process "
                  "publishes a record for it.\n", nb->note);
    return;
  }
  out_printf(o, "  Other processes on this GPU:");
  for (int i = 0; i < nb->count; i++) {
    const vram_neighbour *n = &nb->list[i];
    char used[32], res[32], cfr[32];
    out_printf(o, "%s pid %d%s%s%s", i ? ";" : "", n->pid, n->name[0] ? " (" : "", n->name,
               n->name[0] ? ")" : "");
    if (n->used_bytes != VRAM_NEIGHBOUR_UNKNOWN) {
      human_size(used, sizeof used, (int64_t)n->used_bytes);
      out_printf(o, " %s", used);
    }
    if (n->is_vramkit) {
      human_size(res, sizeof res, (int64_t)n->reserved_bytes);
      human_size(cfr, sizeof cfr, (int64_t)n->cached_free_bytes);
      out_printf(o, ", vramkit: reserved %s, %s cached free%s", res, cfr,
                 n->cached_free_bytes ? " it could give back (empty_cache)" : "");
    }
  }
  if (nb->total > nb->count) out_printf(o, "; and %d more", nb->total - nb->count);
  out_printf(o, ".\n");
  if (nb->note[0]) out_printf(o, "  (NVML: %s; only vramkit processes are listed.)\n", nb->note);
}

int _vram_format_oom_report(const vram_pool_snapshot *snap, const vram_oom_request *req, char *buf,
                            size_t cap) {
  text_out o = {buf, cap, 0};
  if (cap) buf[0] = 0;
  const vram_stats_t *s = &snap->stats;
  size_t requested = req->size, total = snap->device_total, limit = s->limit_bytes;
  size_t cached = snap->cached_free;
  char rq[32], tot[32], fre[32], res[32], alc[32], lfb[32], lim[32], cfr[32], where[48];
  human_size(cfr, sizeof cfr, (int64_t)cached);
  human_size(rq, sizeof rq, requested > INT64_MAX ? INT64_MAX : (int64_t)requested);
  human_size(tot, sizeof tot, (int64_t)total);
  human_size(fre, sizeof fre, (int64_t)snap->device_free);
  human_size(res, sizeof res, s->reserved_bytes.current);
  human_size(alc, sizeof alc, s->allocated_bytes.current);
  human_size(lfb, sizeof lfb, (int64_t)s->largest_free_block);
  if (limit) human_size(lim, sizeof lim, (int64_t)limit);
  else snprintf(lim, sizeof lim, "none");
  stream_name(where, sizeof where, req->stream);
  out_printf(&o, "vramkit: out of memory on device %d (%s source): ", snap->device,
             snap->source_name);
  if (req->max_request) {
    /* The headline in one decimal, as a person would say it. */
    char size[32], most[32];
    human_size_1(size, sizeof size, requested);
    human_size_1(most, sizeof most, req->max_request);
    out_printf(&o, "tried to allocate %s (%zu bytes) on %s, more than device %d's %s of %s.\n",
               size, requested, where, snap->device,
               req->max_request == snap->device_total ? "capacity" : "addressable limit", most);
  } else {
    out_printf(&o, "tried to allocate %s (%zu bytes) on %s.\n", rq, requested, where);
  }
  out_printf(&o,
             "  device capacity %s, free on device %s, limit %s;\n"
             "  reserved by vramkit %s, allocated %s, cached free %s, largest free block %s, "
             "fragmentation %.1f%%.\n",
             tot, fre, lim, res, alc, cfr, lfb, 100.0 * s->fragmentation);
  format_neighbours(&o, snap->neighbours);
  if (req->max_request) {
    out_printf(&o, "  No memory setting can serve a request this large: check how its size was "
                   "computed (a negative number converted to an unsigned size, or a shape "
                   "multiplied out wrong, gives sizes like this).");
    return (int)o.len;
  }
  /* What to try, chosen from the numbers above. */
  if (limit && (size_t)s->reserved_bytes.current + requested > limit)
    out_printf(&o, "  The limit of %s is what refused it: raise it (VRAMKIT_LIMIT, "
                   "set_per_process_memory_fraction) if the device has room.\n", lim);
  if (cached >= requested)
    out_printf(&o, "  %.1f%% of reserved memory is free but fragmented: try the vmm source "
                   "(VRAMKIT_SOURCE=vmm), which maps physical memory where it is needed.\n",
               s->reserved_bytes.current ? 100.0 * (double)cached / (double)s->reserved_bytes.current
                                         : 0.0);
  /* Live bytes plus the request fit under the cap: the free memory around live blocks is
   * what failed it, the waste tight placement avoids on fixed segments. */
  size_t cap_bytes = limit ? limit : total;
  if (!snap->is_vmm && snap->tight_threshold > 0 && cached > 0 &&
      (size_t)s->allocated_bytes.current + requested <= cap_bytes)
    out_printf(&o, "  Live memory and this request would fit: keep fixed segments tighter with "
                   "VRAMKIT_TIGHT_THRESHOLD=0, which gives large requests segments of their own "
                   "size instead of carving cached ones (less memory, more driver calls).\n");
  out_printf(&o, "  Reduce the batch size, drop references to buffers and tensors you no longer "
                 "need (the memory summary shows what is allocated), use gradient "
                 "checkpointing or mixed precision, or the managed source "
                 "(VRAMKIT_SOURCE=managed) to spill to host memory.");
  return (int)o.len;
}

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

static const char *const size_units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};

/* A byte count in the largest binary unit below it, with `decimals` digits after the
 * point (none for plain bytes). Any uint64_t: 2^64 - 1 is "16.0 EiB", never a wrapped
 * negative number. */
static void size_text(char *buf, size_t cap, uint64_t bytes, int decimals) {
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    u++;
  }
  snprintf(buf, cap, "%.*f %s", u ? decimals : 0, v, size_units[u]);
}

/* Two decimals, as the summary table and the report's figures print sizes. */
static void human_size(char *buf, size_t cap, uint64_t bytes) { size_text(buf, cap, bytes, 2); }

/* A statistic (int64_t): its magnitude taken without negating INT64_MIN. */
static void human_stat(char *buf, size_t cap, int64_t value) {
  if (value >= 0 || cap < 2) {
    human_size(buf, cap, value >= 0 ? (uint64_t)value : 0);
    return;
  }
  buf[0] = '-';
  human_size(buf + 1, cap - 1, 0 - (uint64_t)value);
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
    human_stat(a, sizeof a, s.name.current);                                               \
    human_stat(b, sizeof b, s.name.peak);                                                  \
    human_stat(c, sizeof c, s.name.total);                                                 \
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
  human_size(a, sizeof a, s.largest_free_block);
  out_printf(&o, "| %-24s | %14s | %-31s |\n", "largest_free_block", a, "");
  out_printf(&o, "| %-24s | %13.1f%% | %-31s |\n", "fragmentation", 100.0 * s.fragmentation,
             "1 - largest free / cached free");
  if (s.limit_bytes) human_size(a, sizeof a, s.limit_bytes);
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

/* One decimal: a size a request names, whatever its magnitude. */
static void human_size_1(char *buf, size_t cap, uint64_t bytes) { size_text(buf, cap, bytes, 1); }

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
      human_size(used, sizeof used, n->used_bytes);
      out_printf(o, " %s", used);
    }
    if (n->is_vramkit) {
      human_size(res, sizeof res, n->reserved_bytes);
      human_size(cfr, sizeof cfr, n->cached_free_bytes);
      out_printf(o, ", vramkit: reserved %s, %s cached free%s", res, cfr,
                 n->cached_free_bytes ? " it could give back (empty_cache)" : "");
    }
  }
  if (nb->total > nb->count) out_printf(o, "; and %d more", nb->total - nb->count);
  out_printf(o, ".\n");
  if (nb->note[0]) out_printf(o, "  (NVML: %s; only vramkit processes are listed.)\n", nb->note);
}

/* Why a request failed, one word a program can match ("  cause: <kind>: ...") and one
 * sentence with the numbers. Exactly one kind is chosen, in this order:
 *
 *   fragmentation  live memory and the request fit under the limit and in what the device
 *                  leaves us (allocated + request <= min(limit, reserved + device free)),
 *                  so only placement failed: cached free memory (with what the pool may
 *                  still reserve) covers the request but no block is large enough. First,
 *                  because its fixes cost no memory at all; raising a limit or stopping a
 *                  neighbour would also make it fit, but would hand more memory to a
 *                  placement problem.
 *   limit          a limit is set, live memory and the request exceed it, and the device
 *                  itself has room for them (allocated + request <= reserved + device
 *                  free). Second: it is one setting, the user's own, and the only thing in
 *                  the way.
 *   live           live memory and the request are more than the whole device, or more
 *                  than the limit while the device has no room either: packed perfectly and
 *                  with the GPU to itself the pool still could not serve it, so live memory
 *                  is what must shrink. A request past the device's addressable limit is
 *                  this kind too.
 *   others         last: live memory and the request would fit the device and the limit,
 *                  but the device's free memory plus what we reserve falls short: other
 *                  processes hold the difference (device total - reserved - device free).
 *
 * The conditions cover every case: not fragmentation means over the limit (limit or live)
 * or over what the device leaves us (live if over the whole device, else others). The
 * report is made after the ladder gave every free segment back, so cached free here is
 * memory inside segments that still hold live blocks. */
typedef enum oom_cause { OOM_FRAGMENTATION, OOM_LIMIT, OOM_LIVE, OOM_OTHERS } oom_cause;

static const char *const oom_cause_names[] = {"fragmentation", "limit", "live", "others"};

/* a + b, saturating: a request near SIZE_MAX must not wrap into a small sum. */
static size_t add_sat(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

static oom_cause classify_oom(const vram_pool_snapshot *snap, const vram_oom_request *req) {
  const vram_stats_t *s = &snap->stats;
  size_t limit = s->limit_bytes, reserved = (size_t)s->reserved_bytes.current;
  size_t needed = add_sat((size_t)s->allocated_bytes.current, req->size);
  if (req->max_request) return OOM_LIVE;
  bool under_limit = !limit || needed <= limit;
  bool device_has_room = needed <= add_sat(reserved, snap->device_free);
  bool fits_whole_device = needed <= snap->device_total;
  if (under_limit && device_has_room) return OOM_FRAGMENTATION;
  if (!under_limit) return device_has_room ? OOM_LIMIT : OOM_LIVE;
  return fits_whole_device ? OOM_OTHERS : OOM_LIVE;
}

/* The cause line, with the numbers that chose it. */
static void format_oom_cause(text_out *o, const vram_pool_snapshot *snap,
                             const vram_oom_request *req) {
  const vram_stats_t *s = &snap->stats;
  size_t limit = s->limit_bytes, reserved = (size_t)s->reserved_bytes.current;
  size_t allocated = (size_t)s->allocated_bytes.current;
  size_t needed = add_sat(allocated, req->size);
  char rq[32], nd[32], lim[32], res[32], fre[32], tot[32], cfr[32], lfb[32], alc[32], more[32];
  human_size_1(rq, sizeof rq, req->size);
  human_size_1(nd, sizeof nd, needed);
  human_size_1(lim, sizeof lim, limit);
  human_size_1(res, sizeof res, reserved);
  human_size_1(fre, sizeof fre, snap->device_free);
  human_size_1(tot, sizeof tot, snap->device_total);
  human_size_1(cfr, sizeof cfr, snap->cached_free);
  human_size_1(lfb, sizeof lfb, s->largest_free_block);
  human_size_1(alc, sizeof alc, allocated);
  oom_cause cause = classify_oom(snap, req);
  out_printf(o, "  cause: %s: ", oom_cause_names[cause]);
  switch (cause) {
  case OOM_FRAGMENTATION: {
    /* What the pool may still take from the device, under the limit if one is set. */
    size_t room = snap->device_free;
    if (limit) room = limit > reserved ? (limit - reserved < room ? limit - reserved : room) : 0;
    human_size_1(more, sizeof more, room);
    out_printf(o, "%s is cached free and the pool may reserve %s more, against a request "
                  "of %s, but the largest free block is %s: the room is there, not in one "
                  "piece (live memory plus the request, %s, would fit).\n",
               cfr, more, rq, lfb, nd);
    break;
  }
  case OOM_LIMIT: {
    /* Enough to take a segment of the request's size beside everything reserved now. */
    size_t raise = add_sat(reserved, req->size) - limit;
    human_size_1(more, sizeof more, raise);
    out_printf(o, "the limit of %s refused it: reserved %s plus the request %s is more, while "
                  "the device has %s free; raise the limit by %s (%zu bytes).\n",
               lim, res, rq, fre, more, raise);
    break;
  }
  case OOM_LIVE:
    if (req->max_request)
      out_printf(o, "the request alone (%s) is more than the device can hold.\n", rq);
    else if (needed > snap->device_total)
      out_printf(o, "live memory %s plus the request %s is %s, more than the device's %s: "
                    "live memory itself is too much.\n", alc, rq, nd, tot);
    else
      out_printf(o, "live memory %s plus the request %s is %s, more than the limit of %s, "
                    "and the device has only %s free besides: live memory itself is too "
                    "much.\n", alc, rq, nd, lim, fre);
    break;
  case OOM_OTHERS: {
    /* The device less what we reserve and what is free: someone else's. */
    size_t ours = reserved < snap->device_total ? reserved : snap->device_total;
    size_t held = snap->device_total - ours;
    held = held > snap->device_free ? held - snap->device_free : 0;
    human_size_1(more, sizeof more, held);
    out_printf(o, "other processes hold %s of the device's %s: free on the device %s plus "
                  "cached free %s cannot serve the request %s, though live memory and the "
                  "request (%s) would fit on the device alone.\n",
               more, tot, fre, cfr, rq, nd);
    break;
  }
  }
}

int _vram_format_oom_report(const vram_pool_snapshot *snap, const vram_oom_request *req, char *buf,
                            size_t cap) {
  text_out o = {buf, cap, 0};
  if (cap) buf[0] = 0;
  const vram_stats_t *s = &snap->stats;
  size_t requested = req->size, total = snap->device_total, limit = s->limit_bytes;
  size_t cached = snap->cached_free;
  char rq[32], tot[32], fre[32], res[32], alc[32], lfb[32], lim[32], cfr[32], where[48];
  human_size(cfr, sizeof cfr, cached);
  human_size(rq, sizeof rq, requested);
  human_size(tot, sizeof tot, total);
  human_size(fre, sizeof fre, snap->device_free);
  human_stat(res, sizeof res, s->reserved_bytes.current);
  human_stat(alc, sizeof alc, s->allocated_bytes.current);
  human_size(lfb, sizeof lfb, s->largest_free_block);
  if (limit) human_size(lim, sizeof lim, limit);
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
  format_oom_cause(&o, snap, req);
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
  if (cached >= requested) {
    out_printf(&o, "  %.1f%% of reserved memory is free but fragmented: try the vmm source "
                   "(VRAMKIT_SOURCE=vmm), which maps physical memory where it is needed",
               s->reserved_bytes.current ? 100.0 * (double)cached / (double)s->reserved_bytes.current
                                         : 0.0);
    /* Fixed segments that turn virtual near the cap: starting sooner leaves fewer holes. */
    if (!snap->is_vmm && snap->virtual_threshold < 1.0)
      out_printf(&o, ", or a lower VRAMKIT_VIRTUAL_THRESHOLD (now %.2f%s), so that this pool "
                     "turns to virtual memory sooner", snap->virtual_threshold,
                 snap->grows_virtual ? ", passed" : ", not reached");
    out_printf(&o, ".\n");
  }
  /* Live bytes plus the request fit under the cap: the free memory around live blocks is
   * what failed it, the waste tight placement avoids on fixed segments. */
  size_t cap_bytes = limit ? limit : total;
  if (snap->fixed_large && snap->tight_threshold > 0 && cached > 0 &&
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

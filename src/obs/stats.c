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
 * negative number. The unit is the one of the figure as printed: a value that rounds up to
 * 1024 of a unit is shown as 1 of the next ("1.00 GiB", not "1024.00 MiB"). */
static void size_text(char *buf, size_t cap, uint64_t bytes, int decimals) {
  double half_digit = 0.5;
  for (int i = 0; i < decimals; i++) half_digit /= 10;
  double v = (double)bytes;
  int u = 0;
  while (u < 6 && v >= (u ? 1024 - half_digit : 1024)) {
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

/* What the give-back group did when this request asked it (pool/giveback.h): who was
 * asked, what each gave back, and who did not answer in time. */
static void format_giveback(text_out *o, const vram_giveback_outcome *gb) {
  if (!gb) return;
  char want[32], got[32], given[32];
  human_size(want, sizeof want, gb->wanted_bytes);
  human_size(got, sizeof got, gb->received_bytes);
  out_printf(o, "  Give-back: asked %d vramkit neighbour%s on this device for %s, got %s back",
             gb->asked, gb->asked == 1 ? "" : "s", want, got);
  for (int i = 0; i < gb->count; i++) {
    const vram_giveback_answer *a = &gb->list[i];
    out_printf(o, "%s pid %d%s%s%s ", i ? ";" : ":", a->pid, a->name[0] ? " (" : "", a->name,
               a->name[0] ? ")" : "");
    human_size(given, sizeof given, a->given_bytes);
    if (!a->answered) out_printf(o, "did not answer within %llu ms", (unsigned long long)gb->timeout_ms);
    else if (a->given_bytes) out_printf(o, "gave back %s", given);
    else out_printf(o, "had nothing idle to give back");
  }
  if (gb->asked > gb->count) out_printf(o, "; and %d more", gb->asked - gb->count);
  out_printf(o, ".\n");
}

/* Why a request failed, one word a program can match ("  cause: <kind>: ...") and one
 * sentence with the numbers. Exactly one kind is chosen, in this order:
 *
 *   preallocate    the pool's creation asked for memory up front (VRAMKIT_PREALLOCATE)
 *                  that the device or the limit cannot give: a setting, not a request.
 *   fragmentation  live memory and the request fit under the limit and in what the device
 *                  leaves us (allocated + request <= min(limit, reserved + device free)),
 *                  so only placement failed: cached free memory (with what the pool may
 *                  still reserve) covers the request but no block is large enough. First,
 *                  because its fixes cost no memory at all; raising a limit or stopping a
 *                  neighbour would also make it fit, but would hand more memory to a
 *                  placement problem.
 *   granularity    as fragmentation by the byte count, but the pool maps memory in whole
 *                  segments (granules): cached free memory plus what the pool may still
 *                  reserve, rounded down to whole segments, is less than the request. A
 *                  cap below one segment (a 1 MiB limit, a 1 KiB sim) is this kind: no
 *                  placement could help.
 *   limit          a limit is set, live memory and the request exceed it, and the device
 *                  itself has room for them (allocated + request <= reserved + device
 *                  free). Second: it is one setting, the user's own, and the only thing in
 *                  the way.
 *   live           live memory and the request are more than the whole device, or more
 *                  than the limit while the device has no room either: packed perfectly and
 *                  with the GPU to itself the pool still could not serve it, so live memory
 *                  is what must shrink. A request past the device's capacity or addressable
 *                  limit is this kind too.
 *   group_limit    (before fragmentation) a group limit is set, the pool's own limit has room,
 *                  and what every vramkit process on the device reserves, plus the request,
 *                  less this pool's cached free memory, is more than the group limit:
 *                  growth was refused by the group, not by the device.
 *   others         last: live memory and the request would fit the device and the limit,
 *                  but the device's free memory plus what we reserve falls short: other
 *                  processes hold the difference (device total - reserved - device free).
 *
 * The conditions cover every case: not fragmentation (or granularity) means over the limit
 * (limit or live) or over what the device leaves us (live if over the whole device, else
 * others). The report is made after the ladder gave every free segment back, so cached
 * free here is memory inside segments that still hold live blocks. */
static const char *const oom_cause_names[VRAM_OOM_CAUSE_COUNT] = {
    "preallocate", "fragmentation", "granularity", "limit", "live", "others", "group_limit"};

const char *vram_oom_cause_name(int cause) {
  return cause >= 0 && cause < VRAM_OOM_CAUSE_COUNT ? oom_cause_names[cause] : NULL;
}

/* A request past what any device addresses (2^48 bytes), or a thousand times and more the
 * device's capacity (a unit off, a shape multiplied out wrong), was computed wrong, and the
 * advice says so. Just above the capacity it is a request too large for this device, and
 * the advice is about capacity. */
#define OOM_ABSURD_SIZE ((size_t)VRAM_SIM_MAX_CAPACITY)
#define OOM_ABSURD_FACTOR 1024

static bool absurd_request(const vram_oom_info_t *in) {
  return in->requested > OOM_ABSURD_SIZE || in->requested / OOM_ABSURD_FACTOR >= in->capacity;
}

/* a + b, saturating: a request near UINT64_MAX must not wrap into a small sum. */
static uint64_t add_sat(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

/* What the pool may still take from the device: its free memory, under the limit if set. */
static uint64_t may_reserve(const vram_oom_info_t *in) {
  uint64_t room = in->device_free;
  if (in->limit)
    room = in->limit > in->reserved ? (in->limit - in->reserved < room ? in->limit - in->reserved
                                                                       : room)
                                    : 0;
  return room;
}

/* The smallest unit the pool maps (1 where the figures do not say). */
static uint64_t granule_of(const vram_oom_info_t *in) {
  return in->granularity ? in->granularity : 1;
}

/* The cap that bounds the pool: the limit where it is below the device, else the device. */
static uint64_t cap_of(const vram_oom_info_t *in, const char **what) {
  bool by_limit = in->limit && in->limit <= in->capacity;
  *what = by_limit ? "limit" : "device's capacity";
  return by_limit ? in->limit : in->capacity;
}

static int classify_oom(const vram_oom_info_t *in) {
  uint64_t needed = add_sat(in->allocated, in->requested);
  if (in->preallocate) return VRAM_OOM_PREALLOCATE;
  if (in->max_request) return VRAM_OOM_LIVE;
  bool under_limit = !in->limit || needed <= in->limit;
  bool device_has_room = needed <= add_sat(in->reserved, in->device_free);
  bool fits_whole_device = needed <= in->capacity;
  if (under_limit && in->group_limit &&
      add_sat(in->group_reserved, in->requested) > add_sat(in->group_limit, in->cached_free))
    return VRAM_OOM_GROUP_LIMIT;
  if (under_limit && device_has_room) {
    uint64_t room = may_reserve(in);
    uint64_t mappable = room - room % granule_of(in);
    return add_sat(in->cached_free, mappable) < in->requested ? VRAM_OOM_GRANULARITY
                                                               : VRAM_OOM_FRAGMENTATION;
  }
  if (!under_limit) return device_has_room ? VRAM_OOM_LIMIT : VRAM_OOM_LIVE;
  return fits_whole_device ? VRAM_OOM_OTHERS : VRAM_OOM_LIVE;
}

void vram_oom_classify(vram_oom_info_t *in) {
  if (!in) return;
  in->may_reserve = may_reserve(in);
  in->cause = classify_oom(in);
  /* The device less what we reserve and what is free: someone else's. */
  uint64_t ours = in->reserved < in->capacity ? in->reserved : in->capacity;
  uint64_t held = in->capacity - ours;
  in->others_used = held > in->device_free ? held - in->device_free : 0;
  /* Enough to take a segment of the request's size beside everything reserved now. */
  uint64_t want = add_sat(in->reserved, in->requested);
  in->raise_limit_by = in->cause == VRAM_OOM_LIMIT && want > in->limit ? want - in->limit : 0;
  const char *what;
  uint64_t needed = add_sat(in->allocated, in->requested), cap = cap_of(in, &what);
  in->shortfall = in->cause == VRAM_OOM_LIVE && !in->max_request && needed > cap ? needed - cap
                                                                                : 0;
}

void _vram_oom_info_fill(const vram_pool_snapshot *snap, const vram_oom_request *req,
                         vram_oom_info_t *in) {
  const vram_stats_t *s = &snap->stats;
  memset(in, 0, sizeof *in);
  in->device = snap->device;
  in->source = snap->source;
  in->preallocate = req->preallocate;
  in->requested = req->size;
  in->max_request = req->max_request;
  in->capacity = snap->device_total;
  in->device_free = snap->device_free;
  in->limit = s->limit_bytes;
  in->reserved = (uint64_t)s->reserved_bytes.current;
  in->allocated = (uint64_t)s->allocated_bytes.current;
  in->cached_free = snap->cached_free;
  in->largest_free_block = s->largest_free_block;
  in->granularity = snap->granularity;
  in->preallocated = snap->preallocated;
  in->fragmentation = s->fragmentation;
  vram_oom_classify(in);
  const vram_neighbours *nb = snap->neighbours;
  if (!nb) return;
  in->neighbours_total = nb->total;
  for (int i = 0; i < nb->count && i < VRAM_OOM_MAX_NEIGHBOURS; i++) {
    const vram_neighbour *n = &nb->list[i];
    vram_oom_neighbour_t *o = &in->neighbours[in->neighbours_count++];
    o->pid = n->pid;
    o->is_vramkit = n->is_vramkit;
    snprintf(o->name, sizeof o->name, "%s", n->name);
    o->used_bytes = n->used_bytes == VRAM_NEIGHBOUR_UNKNOWN ? VRAM_OOM_UNKNOWN : n->used_bytes;
    o->reserved_bytes = n->reserved_bytes;
    o->allocated_bytes = n->allocated_bytes;
    o->cached_free_bytes = n->cached_free_bytes;
  }
}

/* "a plus b is a + b, more than bound", each figure in one unit with as many decimals as
 * make both the sum and the comparison read true ("1.50 GiB plus 0.03 GiB is 1.53 GiB, more
 * than 1.50 GiB", where one decimal in each one's own unit read "1.5 GiB plus 29.5 MiB is
 * 1.5 GiB, more than 1.5 GiB"), and in exact bytes where six decimals do not. */
typedef struct sum_text {
  char a[48], b[48], sum[48], bound[48];
} sum_text;

static void u128_text(char *buf, size_t cap, unsigned __int128 v, const char *unit) {
  char digits[48];
  int n = 0;
  do {
    digits[n++] = (char)('0' + (int)(v % 10));
    v /= 10;
  } while (v);
  char *p = buf;
  size_t left = cap;
  while (n && left > 1) {
    *p++ = digits[--n];
    left--;
  }
  *p = 0;
  snprintf(p, left, " %s", unit);
}

/* x in `unit`, rounded to `decimals` digits, as an integer of 10^-decimals units. */
static unsigned __int128 scaled(unsigned __int128 x, unsigned __int128 unit, uint64_t scale) {
  return (x * scale + unit / 2) / unit;
}

static void scaled_text(char *buf, size_t cap, unsigned __int128 v, uint64_t scale, int decimals,
                        const char *unit) {
  snprintf(buf, cap, "%llu.%0*llu %s", (unsigned long long)(v / scale), decimals,
           (unsigned long long)(v % scale), unit);
}

static void sum_texts(sum_text *t, uint64_t a, uint64_t b, uint64_t bound) {
  unsigned __int128 sum = (unsigned __int128)a + b, unit = 1;
  int u = 0;
  while (u < 6 && sum >= unit * 1024) {
    unit *= 1024;
    u++;
  }
  uint64_t scale = 1;
  for (int d = 1; u && d <= 6; d++) {
    scale *= 10;
    unsigned __int128 sa = scaled(a, unit, scale), sb = scaled(b, unit, scale);
    unsigned __int128 ss = scaled(sum, unit, scale), sl = scaled(bound, unit, scale);
    if (sa + sb != ss || (sum > bound) != (ss > sl)) continue;
    scaled_text(t->a, sizeof t->a, sa, scale, d, size_units[u]);
    scaled_text(t->b, sizeof t->b, sb, scale, d, size_units[u]);
    scaled_text(t->sum, sizeof t->sum, ss, scale, d, size_units[u]);
    scaled_text(t->bound, sizeof t->bound, sl, scale, d, size_units[u]);
    return;
  }
  const char *bytes = u ? "bytes" : "B";
  u128_text(t->a, sizeof t->a, a, bytes);
  u128_text(t->b, sizeof t->b, b, bytes);
  u128_text(t->sum, sizeof t->sum, sum, bytes);
  u128_text(t->bound, sizeof t->bound, bound, bytes);
}

/* The cause line of a failed preallocation: what refused it. */
static void format_preallocate_cause(text_out *o, const vram_oom_info_t *in) {
  char rq[32], bound[32];
  human_size_1(rq, sizeof rq, in->requested);
  if (in->requested > in->capacity) {
    human_size_1(bound, sizeof bound, in->capacity);
    out_printf(o, "the preallocation of %s is more than the device's capacity of %s.\n", rq,
               bound);
  } else if (in->limit && in->requested > in->limit) {
    human_size_1(bound, sizeof bound, in->limit);
    out_printf(o, "the preallocation of %s is more than the limit of %s.\n", rq, bound);
  } else {
    human_size_1(bound, sizeof bound, in->device_free);
    out_printf(o, "the preallocation of %s is more than the %s free on the device (other "
                  "processes hold the rest).\n", rq, bound);
  }
}

/* The cause line of a request that whole segments cannot place. */
static void format_granularity_cause(text_out *o, const vram_oom_info_t *in) {
  const char *what;
  uint64_t cap = cap_of(in, &what), g = granule_of(in), room = in->may_reserve;
  char capt[32], seg[32], rq[32], more[32], mappable[32], cfr[32];
  human_size_1(capt, sizeof capt, cap);
  human_size_1(seg, sizeof seg, g);
  human_size_1(rq, sizeof rq, in->requested);
  human_size_1(more, sizeof more, room);
  human_size_1(mappable, sizeof mappable, room - room % g);
  human_size_1(cfr, sizeof cfr, in->cached_free);
  if (cap < g)
    out_printf(o, "the %s of %s is smaller than the smallest segment the pool maps (%s): no "
                  "request fits under it.\n", what, capt, seg);
  else
    out_printf(o, "the pool maps memory in whole segments of %s: of the %s it may still "
                  "reserve, %s can be mapped, which with the %s cached free is less than the "
                  "request of %s.\n", seg, more, mappable, cfr, rq);
}

/* The cause line of live memory over the cap. */
static void format_live_cause(text_out *o, const vram_oom_info_t *in, const char *fre) {
  if (in->max_request) {
    char rq[32];
    human_size_1(rq, sizeof rq, in->requested);
    out_printf(o, "the request alone (%s) is more than the device can hold.\n", rq);
    return;
  }
  bool over_device = add_sat(in->allocated, in->requested) > in->capacity;
  sum_text t;
  sum_texts(&t, in->allocated, in->requested, over_device ? in->capacity : in->limit);
  if (over_device)
    out_printf(o, "live memory %s plus the request %s is %s, more than the device's %s: "
                  "live memory itself is too much.\n", t.a, t.b, t.sum, t.bound);
  else
    out_printf(o, "live memory %s plus the request %s is %s, more than the limit of %s, "
                  "and the device has only %s free besides: live memory itself is too "
                  "much.\n", t.a, t.b, t.sum, t.bound, fre);
}

/* The cause line, with the numbers that chose it. */
static void format_oom_cause(text_out *o, const vram_oom_info_t *in) {
  uint64_t needed = add_sat(in->allocated, in->requested);
  char rq[32], nd[32], lim[32], res[32], fre[32], tot[32], cfr[32], lfb[32], more[32];
  human_size_1(rq, sizeof rq, in->requested);
  human_size_1(nd, sizeof nd, needed);
  human_size_1(lim, sizeof lim, in->limit);
  human_size_1(res, sizeof res, in->reserved);
  human_size_1(fre, sizeof fre, in->device_free);
  human_size_1(tot, sizeof tot, in->capacity);
  human_size_1(cfr, sizeof cfr, in->cached_free);
  human_size_1(lfb, sizeof lfb, in->largest_free_block);
  out_printf(o, "  cause: %s: ", vram_oom_cause_name(in->cause));
  switch (in->cause) {
  case VRAM_OOM_PREALLOCATE:
    format_preallocate_cause(o, in);
    break;
  case VRAM_OOM_GRANULARITY:
    format_granularity_cause(o, in);
    break;
  case VRAM_OOM_FRAGMENTATION:
    human_size_1(more, sizeof more, in->may_reserve);
    out_printf(o, "%s is cached free and the pool may reserve %s more, against a request "
                  "of %s, but the largest free block is %s: the room is there, not in one "
                  "piece (live memory plus the request, %s, would fit).\n",
               cfr, more, rq, lfb, nd);
    break;
  case VRAM_OOM_LIMIT:
    human_size_1(more, sizeof more, in->raise_limit_by);
    out_printf(o, "the limit of %s refused it: reserved %s plus the request %s is more, while "
                  "the device has %s free; raise the limit by %s (%llu bytes).\n",
               lim, res, rq, fre, more, (unsigned long long)in->raise_limit_by);
    break;
  case VRAM_OOM_LIVE:
    format_live_cause(o, in, fre);
    break;
  case VRAM_OOM_OTHERS:
    human_size_1(more, sizeof more, in->others_used);
    out_printf(o, "other processes hold %s of the device's %s: free on the device %s plus "
                  "cached free %s cannot serve the request %s, though live memory and the "
                  "request (%s) would fit on the device alone.\n",
               more, tot, fre, cfr, rq, nd);
    break;
  case VRAM_OOM_GROUP_LIMIT:
    human_size_1(lim, sizeof lim, in->group_limit);
    human_size_1(more, sizeof more, in->group_reserved);
    out_printf(o, "every vramkit process on this device together may reserve %s "
                  "(VRAMKIT_GROUP_LIMIT, or a pool's group_limit); they reserve %s, and the "
                  "request %s would pass it (cached free here %s): neighbours' idle memory "
                  "given back, or a higher group limit, would let it fit.\n",
               lim, more, rq, cfr);
    break;
  }
}

/* The first line: what was asked, where, and for a size past the device, its capacity. */
static void format_oom_headline(text_out *o, const vram_pool_snapshot *snap,
                                const vram_oom_request *req, const vram_oom_info_t *in) {
  char rq[32], where[48];
  human_size(rq, sizeof rq, in->requested);
  stream_name(where, sizeof where, req->stream);
  out_printf(o, "vramkit: out of memory on device %d (%s source): ", in->device,
             snap->source_name);
  if (in->preallocate) {
    out_printf(o, "could not preallocate %s (%llu bytes) when creating the pool.\n", rq,
               (unsigned long long)in->requested);
  } else if (in->max_request) {
    /* The headline in one decimal, as a person would say it. */
    char size[32], most[32];
    human_size_1(size, sizeof size, in->requested);
    human_size_1(most, sizeof most, in->max_request);
    out_printf(o, "tried to allocate %s (%llu bytes) on %s, more than device %d's %s of %s.\n",
               size, (unsigned long long)in->requested, where, in->device,
               in->max_request == in->capacity ? "capacity" : "addressable limit", most);
  } else {
    out_printf(o, "tried to allocate %s (%llu bytes) on %s.\n", rq,
               (unsigned long long)in->requested, where);
  }
}

/* Advice where no setting of the pool's own helps: a preallocation, a request past the
 * device, a cap below one segment. Returns true if it gave the report's last word. */
static bool format_oom_setting_advice(text_out *o, const vram_pool_snapshot *snap,
                                      const vram_oom_info_t *in) {
  bool sim = strncmp(snap->source_name, "sim", 3) == 0;
  const char *what;
  uint64_t cap = cap_of(in, &what);
  char size[32];
  if (in->preallocate) {
    human_size_1(size, sizeof size, cap < in->device_free ? cap : in->device_free);
    out_printf(o, "  Lower VRAMKIT_PREALLOCATE to what the device can give (%s now), or leave "
                  "it unset to grow on demand.", size);
    return true;
  }
  if (in->max_request && absurd_request(in)) {
    out_printf(o, "  No memory setting can serve a request this large: check how its size was "
                   "computed (a negative number converted to an unsigned size, or a shape "
                   "multiplied out wrong, gives sizes like this).");
    return true;
  }
  if (in->max_request) {
    human_size_1(size, sizeof size, in->max_request);
    out_printf(o, "  The request alone is more than this device's %s of %s: no limit or cache "
                  "release can serve it. Split it into smaller allocations, use a device with "
                  "more memory%s, or the managed source (VRAMKIT_SOURCE=managed) to spill to "
                  "host memory.",
               in->max_request == in->capacity ? "capacity" : "addressable limit", size,
               sim ? " (on sim, a larger VRAMKIT_SIM_CAPACITY)" : "");
    return true;
  }
  if (cap < granule_of(in) && in->cause == VRAM_OOM_GRANULARITY) {
    human_size_1(size, sizeof size, granule_of(in));
    out_printf(o, "  Raise the %s to at least one segment, %s (%s).", what, size,
               strcmp(what, "limit") == 0 ? "VRAMKIT_LIMIT" : sim ? "VRAMKIT_SIM_CAPACITY"
                                                                  : "a device with more memory");
    return true;
  }
  return false;
}

/* What to try, chosen from the numbers of the report. */
static void format_oom_advice(text_out *o, const vram_pool_snapshot *snap,
                              const vram_oom_info_t *in, const char *lim) {
  if (format_oom_setting_advice(o, snap, in)) return;
  uint64_t requested = in->requested, limit = in->limit, cached = in->cached_free;
  if (limit && in->reserved + requested > limit)
    out_printf(o, "  The limit of %s is what refused it: raise it (VRAMKIT_LIMIT, "
                  "set_per_process_memory_fraction) if the device has room.\n", lim);
  if (cached >= requested && in->preallocated) {
    /* The preallocation is mapped whole on every source: no source moves its holes. */
    out_printf(o, "  %.1f%% of reserved memory is free but fragmented: a preallocation is "
                  "one region that keeps its holes on every source; leave VRAMKIT_PREALLOCATE "
                  "unset so that the pool grows on demand and gives back or remaps what "
                  "fragments, or preallocate more.\n",
               in->reserved ? 100.0 * (double)cached / (double)in->reserved : 0.0);
  } else if (cached >= requested) {
    out_printf(o, "  %.1f%% of reserved memory is free but fragmented: try the vmm source "
                  "(VRAMKIT_SOURCE=vmm), which maps physical memory where it is needed",
               in->reserved ? 100.0 * (double)cached / (double)in->reserved : 0.0);
    /* Fixed segments that turn virtual near the cap: starting sooner leaves fewer holes. */
    if (!snap->is_vmm && snap->virtual_threshold < 1.0)
      out_printf(o, ", or a lower VRAMKIT_VIRTUAL_THRESHOLD (now %.2f%s), so that this pool "
                    "turns to virtual memory sooner", snap->virtual_threshold,
                 snap->grows_virtual ? ", passed" : ", not reached");
    out_printf(o, ".\n");
  }
  /* Live bytes plus the request fit under the cap: the free memory around live blocks is
   * what failed it, the waste tight placement avoids on fixed segments. */
  uint64_t cap_bytes = limit ? limit : in->capacity;
  if (snap->fixed_large && snap->tight_threshold > 0 && cached > 0 && !in->preallocated &&
      in->allocated + requested <= cap_bytes)
    out_printf(o, "  Live memory and this request would fit: keep fixed segments tighter with "
                  "VRAMKIT_TIGHT_THRESHOLD=0, which gives large requests segments of their own "
                  "size instead of carving cached ones (less memory, more driver calls).\n");
  out_printf(o, "  Reduce the batch size, drop references to buffers and tensors you no longer "
                "need (the memory summary shows what is allocated), use gradient "
                "checkpointing or mixed precision, or the managed source "
                "(VRAMKIT_SOURCE=managed) to spill to host memory.");
}

int _vram_format_oom_report(const vram_pool_snapshot *snap, const vram_oom_request *req,
                            const vram_oom_info_t *in, char *buf, size_t cap) {
  text_out o = {buf, cap, 0};
  if (cap) buf[0] = 0;
  char tot[32], fre[32], res[32], alc[32], lfb[32], lim[32], cfr[32];
  human_size(cfr, sizeof cfr, in->cached_free);
  human_size(tot, sizeof tot, in->capacity);
  human_size(fre, sizeof fre, in->device_free);
  human_stat(res, sizeof res, (int64_t)in->reserved);
  human_stat(alc, sizeof alc, (int64_t)in->allocated);
  human_size(lfb, sizeof lfb, in->largest_free_block);
  if (in->limit) human_size(lim, sizeof lim, in->limit);
  else snprintf(lim, sizeof lim, "none");
  format_oom_headline(&o, snap, req, in);
  format_oom_cause(&o, in);
  out_printf(&o,
             "  device capacity %s, free on device %s, limit %s;\n"
             "  reserved by vramkit %s, allocated %s, cached free %s, largest free block %s, "
             "fragmentation %.1f%%.\n",
             tot, fre, lim, res, alc, cfr, lfb, 100.0 * in->fragmentation);
  format_neighbours(&o, snap->neighbours);
  format_giveback(&o, snap->giveback);
  format_oom_advice(&o, snap, in, lim);
  return (int)o.len;
}

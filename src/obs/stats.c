/* stats.c - statistics as text and JSON, and the OOM report.
 *
 * The table of vram_summary follows torch.cuda.memory_summary(): one row per statistic
 * with current, peak and total. Rows come from VRAM_STAT_LIST and VRAM_COUNTER_LIST, so a
 * statistic added there appears in the struct, the table and the JSON at once. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pool/internal.h"

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

void _vram_fill_derived_stats(vram_pool_t *pool, vram_stats_t *out) {
  /* Active = allocated + waiting on events; each block became active once, at its malloc. */
  const vram_stats_t *s = &pool->stats;
  out->active_bytes.current = s->allocated_bytes.current + (int64_t)pool->pending_bytes;
  out->active_bytes.total = s->allocated_bytes.total;
  out->active_bytes.peak = s->allocated_bytes.peak > pool->active_bytes_peak
                               ? s->allocated_bytes.peak : pool->active_bytes_peak;
  out->active.current = s->allocation.current + (int64_t)pool->pending_blocks;
  out->active.total = s->allocation.total;
  out->active.peak = s->allocation.peak > pool->active_peak ? s->allocation.peak : pool->active_peak;
  out->num_mallocs = (uint64_t)s->allocation.total;
  out->num_frees = (uint64_t)(s->allocation.total - s->allocation.current);
  size_t cached = _vram_pool_cached_free(pool);
  out->largest_free_block = _vram_pool_largest_free(pool);
  if (out->largest_free_block > cached) out->largest_free_block = cached;
  out->fragmentation = cached ? 1.0 - (double)out->largest_free_block / (double)cached : 0.0;
  out->limit_bytes = pool->limit;
}

int _vram_format_summary(vram_pool_t *pool, char *buf, size_t cap) {
  text_out o = {buf, cap, 0};
  if (cap) buf[0] = 0;
  vram_stats_t s = pool->stats;
  _vram_fill_derived_stats(pool, &s);
  char a[32], b[32], c[32];
  out_printf(&o, "|===========================================================================|\n");
  out_printf(&o, "|                  vramkit memory summary, device %-3d (%-8s)             |\n",
             pool->opts.device, pool->src->zName);
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

int _vram_format_oom_report(vram_pool_t *pool, size_t requested, vram_stream_t stream, char *buf,
                            size_t cap) {
  text_out o = {buf, cap, 0};
  vram_stats_t s = pool->stats;
  _vram_fill_derived_stats(pool, &s);
  size_t free_bytes = 0, total = 0;
  pool->src->xMemInfo(pool->src_state, &free_bytes, &total);
  char req[32], tot[32], fre[32], res[32], alc[32], lfb[32], lim[32], cfr[32];
  size_t cached = _vram_pool_cached_free(pool);
  human_size(cfr, sizeof cfr, (int64_t)cached);
  human_size(req, sizeof req, (int64_t)requested);
  human_size(tot, sizeof tot, (int64_t)total);
  human_size(fre, sizeof fre, (int64_t)free_bytes);
  human_size(res, sizeof res, s.reserved_bytes.current);
  human_size(alc, sizeof alc, s.allocated_bytes.current);
  human_size(lfb, sizeof lfb, (int64_t)s.largest_free_block);
  if (pool->limit) human_size(lim, sizeof lim, (int64_t)pool->limit);
  else snprintf(lim, sizeof lim, "none");
  out_printf(&o,
             "vramkit: out of memory on device %d (%s source): tried to allocate %s (%zu bytes) "
             "on stream %p.\n"
             "  device capacity %s, free on device %s, limit %s;\n"
             "  reserved by vramkit %s, allocated %s, cached free %s, largest free block %s, "
             "fragmentation %.1f%%.\n",
             pool->opts.device, pool->src->zName, req, requested, stream, tot, fre, lim, res, alc,
             cfr, lfb, 100.0 * s.fragmentation);
  /* What to try, chosen from the numbers above. */
  if (pool->limit && (size_t)s.reserved_bytes.current + requested > pool->limit)
    out_printf(&o, "  The limit of %s is what refused it: raise it (VRAMKIT_LIMIT, "
                   "set_per_process_memory_fraction) if the device has room.\n", lim);
  if (cached >= requested)
    out_printf(&o, "  %.1f%% of reserved memory is free but fragmented: try the vmm source "
                   "(VRAMKIT_SOURCE=vmm), which maps physical memory where it is needed.\n",
               s.reserved_bytes.current ? 100.0 * (double)cached / (double)s.reserved_bytes.current : 0.0);
  /* Live bytes plus the request fit under the cap: the free memory around live blocks is
   * what failed it, the waste tight placement avoids on fixed segments. */
  size_t cap_bytes = pool->limit ? pool->limit : total;
  if (!pool->src->is_vmm && pool->opts.tight_threshold > 0 && cached > 0 &&
      (size_t)s.allocated_bytes.current + requested <= cap_bytes)
    out_printf(&o, "  Live memory and this request would fit: keep fixed segments tighter with "
                   "VRAMKIT_TIGHT_THRESHOLD=0, which gives large requests segments of their own "
                   "size instead of carving cached ones (less memory, more driver calls).\n");
  out_printf(&o, "  Reduce the batch size, free tensors you no longer need (vram_for_each_block "
                 "lists live blocks), use gradient checkpointing or mixed precision, or the "
                 "managed source to spill to host memory.");
  return (int)o.len;
}

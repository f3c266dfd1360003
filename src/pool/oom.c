/* oom.c - out of memory: count it, and keep the report that says why (src/obs writes it
 * from a snapshot, with the figures it is written from). A pool keeps its last report and
 * figures for vram_oom_report and vram_oom_info. A pool whose creation
 * fails because its preallocation does not fit also leaves its report with the thread that
 * tried, for vram_pool_create_report: no pool remains to ask, and every out-of-memory
 * error carries a report. */
#include <stdio.h>
#include <string.h>

#include "pool/events.h"
#include "pool/giveback.h"
#include "pool/oom.h"
#include "pool/published.h"
#include "pool/snapshot.h"

static _Thread_local char create_report[sizeof ((vram_pool_t *)0)->oom_report];
static _Thread_local vram_oom_info_t create_info = {.cause = -1};

static __attribute__((noinline, cold)) void write_report(vram_pool_t *pool,
                                                         const vram_oom_request *req) {
  pool->stats.num_ooms++;
  vram_pool_snapshot snap;
  _vram_pool_snapshot(pool, true, &snap);
  /* Who else holds the GPU: read from records and NVML, nothing of this pool's. */
  vram_neighbours neighbours;
  _vram_pool_neighbours(pool, &neighbours);
  snap.neighbours = &neighbours;
  /* What the neighbours gave back, or did not, when this request asked them. */
  snap.giveback = req->max_request || req->preallocate ? NULL : _vram_giveback_outcome(pool);
  _vram_pool_publish_slow(pool);
  _vram_oom_info_fill(&snap, req, &pool->oom_info);
  /* In a give-back group, the group's figures may name the group limit as the cause. */
  if (_vram_giveback_group_figures(pool, &pool->oom_info.group_limit,
                                   &pool->oom_info.group_reserved))
    vram_oom_classify(&pool->oom_info);
  _vram_format_oom_report(&snap, req, &pool->oom_info, pool->oom_report,
                          sizeof pool->oom_report);
  _vram_note(pool, VRAM_EVENT_OOM, snap.device_free, req->size, req->size, req->stream, 0);
}

void _vram_note_oom(vram_pool_t *pool, size_t requested, vram_stream_t stream,
                    size_t max_request) {
  vram_oom_request req = {.size = requested, .stream = stream, .max_request = max_request};
  write_report(pool, &req);
}

void _vram_note_preallocate_oom(vram_pool_t *pool, size_t bytes) {
  vram_oom_request req = {.size = bytes, .preallocate = true};
  write_report(pool, &req);
  snprintf(create_report, sizeof create_report, "%s", pool->oom_report);
  create_info = pool->oom_info;
}

void _vram_create_report_clear(void) {
  create_report[0] = 0;
  create_info.cause = -1;
}

void _vram_create_report_refusal(const char *why) {
  snprintf(create_report, sizeof create_report, "%s", why);
  create_info.cause = -1;
}

int vram_pool_create_oom_info(vram_oom_info_t *info) {
  if (!info) return VRAM_EINVAL;
  if (create_info.cause < 0) {
    memset(info, 0, sizeof *info);
    return VRAM_EINVAL;
  }
  *info = create_info;
  return VRAM_OK;
}

int vram_pool_create_report(char *buf, size_t cap) {
  if (!buf && cap) return VRAM_EINVAL;
  return snprintf(buf, cap, "%s", create_report);
}

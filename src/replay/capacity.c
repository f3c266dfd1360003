/* capacity.c - the calls around the replay's passes (vramkit.h, vram_replay_*): loading a
 * trace behind its handle, what the trace alone says, and the bisection for the smallest
 * capacity under which it replays with no out-of-memory.
 */
#define _POSIX_C_SOURCE 200809L
#include "replay/replay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((uint64_t)1 << 20)

void vram_replay_options_init(vram_replay_options *opts, const vram_options_t *pool) {
  memset(opts, 0, sizeof *opts);
  if (pool) opts->pool = *pool;
  else vram_options_init(&opts->pool);
  opts->repeat = 1;
  opts->calls_after = -1;
}

int _vram_replay_pass_init(_vram_replay_pass *pass, const trace_t *trace) {
  memset(pass, 0, sizeof *pass);
  pass->calls_after = SIZE_MAX;
  pass->failed_at = SIZE_MAX;
  pass->blocks = calloc(trace->slot_count ? trace->slot_count : 1, sizeof *pass->blocks);
  pass->streams = calloc(trace->stream_count ? trace->stream_count : 1, sizeof *pass->streams);
  if (pass->blocks && pass->streams) return 0;
  _vram_replay_pass_close(pass);
  return -1;
}

void _vram_replay_pass_close(_vram_replay_pass *pass) {
  free(pass->blocks);
  free(pass->streams);
  pass->blocks = NULL;
  pass->streams = NULL;
}

static int status_of(int trace_status) {
  switch (trace_status) {
  case TRACE_OK: return VRAM_OK;
  case TRACE_EIO: return VRAM_EIO;
  case TRACE_ENOMEM: return VRAM_EHOSTMEM;
  case TRACE_ELIMIT: return VRAM_ELIMIT;
  default: return VRAM_ETRACE;
  }
}

int vram_replay_load(const char *path, uint64_t max_ops, vram_replay_trace_t **out,
                     char *error, size_t cap) {
  if (!out) return VRAM_EINVAL;
  *out = NULL;
  if (cap) error[0] = '\0';
  if (!path) return VRAM_EINVAL;
  vram_replay_trace_t *handle = calloc(1, sizeof *handle);
  if (!handle) {
    if (cap) snprintf(error, cap, "%s: out of host memory", path);
    return VRAM_EHOSTMEM;
  }
  int rc = status_of(_vram_trace_load(path, max_ops, &handle->trace, error, cap));
  if (rc != VRAM_OK) {
    free(handle);
    return rc;
  }
  *out = handle;
  return VRAM_OK;
}

void vram_replay_unload(vram_replay_trace_t *handle) {
  if (!handle) return;
  _vram_trace_free(&handle->trace);
  free(handle);
}

void vram_replay_describe(const vram_replay_trace_t *handle, vram_replay_result *result) {
  const trace_t *trace = &handle->trace;
  memset(result, 0, sizeof *result);
  snprintf(result->name, sizeof result->name, "%s", trace->name);
  result->ops = trace->op_count;
  result->skipped_frees = trace->unmatched_frees;
  result->peak_live_bytes = trace->peak_live_bytes;
  result->first_oom_op = -1;
}

/* Does the trace replay with no OOM when capacity bounds the source of `family`? */
static int fits_under(const trace_t *trace, const vram_options_t *family, uint64_t capacity,
                      _vram_replay_pass *pass, vram_replay_result *result, int *fits) {
  vram_options_t options = *family;
  options.sim_capacity = (size_t)capacity;
  options.limit_bytes = (size_t)capacity;
  options.limit_fraction = 0;
  _vram_replay_run run;
  int status = _vram_replay_once(trace, &options, pass, &run, result);
  *fits = run.ooms == 0;
  return status;
}

/* Bisection between low (not fitting) and high (fitting), both in MiB: high * MiB, or 0
 * with *found -1 when high itself does not fit. */
static int bisect(const trace_t *trace, const vram_options_t *family, uint64_t low,
                  uint64_t high, _vram_replay_pass *pass, vram_replay_result *result) {
  int fits = 0, status;
  if ((status = fits_under(trace, family, high * MIB, pass, result, &fits)) != VRAM_OK)
    return status;
  if (!fits) {
    result->have_min_capacity = -1;
    return VRAM_OK;
  }
  if (low > 0) {
    if ((status = fits_under(trace, family, low * MIB, pass, result, &fits)) != VRAM_OK)
      return status;
    if (fits) high = low;
  }
  while (high - low > 1) {
    uint64_t middle = low + (high - low) / 2;
    if ((status = fits_under(trace, family, middle * MIB, pass, result, &fits)) != VRAM_OK)
      return status;
    if (fits) high = middle;
    else low = middle;
  }
  result->have_min_capacity = 1;
  result->min_capacity_bytes = high * MIB;
  return VRAM_OK;
}

/* Between peak live and 4x peak live, to 1 MiB, on the host model of the pool's source
 * family. The top is raised to the peak reserved of a run already made into `result`
 * with no out-of-memory: a trace smaller than the pool's first segment fits only above
 * four times its live bytes, and that run held it. It is lowered to the largest capacity
 * the sim models where that is less. */
int vram_replay_min_capacity(const vram_replay_trace_t *handle, const vram_options_t *pool,
                             vram_replay_result *result) {
  if (!handle || !pool || !result) return VRAM_EINVAL;
  const trace_t *trace = &handle->trace;
  vram_options_t family = *pool;
  vram_options_host_model(&family);
  result->min_capacity_source = family.source;
  result->min_capacity_bytes = 0;
  const uint64_t most = VRAM_SIM_MAX_CAPACITY;
  if (trace->peak_live_bytes > most) {
    result->have_min_capacity = -2;
    return VRAM_OK;
  }
  if (trace->peak_live_bytes == 0) {
    /* Any capacity holds nothing: a smallest one of 0 bytes, over 0 live, is no figure. */
    result->have_min_capacity = -3;
    return VRAM_OK;
  }
  result->have_min_capacity = 1;
  /* Peak live is at most 2^48 here: four times it cannot overflow. */
  uint64_t low = trace->peak_live_bytes / MIB;
  uint64_t high = (4 * trace->peak_live_bytes + MIB - 1) / MIB;
  if (result->ooms == 0 && result->peak_reserved_bytes > high * MIB)
    high = (result->peak_reserved_bytes + MIB - 1) / MIB;
  if (high > most / MIB) high = most / MIB;
  _vram_replay_pass pass;
  if (_vram_replay_pass_init(&pass, trace) != 0) {
    snprintf(result->error, sizeof result->error, "%s: out of host memory", trace->name);
    return VRAM_EHOSTMEM;
  }
  pass.stop_at_oom = 1;
  pass.private_pools = 1; /* a measurement of the trace alone, never of a shared device */
  int status = bisect(trace, &family, low, high, &pass, result);
  _vram_replay_pass_close(&pass);
  return status;
}

int vram_replay_run(const vram_replay_options *opts, const char *path, uint64_t max_ops,
                    vram_replay_result *result) {
  if (!opts || !result) return VRAM_EINVAL;
  memset(result, 0, sizeof *result);
  result->first_oom_op = -1;
  vram_replay_trace_t *trace = NULL;
  int status = vram_replay_load(path, max_ops, &trace, result->error, sizeof result->error);
  if (status != VRAM_OK) return status;
  status = vram_replay_trace(trace, opts, result);
  vram_replay_unload(trace);
  return status;
}

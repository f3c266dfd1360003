/* options.c - pool options: defaults, sizes with suffixes, source names, and the VRAMKIT_*
 * environment variables. A bad value is an error that names the variable, never a silent
 * default. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pool/internal.h"

#define DEFAULT_SIM_CAPACITY ((size_t)80 << 30) /* an 80 GiB card, as an H100 */

void vram_options_init(vram_options_t *opts) {
  if (!opts) return;
  memset(opts, 0, sizeof *opts);
  opts->device = 0;
  opts->source = VRAM_SOURCE_AUTO;
  opts->release_threshold = SIZE_MAX;
  opts->sim_capacity = DEFAULT_SIM_CAPACITY;
  opts->managed_prefetch = 1;
}

static const struct {
  const char *name;
  vram_source_kind kind;
} source_names[] = {
    {"auto", VRAM_SOURCE_AUTO}, {"sim", VRAM_SOURCE_SIM},         {"sim:cuda", VRAM_SOURCE_SIM},
    {"sim:vmm", VRAM_SOURCE_SIM_VMM}, {"cuda", VRAM_SOURCE_CUDA}, {"vmm", VRAM_SOURCE_VMM},
    {"managed", VRAM_SOURCE_MANAGED},
};

int vram_source_parse(const char *text, vram_source_kind *out) {
  if (!text || !out) return VRAM_EINVAL;
  for (size_t i = 0; i < sizeof source_names / sizeof source_names[0]; i++) {
    if (strcasecmp(text, source_names[i].name) == 0) {
      *out = source_names[i].kind;
      return VRAM_OK;
    }
  }
  return VRAM_EINVAL;
}

const char *vram_source_name(vram_source_kind kind) {
  for (size_t i = 0; i < sizeof source_names / sizeof source_names[0]; i++)
    if (source_names[i].kind == kind) return source_names[i].name;
  return "unknown";
}

/* AUTO means: a real GPU source if the driver opens and sees a device, else sim. The GPU
 * default is the fixed-segment cuda source (README explains the measurements behind it). */
int _vram_resolve_source(vram_source_kind kind, vram_source_kind *resolved) {
  if (kind != VRAM_SOURCE_AUTO) {
    if (kind < VRAM_SOURCE_AUTO || kind > VRAM_SOURCE_MANAGED) return VRAM_EINVAL;
    *resolved = kind;
    return VRAM_OK;
  }
  int count = 0;
  *resolved = (vram_device_count(VRAM_SOURCE_CUDA, &count) == VRAM_OK && count > 0)
                  ? VRAM_SOURCE_CUDA
                  : VRAM_SOURCE_SIM;
  return VRAM_OK;
}

int vram_parse_size(const char *text, int allow_percent, size_t *bytes, double *fraction) {
  if (!text || !bytes) return VRAM_EINVAL;
  while (*text == ' ') text++;
  if (!*text || *text == '-' || *text == '+') return VRAM_EINVAL;
  char *end = NULL;
  errno = 0;
  double value = strtod(text, &end);
  if (end == text || errno || !isfinite(value) || value < 0) return VRAM_EINVAL;
  while (*end == ' ') end++;
  if (*end == '%') {
    if (!allow_percent || !fraction || end[1] || value <= 0 || value > 100) return VRAM_EINVAL;
    *fraction = value / 100.0;
    *bytes = 0;
    return VRAM_OK;
  }
  double scale = 1;
  switch (*end) {
    case 'k': case 'K': scale = 1024.0; end++; break;
    case 'm': case 'M': scale = 1024.0 * 1024; end++; break;
    case 'g': case 'G': scale = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': scale = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
  }
  if (scale > 1 && (*end == 'i' || *end == 'I')) end++;
  if (*end == 'b' || *end == 'B') end++;
  if (*end) return VRAM_EINVAL;
  double total = value * scale;
  if (total >= 18446744073709551615.0 || total != floor(total)) {
    if (total >= 18446744073709551615.0) return VRAM_EINVAL;
    total = ceil(total);
  }
  *bytes = (size_t)total;
  if (fraction) *fraction = 0;
  return VRAM_OK;
}

int vram_options_from_env(vram_options_t *opts, const char **why) {
  if (!opts) return VRAM_EINVAL;
  vram_options_t o = *opts;
  const char *v;
  if ((v = getenv("VRAMKIT_SOURCE")) && *v) {
    if (vram_source_parse(v, &o.source)) goto bad_source;
  }
  if ((v = getenv("VRAMKIT_LIMIT")) && *v) {
    if (vram_parse_size(v, 1, &o.limit_bytes, &o.limit_fraction)) goto bad_limit;
  }
  if ((v = getenv("VRAMKIT_PREALLOCATE")) && *v) {
    if (vram_parse_size(v, 1, &o.preallocate_bytes, &o.preallocate_fraction)) goto bad_prealloc;
  }
  if ((v = getenv("VRAMKIT_RELEASE_THRESHOLD")) && *v) {
    if (vram_parse_size(v, 0, &o.release_threshold, NULL)) goto bad_threshold;
  }
  if ((v = getenv("VRAMKIT_SIM_CAPACITY")) && *v) {
    if (vram_parse_size(v, 0, &o.sim_capacity, NULL) || o.sim_capacity == 0) goto bad_capacity;
  }
  *opts = o;
  return VRAM_OK;
bad_source:
  if (why) *why = "VRAMKIT_SOURCE: expected auto, sim, sim:cuda, sim:vmm, cuda, vmm or managed";
  return VRAM_EENV;
bad_limit:
  if (why) *why = "VRAMKIT_LIMIT: expected a size such as 8G or a percentage such as 50%";
  return VRAM_EENV;
bad_prealloc:
  if (why) *why = "VRAMKIT_PREALLOCATE: expected a size such as 8G or a percentage such as 50%";
  return VRAM_EENV;
bad_threshold:
  if (why) *why = "VRAMKIT_RELEASE_THRESHOLD: expected a size such as 1G";
  return VRAM_EENV;
bad_capacity:
  if (why) *why = "VRAMKIT_SIM_CAPACITY: expected a positive size such as 16G";
  return VRAM_EENV;
}

/* options.c - pool options: defaults, sizes with suffixes, source names, and the VRAMKIT_*
 * environment variables. A bad value is an error that names the variable, never a silent
 * default. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "vramkit.h"

#define DEFAULT_SIM_CAPACITY ((size_t)80 << 30) /* an 80 GiB card, as an H100 */

void vram_options_init(vram_options_t *opts) {
  if (!opts) return;
  memset(opts, 0, sizeof *opts);
  opts->device = 0;
  opts->source = VRAM_SOURCE_AUTO;
  opts->release_threshold = SIZE_MAX;
  opts->tight_threshold = 1.0;
  opts->virtual_threshold = 0.5;
  opts->large_blocks = VRAM_LARGE_VIRTUAL;
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

/* The settings that VRAMKIT_* variables and vram_options_set name, each with its parser and
 * the message that explains a bad value. One table serves both. */
typedef int (*setting_parse_fn)(vram_options_t *o, const char *value);

static int parse_source(vram_options_t *o, const char *v) { return vram_source_parse(v, &o->source); }
static int parse_limit(vram_options_t *o, const char *v) {
  return vram_parse_size(v, 1, &o->limit_bytes, &o->limit_fraction);
}
static int parse_preallocate(vram_options_t *o, const char *v) {
  return vram_parse_size(v, 1, &o->preallocate_bytes, &o->preallocate_fraction);
}
static int parse_release_threshold(vram_options_t *o, const char *v) {
  return vram_parse_size(v, 0, &o->release_threshold, NULL);
}
/* A share in [0, 1], written as a fraction ("0.9") or a percentage ("90%"). */
static int parse_share(const char *v, double *out) {
  char *end = NULL;
  errno = 0;
  double value = strtod(v, &end);
  if (end == v || errno || !isfinite(value)) return VRAM_EINVAL;
  if (*end == '%') {
    value /= 100.0;
    end++;
  }
  if (*end || value < 0 || value > 1) return VRAM_EINVAL;
  *out = value;
  return VRAM_OK;
}
static int parse_tight_threshold(vram_options_t *o, const char *v) {
  return parse_share(v, &o->tight_threshold);
}
static int parse_virtual_threshold(vram_options_t *o, const char *v) {
  return parse_share(v, &o->virtual_threshold);
}
static int parse_large_blocks(vram_options_t *o, const char *v) {
  if (strcasecmp(v, "fixed") == 0) o->large_blocks = VRAM_LARGE_FIXED;
  else if (strcasecmp(v, "virtual") == 0) o->large_blocks = VRAM_LARGE_VIRTUAL;
  else return VRAM_EINVAL;
  return VRAM_OK;
}
static int parse_sim_capacity(vram_options_t *o, const char *v) {
  int rc = vram_parse_size(v, 0, &o->sim_capacity, NULL);
  return rc ? rc : o->sim_capacity ? VRAM_OK : VRAM_EINVAL;
}

static const struct {
  const char *name;
  setting_parse_fn parse;
  const char *why;
} settings[] = {
    {"VRAMKIT_SOURCE", parse_source,
     "VRAMKIT_SOURCE: expected auto, sim, sim:cuda, sim:vmm, cuda, vmm or managed"},
    {"VRAMKIT_LIMIT", parse_limit,
     "VRAMKIT_LIMIT: expected a size such as 8G or a percentage such as 50%"},
    {"VRAMKIT_PREALLOCATE", parse_preallocate,
     "VRAMKIT_PREALLOCATE: expected a size such as 8G or a percentage such as 50%"},
    {"VRAMKIT_RELEASE_THRESHOLD", parse_release_threshold,
     "VRAMKIT_RELEASE_THRESHOLD: expected a size such as 1G"},
    {"VRAMKIT_TIGHT_THRESHOLD", parse_tight_threshold,
     "VRAMKIT_TIGHT_THRESHOLD: expected a share of the memory cap from 0 to 1, such as 0.9 or 90%"},
    {"VRAMKIT_VIRTUAL_THRESHOLD", parse_virtual_threshold,
     "VRAMKIT_VIRTUAL_THRESHOLD: expected a share of the memory cap from 0 to 1, such as 0.5 or 50%"},
    {"VRAMKIT_LARGE_BLOCKS", parse_large_blocks,
     "VRAMKIT_LARGE_BLOCKS: expected fixed or virtual"},
    {"VRAMKIT_SIM_CAPACITY", parse_sim_capacity,
     "VRAMKIT_SIM_CAPACITY: expected a positive size such as 16G"},
};

int vram_options_set(vram_options_t *opts, const char *name, const char *value, const char **why) {
  if (!opts || !name || !value) return VRAM_EINVAL;
  for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) {
    if (strcmp(name, settings[i].name) != 0) continue;
    vram_options_t o = *opts;
    if (settings[i].parse(&o, value) != VRAM_OK) {
      if (why) *why = settings[i].why;
      return VRAM_EENV;
    }
    *opts = o;
    return VRAM_OK;
  }
  if (why) *why = "unknown setting: expected VRAMKIT_SOURCE, VRAMKIT_LIMIT, VRAMKIT_PREALLOCATE, "
                  "VRAMKIT_RELEASE_THRESHOLD, VRAMKIT_TIGHT_THRESHOLD, VRAMKIT_VIRTUAL_THRESHOLD, "
                  "VRAMKIT_LARGE_BLOCKS or VRAMKIT_SIM_CAPACITY";
  return VRAM_EINVAL;
}

int vram_options_from_env(vram_options_t *opts, const char **why) {
  if (!opts) return VRAM_EINVAL;
  vram_options_t o = *opts;
  for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) {
    const char *v = getenv(settings[i].name);
    if (!v || !*v) continue;
    int rc = vram_options_set(&o, settings[i].name, v, why);
    if (rc) return rc;
  }
  *opts = o;
  return VRAM_OK;
}

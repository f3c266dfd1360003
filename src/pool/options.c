/* options.c - pool options: defaults, source names, and the one table of the VRAMKIT_*
 * environment variables vramkit reads (the pool's options and the others, which Python and
 * the tools ask for through vram_env_variable rather than keep lists of their own). A bad
 * value is an error that names the variable and quotes the value, never a silent default;
 * an unknown VRAMKIT_* name gets one warning with the nearest known one. Sizes: size.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pool/options.h"
#include "source/sim_shared.h"
#include "vramkit.h"

/* vram_set_split_stats_default: set once, early, by whoever wants PyTorch's rows. */
static int split_stats_default;

void vram_set_split_stats_default(int on) {
  __atomic_store_n(&split_stats_default, on ? 1 : 0, __ATOMIC_RELAXED);
}

void vram_options_init(vram_options_t *opts) {
  if (!opts) return;
  memset(opts, 0, sizeof *opts);
  opts->device = 0;
  opts->source = VRAM_SOURCE_AUTO;
  opts->release_threshold = SIZE_MAX;
  opts->tight_threshold = 1.0;
  opts->virtual_threshold = 0.5;
  opts->large_blocks = VRAM_LARGE_VIRTUAL;
  opts->sim_capacity = VRAM_SIM_DEFAULT_CAPACITY;
  opts->managed_prefetch = 1;
  opts->give_back = 1;
  opts->give_back_timeout_ms = VRAM_GIVE_BACK_TIMEOUT_DEFAULT_MS;
  opts->split_stats = __atomic_load_n(&split_stats_default, __ATOMIC_RELAXED);
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

const char *vram_source_spelling(size_t index) {
  return index < sizeof source_names / sizeof source_names[0] ? source_names[index].name : NULL;
}

/* The sims model the GPU sources for placement (sim.c): fixed segments and the
 * ranges they grow into for cuda, mapped granules for vmm. Managed memory cannot reserve a
 * range (placement.c's managed table), so its model is fixed segments throughout. */
int vram_options_host_model(vram_options_t *opts) {
  if (!opts) return VRAM_EINVAL;
  vram_source_kind source = opts->source;
  opts->source = source == VRAM_SOURCE_VMM || source == VRAM_SOURCE_SIM_VMM ? VRAM_SOURCE_SIM_VMM
                                                                             : VRAM_SOURCE_SIM;
  if (source == VRAM_SOURCE_MANAGED) {
    opts->virtual_threshold = 1.0;
    opts->large_blocks = VRAM_LARGE_FIXED;
  }
  return VRAM_OK;
}


/* ---- the table of variables ------------------------------------------------------------
 * A pool option's parser sets it and returns NULL, or returns why the text is refused ("" when
 * "is not WHAT" says it all). */
typedef const char *(*setting_parse_fn)(vram_options_t *o, const char *value);

static const char *parse_source(vram_options_t *o, const char *v) {
  return vram_source_parse(v, &o->source) ? "" : NULL;
}
static const char *parse_size_or_share(const char *v, size_t *bytes, double *fraction) {
  const char *why = vram_parse_size_error(v, 1);
  if (!why) vram_parse_size(v, 1, bytes, fraction);
  return why;
}
/* 0 is refused: TensorFlow's memory_limit and PyTorch's memory fraction read 0 as none
 * allowed, and a limit that silently meant "no limit" would surprise either user. The
 * give-back limits read the same way. */
static const char *parse_nonzero_limit(const char *v, size_t *bytes, double *fraction) {
  *bytes = 0;
  *fraction = 0;
  const char *why = parse_size_or_share(v, bytes, fraction);
  if (!why && *bytes == 0 && *fraction == 0)
    why = "0 would read as no limit: for none, leave it unset";
  return why;
}
static const char *parse_limit(vram_options_t *o, const char *v) {
  return parse_nonzero_limit(v, &o->limit_bytes, &o->limit_fraction);
}
static const char *parse_preallocate(vram_options_t *o, const char *v) {
  return parse_size_or_share(v, &o->preallocate_bytes, &o->preallocate_fraction);
}
static const char *parse_release_threshold(vram_options_t *o, const char *v) {
  const char *why = vram_parse_size_error(v, 0);
  if (!why) vram_parse_size(v, 0, &o->release_threshold, NULL);
  return why;
}
/* A share in [0, 1], written as a fraction ("0.9") or a percentage ("90%"). */
static const char *parse_share(const char *v, double *out) {
  char *end = NULL;
  errno = 0;
  double value = strtod(v, &end);
  if (end == v || errno || !isfinite(value)) return "";
  if (*end == '%') {
    value /= 100.0;
    end++;
  }
  if (*end) return "";
  if (value < 0 || value > 1) return "it is outside 0 to 1";
  *out = value;
  return NULL;
}
static const char *parse_tight_threshold(vram_options_t *o, const char *v) {
  return parse_share(v, &o->tight_threshold);
}
static const char *parse_virtual_threshold(vram_options_t *o, const char *v) {
  return parse_share(v, &o->virtual_threshold);
}
static const char *parse_large_blocks(vram_options_t *o, const char *v) {
  if (strcasecmp(v, "fixed") == 0) o->large_blocks = VRAM_LARGE_FIXED;
  else if (strcasecmp(v, "virtual") == 0) o->large_blocks = VRAM_LARGE_VIRTUAL;
  else return "";
  return NULL;
}
static const char *parse_sim_capacity(vram_options_t *o, const char *v) {
  const char *why = vram_parse_size_error(v, 0);
  if (!why) vram_parse_size(v, 0, &o->sim_capacity, NULL);
  return why ? why : o->sim_capacity ? NULL : "the simulated device needs more than 0 bytes";
}
/* Not an option: read when a pool is made (history.c), checked here so that a bad value is
 * refused with the others, naming the variable. */
static const char *check_switch(vram_options_t *o, const char *v) {
  (void)o;
  int on;
  return _vram_parse_switch(v, &on) ? "" : NULL;
}

static const char *check_sim_shared(vram_options_t *o, const char *v) {
  (void)o;
  return _vram_sim_shared_name_error(v);
}
static const char *parse_give_back(vram_options_t *o, const char *v) {
  return _vram_parse_switch(v, &o->give_back) ? "" : NULL;
}
static const char *parse_give_back_timeout(vram_options_t *o, const char *v) {
  if (!*v || strspn(v, "0123456789") != strlen(v)) return "";
  if (strlen(v) > 5 || strtoul(v, NULL, 10) > VRAM_GIVE_BACK_TIMEOUT_MAX_MS)
    return "it is more than 10000 ms";
  o->give_back_timeout_ms = (unsigned)strtoul(v, NULL, 10);
  return NULL;
}
static const char *parse_no_split(vram_options_t *o, const char *v) {
  return _vram_parse_switch(v, &o->no_split) ? "" : NULL;
}
static const char *parse_group_limit(vram_options_t *o, const char *v) {
  return parse_nonzero_limit(v, &o->group_limit_bytes, &o->group_limit_fraction);
}
static const char *parse_soft_limit(vram_options_t *o, const char *v) {
  return parse_nonzero_limit(v, &o->soft_limit_bytes, &o->soft_limit_fraction);
}

static const struct setting {
  const char *name;
  setting_parse_fn parse; /* a pool option's parser; NULL: read elsewhere */
  setting_parse_fn check; /* read elsewhere, but refused by vram_options_from_env when bad */
  const char *what;       /* "is not WHAT" in a refusal */
  const char *help;       /* what it takes: the "expected" of a refusal, and help texts */
} settings[] = {
    {"VRAMKIT_SOURCE", parse_source, NULL, "a source",
     "auto, sim, sim:cuda, sim:vmm, cuda, vmm or managed"},
    {"VRAMKIT_LIMIT", parse_limit, NULL, "a limit",
     "a size such as 8G or a percentage such as 50%; unset for no limit (0 is refused)"},
    {"VRAMKIT_PREALLOCATE", parse_preallocate, NULL, "a size",
     "a size such as 8G or a percentage such as 50%; 0 or unset for none"},
    {"VRAMKIT_RELEASE_THRESHOLD", parse_release_threshold, NULL, "a size",
     "a size such as 1G"},
    {"VRAMKIT_TIGHT_THRESHOLD", parse_tight_threshold, NULL, "a share",
     "a share of the memory cap from 0 to 1, such as 0.9 or 90%"},
    {"VRAMKIT_VIRTUAL_THRESHOLD", parse_virtual_threshold, NULL, "a share",
     "a share of the memory cap from 0 to 1, such as 0.5 or 50%"},
    {"VRAMKIT_LARGE_BLOCKS", parse_large_blocks, NULL, "a placement", "fixed or virtual"},
    {"VRAMKIT_SIM_CAPACITY", parse_sim_capacity, NULL, "a capacity",
     "a positive size such as 16G"},
    {"VRAMKIT_LEAK_REPORT", NULL, check_switch, "a switch",
     "1 (or on, true, yes) to print the blocks never freed at exit; 0, off, false or no"},
    {"VRAMKIT_SIM_SHARED", NULL, check_sim_shared, "a shared sim name",
     "a name of 1 to 64 letters, digits, '_', '.' or '-': the sim devices of every process "
     "with the same name share one capacity (a file beside the published records)"},
    {"VRAMKIT_GIVE_BACK", parse_give_back, NULL, "a switch",
     "1 (default; or on, true, yes): give idle cached memory back when a neighbour on the "
     "same device runs out; 0, off, false or no: never"},
    {"VRAMKIT_GIVE_BACK_TIMEOUT", parse_give_back_timeout, NULL, "a timeout",
     "milliseconds from 0 to 10000 that a pool about to run out waits for its neighbours to "
     "give back (default 250)"},
    {"VRAMKIT_GROUP_LIMIT", parse_group_limit, NULL, "a limit",
     "a size such as 40G or a percentage of the card such as 80%: what every vramkit process "
     "on the device may reserve together; unset for none (0 is refused)"},
    {"VRAMKIT_SOFT_LIMIT", parse_soft_limit, NULL, "a limit",
     "a size such as 8G or a percentage of the card such as 25%: asked by a neighbour, a "
     "process over it gives back all its idle memory, one under it only what is asked; "
     "unset for none (0 is refused)"},
    {"VRAMKIT_NO_SPLIT", parse_no_split, NULL, "a switch",
     "1 (or on, true, yes): never split a segment, each block its own (PyTorch's "
     "MemPool(no_split=True)); 0 (default), off, false or no"},
    {"VRAMKIT_PUBLISH", NULL, NULL, NULL,
     "1, on, true or yes (default), 0, off, false or no, or cmdline (also store the command "
     "line); anything else leaves publishing on with a warning"},
    {"VRAMKIT_PUBLISH_DIR", NULL, NULL, NULL,
     "where the per-process records go (default /dev/shm/vramkit-<uid>)"},
    {"VRAMKIT_TORCH_BACKEND", NULL, NULL, NULL, "backend or pluggable (Python, PyTorch)"},
    {"VRAMKIT_TORCH_BACKEND_LIB", NULL, NULL, NULL, "a prebuilt PyTorch backend library"},
    {"VRAMKIT_TORCH_HOOKS", NULL, NULL, NULL, "a prebuilt PyTorch fallback hook library"},
    {"VRAMKIT_CACHE_DIR", NULL, NULL, NULL,
     "where built libraries and measurements are cached (default ~/.cache/vramkit)"},
    {"VRAMKIT_NVML_LIBRARY", NULL, NULL, NULL, "the NVML library to open instead of NVIDIA's"},
    {"VRAMKIT_DEBUG_SCRATCH", NULL, NULL, NULL, "Python estimator: report scratch measurements"},
    {"VRAMKIT_TEST_GPU", NULL, NULL, NULL, "tests: 1 runs the GPU conformance tests"},
    {"VRAMKIT_TEST_SOURCE", NULL, NULL, NULL, "tests: the source the C tests run on"},
    {"VRAMKIT_TEST_OPS", NULL, NULL, NULL, "tests: operations per thread of the thread tests"},
    {"VRAMKIT_TEST_GIVE_BACK_DELAY", NULL, NULL, NULL,
     "tests: milliseconds a give-back watcher waits before it answers (a late neighbour)"},
};
enum { N_SETTINGS = sizeof settings / sizeof settings[0] };

const char *vram_env_variable(size_t index, const char **help, int *pool_option) {
  if (index >= N_SETTINGS) return NULL;
  if (help) *help = settings[index].help;
  if (pool_option) *pool_option = settings[index].parse != NULL;
  return settings[index].name;
}

const char *_vram_env_help(const char *name) {
  for (size_t i = 0; i < N_SETTINGS; i++)
    if (strcmp(name, settings[i].name) == 0) return settings[i].help;
  return NULL;
}

void _vram_env_refusal(char *buf, size_t cap, const char *name, const char *value,
                       const char *what, const char *reason, const char *expected) {
  enum { QUOTED = 120 }; /* a long value is cut in the message: the line stays readable */
  int cut = strlen(value) > QUOTED;
  snprintf(buf, cap, "%s: '%.*s%s' is not %s%s%s; expected %s", name, QUOTED, value,
           cut ? "..." : "", what, reason && *reason ? ": " : "", reason ? reason : "",
           expected);
}

/* Edit distance, for the nearest known name of a misspelled one (names are short). */
static size_t distance(const char *a, const char *b) {
  size_t lb = strlen(b), row[64];
  if (lb >= 64) return SIZE_MAX;
  for (size_t j = 0; j <= lb; j++) row[j] = j;
  for (size_t i = 1; a[i - 1]; i++) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t up = row[j];
      size_t best = diagonal + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diagonal = up;
    }
  }
  return row[lb];
}

static const char *nearest_known(const char *name, size_t length) {
  char copy[64];
  snprintf(copy, sizeof copy, "%.*s", (int)(length < 63 ? length : 63), name);
  const char *best = settings[0].name;
  size_t best_distance = SIZE_MAX;
  for (size_t i = 0; i < N_SETTINGS; i++) {
    size_t d = distance(copy, settings[i].name);
    if (d < best_distance) best_distance = d, best = settings[i].name;
  }
  return best;
}

extern char **environ;

/* Once per process: a VRAMKIT_* name nothing reads is most likely a typo the user believes
 * took effect, so say so, with the name they probably meant. */
static void warn_unknown_names(void) {
  for (char **e = environ; e && *e; e++) {
    if (strncmp(*e, "VRAMKIT_", 8) != 0) continue;
    const char *eq = strchr(*e, '=');
    size_t length = eq ? (size_t)(eq - *e) : strlen(*e);
    int known = 0;
    for (size_t i = 0; i < N_SETTINGS && !known; i++)
      known = strlen(settings[i].name) == length && strncmp(*e, settings[i].name, length) == 0;
    if (known) continue;
    char shown[256]; /* the environment is foreign text: shown escaped */
    vram_escape_text(shown, sizeof shown, *e, length);
    fprintf(stderr, "vramkit: warning: %s is not a vramkit variable and is ignored; did you mean "
                    "%s?\n", shown, nearest_known(*e, length));
  }
}
static pthread_once_t unknown_once = PTHREAD_ONCE_INIT;

/* The text of a refusal: *why points here, one per thread, until its next refusal. */
static _Thread_local char why_text[512];

static int refuse(const struct setting *s, const char *value, const char *reason,
                  const char **why) {
  _vram_env_refusal(why_text, sizeof why_text, s->name, value, s->what, reason, s->help);
  if (why) *why = why_text;
  return VRAM_EENV;
}

int vram_options_set(vram_options_t *opts, const char *name, const char *value, const char **why) {
  if (!opts || !name || !value) return VRAM_EINVAL;
  for (size_t i = 0; i < N_SETTINGS; i++) {
    if (strcmp(name, settings[i].name) != 0 || !settings[i].parse) continue;
    vram_options_t o = *opts;
    const char *reason = settings[i].parse(&o, value);
    if (reason) return refuse(&settings[i], value, reason, why);
    *opts = o;
    return VRAM_OK;
  }
  snprintf(why_text, sizeof why_text, "%s is not a pool option (did you mean %s?)", name,
           nearest_known(name, strlen(name)));
  if (why) *why = why_text;
  return VRAM_EINVAL;
}

void vram_options_warn_unknown(void) { pthread_once(&unknown_once, warn_unknown_names); }

int vram_options_from_env(vram_options_t *opts, const char **why) {
  if (!opts) return VRAM_EINVAL;
  vram_options_warn_unknown();
  vram_options_t o = *opts;
  for (size_t i = 0; i < N_SETTINGS; i++) {
    const char *v = getenv(settings[i].name);
    if (!v || !*v || (!settings[i].parse && !settings[i].check)) continue;
    const char *reason = (settings[i].parse ? settings[i].parse : settings[i].check)(&o, v);
    if (reason) return refuse(&settings[i], v, reason, why);
  }
  *opts = o;
  return VRAM_OK;
}

/* _core_replay.c - vramkit._core.replay and replay_reserved: the library's replay
 * (vram_replay_*, vramkit.h) as calls, so that the estimator, the doctor and the plots get
 * the engine's figures in this process, with no command to find, run and parse.
 *
 * Both run on pools of their own (vram_pool_create), never the process-wide default pools,
 * so a caller's pools are neither configured nor filled by them; and neither reads the
 * environment: the pool options are the call's (settings), one rule for every caller.
 */
#include "_core.h"

#include <stdlib.h>

/* Options of the pool from the source's name and (name, value) pairs of VRAMKIT_* pool
 * settings; -1 with a Python error. */
static int pool_options(core_state *st, const char *source, PyObject *settings,
                        vram_options_t *opts) {
  vram_options_init(opts);
  if (vram_source_parse(source, &opts->source) != VRAM_OK) {
    PyObject *name = PyUnicode_DecodeFSDefault(source);
    if (name != NULL) {
      PyErr_Format(PyExc_ValueError, "replay(): unknown source %R", name);
      Py_DECREF(name);
    }
    return -1;
  }
  if (settings == Py_None) return 0;
  PyObject *items = PySequence_Fast(settings, "replay(): settings must be (name, value) pairs");
  if (items == NULL) return -1;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items); i++) {
    const char *name, *value, *why = NULL;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(items, i), "ss", &name, &value)) {
      Py_DECREF(items);
      return -1;
    }
    int rc = vram_options_set(opts, name, value, &why);
    if (rc != VRAM_OK) {
      Py_DECREF(items);
      if (rc == VRAM_EINVAL)
        PyErr_Format(PyExc_ValueError, "replay(): %s is not a pool setting", name);
      else
        raise_message(st, rc, PyUnicode_FromString(why ? why : name), NULL);
      return -1;
    }
  }
  Py_DECREF(items);
  return 0;
}

static int set_item(PyObject *dict, const char *key, PyObject *value) {
  if (value == NULL) return -1;
  int rc = PyDict_SetItemString(dict, key, value);
  Py_DECREF(value);
  return rc;
}

static double rounded(double value, double scale) {
  return (double)(long long)(value * scale + (value >= 0 ? 0.5 : -0.5)) / scale;
}

static double ratio(uint64_t numerator, uint64_t denominator) {
  return denominator ? (double)numerator / (double)denominator : 0.0;
}

/* The keys of `vramkit replay --json`, rounded as it prints them, and the first OOM. */
static PyObject *result_dict(const vram_replay_result *r, const vram_replay_options *opts) {
  PyObject *d = PyDict_New();
  if (d == NULL) return NULL;
  /* A figure the replay has none of (no time per op where no pool was made; no reserved
   * over live there, nor where ops ran out of memory) is null, as in the command's JSON. */
  /* As the command's JSON writes it: a byte that starts no UTF-8 sequence reads U+FFFD. */
  int bad = set_item(d, "trace", PyUnicode_DecodeUTF8(r->name, (Py_ssize_t)strlen(r->name),
                                                      "replace")) ||
            set_item(d, "source", PyUnicode_FromString(vram_source_name(r->source))) ||
            set_item(d, "ops", PyLong_FromUnsignedLongLong(r->ops)) ||
            set_item(d, "peak_live_bytes", PyLong_FromUnsignedLongLong(r->peak_live_bytes)) ||
            set_item(d, "peak_reserved_bytes",
                     PyLong_FromUnsignedLongLong(r->peak_reserved_bytes)) ||
            set_item(d, "reserved_over_live",
                     vram_replay_reserved_over_live(r) > 0
                         ? PyFloat_FromDouble(rounded(vram_replay_reserved_over_live(r), 1000))
                         : Py_NewRef(Py_None)) ||
            set_item(d, "ns_per_op", r->ns_per_op > 0
                                         ? PyFloat_FromDouble(rounded(r->ns_per_op, 10))
                                         : Py_NewRef(Py_None)) ||
            set_item(d, "ooms", PyLong_FromUnsignedLongLong(r->ooms)) ||
            set_item(d, "skipped_frees", PyLong_FromUnsignedLongLong(r->skipped_frees)) ||
            set_item(d, "repeat", PyLong_FromLong(opts->repeat)) ||
            set_item(d, "device_calls", PyLong_FromUnsignedLongLong(r->device_calls));
  if (!bad && opts->capacity)
    bad = set_item(d, "capacity_bytes", PyLong_FromUnsignedLongLong(opts->capacity));
  if (!bad && opts->min_capacity) {
    int found = r->have_min_capacity > 0;
    bad = set_item(d, "min_capacity_bytes", found ? PyLong_FromUnsignedLongLong(
                                                        r->min_capacity_bytes)
                                                  : Py_NewRef(Py_None)) ||
          set_item(d, "min_capacity_over_live",
                   found ? PyFloat_FromDouble(rounded(
                               ratio(r->min_capacity_bytes, r->peak_live_bytes), 1000))
                         : Py_NewRef(Py_None)) ||
          set_item(d, "min_capacity_source",
                   PyUnicode_FromString(vram_source_name(r->min_capacity_source)));
  }
  if (!bad)
    bad = set_item(d, "first_oom_report", r->ooms ? PyUnicode_DecodeUTF8(
                                                        r->first_oom_report,
                                                        (Py_ssize_t)strlen(r->first_oom_report),
                                                        "replace")
                                                  : Py_NewRef(Py_None)) ||
          set_item(d, "first_oom", r->ooms ? oom_info_dict(&r->first_oom_info)
                                           : Py_NewRef(Py_None));
  if (bad) Py_CLEAR(d);
  return d;
}

PyObject *core_replay(PyObject *module, PyObject *args, PyObject *kwargs) {
  static char *keywords[] = {"path", "source", "capacity", "min_capacity", "repeat",
                             "settings", "max_ops", "host_model", NULL};
  PyObject *path_obj, *settings = Py_None;
  const char *source = "sim";
  unsigned long long capacity = 0;
  int min_capacity = 0, repeat = 1, host_model = 0;
  long long max_ops = -1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|sKpiOLp:replay", keywords,
                                   PyUnicode_FSConverter, &path_obj, &source, &capacity,
                                   &min_capacity, &repeat, &settings, &max_ops, &host_model))
    return NULL;
  core_state *st = get_state(module);
  vram_replay_options opts;
  vram_replay_options_init(&opts, NULL);
  if (pool_options(st, source, settings, &opts.pool) != 0 || repeat < 1) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "replay(): repeat must be >= 1");
    Py_DECREF(path_obj);
    return NULL;
  }
  if (host_model) vram_options_host_model(&opts.pool);
  opts.capacity = capacity;
  opts.min_capacity = min_capacity;
  opts.private_pools = 1; /* vramkit.replay() reads no environment: see _replaying.py */
  opts.repeat = repeat;
  vram_replay_result *result = calloc(1, sizeof *result);
  if (result == NULL) {
    Py_DECREF(path_obj);
    return PyErr_NoMemory();
  }
  uint64_t limit = max_ops < 0 ? VRAM_TRACE_DEFAULT_MAX_OPS : (uint64_t)max_ops;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = vram_replay_run(&opts, PyBytes_AS_STRING(path_obj), limit, result);
  Py_END_ALLOW_THREADS
  Py_DECREF(path_obj);
  PyObject *out = NULL;
  if (rc == VRAM_OK) {
    out = result_dict(result, &opts);
  } else {
    if (rc == VRAM_EIO) {
      /* A file that cannot be opened or decompressed: what reading it in Python raises. */
      raise_io_error(result->error);
    } else {
      raise_message(st, rc,
                    PyUnicode_DecodeUTF8(result->error, (Py_ssize_t)strlen(result->error),
                                         "replace"),
                    NULL);
    }
  }
  free(result);
  return out;
}

/* Run the ops (int64 triples: size, or -1 for a free; block number; stream) through pool,
 * appending (op number, reserved) to out wherever reserved changed. -1 on failure. */
static int reserved_steps(vram_pool_t *pool, const int64_t *ops, size_t count, void **blocks,
                          size_t block_count, int64_t *out, size_t *steps, int64_t *last) {
  vram_stats_t stats;
  int rc = VRAM_OK;
  for (size_t i = 0; i < count && rc == VRAM_OK; i++) {
    int64_t size = ops[3 * i], number = ops[3 * i + 1], stream = ops[3 * i + 2];
    if (number < 0 || (size_t)number >= block_count) return VRAM_EINVAL;
    if (size >= 0) {
      rc = vram_malloc(pool, (size_t)size, (vram_stream_t)(uintptr_t)stream, &blocks[number]);
    } else if (blocks[number]) {
      rc = vram_free(pool, blocks[number]);
      blocks[number] = NULL;
    }
    if (rc == VRAM_OK) rc = vram_get_stats(pool, &stats);
    if (rc == VRAM_OK && stats.reserved_bytes.current != *last) {
      *last = stats.reserved_bytes.current;
      out[2 * *steps] = (int64_t)i;
      out[2 * *steps + 1] = *last;
      ++*steps;
    }
  }
  return rc;
}

PyObject *core_replay_reserved(PyObject *module, PyObject *args) {
  Py_buffer ops;
  unsigned long long capacity;
  Py_ssize_t block_count;
  if (!PyArg_ParseTuple(args, "y*Kn:replay_reserved", &ops, &capacity, &block_count))
    return NULL;
  core_state *st = get_state(module);
  size_t count = (size_t)ops.len / (3 * sizeof(int64_t));
  vram_options_t opts;
  vram_options_init(&opts);
  opts.source = VRAM_SOURCE_SIM;
  opts.sim_capacity = (size_t)capacity;
  vram_pool_t *pool = NULL;
  void **blocks = calloc(block_count > 0 ? (size_t)block_count : 1, sizeof *blocks);
  int64_t *out = malloc((count ? count : 1) * 2 * sizeof *out);
  size_t steps = 0;
  int64_t last = 0;
  int rc = blocks && out ? VRAM_OK : VRAM_EHOSTMEM;
  Py_BEGIN_ALLOW_THREADS
  if (rc == VRAM_OK) rc = vram_pool_create(&pool, &opts);
  if (rc == VRAM_OK)
    rc = reserved_steps(pool, ops.buf, count, blocks, (size_t)block_count, out, &steps, &last);
  if (pool) {
    for (Py_ssize_t i = 0; i < block_count; i++)
      if (blocks[i]) vram_free(pool, blocks[i]);
    vram_pool_destroy_force(pool);
  }
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&ops);
  free(blocks);
  PyObject *result = rc == VRAM_OK ? PyBytes_FromStringAndSize((const char *)out,
                                                               (Py_ssize_t)(2 * steps * sizeof *out))
                                   : raise_message(st, rc, PyUnicode_FromString(
                                                       vram_strerror(rc)), NULL);
  free(out);
  return result;
}

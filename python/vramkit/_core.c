/* _core.c - vramkit._core, the thin CPython layer over the public C API (vramkit.h): the
 * module, its pool-wide functions and its method table (_core.h says where the rest is).
 *
 * Everything here is wrapping: parse arguments, call one vram_ function, turn its status
 * into an exception or its result into Python objects. Policy (device names, PyTorch key
 * names, TensorFlow semantics) lives in the Python package above this module.
 *
 * Shape follows CPython's Modules/xxlimited.c: multi-phase init (PyModuleDef_Init with a
 * Py_mod_exec slot), a module state holding the exception types and the DeviceBuffer
 * type, parse formats ending in ":name", and ONE function, status_type(), that maps a
 * vram_status to an exception type. Messages name what the user gave (the device, the
 * argument, the environment variable), never this module's own function names: the user
 * called vramkit.memory_stats(99), not stats().
 *
 * The pools are the library's process-wide default pools (vram_default_pool). The
 * extension links the shared libvramkit, not a static copy, so that PyTorch's hooks
 * (libvramkit_torch, which links the same libvramkit) and this module see the very same
 * pools: one set of statistics, one limit, one cache per device in the process.
 */
#include "_core.h"

VRAMKIT_PY_INTERNAL unsigned char pool_touched[VRAMKIT_MAX_TRACKED];

/* ---------------------------------------------------------------------------------------
 * Pool-wide functions. Each takes a device ordinal; the Python layer resolves names.
 * ------------------------------------------------------------------------------------- */
static PyObject *stat_tuple(const vram_stat_t *s) {
  return Py_BuildValue("(LLL)", (long long)s->current, (long long)s->peak, (long long)s->total);
}

/* The calls on one pool, shared by the module's functions (a device's default pool) and
 * the methods of Pool (_core_pool.c). `device` only names the pool in messages. */
PyObject *pool_stats(core_state *st, vram_pool_t *pool, int device) {
  vram_stats_t s;
  int rc = vram_get_stats(pool, &s);
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);

  PyObject *d = PyDict_New();
  if (d == NULL) return NULL;
  PyObject *v;
  /* The engine's own X-macro lists name the fields, so nothing here goes stale. */
#define ADD(key, expr)                                                                     \
  v = (expr);                                                                              \
  if (v == NULL || PyDict_SetItemString(d, key, v) < 0) {                                  \
    Py_XDECREF(v);                                                                         \
    Py_DECREF(d);                                                                          \
    return NULL;                                                                           \
  }                                                                                        \
  Py_DECREF(v);
#define X_STAT(name, doc) ADD(#name, stat_tuple(&s.name))
#define X_COUNTER(name, doc) ADD(#name, PyLong_FromUnsignedLongLong(s.name))
  VRAM_STAT_LIST(X_STAT)
  VRAM_COUNTER_LIST(X_COUNTER)
#undef X_STAT
#undef X_COUNTER
  ADD("largest_free_block", PyLong_FromSize_t(s.largest_free_block))
  ADD("fragmentation", PyFloat_FromDouble(s.fragmentation))
  ADD("limit_bytes", PyLong_FromSize_t(s.limit_bytes))
#undef ADD
  return d;
}

/* One kind's stats as {name: (current, peak, total)}. */
static PyObject *kind_dict(const vram_kind_stats_t *k) {
  PyObject *d = PyDict_New();
  if (d == NULL) return NULL;
  struct { const char *name; const vram_stat_t *stat; } rows[] = {
#define X_ROW(name, doc) {#name, &k->name},
      VRAM_STAT_LIST(X_ROW)
#undef X_ROW
      {"inactive_split", &k->inactive_split},
      {"inactive_split_bytes", &k->inactive_split_bytes}};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    PyObject *v = stat_tuple(rows[i].stat);
    if (v == NULL || PyDict_SetItemString(d, rows[i].name, v) < 0) {
      Py_XDECREF(v);
      Py_DECREF(d);
      return NULL;
    }
    Py_DECREF(v);
  }
  return d;
}

/* vram_get_split_stats: PyTorch's small_pool and large_pool rows. */
PyObject *pool_split_stats(core_state *st, vram_pool_t *pool, int device) {
  vram_split_stats_t s;
  int rc = vram_get_split_stats(pool, &s);
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  PyObject *small = kind_dict(&s.small), *large = small ? kind_dict(&s.large) : NULL;
  PyObject *out = large ? Py_BuildValue("{sOsOsK}", "small_pool", small, "large_pool", large,
                                        "num_sync_all_streams",
                                        (unsigned long long)s.num_sync_all_streams)
                        : NULL;
  Py_XDECREF(small);
  Py_XDECREF(large);
  return out;
}

/* A pool's text (vram_summary, vram_stats_json, vram_oom_report). */
PyObject *pool_text_of(core_state *st, vram_pool_t *pool, int device, text_fn fn) {
  int rc;
  PyObject *text = pool_text(pool, fn, &rc);
  if (text == NULL && rc != VRAM_OK) return raise_status(st, rc, device, pool);
  return text;
}

PyObject *pool_empty_cache(core_state *st, vram_pool_t *pool, int device) {
  int rc;
  /* Releasing segments calls the driver (cuMemFree, unmaps): other threads may run. */
  Py_BEGIN_ALLOW_THREADS
  rc = vram_empty_cache(pool);
  Py_END_ALLOW_THREADS
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  Py_RETURN_NONE;
}

PyObject *pool_reset_peak_stats(core_state *st, vram_pool_t *pool, int device) {
  int rc = vram_reset_peak_stats(pool);
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  Py_RETURN_NONE;
}

PyObject *pool_mem_get_info(core_state *st, vram_pool_t *pool, int device) {
  size_t free_bytes = 0, total_bytes = 0;
  int rc = vram_mem_get_info(pool, &free_bytes, &total_bytes);
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  /* Sizes: unsigned, so that a figure past 2^63 is not read as a negative Py_ssize_t. */
  return Py_BuildValue("(KK)", (unsigned long long)free_bytes, (unsigned long long)total_bytes);
}

/* A limit caps reserved memory; it asks for nothing, so one past any device is no
 * out-of-memory error but a bad argument. */
int limit_fits(core_state *st, const size_arg *limit) {
  if (!limit->too_big) return 1;
  raise_message(st, VRAM_EINVAL,
                PyUnicode_FromFormat("limit: %S bytes is more than any device holds "
                                     "(0 removes the limit)",
                                     limit->obj),
                NULL);
  return 0;
}

PyObject *pool_set_limit(core_state *st, vram_pool_t *pool, int device, size_t bytes,
                         double fraction) {
  int rc;
  if (!(fraction >= 0.0 && fraction <= 1.0)) { /* NaN too */
    PyObject *given = PyFloat_FromDouble(fraction);
    if (given == NULL) return NULL;
    PyObject *message = PyUnicode_FromFormat("set_limit(): the fraction must be from 0 to 1 "
                                             "(0: none), not %R", given);
    Py_DECREF(given);
    return raise_message(st, VRAM_EINVAL, message, NULL);
  }
  /* Lowering a limit may release cached segments through the driver. */
  Py_BEGIN_ALLOW_THREADS
  rc = vram_set_limit(pool, bytes, fraction);
  Py_END_ALLOW_THREADS
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  Py_RETURN_NONE;
}

PyObject *pool_summary(core_state *st, vram_pool_t *pool, int device) {
  return pool_text_of(st, pool, device, vram_summary);
}

PyObject *pool_stats_json(core_state *st, vram_pool_t *pool, int device) {
  return pool_text_of(st, pool, device, vram_stats_json);
}

PyObject *pool_oom_report(core_state *st, vram_pool_t *pool, int device) {
  return pool_text_of(st, pool, device, vram_oom_report);
}

/* The module's functions on a device's default pool: (device, /) in, the pool call out. */
PyObject *on_default_pool(PyObject *module, PyObject *args, const char *format,
                          pool_call call) {
  int device;
  if (!PyArg_ParseTuple(args, format, device_converter, &device)) return NULL;
  core_state *st = get_state(module);
  vram_pool_t *pool = get_pool(st, device);
  return pool == NULL ? NULL : call(st, pool, device);
}

#define ON_DEFAULT_POOL(name)                                                              \
  static PyObject *core_##name(PyObject *module, PyObject *args) {                         \
    return on_default_pool(module, args, "O&:" #name, pool_##name);                        \
  }
ON_DEFAULT_POOL(stats)
ON_DEFAULT_POOL(split_stats)
ON_DEFAULT_POOL(summary)
ON_DEFAULT_POOL(stats_json)
ON_DEFAULT_POOL(oom_report)
ON_DEFAULT_POOL(empty_cache)
ON_DEFAULT_POOL(reset_peak_stats)
ON_DEFAULT_POOL(mem_get_info)
#undef ON_DEFAULT_POOL

static PyObject *core_set_limit(PyObject *module, PyObject *args) {
  int device;
  core_state *st = get_state(module);
  size_arg limit = {.name = "limit", .st = st};
  double fraction;
  if (!PyArg_ParseTuple(args, "O&O&d:set_limit", device_converter, &device, size_converter,
                        &limit, &fraction))
    return NULL;
  if (!limit_fits(st, &limit)) return NULL;
  vram_pool_t *pool = get_pool(st, device);
  return pool == NULL ? NULL : pool_set_limit(st, pool, device, limit.bytes, fraction);
}

static PyObject *core_enable_peer_access(PyObject *module, PyObject *args) {
  int device, peer;
  if (!PyArg_ParseTuple(args, "O&O&:enable_peer_access", device_converter, &device,
                        device_converter, &peer)) return NULL;
  core_state *st = get_state(module);
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
  int rc = vram_enable_peer_access(pool, peer);
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  Py_RETURN_NONE;
}

static PyObject *core_source_names(PyObject *module, PyObject *Py_UNUSED(ignored)) {
  (void)module;
  PyObject *names = PyList_New(0);
  const char *name;
  for (size_t i = 0; names && (name = vram_source_spelling(i)) != NULL; i++) {
    PyObject *text = PyUnicode_FromString(name);
    if (text == NULL || PyList_Append(names, text) < 0) Py_CLEAR(names);
    Py_XDECREF(text);
  }
  if (names == NULL) return NULL;
  PyObject *tuple = PyList_AsTuple(names);
  Py_DECREF(names);
  return tuple;
}

static PyObject *core_source(PyObject *module, PyObject *args) {
  int device;
  if (!PyArg_ParseTuple(args, "O&:source", device_converter, &device)) return NULL;
  vram_pool_t *pool = get_pool(get_state(module), device);
  if (pool == NULL) return NULL;
  return PyUnicode_FromString(vram_source_name(vram_pool_source(pool)));
}

/* One override of init_pool or option of Pool: `value` is the text, or (argument, text)
 * when it came from a Python argument, which a bad value then blames instead of the
 * variable, with argument_status (init_pool: a bad argument; Pool: a bad option). */
int apply_override(core_state *st, vram_options_t *opts, PyObject *key, PyObject *value,
                   int argument_status) {
  PyObject *argument = NULL, *text_obj = value;
  if (PyTuple_Check(value) && PyTuple_GET_SIZE(value) == 2) {
    argument = PyTuple_GET_ITEM(value, 0);
    text_obj = PyTuple_GET_ITEM(value, 1);
  }
  const char *name = PyUnicode_AsUTF8(key);
  const char *text = name ? PyUnicode_AsUTF8(text_obj) : NULL;
  if (text == NULL) return -1;
  const char *why = NULL;
  int rc = vram_options_set(opts, name, text, &why);
  if (rc == VRAM_OK) return 0;
  /* The engine's message quotes the value: blame the argument, or keep the variable. The
   * value is the caller's text, shown escaped as every foreign text is. */
  const char *message = why ? (argument != NULL ? reason_of(why, name) : why) : vram_strerror(rc);
  char shown[2048];
  vram_escape_text(shown, sizeof shown, message, strlen(message));
  if (argument != NULL)
    raise_message(st, argument_status, PyUnicode_FromFormat("%S: %s", argument, shown), NULL);
  else
    raise_message(st, rc, PyUnicode_FromString(shown), NULL);
  return -1;
}

/* init_pool(device, overrides=None): create the device's default pool now. overrides maps
 * VRAMKIT_* names to text or (argument, text) and wins over the environment; the
 * environment is not touched (other threads may be reading it). */
static PyObject *core_init_pool(PyObject *module, PyObject *args) {
  int device;
  PyObject *overrides = Py_None;
  if (!PyArg_ParseTuple(args, "O&|O:init_pool", device_converter, &device, &overrides))
    return NULL;
  core_state *st = get_state(module);
  if (overrides == Py_None) {
    if (get_pool(st, device) == NULL) return NULL;
    Py_RETURN_NONE;
  }
  if (!PyDict_Check(overrides)) {
    PyErr_SetString(PyExc_TypeError, "init_pool: overrides must be a dict or None");
    return NULL;
  }
  vram_options_t opts;
  vram_options_init(&opts);
  /* A bad variable is an error even where an argument overrides it: it is still wrong. */
  int rc = vram_options_from_env(&opts, NULL);
  if (rc != VRAM_OK) return raise_status(st, rc, device, NULL);
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(overrides, &pos, &key, &value))
    if (apply_override(st, &opts, key, value, VRAM_EINVAL) < 0) return NULL;
  opts.device = device;
  vram_pool_t *pool = NULL;
  /* Preallocation may call the driver: let other threads run meanwhile. */
  Py_BEGIN_ALLOW_THREADS
  rc = vram_default_pool_create(&opts, &pool);
  Py_END_ALLOW_THREADS
  if (rc == VRAM_EDEVICE) return raise_bad_device(st, device, opts.source);
  if (rc == VRAM_ESIMCAPACITY) return raise_sim_capacity(st, device, opts.sim_capacity);
  /* The engine's EBUSY here means the pool exists, not that blocks are live (its generic
   * text): say what the caller can act on. */
  if (rc == VRAM_EBUSY)
    return raise_message(st, rc,
                         PyUnicode_FromFormat("device %d: its default pool was already "
                                              "created (options are fixed then), so these "
                                              "options cannot apply",
                                              device),
                         NULL);
  if (rc != VRAM_OK) return raise_status(st, rc, device, NULL);
  if (device >= 0 && device < VRAMKIT_MAX_TRACKED) pool_touched[device] = 1;
  Py_RETURN_NONE;
}

static PyObject *core_pool_touched(PyObject *module, PyObject *args) {
  int device;
  if (!PyArg_ParseTuple(args, "O&:pool_touched", device_converter, &device)) return NULL;
  int touched = device >= 0 && device < VRAMKIT_MAX_TRACKED && pool_touched[device];
  return PyBool_FromLong(touched);
}

static PyObject *core_device_count(PyObject *module, PyObject *args) {
  const char *name = "auto";
  if (!PyArg_ParseTuple(args, "|s:device_count", &name)) return NULL;
  core_state *st = get_state(module);
  vram_source_kind kind;
  int rc = vram_source_parse(name, &kind);
  if (rc != VRAM_OK)
    return raise_message(st, rc,
                         PyUnicode_FromFormat("source: unknown source '%s'; expected auto, "
                                              "sim, sim:cuda, sim:vmm, cuda, vmm or managed",
                                              name),
                         NULL);
  int count = 0;
  rc = vram_device_count(kind, &count);
  if (rc != VRAM_OK) return raise_status(st, rc, NO_DEVICE, NULL);
  return PyLong_FromLong(count);
}

static PyObject *core_parse_size(PyObject *module, PyObject *args) {
  const char *text;
  int allow_percent = 0;
  if (!PyArg_ParseTuple(args, "s|p:parse_size", &text, &allow_percent)) return NULL;
  size_t bytes = 0;
  double fraction = 0.0;
  const char *why = vram_parse_size_error(text, allow_percent);
  int rc = why ? VRAM_EINVAL : vram_parse_size(text, allow_percent, &bytes, &fraction);
  if (rc != VRAM_OK)
    return raise_message(get_state(module), rc,
                         PyUnicode_FromFormat("'%s' is not a size: %s", text,
                                              why ? why : vram_strerror(rc)),
                         NULL);
  return Py_BuildValue("(Kd)", (unsigned long long)bytes, fraction);
}

/* The engine's warning about VRAMKIT_* names it does not read (once per process), for the
 * Python subcommands, which may make no pool: one rule for the nearest name, the engine's. */
static PyObject *core_warn_unknown_variables(PyObject *module, PyObject *Py_UNUSED(ignored)) {
  (void)module;
  fflush(stderr);
  vram_options_warn_unknown();
  Py_RETURN_NONE;
}

/* The engine's reading of the VRAMKIT_* environment, for the Python subcommands, which may
 * make no pool: None when it takes every variable, else why not (env_problem). */
static PyObject *core_environment_problem(PyObject *module, PyObject *Py_UNUSED(ignored)) {
  (void)module;
  char problem[2200];
  if (!env_problem(problem, sizeof problem)) Py_RETURN_NONE;
  return PyUnicode_FromString(problem);
}

/* The library's table of VRAMKIT_* variables, so that no Python module keeps a list. */
static PyObject *core_env_variables(PyObject *module, PyObject *Py_UNUSED(ignored)) {
  PyObject *rows = PyList_New(0);
  const char *name, *help;
  int pool_option;
  for (size_t i = 0; rows && (name = vram_env_variable(i, &help, &pool_option)); i++) {
    PyObject *row = Py_BuildValue("(ssO)", name, help, pool_option ? Py_True : Py_False);
    if (row == NULL || PyList_Append(rows, row) < 0) Py_CLEAR(rows);
    Py_XDECREF(row);
  }
  PyObject *result = rows ? PyList_AsTuple(rows) : NULL;
  Py_XDECREF(rows);
  return result;
}

static PyObject *core_raise_status(PyObject *module, PyObject *args) {
  int status;
  const char *what = "vramkit";
  if (!PyArg_ParseTuple(args, "i|s:raise_status", &status, &what)) return NULL;
  if (status == VRAM_OK) Py_RETURN_NONE;
  return raise_message(get_state(module), status,
                       PyUnicode_FromFormat("%s: %s", what, vram_strerror(status)), NULL);
}

/* error(status, message): the exception, not raised, so the package's own checks raise
 * errors that carry .status and .errname like the engine's. */
static PyObject *core_error(PyObject *module, PyObject *args) {
  int status;
  PyObject *message;
  if (!PyArg_ParseTuple(args, "iU:error", &status, &message)) return NULL;
  return new_error(get_state(module), status, message, NULL);
}

static PyObject *core_set_device_resolver(PyObject *module, PyObject *resolver) {
  if (!PyCallable_Check(resolver)) {
    PyErr_SetString(PyExc_TypeError, "set_device_resolver: a callable is required");
    return NULL;
  }
  core_state *st = get_state(module);
  Py_XSETREF(st->device_resolver, Py_NewRef(resolver));
  Py_RETURN_NONE;
}

static PyObject *core_strerror(PyObject *module, PyObject *args) {
  int status;
  if (!PyArg_ParseTuple(args, "i:strerror", &status)) return NULL;
  return Py_BuildValue("(ss)", vram_errname(status), vram_strerror(status));
}

static PyMethodDef core_methods[] = {
    {"empty", (PyCFunction)(void (*)(void))core_empty, METH_VARARGS | METH_KEYWORDS,
     PyDoc_STR("empty(nbytes, device=0, stream=None)\n--\n\nAllocate nbytes of device "
               "memory from the device's default pool; returns a DeviceBuffer.")},
    {"stats", core_stats, METH_VARARGS,
     PyDoc_STR("stats(device, /)\n--\n\nThe pool's vram_stats_t: stats as (current, peak, "
               "total) tuples, counters as ints.")},
    {"summary", core_summary, METH_VARARGS,
     PyDoc_STR("summary(device, /)\n--\n\nThe pool's text summary table.")},
    {"split_stats", core_split_stats, METH_VARARGS,
     PyDoc_STR("split_stats(device, /)\n--\n\nvram_get_split_stats: {'small_pool': {stat: "
               "(current, peak, total)}, 'large_pool': {...}, 'num_sync_all_streams': int}.")},
    {"stats_json", core_stats_json, METH_VARARGS,
     PyDoc_STR("stats_json(device, /)\n--\n\nThe pool's statistics as a JSON string.")},
    {"oom_info", core_oom_info, METH_VARARGS,
     PyDoc_STR("oom_info(device, /)\n--\n\nThe figures and cause of the pool's last OOM as a "
               "dict (vram_oom_info_t; cause as its name), or None if it had none.")},
    {"oom_classify", core_oom_classify, METH_O,
     PyDoc_STR("oom_classify(figures, /)\n--\n\nThe engine's cause of these figures "
               "(vram_oom_classify): the dict oom_info gives, filled from a mapping with "
               "requested, capacity, device_free, limit, reserved, allocated, cached_free, "
               "largest_free_block, granularity (absent: 0).")},
    {"oom_report", core_oom_report, METH_VARARGS,
     PyDoc_STR("oom_report(device, /)\n--\n\nThe report of the pool's last OOM ('' if none).")},
    {"empty_cache", core_empty_cache, METH_VARARGS,
     PyDoc_STR("empty_cache(device, /)\n--\n\nReturn fully free cached segments to the driver.")},
    {"reset_peak_stats", core_reset_peak_stats, METH_VARARGS,
     PyDoc_STR("reset_peak_stats(device, /)\n--\n\nSet every peak to its current value.")},
    {"mem_get_info", core_mem_get_info, METH_VARARGS,
     PyDoc_STR("mem_get_info(device, /)\n--\n\n(free, total) bytes of the device.")},
    {"set_limit", core_set_limit, METH_VARARGS,
     PyDoc_STR("set_limit(device, limit, fraction, /)\n--\n\nHard limit on reserved memory, in "
               "bytes or as a fraction of the device; 0 and 0.0 remove it.")},
    {"enable_peer_access", core_enable_peer_access, METH_VARARGS,
     PyDoc_STR("enable_peer_access(device, peer, /)\n--\n\nLet peer read and write device's "
               "pool (virtual-memory sources).")},
    {"source_names", core_source_names, METH_NOARGS,
     PyDoc_STR("source_names(/)\n--\n\nThe source names the engine accepts "
               "(vram_source_spelling), in its order.")},
    {"source", core_source, METH_VARARGS,
     PyDoc_STR("source(device, /)\n--\n\nName of the memory source behind the pool.")},
    {"init_pool", core_init_pool, METH_VARARGS,
     PyDoc_STR("init_pool(device, overrides=None, /)\n--\n\nCreate the device's default pool "
               "now, from the VRAMKIT_* environment and overrides {variable: text or "
               "(argument, text)}.")},
    {"pool_touched", core_pool_touched, METH_VARARGS,
     PyDoc_STR("pool_touched(device, /)\n--\n\nWhether this process has used the device's pool "
               "from Python.")},
    {"device_count", core_device_count, METH_VARARGS,
     PyDoc_STR("device_count(source='auto', /)\n--\n\nDevices the source can see.")},
    {"parse_size", core_parse_size, METH_VARARGS,
     PyDoc_STR("parse_size(text, allow_percent=False, /)\n--\n\n(bytes, fraction) of a size "
               "such as '64K', '1.5G' or '30%'.")},
    {"warn_unknown_variables", core_warn_unknown_variables, METH_NOARGS,
     PyDoc_STR("warn_unknown_variables(/)\n--\n\nWarn on stderr, once per process, of each "
               "VRAMKIT_* variable vramkit does not read, naming the nearest it does.")},
    {"environment_problem", core_environment_problem, METH_NOARGS,
     PyDoc_STR("environment_problem(/)\n--\n\nNone if the engine takes every VRAMKIT_* "
               "variable set, else its message naming the variable and quoting the value.")},
    {"env_variables", core_env_variables, METH_NOARGS,
     PyDoc_STR("env_variables(/)\n--\n\n((name, help, pool_option), ...): the VRAMKIT_* "
               "variables vramkit reads, from the library's one table.")},
    {"error", core_error, METH_VARARGS,
     PyDoc_STR("error(status, message, /)\n--\n\nThe exception a status code maps to, with "
               "this message and .status, .errname and .report set; not raised.")},
    {"raise_status", core_raise_status, METH_VARARGS,
     PyDoc_STR("raise_status(status, what='vramkit', /)\n--\n\nRaise the exception a status "
               "code maps to (None for 0).")},
    {"set_device_resolver", core_set_device_resolver, METH_O,
     PyDoc_STR("set_device_resolver(fn, /)\n--\n\nfn(device) -> ordinal, used by empty() for "
               "device arguments that are not ints.")},
    {"strerror", core_strerror, METH_VARARGS,
     PyDoc_STR("strerror(status, /)\n--\n\n(name, message) of a status code.")},
    {"history_start", core_history_start, METH_VARARGS,
     PyDoc_STR("history_start(device, max_entries, stacks, /)\n--\n\nStart (or restart) "
               "recording the pool's events into a ring of max_entries; with stacks, each "
               "allocation carries the id of its Python stack.")},
    {"history_stop", core_history_stop, METH_VARARGS,
     PyDoc_STR("history_stop(device, /)\n--\n\nStop recording; what was recorded stays "
               "readable.")},
    {"history_read", core_history_read, METH_VARARGS,
     PyDoc_STR("history_read(device, /)\n--\n\n(events, dropped): the recorded "
               "vram_event_t records as bytes, oldest first, and how many were overwritten.")},
    {"history_annotate", core_history_annotate, METH_VARARGS,
     PyDoc_STR("history_annotate(device, context, /)\n--\n\nRecord an annotate event "
               "carrying context.")},
    {"snapshot", core_snapshot, METH_VARARGS,
     PyDoc_STR("snapshot(device, /)\n--\n\n(segments, blocks): the pool's "
               "vram_snapshot_segment_t and vram_snapshot_block_t records as bytes.")},
    {"stack_frames", core_stack_frames, METH_O,
     PyDoc_STR("stack_frames(ids, /)\n--\n\n{id: ((filename, line, name), ...)} of "
               "captured Python stacks, innermost frame first.")},
    {"stack_count", core_stack_count, METH_NOARGS,
     PyDoc_STR("stack_count(/)\n--\n\nHow many distinct Python stacks were captured.")},
    {"escape_text", core_escape_text, METH_O,
     PyDoc_STR("escape_text(data, /)\n--\n\nForeign bytes as the engine shows them "
               "(vram_escape_text): controls, backslashes, invalid UTF-8 and invisible "
               "characters as \\xNN.")},
    {"records_dir", core_records_dir, METH_NOARGS,
     PyDoc_STR("records_dir(/)\n--\n\nThe folder of published records "
               "(vram_records_dir): $VRAMKIT_PUBLISH_DIR, else /dev/shm/vramkit-<euid>.")},
    {"records_open", core_records_open, METH_VARARGS,
     PyDoc_STR("records_open(folder=None, /)\n--\n\nA descriptor of the folder of published "
               "records (None: the default), refused with OSError when it is a link, another "
               "user's or open to others.")},
    {"record_read", core_record_read, METH_VARARGS,
     PyDoc_STR("record_read(folder_fd, name, /)\n--\n\n(verdict, record or None, reason) of "
               "one record file: verdict 0 live, 1 exited, 2 skipped, 3 gone.")},
    {"trace_read", core_trace_read, METH_VARARGS,
     PyDoc_STR("trace_read(path, max_ops, /)\n--\n\n(ops, unmatched_frees) of a vramkit "
               "trace, read by the library's reader: ops are (is_alloc, id, size, stream, "
               "t_us); max_ops < 0 is the library's default limit, 0 none.")},
    {"trace_write", core_trace_write, METH_VARARGS,
     PyDoc_STR("trace_write(path, ops, header, /)\n--\n\nWrite ops, ('a', id, size, stream, "
               "t_us) and ('f', id, stream, t_us) tuples, as a vramkit trace through the "
               "library's writer; returns the ops written. A failure removes the file.")},
    {"replay", (PyCFunction)(void (*)(void))core_replay, METH_VARARGS | METH_KEYWORDS,
     PyDoc_STR("replay(path, source='sim', capacity=0, min_capacity=False, repeat=1, "
               "settings=None, max_ops=-1, host_model=False)\n--\n\nThe trace replayed on "
               "pools of its own (vram_replay_run): the keys of `vramkit replay --json`, "
               "first_oom_report and first_oom. host_model: on the host model of source "
               "(vram_options_host_model). "
               "settings: (name, value) pairs of VRAMKIT_* pool settings; nothing is read "
               "from the environment.")},
    {"replay_reserved", core_replay_reserved, METH_VARARGS,
     PyDoc_STR("replay_reserved(ops, capacity, blocks, /)\n--\n\nops (int64 triples: size "
               "or -1 for a free, block number below blocks, stream) on a private sim pool of "
               "capacity bytes: int64 pairs (op number, reserved bytes) where reserved "
               "changed.")},
    {NULL, NULL, 0, NULL},
};

/* ---------------------------------------------------------------------------------------
 * Module: multi-phase init.
 * ------------------------------------------------------------------------------------- */

/* Make one exception type with the given bases, store it in *slot and on the module. */
static int add_exception(PyObject *module, PyObject **slot, const char *name, const char *doc,
                         PyObject *bases) {
  if (bases == NULL) return -1; /* the caller's Py_BuildValue failed */
  char qualified[96];
  PyOS_snprintf(qualified, sizeof qualified, "vramkit.%s", name);
  *slot = PyErr_NewExceptionWithDoc(qualified, doc, bases, NULL);
  Py_DECREF(bases);
  if (*slot == NULL) return -1;
  return PyModule_AddObjectRef(module, name, *slot);
}

static int core_exec(PyObject *module) {
  /* The package speaks PyTorch's vocabulary, small_pool and large_pool rows included: pools
   * made from here on keep them (vram_options_t.split_stats). */
  vram_set_split_stats_default(1);
  core_state *st = get_state(module);
  PyObject *b;

  if (add_exception(module, &st->VramError, "VramError",
                    "Base class of every error vramkit raises; .status, .errname and "
                    ".report (None unless out of memory) describe it.",
                    Py_BuildValue("(O)", PyExc_Exception)) < 0 ||
      install_error_reduce(st->VramError) < 0)
    return -1;
#define SUB(slot, name, doc, ...)                                                          \
  b = Py_BuildValue(__VA_ARGS__);                                                          \
  if (b == NULL || add_exception(module, &st->slot, name, doc, b) < 0) return -1;
  SUB(OutOfMemoryError, "OutOfMemoryError",
      "Device memory ran out; the message and .report are the pool's OOM report.", "(OO)",
      st->VramError, PyExc_MemoryError)
  SUB(HostMemoryError, "HostMemoryError", "Host memory for the allocator's metadata ran out.",
      "(OO)", st->VramError, PyExc_MemoryError)
  SUB(InvalidArgumentError, "InvalidArgumentError",
      "A size, option or argument the allocator cannot accept.", "(OO)", st->VramError,
      PyExc_ValueError)
  SUB(InvalidDeviceError, "InvalidDeviceError", "No such device.", "(OO)", st->VramError,
      PyExc_ValueError)
  SUB(ConfigError, "ConfigError",
      "A bad VRAMKIT_* environment variable (a bad argument is an InvalidArgumentError).",
      "(OO)", st->VramError, PyExc_ValueError)
  SUB(AllocatorError, "AllocatorError", "A pointer or pool used in a way the pool refuses.",
      "(OO)", st->VramError, PyExc_RuntimeError)
  SUB(DoubleFreeError, "DoubleFreeError", "The block was already freed.", "(O)",
      st->AllocatorError)
  SUB(ForeignPointerError, "ForeignPointerError", "The pointer did not come from this pool.",
      "(O)", st->AllocatorError)
  SUB(BusyError, "BusyError", "The pool still has live allocations.", "(O)",
      st->AllocatorError)
  SUB(DriverError, "DriverError", "A CUDA driver call failed.", "(OO)", st->VramError,
      PyExc_RuntimeError)
  SUB(NoDriverError, "NoDriverError", "No CUDA driver could be loaded.", "(O)",
      st->DriverError)
  SUB(UnsupportedError, "UnsupportedError",
      "The memory source does not support this operation.", "(OO)", st->VramError,
      PyExc_NotImplementedError)
#undef SUB

  st->DeviceBuffer_Type =
      (PyTypeObject *)PyType_FromModuleAndSpec(module, &DeviceBuffer_spec, NULL);
  if (st->DeviceBuffer_Type == NULL) return -1;
  if (PyModule_AddType(module, st->DeviceBuffer_Type) < 0) return -1;
  st->Pool_Type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &Pool_spec, NULL);
  if (st->Pool_Type == NULL) return -1;
  if (PyModule_AddType(module, st->Pool_Type) < 0) return -1;

  if (PyModule_AddStringConstant(module, "VERSION", VRAMKIT_VERSION) < 0) return -1;
  /* The sim source's default and largest devices, for callers that size one. */
  PyObject *sim_max = PyLong_FromUnsignedLongLong(VRAM_SIM_MAX_CAPACITY);
  int added = sim_max ? PyModule_AddObjectRef(module, "SIM_MAX_CAPACITY", sim_max) : -1;
  Py_XDECREF(sim_max);
  if (added < 0) return -1;
  PyObject *sim_default = PyLong_FromUnsignedLongLong(VRAM_SIM_DEFAULT_CAPACITY);
  added = sim_default ? PyModule_AddObjectRef(module, "SIM_DEFAULT_CAPACITY", sim_default) : -1;
  Py_XDECREF(sim_default);
  if (added < 0) return -1;
  /* The ring kept where every event of a history is asked for (vramkit.h). */
  if (PyModule_AddIntConstant(module, "HISTORY_EVERY_EVENT", VRAM_HISTORY_EVERY_EVENT) < 0)
    return -1;
  /* The status codes, by name, for callers that test .status. */
#define X_CODE(name, value, text)                                                          \
  if (PyModule_AddIntConstant(module, #name, value) < 0) return -1;
  VRAM_STATUS_LIST(X_CODE)
#undef X_CODE
  /* The record layouts history.py unpacks, and the event kinds by name. */
  if (PyModule_AddIntConstant(module, "EVENT_SIZE", sizeof(vram_event_t)) < 0 ||
      PyModule_AddIntConstant(module, "SEGMENT_SIZE", sizeof(vram_snapshot_segment_t)) < 0 ||
      PyModule_AddIntConstant(module, "BLOCK_SIZE", sizeof(vram_snapshot_block_t)) < 0)
    return -1;
#define X_KIND(name)                                                                       \
  if (PyModule_AddIntConstant(module, #name, name) < 0) return -1;
  X_KIND(VRAM_EVENT_ALLOC) X_KIND(VRAM_EVENT_FREE_REQUESTED) X_KIND(VRAM_EVENT_FREE_COMPLETED)
  X_KIND(VRAM_EVENT_SEGMENT_ALLOC) X_KIND(VRAM_EVENT_SEGMENT_FREE)
  X_KIND(VRAM_EVENT_SEGMENT_MAP) X_KIND(VRAM_EVENT_SEGMENT_UNMAP) X_KIND(VRAM_EVENT_OOM)
  X_KIND(VRAM_EVENT_EMPTY_CACHE) X_KIND(VRAM_EVENT_SNAPSHOT) X_KIND(VRAM_EVENT_ANNOTATE)
  X_KIND(VRAM_EVENT_GIVE_BACK)
  X_KIND(VRAM_SNAPSHOT_INACTIVE) X_KIND(VRAM_SNAPSHOT_ACTIVE_ALLOCATED)
  X_KIND(VRAM_SNAPSHOT_ACTIVE_PENDING_FREE)
#undef X_KIND
  return 0;
}

static int core_traverse(PyObject *module, visitproc visit, void *arg) {
  core_state *st = get_state(module);
  Py_VISIT(st->VramError);
  Py_VISIT(st->OutOfMemoryError);
  Py_VISIT(st->HostMemoryError);
  Py_VISIT(st->InvalidArgumentError);
  Py_VISIT(st->InvalidDeviceError);
  Py_VISIT(st->ConfigError);
  Py_VISIT(st->AllocatorError);
  Py_VISIT(st->DoubleFreeError);
  Py_VISIT(st->ForeignPointerError);
  Py_VISIT(st->BusyError);
  Py_VISIT(st->DriverError);
  Py_VISIT(st->NoDriverError);
  Py_VISIT(st->UnsupportedError);
  Py_VISIT(st->DeviceBuffer_Type);
  Py_VISIT(st->Pool_Type);
  Py_VISIT(st->device_resolver);
  return 0;
}

static int core_clear(PyObject *module) {
  core_state *st = get_state(module);
  Py_CLEAR(st->VramError);
  Py_CLEAR(st->OutOfMemoryError);
  Py_CLEAR(st->HostMemoryError);
  Py_CLEAR(st->InvalidArgumentError);
  Py_CLEAR(st->InvalidDeviceError);
  Py_CLEAR(st->ConfigError);
  Py_CLEAR(st->AllocatorError);
  Py_CLEAR(st->DoubleFreeError);
  Py_CLEAR(st->ForeignPointerError);
  Py_CLEAR(st->BusyError);
  Py_CLEAR(st->DriverError);
  Py_CLEAR(st->NoDriverError);
  Py_CLEAR(st->UnsupportedError);
  Py_CLEAR(st->DeviceBuffer_Type);
  Py_CLEAR(st->Pool_Type);
  Py_CLEAR(st->device_resolver);
  return 0;
}

static void core_free(void *module) { core_clear((PyObject *)module); }

static PyModuleDef_Slot core_slots[] = {
    {Py_mod_exec, core_exec},
    {0, NULL},
};

struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "vramkit._core",
    .m_doc = "Thin CPython layer over vramkit's C API. Use the vramkit package instead.",
    .m_size = sizeof(core_state),
    .m_methods = core_methods,
    .m_slots = core_slots,
    .m_traverse = core_traverse,
    .m_clear = core_clear,
    .m_free = core_free,
};

PyMODINIT_FUNC PyInit__core(void) { return PyModuleDef_Init(&core_module); }

/* _core_pool.c - _core.Pool: one vram_pool_t as a Python object, the base of vramkit.Pool.
 *
 * A private pool is made from options that go through the engine's own option table
 * (vram_options_set: the names and grammar of the VRAMKIT_* variables), so Python parses
 * nothing itself. The default pool of a device is wrapped too (Pool._of_default), not owned:
 * its methods are the module functions' very calls, so both report the same figures.
 *
 * Lifetime: each DeviceBuffer from allocate() holds a reference to its Pool, so a pool is
 * destroyed only when no block of it is live: by close(), which refuses with BusyError while
 * blocks are live (as vram_pool_destroy does), or when its last reference goes. The engine
 * locks each pool; the counter of calls in flight keeps close() from destroying a pool that
 * another thread is using with the GIL released.
 */
#include "_core.h"

typedef struct {
  PyObject_HEAD
  vram_pool_t *pool; /* NULL before __init__ and after close() */
  int device;
  vram_source_kind source;
  int owns;          /* a private pool: destroyed by close() or with the object */
  int in_flight;     /* calls running on the pool (some release the GIL) */
} PoolObject;

static core_state *pool_module_state(PyTypeObject *type) {
  /* By definition, not by type: vramkit.Pool is a Python subclass of this type. */
  PyObject *module = PyType_GetModuleByDef(type, &core_module);
  return module == NULL ? NULL : get_state(module);
}

/* The pool of self, or NULL with InvalidArgumentError (a ValueError, as for a closed
 * file) once it is closed. */
static vram_pool_t *open_pool(PoolObject *self, const char *what, core_state **st) {
  *st = pool_module_state(Py_TYPE(self));
  if (*st == NULL) return NULL;
  if (self->pool != NULL) return self->pool;
  raise_message(*st, VRAM_EINVAL,
                PyUnicode_FromFormat("Pool.%s: the pool is %s", what,
                                     self->owns ? "closed" : "not made yet (Pool.__init__)"),
                NULL);
  return NULL;
}

static int Pool_init(PoolObject *self, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"device", "options", NULL};
  int device = 0;
  PyObject *options = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O&O:Pool", kwlist, device_converter,
                                   &device, &options))
    return -1;
  core_state *st = pool_module_state(Py_TYPE(self));
  if (st == NULL) return -1;
  if (self->pool != NULL || self->owns) {
    raise_message(st, VRAM_EINVAL, PyUnicode_FromString("Pool.__init__: this Pool was made "
                                                        "already; make a new one instead"),
                  NULL);
    return -1;
  }
  if (options != Py_None && !PyDict_Check(options)) {
    PyErr_SetString(PyExc_TypeError, "Pool: options must be a dict or None");
    return -1;
  }
  /* The engine's defaults and these options only: a private pool reads no environment. */
  vram_options_t opts;
  vram_options_init(&opts);
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (options != Py_None && PyDict_Next(options, &pos, &key, &value))
    if (apply_override(st, &opts, key, value, VRAM_EENV) < 0) return -1;
  opts.device = device;
  vram_pool_t *pool = NULL;
  int rc;
  /* Preallocation may call the driver: let other threads run meanwhile. */
  Py_BEGIN_ALLOW_THREADS
  rc = vram_pool_create(&pool, &opts);
  Py_END_ALLOW_THREADS
  if (rc == VRAM_EDEVICE) return raise_bad_device(st, device, opts.source), -1;
  if (rc == VRAM_ESIMCAPACITY) return raise_sim_capacity(st, device, opts.sim_capacity), -1;
  if (rc != VRAM_OK) return raise_status(st, rc, device, NULL), -1;
  self->pool = pool;
  self->device = device;
  self->source = vram_pool_source(pool);
  self->owns = 1;
  return 0;
}

/* Pool._of_default(device): the device's default pool as an instance of cls, not owned. */
static PyObject *Pool_of_default(PyTypeObject *cls, PyObject *args) {
  int device;
  if (!PyArg_ParseTuple(args, "O&:_of_default", device_converter, &device)) return NULL;
  core_state *st = pool_module_state(cls);
  if (st == NULL) return NULL;
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
  PoolObject *self = (PoolObject *)cls->tp_alloc(cls, 0);
  if (self == NULL) return NULL;
  self->pool = pool;
  self->device = device;
  self->source = vram_pool_source(pool);
  self->owns = 0;
  return (PyObject *)self;
}

static void Pool_dealloc(PoolObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  /* No buffer of this pool is alive (each would hold a reference), so nothing is live. */
  if (self->owns && self->pool != NULL) {
    int rc = vram_pool_destroy(self->pool);
    if (rc != VRAM_OK) {
      PyObject *type, *value, *tb;
      PyErr_Fetch(&type, &value, &tb);
      PyErr_Format(PyExc_RuntimeWarning, "vramkit: destroying a Pool of device %d failed: %s",
                   self->device, vram_strerror(rc));
      PyErr_WriteUnraisable(NULL);
      PyErr_Restore(type, value, tb);
    }
  }
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp);
}

/* One method with no arguments: the shared call of _core.c or _core_history.c on this pool. */
#define POOL_METHOD(name, call)                                                            \
  static PyObject *Pool_##name(PoolObject *self, PyObject *Py_UNUSED(ignored)) {           \
    core_state *st;                                                                        \
    vram_pool_t *pool = open_pool(self, #name "()", &st);                                  \
    if (pool == NULL) return NULL;                                                         \
    self->in_flight++;                                                                     \
    PyObject *result = call(st, pool, self->device);                                       \
    self->in_flight--;                                                                     \
    return result;                                                                         \
  }

POOL_METHOD(stats, pool_stats)
POOL_METHOD(split_stats, pool_split_stats)
POOL_METHOD(summary, pool_summary)
POOL_METHOD(stats_json, pool_stats_json)
POOL_METHOD(oom_report, pool_oom_report)
POOL_METHOD(oom_info, pool_oom_info)
POOL_METHOD(empty_cache, pool_empty_cache)
POOL_METHOD(reset_peak_stats, pool_reset_peak_stats)
POOL_METHOD(mem_get_info, pool_mem_get_info)
POOL_METHOD(history_stop, pool_history_stop)
POOL_METHOD(history_read, pool_history_read)
POOL_METHOD(snapshot_records, pool_snapshot)
#undef POOL_METHOD

static PyObject *Pool_allocate(PoolObject *self, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"nbytes", "stream", NULL};
  core_state *st;
  vram_pool_t *pool = open_pool(self, "allocate()", &st);
  if (pool == NULL) return NULL;
  size_arg nbytes = {.name = "nbytes", .st = st};
  PyObject *stream_obj = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|O:allocate", kwlist, size_converter,
                                   &nbytes, &stream_obj))
    return NULL;
  return buffer_new(st, pool, self->device, &nbytes, stream_obj, (PyObject *)self);
}

static PyObject *Pool_set_limit(PoolObject *self, PyObject *args) {
  core_state *st;
  vram_pool_t *pool = open_pool(self, "set_limit()", &st);
  if (pool == NULL) return NULL;
  size_arg limit = {.name = "limit", .st = st};
  double fraction = 0.0;
  if (!PyArg_ParseTuple(args, "O&|d:set_limit", size_converter, &limit, &fraction)) return NULL;
  if (!limit_fits(st, &limit)) return NULL;
  self->in_flight++;
  PyObject *result = pool_set_limit(st, pool, self->device, limit.bytes, fraction);
  self->in_flight--;
  return result;
}

static PyObject *Pool_history_start(PoolObject *self, PyObject *args) {
  core_state *st;
  vram_pool_t *pool = open_pool(self, "history_start()", &st);
  if (pool == NULL) return NULL;
  Py_ssize_t max_entries;
  int with_stacks;
  if (!PyArg_ParseTuple(args, "np:history_start", &max_entries, &with_stacks)) return NULL;
  return pool_history_start(st, pool, self->device, max_entries, with_stacks);
}

static PyObject *Pool_history_annotate(PoolObject *self, PyObject *arg) {
  core_state *st;
  vram_pool_t *pool = open_pool(self, "history_annotate()", &st);
  if (pool == NULL) return NULL;
  unsigned long long context;
  if (!context_converter(arg, &context)) return NULL;
  return pool_history_annotate(st, pool, self->device, context);
}

/* close(): destroy a private pool now. Refused with BusyError while blocks are live (the
 * pool stays open and usable); a no-op on a default pool and on a closed one. */
static PyObject *Pool_close(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
  if (!self->owns || self->pool == NULL) Py_RETURN_NONE;
  core_state *st = pool_module_state(Py_TYPE(self));
  if (st == NULL) return NULL;
  if (self->in_flight > 0)
    return raise_message(st, VRAM_EBUSY,
                         PyUnicode_FromString("Pool.close(): another thread is using the "
                                              "pool; close it once that call returns"),
                         NULL);
  int rc = vram_pool_destroy(self->pool);
  if (rc == VRAM_EBUSY) {
    vram_stats_t s;
    if (vram_get_stats(self->pool, &s) != VRAM_OK) memset(&s, 0, sizeof s);
    return raise_message(
        st, rc,
        PyUnicode_FromFormat("Pool.close(): %lld block(s) of %lld bytes are still allocated "
                             "from this pool (device %d); free them or drop their "
                             "DeviceBuffers first. The pool stays open.",
                             (long long)s.allocation.current,
                             (long long)s.allocated_bytes.current, self->device),
        NULL);
  }
  if (rc != VRAM_OK) return raise_status(st, rc, self->device, self->pool);
  self->pool = NULL;
  Py_RETURN_NONE;
}

static PyObject *Pool_get_device(PoolObject *self, void *closure) {
  return PyLong_FromLong(self->device);
}

static PyObject *Pool_get_source(PoolObject *self, void *closure) {
  if (self->pool == NULL && !self->owns) Py_RETURN_NONE;
  return PyUnicode_FromString(vram_source_name(self->source));
}

static PyObject *Pool_get_closed(PoolObject *self, void *closure) {
  return PyBool_FromLong(self->owns && self->pool == NULL);
}

static PyObject *Pool_get_is_default(PoolObject *self, void *closure) {
  return PyBool_FromLong(self->pool != NULL && !self->owns);
}

#define NOARGS(name, doc)                                                                  \
  {#name, (PyCFunction)Pool_##name, METH_NOARGS, PyDoc_STR(#name "($self, /)\n--\n\n" doc)}

static PyMethodDef Pool_methods[] = {
    {"allocate", (PyCFunction)(void (*)(void))Pool_allocate, METH_VARARGS | METH_KEYWORDS,
     PyDoc_STR("allocate($self, /, nbytes, stream=None)\n--\n\nnbytes of device memory from "
               "this pool: a DeviceBuffer, which keeps the pool alive.")},
    NOARGS(stats, "The pool's vram_stats_t, as _core.stats gives it."),
    NOARGS(split_stats, "The small_pool and large_pool rows, as _core.split_stats."),
    NOARGS(summary, "The pool's text summary table."),
    NOARGS(stats_json, "The pool's statistics as a JSON string."),
    NOARGS(oom_report, "The report of the pool's last OOM ('' if none)."),
    NOARGS(oom_info, "The figures of the pool's last OOM as a dict, or None."),
    NOARGS(empty_cache, "Return fully free cached segments to the source."),
    NOARGS(reset_peak_stats, "Set every peak to its current value."),
    NOARGS(mem_get_info, "(free, total) bytes of the pool's device."),
    NOARGS(history_stop, "Stop recording; what was recorded stays readable."),
    NOARGS(history_read, "(events, dropped): the recorded vram_event_t records as bytes."),
    NOARGS(snapshot_records, "(segments, blocks): vram_snapshot records as bytes."),
    NOARGS(close, "Destroy a private pool now (BusyError while blocks are live; it stays "
                  "open then). A no-op on a default pool and on a closed pool."),
    {"set_limit", (PyCFunction)Pool_set_limit, METH_VARARGS,
     PyDoc_STR("set_limit($self, limit, fraction=0.0, /)\n--\n\nHard limit on reserved "
               "memory, in bytes or as a fraction of the device; 0 and 0.0 remove it.")},
    {"history_start", (PyCFunction)Pool_history_start, METH_VARARGS,
     PyDoc_STR("history_start($self, max_entries, stacks, /)\n--\n\nStart (or restart) "
               "recording the pool's events.")},
    {"history_annotate", (PyCFunction)Pool_history_annotate, METH_O,
     PyDoc_STR("history_annotate($self, context, /)\n--\n\nRecord an annotate event.")},
    {"_of_default", (PyCFunction)Pool_of_default, METH_VARARGS | METH_CLASS,
     PyDoc_STR("_of_default(device, /)\n--\n\nThe device's default pool, not owned.")},
    {NULL, NULL, 0, NULL},
};
#undef NOARGS

static PyGetSetDef Pool_getset[] = {
    {"device", (getter)Pool_get_device, NULL, PyDoc_STR("device ordinal"), NULL},
    {"source", (getter)Pool_get_source, NULL, PyDoc_STR("name of the memory source"), NULL},
    {"closed", (getter)Pool_get_closed, NULL, PyDoc_STR("True once close() destroyed it"),
     NULL},
    {"is_default", (getter)Pool_get_is_default, NULL,
     PyDoc_STR("True for a device's default pool, which the process owns"), NULL},
    {NULL},
};

static PyType_Slot Pool_slots[] = {
    {Py_tp_init, Pool_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, Pool_dealloc},
    {Py_tp_methods, Pool_methods},
    {Py_tp_getset, Pool_getset},
    {Py_tp_doc, "Pool(device=0, options=None): a private pool made from {VRAMKIT_* name: text "
                "or (argument, text)}; the base of vramkit.Pool."},
    {0, NULL},
};

PyType_Spec Pool_spec = {
    .name = "vramkit._core.Pool",
    .basicsize = sizeof(PoolObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = Pool_slots,
};

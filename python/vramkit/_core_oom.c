/* _core_oom.c - the figures of an out-of-memory (vram_oom_info_t) as a dict, with the cause
 * as its name: what _core.oom_info, _core.oom_classify, replay's first_oom and the
 * OutOfMemoryError's .oom_info give, so that Python reads the engine's numbers and cause
 * rather than parsing the report's text.
 */
#include "_core.h"

static int put(PyObject *d, const char *key, PyObject *value) {
  if (value == NULL) return -1;
  int rc = PyDict_SetItemString(d, key, value);
  Py_DECREF(value);
  return rc;
}

static int put_u64(PyObject *d, const char *key, uint64_t value) {
  return put(d, key, PyLong_FromUnsignedLongLong(value));
}

/* Each neighbour as {"pid", "name", "bytes" (None: unknown), and for a vramkit one,
 * "reserved", "allocated", "cached_free"}. */
static PyObject *neighbours_list(const vram_oom_info_t *in) {
  PyObject *list = PyList_New(0);
  for (int i = 0; list != NULL && i < in->neighbours_count; i++) {
    const vram_oom_neighbour_t *n = &in->neighbours[i];
    PyObject *e = PyDict_New();
    int bad = e == NULL || put(e, "pid", PyLong_FromLong(n->pid)) ||
              put(e, "name", PyUnicode_DecodeUTF8(n->name, (Py_ssize_t)strlen(n->name),
                                                  "replace")) ||
              put(e, "bytes", n->used_bytes == VRAM_OOM_UNKNOWN
                                  ? Py_NewRef(Py_None)
                                  : PyLong_FromUnsignedLongLong(n->used_bytes));
    if (!bad && n->is_vramkit)
      bad = put_u64(e, "reserved", n->reserved_bytes) ||
            put_u64(e, "allocated", n->allocated_bytes) ||
            put_u64(e, "cached_free", n->cached_free_bytes);
    if (bad || PyList_Append(list, e) < 0) Py_CLEAR(list);
    Py_XDECREF(e);
  }
  return list;
}

PyObject *oom_info_dict(const vram_oom_info_t *in) {
  const char *cause = vram_oom_cause_name(in->cause);
  PyObject *d = PyDict_New();
  int bad = d == NULL || put(d, "cause", PyUnicode_FromString(cause ? cause : "unknown")) ||
            put(d, "device", PyLong_FromLong(in->device)) ||
            put(d, "source", PyUnicode_FromString(vram_source_name(in->source))) ||
            put(d, "preallocate", PyBool_FromLong(in->preallocate)) ||
            put_u64(d, "requested", in->requested) || put_u64(d, "max_request", in->max_request) ||
            put_u64(d, "capacity", in->capacity) || put_u64(d, "device_free", in->device_free) ||
            put(d, "limit", in->limit ? PyLong_FromUnsignedLongLong(in->limit)
                                      : Py_NewRef(Py_None)) ||
            put_u64(d, "reserved", in->reserved) || put_u64(d, "allocated", in->allocated) ||
            put_u64(d, "cached_free", in->cached_free) ||
            put_u64(d, "largest_free_block", in->largest_free_block) ||
            put_u64(d, "granularity", in->granularity) ||
            put_u64(d, "may_reserve", in->may_reserve) ||
            put_u64(d, "raise_limit_by", in->raise_limit_by) ||
            put_u64(d, "others_used", in->others_used) || put_u64(d, "shortfall", in->shortfall) ||
            put(d, "group_limit", in->group_limit ? PyLong_FromUnsignedLongLong(in->group_limit)
                                                  : Py_NewRef(Py_None)) ||
            put_u64(d, "group_reserved", in->group_reserved) ||
            put_u64(d, "preallocated", in->preallocated) ||
            put(d, "fragmentation", PyFloat_FromDouble(in->fragmentation)) ||
            put(d, "neighbours_total", PyLong_FromLong(in->neighbours_total)) ||
            put(d, "neighbours", neighbours_list(in));
  if (bad) Py_CLEAR(d);
  return d;
}

/* The figures of a pool's last OOM, or None before any. */
PyObject *pool_oom_info(core_state *st, vram_pool_t *pool, int device) {
  (void)st;
  (void)device;
  vram_oom_info_t info;
  if (vram_oom_info(pool, &info) != VRAM_OK) Py_RETURN_NONE;
  return oom_info_dict(&info);
}

/* oom_info(device): that of the device's default pool. */
PyObject *core_oom_info(PyObject *module, PyObject *args) {
  return on_default_pool(module, args, "O&:oom_info", pool_oom_info);
}

/* A figure of oom_classify's mapping: absent or None reads 0. */
static int figure(PyObject *figures, const char *key, uint64_t *out) {
  PyObject *v = PyMapping_GetItemString(figures, key);
  if (v == NULL) {
    if (!PyErr_ExceptionMatches(PyExc_KeyError)) return -1;
    PyErr_Clear();
    *out = 0;
    return 0;
  }
  *out = v == Py_None ? 0 : PyLong_AsUnsignedLongLong(v);
  Py_DECREF(v);
  return PyErr_Occurred() ? -1 : 0;
}

/* oom_classify(figures): the engine's cause (vram_oom_classify) of figures read elsewhere,
 * a snapshot's: the dict oom_info gives, filled from them. */
PyObject *core_oom_classify(PyObject *module, PyObject *figures) {
  (void)module;
  static const char *const keys[] = {"requested", "max_request", "capacity", "device_free",
                                     "limit",     "reserved",    "allocated", "cached_free",
                                     "largest_free_block", "granularity", "group_limit",
                                     "group_reserved", "preallocated"};
  vram_oom_info_t in;
  memset(&in, 0, sizeof in);
  uint64_t *fields[] = {&in.requested, &in.max_request, &in.capacity,    &in.device_free,
                        &in.limit,     &in.reserved,    &in.allocated,   &in.cached_free,
                        &in.largest_free_block, &in.granularity, &in.group_limit,
                        &in.group_reserved, &in.preallocated};
  if (!PyMapping_Check(figures)) {
    PyErr_SetString(PyExc_TypeError, "oom_classify() takes a mapping of figures");
    return NULL;
  }
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
    if (figure(figures, keys[i], fields[i]) < 0) return NULL;
  vram_oom_classify(&in);
  return oom_info_dict(&in);
}

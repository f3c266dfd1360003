/* _core_records.c - the records other vramkit processes publish, read by the engine's own
 * reader (vram_records_open, vram_record_read) and handed to vramkit.records as plain
 * Python values: the record's layout, its checks and its consistent copy live in C alone. */
#include "_core.h"

#include <errno.h>
#include <unistd.h>

#include "vramkit_record.h"

/* records_open(folder or None) -> descriptor; OSError with the engine's reason. */
PyObject *core_records_open(PyObject *module, PyObject *args) {
  PyObject *folder = Py_None, *encoded = NULL;
  if (!PyArg_ParseTuple(args, "|O:records_open", &folder)) return NULL;
  if (folder != Py_None && !PyUnicode_FSConverter(folder, &encoded)) return NULL;
  char why[256];
  int fd;
  Py_BEGIN_ALLOW_THREADS
  fd = vram_records_open(encoded ? PyBytes_AS_STRING(encoded) : NULL, why, sizeof why);
  Py_END_ALLOW_THREADS
  int err = errno;
  Py_XDECREF(encoded);
  if (fd < 0) {
    PyObject *error = Py_BuildValue("(is)", err, why);
    if (error) PyErr_SetObject(PyExc_OSError, error);
    Py_XDECREF(error);
    return NULL;
  }
  return PyLong_FromLong(fd);
}

PyObject *core_records_dir(PyObject *module, PyObject *Py_UNUSED(ignored)) {
  char path[4096];
  if (vram_records_dir(path, sizeof path) != 0) {
    core_state *st = get_state(module);
    return raise_message(st, VRAM_EENV,
                         PyUnicode_FromFormat("VRAMKIT_PUBLISH_DIR is longer than the %zu "
                                              "bytes a folder's name may have",
                                              sizeof path - 1),
                         NULL);
  }
  return PyUnicode_DecodeFSDefault(path);
}

PyObject *core_escape_text(PyObject *module, PyObject *arg) {
  (void)module;
  Py_buffer view;
  if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
  size_t len = (size_t)view.len;
  /* Every byte at most \xNN: four out for one in. */
  char *out = len < ((size_t)PY_SSIZE_T_MAX - 1) / 4 ? PyMem_Malloc(4 * len + 1) : NULL;
  PyObject *text = NULL;
  if (out == NULL) {
    PyErr_NoMemory();
  } else {
    size_t n = vram_escape_text(out, 4 * len + 1, view.buf, len);
    text = PyUnicode_DecodeUTF8(out, (Py_ssize_t)n, "strict");
    PyMem_Free(out);
  }
  PyBuffer_Release(&view);
  return text;
}

/* A NUL-terminated field of foreign bytes as str: invalid UTF-8 replaced, nothing else
 * changed (showing it escaped is the caller's job). */
static PyObject *field_text(const char *raw, size_t cap) {
  return PyUnicode_DecodeUTF8(raw, (Py_ssize_t)strnlen(raw, cap), "replace");
}

#define SET(dict, key, expr)                                                               \
  do {                                                                                     \
    PyObject *value_ = (expr);                                                             \
    if (!value_ || PyDict_SetItemString(dict, key, value_) < 0) {                          \
      Py_XDECREF(value_);                                                                  \
      return -1;                                                                           \
    }                                                                                      \
    Py_DECREF(value_);                                                                     \
  } while (0)

static int fill_device(PyObject *d, const vram_device_record *s, int busy) {
  SET(d, "device", PyLong_FromLong(s->device));
  SET(d, "source", field_text(s->source, sizeof s->source));
  SET(d, "uuid", field_text(s->uuid, sizeof s->uuid));
  SET(d, "busy", PyBool_FromLong(busy));
#define COUNTER(name) SET(d, #name, PyLong_FromUnsignedLongLong(s->name))
  COUNTER(allocated_bytes);
  COUNTER(reserved_bytes);
  COUNTER(active_bytes);
  COUNTER(cached_free_bytes);
  COUNTER(largest_free_block);
  COUNTER(largest_of_cached_bytes);
  COUNTER(peak_allocated_bytes);
  COUNTER(peak_reserved_bytes);
  COUNTER(num_ooms);
  COUNTER(num_alloc_retries);
  COUNTER(limit_bytes);
  COUNTER(capacity_bytes);
  COUNTER(updated_ns);
  COUNTER(givable_bytes);
  COUNTER(given_back_bytes);
  COUNTER(given_back_count);
  COUNTER(group_limit_bytes);
#undef COUNTER
  return 0;
}

static int fill_process(PyObject *p, const vram_process_record *r, uint32_t busy) {
  SET(p, "pid", PyLong_FromLong(r->pid));
  SET(p, "uid", PyLong_FromUnsignedLong(r->uid));
  SET(p, "start_ticks", PyLong_FromUnsignedLongLong(r->start_ticks));
  SET(p, "name", field_text(r->name, sizeof r->name));
  SET(p, "cmdline", field_text(r->cmdline, sizeof r->cmdline));
  PyObject *devices = PyList_New(0);
  if (!devices) return -1;
  int rc = PyDict_SetItemString(p, "devices", devices);
  Py_DECREF(devices);
  if (rc < 0) return -1;
  for (uint32_t i = 0; i < r->n_devices; i++) {
    int is_busy = (int)((busy >> i) & 1);
    /* A slot never claimed or given back is no device; a busy one is shown as busy. */
    if (!is_busy && r->devices[i].in_use != 1) continue;
    PyObject *d = PyDict_New();
    if (!d || fill_device(d, &r->devices[i], is_busy) < 0 || PyList_Append(devices, d) < 0) {
      Py_XDECREF(d);
      return -1;
    }
    Py_DECREF(d);
  }
  return 0;
}
#undef SET

/* record_read(folder descriptor, name) -> (verdict, record dict or None, reason). */
PyObject *core_record_read(PyObject *module, PyObject *args) {
  int dir_fd;
  PyObject *encoded = NULL;
  if (!PyArg_ParseTuple(args, "iO&:record_read", &dir_fd, PyUnicode_FSConverter, &encoded))
    return NULL;
  vram_process_record *r = PyMem_Malloc(sizeof *r);
  if (!r) {
    Py_DECREF(encoded);
    return PyErr_NoMemory();
  }
  char why[256];
  uint32_t busy = 0;
  vram_record_verdict verdict;
  Py_BEGIN_ALLOW_THREADS
  verdict = vram_record_read(dir_fd, PyBytes_AS_STRING(encoded), r, &busy, why, sizeof why);
  Py_END_ALLOW_THREADS
  Py_DECREF(encoded);
  PyObject *record = Py_None;
  Py_INCREF(record);
  if (verdict == VRAM_RECORD_LIVE) {
    Py_SETREF(record, PyDict_New());
    if (!record || fill_process(record, r, busy) < 0) {
      Py_XDECREF(record);
      PyMem_Free(r);
      return NULL;
    }
  }
  PyMem_Free(r);
  PyObject *result = Py_BuildValue("(iNs)", (int)verdict, record, why);
  return result;
}

/* _core_errors.c - how vramkit._core reports failure and reads its arguments: ONE function,
 * status_type(), maps a vram_status to an exception type; the raise_* helpers build
 * messages that name what the user gave (the device, the argument, the environment
 * variable), never this module's own function names; the converters read sizes, streams
 * and devices the way every function of the module accepts them. */
#include "_core.h"

typedef int (*text_fn)(vram_pool_t *, char *, size_t);

PyObject *pool_text(vram_pool_t *pool, text_fn fn, int *status) {
  char small[4096];
  int need = fn(pool, small, sizeof small);
  *status = need < 0 ? need : 0;
  if (need < 0) return NULL;
  if ((size_t)need < sizeof small) return PyUnicode_DecodeUTF8(small, need, "replace");
  /* Too long for the stack buffer: ask again with room for all of it. */
  char *big = PyMem_Malloc((size_t)need + 1);
  if (big == NULL) return PyErr_NoMemory();
  int again = fn(pool, big, (size_t)need + 1);
  PyObject *text = again < 0 ? NULL : PyUnicode_DecodeUTF8(big, again < need ? again : need,
                                                           "replace");
  PyMem_Free(big);
  *status = again < 0 ? again : 0;
  return text;
}

/* THE mapping from a vram_status to the exception type that stands for it. */
PyObject *status_type(core_state *st, int status) {
  switch (status) {
  case VRAM_ENOMEM: return st->OutOfMemoryError;
  case VRAM_EHOSTMEM: return st->HostMemoryError;
  case VRAM_EINVAL:
  case VRAM_ETRACE:
  case VRAM_ELIMIT: return st->InvalidArgumentError;
  case VRAM_EDEVICE: return st->InvalidDeviceError;
  case VRAM_EENV:
  case VRAM_ESIMCAPACITY: return st->ConfigError;
  case VRAM_EDOUBLEFREE: return st->DoubleFreeError;
  case VRAM_EFOREIGN: return st->ForeignPointerError;
  case VRAM_EBUSY: return st->BusyError;
  case VRAM_ENODRIVER: return st->NoDriverError;
  case VRAM_EUNSUPPORTED: return st->UnsupportedError;
  case VRAM_EDRIVER:
  case VRAM_EFAULT:
  case VRAM_EIO: return st->DriverError;
  default: return st->VramError;
  }
}

/* The exception of `status` with this message, carrying .status, .errname, .report (the
 * OOM report, else None) and .oom_info (its figures, set by raise_oom, else None), so
 * callers can test the code and read the figures rather than parse text. */
PyObject *new_error(core_state *st, int status, PyObject *message, PyObject *report) {
  PyObject *exc = PyObject_CallOneArg(status_type(st, status), message);
  if (exc == NULL) return NULL;
  PyObject *code = PyLong_FromLong(status);
  PyObject *name = PyUnicode_FromString(vram_errname(status));
  int failed = code == NULL || name == NULL || PyObject_SetAttrString(exc, "status", code) < 0 ||
               PyObject_SetAttrString(exc, "errname", name) < 0 ||
               PyObject_SetAttrString(exc, "report", report ? report : Py_None) < 0 ||
               PyObject_SetAttrString(exc, "oom_info", Py_None) < 0;
  Py_XDECREF(code);
  Py_XDECREF(name);
  if (failed) Py_CLEAR(exc);
  return exc;
}

/* An engine message of VRAM_EIO (a file that could not be opened, read or written) ends
 * with strerror() of the call that failed: raise the OSError subclass Python's own open()
 * raises for that errno (FileNotFoundError, PermissionError, IsADirectoryError...), with
 * the whole message. One without (a damaged gzip stream) is a plain OSError. Bytes that
 * are not UTF-8 (a path's) are shown as \xNN escapes. */
PyObject *raise_io_error(const char *text) {
  size_t length = strlen(text);
  PyObject *message = PyUnicode_DecodeUTF8(text, (Py_ssize_t)length, "backslashreplace");
  if (message == NULL) return NULL;
  int number = 0;
  for (int candidate = 1; candidate < 256 && number == 0; candidate++) {
    const char *words = strerror(candidate);
    size_t n = strlen(words);
    if (n + 2 <= length && memcmp(text + length - n - 2, ": ", 2) == 0 &&
        strcmp(text + length - n, words) == 0)
      number = candidate;
  }
  if (number == 0) {
    PyErr_SetObject(PyExc_OSError, message);
    Py_DECREF(message);
    return NULL;
  }
  /* OSError(errno, text) picks the subclass, whose str() would read "[Errno N] text".
   * The engine's message already says what failed and why, so the exception is that
   * subclass made from the message alone, with .errno set beside it. */
  PyObject *probe = PyObject_CallFunction(PyExc_OSError, "iO", number, message);
  PyObject *exc = probe ? PyObject_CallOneArg((PyObject *)Py_TYPE(probe), message) : NULL;
  PyObject *code = exc ? PyLong_FromLong(number) : NULL;
  Py_XDECREF(probe);
  Py_DECREF(message);
  if (code != NULL && PyObject_SetAttrString(exc, "errno", code) == 0)
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
  Py_XDECREF(code);
  Py_XDECREF(exc);
  return NULL;
}

/* Raise `status` with a message (a new reference, consumed; NULL passes an error on). */
PyObject *raise_message(core_state *st, int status, PyObject *message, PyObject *report) {
  if (message == NULL) return NULL;
  PyObject *exc = new_error(st, status, message, report);
  Py_DECREF(message);
  if (exc == NULL) return NULL;
  PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
  Py_DECREF(exc);
  return NULL;
}

/* Raise out of memory with the report as the message and the figures as .oom_info (rc
 * not VRAM_OK: none to give). Consumes report. */
static PyObject *raise_oom(core_state *st, int status, PyObject *report, int rc,
                           const vram_oom_info_t *info) {
  PyObject *exc = new_error(st, status, report, report);
  Py_DECREF(report);
  if (exc == NULL) return NULL;
  PyObject *figures = rc == VRAM_OK ? oom_info_dict(info) : Py_NewRef(Py_None);
  if (figures == NULL || PyObject_SetAttrString(exc, "oom_info", figures) < 0) {
    Py_XDECREF(figures);
    Py_DECREF(exc);
    return NULL;
  }
  Py_DECREF(figures);
  PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
  Py_DECREF(exc);
  return NULL;
}

/* Sizes in messages: "80.00 GiB", the exact byte count going beside it. */
static void format_bytes(char *out, size_t cap, double bytes) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB",
                                      "YiB"};
  int unit = 0;
  /* The unit of the figure as printed: one that rounds to 1024.00 is 1.00 of the next. */
  while (unit < 8 && bytes >= (unit ? 1024.0 - 0.005 : 1024.0)) {
    bytes /= 1024.0;
    unit++;
  }
  PyOS_snprintf(out, cap, unit == 0 ? "%.0f %s" : "%.2f %s", bytes, units[unit]);
}

/* Messages of the engine's option table read "VRAMKIT_LIMIT: expected ..."; a message for a
 * Python argument keeps only the reason, since the user never wrote the variable. */
const char *reason_of(const char *why, const char *variable) {
  size_t n = strlen(variable);
  if (why == NULL) return "invalid value";
  if (strncmp(why, variable, n) == 0 && why[n] == ':') return why + n + (why[n + 1] == ' ' ? 2 : 1);
  return why;
}

int env_problem(char *out, size_t cap) {
  vram_options_t probe;
  const char *why = NULL;
  vram_options_init(&probe);
  if (vram_options_from_env(&probe, &why) == VRAM_OK) return 0;
  if (why == NULL) {
    snprintf(out, cap, "%s", vram_strerror(VRAM_EENV));
    return 1;
  }
  /* The value came from the environment: shown escaped, as every foreign text is. */
  char shown[2048];
  vram_escape_text(shown, sizeof shown, why, strlen(why));
  snprintf(out, cap, "environment variable %s", shown);
  return 1;
}

/* A bad VRAMKIT_* variable: the engine's message names the variable and quotes the value,
 * so the user sees the line to fix. */
static PyObject *raise_env_error(core_state *st) {
  char problem[2200];
  env_problem(problem, sizeof problem);
  return raise_message(st, VRAM_EENV, PyUnicode_FromString(problem), NULL);
}

/* Where a device's pool takes its memory when none is configured: the source the
 * environment names, AUTO read as the engine reads it (the GPU if one is seen, else sim). */
static vram_source_kind env_source(void) {
  vram_options_t probe;
  vram_options_init(&probe);
  if (vram_options_from_env(&probe, NULL) != VRAM_OK) return VRAM_SOURCE_AUTO;
  if (probe.source != VRAM_SOURCE_AUTO) return probe.source;
  int gpus = 0;
  return vram_device_count(VRAM_SOURCE_CUDA, &gpus) == VRAM_OK && gpus > 0 ? VRAM_SOURCE_CUDA
                                                                          : VRAM_SOURCE_SIM;
}

/* No such device: say how many there are, so "device 99" is not a riddle. */
PyObject *raise_bad_device(core_state *st, int device, vram_source_kind kind) {
  int count = 0;
  if (kind == VRAM_SOURCE_AUTO) kind = env_source();
  if (device < 0)
    return raise_message(
        st, VRAM_EDEVICE,
        PyUnicode_FromFormat("device %d: invalid device ordinal (ordinals start at 0)", device),
        NULL);
  if (vram_device_count(kind, &count) != VRAM_OK)
    return raise_message(
        st, VRAM_EDEVICE, PyUnicode_FromFormat("device %d: invalid device ordinal", device),
        NULL);
  return raise_message(st, VRAM_EDEVICE,
                       PyUnicode_FromFormat("device %d: invalid device ordinal (the %s source "
                                            "has %d device%s)",
                                            device, vram_source_name(kind), count,
                                            count == 1 ? "" : "s"),
                       NULL);
}


/* A sim capacity outside what the sim models: the value given, and the range. */
PyObject *raise_sim_capacity(core_state *st, int device, size_t capacity) {
  return raise_message(st, VRAM_ESIMCAPACITY,
                       PyUnicode_FromFormat("device %d: sim capacity of %zu bytes: %s", device,
                                            capacity, vram_strerror(VRAM_ESIMCAPACITY)),
                       NULL);
}

/* Raise the exception of a status from a call on `device`. `pool`, if known, supplies the
 * OOM report, which names the size, the capacity, what is free and what to try: when there
 * is one it is the whole message. Returns NULL for convenience. */
PyObject *raise_status(core_state *st, int status, int device, vram_pool_t *pool) {
  if (status == VRAM_EDEVICE) return raise_bad_device(st, device, VRAM_SOURCE_AUTO);
  if (status == VRAM_EENV) return raise_env_error(st);
  if (status == VRAM_ESIMCAPACITY) {
    /* A pool made from the environment: the capacity is the one it names. */
    vram_options_t probe;
    vram_options_init(&probe);
    vram_options_from_env(&probe, NULL);
    return raise_sim_capacity(st, device, probe.sim_capacity);
  }
  if (status == VRAM_ENOMEM && pool != NULL) {
    int rs;
    PyObject *report = pool_text(pool, vram_oom_report, &rs);
    if (report == NULL) PyErr_Clear();
    if (report != NULL && PyUnicode_GetLength(report) > 0) {
      vram_oom_info_t info;
      return raise_oom(st, status, report, vram_oom_info(pool, &info), &info);
    }
    Py_XDECREF(report);
  }
  if (status == VRAM_ENOMEM && pool == NULL) {
    /* A pool that could not be made (its preallocation did not fit): the report it left
     * with this thread. */
    int need = vram_pool_create_report(NULL, 0);
    char *text = need > 0 ? PyMem_Malloc((size_t)need + 1) : NULL;
    if (text != NULL) {
      vram_pool_create_report(text, (size_t)need + 1);
      PyObject *report = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
      PyMem_Free(text);
      if (report == NULL) return NULL;
      vram_oom_info_t info;
      return raise_oom(st, status, report, vram_pool_create_oom_info(&info), &info);
    }
  }
  if (pool == NULL && (status == VRAM_EINVAL || status == VRAM_EUNSUPPORTED)) {
    /* Options the library refused together: its words for why, which name them. */
    char why[512];
    if (vram_pool_create_report(why, sizeof why) > 0) {
      if (device == NO_DEVICE) return raise_message(st, status, PyUnicode_FromString(why), NULL);
      return raise_message(st, status, PyUnicode_FromFormat("device %d: %s", device, why),
                           NULL);
    }
  }
  if (device == NO_DEVICE)
    return raise_message(st, status, PyUnicode_FromString(vram_strerror(status)), NULL);
  return raise_message(st, status,
                       PyUnicode_FromFormat("device %d: %s", device, vram_strerror(status)),
                       NULL);
}

/* The default pool of a device, or NULL with an exception set. */
vram_pool_t *get_pool(core_state *st, int device) {
  vram_pool_t *pool = NULL;
  int rc;
  if (device >= 0 && device < VRAMKIT_MAX_TRACKED && pool_touched[device]) {
    rc = vram_default_pool(device, &pool);
  } else {
    /* First use may preallocate from the driver: let other threads run meanwhile. */
    Py_BEGIN_ALLOW_THREADS
    rc = vram_default_pool(device, &pool);
    Py_END_ALLOW_THREADS
  }
  if (rc != VRAM_OK) {
    raise_status(st, rc, device, NULL);
    return NULL;
  }
  if (device >= 0 && device < VRAMKIT_MAX_TRACKED) pool_touched[device] = 1;
  return pool;
}


/* An int, or an object with __index__ (numpy's integers), never a bool or a float: a byte
 * count has no fractions, and True is not a size. A negative size is refused here, naming
 * the argument. One past size_t is not an overflow but a size no device holds; what that
 * means is the caller's (empty(): out of memory), so it is only marked. */
int size_converter(PyObject *obj, void *out) {
  size_arg *arg = out;
  arg->obj = obj;
  arg->bytes = 0;
  arg->too_big = 0;
  if (PyBool_Check(obj) || !PyIndex_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "%s must be an int (a number of bytes), not %s", arg->name,
                 Py_TYPE(obj)->tp_name);
    return 0;
  }
  PyObject *value = PyLong_CheckExact(obj) ? Py_NewRef(obj) : PyNumber_Index(obj);
  if (value == NULL) return 0;
  int overflow = 0;
  long long small = PyLong_AsLongLongAndOverflow(value, &overflow);
  int ok = 1;
  if (small == -1 && PyErr_Occurred()) {
    ok = 0;
  } else if (overflow < 0 || (overflow == 0 && small < 0)) {
    raise_message(arg->st, VRAM_EINVAL,
                  PyUnicode_FromFormat("%s must be >= 0, got %S", arg->name, value), NULL);
    ok = 0;
  } else if (overflow == 0) {
    arg->bytes = (size_t)small;
  } else {
    unsigned long long big = PyLong_AsUnsignedLongLong(value);
    if (big == (unsigned long long)-1 && PyErr_Occurred()) {
      if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
        PyErr_Clear();
        arg->too_big = 1;
      } else {
        ok = 0;
      }
    } else if (big > SIZE_MAX) {
      arg->too_big = 1;
    } else {
      arg->bytes = (size_t)big;
    }
  }
  Py_DECREF(value);
  return ok;
}

/* empty() of a size past size_t, which the engine never sees: an out-of-memory error like
 * the one the engine gives for sizes past its maximum, naming the size and the capacity. */
PyObject *raise_too_big(core_state *st, vram_pool_t *pool, int device,
                               const size_arg *size) {
  size_t free_bytes = 0, total_bytes = 0;
  vram_mem_get_info(pool, &free_bytes, &total_bytes);
  PyObject *exact = PyNumber_Index(size->obj);
  if (exact == NULL) return NULL;
  char asked[48] = "", capacity[48];
  double approx = PyLong_AsDouble(exact);
  if (approx == -1.0 && PyErr_Occurred()) PyErr_Clear();
  /* Past a thousand YiB a unit says nothing the exact figure does not. */
  else if (approx < 0x1p90) format_bytes(asked, sizeof asked, approx);
  format_bytes(capacity, sizeof capacity, (double)total_bytes);
  PyObject *message = PyUnicode_FromFormat(
      "vramkit: out of memory on device %d (%s source): tried to allocate %s%s%S bytes%s, "
      "more than device %d's capacity of %s (%zu bytes).",
      device, vram_source_name(vram_pool_source(pool)), asked, asked[0] ? " (" : "", exact,
      asked[0] ? ")" : "", device, capacity, total_bytes);
  Py_DECREF(exact);
  /* The message is the report too, as the engine's out-of-memory reports are. */
  return raise_message(st, VRAM_ENOMEM, message, message);
}

/* getattr that treats a missing attribute as "absent" (1: found, 0: absent, -1: error). */
static int optional_attr(PyObject *obj, const char *name, PyObject **out) {
  *out = PyObject_GetAttrString(obj, name);
  if (*out != NULL) return 1;
  if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
  PyErr_Clear();
  return 0;
}

/* "O&" converter for a device ordinal: an int (or an object with __index__) that fits a C
 * int; a bool is refused, as True is never meant as device 1. The ordinal's own checks
 * (negative, no such device) are get_pool's. */
int device_converter(PyObject *obj, void *out) {
  if (PyBool_Check(obj)) {
    PyErr_SetString(PyExc_TypeError, "device must be an int, not bool");
    return 0;
  }
  PyObject *index = PyNumber_Index(obj);
  if (index == NULL) return 0;
  int overflow = 0;
  long value = PyLong_AsLongAndOverflow(index, &overflow);
  Py_DECREF(index);
  if (value == -1 && PyErr_Occurred()) return 0;
  if (overflow || value < INT_MIN || value > INT_MAX) {
    PyErr_Format(PyExc_OverflowError, "device %.60R is out of range: an ordinal is below 2**31",
                 obj);
    return 0;
  }
  *(int *)out = (int)value;
  return 1;
}

/* "O&" converter: None -> NULL stream; an int is the CUstream handle itself; an object
 * with .cuda_stream (torch.cuda.Stream) or .ptr (cupy.cuda.Stream) gives its handle. */
int stream_converter(PyObject *obj, void *out) {
  vram_stream_t *stream = out;
  if (obj == Py_None) {
    *stream = NULL;
    return 1;
  }
  PyObject *handle = NULL;
  if (PyBool_Check(obj)) {
    /* An int to Python, but True is a flag written by mistake, never stream handle 1. */
    PyErr_SetString(PyExc_TypeError, "stream must be None, an int (a CUstream handle) or a "
                                     "stream object, not bool");
    return 0;
  }
  if (PyLong_Check(obj)) {
    handle = Py_NewRef(obj);
  } else {
    if (optional_attr(obj, "cuda_stream", &handle) < 0) return 0;
    if (handle == NULL && optional_attr(obj, "ptr", &handle) < 0)
      return 0;
    if (handle == NULL || !PyLong_Check(handle)) {
      Py_XDECREF(handle);
      PyErr_Format(PyExc_TypeError,
                   "stream must be None, an int (a CUstream handle) or a stream object "
                   "with .cuda_stream or .ptr, not %s",
                   Py_TYPE(obj)->tp_name);
      return 0;
    }
  }
  PyObject *zero = PyLong_FromLong(0);
  int negative = zero ? PyObject_RichCompareBool(handle, zero, Py_LT) : -1;
  Py_XDECREF(zero);
  if (negative != 0) {
    /* PyLong_AsVoidPtr would take -1 as the all-ones pointer: a handle is never below 0. */
    if (negative > 0)
      PyErr_Format(PyExc_OverflowError, "stream handle %R is not a pointer (0 to 2**64 - 1)",
                   handle);
    Py_DECREF(handle);
    return 0;
  }
  *stream = PyLong_AsVoidPtr(handle);
  if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_OverflowError)) {
    /* A handle is a pointer: say so, not that a C type overflowed. */
    PyErr_Clear();
    PyErr_Format(PyExc_OverflowError, "stream handle %R is not a pointer (0 to 2**64 - 1)",
                 handle);
  }
  Py_DECREF(handle);
  return !PyErr_Occurred();
}


static int long_to_int(core_state *st, PyObject *obj, int *out) {
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (v == -1 && PyErr_Occurred()) return 0;
  if (overflow != 0 || v < INT_MIN || v > INT_MAX) {
    /* No device has such an ordinal: the same error as any other missing device. */
    raise_message(st, VRAM_EDEVICE,
                  PyUnicode_FromFormat("device %S: invalid device ordinal", obj), NULL);
    return 0;
  }
  *out = (int)v;
  return 1;
}

int device_from_object(core_state *st, PyObject *obj, int *device) {
  if (PyLong_CheckExact(obj)) return long_to_int(st, obj, device);
  if (st->device_resolver == NULL) {
    PyErr_SetString(PyExc_TypeError, "device must be an int");
    return 0;
  }
  PyObject *ordinal = PyObject_CallOneArg(st->device_resolver, obj);
  if (ordinal == NULL) return 0;
  int ok = long_to_int(st, ordinal, device);
  Py_DECREF(ordinal);
  return ok;
}

/* ---------------------------------------------------------------------------------------
 * Pickling.
 * ------------------------------------------------------------------------------------- */

/* BaseException's own reduce gives the same triple, but tools that carry exceptions between
 * processes (tblib, under dask's distributed) rebuild a class without an explicit
 * __reduce__ through cls.__new__, and for OutOfMemoryError, a MemoryError too, that is
 * MemoryError.__new__, which refuses the subclass: the receiver would get a plain
 * Exception. An explicit one makes every such tool rebuild it as pickle does, as
 * cls(*args) with .status, .errname and .report restored from its __dict__. */
static PyObject *error_reduce(PyObject *self, PyObject *Py_UNUSED(ignored)) {
  PyObject *args = PyObject_GetAttrString(self, "args");
  if (args == NULL) return NULL;
  PyObject *dict = PyObject_GenericGetDict(self, NULL);
  if (dict == NULL) {
    Py_DECREF(args);
    return NULL;
  }
  PyObject *triple = Py_BuildValue("(ONN)", (PyObject *)Py_TYPE(self), args, dict);
  return triple;
}

static PyMethodDef error_reduce_def = {
    "__reduce__", error_reduce, METH_NOARGS,
    PyDoc_STR("(type, args, attributes): how pickle and tblib rebuild the error.")};

int install_error_reduce(PyObject *vram_error) {
  PyObject *descr = PyDescr_NewMethod((PyTypeObject *)vram_error, &error_reduce_def);
  if (descr == NULL) return -1;
  int rc = PyObject_SetAttrString(vram_error, "__reduce__", descr);
  Py_DECREF(descr);
  return rc;
}

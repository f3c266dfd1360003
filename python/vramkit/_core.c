/* _core.c - vramkit._core, the thin CPython layer over the public C API (vramkit.h).
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
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <string.h>

#include "vramkit.h"

/* Devices whose default pool this process has touched through Python. The pools are
 * process-wide, so this is process-wide too (not module state): it lets configure() and
 * set_memory_growth() refuse, as TensorFlow does, to change a device already in use. */
#define VRAMKIT_MAX_TRACKED 64
static unsigned char pool_touched[VRAMKIT_MAX_TRACKED];

/* ---------------------------------------------------------------------------------------
 * Module state.
 * ------------------------------------------------------------------------------------- */
typedef struct {
  PyObject *VramError;            /* base of every vramkit error */
  PyObject *OutOfMemoryError;     /* VRAM_ENOMEM; also a MemoryError */
  PyObject *HostMemoryError;      /* VRAM_EHOSTMEM; also a MemoryError */
  PyObject *InvalidArgumentError; /* VRAM_EINVAL, VRAM_ETRACE; ValueError */
  PyObject *InvalidDeviceError;   /* VRAM_EDEVICE; ValueError */
  PyObject *ConfigError;          /* VRAM_EENV; ValueError */
  PyObject *AllocatorError;       /* pointer misuse and pool misuse; RuntimeError */
  PyObject *DoubleFreeError;      /* VRAM_EDOUBLEFREE */
  PyObject *ForeignPointerError;  /* VRAM_EFOREIGN */
  PyObject *BusyError;            /* VRAM_EBUSY */
  PyObject *DriverError;          /* VRAM_EDRIVER, VRAM_EFAULT, VRAM_EIO; RuntimeError */
  PyObject *NoDriverError;        /* VRAM_ENODRIVER */
  PyObject *UnsupportedError;     /* VRAM_EUNSUPPORTED; NotImplementedError */
  PyTypeObject *DeviceBuffer_Type;
  PyObject *device_resolver; /* the package's name -> ordinal function, for empty() */
} core_state;

static inline core_state *get_state(PyObject *module) {
  return (core_state *)PyModule_GetState(module);
}

/* Text from a vram_summary-style call (returns the length it needs). */
typedef int (*text_fn)(vram_pool_t *, char *, size_t);

static PyObject *pool_text(vram_pool_t *pool, text_fn fn, int *status) {
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
static PyObject *status_type(core_state *st, int status) {
  switch (status) {
  case VRAM_ENOMEM: return st->OutOfMemoryError;
  case VRAM_EHOSTMEM: return st->HostMemoryError;
  case VRAM_EINVAL:
  case VRAM_ETRACE: return st->InvalidArgumentError;
  case VRAM_EDEVICE: return st->InvalidDeviceError;
  case VRAM_EENV: return st->ConfigError;
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

/* The exception of `status` with this message, carrying .status, .errname and .report
 * (the OOM report, else None), so callers can test the code rather than parse text. */
static PyObject *new_error(core_state *st, int status, PyObject *message, PyObject *report) {
  PyObject *exc = PyObject_CallOneArg(status_type(st, status), message);
  if (exc == NULL) return NULL;
  PyObject *code = PyLong_FromLong(status);
  PyObject *name = PyUnicode_FromString(vram_errname(status));
  int failed = code == NULL || name == NULL || PyObject_SetAttrString(exc, "status", code) < 0 ||
               PyObject_SetAttrString(exc, "errname", name) < 0 ||
               PyObject_SetAttrString(exc, "report", report ? report : Py_None) < 0;
  Py_XDECREF(code);
  Py_XDECREF(name);
  if (failed) Py_CLEAR(exc);
  return exc;
}

/* Raise `status` with a message (a new reference, consumed; NULL passes an error on). */
static PyObject *raise_message(core_state *st, int status, PyObject *message, PyObject *report) {
  if (message == NULL) return NULL;
  PyObject *exc = new_error(st, status, message, report);
  Py_DECREF(message);
  if (exc == NULL) return NULL;
  PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
  Py_DECREF(exc);
  return NULL;
}

/* Sizes in messages: "80.00 GiB", the exact byte count going beside it. */
static void format_bytes(char *out, size_t cap, double bytes) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB",
                                      "YiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 8) {
    bytes /= 1024.0;
    unit++;
  }
  PyOS_snprintf(out, cap, unit == 0 ? "%.0f %s" : "%.2f %s", bytes, units[unit]);
}

/* Messages of the engine's option table read "VRAMKIT_LIMIT: expected ..."; a message for a
 * Python argument keeps only the reason, since the user never wrote the variable. */
static const char *reason_of(const char *why, const char *variable) {
  size_t n = strlen(variable);
  if (why == NULL) return "invalid value";
  if (strncmp(why, variable, n) == 0 && why[n] == ':') return why + n + (why[n + 1] == ' ' ? 2 : 1);
  return why;
}

/* A bad VRAMKIT_* variable: ask the engine which one (it keeps the reason) and quote what
 * the environment holds, so the user sees the line to fix. */
static PyObject *raise_env_error(core_state *st) {
  vram_options_t probe;
  const char *why = NULL;
  vram_options_init(&probe);
  vram_options_from_env(&probe, &why);
  const char *colon = why ? strchr(why, ':') : NULL;
  if (colon == NULL)
    return raise_message(st, VRAM_EENV, PyUnicode_FromString(vram_strerror(VRAM_EENV)), NULL);
  char variable[64];
  PyOS_snprintf(variable, sizeof variable, "%.*s", (int)(colon - why), why);
  const char *value = getenv(variable);
  return raise_message(st, VRAM_EENV,
                       PyUnicode_FromFormat("environment variable %s=%s: %s", variable,
                                            value ? value : "", reason_of(why, variable)),
                       NULL);
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
static PyObject *raise_bad_device(core_state *st, int device, vram_source_kind kind) {
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

/* No device in a message: the error is not about one. */
#define NO_DEVICE INT_MIN

/* Raise the exception of a status from a call on `device`. `pool`, if known, supplies the
 * OOM report, which names the size, the capacity, what is free and what to try: when there
 * is one it is the whole message. Returns NULL for convenience. */
static PyObject *raise_status(core_state *st, int status, int device, vram_pool_t *pool) {
  if (status == VRAM_EDEVICE) return raise_bad_device(st, device, VRAM_SOURCE_AUTO);
  if (status == VRAM_EENV) return raise_env_error(st);
  if (status == VRAM_ENOMEM && pool != NULL) {
    int rs;
    PyObject *report = pool_text(pool, vram_oom_report, &rs);
    if (report == NULL) PyErr_Clear();
    if (report != NULL && PyUnicode_GetLength(report) > 0) {
      raise_message(st, status, Py_NewRef(report), report);
      Py_DECREF(report);
      return NULL;
    }
    Py_XDECREF(report);
  }
  if (device == NO_DEVICE)
    return raise_message(st, status, PyUnicode_FromString(vram_strerror(status)), NULL);
  return raise_message(st, status,
                       PyUnicode_FromFormat("device %d: %s", device, vram_strerror(status)),
                       NULL);
}

/* The default pool of a device, or NULL with an exception set. */
static vram_pool_t *get_pool(core_state *st, int device) {
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

/* A size argument, for the "O&" converter below. The caller sets `name` (the argument, for
 * messages) and `st`; the converter fills the rest. */
typedef struct {
  const char *name;
  core_state *st;
  PyObject *obj;  /* the argument as given (borrowed: the argument tuple holds it) */
  size_t bytes;
  int too_big;    /* more than size_t holds */
} size_arg;

/* An int, or an object with __index__ (numpy's integers), never a bool or a float: a byte
 * count has no fractions, and True is not a size. A negative size is refused here, naming
 * the argument. One past size_t is not an overflow but a size no device holds; what that
 * means is the caller's (empty(): out of memory), so it is only marked. */
static int size_converter(PyObject *obj, void *out) {
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
static PyObject *raise_too_big(core_state *st, vram_pool_t *pool, int device,
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

/* "O&" converter: None -> NULL stream; an int is the CUstream handle itself; an object
 * with .cuda_stream (torch.cuda.Stream) or .ptr (cupy.cuda.Stream) gives its handle. */
static int stream_converter(PyObject *obj, void *out) {
  vram_stream_t *stream = out;
  if (obj == Py_None) {
    *stream = NULL;
    return 1;
  }
  PyObject *handle = NULL;
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
  *stream = PyLong_AsVoidPtr(handle);
  Py_DECREF(handle);
  return !PyErr_Occurred();
}

/* ---------------------------------------------------------------------------------------
 * DeviceBuffer: one block of device memory, freed when the last reference goes.
 *
 * A C type with its own tp_dealloc, because `vramkit.empty(n)` followed by `del` is a hot
 * path that must beat CuPy's pool from Python: no __dict__, no GC tracking (the object
 * holds no Python references), no Python-level __del__.
 * ------------------------------------------------------------------------------------- */
typedef struct {
  PyObject_HEAD
  void *ptr;
  size_t nbytes; /* as asked for; 0 once freed, as a buffer that holds nothing */
  vram_pool_t *pool;
  vram_stream_t stream;
  int device;
  int has_stream; /* the caller named a stream: __cuda_array_interface__ reports it */
  int freed;
} DeviceBuffer;

/* A device argument: an int as is; anything else ("cuda:1", "GPU:0", torch.device...) goes
 * through the package's resolver, so every function accepts the same device names. */
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

static int device_from_object(core_state *st, PyObject *obj, int *device) {
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

static PyObject *core_empty(PyObject *module, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"nbytes", "device", "stream", NULL};
  core_state *st = get_state(module);
  size_arg nbytes = {.name = "nbytes", .st = st};
  int device = 0;
  PyObject *device_obj = NULL, *stream_obj = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|OO:empty", kwlist, size_converter,
                                   &nbytes, &device_obj, &stream_obj))
    return NULL;
  if (device_obj != NULL && !device_from_object(st, device_obj, &device)) return NULL;
  vram_stream_t stream = NULL;
  if (stream_obj != Py_None && !stream_converter(stream_obj, &stream)) return NULL;
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
  if (nbytes.too_big) return raise_too_big(st, pool, device, &nbytes);

  /* The GIL stays held: a cached allocation takes tens of nanoseconds, less than
   * releasing and retaking the GIL would. */
  void *ptr = NULL;
  int rc = vram_malloc(pool, nbytes.bytes, stream, &ptr);
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);

  DeviceBuffer *self = PyObject_New(DeviceBuffer, st->DeviceBuffer_Type);
  if (self == NULL) {
    vram_free(pool, ptr);
    return NULL;
  }
  self->ptr = ptr;
  self->nbytes = nbytes.bytes;
  self->pool = pool;
  self->stream = stream;
  self->device = device;
  self->has_stream = stream_obj != Py_None;
  self->freed = 0;
  return (PyObject *)self;
}

static void DeviceBuffer_dealloc(DeviceBuffer *self) {
  PyTypeObject *tp = Py_TYPE(self);
  if (!self->freed) {
    int rc = vram_free(self->pool, self->ptr);
    if (rc != VRAM_OK) {
      /* A destructor cannot raise; say what went wrong rather than swallow it, and keep
       * any exception already in flight (dealloc can run while one unwinds). */
      PyObject *type, *value, *tb;
      PyErr_Fetch(&type, &value, &tb);
      PyErr_Format(PyExc_RuntimeWarning, "vramkit: freeing DeviceBuffer 0x%zx failed: %s",
                   (size_t)self->ptr, vram_strerror(rc));
      PyErr_WriteUnraisable(NULL);
      PyErr_Restore(type, value, tb);
    }
  }
  PyObject_Free(self);
  Py_DECREF(tp);
}

/* Use of a buffer after free(): a DoubleFreeError naming what was asked of it. */
static PyObject *raise_freed(core_state *st, DeviceBuffer *self, const char *what) {
  return raise_message(st, VRAM_EDOUBLEFREE,
                       PyUnicode_FromFormat("DeviceBuffer.%s: the buffer (device %d) was "
                                            "already freed",
                                            what, self->device),
                       NULL);
}

static PyObject *DeviceBuffer_free(DeviceBuffer *self, PyObject *Py_UNUSED(ignored)) {
  core_state *st = PyType_GetModuleState(Py_TYPE(self));
  if (st == NULL) return NULL;
  if (self->freed) return raise_freed(st, self, "free()");
  int rc = vram_free(self->pool, self->ptr);
  if (rc != VRAM_OK) return raise_status(st, rc, self->device, self->pool);
  self->freed = 1;
  /* A freed buffer holds nothing: ptr reads 0 and nbytes 0, as a released rmm.DeviceBuffer
   * does, so code that sums nbytes over live buffers stays right. */
  self->nbytes = 0;
  Py_RETURN_NONE;
}

static PyObject *DeviceBuffer_record_stream(DeviceBuffer *self, PyObject *arg) {
  core_state *st = PyType_GetModuleState(Py_TYPE(self));
  if (st == NULL) return NULL;
  vram_stream_t stream;
  if (!stream_converter(arg, &stream)) return NULL;
  if (self->freed) return raise_freed(st, self, "record_stream()");
  int rc = vram_record_stream(self->pool, self->ptr, stream);
  if (rc != VRAM_OK) return raise_status(st, rc, self->device, self->pool);
  Py_RETURN_NONE;
}

static PyObject *DeviceBuffer_prefetch(DeviceBuffer *self, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"to_device", "stream", NULL};
  core_state *st = PyType_GetModuleState(Py_TYPE(self));
  if (st == NULL) return NULL;
  int to_device = 1;
  vram_stream_t stream = self->stream;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|pO&:prefetch", kwlist, &to_device,
                                   stream_converter, &stream))
    return NULL;
  if (self->freed) return raise_freed(st, self, "prefetch()");
  int rc = vram_prefetch(self->pool, self->ptr, self->nbytes, to_device, stream);
  if (rc != VRAM_OK) return raise_status(st, rc, self->device, self->pool);
  Py_RETURN_NONE;
}

static PyObject *DeviceBuffer_get_ptr(DeviceBuffer *self, void *closure) {
  return PyLong_FromVoidPtr(self->freed ? NULL : self->ptr);
}

static PyObject *DeviceBuffer_get_nbytes(DeviceBuffer *self, void *closure) {
  return PyLong_FromSize_t(self->nbytes);
}

static PyObject *DeviceBuffer_get_device(DeviceBuffer *self, void *closure) {
  return PyLong_FromLong(self->device);
}

static PyObject *DeviceBuffer_get_stream(DeviceBuffer *self, void *closure) {
  if (!self->has_stream) Py_RETURN_NONE;
  return PyLong_FromVoidPtr(self->stream);
}

static PyObject *DeviceBuffer_get_freed(DeviceBuffer *self, void *closure) {
  return PyBool_FromLong(self->freed);
}

/* Version 3 of Numba's CUDA Array Interface: a 1-D array of nbytes unsigned bytes. */
static PyObject *DeviceBuffer_get_cai(DeviceBuffer *self, void *closure) {
  if (self->freed) {
    core_state *st = PyType_GetModuleState(Py_TYPE(self));
    if (st == NULL) return NULL;
    return raise_freed(st, self, "__cuda_array_interface__");
  }
  PyObject *stream;
  if (!self->has_stream) {
    stream = Py_NewRef(Py_None);
  } else {
    /* The interface reserves 0; the legacy default stream is spelled 1 there. */
    stream = self->stream == NULL ? PyLong_FromLong(1) : PyLong_FromVoidPtr(self->stream);
  }
  if (stream == NULL) return NULL;
  return Py_BuildValue("{s:(N),s:s,s:(NO),s:O,s:i,s:N}", "shape",
                       PyLong_FromSize_t(self->nbytes), "typestr", "|u1", "data",
                       PyLong_FromVoidPtr(self->ptr), Py_False, "strides", Py_None, "version",
                       3, "stream", stream);
}

static PyObject *DeviceBuffer_repr(DeviceBuffer *self) {
  if (self->freed)
    return PyUnicode_FromFormat("<vramkit.DeviceBuffer freed device=%d>", self->device);
  return PyUnicode_FromFormat("<vramkit.DeviceBuffer ptr=%p nbytes=%zu device=%d>", self->ptr,
                              self->nbytes, self->device);
}

static PyMethodDef DeviceBuffer_methods[] = {
    {"free", (PyCFunction)DeviceBuffer_free, METH_NOARGS,
     PyDoc_STR("free($self, /)\n--\n\nReturn the block to its pool now. A second call raises "
               "DoubleFreeError.")},
    {"prefetch", (PyCFunction)(void (*)(void))DeviceBuffer_prefetch, METH_VARARGS | METH_KEYWORDS,
     PyDoc_STR("prefetch($self, /, to_device=True, stream=None)\n--\n\nMove the pages of "
               "this buffer to the device or the host (managed source; NotImplementedError "
               "elsewhere).")},
    {"record_stream", (PyCFunction)DeviceBuffer_record_stream, METH_O,
     PyDoc_STR("record_stream($self, stream, /)\n--\n\nMark the block as used on stream too: it is "
               "not reused before that stream's queued work completes.")},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef DeviceBuffer_getset[] = {
    {"ptr", (getter)DeviceBuffer_get_ptr, NULL, PyDoc_STR("device address (0 once freed)"),
     NULL},
    {"nbytes", (getter)DeviceBuffer_get_nbytes, NULL,
     PyDoc_STR("size asked for, in bytes (0 once freed)"), NULL},
    {"device", (getter)DeviceBuffer_get_device, NULL, PyDoc_STR("device ordinal"), NULL},
    {"stream", (getter)DeviceBuffer_get_stream, NULL,
     PyDoc_STR("stream handle given to empty(), or None"), NULL},
    {"freed", (getter)DeviceBuffer_get_freed, NULL, PyDoc_STR("True once free() ran"), NULL},
    {"__cuda_array_interface__", (getter)DeviceBuffer_get_cai, NULL,
     PyDoc_STR("CUDA Array Interface, version 3"), NULL},
    {NULL},
};

static PyType_Slot DeviceBuffer_slots[] = {
    {Py_tp_dealloc, DeviceBuffer_dealloc},
    {Py_tp_repr, DeviceBuffer_repr},
    {Py_tp_methods, DeviceBuffer_methods},
    {Py_tp_getset, DeviceBuffer_getset},
    {Py_tp_doc, "DeviceBuffer: device memory from vramkit.empty(); freed when the last "
                "reference goes, or by free()."},
    {0, NULL},
};

static PyType_Spec DeviceBuffer_spec = {
    .name = "vramkit.DeviceBuffer",
    .basicsize = sizeof(DeviceBuffer),
    /* Not a base type: the hot path relies on the exact layout and dealloc. Instances are
     * made only by empty(). */
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = DeviceBuffer_slots,
};

/* ---------------------------------------------------------------------------------------
 * Pool-wide functions. Each takes a device ordinal; the Python layer resolves names.
 * ------------------------------------------------------------------------------------- */
static PyObject *stat_tuple(const vram_stat_t *s) {
  return Py_BuildValue("(LLL)", (long long)s->current, (long long)s->peak, (long long)s->total);
}

static PyObject *core_stats(PyObject *module, PyObject *args) {
  int device;
  if (!PyArg_ParseTuple(args, "i:stats", &device)) return NULL;
  core_state *st = get_state(module);
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
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

/* Shared body of the functions that return a pool's text. */
static PyObject *text_call(PyObject *module, PyObject *args, const char *format, text_fn fn) {
  int device;
  if (!PyArg_ParseTuple(args, format, &device)) return NULL;
  core_state *st = get_state(module);
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
  int rc;
  PyObject *text = pool_text(pool, fn, &rc);
  if (text == NULL && rc != VRAM_OK) return raise_status(st, rc, device, pool);
  return text;
}

static PyObject *core_summary(PyObject *module, PyObject *args) {
  return text_call(module, args, "i:summary", vram_summary);
}

static PyObject *core_stats_json(PyObject *module, PyObject *args) {
  return text_call(module, args, "i:stats_json", vram_stats_json);
}

static PyObject *core_oom_report(PyObject *module, PyObject *args) {
  return text_call(module, args, "i:oom_report", vram_oom_report);
}

static PyObject *core_empty_cache(PyObject *module, PyObject *args) {
  int device;
  if (!PyArg_ParseTuple(args, "i:empty_cache", &device)) return NULL;
  core_state *st = get_state(module);
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
  int rc;
  /* Releasing segments calls the driver (cuMemFree, unmaps): other threads may run. */
  Py_BEGIN_ALLOW_THREADS
  rc = vram_empty_cache(pool);
  Py_END_ALLOW_THREADS
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  Py_RETURN_NONE;
}

static PyObject *core_reset_peak_stats(PyObject *module, PyObject *args) {
  int device;
  if (!PyArg_ParseTuple(args, "i:reset_peak_stats", &device)) return NULL;
  core_state *st = get_state(module);
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
  int rc = vram_reset_peak_stats(pool);
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  Py_RETURN_NONE;
}

static PyObject *core_mem_get_info(PyObject *module, PyObject *args) {
  int device;
  if (!PyArg_ParseTuple(args, "i:mem_get_info", &device)) return NULL;
  core_state *st = get_state(module);
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
  size_t free_bytes = 0, total_bytes = 0;
  int rc = vram_mem_get_info(pool, &free_bytes, &total_bytes);
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  return Py_BuildValue("(nn)", (Py_ssize_t)free_bytes, (Py_ssize_t)total_bytes);
}

static PyObject *core_set_limit(PyObject *module, PyObject *args) {
  int device;
  core_state *st = get_state(module);
  size_arg limit = {.name = "limit", .st = st};
  double fraction;
  if (!PyArg_ParseTuple(args, "iO&d:set_limit", &device, size_converter, &limit, &fraction))
    return NULL;
  if (limit.too_big) {
    /* A limit caps reserved memory; it asks for nothing, so it is no out-of-memory error. */
    return raise_message(st, VRAM_EINVAL,
                         PyUnicode_FromFormat("limit: %S bytes is more than any device holds "
                                              "(0 removes the limit)",
                                              limit.obj),
                         NULL);
  }
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
  int rc;
  /* Lowering a limit may release cached segments through the driver. */
  Py_BEGIN_ALLOW_THREADS
  rc = vram_set_limit(pool, limit.bytes, fraction);
  Py_END_ALLOW_THREADS
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  Py_RETURN_NONE;
}

static PyObject *core_enable_peer_access(PyObject *module, PyObject *args) {
  int device, peer;
  if (!PyArg_ParseTuple(args, "ii:enable_peer_access", &device, &peer)) return NULL;
  core_state *st = get_state(module);
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
  int rc = vram_enable_peer_access(pool, peer);
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  Py_RETURN_NONE;
}

static PyObject *core_source(PyObject *module, PyObject *args) {
  int device;
  if (!PyArg_ParseTuple(args, "i:source", &device)) return NULL;
  vram_pool_t *pool = get_pool(get_state(module), device);
  if (pool == NULL) return NULL;
  return PyUnicode_FromString(vram_source_name(vram_pool_source(pool)));
}

/* One override of init_pool: `value` is the text, or (argument, text) when it came from a
 * Python argument, which a bad value then blames instead of the variable. */
static int apply_override(core_state *st, vram_options_t *opts, PyObject *key, PyObject *value) {
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
  if (argument != NULL)
    raise_message(st, VRAM_EINVAL,
                  PyUnicode_FromFormat("%S: %s, got %s", argument, reason_of(why, name), text),
                  NULL);
  else
    raise_message(st, rc, PyUnicode_FromFormat("%s=%s: %s", name, text, reason_of(why, name)),
                  NULL);
  return -1;
}

/* init_pool(device, overrides=None): create the device's default pool now. overrides maps
 * VRAMKIT_* names to text or (argument, text) and wins over the environment; the
 * environment is not touched (other threads may be reading it). */
static PyObject *core_init_pool(PyObject *module, PyObject *args) {
  int device;
  PyObject *overrides = Py_None;
  if (!PyArg_ParseTuple(args, "i|O:init_pool", &device, &overrides)) return NULL;
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
    if (apply_override(st, &opts, key, value) < 0) return NULL;
  opts.device = device;
  vram_pool_t *pool = NULL;
  /* Preallocation may call the driver: let other threads run meanwhile. */
  Py_BEGIN_ALLOW_THREADS
  rc = vram_default_pool_create(&opts, &pool);
  Py_END_ALLOW_THREADS
  if (rc == VRAM_EDEVICE) return raise_bad_device(st, device, opts.source);
  if (rc != VRAM_OK) return raise_status(st, rc, device, NULL);
  if (device >= 0 && device < VRAMKIT_MAX_TRACKED) pool_touched[device] = 1;
  Py_RETURN_NONE;
}

static PyObject *core_pool_touched(PyObject *module, PyObject *args) {
  int device;
  if (!PyArg_ParseTuple(args, "i:pool_touched", &device)) return NULL;
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
  int rc = vram_parse_size(text, allow_percent, &bytes, &fraction);
  if (rc != VRAM_OK)
    return raise_message(get_state(module), rc,
                         PyUnicode_FromFormat("cannot read '%s' as a size", text), NULL);
  return Py_BuildValue("(Kd)", (unsigned long long)bytes, fraction);
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

/* ---------------------------------------------------------------------------------------
 * Memory history, snapshots and Python stacks.
 *
 * The engine records events and snapshots in C structs; these calls hand them over as one
 * bytes object each (a memcpy here), unpacked by vramkit/history.py with struct: a list of
 * tuples built here would cost the same object allocations, only in more C. EVENT_SIZE,
 * SEGMENT_SIZE and BLOCK_SIZE let the package check its struct formats against the C
 * layout at import.
 * ------------------------------------------------------------------------------------- */

/* One Python frame of a captured stack: the code object and the offset of the instruction
 * running in it. The line is computed from the pair only at snapshot time. */
typedef struct {
  PyObject *code; /* a strong reference, held by the table once the stack is interned */
  int lasti;
} stack_frame;

typedef struct {
  uint64_t hash;
  size_t first; /* its frames: stacks.frames[first .. first + depth) */
  uint32_t depth;
} stack_entry;

/* The interned stacks. Process-wide, like the context function the pools call; touched
 * only by threads holding the GIL, which is its lock. A stack's id is its index + 1 and
 * is never reused: blocks allocated long ago (and events in any pool's ring) keep naming
 * it, so the table only grows, by one entry per distinct call path, not per allocation. */
static struct {
  stack_frame *frames;
  size_t n_frames, cap_frames;
  stack_entry *entries;
  size_t n_entries, cap_entries;
  uint32_t *slots; /* open addressing over entries: 0 = empty, else index + 1 */
  size_t n_slots;  /* a power of two, kept at least twice n_entries */
} stacks;

/* Deep recursion would make each capture as slow as its depth: the innermost frames are
 * the ones that name the call site, so a stack keeps at most this many. */
#define STACK_MAX_DEPTH 96

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

static int stacks_grow_slots(void) {
  size_t n = stacks.n_slots ? stacks.n_slots * 2 : 1024;
  uint32_t *slots = PyMem_RawCalloc(n, sizeof *slots);
  if (slots == NULL) return -1;
  for (size_t i = 0; i < stacks.n_entries; i++) {
    size_t j = (size_t)stacks.entries[i].hash & (n - 1);
    while (slots[j] != 0) j = (j + 1) & (n - 1);
    slots[j] = (uint32_t)(i + 1);
  }
  PyMem_RawFree(stacks.slots);
  stacks.slots = slots;
  stacks.n_slots = n;
  return 0;
}

/* The id of this stack, interning it if new (0 when host memory runs out: the allocation
 * then simply has no stack). */
static uint64_t stacks_intern(const stack_frame *frames, uint32_t depth, uint64_t hash) {
  if (stacks.n_slots == 0 && stacks_grow_slots() < 0) return 0;
  size_t mask = stacks.n_slots - 1, j = (size_t)hash & mask;
  for (; stacks.slots[j] != 0; j = (j + 1) & mask) {
    const stack_entry *e = &stacks.entries[stacks.slots[j] - 1];
    if (e->hash == hash && e->depth == depth &&
        memcmp(&stacks.frames[e->first], frames, depth * sizeof *frames) == 0)
      return stacks.slots[j];
  }
  if (stacks.n_entries >= UINT32_MAX - 1) return 0;
  if (stacks.n_frames + depth > stacks.cap_frames) {
    size_t cap = stacks.cap_frames ? stacks.cap_frames * 2 : 4096;
    while (cap < stacks.n_frames + depth) cap *= 2;
    stack_frame *grown = PyMem_RawRealloc(stacks.frames, cap * sizeof *grown);
    if (grown == NULL) return 0;
    stacks.frames = grown;
    stacks.cap_frames = cap;
  }
  if (stacks.n_entries == stacks.cap_entries) {
    size_t cap = stacks.cap_entries ? stacks.cap_entries * 2 : 256;
    stack_entry *grown = PyMem_RawRealloc(stacks.entries, cap * sizeof *grown);
    if (grown == NULL) return 0;
    stacks.entries = grown;
    stacks.cap_entries = cap;
  }
  stack_entry *e = &stacks.entries[stacks.n_entries];
  e->hash = hash;
  e->first = stacks.n_frames;
  e->depth = depth;
  for (uint32_t i = 0; i < depth; i++) {
    /* The table keeps the code objects alive so that the stack can be symbolized long
     * after the functions are gone. */
    Py_INCREF(frames[i].code);
    stacks.frames[stacks.n_frames + i] = frames[i];
  }
  stacks.n_frames += depth;
  stacks.n_entries++;
  stacks.slots[j] = (uint32_t)stacks.n_entries;
  if (stacks.n_entries * 2 > stacks.n_slots) stacks_grow_slots(); /* a failure only slows */
  return stacks.n_entries;
}

static uint64_t capture_stack_locked(void);

/* Python is shutting down: no thread may take the GIL any more. */
static int python_finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

/* The vram_context_fn: called by a pool at each allocation while it records with stacks,
 * on whatever thread allocates, outside the pool's lock. Python frames may only be read
 * with the GIL, and PyTorch releases it around every operator it dispatches, so a thread
 * that Python knows (it has a thread state, and with it its frames) takes the GIL back for
 * the walk, as PyTorch's own recorder does. A thread Python never saw (a C++ worker) has
 * no Python frames: 0, "no stack". */
static uint64_t capture_stack(void *user) {
  (void)user;
  if (PyGILState_Check()) return capture_stack_locked();
  if (PyGILState_GetThisThreadState() == NULL || python_finalizing()) return 0;
  PyGILState_STATE gil = PyGILState_Ensure();
  uint64_t id = capture_stack_locked();
  PyGILState_Release(gil);
  return id;
}

/* The walk itself, with the GIL held. Nothing here builds a Python object or looks
 * anything up from Python: it reads (code, lasti) pairs and hashes them. */
static uint64_t capture_stack_locked(void) {
  stack_frame frames[STACK_MAX_DEPTH];
  uint32_t depth = 0;
  uint64_t hash = 0x84222325cbf29ce4ull;
  PyFrameObject *frame = PyEval_GetFrame(); /* borrowed */
  Py_XINCREF(frame);
  while (frame != NULL && depth < STACK_MAX_DEPTH) {
    PyCodeObject *code = PyFrame_GetCode(frame);
    /* The running frame keeps its code alive for the rest of this call. */
    Py_DECREF(code);
    frames[depth].code = (PyObject *)code;
    frames[depth].lasti = PyFrame_GetLasti(frame);
    hash = mix(mix(hash, (uint64_t)(uintptr_t)code), (uint64_t)(uint32_t)frames[depth].lasti);
    depth++;
    PyFrameObject *back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  if (depth == 0) return 0;
  return stacks_intern(frames, depth, hash);
}

/* stack_frames(ids): {id: ((filename, line, name), ...) innermost first} for the stack ids
 * given. Symbolizing is the slow part of a stack, so it happens here, at snapshot time,
 * once per distinct (code, offset) pair of the call. */
static PyObject *core_stack_frames(PyObject *module, PyObject *ids) {
  PyObject *iter = PyObject_GetIter(ids);
  if (iter == NULL) return NULL;
  PyObject *out = PyDict_New(), *seen = PyDict_New(), *item = NULL;
  if (out == NULL || seen == NULL) goto fail;
  while ((item = PyIter_Next(iter)) != NULL) {
    unsigned long long id = PyLong_AsUnsignedLongLong(item);
    if (id == (unsigned long long)-1 && PyErr_Occurred()) goto fail;
    if (id == 0 || id > stacks.n_entries) {
      Py_CLEAR(item);
      continue; /* no stack (0) or not one of ours: the caller shows no frames */
    }
    const stack_entry *e = &stacks.entries[id - 1];
    PyObject *tuple = PyTuple_New(e->depth);
    if (tuple == NULL) goto fail;
    for (uint32_t i = 0; i < e->depth; i++) {
      const stack_frame *f = &stacks.frames[e->first + i];
      PyObject *key = Py_BuildValue("(Oi)", f->code, f->lasti);
      if (key == NULL) {
        Py_DECREF(tuple);
        goto fail;
      }
      PyObject *sym = PyDict_GetItemWithError(seen, key); /* borrowed */
      if (sym == NULL && !PyErr_Occurred()) {
        PyCodeObject *code = (PyCodeObject *)f->code;
        PyObject *name = PyObject_GetAttrString(f->code, "co_qualname");
        PyObject *filename = PyObject_GetAttrString(f->code, "co_filename");
        if (name != NULL && filename != NULL)
          sym = Py_BuildValue("(OiO)", filename, PyCode_Addr2Line(code, f->lasti), name);
        Py_XDECREF(name);
        Py_XDECREF(filename);
        if (sym != NULL && PyDict_SetItem(seen, key, sym) < 0) Py_CLEAR(sym);
        Py_XDECREF(sym); /* the dict holds it now */
      }
      Py_DECREF(key);
      if (sym == NULL) {
        Py_DECREF(tuple);
        goto fail;
      }
      PyTuple_SET_ITEM(tuple, i, Py_NewRef(sym));
    }
    int rc = PyDict_SetItem(out, item, tuple);
    Py_DECREF(tuple);
    Py_CLEAR(item);
    if (rc < 0) goto fail;
  }
  if (PyErr_Occurred()) goto fail;
  Py_DECREF(iter);
  Py_DECREF(seen);
  return out;
fail:
  Py_XDECREF(item);
  Py_DECREF(iter);
  Py_XDECREF(out);
  Py_XDECREF(seen);
  return NULL;
}

static PyObject *core_stack_count(PyObject *module, PyObject *Py_UNUSED(ignored)) {
  return PyLong_FromSize_t(stacks.n_entries);
}

/* history_start(device, max_entries, stacks, /): start (or restart: the ring is cleared)
 * the pool's recording; with stacks, each allocation gets the id of its Python stack. */
static PyObject *core_history_start(PyObject *module, PyObject *args) {
  int device, with_stacks;
  Py_ssize_t max_entries;
  if (!PyArg_ParseTuple(args, "inp:history_start", &device, &max_entries, &with_stacks))
    return NULL;
  core_state *st = get_state(module);
  if (max_entries <= 0)
    return raise_message(st, VRAM_EINVAL,
                         PyUnicode_FromFormat("max_entries must be > 0, got %zd", max_entries),
                         NULL);
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
  /* Process-wide and harmless to set again: pools call it only when they record with
   * VRAM_HISTORY_CONTEXTS. */
  if (with_stacks) vram_set_context_fn(capture_stack, NULL);
  int rc = vram_history_start(pool, (size_t)max_entries, with_stacks ? VRAM_HISTORY_CONTEXTS : 0);
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  Py_RETURN_NONE;
}

static PyObject *core_history_stop(PyObject *module, PyObject *args) {
  int device;
  if (!PyArg_ParseTuple(args, "i:history_stop", &device)) return NULL;
  core_state *st = get_state(module);
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
  int rc = vram_history_stop(pool);
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  Py_RETURN_NONE;
}

/* history_read(device, /) -> (events: bytes of vram_event_t, oldest first, dropped). */
static PyObject *core_history_read(PyObject *module, PyObject *args) {
  int device;
  if (!PyArg_ParseTuple(args, "i:history_read", &device)) return NULL;
  core_state *st = get_state(module);
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
  size_t count = 0, total = 0;
  uint64_t dropped = 0;
  int rc = vram_history_read(pool, NULL, 0, &count, &total, &dropped);
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  for (;;) {
    /* Other threads (PyTorch's, without the GIL) may record meanwhile: leave room for
     * some, and ask again if even that was not enough. */
    size_t cap = total + total / 8 + 64;
    if (cap > (size_t)PY_SSIZE_T_MAX / sizeof(vram_event_t)) return PyErr_NoMemory();
    PyObject *buf = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(cap * sizeof(vram_event_t)));
    if (buf == NULL) return NULL;
    rc = vram_history_read(pool, (vram_event_t *)PyBytes_AS_STRING(buf), cap, &count, &total,
                           &dropped);
    if (rc != VRAM_OK) {
      Py_DECREF(buf);
      return raise_status(st, rc, device, pool);
    }
    if (total <= cap) {
      if (_PyBytes_Resize(&buf, (Py_ssize_t)(count * sizeof(vram_event_t))) < 0) return NULL;
      return Py_BuildValue("(NK)", buf, (unsigned long long)dropped);
    }
    Py_DECREF(buf);
  }
}

static PyObject *core_history_annotate(PyObject *module, PyObject *args) {
  int device;
  unsigned long long context;
  if (!PyArg_ParseTuple(args, "iK:history_annotate", &device, &context)) return NULL;
  core_state *st = get_state(module);
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
  int rc = vram_history_annotate(pool, (uint64_t)context);
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  Py_RETURN_NONE;
}

/* snapshot(device, /) -> (segments: bytes of vram_snapshot_segment_t, blocks: bytes of
 * vram_snapshot_block_t). */
static PyObject *core_snapshot(PyObject *module, PyObject *args) {
  int device;
  if (!PyArg_ParseTuple(args, "i:snapshot", &device)) return NULL;
  core_state *st = get_state(module);
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
  /* Each vram_snapshot call is a snapshot event in the history: start from the sizes the
   * last snapshot needed, so that one call is usually enough. */
  static size_t last_segments = 64, last_blocks = 1024;
  size_t n_segments = last_segments, n_blocks = last_blocks;
  int rc;
  for (;;) {
    /* The pool may change between the two calls (other threads): room for some growth. */
    size_t seg_cap = n_segments + n_segments / 4 + 8, block_cap = n_blocks + n_blocks / 4 + 16;
    if (block_cap > (size_t)PY_SSIZE_T_MAX / sizeof(vram_snapshot_block_t))
      return PyErr_NoMemory();
    PyObject *segs = PyBytes_FromStringAndSize(
        NULL, (Py_ssize_t)(seg_cap * sizeof(vram_snapshot_segment_t)));
    PyObject *blocks = PyBytes_FromStringAndSize(
        NULL, (Py_ssize_t)(block_cap * sizeof(vram_snapshot_block_t)));
    if (segs == NULL || blocks == NULL) {
      Py_XDECREF(segs);
      Py_XDECREF(blocks);
      return NULL;
    }
    rc = vram_snapshot(pool, (vram_snapshot_segment_t *)PyBytes_AS_STRING(segs), seg_cap,
                       &n_segments, (vram_snapshot_block_t *)PyBytes_AS_STRING(blocks),
                       block_cap, &n_blocks);
    if (rc != VRAM_OK) {
      Py_DECREF(segs);
      Py_DECREF(blocks);
      return raise_status(st, rc, device, pool);
    }
    if (n_segments <= seg_cap && n_blocks <= block_cap) {
      last_segments = n_segments;
      last_blocks = n_blocks;
      if (_PyBytes_Resize(&segs, (Py_ssize_t)(n_segments * sizeof(vram_snapshot_segment_t))) < 0) {
        Py_DECREF(blocks);
        return NULL;
      }
      if (_PyBytes_Resize(&blocks, (Py_ssize_t)(n_blocks * sizeof(vram_snapshot_block_t))) < 0) {
        Py_DECREF(segs);
        return NULL;
      }
      return Py_BuildValue("(NN)", segs, blocks);
    }
    Py_DECREF(segs);
    Py_DECREF(blocks);
  }
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
    {"stats_json", core_stats_json, METH_VARARGS,
     PyDoc_STR("stats_json(device, /)\n--\n\nThe pool's statistics as a JSON string.")},
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
  core_state *st = get_state(module);
  PyObject *b;

  if (add_exception(module, &st->VramError, "VramError",
                    "Base class of every error vramkit raises; .status, .errname and "
                    ".report (None unless out of memory) describe it.",
                    Py_BuildValue("(O)", PyExc_Exception)) < 0)
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

  if (PyModule_AddStringConstant(module, "VERSION", VRAMKIT_VERSION) < 0) return -1;
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
  Py_CLEAR(st->device_resolver);
  return 0;
}

static void core_free(void *module) { core_clear((PyObject *)module); }

static PyModuleDef_Slot core_slots[] = {
    {Py_mod_exec, core_exec},
    {0, NULL},
};

static struct PyModuleDef core_module = {
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

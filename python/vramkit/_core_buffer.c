/* _core_buffer.c - vramkit.DeviceBuffer and vramkit.empty(): one block of device memory
 * from a default pool or a Pool, freed when its last reference goes. */
#include "_core.h"

/* ---------------------------------------------------------------------------------------
 * DeviceBuffer: one block of device memory, freed when the last reference goes.
 *
 * A C type with its own tp_dealloc, because `vramkit.empty(n)` followed by `del` is a hot
 * path that must beat CuPy's pool from Python: no __dict__, no GC tracking, no Python-level
 * __del__. Its one Python reference, to the Pool it came from, keeps that pool alive while
 * the block is; a Pool refers to nothing, so no cycle can pass through a buffer.
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
  PyObject *owner; /* the Pool it came from (a strong reference), NULL from vramkit.empty() */
} DeviceBuffer;

/* A device argument: an int as is; anything else ("cuda:1", "GPU:0", torch.device...) goes
 * through the package's resolver, so every function accepts the same device names. */

/* A buffer of nbytes from pool, which `owner` (if not NULL) stands for and is kept alive
 * by the buffer. */
PyObject *buffer_new(core_state *st, vram_pool_t *pool, int device, const size_arg *nbytes,
                     PyObject *stream_obj, PyObject *owner) {
  vram_stream_t stream = NULL;
  if (stream_obj != Py_None && !stream_converter(stream_obj, &stream)) return NULL;
  if (nbytes->too_big) return raise_too_big(st, pool, device, nbytes);

  /* The GIL stays held: a cached allocation takes tens of nanoseconds, less than
   * releasing and retaking the GIL would. */
  void *ptr = NULL;
  int rc = vram_malloc(pool, nbytes->bytes, stream, &ptr);
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);

  DeviceBuffer *self = PyObject_New(DeviceBuffer, st->DeviceBuffer_Type);
  if (self == NULL) {
    vram_free(pool, ptr);
    return NULL;
  }
  self->ptr = ptr;
  self->nbytes = nbytes->bytes;
  self->pool = pool;
  self->stream = stream;
  self->device = device;
  self->has_stream = stream_obj != Py_None;
  self->freed = 0;
  self->owner = Py_XNewRef(owner);
  return (PyObject *)self;
}

PyObject *core_empty(PyObject *module, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"nbytes", "device", "stream", NULL};
  core_state *st = get_state(module);
  size_arg nbytes = {.name = "nbytes", .st = st};
  int device = 0;
  PyObject *device_obj = NULL, *stream_obj = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|OO:empty", kwlist, size_converter,
                                   &nbytes, &device_obj, &stream_obj))
    return NULL;
  if (device_obj != NULL && !device_from_object(st, device_obj, &device)) return NULL;
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
  return buffer_new(st, pool, device, &nbytes, stream_obj, NULL);
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
  /* After the free: the last buffer of a Pool nobody else holds takes the pool with it. */
  PyObject *owner = self->owner;
  PyObject_Free(self);
  Py_XDECREF(owner);
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

static PyObject *DeviceBuffer_get_pool(DeviceBuffer *self, void *closure) {
  return Py_NewRef(self->owner ? self->owner : Py_None);
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

/* numpy's __array__ protocol, refused: without it numpy wraps the buffer in an object
 * array, and anything that then reads ptr as host memory crashes the process (on sim, ptr
 * lies in a reserved, unbacked host range that stands for device memory). */
static PyObject *DeviceBuffer_array(DeviceBuffer *self, PyObject *args, PyObject *kwargs) {
  PyErr_SetString(PyExc_TypeError,
                  "a vramkit.DeviceBuffer is device memory, which numpy cannot read from the "
                  "host (on the sim source its address stands for device memory in a "
                  "reserved, unbacked range); read it with a GPU library through "
                  "__cuda_array_interface__ (cupy.asarray, torch.as_tensor, numba.cuda)");
  return NULL;
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
    {"__array__", (PyCFunction)(void (*)(void))DeviceBuffer_array, METH_VARARGS | METH_KEYWORDS,
     PyDoc_STR("__array__($self, /, *args, **kwargs)\n--\n\nRefused (TypeError): device "
               "memory cannot be read from the host.")},
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
    {"pool", (getter)DeviceBuffer_get_pool, NULL,
     PyDoc_STR("the vramkit.Pool it came from (kept alive by the buffer); None from "
               "vramkit.empty(), whose pool is the device's default pool"),
     NULL},
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
    {Py_tp_doc, "DeviceBuffer: device memory from vramkit.empty() or Pool.allocate(); freed "
                "when the last reference goes, or by free()."},
    {0, NULL},
};

PyType_Spec DeviceBuffer_spec = {
    .name = "vramkit.DeviceBuffer",
    .basicsize = sizeof(DeviceBuffer),
    /* Not a base type: the hot path relies on the exact layout and dealloc. Instances are
     * made only by empty() and Pool.allocate(). */
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = DeviceBuffer_slots,
};

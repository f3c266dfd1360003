/* _core_trace.c - vramkit._core.trace_read and trace_write: a trace file read through the
 * library's one trace reader (vram_trace_reader_*, vramkit.h), so that `vramkit plot`, the
 * estimator and every other Python reader accept and refuse exactly the files
 * `vramkit replay` does; and written through its one writer (vram_trace_writer_*), so that
 * what save_trace and the estimator write is what that reader reads back.
 *
 * The ops come back as a list of tuples built here, in C, because a trace may hold
 * millions of lines and a Python-level loop over packed records would cost more than the
 * read itself. Frees of ids that were not live (blocks from before the recording) are
 * counted, not returned, as replay does. The writer takes the same ops the package's
 * write_trace always took, ("a", id, size, stream, t_us) and ("f", id, stream, t_us),
 * converted a batch at a time with the GIL held and written with it released.
 */
#include "_core.h"

/* Append one op as (is_alloc, id, size, stream, time_us); -1 on a Python error. */
static int append_op(PyObject *ops, const vram_trace_op_t *op) {
  PyObject *item = Py_BuildValue("(OKKKK)", op->is_alloc ? Py_True : Py_False,
                                 (unsigned long long)op->id, (unsigned long long)op->size,
                                 (unsigned long long)op->stream,
                                 (unsigned long long)op->time_us);
  if (item == NULL) return -1;
  int rc = PyList_Append(ops, item);
  Py_DECREF(item);
  return rc;
}

static PyObject *raise_trace_error(core_state *st, int status, const char *message) {
  return raise_message(st, status, PyUnicode_DecodeASCII(message, (Py_ssize_t)strlen(message),
                                                         "backslashreplace"), NULL);
}

PyObject *core_trace_read(PyObject *module, PyObject *args) {
  PyObject *path_obj;
  long long max_ops;
  if (!PyArg_ParseTuple(args, "O&L:trace_read", PyUnicode_FSConverter, &path_obj, &max_ops))
    return NULL;
  core_state *st = get_state(module);
  uint64_t limit = max_ops < 0 ? VRAM_TRACE_DEFAULT_MAX_OPS : (uint64_t)max_ops;
  char error[512];
  vram_trace_reader_t *reader = NULL;
  int rc = vram_trace_reader_open(PyBytes_AS_STRING(path_obj), limit, &reader, error,
                                  sizeof error);
  Py_DECREF(path_obj);
  if (rc != VRAM_OK) return raise_trace_error(st, rc, error);
  PyObject *ops = PyList_New(0);
  unsigned long long unmatched = 0;
  vram_trace_op_t op;
  while (ops != NULL && (rc = vram_trace_reader_next(reader, &op)) == 1) {
    if (!op.is_alloc && !op.matched) unmatched++;
    else if (append_op(ops, &op) != 0) Py_CLEAR(ops);
  }
  if (ops != NULL && rc < 0) {
    Py_CLEAR(ops);
    raise_trace_error(st, rc, vram_trace_reader_error(reader));
  }
  vram_trace_reader_close(reader);
  if (ops == NULL) return NULL;
  return Py_BuildValue("(NK)", ops, unmatched);
}

#define WRITE_BATCH 4096

/* One unsigned 64-bit field of an op; -1 with TypeError or InvalidArgumentError set. */
static int op_field(core_state *st, PyObject *item, Py_ssize_t index, Py_ssize_t op_number,
                    const char *name, uint64_t *out) {
  PyObject *value = PyTuple_GET_ITEM(item, index);
  if (!PyLong_Check(value) || PyBool_Check(value)) {
    PyErr_Format(PyExc_TypeError, "trace op %zd: %s must be an int, not %s", op_number, name,
                 Py_TYPE(value)->tp_name);
    return -1;
  }
  unsigned long long number = PyLong_AsUnsignedLongLong(value);
  if (number == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    raise_message(st, VRAM_EINVAL, PyUnicode_FromFormat("trace op %zd: %s %S is outside "
                                                        "0 to 2**64 - 1", op_number, name,
                                                        value), NULL);
    return -1;
  }
  *out = number;
  return 0;
}

/* An op tuple as the writer's struct; -1 with a Python error set. */
static int op_from_tuple(core_state *st, PyObject *item, Py_ssize_t op_number,
                         vram_trace_op_t *op) {
  if (!PyTuple_Check(item)) {
    PyErr_Format(PyExc_TypeError, "trace op %zd must be a tuple (or list) ('a', id, size, "
                 "stream, t_us) or ('f', id, stream, t_us), not %s", op_number, Py_TYPE(item)->tp_name);
    return -1;
  }
  Py_ssize_t length = PyTuple_GET_SIZE(item);
  PyObject *tag = length ? PyTuple_GET_ITEM(item, 0) : NULL;
  int is_alloc = tag && PyUnicode_Check(tag) && PyUnicode_CompareWithASCIIString(tag, "a") == 0;
  int is_free = tag && PyUnicode_Check(tag) && PyUnicode_CompareWithASCIIString(tag, "f") == 0;
  if ((!is_alloc && !is_free) || length != (is_alloc ? 5 : 4)) {
    raise_message(st, VRAM_EINVAL, PyUnicode_FromFormat("trace op %zd is %R: expected "
                                                        "('a', id, size, stream, t_us) or "
                                                        "('f', id, stream, t_us)", op_number,
                                                        item), NULL);
    return -1;
  }
  memset(op, 0, sizeof *op);
  op->is_alloc = (uint8_t)is_alloc;
  if (op_field(st, item, 1, op_number, "id", &op->id) != 0) return -1;
  Py_ssize_t next = 2;
  if (is_alloc && op_field(st, item, next++, op_number, "size", &op->size) != 0) return -1;
  if (op_field(st, item, next++, op_number, "stream", &op->stream) != 0) return -1;
  return op_field(st, item, next, op_number, "t_us", &op->time_us);
}

/* Up to WRITE_BATCH ops from the iterator into batch; the count, or -1 with an error set. */
static Py_ssize_t next_batch(core_state *st, PyObject *iterator, vram_trace_op_t *batch,
                             Py_ssize_t done) {
  Py_ssize_t count = 0;
  PyObject *item;
  while (count < WRITE_BATCH && (item = PyIter_Next(iterator)) != NULL) {
    if (PyList_Check(item)) Py_SETREF(item, PyList_AsTuple(item)); /* taken as a tuple */
    int rc = item ? op_from_tuple(st, item, done + count + 1, &batch[count]) : -1;
    Py_XDECREF(item);
    if (rc != 0) return -1;
    count++;
  }
  return PyErr_Occurred() ? -1 : count;
}

/* Write every op of the iterator; VRAM_OK, a writer status (message in the writer), or
 * 1 when a Python error is set. */
static int write_ops(core_state *st, vram_trace_writer_t *writer, PyObject *iterator) {
  vram_trace_op_t *batch = PyMem_Malloc(WRITE_BATCH * sizeof *batch);
  if (batch == NULL) {
    PyErr_NoMemory();
    return 1;
  }
  Py_ssize_t done = 0, count;
  int rc = VRAM_OK;
  while (rc == VRAM_OK && (count = next_batch(st, iterator, batch, done)) > 0) {
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count && rc == VRAM_OK; i++)
      rc = vram_trace_writer_put(writer, &batch[i]);
    Py_END_ALLOW_THREADS
    done += count;
  }
  PyMem_Free(batch);
  if (rc == VRAM_OK && PyErr_Occurred()) return 1;
  return rc;
}

PyObject *core_trace_write(PyObject *module, PyObject *args) {
  PyObject *path_obj, *ops, *header_obj;
  if (!PyArg_ParseTuple(args, "O&OU:trace_write", PyUnicode_FSConverter, &path_obj, &ops,
                        &header_obj))
    return NULL;
  core_state *st = get_state(module);
  Py_ssize_t header_length;
  const char *header = PyUnicode_AsUTF8AndSize(header_obj, &header_length);
  PyObject *iterator = header ? PyObject_GetIter(ops) : NULL;
  if (iterator == NULL) {
    Py_DECREF(path_obj);
    return NULL;
  }
  if (strlen(header) != (size_t)header_length) {
    Py_DECREF(path_obj);
    Py_DECREF(iterator);
    return raise_message(st, VRAM_EINVAL, PyUnicode_FromString("trace header has a NUL "
                                                               "character"), NULL);
  }
  char error[512];
  vram_trace_writer_t *writer = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = vram_trace_writer_open(PyBytes_AS_STRING(path_obj), header, &writer, error,
                              sizeof error);
  Py_END_ALLOW_THREADS
  Py_DECREF(path_obj);
  if (rc == VRAM_OK) rc = write_ops(st, writer, iterator);
  Py_DECREF(iterator);
  if (rc == 1) { /* a Python error: the trace is abandoned and its file removed */
    vram_trace_writer_discard(writer);
    return NULL;
  }
  unsigned long long written = writer ? vram_trace_writer_ops(writer) : 0;
  if (writer != NULL) {
    Py_BEGIN_ALLOW_THREADS
    rc = vram_trace_writer_close(writer, error, sizeof error);
    Py_END_ALLOW_THREADS
  }
  if (rc == VRAM_EIO) return raise_io_error(error); /* what open() would raise */
  if (rc != VRAM_OK) return raise_trace_error(st, rc, error);
  return PyLong_FromUnsignedLongLong(written);
}

/* _core_trace.c - vramkit._core.trace_read: a trace file read through the library's one
 * trace reader (vram_trace_reader_*, vramkit.h), so that `vramkit plot`, the estimator and
 * every other Python reader accept and refuse exactly the files `vramkit replay` does.
 *
 * The ops come back as a list of tuples built here, in C, because a trace may hold
 * millions of lines and a Python-level loop over packed records would cost more than the
 * read itself. Frees of ids that were not live (blocks from before the recording) are
 * counted, not returned, as replay does.
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

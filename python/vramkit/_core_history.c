/* _core_history.c - the engine's memory history, snapshots and the Python stacks attached
 * to allocations, handed to vramkit/observe/history.py. */
#include "_core.h"

/* ---------------------------------------------------------------------------------------
 * Memory history, snapshots and Python stacks.
 *
 * The engine records events and snapshots in C structs; these calls hand them over as one
 * bytes object each (a memcpy here), unpacked by vramkit/observe/history.py with struct: a list of
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
PyObject *core_stack_frames(PyObject *module, PyObject *ids) {
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

PyObject *core_stack_count(PyObject *module, PyObject *Py_UNUSED(ignored)) {
  return PyLong_FromSize_t(stacks.n_entries);
}

/* history_start(device, max_entries, stacks, /): start (or restart: the ring is cleared)
 * the pool's recording; with stacks, each allocation gets the id of its Python stack. */
PyObject *pool_history_start(core_state *st, vram_pool_t *pool, int device,
                             Py_ssize_t max_entries, int with_stacks) {
  if (max_entries <= 0)
    return raise_message(st, VRAM_EINVAL,
                         PyUnicode_FromFormat("max_entries must be > 0, got %zd", max_entries),
                         NULL);
  /* Process-wide and harmless to set again: pools call it only when they record with
   * VRAM_HISTORY_CONTEXTS. */
  if (with_stacks) vram_set_context_fn(capture_stack, NULL);
  int rc = vram_history_start(pool, (size_t)max_entries, with_stacks ? VRAM_HISTORY_CONTEXTS : 0);
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  Py_RETURN_NONE;
}

PyObject *core_history_start(PyObject *module, PyObject *args) {
  int device, with_stacks;
  Py_ssize_t max_entries;
  if (!PyArg_ParseTuple(args, "O&np:history_start", device_converter, &device, &max_entries,
                        &with_stacks))
    return NULL;
  core_state *st = get_state(module);
  if (max_entries <= 0) return pool_history_start(st, NULL, device, max_entries, with_stacks);
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
  return pool_history_start(st, pool, device, max_entries, with_stacks);
}

PyObject *pool_history_stop(core_state *st, vram_pool_t *pool, int device) {
  int rc = vram_history_stop(pool);
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  Py_RETURN_NONE;
}

PyObject *core_history_stop(PyObject *module, PyObject *args) {
  return on_default_pool(module, args, "O&:history_stop", pool_history_stop);
}

/* (events: bytes of vram_event_t, oldest first, dropped). */
PyObject *pool_history_read(core_state *st, vram_pool_t *pool, int device) {
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

PyObject *core_history_read(PyObject *module, PyObject *args) {
  return on_default_pool(module, args, "O&:history_read", pool_history_read);
}

/* "O&" converter for an annotation's context: the engine keeps 64 bits, and "K" would keep
 * the low 64 of any int (of -1 too) without a word. */
int context_converter(PyObject *obj, void *out) {
  if (PyBool_Check(obj)) {
    PyErr_SetString(PyExc_TypeError, "history_annotate(): context must be an int, not bool");
    return 0;
  }
  PyObject *index = PyNumber_Index(obj);
  if (index == NULL) return 0;
  unsigned long long value = PyLong_AsUnsignedLongLong(index);
  Py_DECREF(index);
  if (value == (unsigned long long)-1 && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return 0;
    PyErr_Clear();
    PyErr_Format(PyExc_OverflowError,
                 "history_annotate(): context must be from 0 to 2**64 - 1, got %.60R", obj);
    return 0;
  }
  *(unsigned long long *)out = value;
  return 1;
}

PyObject *pool_history_annotate(core_state *st, vram_pool_t *pool, int device,
                                unsigned long long context) {
  int rc = vram_history_annotate(pool, (uint64_t)context);
  if (rc != VRAM_OK) return raise_status(st, rc, device, pool);
  Py_RETURN_NONE;
}

PyObject *core_history_annotate(PyObject *module, PyObject *args) {
  int device;
  unsigned long long context;
  if (!PyArg_ParseTuple(args, "O&O&:history_annotate", device_converter, &device,
                        context_converter, &context)) return NULL;
  core_state *st = get_state(module);
  vram_pool_t *pool = get_pool(st, device);
  if (pool == NULL) return NULL;
  return pool_history_annotate(st, pool, device, context);
}

/* (segments: bytes of vram_snapshot_segment_t, blocks: bytes of vram_snapshot_block_t). */
PyObject *pool_snapshot(core_state *st, vram_pool_t *pool, int device) {
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

PyObject *core_snapshot(PyObject *module, PyObject *args) {
  return on_default_pool(module, args, "O&:snapshot", pool_snapshot);
}

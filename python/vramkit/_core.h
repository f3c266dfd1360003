/* _core.h - what the files of the vramkit._core extension share: the module state, the
 * mapping of engine statuses to exceptions and the argument converters (_core_errors.c),
 * the DeviceBuffer type (_core_buffer.c), the Pool type (_core_pool.c), history and
 * snapshots (_core_history.c), trace files (_core_trace.c); the module itself, its
 * pool-wide functions and its method table are _core.c.
 *
 * Nothing here is visible outside the extension: VRAMKIT_PY_INTERNAL hides the symbols,
 * and PyInit__core is the module's only export. */
#ifndef VRAMKIT_PY_CORE_H
#define VRAMKIT_PY_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "vramkit.h"

#define VRAMKIT_PY_INTERNAL __attribute__((visibility("hidden")))

/* Devices whose default pool this process has touched through Python. The pools are
 * process-wide, so this is process-wide too (not module state): it lets configure() and
 * set_memory_growth() refuse, as TensorFlow does, to change a device already in use. */
#define VRAMKIT_MAX_TRACKED 64
extern VRAMKIT_PY_INTERNAL unsigned char pool_touched[VRAMKIT_MAX_TRACKED];

/* ---------------------------------------------------------------------------------------
 * Module state.
 * ------------------------------------------------------------------------------------- */
typedef struct {
  PyObject *VramError;            /* base of every vramkit error */
  PyObject *OutOfMemoryError;     /* VRAM_ENOMEM; also a MemoryError */
  PyObject *HostMemoryError;      /* VRAM_EHOSTMEM; also a MemoryError */
  PyObject *InvalidArgumentError; /* VRAM_EINVAL, VRAM_ETRACE, VRAM_ELIMIT; ValueError */
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
  PyTypeObject *Pool_Type;
  PyObject *device_resolver; /* the package's name -> ordinal function, for empty() */
} core_state;

static inline core_state *get_state(PyObject *module) {
  return (core_state *)PyModule_GetState(module);
}


/* Text from a vram_summary-style call (returns the length it needs). */
typedef int (*text_fn)(vram_pool_t *, char *, size_t);

/* No device in a message: the error is not about one. */
#define NO_DEVICE INT_MIN

/* ---- _core_errors.c: statuses to exceptions, and the argument converters */
/* A size argument, for the "O&" converter below. The caller sets `name` (the argument, for
 * messages) and `st`; the converter fills the rest. */
typedef struct {
  const char *name;
  core_state *st;
  PyObject *obj;  /* the argument as given (borrowed: the argument tuple holds it) */
  size_t bytes;
  int too_big;    /* more than size_t holds */
} size_arg;

VRAMKIT_PY_INTERNAL PyObject *pool_text(vram_pool_t *pool, text_fn fn, int *status);
VRAMKIT_PY_INTERNAL PyObject *status_type(core_state *st, int status);
VRAMKIT_PY_INTERNAL PyObject *new_error(core_state *st, int status, PyObject *message, PyObject *report);
VRAMKIT_PY_INTERNAL PyObject *raise_message(core_state *st, int status, PyObject *message, PyObject *report);
VRAMKIT_PY_INTERNAL PyObject *raise_io_error(const char *text);
/* Whether the VRAMKIT_* environment is one the engine refuses: 1 with its message (the
 * variable named, the value quoted, escaped) in out, 0 when every variable is good. */
VRAMKIT_PY_INTERNAL int env_problem(char *out, size_t cap);
VRAMKIT_PY_INTERNAL const char *reason_of(const char *why, const char *variable);
VRAMKIT_PY_INTERNAL PyObject *raise_bad_device(core_state *st, int device, vram_source_kind kind);
VRAMKIT_PY_INTERNAL PyObject *raise_sim_capacity(core_state *st, int device, size_t capacity);
/* VramError.__reduce__ (pickling that tblib and dask's distributed honour). */
VRAMKIT_PY_INTERNAL int install_error_reduce(PyObject *vram_error);
VRAMKIT_PY_INTERNAL PyObject *raise_status(core_state *st, int status, int device, vram_pool_t *pool);
VRAMKIT_PY_INTERNAL vram_pool_t *get_pool(core_state *st, int device);
VRAMKIT_PY_INTERNAL int size_converter(PyObject *obj, void *out);
VRAMKIT_PY_INTERNAL PyObject *raise_too_big(core_state *st, vram_pool_t *pool, int device,
                               const size_arg *size);
VRAMKIT_PY_INTERNAL int stream_converter(PyObject *obj, void *out);
VRAMKIT_PY_INTERNAL int device_converter(PyObject *obj, void *out);
VRAMKIT_PY_INTERNAL int device_from_object(core_state *st, PyObject *obj, int *device);

/* ---- _core.c: the module, and the calls on one pool that its functions (on a device's
 * default pool) and Pool's methods share; `device` names the pool in messages. */
extern VRAMKIT_PY_INTERNAL struct PyModuleDef core_module;
typedef PyObject *(*pool_call)(core_state *st, vram_pool_t *pool, int device);
/* Parse (device, /) with format, then call on the device's default pool. */
VRAMKIT_PY_INTERNAL PyObject *on_default_pool(PyObject *module, PyObject *args,
                                              const char *format, pool_call call);
VRAMKIT_PY_INTERNAL PyObject *pool_summary(core_state *st, vram_pool_t *pool, int device);
VRAMKIT_PY_INTERNAL PyObject *pool_stats_json(core_state *st, vram_pool_t *pool, int device);
VRAMKIT_PY_INTERNAL PyObject *pool_oom_report(core_state *st, vram_pool_t *pool, int device);
VRAMKIT_PY_INTERNAL PyObject *pool_stats(core_state *st, vram_pool_t *pool, int device);
VRAMKIT_PY_INTERNAL PyObject *pool_split_stats(core_state *st, vram_pool_t *pool, int device);
VRAMKIT_PY_INTERNAL PyObject *pool_text_of(core_state *st, vram_pool_t *pool, int device,
                                           text_fn fn);
VRAMKIT_PY_INTERNAL PyObject *pool_empty_cache(core_state *st, vram_pool_t *pool, int device);
VRAMKIT_PY_INTERNAL PyObject *pool_reset_peak_stats(core_state *st, vram_pool_t *pool,
                                                    int device);
VRAMKIT_PY_INTERNAL PyObject *pool_mem_get_info(core_state *st, vram_pool_t *pool, int device);
VRAMKIT_PY_INTERNAL int limit_fits(core_state *st, const size_arg *limit);
VRAMKIT_PY_INTERNAL PyObject *pool_set_limit(core_state *st, vram_pool_t *pool, int device,
                                             size_t bytes, double fraction);
VRAMKIT_PY_INTERNAL int apply_override(core_state *st, vram_options_t *opts, PyObject *key,
                                       PyObject *value, int argument_status);

/* ---- _core_buffer.c */
extern VRAMKIT_PY_INTERNAL PyType_Spec DeviceBuffer_spec;
VRAMKIT_PY_INTERNAL PyObject *buffer_new(core_state *st, vram_pool_t *pool, int device,
                                         const size_arg *nbytes, PyObject *stream_obj,
                                         PyObject *owner);
VRAMKIT_PY_INTERNAL PyObject *core_empty(PyObject *module, PyObject *args, PyObject *kwargs);

/* ---- _core_pool.c */
extern VRAMKIT_PY_INTERNAL PyType_Spec Pool_spec;

/* ---- _core_history.c */
VRAMKIT_PY_INTERNAL PyObject *core_stack_frames(PyObject *module, PyObject *ids);
VRAMKIT_PY_INTERNAL PyObject *core_stack_count(PyObject *module, PyObject *Py_UNUSED(ignored));
VRAMKIT_PY_INTERNAL PyObject *core_history_start(PyObject *module, PyObject *args);
VRAMKIT_PY_INTERNAL PyObject *core_history_stop(PyObject *module, PyObject *args);
VRAMKIT_PY_INTERNAL PyObject *core_history_read(PyObject *module, PyObject *args);
VRAMKIT_PY_INTERNAL PyObject *core_history_annotate(PyObject *module, PyObject *args);
VRAMKIT_PY_INTERNAL PyObject *core_snapshot(PyObject *module, PyObject *args);
VRAMKIT_PY_INTERNAL int context_converter(PyObject *obj, void *out);
VRAMKIT_PY_INTERNAL PyObject *pool_history_start(core_state *st, vram_pool_t *pool, int device,
                                                 Py_ssize_t max_entries, int with_stacks);
VRAMKIT_PY_INTERNAL PyObject *pool_history_stop(core_state *st, vram_pool_t *pool, int device);
VRAMKIT_PY_INTERNAL PyObject *pool_history_read(core_state *st, vram_pool_t *pool, int device);
VRAMKIT_PY_INTERNAL PyObject *pool_history_annotate(core_state *st, vram_pool_t *pool,
                                                    int device, unsigned long long context);
VRAMKIT_PY_INTERNAL PyObject *pool_snapshot(core_state *st, vram_pool_t *pool, int device);

/* ---- _core_records.c */
VRAMKIT_PY_INTERNAL PyObject *core_records_dir(PyObject *module, PyObject *ignored);
VRAMKIT_PY_INTERNAL PyObject *core_escape_text(PyObject *module, PyObject *arg);
VRAMKIT_PY_INTERNAL PyObject *core_records_open(PyObject *module, PyObject *args);
VRAMKIT_PY_INTERNAL PyObject *core_record_read(PyObject *module, PyObject *args);

/* ---- _core_trace.c */
VRAMKIT_PY_INTERNAL PyObject *core_trace_read(PyObject *module, PyObject *args);
VRAMKIT_PY_INTERNAL PyObject *core_trace_write(PyObject *module, PyObject *args);

/* ---- _core_replay.c */
VRAMKIT_PY_INTERNAL PyObject *core_replay(PyObject *module, PyObject *args, PyObject *kwargs);
VRAMKIT_PY_INTERNAL PyObject *core_replay_reserved(PyObject *module, PyObject *args);

/* ---- _core_oom.c */
VRAMKIT_PY_INTERNAL PyObject *oom_info_dict(const vram_oom_info_t *info);
VRAMKIT_PY_INTERNAL PyObject *pool_oom_info(core_state *st, vram_pool_t *pool, int device);
VRAMKIT_PY_INTERNAL PyObject *core_oom_info(PyObject *module, PyObject *args);
VRAMKIT_PY_INTERNAL PyObject *core_oom_classify(PyObject *module, PyObject *figures);

#endif /* VRAMKIT_PY_CORE_H */

/* forward.h - the calls a source wrapper passes to the source it wraps unchanged (the
 * fault wrapper of fault.c, the callback source of callback.c): events, memory figures and
 * the device's identity. A wrapper's state starts with a vram_inner_source, so that one
 * forwarder serves every wrapper. */
#ifndef VRAM_SOURCE_FORWARD_H
#define VRAM_SOURCE_FORWARD_H

#include "source/source.h"

typedef struct vram_inner_source {
  const vram_source_methods *inner;
  void *inner_state;
} vram_inner_source;

#define VRAM_INNER(state) ((const vram_inner_source *)(state))

static inline int _vram_forward_mem_info(void *state, size_t *free_bytes, size_t *total_bytes) {
  return VRAM_INNER(state)->inner->xMemInfo(VRAM_INNER(state)->inner_state, free_bytes,
                                            total_bytes);
}
static inline int _vram_forward_event_create(void *state, void **event) {
  return VRAM_INNER(state)->inner->xEventCreate(VRAM_INNER(state)->inner_state, event);
}
static inline void _vram_forward_event_destroy(void *state, void *event) {
  VRAM_INNER(state)->inner->xEventDestroy(VRAM_INNER(state)->inner_state, event);
}
static inline int _vram_forward_event_query(void *state, void *event) {
  return VRAM_INNER(state)->inner->xEventQuery(VRAM_INNER(state)->inner_state, event);
}
static inline int _vram_forward_event_synchronize(void *state, void *event) {
  return VRAM_INNER(state)->inner->xEventSynchronize(VRAM_INNER(state)->inner_state, event);
}
static inline int _vram_forward_event_record(void *state, void *event, vram_stream_t stream) {
  return VRAM_INNER(state)->inner->xEventRecord(VRAM_INNER(state)->inner_state, event, stream);
}
static inline int _vram_forward_stream_wait_event(void *state, vram_stream_t stream,
                                                  void *event) {
  return VRAM_INNER(state)->inner->xStreamWaitEvent(VRAM_INNER(state)->inner_state, stream,
                                                    event);
}
static inline void _vram_forward_device_uuid(void *state, char *buf, size_t cap) {
  VRAM_INNER(state)->inner->xDeviceUuid(VRAM_INNER(state)->inner_state, buf, cap);
}
static inline int _vram_forward_processes(void *state, vram_nvml_process *out, int max,
                                          const char **why) {
  return VRAM_INNER(state)->inner->xProcesses(VRAM_INNER(state)->inner_state, out, max, why);
}
static inline void _vram_forward_group_name(void *state, char *buf, size_t cap) {
  VRAM_INNER(state)->inner->xGroupName(VRAM_INNER(state)->inner_state, buf, cap);
}

/* The methods a wrapper of `inner` passes on unchanged, as designated initializers of its
 * table; the identity questions only where the inner source answers them. */
#define VRAM_FORWARDED_METHODS(inner)                                              \
  .xMemInfo = _vram_forward_mem_info, .xEventCreate = _vram_forward_event_create,  \
  .xEventDestroy = _vram_forward_event_destroy,                                    \
  .xEventQuery = _vram_forward_event_query,                                        \
  .xEventSynchronize = _vram_forward_event_synchronize,                            \
  .xDeviceUuid = (inner)->xDeviceUuid ? _vram_forward_device_uuid : NULL,          \
  .xProcesses = (inner)->xProcesses ? _vram_forward_processes : NULL,              \
  .xGroupName = (inner)->xGroupName ? _vram_forward_group_name : NULL

#endif /* VRAM_SOURCE_FORWARD_H */

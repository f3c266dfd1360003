/* managed.h - what the `managed` source offers beyond the source table: moving the pages
 * of a managed range between the device and the host on request.
 */
#ifndef VRAM_SOURCE_MANAGED_H
#define VRAM_SOURCE_MANAGED_H

#include <stddef.h>
#include <stdint.h>

#include "vramkit.h"

/* Prefetch [addr, addr + size) of a managed segment to the source's device (to_device
 * != 0) or to the host (to_device == 0), ordered on `stream` (NULL: the legacy default
 * stream). `state` is the state xOpen of _vram_source_managed returned. Asynchronous: the
 * pages move when the stream reaches the call. VRAM_EUNSUPPORTED where the device cannot
 * access managed memory concurrently with the host (prefetch needs that). */
int _vram_managed_prefetch(void *state, uintptr_t addr, size_t size, int to_device,
                           vram_stream_t stream);

#endif /* VRAM_SOURCE_MANAGED_H */

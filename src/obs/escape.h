/* escape.h - foreign text made safe to print: names other processes chose (a record's
 * name, NVML's process names) go into reports and terminals only through this. */
#ifndef VRAM_OBS_ESCAPE_H
#define VRAM_OBS_ESCAPE_H

#include <stddef.h>

#include "vramkit.h"

/* vram_escape_text (vramkit.h) of a NUL-terminated field: at most `len` bytes of `src`,
 * fewer at its first NUL. */
size_t _vram_escape_text(char *dst, size_t cap, const char *src, size_t len);

#endif /* VRAM_OBS_ESCAPE_H */

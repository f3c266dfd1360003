/* escape.h - foreign text made safe to print: names other processes chose (a record's
 * name, NVML's process names) go into reports and terminals only through this. */
#ifndef VRAM_OBS_ESCAPE_H
#define VRAM_OBS_ESCAPE_H

#include <stddef.h>

/* Copies at most `len` bytes of `src` (less at a NUL) into dst as printable text: control
 * characters (C0, DEL and C1), a backslash and bytes that are not valid UTF-8 become \xNN,
 * valid UTF-8 otherwise passes. The result is NUL-terminated and cut only between whole
 * characters or escapes. Returns the length written. */
size_t _vram_escape_text(char *dst, size_t cap, const char *src, size_t len);

#endif /* VRAM_OBS_ESCAPE_H */

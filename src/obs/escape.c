/* escape.c - foreign text made safe to print (escape.h; vram_escape_text in vramkit.h). A process name is whatever its
 * owner wrote into /proc/self/comm, and an escape sequence in it would clear a terminal,
 * hide text, or with a newline forge lines of a report; so everything that is not plain
 * printable text is shown as \xNN. */
#include "obs/escape.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Characters that are valid and yet steer what a reader sees: the zero-width ones, the
 * line and paragraph separators, and the bidirectional marks, embeddings, overrides and
 * isolates, with which a name can hide text or show it in another order. */
static bool invisible_control(uint32_t cp) {
  return cp == 0x061C || (cp >= 0x200B && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202E) ||
         (cp >= 0x2060 && cp <= 0x206F) || cp == 0xFEFF || (cp >= 0xFFF9 && cp <= 0xFFFB);
}

/* The length of the valid UTF-8 character at s (at most n bytes), 0 if it is not one. The
 * C1 controls (U+0080 to U+009F) count as invalid: terminals obey some of them. */
static size_t utf8_char(const unsigned char *s, size_t n) {
  size_t want;
  uint32_t cp;
  if (s[0] >= 0xC2 && s[0] <= 0xDF) want = 2, cp = s[0] & 0x1Fu;
  else if (s[0] >= 0xE0 && s[0] <= 0xEF) want = 3, cp = s[0] & 0x0Fu;
  else if (s[0] >= 0xF0 && s[0] <= 0xF4) want = 4, cp = s[0] & 0x07u;
  else return 0;
  if (want > n) return 0;
  for (size_t i = 1; i < want; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (s[i] & 0x3Fu);
  }
  bool overlong = (want == 3 && cp < 0x800) || (want == 4 && cp < 0x10000);
  if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || cp < 0xA0) return 0;
  return invisible_control(cp) ? 0 : want;
}

size_t _vram_escape_text(char *dst, size_t cap, const char *src, size_t len) {
  return vram_escape_text(dst, cap, src, strnlen(src, len));
}

size_t vram_escape_text(char *dst, size_t cap, const char *src, size_t len) {
  if (!dst || !cap) return 0;
  const unsigned char *s = (const unsigned char *)src;
  size_t out = 0;
  for (size_t i = 0; i < len;) {
    size_t take = s[i] >= 0x80 ? utf8_char(s + i, len - i) : 0;
    for (size_t k = 0; k < take; k++)
      if (!s[i + k]) take = 0;
    if (take) {
      if (out + take >= cap) break;
      for (size_t k = 0; k < take; k++) dst[out++] = (char)s[i + k];
      i += take;
    } else if (s[i] >= 0x20 && s[i] < 0x7F && s[i] != '\\') {
      if (out + 1 >= cap) break;
      dst[out++] = (char)s[i++];
    } else {
      if (out + 4 >= cap) break;
      snprintf(dst + out, 5, "\\x%02x", s[i++]);
      out += 4;
    }
  }
  dst[out] = 0;
  return out;
}

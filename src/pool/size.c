/* size.c - the one size grammar (vram_parse_size; include/vramkit.h states it) and the
 * on/off spelling of switch variables. Every size vramkit reads, from a VRAMKIT_* variable,
 * a command-line option or a Python argument, goes through parse_size below, so that one
 * text means one thing everywhere and a refusal can say exactly what is wrong with it.
 *
 * Digits are read as integers, not through strtod: strtod takes hex, exponents, "inf" and
 * leading spaces, and its rounding would make "1.1T" depend on double precision. */
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "pool/options.h"
#include "vramkit.h"

typedef unsigned __int128 u128;

enum { MAX_DECIMALS = 18 }; /* 10^18 < 2^64: a fraction of that many digits stays exact */

/* The number at *p: whole digits, then optionally "." and fraction digits. Fills *whole
 * (saturated past 2^64, with *big set), *frac and *decimals; NULL or the reason it fails. */
static const char *read_number(const char **p, u128 *whole, uint64_t *frac, int *decimals,
                               int *big) {
  const char *s = *p;
  *whole = 0;
  *frac = 0;
  *decimals = 0;
  *big = 0;
  if (*s < '0' || *s > '9') return "a size starts with a digit";
  for (; *s >= '0' && *s <= '9'; s++) {
    *whole = *whole * 10 + (u128)(*s - '0');
    if (*whole > UINT64_MAX) {
      *big = 1;
      *whole = (u128)UINT64_MAX + 1;
    }
  }
  if ((*s == 'x' || *s == 'X') && s - *p == 1 && **p == '0')
    return "hexadecimal is not allowed";
  if (*s == '.') {
    s++;
    if (*s < '0' || *s > '9') return "a decimal point needs a digit after it";
    for (; *s >= '0' && *s <= '9'; s++) {
      if (++*decimals > MAX_DECIMALS) return "more than 18 decimal places";
      *frac = *frac * 10 + (uint64_t)(*s - '0');
    }
  }
  if ((*s == 'e' || *s == 'E') && (s[1] == '-' || s[1] == '+' || (s[1] >= '0' && s[1] <= '9')))
    return "exponents are not allowed";
  *p = s;
  return NULL;
}

/* The unit at p (the rest of the text): its scale, or 0 when it is not one. */
static u128 read_unit(const char *p) {
  static const char letters[] = "kmgt";
  if (!*p) return 1;
  if ((*p == 'b' || *p == 'B') && !p[1]) return 1;
  const char *at = strchr(letters, *p | 0x20);
  if (!at) return 0;
  const char *rest = p + 1;
  if (*rest && strcasecmp(rest, "b") != 0 && strcasecmp(rest, "ib") != 0) return 0;
  return (u128)1 << (10 * (at - letters + 1));
}

/* A percentage: more than 0 and at most 100, as a fraction of 1. */
static const char *read_percent(u128 whole, uint64_t frac, int decimals, double *fraction) {
  if ((whole == 0 && frac == 0) || whole > 100 || (whole == 100 && frac))
    return "a percentage is more than 0 and at most 100";
  double scale = 1;
  for (int i = 0; i < decimals; i++) scale *= 10;
  *fraction = ((double)whole + (double)frac / scale) / 100.0;
  return NULL;
}

/* The grammar itself: NULL and the result, or the reason text is not a size. */
static const char *parse_size(const char *text, int allow_percent, size_t *bytes,
                              double *fraction) {
  if (!*text) return "it is empty";
  for (const char *c = text; *c; c++)
    if (*c == ' ' || (*c >= '\t' && *c <= '\r')) return "spaces are not allowed";
  if (*text == '-') return "a size cannot be negative";
  if (*text == '+') return "a sign is not allowed";
  const char *p = text;
  u128 whole;
  uint64_t frac;
  int decimals, big;
  const char *why = read_number(&p, &whole, &frac, &decimals, &big);
  if (why) return why;
  if (*p == '%') {
    if (!allow_percent) return "a percentage is not allowed here";
    if (p[1]) return "nothing may follow the %";
    why = read_percent(whole, frac, decimals, fraction);
    if (!why) *bytes = 0;
    return why;
  }
  u128 scale = read_unit(p);
  if (!scale) return "unknown unit: K, M, G or T, optionally followed by B or iB";
  if (big) return "more than 2^64 - 1 bytes";
  uint64_t ten = 1;
  for (int i = 0; i < decimals; i++) ten *= 10;
  u128 part = (u128)frac * scale;
  if (scale == 1 && frac) return "a fraction of a byte: a decimal needs a unit, as in 1.5G";
  /* A decimal of a unit that is no whole byte rounds up: "0.1G" is 107374183 bytes. */
  u128 total = whole * scale + part / ten + (part % ten ? 1 : 0);
  if (total > SIZE_MAX) return "more than 2^64 - 1 bytes";
  *bytes = (size_t)total;
  if (fraction) *fraction = 0;
  return NULL;
}

int vram_parse_size(const char *text, int allow_percent, size_t *bytes, double *fraction) {
  if (!text || !bytes) return VRAM_EINVAL;
  size_t b = 0;
  double f = 0;
  if (parse_size(text, allow_percent, &b, &f) || (f && !fraction)) return VRAM_EINVAL;
  *bytes = b;
  if (fraction) *fraction = f;
  return VRAM_OK;
}

const char *vram_parse_size_error(const char *text, int allow_percent) {
  if (!text) return "no text";
  size_t b;
  double f;
  return parse_size(text, allow_percent, &b, &f);
}

/* The spellings of a switch, as most tools read them. */
int _vram_parse_switch(const char *text, int *on) {
  static const char *const offs[] = {"0", "off", "false", "no"};
  static const char *const ons[] = {"1", "on", "true", "yes"};
  for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
    if (strcasecmp(text, offs[i]) == 0) return *on = 0, 0;
    if (strcasecmp(text, ons[i]) == 0) return *on = 1, 0;
  }
  return -1;
}

/* options.h - what the library's other parts need from the VRAMKIT_* reading in
 * options.c and size.c: one spelling of on/off for switch variables, and refusals that
 * name the variable and quote its value in one shape. */
#ifndef VRAMKIT_POOL_OPTIONS_H
#define VRAMKIT_POOL_OPTIONS_H

#include <stddef.h>

/* 0/1, off/on, false/true, no/yes in any case: 0 with *on set, or -1 for anything else. */
int _vram_parse_switch(const char *text, int *on);

/* "NAME: 'value' is not WHAT: reason; expected ..." into buf: the one shape of a refused
 * variable (a long value is cut short in the message, never in what is used). */
void _vram_env_refusal(char *buf, size_t cap, const char *name, const char *value,
                       const char *what, const char *reason, const char *expected);

/* The help text of a known VRAMKIT_* variable (vram_env_variable), NULL if unknown. */
const char *_vram_env_help(const char *name);

/* The bounds of vram_options_t.give_back_timeout_ms: the table refuses a longer one, and
 * pool/giveback.c a pool made with it. */
#define VRAM_GIVE_BACK_TIMEOUT_DEFAULT_MS 250u
#define VRAM_GIVE_BACK_TIMEOUT_MAX_MS 10000u

#endif

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

/* The give-back variables (pool/giveback.c reads them when a pool joins its group; these
 * parsers are the ones vram_options_from_env refuses bad values with). Each returns NULL
 * and sets its outputs, or says why the text is refused ("" when "is not WHAT" says all). */
#define VRAM_GIVE_BACK_TIMEOUT_MAX_MS 10000u
const char *_vram_parse_give_back_timeout(const char *text, unsigned *ms);
const char *_vram_parse_group_limit(const char *text, size_t *bytes, double *fraction);

/* The refusal of `name`'s value `text` ("NAME: 'value' is not ..."), or NULL when it is
 * good or `name` has no check: what a pool that reads the variable itself reports. */
const char *_vram_env_check(const char *name, const char *text);

#endif

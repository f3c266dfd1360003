/* test_escape.c - vram_escape_text, the one escaper of foreign text: every report of the
 * engine and every name the Python package prints goes through it, so what it lets pass
 * decides what a name can do to a terminal or a log. */
#include <string.h>

#include "vt.h"

static const char *escaped(const char *src, size_t len) {
  static char out[256];
  vram_escape_text(out, sizeof out, src, len);
  return out;
}

#define ESC(s) escaped((s), sizeof(s) - 1)

static void t_plain_text_passes(void **state) {
  (void)state;
  assert_string_equal(ESC("python3 train.py"), "python3 train.py");
  assert_string_equal(ESC("caf\xc3\xa9 \xe2\x82\xac"), "caf\xc3\xa9 \xe2\x82\xac"); /* é, € */
}

static void t_controls_and_backslash_become_hex(void **state) {
  (void)state;
  assert_string_equal(ESC("a\nb"), "a\\x0ab");
  assert_string_equal(ESC("\x1b[2J"), "\\x1b[2J");
  assert_string_equal(ESC("a\\b"), "a\\x5cb"); /* so that an escape in the text reads as one */
  assert_string_equal(ESC("\x7f"), "\\x7f");
  assert_string_equal(ESC("\xc2\x9b"), "\\xc2\\x9b"); /* C1: CSI, obeyed by some terminals */
  assert_string_equal(ESC("a\0b"), "a\\x00b");       /* the whole length, NULs included */
}

static void t_invalid_utf8_becomes_hex(void **state) {
  (void)state;
  assert_string_equal(ESC("caf\xe9"), "caf\\xe9");
  assert_string_equal(ESC("\xc0\xaf"), "\\xc0\\xaf");         /* overlong '/' */
  assert_string_equal(ESC("\xed\xa0\x80"), "\\xed\\xa0\\x80"); /* a surrogate */
  assert_string_equal(ESC("\xe2\x82"), "\\xe2\\x82");         /* cut short */
}

static void t_invisible_characters_become_hex(void **state) {
  (void)state;
  /* U+202E RIGHT-TO-LEFT OVERRIDE would show "exe.txt" for "txt.exe"; U+2028 breaks a
   * line; U+200B hides between letters; U+FEFF, U+2066 likewise. */
  assert_string_equal(ESC("a\xe2\x80\xae" "b"), "a\\xe2\\x80\\xaeb");
  assert_string_equal(ESC("\xe2\x80\xa8"), "\\xe2\\x80\\xa8");
  assert_string_equal(ESC("\xe2\x80\x8b"), "\\xe2\\x80\\x8b");
  assert_string_equal(ESC("\xef\xbb\xbf"), "\\xef\\xbb\\xbf");
  assert_string_equal(ESC("\xe2\x81\xa6"), "\\xe2\\x81\\xa6");
}

static void t_cut_between_whole_escapes(void **state) {
  (void)state;
  char out[6];
  /* "ab" fits, the escape of \n (4 bytes) does not: cut before it, never inside. */
  assert_int_equal(vram_escape_text(out, sizeof out, "ab\ncd", 5), 2);
  assert_string_equal(out, "ab");
  char small[3];
  assert_int_equal(vram_escape_text(small, sizeof small, "\xc3\xa9\xc3\xa9", 4), 2);
  assert_string_equal(small, "\xc3\xa9");
  assert_int_equal(vram_escape_text(NULL, 4, "x", 1), 0);
}

/* Whatever the bytes, the output has no control byte and fits 4 * len + 1. */
static void t_any_bytes_give_printable_text(void **state) {
  (void)state;
  unsigned seed = 12345;
  char src[64], out[4 * sizeof src + 1];
  for (int round = 0; round < 20000; round++) {
    size_t len = (seed = seed * 1103515245u + 12345u) % sizeof src;
    for (size_t i = 0; i < len; i++) src[i] = (char)((seed = seed * 1103515245u + 12345u) >> 16);
    size_t n = vram_escape_text(out, sizeof out, src, len);
    assert_int_equal(n, strlen(out));
    for (size_t i = 0; i < n; i++) {
      unsigned char c = (unsigned char)out[i];
      assert_true(c >= 0x20 && c != 0x7f);
    }
    if (len) assert_true(n >= len); /* nothing dropped: each byte is kept or escaped */
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_plain_text_passes),
      cmocka_unit_test(t_controls_and_backslash_become_hex),
      cmocka_unit_test(t_invalid_utf8_becomes_hex),
      cmocka_unit_test(t_invisible_characters_become_hex),
      cmocka_unit_test(t_cut_between_whole_escapes),
      cmocka_unit_test(t_any_bytes_give_printable_text),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* fuzz_size.c - vram_parse_size, the one size grammar of the C options, the command line and
 * the Python package, on any text: it accepts or refuses, and what it accepts is a size a
 * pool could be asked for (a fraction within 0..1 where percentages are allowed). The first
 * byte chooses whether percentages are allowed. */
#include <stdio.h>

#include "fuzz.h"
#include "vramkit.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  int allow_percent = data[0] & 1;
  char *text = fuzz_string(data + 1, size - 1);
  size_t bytes = 12345;
  double fraction = -1.0;
  int rc = vram_parse_size(text, allow_percent, &bytes, &fraction);
  if (rc == VRAM_OK && allow_percent && fraction != 0.0 && (fraction < 0.0 || fraction > 1.0)) {
    fprintf(stderr, "'%s' accepted as a fraction of %g\n", text, fraction);
    abort();
  }
  if (rc != VRAM_OK && rc != VRAM_EINVAL) {
    fprintf(stderr, "'%s': unexpected status %d\n", text, rc);
    abort();
  }
  free(text);
  return 0;
}

/* fuzz_options.c - the VRAMKIT_* settings as the environment hands them over: lines of
 * NAME=VALUE through vram_options_set, the table vram_options_from_env reads with. A bad
 * value is VRAM_EENV with a reason and leaves the options as they were; an unknown name is
 * VRAM_EINVAL; nothing else may happen. */
#include <stdio.h>

#include "fuzz.h"
#include "vramkit.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_string(data, size);
  vram_options_t opts;
  vram_options_init(&opts);
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char *eq = strchr(line, '=');
    if (!eq) continue;
    *eq = 0;
    vram_options_t before = opts;
    const char *why = NULL;
    int rc = vram_options_set(&opts, line, eq + 1, &why);
    if (rc == VRAM_OK) continue;
    if ((rc != VRAM_EENV && rc != VRAM_EINVAL) || (rc == VRAM_EENV && !why) ||
        memcmp(&before, &opts, sizeof opts) != 0) {
      fprintf(stderr, "%s=%s: status %d, options %s\n", line, eq + 1, rc,
              memcmp(&before, &opts, sizeof opts) ? "changed" : "kept");
      abort();
    }
  }
  free(text);
  return 0;
}

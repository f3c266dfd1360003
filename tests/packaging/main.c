/* main.c - a downstream C program, built against an installed vramkit by
 * check_install.cmake (through find_package and through pkg-config). It uses only the
 * installed header and library: one allocation and free on the pool VRAMKIT_SOURCE names
 * (sim in the test), so a missing symbol, header or library path fails the build or run. */
#include <stdio.h>
#include <string.h>
#include <vramkit.h>

int main(void) {
  vram_options_t opts;
  vram_options_init(&opts);
  const char *why = NULL;
  if (vram_options_from_env(&opts, &why)) {
    fprintf(stderr, "%s\n", why);
    return 1;
  }
  vram_pool_t *pool;
  int rc = vram_pool_create(&pool, &opts);
  if (rc) {
    fprintf(stderr, "vram_pool_create: %s\n", vram_strerror(rc));
    return 1;
  }
  void *p = NULL;
  rc = vram_malloc(pool, 1 << 20, NULL, &p);
  if (rc || !p) {
    fprintf(stderr, "vram_malloc: %s\n", vram_strerror(rc));
    return 1;
  }
  vram_free(pool, p);
  if (vram_pool_destroy(pool) != VRAM_OK)
    return 1;
  printf("downstream ok: vramkit %s\n", VRAMKIT_VERSION);
  return 0;
}

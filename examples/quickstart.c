/* quickstart.c - the README's C quick start, built and run by the tests (on the sim source
 * unless VRAMKIT_SOURCE says otherwise). */
#include <stdio.h>
#include <vramkit.h>

int main(void) {
  vram_options_t opts;
  vram_options_init(&opts);                 /* device 0, grow on demand, no limit */
  const char *why = NULL;
  if (vram_options_from_env(&opts, &why)) { /* VRAMKIT_SOURCE, VRAMKIT_LIMIT, ... */
    fprintf(stderr, "%s\n", why);
    return 1;
  }
  opts.limit_bytes = (size_t)1 << 30;       /* a hard limit of 1 GiB */

  vram_pool_t *pool;
  int rc = vram_pool_create(&pool, &opts);
  if (rc) {
    fprintf(stderr, "vram_pool_create: %s\n", vram_strerror(rc));
    return 1;
  }
  void *a, *b;
  vram_malloc(pool, 64 << 20, NULL, &a);    /* 64 MiB on the default stream */
  vram_malloc(pool, 1000, NULL, &b);        /* a small block: 1024 bytes */
  vram_free(pool, a);                       /* cached: the next 64 MiB costs no driver call */

  void *huge;
  rc = vram_malloc(pool, (size_t)2 << 30, NULL, &huge);
  if (rc == VRAM_ENOMEM) {                  /* over the limit: the report says why */
    char report[2048];
    vram_oom_report(pool, report, sizeof report);
    printf("%s\n", report);
  }

  vram_stats_t s;
  vram_get_stats(pool, &s);
  printf("allocated %lld, reserved %lld, peak reserved %lld, OOMs %llu\n",
         (long long)s.allocated_bytes.current, (long long)s.reserved_bytes.current,
         (long long)s.reserved_bytes.peak, (unsigned long long)s.num_ooms);

  char table[4096];
  vram_summary(pool, table, sizeof table);  /* like torch.cuda.memory_summary() */
  fputs(table, stdout);

  vram_free(pool, b);
  vram_empty_cache(pool);                   /* give cached segments back */
  return vram_pool_destroy(pool) == VRAM_OK && rc == VRAM_ENOMEM ? 0 : 1;
}

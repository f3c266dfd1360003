/* test_leak_report.c - VRAMKIT_LEAK_REPORT=1: a child process plants leaks from two
 * functions, frees other blocks, and exits; the report it prints at exit must name both
 * functions with the right counts and bytes, the larger first, and nothing freed. Built
 * with exported symbols (-rdynamic) so that the report can name the test's functions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "vramkit.h"

static vram_pool_t *g_pool;

/* Each leak calls vram_malloc itself: the report names the caller of vram_malloc. */
static void check(int rc) {
  if (rc != VRAM_OK) _exit(3);
}

/* Three blocks of 4 KiB never freed, from one call site. */
__attribute__((noinline)) void planted_leak_small(void) {
  void *p;
  for (int i = 0; i < 3; i++) check(vram_malloc(g_pool, 4096, NULL, &p));
}

/* Two blocks of 3 MiB never freed: more bytes, so reported first. */
__attribute__((noinline)) void planted_leak_large(void) {
  void *p;
  for (int i = 0; i < 2; i++) check(vram_malloc(g_pool, 3 << 20, NULL, &p));
}

__attribute__((noinline)) void allocates_and_frees(void) {
  void *p;
  for (int i = 0; i < 5; i++) {
    check(vram_malloc(g_pool, 100000, NULL, &p));
    vram_free(g_pool, p);
  }
}

static int child(int fd) {
  dup2(fd, 2);
  setenv("VRAMKIT_LEAK_REPORT", "1", 1);
  vram_options_t o;
  vram_options_init(&o);
  o.source = VRAM_SOURCE_SIM;
  if (vram_pool_create(&g_pool, &o) != VRAM_OK) return 3;
  planted_leak_small();
  allocates_and_frees();
  planted_leak_large();
  return 0; /* the report comes from exit */
}

static int fail(const char *why, const char *report) {
  fprintf(stderr, "test_leak_report: %s\n--- report ---\n%s--- end ---\n", why, report);
  return 1;
}

int main(void) {
  int fds[2];
  if (pipe(fds)) return 2;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    exit(child(fds[1]));
  }
  close(fds[1]);
  static char report[1 << 16];
  size_t len = 0;
  ssize_t got;
  while ((got = read(fds[0], report + len, sizeof report - 1 - len)) > 0) len += (size_t)got;
  report[len] = 0;
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return fail("the child failed", report);
  const char *head = strstr(report, "5 blocks (6303744 bytes) never freed");
  const char *large = strstr(report, "2 blocks, 6291456 bytes, allocated at planted_leak_large+");
  const char *small = strstr(report, "3 blocks, 12288 bytes, allocated at planted_leak_small+");
  if (!head) return fail("no header with 5 blocks and their bytes", report);
  if (!large) return fail("planted_leak_large not named with 2 blocks, 6 MiB", report);
  if (!small) return fail("planted_leak_small not named with 3 blocks, 12 KiB", report);
  if (large > small) return fail("the larger leak is not first", report);
  if (strstr(report, "allocated at allocates_and_frees")) return fail("a freed block reported", report);
  printf("%s", report);
  return 0;
}

/* replay_corpus.c - a fuzz target's main where libFuzzer is not linked (gcc builds, or clang
 * without the fuzz option): each file of the folders named on the command line goes once
 * through the target, so that every build replays the corpus, and the findings kept in it
 * stay fixed. Exits non-zero if a folder cannot be read; a target that finds a fault aborts. */
#include <dirent.h>
#include <stdio.h>

#include "fuzz.h"

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  uint8_t *data = NULL;
  size_t size = 0, cap = 0;
  for (;;) {
    if (size == cap) {
      cap = cap ? 2 * cap : 4096;
      data = realloc(data, cap);
      if (!data) abort();
    }
    size_t n = fread(data + size, 1, cap - size, f);
    if (n == 0) break;
    size += n;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(data, size);
  free(data);
  return 0;
}

int main(int argc, char **argv) {
  int files = 0;
  for (int i = 1; i < argc; i++) {
    DIR *d = opendir(argv[i]);
    if (!d) {
      fprintf(stderr, "cannot read the corpus folder %s\n", argv[i]);
      return 2;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
      if (replay_file(path) == 0) files++;
    }
    closedir(d);
  }
  printf("%d inputs replayed\n", files);
  return files > 0 ? 0 : 2;
}

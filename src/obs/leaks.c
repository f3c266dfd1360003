/* leaks.c - C call stacks for the leak report, and the report itself (leaks.h).
 *
 * A stack is captured with backtrace() at each allocation and interned, so that a loop that
 * leaks a million blocks from one place keeps one stack. Names come from dladdr at report
 * time only: a program linked with -rdynamic (or a shared library) names its functions;
 * otherwise the report gives the object and the offset, which addr2line resolves. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "obs/leaks.h"

#define MAX_FRAMES 24
#define SHOWN_FRAMES 4

typedef struct stack {
  int n;
  void *frames[MAX_FRAMES];
} stack;

static pthread_mutex_t g_stacks_lock = PTHREAD_MUTEX_INITIALIZER;
static stack *g_stacks;
static size_t g_n_stacks, g_cap_stacks;
static size_t *g_index; /* open addressing over g_stacks: slot -> index + 1 */
static size_t g_index_mask;

static uint64_t stack_hash(const stack *s) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < s->n; i++) h = (h ^ (uint64_t)(uintptr_t)s->frames[i]) * 1099511628211ull;
  return h;
}

static bool index_grow(void) {
  size_t cap = g_index_mask ? (g_index_mask + 1) * 2 : 1024;
  size_t *index = calloc(cap, sizeof *index);
  if (!index) return false;
  for (size_t k = 0; k < g_n_stacks; k++) {
    size_t i = stack_hash(&g_stacks[k]) & (cap - 1);
    while (index[i]) i = (i + 1) & (cap - 1);
    index[i] = k + 1;
  }
  free(g_index);
  g_index = index;
  g_index_mask = cap - 1;
  return true;
}

/* The id of stack s, adding it if new; 0 when out of host memory. Lock held. */
static uint64_t intern(const stack *s) {
  if ((g_n_stacks + 1) * 2 > g_index_mask + 1 && !index_grow()) return 0;
  size_t i = stack_hash(s) & g_index_mask;
  for (; g_index[i]; i = (i + 1) & g_index_mask) {
    const stack *t = &g_stacks[g_index[i] - 1];
    if (t->n == s->n && !memcmp(t->frames, s->frames, (size_t)s->n * sizeof *s->frames))
      return VRAM_BACKTRACE_ID_BIT | g_index[i];
  }
  if (g_n_stacks == g_cap_stacks) {
    size_t cap = g_cap_stacks ? g_cap_stacks * 2 : 256;
    stack *grown = realloc(g_stacks, cap * sizeof *grown);
    if (!grown) return 0;
    g_stacks = grown;
    g_cap_stacks = cap;
  }
  g_stacks[g_n_stacks++] = *s;
  g_index[i] = g_n_stacks;
  return VRAM_BACKTRACE_ID_BIT | g_n_stacks;
}

uint64_t _vram_backtrace_capture(void *call_site) {
  void *frames[MAX_FRAMES + 8];
  int n = backtrace(frames, MAX_FRAMES + 8);
  /* Drop the frames of vramkit itself: everything up to the caller's return address. When
   * that address is not among the frames (a tail call), keep all but this function's. */
  int from = 1;
  for (int i = 0; i < n; i++)
    if (frames[i] == call_site) {
      from = i;
      break;
    }
  stack s = {0};
  for (int i = from; i < n && s.n < MAX_FRAMES; i++) s.frames[s.n++] = frames[i];
  pthread_mutex_lock(&g_stacks_lock);
  uint64_t id = intern(&s);
  pthread_mutex_unlock(&g_stacks_lock);
  return id;
}

/* A copy of the stack with this id, or false if the id is not one of ours. */
static bool stack_of(uint64_t id, stack *out) {
  if (!(id & VRAM_BACKTRACE_ID_BIT)) return false;
  size_t k = (size_t)(id & ~VRAM_BACKTRACE_ID_BIT);
  pthread_mutex_lock(&g_stacks_lock);
  bool ok = k >= 1 && k <= g_n_stacks;
  if (ok) *out = g_stacks[k - 1];
  pthread_mutex_unlock(&g_stacks_lock);
  return ok;
}

/* "function+0x1f (object)", or "object+0x1234" where the function has no dynamic symbol. A
 * return address points after the call, so the byte before it is what is looked up. */
static void print_frame(FILE *out, void *pc) {
  Dl_info info;
  void *at = (char *)pc - 1;
  if (dladdr(at, &info) && info.dli_sname && info.dli_saddr) {
    fprintf(out, "%s+%#lx (%s)", info.dli_sname, (unsigned long)((char *)pc - (char *)info.dli_saddr),
            info.dli_fname ? info.dli_fname : "?");
  } else if (dladdr(at, &info) && info.dli_fname) {
    fprintf(out, "%s+%#lx", info.dli_fname, (unsigned long)((char *)pc - (char *)info.dli_fbase));
  } else {
    fprintf(out, "%p", pc);
  }
}

/* The call site of a context: the function that called vram_malloc (where its symbol is
 * known; else the return address), or the id itself. By function, not by address, since a
 * compiler that unrolls a loop makes one line of source many call instructions. */
static uint64_t site_of(uint64_t context) {
  stack s;
  if (!stack_of(context, &s) || !s.n) return context;
  Dl_info info;
  if (dladdr((char *)s.frames[0] - 1, &info) && info.dli_sname && info.dli_saddr)
    return (uint64_t)(uintptr_t)info.dli_saddr;
  return (uint64_t)(uintptr_t)s.frames[0];
}

typedef struct site {
  uint64_t key, context, count, bytes;
} site;

static int by_key(const void *a, const void *b) {
  uint64_t x = ((const vram_leak_entry *)a)->context, y = ((const vram_leak_entry *)b)->context;
  return x < y ? -1 : x > y;
}

static int by_bytes(const void *a, const void *b) {
  const site *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  return x->count > y->count ? -1 : x->count < y->count;
}

static void print_site(FILE *out, const site *s) {
  fprintf(out, "  %llu block%s, %llu bytes, allocated at ", (unsigned long long)s->count,
          s->count == 1 ? "" : "s", (unsigned long long)s->bytes);
  stack st;
  if (!stack_of(s->context, &st) || !st.n) {
    if (s->context) fprintf(out, "context %llu (no C stack)\n", (unsigned long long)s->context);
    else fprintf(out, "an unknown place (allocated before recording)\n");
    return;
  }
  print_frame(out, st.frames[0]);
  fputc('\n', out);
  for (int i = 1; i < st.n && i < SHOWN_FRAMES; i++) {
    fputs("      from ", out);
    print_frame(out, st.frames[i]);
    fputc('\n', out);
  }
}

void _vram_leak_report(FILE *out, int device, vram_leak_entry *entries, size_t n) {
  if (!n) return;
  /* Entries become their call site's key, then runs of one key add up. */
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) total += entries[i].size;
  site *sites = malloc(n * sizeof *sites);
  vram_leak_entry *keyed = malloc(n * sizeof *keyed);
  fprintf(out, "vramkit: leak report for device %d: %zu block%s (%llu bytes) never freed\n",
          device, n, n == 1 ? "" : "s", (unsigned long long)total);
  if (!sites || !keyed) {
    free(sites);
    free(keyed);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    keyed[i] = entries[i];
    keyed[i].requested = entries[i].context; /* keeps one context of the site */
    keyed[i].context = site_of(entries[i].context);
  }
  qsort(keyed, n, sizeof *keyed, by_key);
  size_t n_sites = 0;
  for (size_t i = 0; i < n; i++) {
    if (!n_sites || sites[n_sites - 1].key != keyed[i].context)
      sites[n_sites++] = (site){keyed[i].context, keyed[i].requested, 0, 0};
    sites[n_sites - 1].count++;
    sites[n_sites - 1].bytes += keyed[i].size;
  }
  qsort(sites, n_sites, sizeof *sites, by_bytes);
  for (size_t i = 0; i < n_sites; i++) print_site(out, &sites[i]);
  fflush(out);
  free(sites);
  free(keyed);
}

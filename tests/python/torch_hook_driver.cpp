// torch_hook_driver.cpp - calls the PyTorch hook library as CUDAPluggableAllocator does
// (dlopen, then the alloc and free functions by name) and prints what came back, one line
// a call, for tests/python/test_torch_hooks.py.
//
//   torch_hook_driver LIBRARY DEVICE SIZE...
//
// For each SIZE: "ok <pointer>" (then frees it), "oom <message>" for c10::OutOfMemoryError,
// "error <message>" for any other c10::Error. Messages have their newlines replaced by '|'.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <c10/util/Exception.h>

using AllocFn = void *(*)(size_t, int, void *);
using FreeFn = void (*)(void *, size_t, int, void *);

static std::string one_line(const char *text) {
  std::string s(text);
  for (char &c : s)
    if (c == '\n') c = '|';
  return s;
}

int main(int argc, char **argv) {
  if (argc < 4) return 2;
  void *lib = dlopen(argv[1], RTLD_NOW);
  if (lib == nullptr) {
    std::printf("dlopen %s\n", dlerror());
    return 3;
  }
  auto alloc = reinterpret_cast<AllocFn>(dlsym(lib, "vramkit_torch_malloc"));
  auto release = reinterpret_cast<FreeFn>(dlsym(lib, "vramkit_torch_free_block"));
  if (alloc == nullptr || release == nullptr) return 4;
  int device = std::atoi(argv[2]);
  for (int i = 3; i < argc; i++) {
    size_t size = std::strtoull(argv[i], nullptr, 10);
    try {
      void *p = alloc(size, device, nullptr);
      std::printf("ok %zu\n", reinterpret_cast<size_t>(p));
      release(p, size, device, nullptr);
    } catch (const c10::OutOfMemoryError &e) {
      std::printf("oom %s\n", one_line(e.what()).c_str());
    } catch (const c10::Error &e) {
      std::printf("error %s\n", one_line(e.what()).c_str());
    }
  }
  return 0;
}

// torch_oom.cpp - the alloc and free functions PyTorch's CUDAPluggableAllocator calls.
//
// PyTorch does not check the pointer an alloc function returns, so a failure has to leave
// as a C++ exception: c10::OutOfMemoryError, which PyTorch's Python bindings raise as
// torch.OutOfMemoryError, exactly what its own caching allocator raises. Throwing a c10
// exception needs c10's headers and library, so this file is compiled against the PyTorch
// installed beside vramkit (vramkit/plug/_torch_build.py does that once, and caches the result);
// everything else stays in C, in libvramkit_torch.so, which this library links.
//
// The exception leaves through std::function and PyTorch's own C++ frames only: the C code
// below has returned by the time it is thrown.
#include <cstddef>
#include <string>

#include <c10/util/Exception.h>

extern "C" {
int vramkit_torch_alloc(size_t size, int device, void *stream, void **out, char *msg,
                        size_t msg_cap);
void vramkit_torch_free(void *ptr, size_t size, int device, void *stream);
}

namespace {

// Must match the outcomes in torch_hooks.c.
constexpr int kAllocOk = 0;
constexpr int kAllocOutOfMemory = 1;

// The engine's report runs to a dozen lines; this leaves it room.
constexpr size_t kMessageCap = 8192;

}  // namespace

#define VRAMKIT_TORCH_EXPORT extern "C" __attribute__((visibility("default")))

// void* alloc_fn(size_t size, int device, cudaStream_t stream)
VRAMKIT_TORCH_EXPORT void *vramkit_torch_malloc(size_t size, int device, void *stream) {
  void *ptr = nullptr;
  char message[kMessageCap];
  message[0] = '\0';
  int outcome = vramkit_torch_alloc(size, device, stream, &ptr, message, sizeof message);
  if (outcome == kAllocOk) return ptr;
  if (outcome == kAllocOutOfMemory) C10_THROW_ERROR(OutOfMemoryError, std::string(message));
  C10_THROW_ERROR(Error, std::string(message));
}

// void free_fn(void* ptr, size_t size, int device, cudaStream_t stream). PyTorch looks both
// functions up in this one library, so the free function is here too.
VRAMKIT_TORCH_EXPORT void vramkit_torch_free_block(void *ptr, size_t size, int device,
                                                   void *stream) {
  vramkit_torch_free(ptr, size, device, stream);
}

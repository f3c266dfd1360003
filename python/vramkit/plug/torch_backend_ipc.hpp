// torch_backend_ipc.hpp - CUDA IPC for torch_backend.cpp (included there, after the class
// Backend, inside its namespace): the handles torch.multiprocessing sends to another
// process for a block's segment, and the opening of handles received, in the unversioned
// form PyTorch's own allocator reads too.

inline cca::ShareableHandle Backend::shareIpcHandle(void *ptr) {
  vram_pool_t *pool = owner_of(ptr);
  void *base = nullptr;
  TORCH_CHECK(pool && vram_segment_of(pool, ptr, &base, nullptr) == VRAM_OK,
              "vramkit: shareIpcHandle: ", ptr, " is not a live block of vramkit's");
  TORCH_CHECK(vram_pool_source(pool) == VRAM_SOURCE_CUDA,
              "vramkit: CUDA tensors can be shared between processes only from the 'cuda' "
              "source (cuMemAlloc segments); this pool's source is '",
              vram_source_name(vram_pool_source(pool)),
              "'. Set VRAMKIT_SOURCE=cuda in the producing process.");
  cudaIpcMemHandle_t handle;
  cudaError_t err = cudaIpcGetMemHandle(&handle, base);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    // A cuda pool's large blocks are in virtual ranges (cuMemMap'd granules), which have
    // no CUDA IPC handle: from the first by default (VRAMKIT_LARGE_BLOCKS=virtual), and
    // past VRAMKIT_VIRTUAL_THRESHOLD of its cap with large blocks fixed.
    TORCH_CHECK(false,
                "vramkit: this CUDA tensor cannot be shared between processes: it lies in "
                "virtual memory, where a 'cuda' pool puts blocks over 1 MiB by default "
                "(VRAMKIT_LARGE_BLOCKS=virtual), or past VRAMKIT_VIRTUAL_THRESHOLD of its "
                "cap with VRAMKIT_LARGE_BLOCKS=fixed (",
                cudaGetErrorString(err),
                "). Set VRAMKIT_VIRTUAL_THRESHOLD=1 and VRAMKIT_LARGE_BLOCKS=fixed in the "
                "producing process to keep every block in cuMemAlloc segments.");
  }
  // The unversioned form (the handle's bytes alone): PyTorch's own allocator reads it too,
  // so a consumer process need not run vramkit.
  return {static_cast<char *>(ptr) - static_cast<char *>(base),
          std::string(reinterpret_cast<const char *>(&handle), sizeof handle)};
}

inline std::shared_ptr<void> Backend::getIpcDevPtr(std::string handle) {
  cudaIpcMemHandle_t raw;
  // Unversioned (vramkit's and old PyTorch's) or PyTorch's versioned cudaMalloc form:
  // a version byte, 'c', then the handle.
  if (handle.size() == sizeof raw) {
    std::memcpy(&raw, handle.data(), sizeof raw);
  } else if (handle.size() == sizeof raw + 2 && handle[1] == 'c') {
    std::memcpy(&raw, handle.data() + 2, sizeof raw);
  } else {
    TORCH_CHECK(false, "vramkit: cannot open this CUDA IPC handle (", handle.size(),
                " bytes): only cudaMalloc-style handles are supported, not expandable "
                "segments'");
  }
  std::lock_guard<std::mutex> g(ipc_mutex_);
  auto it = ipc_opened_.find(handle);
  if (it != ipc_opened_.end())
    if (auto alive = it->second.lock()) return alive;
  c10::DeviceIndex device = 0;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  void *dev_ptr = nullptr;
  C10_CUDA_CHECK(cudaIpcOpenMemHandle(&dev_ptr, raw, cudaIpcMemLazyEnablePeerAccess));
  std::shared_ptr<void> opened(dev_ptr, [device](void *p) {
    c10::cuda::CUDAGuard guard(device);
    cudaIpcCloseMemHandle(p);
  });
  ipc_opened_[handle] = opened;
  return opened;
}

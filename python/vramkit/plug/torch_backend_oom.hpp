// torch_backend_oom.hpp - failures of the allocation path for torch_backend.cpp (included
// there, after the class Backend, inside its namespace): out of memory as
// c10::OutOfMemoryError in PyTorch's sentences with the device's figures and then vramkit's
// report of the pool that failed, noted to the profiler and to the observers PyTorch
// attached; any other engine error as c10::Error with vramkit's message.

[[noreturn]] inline void Backend::fail(c10::DeviceIndex device, size_t n, vram_pool_t *pool,
                                       int rc) {
  char message[kMessageCap];
  if (rc != VRAM_ENOMEM || !pool)
    vramkit_torch_compose_message(message, sizeof message, rc, device, n, pool);
  if (rc == VRAM_ENOMEM) {
    vram_stats_t s{};
    size_t free_bytes = 0, total = 0;
    if (pool) {
      vram_get_stats(pool, &s);
      vram_mem_get_info(pool, &free_bytes, &total);
      oom_message(message, sizeof message, device, n, pool, free_bytes, total);
    }
    c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(n),
                                     static_cast<size_t>(s.allocated_bytes.current),
                                     static_cast<size_t>(s.reserved_bytes.current),
                                     cuda_device(device));
    std::vector<cca::OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> g(mutex_);
      observers = oom_observers_;
    }
    for (auto &observer : observers)
      observer(device, static_cast<size_t>(s.allocated_bytes.current), total, free_bytes);
    C10_THROW_ERROR(OutOfMemoryError, std::string(message));
  }
  C10_THROW_ERROR(Error, std::string(message));
}

// PyTorch's sentences with the device's figures (graph pools' share named as PyTorch
// names it), then the report of the pool that failed.
inline void Backend::oom_message(char *message, size_t cap, c10::DeviceIndex device, size_t n,
                                 vram_pool_t *failed, size_t free_bytes, size_t total) {
  size_t allocated = 0, private_allocated = 0, reserved = 0, limit = 0;
  {
    std::lock_guard<std::mutex> g(mutex_);
    for (vram_pool_t *pool : pools_of_locked(device)) {
      vram_stats_t s{};
      if (vram_get_stats(pool, &s) != VRAM_OK) continue;
      bool is_default = pool == used_[device].load();
      (is_default ? allocated : private_allocated) += s.allocated_bytes.current;
      reserved += s.reserved_bytes.current;
      if (is_default) limit = s.limit_bytes;
    }
  }
  int k = vramkit_torch_oom_head(message, cap, device, n, total, free_bytes, limit, allocated,
                                 private_allocated, reserved);
  if (k >= 0 && static_cast<size_t>(k) < cap)
    vram_oom_report(failed, message + k, cap - static_cast<size_t>(k));
}

inline void Backend::attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) {
  std::lock_guard<std::mutex> g(mutex_);
  oom_observers_.push_back(std::move(observer));
}

// torch_backend_watchers.hpp - what watchers see for torch_backend.cpp (included there,
// after the class Backend, inside its namespace): each allocation and free as the profiler's
// memory events, the CUDA sanitizer's (GPUTrace) and the trace trackers PyTorch attached
// (attachAllocatorTraceTracker), at no cost while none of them watches.

inline void Backend::attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) {
  std::lock_guard<std::mutex> g(mutex_);
  trackers_.push_back(std::move(tracker));
  has_trackers_.store(true);
}


inline bool Backend::profiling_or_tracing() const {
  return c10::memoryProfilingEnabled() || c10::impl::GPUTrace::get_trace() ||
         has_trackers_.load(std::memory_order_relaxed);
}

inline void Backend::note_alloc(c10::DeviceIndex device, void *ptr, size_t n,
                                cudaStream_t stream, vram_pool_t *pool) {
  if (!profiling_or_tracing()) return;
  size_t size = (n + kAlign - 1) & ~(kAlign - 1);
  watchers(TraceEntry::ALLOC, device, ptr, static_cast<int64_t>(size), stream, pool);
  if (auto *interp = c10::impl::GPUTrace::get_trace())
    (*interp)->trace_gpu_memory_allocation(c10::kCUDA, reinterpret_cast<uintptr_t>(ptr));
}

inline void Backend::note_free(c10::DeviceIndex device, void *ptr, size_t size,
                               cudaStream_t stream, vram_pool_t *pool) {
  watchers(TraceEntry::FREE_REQUESTED, device, ptr, -static_cast<int64_t>(size), stream,
           pool);
  if (auto *interp = c10::impl::GPUTrace::get_trace())
    (*interp)->trace_gpu_memory_deallocation(c10::kCUDA, reinterpret_cast<uintptr_t>(ptr));
}

inline void Backend::watchers(TraceEntry::Action action, c10::DeviceIndex device, void *ptr,
                              int64_t delta, cudaStream_t stream, vram_pool_t *pool) {
  if (c10::memoryProfilingEnabled()) {
    vram_stats_t s{};
    vram_get_stats(pool, &s);
    c10::reportMemoryUsageToProfiler(ptr, delta, static_cast<size_t>(s.allocated_bytes.current),
                                     static_cast<size_t>(s.reserved_bytes.current),
                                     cuda_device(device));
  }
  if (!has_trackers_.load(std::memory_order_relaxed)) return;
  std::vector<cca::AllocatorTraceTracker> trackers;
  {
    std::lock_guard<std::mutex> g(mutex_);
    trackers = trackers_;
  }
  TraceEntry entry(action, device, reinterpret_cast<size_t>(ptr),
                   static_cast<size_t>(delta < 0 ? -delta : delta), stream, MempoolId_t{0, 0},
                   c10::getApproximateTime());
  for (auto &tracker : trackers) tracker(entry);
}

// torch_backend_pools.hpp - private pools for torch_backend.cpp (included there, after the
// class Backend, inside its namespace): the pools of CUDA graphs, graph trees and
// torch.cuda.MemPool, created and counted per (device, MempoolId_t), the captures that
// steer a stream's allocations into one, and graph-tree checkpoints taken and restored.
//
// Each private pool is an engine pool of its own on the default pool's source, keeping what
// it has: a graph's memory is never handed to anyone else while the graph may replay, and
// releasing the pool gives all of it back at once. A checkpoint is the list of live blocks
// of a pool; restoring it frees what is live and claims every listed block again at its
// address (vram_malloc_at).
//
// A MemPool with an allocator of its own (NCCL's or NVSHMEM's symmetric memory, a
// CUDAPluggableAllocator) is an engine pool on callbacks (vram_pool_create_with_callbacks)
// that take each segment from allocator->raw_alloc_with_stream and give it back with
// raw_delete, as PyTorch's allocator does for such a pool: its statistics, history, limit
// and OOM report are vramkit's. MemPool(no_split=True) is the engine's no_split option:
// each block a segment of its own, never cut. PyTorch sets it right after creating the
// pool, so the empty engine pool is made again with it.

inline void Backend::beginAllocateToPool(c10::DeviceIndex device, MempoolId_t id,
                                         std::function<bool(cudaStream_t)> filter) {
  CaptureFilter entry;
  entry.id = id;
  entry.device = device;
  entry.claims = std::move(filter);
  // PyTorch begins a capture's allocations on the stream it then captures, before the
  // capture starts. Without a device to ask (no CUDA here), the origin stays unknown and
  // the entry counts as a running capture for as long as it is open.
  try {
    entry.origin = c10::cuda::getCurrentCUDAStream(device).stream();
    entry.origin_known = true;
  } catch (const c10::Error &) {
  }
  std::lock_guard<std::mutex> g(mutex_);
  for (auto &c : capture_filters_)
    TORCH_CHECK(!(c.id == id && c.device == device),
                "vramkit: beginAllocateToPool: already allocating to pool (", id.first, ", ",
                id.second, ")");
  incref_locked(device, id);
  capture_filters_.push_back(std::move(entry));
  captures_[device].fetch_add(1);
}

inline void Backend::endAllocateToPool(c10::DeviceIndex device, MempoolId_t id) {
  std::vector<DeferredFree> deferred;
  {
    std::lock_guard<std::mutex> g(mutex_);
    auto it = std::find_if(capture_filters_.begin(), capture_filters_.end(), [&](auto &c) {
      return c.id == id && c.device == device;
    });
    TORCH_CHECK(it != capture_filters_.end(), "vramkit: endAllocateToPool: pool (", id.first,
                ", ", id.second, ") is not being allocated to");
    capture_filters_.erase(it);
    if (captures_[device].fetch_sub(1) == 1) {
      deferred.swap(deferred_frees_);
      reusable_frees_.store(0);
    }
    // A limit held up during the capture comes down to what the fraction leaves.
    if (device_limit_[device].load()) refresh_default_limit_locked(device);
  }
  for (const DeferredFree &d : deferred) free_private_block(d.ptr);
}

inline void Backend::releasePool(c10::DeviceIndex device, MempoolId_t id) {
  std::lock_guard<std::mutex> g(mutex_);
  PrivatePool *pp = find_locked(device, id);
  TORCH_CHECK(pp, "vramkit: releasePool: no pool (", id.first, ", ", id.second, ")");
  TORCH_INTERNAL_ASSERT(pp->use_count > 0);
  pp->use_count--;
  maybe_destroy(pp);
}

inline int Backend::getPoolUseCount(c10::DeviceIndex device, MempoolId_t id) {
  std::lock_guard<std::mutex> g(mutex_);
  PrivatePool *pp = find_locked(device, id);
  return pp ? pp->use_count : 0;
}

inline void Backend::createOrIncrefPool(c10::DeviceIndex device, MempoolId_t id,
                                        std::shared_ptr<cca::CUDAAllocator> allocator) {
  if (allocator.get() == this) allocator = nullptr;  // vramkit itself: an ordinary pool
  std::lock_guard<std::mutex> g(mutex_);
  PrivatePool *pp = find_locked(device, id);
  TORCH_CHECK(!pp || !allocator || pp->allocator == allocator, "vramkit: pool (", id.first,
              ", ", id.second, ") exists already with another allocator");
  incref_locked(device, id, std::move(allocator));
}

inline void Backend::setUseOnOOM(c10::DeviceIndex device, MempoolId_t id, bool use_on_oom) {
  std::lock_guard<std::mutex> g(mutex_);
  PrivatePool *pp = find_locked(device, id);
  TORCH_CHECK(pp || !use_on_oom, "vramkit: setUseOnOOM: no pool (", id.first, ", ", id.second,
              ")");
  if (!pp) return;
  pp->use_on_oom = use_on_oom;
  if (use_on_oom) has_use_on_oom_.store(true);
}

// A request the default pool refused, served from what a MemPool(use_on_oom=True) of the
// device already holds, as PyTorch's allocator does: only a pool with a free block that
// takes it is asked, so that it is not grown (the default pool's refusal already says the
// device, or its fraction, has no more). Pools in creation order; a MemPool deleted while
// blocks of it live serves nothing.
inline PrivatePool *Backend::malloc_on_oom_pools(c10::DeviceIndex device, size_t n,
                                                 cudaStream_t stream, void **ptr) {
  const size_t rounded = (n + kAlign - 1) & ~(kAlign - 1);
  std::lock_guard<std::mutex> g(mutex_);
  for (auto &entry : private_pools_) {
    PrivatePool *pp = entry.second.get();
    if (pp->device != device || !pp->use_on_oom || pp->use_count == 0) continue;
    vram_stats_t s{};
    if (vram_get_stats(pp->pool, &s) != VRAM_OK || s.largest_free_block < rounded) continue;
    if (vram_malloc(pp->pool, n, static_cast<vram_stream_t>(stream), ptr) == VRAM_OK) return pp;
  }
  return nullptr;
}

// The default pool's limit under a fraction: its bytes less what the device's private pools
// reserve (one byte when they hold it all: the engine reads 0 as no limit). A limit below
// what the pool reserves gives cached memory back at once, which a capture forbids: while
// one runs, the limit goes no lower than that.
inline void Backend::refresh_default_limit_locked(c10::DeviceIndex device) {
  const size_t limit = device_limit_[device].load();
  vram_pool_t *dflt = used_[device].load();
  if (!limit || !dflt) return;
  size_t held = 0;
  for (auto &entry : private_pools_) {
    vram_stats_t s{};
    if (entry.second->device == device && vram_get_stats(entry.second->pool, &s) == VRAM_OK)
      held += s.reserved_bytes.current;
  }
  size_t bytes = limit > held ? limit - held : 1;
  vram_stats_t own{};
  if (capture_running_locked() && vram_get_stats(dflt, &own) == VRAM_OK)
    bytes = std::max<size_t>(bytes, own.reserved_bytes.current);
  vram_set_limit(dflt, bytes, 0);
}

inline void Backend::setNoSplit(c10::DeviceIndex device, MempoolId_t id) {
  std::lock_guard<std::mutex> g(mutex_);
  PrivatePool *pp = find_locked(device, id);
  TORCH_CHECK(pp, "vramkit: setNoSplit: no pool (", id.first, ", ", id.second, ")");
  if (pp->no_split) return;
  vram_stats_t s{};
  TORCH_CHECK(vram_get_stats(pp->pool, &s) == VRAM_OK && pp->live == 0 &&
                  s.reserved_bytes.current == 0,
              "vramkit: setNoSplit: pool (", id.first, ", ", id.second,
              ") already holds memory; no_split applies to a new MemPool only");
  pp->no_split = true;
  vram_pool_t *fresh = nullptr;
  try {
    fresh = make_engine_pool(*pp);
  } catch (...) {
    pp->no_split = false;  // the pool as it was, still usable
    throw;
  }
  vram_pool_destroy(pp->pool);
  pp->pool = fresh;
}

inline bool Backend::checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t id,
                                              const std::unordered_set<void *> &expected) {
  std::vector<PoolCheckpoint::Block> live;
  {
    std::lock_guard<std::mutex> g(mutex_);
    PrivatePool *pp = find_locked(device, id);
    if (!pp) return expected.empty();
    live = live_blocks(pp->pool);
  }
  if (live.size() != expected.size()) return false;
  for (auto &b : live)
    if (!expected.count(b.ptr)) return false;
  return true;
}

inline std::shared_ptr<cca::AllocatorState> Backend::getCheckpointState(
    c10::DeviceIndex device, MempoolId_t id) {
  std::lock_guard<std::mutex> g(mutex_);
  PrivatePool *pp = find_locked(device, id);
  TORCH_CHECK(pp, "vramkit: getCheckpointState: no pool (", id.first, ", ", id.second, ")");
  auto state = std::make_shared<PoolCheckpoint>();
  state->id = id;
  state->device = device;
  state->blocks = live_blocks(pp->pool);
  return state;
}

inline cca::CheckpointDelta Backend::setCheckpointPoolState(
    c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> state) {
  auto checkpoint = std::dynamic_pointer_cast<PoolCheckpoint>(state);
  TORCH_CHECK(checkpoint && checkpoint->device == device,
              "vramkit: setCheckpointPoolState: not a checkpoint vramkit took on device ",
              device);
  cca::CheckpointDelta delta;
  std::lock_guard<std::mutex> g(mutex_);
  PrivatePool *pp = find_locked(device, checkpoint->id);
  TORCH_CHECK(pp, "vramkit: setCheckpointPoolState: the pool is gone");
  for (auto &b : live_blocks(pp->pool)) {
    int rc = vram_free(pp->pool, b.ptr);
    TORCH_CHECK(rc == VRAM_OK, "vramkit: setCheckpointPoolState: freeing ", b.ptr, ": ",
                vram_strerror(rc));
    private_blocks_.erase(b.ptr);
    deferred_uses_.erase(b.ptr);
    pp->live--;
    delta.ptrs_freed.push_back(b.ptr);
  }
  for (auto &b : checkpoint->blocks) {
    int rc = vram_malloc_at(pp->pool, b.ptr, b.requested, static_cast<vram_stream_t>(b.stream));
    TORCH_CHECK(rc == VRAM_OK, "vramkit: setCheckpointPoolState: the block at ", b.ptr, " (",
                b.requested, " bytes) cannot be restored: ", vram_strerror(rc),
                " (a block of the pool still waits on another stream?)");
    private_blocks_[b.ptr] = pp;
    pp->live++;
    delta.dataptrs_allocd.emplace_back(b.ptr, b.ptr, &free_any, cuda_device(device));
  }
  return delta;
}

inline PrivatePool *Backend::find_locked(c10::DeviceIndex device, MempoolId_t id) {
  auto it = private_pools_.find({device, id});
  return it == private_pools_.end() ? nullptr : it->second.get();
}

inline void Backend::incref_locked(c10::DeviceIndex device, MempoolId_t id,
                                   std::shared_ptr<cca::CUDAAllocator> allocator) {
  PrivatePool *pp = find_locked(device, id);
  if (!pp) {
    auto fresh = std::make_unique<PrivatePool>();
    fresh->id = id;
    fresh->device = device;
    fresh->allocator = std::move(allocator);
    fresh->pool = make_engine_pool(*fresh);
    pp = fresh.get();
    private_pools_[{device, id}] = std::move(fresh);
  }
  pp->use_count++;
}

// A MemPool's allocator, called by the engine under its pool's lock on the allocating
// thread (whose current device is the pool's). No exception may cross the engine: a
// failure is the device being out of memory, which the engine reports as its own.
int allocator_alloc(void *ctx, size_t size, int, vram_stream_t stream, void **ptr) {
  try {
    *ptr = static_cast<cca::CUDAAllocator *>(ctx)->raw_alloc_with_stream(
        size, static_cast<cudaStream_t>(stream));
    return *ptr ? 0 : 1;
  } catch (...) {
    return 1;
  }
}
void allocator_free(void *ctx, void *ptr, size_t, int, vram_stream_t) {
  try {
    static_cast<cca::CUDAAllocator *>(ctx)->raw_delete(ptr);
  } catch (...) {
    g_last_status.store(VRAM_EDRIVER);
  }
}

// The engine pool of a private pool, as its MemPool options ask, joined to PyTorch's
// recording if one runs.
inline vram_pool_t *Backend::make_engine_pool(const PrivatePool &pp) {
  vram_pool_t *dflt = default_pool(pp.device);
  vram_options_t opts;
  vram_options_init(&opts);
  const char *why = nullptr;
  vram_options_from_env(&opts, &why);
  opts.device = pp.device;
  opts.source = vram_pool_source(dflt);
  // A graph's pool keeps what it has: no memory may go back during a capture, and a
  // graph replays into the same addresses. Its limit is the device's, not the default
  // pool's.
  opts.limit_bytes = 0;
  opts.limit_fraction = 0;
  opts.preallocate_bytes = 0;
  opts.preallocate_fraction = 0;
  opts.release_threshold = SIZE_MAX;
  opts.no_split = pp.no_split;
  // Segments never cut are fixed ones: the virtual-memory sources' fixed counterparts.
  if (pp.no_split && opts.source == VRAM_SOURCE_VMM) opts.source = VRAM_SOURCE_CUDA;
  if (pp.no_split && opts.source == VRAM_SOURCE_SIM_VMM) opts.source = VRAM_SOURCE_SIM;
  vram_pool_t *pool = nullptr;
  int rc;
  if (pp.allocator) {
    vram_source_callbacks_t callbacks{};
    callbacks.alloc = &allocator_alloc;
    callbacks.free = &allocator_free;
    callbacks.ctx = pp.allocator.get();
    rc = vram_pool_create_with_callbacks(&pool, &opts, &callbacks);
  } else {
    rc = vram_pool_create(&pool, &opts);
  }
  TORCH_CHECK(rc == VRAM_OK, "vramkit: cannot create a private pool on device ", pp.device,
              ": ", vram_strerror(rc));
  std::lock_guard<std::mutex> h(history_mutex_);
  start_or_stop_history(pool);
  return pool;
}

// A private pool nobody uses and nothing lives in goes back to the driver, unless a
// capture is running anywhere (no frees then): emptyCache() takes it later.
inline void Backend::maybe_destroy(PrivatePool *pp) {
  if (pp->use_count > 0 || pp->live > 0) return;
  if (capture_running_locked()) return;
  c10::DeviceIndex device = pp->device;
  vram_pool_destroy(pp->pool);
  private_pools_.erase({device, pp->id});
  if (device_limit_[device].load()) refresh_default_limit_locked(device);
}

inline PrivatePool *Backend::capture_target(c10::DeviceIndex device, cudaStream_t stream) {
  std::lock_guard<std::mutex> g(mutex_);
  for (auto &c : capture_filters_)
    if (c.device == device && c.claims(stream)) return find_locked(device, c.id);
  return nullptr;
}

// Whether some stream captures a graph now, so that nothing may go back to the driver (a
// capture in CUDA's default mode refuses cudaFree and unmapping on every thread). An open
// entry whose stream no longer captures is a graph tree's or a MemPool's allocation
// context, or a capture that failed before it could end (its capture_end threw before
// releasing the entry): neither holds the memory of every other pool back.
inline bool Backend::capture_running_locked() {
  for (auto &c : capture_filters_) {
    if (!c.origin_known) return true;
    // No capture runs on the legacy default stream (PyTorch refuses one there), and asking
    // it while another stream captures is an implicit synchronisation CUDA refuses.
    if (c.origin == nullptr) continue;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(c.origin, &status) != cudaSuccess) {
      (void)cudaGetLastError();  // a query's failure is not left for PyTorch's next check
      return true;
    }
    if (status == cudaStreamCaptureStatusActive) return true;
  }
  return false;
}

inline std::vector<PoolCheckpoint::Block> Backend::live_blocks(vram_pool_t *pool) {
  std::vector<PoolCheckpoint::Block> out;
  vram_for_each_block(
      pool,
      [](void *user, void *ptr, size_t requested, size_t, vram_stream_t stream) {
        static_cast<std::vector<PoolCheckpoint::Block> *>(user)->push_back(
            {ptr, requested, static_cast<cudaStream_t>(stream)});
      },
      &out);
  return out;
}

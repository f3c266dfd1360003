// torch_backend.cpp - vramkit as PyTorch's CUDA allocator backend: c10's CUDAAllocator
// interface, the one PyTorch's own caching allocator implements, answered by the engine.
//
// Installed, it is what c10::cuda::CUDACachingAllocator::get() returns, so every path into
// PyTorch's allocator reaches vramkit: tensors and streams, CUDA graphs and their private
// pools (torch.cuda.graph, graph trees, torch.compile(mode="reduce-overhead"),
// torch.cuda.MemPool), torch.cuda.memory_stats() and everything built on it, memory history
// and snapshots through PyTorch's own _record_memory_history / _snapshot, the profiler's
// memory events, IPC handles for torch.multiprocessing, and out-of-memory as
// c10::OutOfMemoryError carrying vramkit's report.
//
// How the pieces map:
//   - each device's default pool is the engine's process-wide pool (what vramkit.memory_stats
//     reports), reached through libvramkit_torch so that the pluggable hooks and this
//     backend share one pool per device;
//   - each private pool (a CUDA graph's or a MemPool's MempoolId_t) is an engine pool of its
//     own on the same source: a graph's memory is never handed to anyone else while the
//     graph may replay, and releasing the pool gives all of it back at once;
//   - a graph-tree checkpoint is the list of live blocks of a private pool; restoring it
//     frees what is live and claims every listed block again at its address
//     (vram_malloc_at);
//   - history is the engine's event ring, with PyTorch's context objects (its captured
//     stacks) kept here by the context ids the engine stores.
//
// Built against the installed torch at install() time (vramkit/_torch_build.py), because c10's
// C++ ABI is torch's own. Everything here runs on PyTorch's threads, with or without the GIL:
// no Python, and no exception leaves a deleter.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <c10/core/impl/GPUTrace.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include "vramkit.h"

extern "C" {
int vramkit_torch_pool(int device, vram_pool_t **pool);
void vramkit_torch_compose_message(char *msg, size_t cap, int status, int device, size_t size,
                                   vram_pool_t *pool);
int vramkit_torch_oom_head(char *msg, size_t cap, int device, size_t size, size_t total,
                           size_t free_bytes, size_t limit, size_t allocated,
                           size_t private_allocated, size_t reserved);
}

namespace vramkit_torch {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
using c10::MempoolId_t;
using c10::CachingDeviceAllocator::BlockInfo;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::SegmentInfo;
using c10::CachingDeviceAllocator::TraceEntry;

// Devices with a deleter of their own (below); a process sees at most this many GPUs.
constexpr int kMaxDevices = 64;
constexpr size_t kAlign = 512;  // the engine's block unit
constexpr size_t kMessageCap = 8192;
constexpr size_t kOneExaByte = size_t{1} << 60;

// The last failure inside a deleter, which cannot throw: read by vramkit.torch.
std::atomic<int> g_last_status{0};

c10::Device cuda_device(c10::DeviceIndex d) { return c10::Device(c10::DeviceType::CUDA, d); }

uint64_t unix_us() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// A private pool: a CUDA graph's, a graph tree's or a MemPool's.
struct PrivatePool {
  MempoolId_t id;
  c10::DeviceIndex device = 0;
  vram_pool_t *pool = nullptr;
  int use_count = 0;
  size_t live = 0;  // blocks handed out and not yet freed
};

// A graph-tree checkpoint: the live blocks of one private pool, by address.
struct PoolCheckpoint : cca::AllocatorState {
  struct Block {
    void *ptr;
    size_t requested;
    cudaStream_t stream;
  };
  MempoolId_t id;
  c10::DeviceIndex device = 0;
  std::vector<Block> blocks;
};

#include "torch_backend_stats.hpp"

// A 'snapshot' entry of the history: when a _snapshot() was taken, and the device's active
// bytes then.
struct SnapshotMark {
  uint64_t time_us;
  size_t active;
};

class Backend;
Backend *g_backend = nullptr;  // the one installed instance; lives for the process

void free_default_on(int device, void *ptr);
template <int D>
void free_default(void *ptr) {
  free_default_on(D, ptr);
}
template <size_t... I>
constexpr std::array<c10::DeleterFnPtr, sizeof...(I)> default_deleters(std::index_sequence<I...>) {
  return {&free_default<static_cast<int>(I)>...};
}
// One deleter per device, so that freeing a tensor needs no lookup to find its pool.
constexpr auto kDefaultDeleters = default_deleters(std::make_index_sequence<kMaxDevices>{});
void free_private(void *ptr);
void free_any(void *ptr);

class Backend final : public cca::CUDAAllocator {
 public:
  using cca::CUDAAllocator::recordStream;

  // ---- allocation -------------------------------------------------------------------
  c10::DataPtr allocate(size_t n) override {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    if (n == 0) return {nullptr, nullptr, deleter_of(device, false), cuda_device(device)};
    bool is_private = false;
    void *ptr = malloc_on(device, n, stream, &is_private);
    return {ptr, ptr, deleter_of(device, is_private), cuda_device(device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_any; }

  void *raw_alloc(size_t n) override {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return raw_alloc_with_stream(n, c10::cuda::getCurrentCUDAStream(device).stream());
  }

  void *raw_alloc_with_stream(size_t n, cudaStream_t stream) override {
    if (n == 0) return nullptr;
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    bool is_private = false;
    return malloc_on(device, n, stream, &is_private);
  }

  void raw_delete(void *ptr) override { free_any(ptr); }

  void copy_data(void *dest, const void *src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  // The one allocation path: a private pool if a capture or MemPool context on this device
  // claims the stream, else the device's default pool.
  void *malloc_on(c10::DeviceIndex device, size_t n, cudaStream_t stream, bool *is_private) {
    TORCH_CHECK(device >= 0 && device < kMaxDevices, "vramkit: CUDA device ", device,
                " is beyond the ", kMaxDevices, " devices vramkit serves");
    // PyTorch refuses these before any figure, in these words; so does vramkit.
    TORCH_CHECK_WITH(OutOfMemoryError, n < kOneExaByte,
                     "CUDA out of memory. Tried to allocate more than 1EB memory.");
    PrivatePool *pp = nullptr;
    bool capturing = captures_[device].load(std::memory_order_acquire) > 0;
    if (capturing) pp = capture_target(device, stream);
    vram_pool_t *pool = pp ? pp->pool : used_[device].load(std::memory_order_acquire);
    if (!pool) pool = default_pool(device);
    void *ptr = nullptr;
    int rc;
    if (capturing) {
      // A capture in CUDA's default (global) mode refuses cuMemAlloc on any thread; the
      // engine may need a segment, which is safe here: relax the mode for this thread.
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      bool relaxed = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
      rc = vram_malloc(pool, n, static_cast<vram_stream_t>(stream), &ptr);
      if (relaxed) cudaThreadExchangeStreamCaptureMode(&mode);
    } else {
      rc = vram_malloc(pool, n, static_cast<vram_stream_t>(stream), &ptr);
    }
    if (rc != VRAM_OK) fail(device, n, pool, rc);
    *is_private = pp != nullptr;
    if (pp) {
      std::lock_guard<std::mutex> g(mutex_);
      private_blocks_[ptr] = pp;
      pp->live++;
    }
    note_alloc(device, ptr, n, stream, pool);
    return ptr;
  }

  c10::DeleterFnPtr deleter_of(c10::DeviceIndex device, bool is_private) const {
    if (is_private) return &free_private;
    if (device < 0 || device >= kMaxDevices) return &free_any;  // size 0: nothing to free
    return kDefaultDeleters[device];
  }

  vram_pool_t *default_pool(c10::DeviceIndex device) {
    vram_pool_t *pool = nullptr;
    int rc = vramkit_torch_pool(device, &pool);
    if (rc != VRAM_OK) fail(device, 0, nullptr, rc);
    note_device(device, pool);
    return pool;
  }

  [[noreturn]] void fail(c10::DeviceIndex device, size_t n, vram_pool_t *pool, int rc) {
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
  void oom_message(char *message, size_t cap, c10::DeviceIndex device, size_t n,
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

  // Frees: the deleters land here with the pool already known.
  void free_in(c10::DeviceIndex device, vram_pool_t *pool, void *ptr) {
    bool watched = profiling_or_tracing();
    size_t size = 0;
    cudaStream_t stream = nullptr;
    if (watched) {
      size_t requested = 0;
      vram_stream_t s = nullptr;
      if (vram_block_info(pool, ptr, &requested, &s) == VRAM_OK) {
        size = (requested + kAlign - 1) & ~(kAlign - 1);
        stream = static_cast<cudaStream_t>(s);
      }
    }
    int rc = vram_free(pool, ptr);
    if (rc != VRAM_OK) {
      g_last_status.store(rc);
      return;
    }
    if (watched) note_free(device, ptr, size, stream, pool);
  }

  void free_private_block(void *ptr) {
    PrivatePool *pp = nullptr;
    {
      std::lock_guard<std::mutex> g(mutex_);
      auto it = private_blocks_.find(ptr);
      if (it == private_blocks_.end()) {
        g_last_status.store(VRAM_EFOREIGN);
        return;
      }
      pp = it->second;
      // A block used on another stream during a capture goes back when the capture ends.
      if (deferred_uses_.count(ptr) && captures_[pp->device].load() > 0) {
        deferred_frees_.push_back(ptr);
        return;
      }
      deferred_uses_.erase(ptr);
      private_blocks_.erase(it);
    }
    free_in(pp->device, pp->pool, ptr);
    std::lock_guard<std::mutex> g(mutex_);
    pp->live--;
    maybe_destroy(pp);
  }

  // A pointer with no deleter to say where it lives (raw_delete, raw_deleter()).
  void free_anywhere(void *ptr) {
    if (!ptr) return;
    bool is_private;
    {
      std::lock_guard<std::mutex> g(mutex_);
      is_private = private_blocks_.count(ptr) != 0;
    }
    if (is_private) return free_private_block(ptr);
    for (int d = 0; d < kMaxDevices; d++) {
      vram_pool_t *pool = used_[d].load(std::memory_order_acquire);
      if (pool && vram_segment_of(pool, ptr, nullptr, nullptr) == VRAM_OK)
        return free_in(static_cast<c10::DeviceIndex>(d), pool, ptr);
    }
    g_last_status.store(VRAM_EFOREIGN);
  }

  void free_on_device(int device, void *ptr) {
    vram_pool_t *pool = used_[device].load(std::memory_order_acquire);
    if (!pool) {
      g_last_status.store(VRAM_EFOREIGN);
      return;
    }
    free_in(static_cast<c10::DeviceIndex>(device), pool, ptr);
  }

  // ---- streams ----------------------------------------------------------------------
  void recordStream(const c10::DataPtr &ptr, c10::cuda::CUDAStream stream) override {
    void *p = ptr.get();
    if (!p) return;
    auto deleter = ptr.get_deleter();
    vram_pool_t *pool = nullptr;
    if (deleter == &free_private) {
      std::lock_guard<std::mutex> g(mutex_);
      auto it = private_blocks_.find(p);
      if (it == private_blocks_.end()) return;
      if (captures_[it->second->device].load() > 0) {
        // No events may be recorded into a capture: the block waits for the capture's end.
        deferred_uses_.insert(p);
        return;
      }
      pool = it->second->pool;
    } else {
      int d = device_of_deleter(deleter);
      if (d < 0) return;  // not ours (shared from another process): nothing to order
      pool = used_[d].load();
    }
    if (!pool) return;
    int rc = vram_record_stream(pool, p, static_cast<vram_stream_t>(stream.stream()));
    if (rc != VRAM_OK) g_last_status.store(rc);
  }

  static int device_of_deleter(c10::DeleterFnPtr deleter) {
    for (int d = 0; d < kMaxDevices; d++)
      if (kDefaultDeleters[d] == deleter) return d;
    return -1;
  }

  // ---- private pools: CUDA graphs, graph trees, MemPool ------------------------------
  void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t id,
                           std::function<bool(cudaStream_t)> filter) override {
    std::lock_guard<std::mutex> g(mutex_);
    for (auto &c : capture_filters_)
      TORCH_CHECK(!(c.first == id && c.second.first == device),
                  "vramkit: beginAllocateToPool: already allocating to pool (", id.first, ", ",
                  id.second, ")");
    incref_locked(device, id);
    capture_filters_.push_back({id, {device, std::move(filter)}});
    captures_[device].fetch_add(1);
  }

  void endAllocateToPool(c10::DeviceIndex device, MempoolId_t id) override {
    std::vector<void *> deferred;
    {
      std::lock_guard<std::mutex> g(mutex_);
      auto it = std::find_if(capture_filters_.begin(), capture_filters_.end(), [&](auto &c) {
        return c.first == id && c.second.first == device;
      });
      TORCH_CHECK(it != capture_filters_.end(), "vramkit: endAllocateToPool: pool (", id.first,
                  ", ", id.second, ") is not being allocated to");
      capture_filters_.erase(it);
      if (captures_[device].fetch_sub(1) == 1) deferred.swap(deferred_frees_);
    }
    for (void *p : deferred) free_private_block(p);
  }

  void releasePool(c10::DeviceIndex device, MempoolId_t id) override {
    std::lock_guard<std::mutex> g(mutex_);
    PrivatePool *pp = find_locked(device, id);
    TORCH_CHECK(pp, "vramkit: releasePool: no pool (", id.first, ", ", id.second, ")");
    TORCH_INTERNAL_ASSERT(pp->use_count > 0);
    pp->use_count--;
    maybe_destroy(pp);
  }

  int getPoolUseCount(c10::DeviceIndex device, MempoolId_t id) override {
    std::lock_guard<std::mutex> g(mutex_);
    PrivatePool *pp = find_locked(device, id);
    return pp ? pp->use_count : 0;
  }

  void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override {
    TORCH_CHECK(!allocator || allocator.get() == this,
                "vramkit: a torch.cuda.MemPool with an allocator of its own cannot be used "
                "while vramkit is PyTorch's allocator; create it without `allocator`");
    std::lock_guard<std::mutex> g(mutex_);
    incref_locked(device, id);
  }

  void setUseOnOOM(c10::DeviceIndex, MempoolId_t, bool use_on_oom) override {
    TORCH_CHECK(!use_on_oom, "vramkit: MemPool(use_on_oom=True) is not supported: a request "
                             "the default pool cannot serve fails with vramkit's report");
  }

  void setNoSplit(c10::DeviceIndex, MempoolId_t) override {
    TORCH_CHECK(false, "vramkit: MemPool(no_split=True) is not supported");
  }

  bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t id,
                                const std::unordered_set<void *> &expected) override {
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

  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          MempoolId_t id) override {
    std::lock_guard<std::mutex> g(mutex_);
    PrivatePool *pp = find_locked(device, id);
    TORCH_CHECK(pp, "vramkit: getCheckpointState: no pool (", id.first, ", ", id.second, ")");
    auto state = std::make_shared<PoolCheckpoint>();
    state->id = id;
    state->device = device;
    state->blocks = live_blocks(pp->pool);
    return state;
  }

  cca::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> state) override {
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
      delta.dataptrs_allocd.emplace_back(b.ptr, b.ptr, &free_private, cuda_device(device));
    }
    return delta;
  }

  // ---- statistics ---------------------------------------------------------------------
  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    PoolSums sums;
    AccumulatedBase base;
    {
      std::lock_guard<std::mutex> g(mutex_);
      for (vram_pool_t *pool : pools_of_locked(device)) {
        vram_stats_t s{};
        vram_split_stats_t k{};
        if (vram_get_stats(pool, &s) == VRAM_OK && vram_get_split_stats(pool, &k) == VRAM_OK)
          add_pool_sums(&sums, s, k);
      }
      base = bases_[device];
    }
    return device_stats(sums, base);
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    DeviceStats now = getDeviceStats(device);
    std::lock_guard<std::mutex> g(mutex_);
    move_bases(&bases_[device], now);
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    std::lock_guard<std::mutex> g(mutex_);
    for (vram_pool_t *pool : pools_of_locked(device)) vram_reset_peak_stats(pool);
  }

  void cacheInfo(c10::DeviceIndex device, size_t *largest) override {
    vram_pool_t *pool = default_pool(device);
    if (*largest == 0) {
      size_t total = 0;
      vram_mem_get_info(pool, largest, &total);
    }
    vram_stats_t s{};
    if (vram_get_stats(pool, &s) == VRAM_OK) *largest = std::max(*largest, s.largest_free_block);
  }

  // ---- cache and limits --------------------------------------------------------------
  void emptyCache(MempoolId_t id) override {
    std::lock_guard<std::mutex> g(mutex_);
    // No memory may go back to the driver while a stream captures a graph.
    if (!capture_filters_.empty()) return;
    std::vector<PrivatePool *> unused;
    for (auto &entry : private_pools_) {
      PrivatePool *pp = entry.second.get();
      if (id == MempoolId_t{0, 0} ? pp->use_count > 0 : pp->id != id) continue;
      if (pp->use_count == 0 && pp->live == 0) unused.push_back(pp);  // kept by a capture
      else vram_empty_cache(pp->pool);
    }
    for (PrivatePool *pp : unused) maybe_destroy(pp);
    if (id == MempoolId_t{0, 0})
      for (int d = 0; d < kMaxDevices; d++)
        if (vram_pool_t *pool = used_[d].load()) vram_empty_cache(pool);
  }

  double getMemoryFraction(c10::DeviceIndex device) override {
    std::lock_guard<std::mutex> g(mutex_);
    auto it = fractions_.find(device);
    return it == fractions_.end() ? 1.0 : it->second;
  }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK(fraction >= 0 && fraction <= 1, "vramkit: invalid memory fraction ", fraction,
                " (0 to 1)");
    vram_pool_t *pool = default_pool(device);
    // 0 is "no memory at all" to PyTorch but "no limit" to the engine: ask for one byte.
    int rc = vram_set_limit(pool, fraction == 0.0 ? 1 : 0, fraction);
    TORCH_CHECK(rc == VRAM_OK, "vramkit: set_per_process_memory_fraction: ", vram_strerror(rc));
    std::lock_guard<std::mutex> g(mutex_);
    fractions_[device] = fraction;
  }

  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override {
    return {};
  }

  void *getBaseAllocation(void *ptr, size_t *size) override {
    void *base = nullptr;
    vram_pool_t *pool = owner_of(ptr);
    TORCH_CHECK(pool && vram_segment_of(pool, ptr, &base, size) == VRAM_OK,
                "vramkit: getBaseAllocation: ", ptr, " is not a live block of vramkit's");
    return base;
  }

  // ---- snapshots and history ---------------------------------------------------------
  cca::SnapshotInfo snapshot(MempoolId_t id, bool include_traces) override {
    cca::SnapshotInfo info;
    std::vector<std::pair<vram_pool_t *, std::pair<c10::DeviceIndex, MempoolId_t>>> pools;
    std::lock_guard<std::mutex> g(mutex_);  // held throughout: no pool goes meanwhile
    if (id == MempoolId_t{0, 0})
      for (int d = 0; d < kMaxDevices; d++)
        if (vram_pool_t *pool = used_[d].load())
          pools.push_back({pool, {static_cast<c10::DeviceIndex>(d), MempoolId_t{0, 0}}});
    for (auto &entry : private_pools_)
      if (id == MempoolId_t{0, 0} || entry.second->id == id)
        pools.push_back({entry.second->pool, {entry.second->device, entry.second->id}});
    std::vector<std::vector<TraceEntry>> traces;
    for (auto &p : pools) append_segments(p.first, p.second.first, p.second.second, &info.segments);
    note_snapshot(info.segments);
    for (auto &p : pools)
      if (include_traces && trace_wanted_.load())
        append_trace(p.first, p.second.first, p.second.second, &traces);
    if (include_traces && trace_wanted_.load()) append_snapshot_marks(&traces);
    for (auto &device_trace : traces)
      std::stable_sort(device_trace.begin(), device_trace.end(),
                       [](const TraceEntry &a, const TraceEntry &b) {
                         return a.time_.t_ < b.time_.t_;
                       });
    info.device_traces = std::move(traces);
    info.config_metadata.garbage_collection_threshold = 0.0;
    info.config_metadata.max_split_size = SIZE_MAX;
    info.config_metadata.expandable_segments = false;
    info.config_metadata.last_allocator_settings = "vramkit";
    return info;
  }

  void recordHistory(bool enabled, cca::CreateContextFn recorder, size_t max_entries,
                     RecordContext when, bool clear, const std::vector<std::string> &) override {
    std::lock_guard<std::mutex> g(mutex_);
    std::lock_guard<std::mutex> h(history_mutex_);
    recording_ = enabled;
    recorder_ = enabled && when != RecordContext::NEVER ? recorder : nullptr;
    max_entries_ = max_entries;
    trace_wanted_.store(enabled && when != RecordContext::STATE);
    if (clear || enabled) {
      contexts_.clear();
      snapshot_marks_.clear();
    }
    for (vram_pool_t *pool : all_pools_locked()) start_or_stop_history(pool);
    vram_set_context_fn(recorder_ ? &context_of_this_allocation : nullptr, this);
  }

  bool isHistoryEnabled() override {
    std::lock_guard<std::mutex> g(history_mutex_);
    return recording_;
  }

  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> g(mutex_);
    oom_observers_.push_back(std::move(observer));
  }

  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override {
    std::lock_guard<std::mutex> g(mutex_);
    trackers_.push_back(std::move(tracker));
    has_trackers_.store(true);
  }

  // ---- IPC -------------------------------------------------------------------------
  cca::ShareableHandle shareIpcHandle(void *ptr) override {
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

  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
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

  // ---- devices ---------------------------------------------------------------------
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    {
      c10::cuda::CUDAGuard guard(dev);
      cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
      else C10_CUDA_CHECK(err);
    }
    // Virtual-memory pools map their granules for the peer too (now and later).
    int rc = vram_enable_peer_access(default_pool(dev_to_access), dev);
    TORCH_CHECK(rc == VRAM_OK || rc == VRAM_EUNSUPPORTED, "vramkit: enablePeerAccess: ",
                vram_strerror(rc));
  }

  cudaError_t memcpyAsync(void *dst, int dst_device, const void *src, int src_device,
                          size_t count, cudaStream_t stream, bool p2p_enabled) override {
    if (p2p_enabled || dst_device == src_device)
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
  }

  // ---- the rest of the interface ---------------------------------------------------
  void init(int) override {}
  bool initialized() override { return true; }
  void enable(bool value) override { enabled_ = value; }
  bool isEnabled() const override { return enabled_; }
  std::string name() override { return "vramkit"; }
  void setUserMetadata(const std::string &metadata) override { user_metadata_ = metadata; }
  std::string getUserMetadata() override { return user_metadata_; }

  // For the deleters.
  PrivatePool *private_owner(void *ptr) {
    std::lock_guard<std::mutex> g(mutex_);
    auto it = private_blocks_.find(ptr);
    return it == private_blocks_.end() ? nullptr : it->second;
  }

 private:
  // ---- private pools ---------------------------------------------------------------
  PrivatePool *find_locked(c10::DeviceIndex device, MempoolId_t id) {
    auto it = private_pools_.find({device, id});
    return it == private_pools_.end() ? nullptr : it->second.get();
  }

  void incref_locked(c10::DeviceIndex device, MempoolId_t id) {
    PrivatePool *pp = find_locked(device, id);
    if (!pp) {
      vram_pool_t *dflt = default_pool(device);
      vram_options_t opts;
      vram_options_init(&opts);
      const char *why = nullptr;
      vram_options_from_env(&opts, &why);
      opts.device = device;
      opts.source = vram_pool_source(dflt);
      // A graph's pool keeps what it has: no memory may go back during a capture, and a
      // graph replays into the same addresses. Its limit is the device's, not the default
      // pool's.
      opts.limit_bytes = 0;
      opts.limit_fraction = 0;
      opts.preallocate_bytes = 0;
      opts.preallocate_fraction = 0;
      opts.release_threshold = SIZE_MAX;
      auto fresh = std::make_unique<PrivatePool>();
      fresh->id = id;
      fresh->device = device;
      int rc = vram_pool_create(&fresh->pool, &opts);
      TORCH_CHECK(rc == VRAM_OK, "vramkit: cannot create a private pool on device ", device,
                  ": ", vram_strerror(rc));
      {
        std::lock_guard<std::mutex> h(history_mutex_);
        start_or_stop_history(fresh->pool);
      }
      pp = fresh.get();
      private_pools_[{device, id}] = std::move(fresh);
    }
    pp->use_count++;
  }

  // A private pool nobody uses and nothing lives in goes back to the driver, unless a
  // capture is running anywhere (no frees then): emptyCache() takes it later.
  void maybe_destroy(PrivatePool *pp) {
    if (pp->use_count > 0 || pp->live > 0) return;
    if (!capture_filters_.empty()) return;
    vram_pool_destroy(pp->pool);
    private_pools_.erase({pp->device, pp->id});
  }

  PrivatePool *capture_target(c10::DeviceIndex device, cudaStream_t stream) {
    std::lock_guard<std::mutex> g(mutex_);
    for (auto &c : capture_filters_)
      if (c.second.first == device && c.second.second(stream))
        return find_locked(device, c.first);
    return nullptr;
  }

  static std::vector<PoolCheckpoint::Block> live_blocks(vram_pool_t *pool) {
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

  vram_pool_t *owner_of(void *ptr) {
    if (PrivatePool *pp = private_owner(ptr)) return pp->pool;
    for (int d = 0; d < kMaxDevices; d++) {
      vram_pool_t *pool = used_[d].load();
      if (pool && vram_segment_of(pool, ptr, nullptr, nullptr) == VRAM_OK) return pool;
    }
    return nullptr;
  }

  // The pools of a device PyTorch has used (none for another: asking creates nothing).
  // Under mutex_, which keeps private pools from being destroyed while they are read.
  std::vector<vram_pool_t *> pools_of_locked(c10::DeviceIndex device) {
    std::vector<vram_pool_t *> out;
    if (device >= 0 && device < kMaxDevices)
      if (vram_pool_t *pool = used_[device].load()) out.push_back(pool);
    for (auto &entry : private_pools_)
      if (entry.second->device == device) out.push_back(entry.second->pool);
    return out;
  }

  std::vector<vram_pool_t *> all_pools_locked() {
    std::vector<vram_pool_t *> out;
    for (int d = 0; d < kMaxDevices; d++)
      if (vram_pool_t *pool = used_[d].load()) out.push_back(pool);
    for (auto &entry : private_pools_) out.push_back(entry.second->pool);
    return out;
  }

  // ---- the default pools PyTorch used --------------------------------------------------
  void note_device(c10::DeviceIndex device, vram_pool_t *pool) {
    if (device < 0 || device >= kMaxDevices) return;
    if (used_[device].load(std::memory_order_relaxed) == pool) return;
    used_[device].store(pool, std::memory_order_release);
    std::lock_guard<std::mutex> h(history_mutex_);
    // A pool seen for the first time joins PyTorch's recording if one runs. Never stop
    // one here: vramkit.record_memory_history() may have started it before the first
    // allocation, the natural place in a script.
    if (recording_) start_or_stop_history(pool);
  }

  // ---- what watchers see: the profiler, the CUDA sanitizer, trace trackers -------------
  bool profiling_or_tracing() const {
    return c10::memoryProfilingEnabled() || c10::impl::GPUTrace::get_trace() ||
           has_trackers_.load(std::memory_order_relaxed);
  }

  void note_alloc(c10::DeviceIndex device, void *ptr, size_t n, cudaStream_t stream,
                  vram_pool_t *pool) {
    if (!profiling_or_tracing()) return;
    size_t size = (n + kAlign - 1) & ~(kAlign - 1);
    watchers(TraceEntry::ALLOC, device, ptr, static_cast<int64_t>(size), stream, pool);
    if (auto *interp = c10::impl::GPUTrace::get_trace())
      (*interp)->trace_gpu_memory_allocation(c10::kCUDA, reinterpret_cast<uintptr_t>(ptr));
  }

  void note_free(c10::DeviceIndex device, void *ptr, size_t size, cudaStream_t stream,
                 vram_pool_t *pool) {
    watchers(TraceEntry::FREE_REQUESTED, device, ptr, -static_cast<int64_t>(size), stream,
             pool);
    if (auto *interp = c10::impl::GPUTrace::get_trace())
      (*interp)->trace_gpu_memory_deallocation(c10::kCUDA, reinterpret_cast<uintptr_t>(ptr));
  }

  void watchers(TraceEntry::Action action, c10::DeviceIndex device, void *ptr, int64_t delta,
                cudaStream_t stream, vram_pool_t *pool) {
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

  // ---- history -----------------------------------------------------------------------
  // Called by the engine at each allocation while contexts are recorded, outside its lock.
  static uint64_t context_of_this_allocation(void *user) {
    auto *self = static_cast<Backend *>(user);
    cca::CreateContextFn recorder;
    {
      std::lock_guard<std::mutex> g(self->history_mutex_);
      recorder = self->recorder_;
    }
    if (!recorder) return 0;
    std::shared_ptr<c10::GatheredContext> context = recorder();
    uint64_t id;
    bool crowded;
    {
      std::lock_guard<std::mutex> g(self->history_mutex_);
      id = ++self->next_context_;
      self->contexts_[id] = std::move(context);
      crowded = self->contexts_.size() > 2 * self->max_entries_ + 65536;
    }
    if (crowded) self->prune_contexts(id);
    return id;
  }

  // Keep the contexts that the rings and the live blocks still name (and the one just
  // made, not yet in any ring). Run with no lock held: it reads every pool.
  void prune_contexts(uint64_t newest) {
    std::unordered_set<uint64_t> named{newest};
    std::lock_guard<std::mutex> g(mutex_);
    for (vram_pool_t *pool : all_pools_locked()) {
      for (auto &e : read_history(pool)) named.insert(e.context);
      for (auto &b : read_blocks(pool)) named.insert(b.context);
    }
    std::lock_guard<std::mutex> h(history_mutex_);
    for (auto it = contexts_.begin(); it != contexts_.end();)
      it = named.count(it->first) || it->first > newest ? std::next(it) : contexts_.erase(it);
  }

  void start_or_stop_history(vram_pool_t *pool) {
    if (recording_)
      vram_history_start(pool, max_entries_, recorder_ ? VRAM_HISTORY_CONTEXTS : 0u);
    else
      vram_history_stop(pool);
  }

  std::shared_ptr<c10::GatheredContext> context(uint64_t id) {
    if (!id) return nullptr;
    std::lock_guard<std::mutex> g(history_mutex_);
    auto it = contexts_.find(id);
    return it == contexts_.end() ? nullptr : it->second;
  }

  static std::vector<vram_event_t> read_history(vram_pool_t *pool) {
    size_t total = 0;
    if (vram_history_read(pool, nullptr, 0, nullptr, &total, nullptr) != VRAM_OK) return {};
    std::vector<vram_event_t> events(total + 1024);  // room for events recorded meanwhile
    size_t count = 0;
    vram_history_read(pool, events.data(), events.size(), &count, &total, nullptr);
    events.resize(count);
    return events;
  }

  static std::vector<vram_snapshot_block_t> read_blocks(vram_pool_t *pool) {
    std::vector<vram_snapshot_segment_t> segments;
    std::vector<vram_snapshot_block_t> blocks;
    read_layout(pool, &segments, &blocks);
    return blocks;
  }

  static void read_layout(vram_pool_t *pool, std::vector<vram_snapshot_segment_t> *segments,
                          std::vector<vram_snapshot_block_t> *blocks) {
    for (;;) {
      size_t n_segments = 0, n_blocks = 0;
      if (vram_snapshot(pool, segments->data(), segments->size(), &n_segments, blocks->data(),
                        blocks->size(), &n_blocks) != VRAM_OK)
        return;
      if (n_segments <= segments->size() && n_blocks <= blocks->size()) {
        segments->resize(n_segments);
        blocks->resize(n_blocks);
        return;
      }
      segments->resize(n_segments + 16);
      blocks->resize(n_blocks + 256);
    }
  }

  void append_segments(vram_pool_t *pool, c10::DeviceIndex device, MempoolId_t owner,
                       std::vector<SegmentInfo> *out) {
    std::vector<vram_snapshot_segment_t> segments;
    std::vector<vram_snapshot_block_t> blocks;
    read_layout(pool, &segments, &blocks);
    for (auto &s : segments) {
      SegmentInfo seg;
      seg.device = device;
      seg.address = s.addr;
      seg.total_size = s.size;
      seg.stream = reinterpret_cast<void *>(s.stream);
      seg.is_large = s.size != (size_t{2} << 20);  // the engine's small segments are 2 MiB
      seg.is_expandable = s.is_expandable != 0;
      seg.owner_private_pool_id = owner;
      for (uint64_t i = s.first_block; i < s.first_block + s.n_blocks; i++) {
        const vram_snapshot_block_t &b = blocks[i];
        BlockInfo block;
        block.size = b.size;
        block.requested_size = b.requested;
        block.allocated = b.state == VRAM_SNAPSHOT_ACTIVE_ALLOCATED;
        block.active = b.state != VRAM_SNAPSHOT_INACTIVE;
        block.context_when_allocated = context(b.context);
        if (block.allocated) seg.allocated_size += b.size;
        if (block.active) seg.active_size += b.size;
        seg.requested_size += b.requested;
        seg.blocks.push_back(std::move(block));
      }
      out->push_back(std::move(seg));
    }
  }

  // A _snapshot() while history records: one 'snapshot' entry per device it described,
  // sized by the device's active bytes, as PyTorch's allocator records each call.
  void note_snapshot(const std::vector<SegmentInfo> &segments) {
    std::map<c10::DeviceIndex, size_t> active;
    for (auto &seg : segments) active[static_cast<c10::DeviceIndex>(seg.device)] += seg.active_size;
    std::lock_guard<std::mutex> h(history_mutex_);
    if (!recording_) return;
    for (auto &a : active) {
      auto &marks = snapshot_marks_[a.first];
      marks.push_back({unix_us(), a.second});
      if (max_entries_ && marks.size() > max_entries_) marks.erase(marks.begin());
    }
  }

  void append_snapshot_marks(std::vector<std::vector<TraceEntry>> *out) {
    std::lock_guard<std::mutex> h(history_mutex_);
    for (auto &d : snapshot_marks_) {
      if (out->size() <= static_cast<size_t>(d.first)) out->resize(d.first + 1);
      for (auto &m : d.second) {
        TraceEntry entry(TraceEntry::SNAPSHOT, d.first, 0, m.active, nullptr, MempoolId_t{0, 0},
                         0);
        entry.time_.t_ = static_cast<time_t>(m.time_us);
        (*out)[d.first].push_back(std::move(entry));
      }
    }
  }

  void append_trace(vram_pool_t *pool, c10::DeviceIndex device, MempoolId_t owner,
                    std::vector<std::vector<TraceEntry>> *out) {
    // The engine stamps CLOCK_MONOTONIC microseconds; PyTorch's files carry Unix ones.
    int64_t offset = static_cast<int64_t>(unix_us()) -
                     std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::steady_clock::now().time_since_epoch())
                         .count();
    if (out->size() <= static_cast<size_t>(device)) out->resize(device + 1);
    for (auto &e : read_history(pool)) {
      TraceEntry::Action action;
      switch (e.kind) {
        case VRAM_EVENT_ALLOC: action = TraceEntry::ALLOC; break;
        case VRAM_EVENT_FREE_REQUESTED: action = TraceEntry::FREE_REQUESTED; break;
        case VRAM_EVENT_FREE_COMPLETED: action = TraceEntry::FREE_COMPLETED; break;
        case VRAM_EVENT_SEGMENT_ALLOC: action = TraceEntry::SEGMENT_ALLOC; break;
        case VRAM_EVENT_SEGMENT_FREE: action = TraceEntry::SEGMENT_FREE; break;
        case VRAM_EVENT_SEGMENT_MAP: action = TraceEntry::SEGMENT_MAP; break;
        case VRAM_EVENT_SEGMENT_UNMAP: action = TraceEntry::SEGMENT_UNMAP; break;
        case VRAM_EVENT_OOM: action = TraceEntry::OOM; break;
        // The engine notes every layout read (pruning, vramkit's own tools, one per pool);
        // PyTorch one per device and _snapshot() call: those are snapshot_marks_.
        default: continue;  // nor have empty_cache and annotations a PyTorch action
      }
      TraceEntry entry(action, device, e.addr, e.size, reinterpret_cast<void *>(e.stream), owner,
                       0, context(e.context));
      entry.time_.t_ = static_cast<time_t>(static_cast<int64_t>(e.time_us) + offset);
      (*out)[device].push_back(std::move(entry));
    }
  }

  std::mutex mutex_;  // private pools, captures, observers, trackers, fractions
  std::map<std::pair<c10::DeviceIndex, MempoolId_t>, std::unique_ptr<PrivatePool>> private_pools_;
  std::unordered_map<void *, PrivatePool *> private_blocks_;
  std::vector<std::pair<MempoolId_t,
                        std::pair<c10::DeviceIndex, std::function<bool(cudaStream_t)>>>>
      capture_filters_;
  std::unordered_set<void *> deferred_uses_;  // used on another stream during a capture
  std::vector<void *> deferred_frees_;
  std::map<c10::DeviceIndex, AccumulatedBase> bases_;
  std::map<c10::DeviceIndex, double> fractions_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  std::vector<cca::AllocatorTraceTracker> trackers_;
  std::atomic<bool> has_trackers_{false};
  std::atomic<int> captures_[kMaxDevices] = {};
  std::atomic<vram_pool_t *> used_[kMaxDevices] = {};

  std::mutex history_mutex_;  // what follows
  bool recording_ = false;
  std::atomic<bool> trace_wanted_{false};
  cca::CreateContextFn recorder_ = nullptr;
  size_t max_entries_ = 0;
  uint64_t next_context_ = 0;
  std::unordered_map<uint64_t, std::shared_ptr<c10::GatheredContext>> contexts_;
  std::map<c10::DeviceIndex, std::vector<SnapshotMark>> snapshot_marks_;

  std::mutex ipc_mutex_;
  std::map<std::string, std::weak_ptr<void>> ipc_opened_;

  bool enabled_ = true;
  std::string user_metadata_;
};

void free_default_on(int device, void *ptr) {
  if (ptr) g_backend->free_on_device(device, ptr);
}
void free_private(void *ptr) {
  if (ptr) g_backend->free_private_block(ptr);
}
void free_any(void *ptr) { g_backend->free_anywhere(ptr); }

}  // namespace
}  // namespace vramkit_torch

#define VRAMKIT_TORCH_EXPORT extern "C" __attribute__((visibility("default")))

// Make vramkit PyTorch's CUDA allocator. 0 on success; otherwise -1 with PyTorch's reason
// in `message` (it refuses once its own allocator has been used).
VRAMKIT_TORCH_EXPORT int vramkit_torch_backend_install(char *message, size_t cap) {
  using vramkit_torch::g_backend;
  // Immortal, as PyTorch's own allocator is: tensors are freed during and after the
  // interpreter's shutdown, and the history's contexts hold Python stacks that must not be
  // released once Python is gone. No destructor ever runs.
  static std::shared_ptr<vramkit_torch::Backend> backend;
  try {
    if (!backend) backend.reset(new vramkit_torch::Backend, [](vramkit_torch::Backend *) {});
    g_backend = backend.get();
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(backend);
    return 0;
  } catch (const std::exception &e) {
    if (message && cap) std::snprintf(message, cap, "%s", e.what());
    return -1;
  }
}

// The status of the last failure inside a deleter or record_stream (0 if none).
VRAMKIT_TORCH_EXPORT int vramkit_torch_backend_last_status(void) {
  return vramkit_torch::g_last_status.load();
}

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
// The class declares every member; those of one job apart are defined, out of line, in the
// parts included after it: torch_backend_pools.hpp (private pools and checkpoints),
// torch_backend_history.hpp (history and snapshots), torch_backend_ipc.hpp (IPC handles),
// torch_backend_oom.hpp (out of memory and other failures), torch_backend_streams.hpp
// (record_stream and the frees a capture defers), torch_backend_watchers.hpp
// (the profiler's, the CUDA sanitizer's and trace trackers' events); torch_backend_stats.hpp
// turns the engine's statistics into c10's DeviceStats.
//
// Built against the installed torch at install() time (vramkit/plug/_torch_build.py), because c10's
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
// The events a recording keeps when PyTorch asks for all of them (its default).
constexpr size_t kHistoryAll = VRAM_HISTORY_EVERY_EVENT;
constexpr size_t kOneExaByte = size_t{1} << 60;

// The last failure inside a deleter, which cannot throw: read by vramkit.torch.
std::atomic<int> g_last_status{0};

c10::Device cuda_device(c10::DeviceIndex d) { return c10::Device(c10::DeviceType::CUDA, d); }

uint64_t unix_us() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// A private pool: a CUDA graph's, a graph tree's or a MemPool's. A MemPool made with an
// allocator of its own keeps it here for as long as its engine pool lives, which takes
// every segment from it (torch_backend_pools.hpp).
struct PrivatePool {
  MempoolId_t id;
  c10::DeviceIndex device = 0;
  vram_pool_t *pool = nullptr;
  int use_count = 0;
  size_t live = 0;  // blocks handed out and not yet freed
  std::shared_ptr<cca::CUDAAllocator> allocator;  // MemPool(allocator=...), or null
  bool no_split = false;                          // MemPool(no_split=True)
  bool use_on_oom = false;  // MemPool(use_on_oom=True): what it holds serves the default
                            // pool's requests that would fail
};

// A stream's allocations steered into a private pool: by a CUDA graph's capture, a graph
// tree's pool manager, or a MemPool context. `origin` is the stream current when it began
// (a capture's own stream, which stays capturing until the capture ends), if known.
struct CaptureFilter {
  MempoolId_t id;
  c10::DeviceIndex device = 0;
  std::function<bool(cudaStream_t)> claims;
  cudaStream_t origin = nullptr;
  bool origin_known = false;
};

// A free a capture holds back (torch_backend_streams.hpp): the block's own stream and, if
// the graph may release it before the capture ends, the nodes its uses must precede.
struct DeferredFree {
  void *ptr = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<cudaGraphNode_t> marker;
  bool reusable = false;
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

// A 'snapshot' entry of the history: when a _snapshot() was taken, the device's active
// bytes then, and the user metadata in force.
struct SnapshotMark {
  uint64_t time_us;
  size_t active;
  std::string user_metadata;
};

// What the history keeps of one call by the context id the engine stores on its events:
// PyTorch's captured stack (null when none was asked for), the innermost compiled region
// being run and the user metadata then in force, as PyTorch's trace entries carry them.
struct CallContext {
  std::shared_ptr<c10::GatheredContext> frames;
  std::string compile_context;
  std::string user_metadata;
};

// What a trace entry says outside any compiled region, as PyTorch's say.
constexpr const char *kNoCompileContext = "N/A";

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
void free_any(void *ptr);

class Backend final : public cca::CUDAAllocator {
 public:
  // torch.cuda.memory_stats() has small_pool and large_pool rows: every pool made from here
  // on keeps them (the backend exists before the first CUDA tensor, so that is every pool
  // PyTorch uses).
  Backend() { vram_set_split_stats_default(1); }

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
    if (!enabled_.load(std::memory_order_relaxed) && !capturing) {
      *is_private = false;
      return malloc_uncached(device, n);
    }
    if (capturing) pp = capture_target(device, stream);
    if (pp && reusable_frees_.load(std::memory_order_relaxed) > 0) reclaim_in_capture(stream);
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
    if (rc == VRAM_ENOMEM && !pp && has_use_on_oom_.load(std::memory_order_relaxed)) {
      pp = malloc_on_oom_pools(device, n, stream, &ptr);
      if (pp) rc = VRAM_OK, pool = pp->pool;
    }
    if (rc != VRAM_OK) fail(device, n, pool, rc);
    *is_private = pp != nullptr;
    if (pp) {
      std::lock_guard<std::mutex> g(mutex_);
      private_blocks_[ptr] = pp;
      pp->live++;
      // What a private pool took counts against the device's fraction, as in PyTorch's
      // allocator: the default pool may take that much less.
      if (device_limit_[device].load(std::memory_order_relaxed))
        refresh_default_limit_locked(device);
    }
    note_alloc(device, ptr, n, stream, pool);
    return ptr;
  }

  c10::DeleterFnPtr deleter_of(c10::DeviceIndex device, bool is_private) const {
    // A private pool's block carries raw_deleter(): graph trees swap the deleter of a
    // graph's storages only where it is the allocator's raw_deleter(), as PyTorch's own
    // allocator gives every block.
    if (is_private) return &free_any;
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

  // Failures, out of memory above all, as c10 errors (torch_backend_oom.hpp).
  [[noreturn]] void fail(c10::DeviceIndex device, size_t n, vram_pool_t *pool, int rc);
  void oom_message(char *message, size_t cap, c10::DeviceIndex device, size_t n,
                   vram_pool_t *failed, size_t free_bytes, size_t total);

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

  // A private pool's block: its free waits while a capture may still use it on another
  // stream (torch_backend_streams.hpp).
  void free_private_block(void *ptr);

  // torch.cuda.caching_allocator_enable(False), as PyTorch's allocator serves it: each
  // request straight from cudaMalloc and each free straight to cudaFree, outside every
  // pool and statistic (how memory checkers see each block's true lifetime).
  // `device` is the current device (every caller asked it of CUDA); cudaFree needs none.
  void *malloc_uncached(c10::DeviceIndex device, size_t n) {
    void *ptr = nullptr;
    cudaError_t err = cudaMalloc(&ptr, n);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // a failed cudaMalloc leaves its error behind
      TORCH_CHECK_WITH(OutOfMemoryError, err != cudaErrorMemoryAllocation,
                       "CUDA out of memory. Tried to allocate ", n, " bytes on device ",
                       static_cast<int>(device), " with the caching allocator disabled "
                       "(torch.cuda.caching_allocator_enable(False)): cudaMalloc failed");
      TORCH_CHECK(false, "vramkit: cudaMalloc of ", n, " bytes on device ",
                  static_cast<int>(device), " with the caching allocator disabled: ",
                  cudaGetErrorString(err));
    }
    std::lock_guard<std::mutex> g(mutex_);
    uncached_.insert(ptr);
    uncached_count_.store(uncached_.size(), std::memory_order_relaxed);
    return ptr;
  }

  // True if ptr came from malloc_uncached (and is now given back).
  bool free_uncached(void *ptr) {
    {
      std::lock_guard<std::mutex> g(mutex_);
      auto it = uncached_.find(ptr);
      if (it == uncached_.end()) return false;
      uncached_.erase(it);
      uncached_count_.store(uncached_.size(), std::memory_order_relaxed);
    }
    if (cudaFree(ptr) != cudaSuccess) g_last_status.store(VRAM_EDRIVER);
    return true;
  }

  // A pointer with no deleter to say where it lives (raw_delete, raw_deleter()).
  void free_anywhere(void *ptr) {
    if (!ptr) return;
    if (uncached_count_.load(std::memory_order_relaxed) && free_uncached(ptr)) return;
    bool is_private;
    {
      std::lock_guard<std::mutex> g(mutex_);
      is_private = private_blocks_.count(ptr) != 0;
    }
    if (is_private) return free_private_block(ptr);
    c10::DeviceIndex device = 0;
    if (vram_pool_t *pool = default_pool_holding(ptr, &device)) return free_in(device, pool, ptr);
    g_last_status.store(VRAM_EFOREIGN);
  }

  // The default pool whose segments hold ptr, and its device; null if none does.
  vram_pool_t *default_pool_holding(void *ptr, c10::DeviceIndex *device) const {
    for (int d = 0; d < kMaxDevices; d++) {
      vram_pool_t *pool = used_[d].load(std::memory_order_acquire);
      if (pool && vram_segment_of(pool, ptr, nullptr, nullptr) == VRAM_OK) {
        *device = static_cast<c10::DeviceIndex>(d);
        return pool;
      }
    }
    return nullptr;
  }

  void free_on_device(int device, void *ptr) {
    if (uncached_count_.load(std::memory_order_relaxed) && free_uncached(ptr)) return;
    vram_pool_t *pool = used_[device].load(std::memory_order_acquire);
    if (!pool) {
      g_last_status.store(VRAM_EFOREIGN);
      return;
    }
    free_in(static_cast<c10::DeviceIndex>(device), pool, ptr);
  }

  // ---- streams ----------------------------------------------------------------------
  // torch_backend_streams.hpp: record_stream, and the uses a capture defers.
  void recordStream(const c10::DataPtr &ptr, c10::cuda::CUDAStream stream) override;
  // graph_capture_record_stream_reuse: a block freed during a capture after use on other
  // streams is reused in the capture once the graph orders those uses.
  void set_capture_reuse(bool on) { capture_reuse_.store(on); }

  static int device_of_deleter(c10::DeleterFnPtr deleter) {
    for (int d = 0; d < kMaxDevices; d++)
      if (kDefaultDeleters[d] == deleter) return d;
    return -1;
  }

  // ---- private pools: CUDA graphs, graph trees, MemPool (torch_backend_pools.hpp) ----
  void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, MempoolId_t id) override;
  void releasePool(c10::DeviceIndex device, MempoolId_t id) override;
  int getPoolUseCount(c10::DeviceIndex device, MempoolId_t id) override;
  void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override;
  void setUseOnOOM(c10::DeviceIndex, MempoolId_t, bool use_on_oom) override;
  void setNoSplit(c10::DeviceIndex, MempoolId_t) override;
  bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t id,
                                const std::unordered_set<void *> &expected) override;
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          MempoolId_t id) override;
  cca::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> state) override;

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
    if (capture_running_locked()) return;
    std::vector<PrivatePool *> unused;
    for (auto &entry : private_pools_) {
      PrivatePool *pp = entry.second.get();
      if (id == MempoolId_t{0, 0} ? pp->use_count > 0 : pp->id != id) continue;
      if (pp->use_count == 0 && pp->live == 0) unused.push_back(pp);  // kept by a capture
      else vram_empty_cache(pp->pool);
    }
    for (PrivatePool *pp : unused) maybe_destroy(pp);
    for (int d = 0; d < kMaxDevices; d++)
      if (device_limit_[d].load()) refresh_default_limit_locked(static_cast<c10::DeviceIndex>(d));
    if (id == MempoolId_t{0, 0})
      for (int d = 0; d < kMaxDevices; d++)
        if (vram_pool_t *pool = used_[d].load()) vram_empty_cache(pool);
  }

  double getMemoryFraction(c10::DeviceIndex device) override {
    std::lock_guard<std::mutex> g(mutex_);
    auto it = fractions_.find(device);
    return it == fractions_.end() ? default_fraction_ : it->second;
  }

  // The fraction PYTORCH_CUDA_ALLOC_CONF gave (install() configured the pools' limit from
  // it): what a device with no fraction set since answers.
  void set_default_fraction(double fraction) {
    std::lock_guard<std::mutex> g(mutex_);
    default_fraction_ = fraction;
    environment_fraction_.store(fraction < 1.0);
  }

  // PyTorch's fraction caps all the device's memory the process reserves, private pools'
  // too: the default pool's engine limit is the fraction's bytes less what the private
  // pools hold (refresh_default_limit_locked), kept so as they grow and go.
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK(fraction >= 0 && fraction <= 1, "vramkit: invalid memory fraction ", fraction,
                " (0 to 1)");
    vram_pool_t *pool = default_pool(device);
    // 0 is "no memory at all" to PyTorch but "no limit" to the engine: ask for one byte.
    int rc = vram_set_limit(pool, fraction == 0.0 ? 1 : 0, fraction);
    TORCH_CHECK(rc == VRAM_OK, "vramkit: set_per_process_memory_fraction: ", vram_strerror(rc));
    vram_stats_t s{};
    bool counted = fraction < 1.0 && vram_get_stats(pool, &s) == VRAM_OK && s.limit_bytes > 0;
    std::lock_guard<std::mutex> g(mutex_);
    fractions_[device] = fraction;
    device_limit_[device].store(counted ? s.limit_bytes : 0);
    if (counted) refresh_default_limit_locked(device);
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

  // ---- snapshots and history (torch_backend_history.hpp) ------------------------------
  cca::SnapshotInfo snapshot(MempoolId_t id, bool include_traces) override;
  void recordHistory(bool enabled, cca::CreateContextFn recorder, size_t max_entries,
                     RecordContext when, bool clear,
                     const std::vector<std::string> &skip_actions) override;
  bool isHistoryEnabled() override;
  void pushCompileContext(std::string &region) override;
  void popCompileContext() override;
  void setUserMetadata(const std::string &metadata) override;
  std::string getUserMetadata() override;

  // ---- observers (torch_backend_oom.hpp) and trace trackers (torch_backend_watchers.hpp) --
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override;
  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override;

  // ---- IPC (torch_backend_ipc.hpp) -------------------------------------------------
  cca::ShareableHandle shareIpcHandle(void *ptr) override;
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;

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
  void enable(bool value) override { enabled_.store(value); }
  bool isEnabled() const override { return enabled_.load(); }
  std::string name() override { return "vramkit"; }

  // For the deleters.
  PrivatePool *private_owner(void *ptr) {
    std::lock_guard<std::mutex> g(mutex_);
    auto it = private_blocks_.find(ptr);
    return it == private_blocks_.end() ? nullptr : it->second;
  }

 private:
  // ---- private pools (torch_backend_pools.hpp) ------------------------------------
  PrivatePool *find_locked(c10::DeviceIndex device, MempoolId_t id);
  void incref_locked(c10::DeviceIndex device, MempoolId_t id,
                     std::shared_ptr<cca::CUDAAllocator> allocator = nullptr);
  vram_pool_t *make_engine_pool(const PrivatePool &pp);
  void maybe_destroy(PrivatePool *pp);
  PrivatePool *malloc_on_oom_pools(c10::DeviceIndex device, size_t n, cudaStream_t stream,
                                   void **ptr);
  void refresh_default_limit_locked(c10::DeviceIndex device);
  PrivatePool *capture_target(c10::DeviceIndex device, cudaStream_t stream);
  bool capture_running_locked();
  void note_use_in_capture_locked(void *ptr, cudaStream_t stream);
  DeferredFree deferred_free_locked(PrivatePool *pp, void *ptr,
                                    const std::vector<cudaStream_t> &uses);
  void reclaim_in_capture(cudaStream_t stream);
  static std::vector<PoolCheckpoint::Block> live_blocks(vram_pool_t *pool);

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
    // The fraction PYTORCH_CUDA_ALLOC_CONF gave is the pool's limit already (install()
    // configured it): from here it caps the device's private pools too, as one set later.
    vram_stats_t s{};
    if (environment_fraction_.load() && !device_limit_[device].load() &&
        vram_get_stats(pool, &s) == VRAM_OK && s.limit_bytes > 0)
      device_limit_[device].store(s.limit_bytes);
    std::lock_guard<std::mutex> h(history_mutex_);
    // A pool seen for the first time joins PyTorch's recording if one runs. Never stop
    // one here: vramkit.record_memory_history() may have started it before the first
    // allocation, the natural place in a script.
    if (recording_) start_or_stop_history(pool);
  }

  // ---- what watchers see (torch_backend_watchers.hpp) --------------------------------
  bool profiling_or_tracing() const;
  void note_alloc(c10::DeviceIndex device, void *ptr, size_t n, cudaStream_t stream,
                  vram_pool_t *pool);
  void note_free(c10::DeviceIndex device, void *ptr, size_t size, cudaStream_t stream,
                 vram_pool_t *pool);
  void watchers(TraceEntry::Action action, c10::DeviceIndex device, void *ptr, int64_t delta,
                cudaStream_t stream, vram_pool_t *pool);

  // ---- history (torch_backend_history.hpp) ------------------------------------------
  static uint64_t context_of_this_allocation(void *user);
  void prune_contexts(uint64_t newest);
  int start_or_stop_history(vram_pool_t *pool);
  std::shared_ptr<c10::GatheredContext> context(uint64_t id);
  CallContext call_context(uint64_t id);
  static std::vector<vram_event_t> read_history(vram_pool_t *pool);
  static void read_layout(vram_pool_t *pool, std::vector<vram_snapshot_segment_t> *segments,
                          std::vector<vram_snapshot_block_t> *blocks);
  void append_segments(vram_pool_t *pool, c10::DeviceIndex device, MempoolId_t owner,
                       std::vector<SegmentInfo> *out);
  void note_snapshot(const std::vector<SegmentInfo> &segments);
  void append_snapshot_marks(std::vector<std::vector<TraceEntry>> *out);
  void append_trace(vram_pool_t *pool, c10::DeviceIndex device, MempoolId_t owner,
                    std::vector<std::vector<TraceEntry>> *out);

  std::mutex mutex_;  // private pools, captures, observers, trackers, fractions
  std::map<std::pair<c10::DeviceIndex, MempoolId_t>, std::unique_ptr<PrivatePool>> private_pools_;
  std::unordered_map<void *, PrivatePool *> private_blocks_;
  std::vector<CaptureFilter> capture_filters_;
  // Blocks used on other streams during a capture, with those streams; the frees that
  // wait for the graph or the capture's end, and how many of them the graph may release.
  std::unordered_map<void *, std::vector<cudaStream_t>> deferred_uses_;
  std::vector<DeferredFree> deferred_frees_;
  std::atomic<size_t> reusable_frees_{0};
  std::atomic<bool> capture_reuse_{false};
  std::map<c10::DeviceIndex, AccumulatedBase> bases_;
  std::map<c10::DeviceIndex, double> fractions_;
  // A fraction's bytes, what all the device's pools may reserve together (0: no fraction).
  std::atomic<size_t> device_limit_[kMaxDevices] = {};
  std::atomic<bool> environment_fraction_{false};  // PYTORCH_CUDA_ALLOC_CONF gave one
  std::atomic<bool> has_use_on_oom_{false};
  double default_fraction_ = 1.0;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  std::vector<cca::AllocatorTraceTracker> trackers_;
  std::atomic<bool> has_trackers_{false};
  std::atomic<int> captures_[kMaxDevices] = {};
  std::atomic<vram_pool_t *> used_[kMaxDevices] = {};

  std::mutex history_mutex_;  // what follows
  bool recording_ = false;
  std::atomic<bool> trace_wanted_{false};
  cca::CreateContextFn recorder_ = nullptr;
  unsigned history_flags_ = 0;  // vram_history_start's, for the pools that start recording
  size_t max_entries_ = 0;
  uint64_t next_context_ = 0;
  std::unordered_map<uint64_t, CallContext> contexts_;
  std::map<c10::DeviceIndex, std::vector<SnapshotMark>> snapshot_marks_;
  std::set<TraceEntry::Action> skipped_actions_;  // _record_memory_history(skip_actions=)
  std::vector<std::string> compile_regions_;       // entered and not yet left, innermost last
  std::string user_metadata_;                      // _set_memory_metadata()

  std::mutex ipc_mutex_;
  std::map<std::string, std::weak_ptr<void>> ipc_opened_;

  std::atomic<bool> enabled_{true};
  // Blocks served while caching was off (malloc_uncached), and how many: the free paths
  // look them up only while there are any.
  std::unordered_set<void *> uncached_;
  std::atomic<size_t> uncached_count_{0};
};

// The class's members by job, defined out of line.
#include "torch_backend_history.hpp"
#include "torch_backend_ipc.hpp"
#include "torch_backend_oom.hpp"
#include "torch_backend_pools.hpp"
#include "torch_backend_streams.hpp"
#include "torch_backend_watchers.hpp"

void free_default_on(int device, void *ptr) {
  if (ptr) g_backend->free_on_device(device, ptr);
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
    // changeCurrentAllocator() swaps what CUDACachingAllocator::get() returns, not what
    // c10::GetAllocator(kCUDA) does: torch.accelerator's statistics and generic storage
    // paths ask the latter, which would still name PyTorch's allocator, never initialized.
    c10::SetAllocator(c10::DeviceType::CUDA, backend.get(), UINT8_MAX);
    return 0;
  } catch (const std::exception &e) {
    if (message && cap) std::snprintf(message, cap, "%s", e.what());
    return -1;
  }
}

// PYTORCH_CUDA_ALLOC_CONF's per_process_memory_fraction, for
// torch.cuda.get_per_process_memory_fraction() (install() has set the limit it means).
VRAMKIT_TORCH_EXPORT void vramkit_torch_backend_set_fraction(double fraction) {
  if (vramkit_torch::g_backend) vramkit_torch::g_backend->set_default_fraction(fraction);
}

// graph_capture_record_stream_reuse, from PYTORCH_CUDA_ALLOC_CONF or
// torch.cuda.memory._set_allocator_settings().
VRAMKIT_TORCH_EXPORT void vramkit_torch_backend_set_capture_reuse(int on) {
  if (vramkit_torch::g_backend) vramkit_torch::g_backend->set_capture_reuse(on != 0);
}

// The status of the last failure inside a deleter or record_stream (0 if none).
VRAMKIT_TORCH_EXPORT int vramkit_torch_backend_last_status(void) {
  return vramkit_torch::g_last_status.load();
}

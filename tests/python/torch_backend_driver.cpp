// torch_backend_driver.cpp - the complete PyTorch backend's own logic, on sim, with no GPU:
// compiled together with python/vramkit/plug/torch_backend.cpp (included below, so that the
// class itself is called, not a copy) against the real torch headers, by
// tests/python/test_torch_backend.py, and run with VRAMKIT_SOURCE=sim.
//
// What needs no CUDA device is exercised as PyTorch would call it: default-pool allocation
// and the per-device deleters, statistics and their resets, private pools for a capture
// (streams a filter claims go to the pool, the rest to the default pool), live checks, a
// graph-tree checkpoint taken, the pool changed, and the checkpoint restored at the very
// addresses and reading block by block as it was taken, a pool kept while a block lives and
// destroyed with it, out of memory as c10::OutOfMemoryError with the observer called,
// history with PyTorch-style contexts (bounded or not; a recording that cannot start on
// every pool leaves none recording), snapshots, base allocations, MemPools with an
// allocator of their own (a counting one here: segments come from it and go back to it)
// and with no_split, caching turned off, and the errors bad calls must raise without
// changing anything (foreign pointers, IPC where the source has none, MemPool options
// vramkit does not serve, a fraction of 0). The same class runs under PyTorch itself on the
// GPU in tests/gpu/test_torch_backend.py.
//
// Prints "backend driver: all checks passed" and exits 0, or names the failed check.
#include "torch_backend.cpp"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "backend_driver_checks.hpp"

using namespace vramkit_torch;
using c10::MempoolId_t;

namespace {

struct TaggedContext : c10::GatheredContext {
  int tag = 0;
};
int g_tags = 0;
std::shared_ptr<c10::GatheredContext> tagged_context() {
  auto context = std::make_shared<TaggedContext>();
  context->tag = ++g_tags;
  return context;
}

const cudaStream_t kDefault = nullptr;
const cudaStream_t kCapturing = reinterpret_cast<cudaStream_t>(0x7);

size_t live_bytes(Backend &b) { return b.getDeviceStats(0).allocated_bytes[0].current; }

size_t segments_of(Backend &b, MempoolId_t owner) {
  size_t n = 0;
  for (auto &seg : b.snapshot({0, 0}, false).segments)
    if (seg.owner_private_pool_id == owner) n++;
  return n;
}

std::set<void *> as_set(const std::vector<void *> &v) { return {v.begin(), v.end()}; }

void default_pool_and_statistics(Backend &b) {
  bool is_private = true;
  void *p = b.malloc_on(0, 1000, kDefault, &is_private);
  CHECK(p != nullptr && !is_private);
  DeviceStats st = b.getDeviceStats(0);
  CHECK(st.allocated_bytes[0].current == 1024 && st.requested_bytes[0].current == 1000);
  CHECK(st.allocation[0].current == 1 && st.reserved_bytes[0].current >= 1024);
  b.deleter_of(0, false)(p);  // the device's own deleter: no lookup
  st = b.getDeviceStats(0);
  CHECK(st.allocated_bytes[0].current == 0);
  CHECK(st.allocation[0].allocated == 1 && st.allocation[0].freed == 1);
  CHECK(st.allocated_bytes[0].peak == 1024);
  // PyTorch's pool rows: a request up to 1 MiB is the small pool's, the rest the large's.
  void *s1 = b.malloc_on(0, 1000, kDefault, &is_private);
  void *l1 = b.malloc_on(0, 3 << 20, kDefault, &is_private);
  st = b.getDeviceStats(0);
  CHECK(st.allocated_bytes[1].current == 1024 && st.allocated_bytes[2].current == 3 << 20);
  CHECK(st.segment[1].current == 1 && st.reserved_bytes[1].current == 2 << 20);
  CHECK(st.inactive_split[1].current == 1);
  CHECK(st.inactive_split_bytes[1].current == (2 << 20) - 1024);
  CHECK(st.inactive_split_bytes[0].current ==
        st.inactive_split_bytes[1].current + st.inactive_split_bytes[2].current);
  CHECK(st.active_bytes[0].current == st.active_bytes[1].current + st.active_bytes[2].current);
  CHECK(st.max_split_size == -1);
  b.deleter_of(0, false)(s1);
  b.deleter_of(0, false)(l1);
  st = b.getDeviceStats(0);
  CHECK(st.allocation[1].freed == 2 && st.allocation[2].freed == 1);
  b.resetAccumulatedStats(0);
  b.resetPeakStats(0);
  st = b.getDeviceStats(0);
  CHECK(st.allocation[0].allocated == 0 && st.allocation[0].freed == 0);
  CHECK(st.allocation[1].allocated == 0 && st.allocation[2].freed == 0);
  CHECK(st.allocated_bytes[0].peak == 0);
  // raw_delete and raw_deleter() find a default-pool pointer by asking the pools.
  void *q = b.malloc_on(0, 5000, kDefault, &is_private);
  b.raw_delete(q);
  CHECK(live_bytes(b) == 0);
  void *r = b.malloc_on(0, 5000, kDefault, &is_private);
  b.raw_deleter()(r);
  CHECK(live_bytes(b) == 0);
  b.setMemoryFraction(0.5, 0);
  CHECK(b.getMemoryFraction(0) == 0.5);
  b.setMemoryFraction(1.0, 0);
  CHECK_THROWS(c10::Error, "invalid memory fraction", b.setMemoryFraction(1.5, 0));
}

void capture_checkpoint_and_restore(Backend &b) {
  const MempoolId_t id{1, 0};
  bool is_private = false;
  b.beginAllocateToPool(0, id, [](cudaStream_t s) { return s == kCapturing; });
  CHECK(b.getPoolUseCount(0, id) == 1);
  void *g1 = b.malloc_on(0, 4096, kCapturing, &is_private);
  CHECK(is_private);
  // Graph trees swap deleters only where a storage carries raw_deleter().
  CHECK(b.deleter_of(0, true) == b.raw_deleter());
  void *eager = b.malloc_on(0, 4096, kDefault, &is_private);
  CHECK(!is_private);  // a stream the filter does not claim stays in the default pool
  void *g2 = b.malloc_on(0, 1 << 20, kCapturing, &is_private);
  CHECK(b.checkPoolLiveAllocations(0, id, {g1, g2}));
  CHECK(!b.checkPoolLiveAllocations(0, id, {g1}));
  CHECK(!b.checkPoolLiveAllocations(0, id, {g1, eager}));
  auto checkpoint = b.getCheckpointState(0, id);
  free_any(g1);
  void *g3 = b.malloc_on(0, 8192, kCapturing, &is_private);
  CHECK(b.checkPoolLiveAllocations(0, id, {g2, g3}));
  CHECK_THROWS(c10::Error, "already allocating",
               b.beginAllocateToPool(0, id, [](cudaStream_t) { return true; }));
  b.endAllocateToPool(0, id);
  CHECK_THROWS(c10::Error, "is not being allocated to", b.endAllocateToPool(0, id));
  CHECK(segments_of(b, id) >= 1);

  // Restore: what is live now is freed, the checkpoint's blocks come back where they were.
  {
    auto delta = b.setCheckpointPoolState(0, checkpoint);
    CHECK(as_set(delta.ptrs_freed) == (std::set<void *>{g2, g3}));
    std::set<void *> allocd;
    for (auto &dp : delta.dataptrs_allocd) allocd.insert(dp.get());
    CHECK(allocd == (std::set<void *>{g1, g2}));
    CHECK(b.checkPoolLiveAllocations(0, id, {g1, g2}));
  }  // the DataPtrs go: their deleters free the restored blocks
  CHECK(b.checkPoolLiveAllocations(0, id, {}));
  // A checkpoint that is not vramkit's is refused; the pool is untouched.
  auto foreign = std::make_shared<cca::AllocatorState>();
  CHECK_THROWS(c10::Error, "not a checkpoint", b.setCheckpointPoolState(0, foreign));
  b.releasePool(0, id);
  CHECK(b.getPoolUseCount(0, id) == 0 && segments_of(b, id) == 0);  // given back
  CHECK_THROWS(c10::Error, "no pool", b.releasePool(0, id));
  b.deleter_of(0, false)(eager);
  CHECK(live_bytes(b) == 0);
}

// A graph tree checks that a restored checkpoint reads as it was taken, block by block:
// eleven small blocks captured, all but the sixth freed in the capture (the last one parked
// in the engine's cache), then the checkpoint restored. Free memory reads as one block
// between used ones, as in PyTorch's snapshots, before and after alike.
void a_restored_checkpoint_reads_as_taken(Backend &b) {
  const MempoolId_t id{2, 0};
  bool is_private = false;
  b.beginAllocateToPool(0, id, [](cudaStream_t s) { return s == kCapturing; });
  std::vector<void *> small;
  for (int i = 0; i < 11; i++) small.push_back(b.malloc_on(0, 512, kCapturing, &is_private));
  for (int i = 0; i < 11; i++)
    if (i != 5) free_any(small[i]);
  b.endAllocateToPool(0, id);
  auto blocks_of = [&b, id]() {
    std::vector<std::pair<size_t, bool>> out;
    for (auto &seg : b.snapshot(id, false).segments)
      for (auto &block : seg.blocks) out.push_back({block.size, block.allocated});
    return out;
  };
  auto before = blocks_of();
  CHECK(before.size() == 3 && before[1] == std::make_pair(size_t{512}, true));
  auto checkpoint = b.getCheckpointState(0, id);
  {
    auto delta = b.setCheckpointPoolState(0, checkpoint);
    for (auto &dp : delta.dataptrs_allocd) dp.release_context();  // as PyTorch's binding does
  }
  CHECK(blocks_of() == before);
  b.releasePool(0, id);
  free_any(small[5]);
  CHECK(segments_of(b, id) == 0);
}

void a_pool_lives_as_long_as_its_blocks(Backend &b) {
  const MempoolId_t id{0, 5};  // a MemPool's id
  b.createOrIncrefPool(0, id, nullptr);
  b.beginAllocateToPool(0, id, [](cudaStream_t) { return true; });
  bool is_private = false;
  void *kept = b.malloc_on(0, 3 << 20, kDefault, &is_private);
  CHECK(is_private);
  b.endAllocateToPool(0, id);
  b.releasePool(0, id);  // the context manager's release
  b.releasePool(0, id);  // the MemPool's own
  CHECK(segments_of(b, id) >= 1);  // still holds `kept`
  CHECK(live_bytes(b) == size_t{3} << 20);
  free_any(kept);
  CHECK(segments_of(b, id) == 0 && live_bytes(b) == 0);
  // Freeing a pointer nobody handed out is recorded, changes nothing, and does not throw.
  g_last_status.store(0);
  int local = 0;
  free_any(&local);
  CHECK(g_last_status.load() == VRAM_EFOREIGN);
}

// A MemPool's allocator of its own, as NCCL's symmetric memory or a CUDAPluggableAllocator
// brings one: host memory standing for device memory, every call counted. Only the two
// calls PyTorch's allocator makes of a pool's allocator are answered.
struct CountingAllocator : torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
  CountingAllocator()
      : CUDAPluggableAllocator([](size_t, int, cudaStream_t) -> void * { return nullptr; },
                               [](void *, size_t, int, cudaStream_t) {}) {}
  void *raw_alloc_with_stream(size_t n, cudaStream_t) override {
    if (fail) return nullptr;
    void *p = std::aligned_alloc(kAlign, n);
    live[p] = n;
    allocs++;
    return p;
  }
  void raw_delete(void *p) override {
    CHECK(live.erase(p) == 1);  // only what it handed out comes back, once
    std::free(p);
    deletes++;
  }
  std::map<void *, size_t> live;
  int allocs = 0, deletes = 0;
  bool fail = false;
};

void a_mempool_takes_its_segments_from_its_allocator(Backend &b) {
  auto allocator = std::make_shared<CountingAllocator>();
  const MempoolId_t id{0, 11};
  int64_t reserved_before = b.getDeviceStats(0).reserved_bytes[0].current;
  b.createOrIncrefPool(0, id, allocator);
  b.beginAllocateToPool(0, id, [](cudaStream_t) { return true; });
  bool is_private = false;
  void *large = b.malloc_on(0, 3 << 20, kDefault, &is_private);
  void *small = b.malloc_on(0, 1000, kDefault, &is_private);
  CHECK(is_private && allocator->allocs == 2);
  size_t size = 0;
  void *base = b.getBaseAllocation(large, &size);
  CHECK(allocator->live.count(base) && allocator->live[base] == size);
  // vramkit's statistics and snapshots count them as any private pool's.
  DeviceStats st = b.getDeviceStats(0);
  CHECK(st.allocated_bytes[0].current == (3 << 20) + 1024);
  size_t held = 0;
  for (auto &entry : allocator->live) held += entry.second;
  CHECK(st.reserved_bytes[0].current - reserved_before == static_cast<int64_t>(held));
  CHECK(segments_of(b, id) == 2);
  // Its allocator failing is vramkit's out of memory, and the pool serves on.
  allocator->fail = true;
  CHECK_THROWS(c10::OutOfMemoryError, "CUDA out of memory",
               b.malloc_on(0, 40 << 20, kDefault, &is_private));
  allocator->fail = false;
  b.endAllocateToPool(0, id);
  b.releasePool(0, id);  // the context manager's release
  free_any(large);
  free_any(small);
  CHECK(allocator->deletes == 0);  // cached, as in any pool
  b.emptyCache(id);
  CHECK(allocator->deletes == 2 && allocator->live.empty());
  // Released with a segment cached: the pool goes, the segment back to the allocator, and
  // the backend lets go of the allocator.
  b.beginAllocateToPool(0, id, [](cudaStream_t) { return true; });
  free_any(b.malloc_on(0, 5 << 20, kDefault, &is_private));
  b.endAllocateToPool(0, id);
  b.releasePool(0, id);  // the context manager's release
  b.releasePool(0, id);
  CHECK(b.getPoolUseCount(0, id) == 0 && allocator->live.empty());
  CHECK(allocator.use_count() == 1);
}

// As in PyTorch's allocator: a fraction caps what all the device's pools reserve together,
// and a request the default pool refuses is served from what a MemPool(use_on_oom=True)
// holds, never by growing it, and never from a pool without the option.
void use_on_oom_pools_and_the_devices_fraction(Backend &b) {
  const MempoolId_t keep{0, 41}, lend{0, 42};
  int routed = 0;  // which pool's allocation context claims the stream, as use_mem_pool's
  b.emptyCache({0, 0});
  const int64_t reserved_before = b.getDeviceStats(0).reserved_bytes[0].current;
  // Each with an allocator of its own, as PyTorch's tests make them (and addresses of its
  // own: on sim every engine pool simulates its device from the same base).
  auto allocator = std::make_shared<CountingAllocator>();
  b.createOrIncrefPool(0, keep, allocator);
  b.createOrIncrefPool(0, lend, allocator);
  b.setUseOnOOM(0, lend, true);
  b.setMemoryFraction(0.25, 0);  // 256 MiB of the simulated 1 GiB
  b.beginAllocateToPool(0, keep, [&](cudaStream_t) { return routed == 1; });
  b.beginAllocateToPool(0, lend, [&](cudaStream_t) { return routed == 2; });
  bool is_private = false;
  routed = 1;
  void *a = b.malloc_on(0, 100 << 20, kDefault, &is_private);
  routed = 2;
  void *lent = b.malloc_on(0, 100 << 20, kDefault, &is_private);
  routed = 0;
  b.endAllocateToPool(0, keep);
  b.endAllocateToPool(0, lend);
  CHECK_THROWS(c10::OutOfMemoryError, "CUDA out of memory",
               b.malloc_on(0, 100 << 20, kDefault, &is_private));
  free_any(a);
  free_any(lent);
  void *c = b.malloc_on(0, 90 << 20, kDefault, &is_private);
  CHECK(c == lent && is_private);
  CHECK_THROWS(c10::OutOfMemoryError, "CUDA out of memory",
               b.malloc_on(0, 90 << 20, kDefault, &is_private));
  free_any(c);
  b.setMemoryFraction(1.0, 0);
  for (const MempoolId_t &id : {keep, lend}) {
    b.releasePool(0, id);  // the allocation context's
    b.releasePool(0, id);  // the MemPool's own
  }
  b.emptyCache({0, 0});
  CHECK(b.getPoolUseCount(0, keep) == 0 && b.getPoolUseCount(0, lend) == 0);
  CHECK(b.getDeviceStats(0).reserved_bytes[0].current == reserved_before);
  CHECK(allocator->live.empty());
  b.resetAccumulatedStats(0);  // its two refusals are not the next check's
}

// What a private pool takes during a capture lowers the default pool's limit no lower than
// what it reserves (a limit below that would give cached memory back, which a capture
// forbids); the capture over, the limit comes down to what the fraction leaves.
void the_fraction_gives_nothing_back_during_a_capture(Backend &b) {
  vram_pool_t *dflt = nullptr;
  CHECK(vramkit_torch_pool(0, &dflt) == VRAM_OK);
  auto reserved = [&] {
    vram_stats_t s{};
    CHECK(vram_get_stats(dflt, &s) == VRAM_OK);
    return static_cast<size_t>(s.reserved_bytes.current);
  };
  b.emptyCache({0, 0});
  b.setMemoryFraction(0.25, 0);  // 256 MiB of the simulated 1 GiB
  bool is_private = false;
  free_any(b.malloc_on(0, 60 << 20, kDefault, &is_private));  // cached by the default pool
  const size_t cached = reserved();
  CHECK(cached >= size_t{60} << 20);
  const MempoolId_t graph{0, 43};
  auto allocator = std::make_shared<CountingAllocator>();
  b.createOrIncrefPool(0, graph, allocator);
  b.beginAllocateToPool(0, graph, [](cudaStream_t) { return true; });  // origin unknown
  void *p = b.malloc_on(0, 200 << 20, kDefault, &is_private);
  CHECK(is_private && reserved() == cached);
  b.endAllocateToPool(0, graph);
  CHECK(reserved() <= (size_t{256} << 20) - (size_t{200} << 20));
  free_any(p);
  b.setMemoryFraction(1.0, 0);
  b.releasePool(0, graph);
  b.releasePool(0, graph);
  b.emptyCache({0, 0});
  CHECK(allocator->live.empty());
}

void a_no_split_mempool_gives_each_block_a_segment(Backend &b) {
  auto allocator = std::make_shared<CountingAllocator>();
  const MempoolId_t id{0, 12};
  b.recordHistory(true, &tagged_context, 1000, RecordContext::ALL, false, {});
  b.createOrIncrefPool(0, id, allocator);
  b.setNoSplit(0, id);  // as torch.cuda.MemPool(allocator, no_split=True) calls it
  b.beginAllocateToPool(0, id, [](cudaStream_t) { return true; });
  bool is_private = false;
  void *p = b.malloc_on(0, 1000, kDefault, &is_private);
  void *q = b.malloc_on(0, 1000, kDefault, &is_private);
  CHECK(allocator->allocs == 2 && allocator->live.count(p) && allocator->live.count(q));
  // The pool made again for no_split joined the recording.
  bool recorded = false;
  cca::SnapshotInfo snap = b.snapshot({0, 0}, true);
  CHECK(!snap.device_traces.empty());
  for (auto &e : snap.device_traces[0])
    recorded = recorded ||
               (e.action_ == TraceEntry::ALLOC && e.addr_ == reinterpret_cast<size_t>(q));
  CHECK(recorded);
  b.recordHistory(false, nullptr, 0, RecordContext::NEVER, false, {});
  size_t size = 0;
  CHECK(b.getBaseAllocation(q, &size) == q && size == size_t{2} << 20);
  CHECK(b.getDeviceStats(0).allocated_bytes[0].current == int64_t{4} << 20);
  b.endAllocateToPool(0, id);
  b.releasePool(0, id);  // the context manager's release
  free_any(p);
  free_any(q);
  b.releasePool(0, id);
  CHECK(allocator->deletes == 2 && allocator->live.empty());
  // On the device's own source too; and never for a pool that already holds memory.
  const MempoolId_t plain{0, 13};
  b.createOrIncrefPool(0, plain, nullptr);
  b.beginAllocateToPool(0, plain, [](cudaStream_t) { return true; });
  void *r = b.malloc_on(0, 1000, kDefault, &is_private);
  CHECK_THROWS(c10::Error, "already holds memory", b.setNoSplit(0, plain));
  CHECK(b.checkPoolLiveAllocations(0, plain, {r}));  // untouched
  b.endAllocateToPool(0, plain);
  b.releasePool(0, plain);  // the context manager's release
  free_any(r);
  b.releasePool(0, plain);
  const MempoolId_t fresh{0, 14};
  b.createOrIncrefPool(0, fresh, nullptr);
  b.setNoSplit(0, fresh);
  b.beginAllocateToPool(0, fresh, [](cudaStream_t) { return true; });
  void *s1 = b.malloc_on(0, 4096, kDefault, &is_private);
  void *s2 = b.malloc_on(0, 4096, kDefault, &is_private);
  CHECK(b.getBaseAllocation(s1, &size) == s1 && b.getBaseAllocation(s2, &size) == s2);
  b.endAllocateToPool(0, fresh);
  b.releasePool(0, fresh);  // the context manager's release
  free_any(s1);
  free_any(s2);
  b.releasePool(0, fresh);
  CHECK(segments_of(b, fresh) == 0 && live_bytes(b) == 0);
}

void out_of_memory_raises_and_tells_observers(Backend &b) {
  // The observer stays attached for the checks after this one: what it fills outlives it.
  auto seen = std::make_shared<std::vector<int64_t>>();
  b.attachOutOfMemoryObserver(
      [seen](int64_t device, size_t, size_t, size_t) { seen->push_back(device); });
  bool is_private = false;
  void *keep = b.malloc_on(0, 4096, kDefault, &is_private);
  // PyTorch's sentences and figures first (sim: 1 GiB of capacity, written in MiB up to
  // 1 GiB inclusive), then vramkit's report.
  CHECK_THROWS(c10::OutOfMemoryError,
               "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
               "1024.00 MiB of which ",
               b.malloc_on(0, size_t{2} << 30, kDefault, &is_private));
  CHECK_THROWS(c10::OutOfMemoryError,
               "Of the allocated memory 4.00 KiB is allocated by PyTorch, and ",
               b.malloc_on(0, size_t{2} << 30, kDefault, &is_private));
  CHECK_THROWS(c10::OutOfMemoryError, "Tried to allocate more than 1EB memory",
               b.malloc_on(0, size_t{1} << 62, kDefault, &is_private));
  CHECK(seen->size() == 2 && (*seen)[0] == 0);
  CHECK(b.getDeviceStats(0).num_ooms == 2);
  CHECK(live_bytes(b) == 4096);  // the live block is untouched
  b.deleter_of(0, false)(keep);
}

void history_carries_pytorch_contexts(Backend &b) {
  b.recordHistory(true, &tagged_context, 1000, RecordContext::ALL, false, {});
  CHECK(b.isHistoryEnabled());
  bool is_private = false;
  void *p = b.malloc_on(0, 3000, kDefault, &is_private);
  void *gone = b.malloc_on(0, 100, kDefault, &is_private);
  b.deleter_of(0, false)(gone);
  cca::SnapshotInfo snap = b.snapshot({0, 0}, true);
  int tag = 0;
  for (auto &seg : snap.segments) {
    size_t tiled = 0, address = seg.address;
    for (auto &block : seg.blocks) {
      if (block.allocated && address == reinterpret_cast<size_t>(p)) {
        auto *context = dynamic_cast<TaggedContext *>(block.context_when_allocated.get());
        CHECK(context != nullptr);
        tag = context->tag;
      }
      address += block.size;
      tiled += block.size;
    }
    CHECK(tiled == seg.total_size);  // blocks tile their segment, as PyTorch's viewer needs
  }
  CHECK(tag != 0);
  CHECK(!snap.device_traces.empty());
  bool alloc_with_context = false, free_seen = false;
  int64_t last_time = 0;
  for (auto &e : snap.device_traces[0]) {
    if (e.action_ == TraceEntry::ALLOC && e.addr_ == reinterpret_cast<size_t>(p)) {
      alloc_with_context = e.context_ != nullptr;
      CHECK(e.size_ == 3000);  // the size asked for, as PyTorch's entries carry
    }
    if (e.action_ == TraceEntry::FREE_COMPLETED || e.action_ == TraceEntry::FREE_REQUESTED)
      free_seen = free_seen || e.addr_ == reinterpret_cast<size_t>(gone);
    CHECK(static_cast<int64_t>(e.time_.t_) >= last_time);
    last_time = static_cast<int64_t>(e.time_.t_);
  }
  CHECK(alloc_with_context && free_seen);
  CHECK(last_time > int64_t{1600000000} * 1000000);  // Unix microseconds
  // As PyTorch's: the trace opens with what was allocated and ends with the last thing
  // done before this _snapshot(); each _snapshot() while recording adds one 'snapshot'
  // entry per device, after what came before it, seen from the next _snapshot() on.
  // Layout reads of vramkit's own (pruning, its tools) add none.
  auto &trace = snap.device_traces[0];
  CHECK(trace.front().action_ != TraceEntry::SNAPSHOT);
  CHECK(trace.back().action_ != TraceEntry::SNAPSHOT);
  auto snapshots = [](const std::vector<TraceEntry> &t) {
    return std::count_if(t.begin(), t.end(),
                         [](const TraceEntry &e) { return e.action_ == TraceEntry::SNAPSHOT; });
  };
  CHECK(snapshots(trace) == 0);
  auto second = b.snapshot({0, 0}, true).device_traces[0];
  CHECK(snapshots(second) == 1 && second.back().action_ == TraceEntry::SNAPSHOT);
  vram_pool_t *pool = nullptr;
  CHECK(vramkit_torch_pool(0, &pool) == VRAM_OK);
  vram_snapshot_segment_t segs[64];
  vram_snapshot_block_t blocks[256];
  size_t n_segs = 0, n_blocks = 0;  // a layout read that is no _snapshot()
  CHECK(vram_snapshot(pool, segs, 64, &n_segs, blocks, 256, &n_blocks) == VRAM_OK);
  CHECK(snapshots(b.snapshot({0, 0}, true).device_traces[0]) == 2);  // not the read's
  b.recordHistory(false, nullptr, 0, RecordContext::NEVER, false, {});
  CHECK(!b.isHistoryEnabled());
  b.deleter_of(0, false)(p);
  b.emptyCache({0, 0});
  CHECK(b.getDeviceStats(0).reserved_bytes[0].current == 0);
}

// The tag of an entry's context (0: none).
int tag_of(const TraceEntry &e) {
  auto *context = dynamic_cast<TaggedContext *>(e.context_.get());
  return context ? context->tag : 0;
}

// As PyTorch's allocator: under context="all" a free's entries carry the stack that freed
// (under "alloc", the allocation's); a second _record_memory_history() call while recording
// changes what is recorded from then on and keeps the entries and stacks recorded before;
// clear_history starts afresh.
void history_calls_change_what_comes_next(Backend &b) {
  bool is_private = false;
  b.recordHistory(true, &tagged_context, 1000, RecordContext::ALL, false, {});
  void *p = b.malloc_on(0, 4000, kDefault, &is_private);
  int first = g_tags;
  b.deleter_of(0, false)(p);
  int freed_by = g_tags;
  CHECK(freed_by == first + 1);
  b.recordHistory(true, &tagged_context, 1000, RecordContext::ALLOC, false, {});
  void *q = b.malloc_on(0, 4000, kDefault, &is_private);
  int second = g_tags;
  b.deleter_of(0, false)(q);
  CHECK(g_tags == second);  // no stack taken at a free under "alloc"
  // Memory the pool takes for an allocation names it, as PyTorch's segment entries do.
  void *big = b.malloc_on(0, size_t{96} << 20, kDefault, &is_private);
  int big_tag = g_tags;
  b.deleter_of(0, false)(big);
  // A segment made for an allocation keeps its context in snapshots (a new stream's first
  // small block takes a segment of its own).
  const cudaStream_t side = reinterpret_cast<cudaStream_t>(0x5151);
  void *own = b.malloc_on(0, 1000, side, &is_private);
  int own_tag = g_tags;
  bool segment_named = false;
  for (auto &seg : b.snapshot({0, 0}, true).segments)
    if (seg.address <= reinterpret_cast<size_t>(own) &&
        reinterpret_cast<size_t>(own) < seg.address + seg.total_size) {
      auto *made_by = dynamic_cast<TaggedContext *>(seg.context_when_allocated.get());
      segment_named = made_by && made_by->tag == own_tag;
    }
  CHECK(segment_named);
  b.deleter_of(0, false)(own);
  b.recordHistory(true, &tagged_context, 1000, RecordContext::NEVER, false, {});
  void *r = b.malloc_on(0, 4000, kDefault, &is_private);
  CHECK(g_tags == own_tag);
  b.deleter_of(0, false)(r);
  std::vector<std::pair<TraceEntry::Action, int>> seen;
  cca::SnapshotInfo kept = b.snapshot({0, 0}, true);
  bool taken_named = false;
  for (auto &e : kept.device_traces[0])
    if (e.action_ == TraceEntry::SEGMENT_ALLOC || e.action_ == TraceEntry::SEGMENT_MAP)
      taken_named = taken_named || tag_of(e) == big_tag;
  CHECK(taken_named);
  for (auto &e : kept.device_traces[0])
    if (e.action_ == TraceEntry::ALLOC || e.action_ == TraceEntry::FREE_REQUESTED)
      seen.push_back({e.action_, tag_of(e)});
  using A = TraceEntry::Action;
  std::vector<std::pair<A, int>> expected = {
      {A::ALLOC, first}, {A::FREE_REQUESTED, freed_by},  // p, under "all"
      {A::ALLOC, second}, {A::FREE_REQUESTED, second},   // q, under "alloc"
      {A::ALLOC, big_tag}, {A::FREE_REQUESTED, big_tag},
      {A::ALLOC, own_tag}, {A::FREE_REQUESTED, own_tag},
      {A::ALLOC, 0}, {A::FREE_REQUESTED, 0}};            // r, with no context
  CHECK(seen == expected);
  b.recordHistory(true, &tagged_context, 1000, RecordContext::ALL, true, {});  // clear
  cca::SnapshotInfo cleared = b.snapshot({0, 0}, true);
  for (auto &e : cleared.device_traces[0])
    CHECK(e.action_ != TraceEntry::ALLOC && e.action_ != TraceEntry::FREE_REQUESTED);
  b.recordHistory(false, nullptr, 0, RecordContext::NEVER, false, {});
}

void refusals_are_clear_and_change_nothing(Backend &b) {
  bool is_private = false;
  void *p = b.malloc_on(0, 3 << 20, kDefault, &is_private);
  size_t live = live_bytes(b);
  // The base of a live block is its segment's; a pointer not handed out is refused.
  size_t size = 0;
  void *base = b.getBaseAllocation(static_cast<char *>(p), &size);
  CHECK(base <= p && static_cast<char *>(p) + (3 << 20) <= static_cast<char *>(base) + size);
  int local = 0;
  CHECK_THROWS(c10::Error, "is not a live block", b.getBaseAllocation(&local, &size));
  CHECK_THROWS(c10::Error, "is not a live block", b.shareIpcHandle(&local));
  // The sim source has no IPC: refused by name before any driver call.
  CHECK_THROWS(c10::Error, "only from the 'cuda' source", b.shareIpcHandle(p));
  CHECK_THROWS(c10::Error, "cannot open this CUDA IPC handle", b.getIpcDevPtr("short"));
  // MemPool options vramkit does not serve, and no_split for a pool that is not there.
  const MempoolId_t id{0, 9};
  CHECK_THROWS(c10::Error, "setUseOnOOM: no pool", b.setUseOnOOM(0, id, true));
  b.setUseOnOOM(0, id, false);  // the default asks for nothing
  CHECK_THROWS(c10::Error, "no pool", b.setNoSplit(0, id));
  CHECK(b.getPoolUseCount(0, id) == 0);
  // A fraction of 0 is PyTorch's "nothing at all": the next request fails, the live block
  // stays.
  b.setMemoryFraction(0.0, 0);
  CHECK_THROWS(c10::OutOfMemoryError, "CUDA out of memory",
               b.malloc_on(0, 4 << 20, kDefault, &is_private));
  b.setMemoryFraction(1.0, 0);
  CHECK(live_bytes(b) == live);
  b.deleter_of(0, false)(p);
  CHECK(live_bytes(b) == 0);
}

// PyTorch's _record_memory_history() asks for every event by default (max_entries is
// sys.maxsize): the recording starts, keeping the newest of a bounded ring, and an
// allocation's entry carries its context.
void history_of_every_event(Backend &b) {
  b.recordHistory(true, &tagged_context, size_t{INT64_MAX}, RecordContext::ALL, false, {});
  CHECK(b.isHistoryEnabled());
  bool is_private = false;
  void *p = b.malloc_on(0, 48, kDefault, &is_private);
  bool seen = false;
  cca::SnapshotInfo snap = b.snapshot({0, 0}, true);
  for (auto &e : snap.device_traces[0])
    seen = seen || (e.action_ == TraceEntry::ALLOC && e.addr_ == reinterpret_cast<size_t>(p) &&
                    e.context_ != nullptr);
  CHECK(seen);
  b.recordHistory(false, nullptr, 0, RecordContext::NEVER, false, {});
  b.deleter_of(0, false)(p);
}

// Events the default pool's history holds (0 if it never recorded).
size_t history_total() {
  vram_pool_t *pool = nullptr;
  size_t total = 0;
  CHECK(vramkit_torch_pool(0, &pool) == VRAM_OK);
  CHECK(vram_history_read(pool, nullptr, 0, nullptr, &total, nullptr) == VRAM_OK);
  return total;
}

// A recording that cannot start on every pool raises and leaves nothing recording: with
// the address space held to room for one ring of PyTorch's default size, the default pool's
// starts and a MemPool's cannot; the default pool's stops again.
void a_history_that_cannot_start_records_nothing(Backend &b) {
  const MempoolId_t id{0, 9};
  b.createOrIncrefPool(0, id, nullptr);
  // Small rings first: a start takes its new ring before it lets the old one go.
  b.recordHistory(true, nullptr, 16, RecordContext::NEVER, false, {});
  b.recordHistory(false, nullptr, 0, RecordContext::NEVER, false, {});
  struct rlimit before;
  CHECK(getrlimit(RLIMIT_AS, &before) == 0);
  size_t pages = 0;
  std::FILE *statm = std::fopen("/proc/self/statm", "r");
  CHECK(statm && std::fscanf(statm, "%zu", &pages) == 1);
  std::fclose(statm);
  size_t ring = kHistoryAll * 64;  // a slot and its side slot, 32 bytes each
  struct rlimit tight = before;
  tight.rlim_cur = pages * static_cast<size_t>(sysconf(_SC_PAGESIZE)) + ring + ring / 2;
  CHECK(setrlimit(RLIMIT_AS, &tight) == 0);
  bool thrown = false;
  try {
    b.recordHistory(true, &tagged_context, size_t{INT64_MAX}, RecordContext::ALL, false, {});
  } catch (const c10::Error &e) {
    thrown = std::string(e.what()).find("cannot record memory history") != std::string::npos;
  }
  CHECK(setrlimit(RLIMIT_AS, &before) == 0);
  CHECK(thrown);
  CHECK(!b.isHistoryEnabled());
  size_t recorded = history_total();
  bool is_private = true;
  void *p = b.malloc_on(0, 4096, kDefault, &is_private);
  b.deleter_of(0, false)(p);
  CHECK(history_total() == recorded);
  b.releasePool(0, id);
}

// torch.cuda.caching_allocator_enable(False): requests go straight to cudaMalloc, past the
// pool and its statistics. With no GPU here cudaMalloc fails, so the request raises an
// error that says caching is off, and the pool is untouched; on again, the pool serves.
void caching_off_bypasses_the_pool(Backend &b) {
  bool is_private = true;
  size_t live = live_bytes(b);
  b.enable(false);
  CHECK(!b.isEnabled());
  CHECK_THROWS(c10::Error, "caching allocator disabled",
               b.malloc_on(0, 1 << 20, kDefault, &is_private));
  CHECK(live_bytes(b) == live);
  b.enable(true);
  void *p = b.malloc_on(0, 1 << 20, kDefault, &is_private);
  CHECK(p && !is_private && live_bytes(b) == live + (1 << 20));
  b.deleter_of(0, false)(p);
  CHECK(live_bytes(b) == live);
}

// As PyTorch's entries: each names the innermost compiled region being run ("N/A" outside
// any; a region entered while nothing recorded is not kept) and the user metadata then in
// force; skip_actions leaves those actions out, and an action PyTorch does not know is
// refused with the recording left as it was.
void history_names_regions_metadata_and_skips(Backend &b) {
  bool is_private = false;
  std::string region = "Torch-Compiled Region: 0/0";
  b.pushCompileContext(region);  // before recording: not kept
  b.setUserMetadata("phase one");
  CHECK(b.getUserMetadata() == "phase one");
  b.recordHistory(true, nullptr, 1000, RecordContext::NEVER, false, {"free_requested"});
  void *p = b.malloc_on(0, 4000, kDefault, &is_private);
  b.pushCompileContext(region);
  void *q = b.malloc_on(0, 4000, kDefault, &is_private);
  b.popCompileContext();
  b.popCompileContext();  // one more than kept: nothing to leave
  b.setUserMetadata("");
  void *r = b.malloc_on(0, 4000, kDefault, &is_private);
  for (void *x : {p, q, r}) b.deleter_of(0, false)(x);
  CHECK_THROWS(c10::Error, "unknown action 'fre\\x1bes'",
               b.recordHistory(true, nullptr, 1000, RecordContext::NEVER, false, {"fre\x1b" "es"}));
  CHECK(b.isHistoryEnabled());
  using Named = std::pair<std::string, std::string>;
  std::vector<Named> allocs;
  size_t frees_completed = 0;
  cca::SnapshotInfo snap = b.snapshot({0, 0}, true);
  for (auto &e : snap.device_traces[0]) {
    CHECK(e.action_ != TraceEntry::FREE_REQUESTED);
    if (e.action_ == TraceEntry::ALLOC) allocs.push_back({e.compile_context_, e.user_metadata_});
    frees_completed += e.action_ == TraceEntry::FREE_COMPLETED;
  }
  CHECK(frees_completed == 3);
  CHECK((allocs == std::vector<Named>{
                       {"N/A", "phase one"}, {"Torch-Compiled Region: 0/0", "phase one"}, {"N/A", ""}}));
  // context="state" keeps no trace, yet the snapshot has one (empty) per device.
  b.recordHistory(true, nullptr, 1000, RecordContext::STATE, false, {});
  free_any(b.malloc_on(0, 4000, kDefault, &is_private));
  cca::SnapshotInfo state = b.snapshot({0, 0}, true);
  CHECK(state.device_traces.size() == 1 && state.device_traces[0].empty());
  b.recordHistory(false, nullptr, 0, RecordContext::NEVER, false, {});
}

// Installed, vramkit is what both of PyTorch's ways to its CUDA allocator return: the
// caching allocator's get() and c10::GetAllocator(kCUDA), which torch.accelerator's
// statistics ask.
void install_reaches_both_ways_in() {
  char message[512] = "";
  CHECK(vramkit_torch_backend_install(message, sizeof message) == 0);
  CHECK(cca::get()->name() == "vramkit");
  auto *device_allocator = dynamic_cast<Backend *>(c10::GetAllocator(c10::DeviceType::CUDA));
  CHECK(device_allocator != nullptr && device_allocator == cca::get());
  // PYTORCH_CUDA_ALLOC_CONF's fraction, as install() passes it on, is what a device with
  // none set since answers.
  CHECK(cca::get()->getMemoryFraction(0) == 1.0);
  vramkit_torch_backend_set_fraction(0.25);
  CHECK(cca::get()->getMemoryFraction(0) == 0.25 && cca::get()->getMemoryFraction(3) == 0.25);
  // That fraction is the default pool's limit (install() configures it so) and, once the
  // backend meets the pool, caps the device's private pools with it: 200 MiB in a MemPool
  // leave the default pool 56 MiB of the 256.
  vram_pool_t *dflt = nullptr;
  CHECK(vramkit_torch_pool(0, &dflt) == VRAM_OK && vram_set_limit(dflt, 0, 0.25) == VRAM_OK);
  auto *installed = dynamic_cast<Backend *>(cca::get());
  const MempoolId_t id{0, 44};
  auto allocator = std::make_shared<CountingAllocator>();
  installed->createOrIncrefPool(0, id, allocator);
  installed->beginAllocateToPool(0, id, [](cudaStream_t) { return true; });
  bool is_private = false;
  void *p = installed->malloc_on(0, 200 << 20, kDefault, &is_private);
  installed->endAllocateToPool(0, id);
  CHECK(is_private);
  CHECK_THROWS(c10::OutOfMemoryError, "CUDA out of memory",
               installed->malloc_on(0, 100 << 20, kDefault, &is_private));
  free_any(p);
  installed->releasePool(0, id);
  installed->releasePool(0, id);
  CHECK(allocator->live.empty() && vram_set_limit(dflt, 0, 0) == VRAM_OK);
}

}  // namespace

int main() {
  auto backend = std::make_shared<Backend>();
  g_backend = backend.get();
  default_pool_and_statistics(*backend);
  capture_checkpoint_and_restore(*backend);
  a_restored_checkpoint_reads_as_taken(*backend);
  a_pool_lives_as_long_as_its_blocks(*backend);
  a_mempool_takes_its_segments_from_its_allocator(*backend);
  a_no_split_mempool_gives_each_block_a_segment(*backend);
  use_on_oom_pools_and_the_devices_fraction(*backend);
  the_fraction_gives_nothing_back_during_a_capture(*backend);
  out_of_memory_raises_and_tells_observers(*backend);
  history_carries_pytorch_contexts(*backend);
  history_calls_change_what_comes_next(*backend);
  refusals_are_clear_and_change_nothing(*backend);
  caching_off_bypasses_the_pool(*backend);
  history_of_every_event(*backend);
  a_history_that_cannot_start_records_nothing(*backend);
  history_names_regions_metadata_and_skips(*backend);
  install_reaches_both_ways_in();
  std::printf("backend driver: all checks passed\n");
  return 0;
}

// bench/rmm_replay.cpp - replays vramkit allocation traces (format v1) through RAPIDS RMM.
//
// Purpose: put RMM's two general-purpose suballocators beside PyTorch's caching allocator
// and cudaMallocAsync in gpu_bench.sh's replay table. It follows the method of the
// torch_replay anchor instrument, so that the figures compare one to one:
//   - a warm-up pass, then a measured pass on a fresh resource (RMM cannot empty a pool, so
//     a new resource object stands for torch's emptyCache): ns per op over the whole pass,
//     peak live (sum of requested sizes), peak reserved;
//   - the smallest cap under which the trace replays without out-of-memory, by bisection
//     between peak live and 2 x max(peak reserved, peak live), to 1 MiB
//     (RMM_REPLAY_BISECT_MIB coarsens it), each try on a fresh resource.
// It prints one JSON line per (trace, allocator) with torch_replay's keys, plus a few of its
// own that say how a figure was measured.
//
// The three configurations (RMM 26.10; all resources take their upstream by value as a
// cuda::mr::any_resource, and the RMM resource classes share their state between copies):
//   rmm-pool:  pool_memory_resource(upstream, initial_pool_size = 0), no maximum size.
//              Growth rule (RMM's size_to_grow, read in 26.10's librmm.so): with no maximum
//              the pool asks upstream for max(request, current pool size), i.e. it at least
//              doubles each time it grows; a failed upstream call is retried at half the
//              size, down to the request itself. With initial size 0 the first growth is
//              the first request. The pool never returns memory until it is destroyed.
//   rmm-pool-fixed: pool_memory_resource(upstream, initial_pool_size = S,
//              maximum_pool_size = S): dask-cuda's rmm_pool_size with the maximum equal to
//              it, the like-for-like of vramkit's VRAMKIT_PREALLOCATE=S under a limit of S.
//              The pool takes S from cudaMalloc in its constructor and never grows. S is
//              RMM_REPLAY_POOL_OVER_LIVE (default 2) times the trace's peak live, rounded up
//              to 256 B, for the measured pass; the bisection is on S itself.
//   rmm-arena: arena_memory_resource(upstream, arena_size). The arena takes its whole size
//              from upstream in its constructor (default: half of the free device memory)
//              and never grows.
//
// Peak reserved: the pool's is the peak of bytes taken from cudaMalloc, counted by a
// statistics_resource_adaptor wrapped around the cuda_memory_resource upstream (checked
// against pool_size(), reported as pool_size_bytes). The arena's upstream figure is its
// fixed size, which says nothing about the trace, so its peak_reserved_bytes is the
// high-water extent of the arena: the end of the highest block it handed out, less the
// arena's base (cuMemGetAddressRange). reserved_measure names the method in each line.
//
// The cap: for the pool, a limiting_resource_adaptor between the pool and cudaMalloc (the
// pool behaves as on a card of that size: its doubling fails and is retried smaller, as a
// real cudaMalloc failure would); for the arena, the arena size itself. Out of memory is
// rmm::bad_alloc (rmm::out_of_memory derives from it); any other exception is an error.
//
// Timing: ns_per_op covers the ops alone, as torch_replay's: the pool's growth (its cudaMalloc
// calls) falls inside the pass, the arena's single cudaMalloc happens in its constructor,
// outside it; setup_ms reports the constructor's time.
//
// Streams: stream 0 of a trace is the legacy default stream; every other stream number gets
// a cudaStream_t created on first use, as torch_replay does, passed as cuda::stream_ref
// (rmm::cuda_stream_view is deprecated in 26.10 and converts to it). A free is ordered on the
// stream its trace line names, as torch_replay's cudaMallocAsync replay does (in the shared
// traces it is always the allocation's stream).
//
// `rmm_replay --pair` measures the cached alloc+free pair instead (measure_pairs, below), for
// the bench's pair table.
// Environment: RMM_REPLAY_BISECT_MIB (default 1), RMM_REPLAY_ALLOCATORS (default
// "rmm-pool,rmm-arena"; a comma-separated subset of the three runs only those),
// RMM_REPLAY_POOL_OVER_LIVE (rmm-pool-fixed's measured size, default 2), RMM_REPLAY_CHECK=1 (read the traces and
// print their ops and peak live without touching CUDA: checks the parser on any machine).
// Exit status: 0 ok, 1 CUDA or RMM error, 2 bad command line or unreadable trace.
// Build: bench/rmm_build.sh. Usage: rmm_replay TRACE.trace.gz...
#include <rmm/error.hpp>
#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/limiting_resource_adaptor.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/mr/statistics_resource_adaptor.hpp>
#include <rmm/version_config.hpp>

#include <cuda/stream>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <sys/wait.h>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr std::size_t kAlign = rmm::CUDA_ALLOCATION_ALIGNMENT;  // 256: what RMM rounds to
constexpr uint64_t kMiB      = 1ull << 20;

double now_ns()  // CLOCK_MONOTONIC, as the anchors' workload.h
{
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

struct Op {
  char kind;  // 'a' allocate, 'f' free
  uint32_t id;
  uint64_t size;
  uint64_t stream;
};

struct Trace {
  std::string path, name;
  std::vector<Op> ops;
  uint32_t max_id = 0;
};

[[noreturn]] void die(int status, std::string const& msg)
{
  fflush(stdout);
  fprintf(stderr, "rmm_replay: %s\n", msg.c_str());
  exit(status);
}

void check_cuda(cudaError_t rc, char const* what)
{
  if (rc != cudaSuccess)
    die(1, std::string(what) + " failed: " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")");
}

// The path goes to gzip inside single quotes, each of its own quotes escaped.
std::string shell_quote(std::string const& s)
{
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Trace format v1: "a ID SIZE STREAM [T_US]" and "f ID STREAM [T_US]"; other lines (headers,
// comments) are skipped. A malformed a/f line is an error, not a zero-size op.
Trace load(std::string const& path)
{
  Trace t;
  t.path = path;
  t.name = path.substr(path.rfind('/') + 1);  // basename up to the first dot, as torch_replay
  t.name = t.name.substr(0, t.name.find('.'));
  std::string cmd = "gzip -dc -- " + shell_quote(path);  // gzip names the file in its own errors
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) die(2, "cannot run gzip on trace " + path + ": " + strerror(errno));
  char line[512];
  size_t lineno = 0;
  std::string bad;
  while (fgets(line, sizeof line, f)) {
    lineno++;
    if ((line[0] != 'a' && line[0] != 'f') || line[1] != ' ') continue;
    unsigned long long id = 0, size = 0, stream = 0;
    int n = line[0] == 'a' ? sscanf(line + 2, "%llu %llu %llu", &id, &size, &stream)
                           : sscanf(line + 2, "%llu %llu", &id, &stream);
    if (n != (line[0] == 'a' ? 3 : 2) || id > UINT32_MAX) {
      if (bad.empty()) {
        std::string text(line);
        text = text.substr(0, std::min(text.find('\n'), size_t{80}));
        bad  = "line " + std::to_string(lineno) + ": '" + text + "'";
      }
      continue;
    }
    t.ops.push_back(Op{line[0], (uint32_t)id, size, stream});
    t.max_id = std::max(t.max_id, (uint32_t)id);
  }
  // An id allocated again while live would leak in every replay (torch_replay does the same);
  // say so rather than change the trace.
  std::vector<char> live(t.max_id + 1, 0);
  size_t reused = 0;
  for (Op const& o : t.ops) {
    if (o.kind == 'a') reused += live[o.id], live[o.id] = 1;
    else live[o.id] = 0;
  }
  if (reused) fprintf(stderr, "rmm_replay: warning: %s allocates %zu ids that are still live\n", path.c_str(), reused);
  int status = pclose(f);
  if (status != 0)
    die(2, "cannot read trace " + path + " (gzip -dc failed" +
             (WIFEXITED(status) ? ", exit status " + std::to_string(WEXITSTATUS(status)) : std::string()) + ")");
  if (!bad.empty()) die(2, "malformed trace " + path + ", " + bad);
  if (t.ops.empty()) die(2, "trace " + path + " has no allocate or free lines");
  return t;
}

// Stream 0 is the legacy default stream; every other trace stream gets its own cudaStream_t,
// created on first use and kept for the program's life (as torch_replay does), so the pool's
// per-stream free lists and events see the same streams in every pass.
std::unordered_map<uint64_t, cudaStream_t> streams;
cuda::stream_ref stream_of(uint64_t s)
{
  if (s == 0) return cuda::stream_ref{cudaStream_t{nullptr}};
  auto it = streams.find(s);
  if (it != streams.end()) return cuda::stream_ref{it->second};
  cudaStream_t x{};
  check_cuda(cudaStreamCreate(&x), "cudaStreamCreate");
  streams[s] = x;
  return cuda::stream_ref{x};
}

struct Pass {
  bool ok             = false;
  uint64_t peak_live  = 0;
  double ns_per_op    = 0;
  uint64_t extent     = 0;  // arena only: high-water end of a block less the arena's base
  std::string failure;      // the out-of-memory message of a failed pass
};

// One replay of the trace through `mr`. Timed from the first op to the last one done, as
// torch_replay (parsing is done before). Whatever is still live afterwards is freed on its
// own stream, and the device synchronized, so the resource can be destroyed cleanly.
template <class MR>
Pass replay(MR& mr, Trace const& t)
{
  Pass p;
  std::vector<void*> ptr(t.max_id + 1, nullptr);
  std::vector<uint64_t> size(t.max_id + 1, 0);
  std::vector<uint64_t> on(t.max_id + 1, 0);
  uint64_t live = 0;
  uintptr_t low = UINTPTR_MAX, high = 0;
  size_t i = 0;
  p.ok     = true;
  double t0 = now_ns();
  try {
    for (; i < t.ops.size(); i++) {
      Op const& o = t.ops[i];
      if (o.kind == 'a') {
        void* q = mr.allocate(stream_of(o.stream), o.size, kAlign);
        ptr[o.id] = q, size[o.id] = o.size, on[o.id] = o.stream;
        live += o.size;
        p.peak_live = std::max(p.peak_live, live);
        if (q) {
          low  = std::min(low, (uintptr_t)q);
          high = std::max(high, (uintptr_t)q + o.size);
        }
      } else if (ptr[o.id]) {
        mr.deallocate(stream_of(o.stream), ptr[o.id], size[o.id], kAlign);
        ptr[o.id] = nullptr;
        live -= size[o.id];
      }
    }
  } catch (rmm::bad_alloc const& e) {  // rmm::out_of_memory is a rmm::bad_alloc
    p.ok      = false;
    p.failure = e.what();
  }
  p.ns_per_op = (now_ns() - t0) / std::max<size_t>(i, 1);
  // The arena is one cudaMalloc: its base is that allocation's base, found from any pointer
  // it handed out (the arena still holds the memory, so the address is valid here).
  if (high > 0) {
    static PFN_cuMemGetAddressRange_v3020 get_range = [] {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult found{};
      cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &found);
      return found == cudaDriverEntryPointSuccess ? (PFN_cuMemGetAddressRange_v3020)fn : nullptr;
    }();
    CUdeviceptr base = 0;
    size_t bytes     = 0;
    if (get_range && get_range(&base, &bytes, (CUdeviceptr)low) == CUDA_SUCCESS) p.extent = high - base;
  }
  for (uint32_t id = 0; id <= t.max_id; id++)
    if (ptr[id]) mr.deallocate(stream_of(on[id]), ptr[id], size[id], kAlign);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize after a pass");
  return p;
}

enum class Kind { pool, fixed, arena };

char const* label_of(Kind kind)
{
  return kind == Kind::pool ? "rmm-pool" : kind == Kind::fixed ? "rmm-pool-fixed" : "rmm-arena";
}

// The sum of the sizes live at once, at its highest (what every figure is divided by).
uint64_t peak_live_of(Trace const& t)
{
  std::vector<uint64_t> size(t.max_id + 1, 0);
  uint64_t live = 0, peak = 0;
  for (Op const& o : t.ops) {
    if (o.kind == 'a') size[o.id] = o.size, live += o.size, peak = std::max(peak, live);
    else live -= size[o.id], size[o.id] = 0;
  }
  return peak;
}

struct Try {
  Pass pass;
  uint64_t upstream_peak = 0;  // peak bytes taken from cudaMalloc
  uint64_t pool_size     = 0;  // pool only: pool_size() at the end of the pass
  uint64_t arena_size    = 0;  // arena only: bytes the arena took
  double setup_ms        = 0;  // constructing the resource: the arena's one cudaMalloc
};

// A fresh resource over cudaMalloc (through a statistics adaptor that counts what RMM takes
// from it), one pass, then the resource is destroyed and its memory goes back to cudaMalloc.
// cap: none for the warm-up and measured passes; in the bisection, the limit. For
// rmm-pool-fixed the cap is the pool's size, and there is always one.
Try run(Kind kind, Trace const& t, std::optional<uint64_t> cap)
{
  Try r;
  rmm::mr::cuda_memory_resource cuda_mr;
  rmm::mr::statistics_resource_adaptor stats{cuda_mr};
  double t0 = now_ns();
  if (kind == Kind::pool) {
    // initial_pool_size 0: the pool grows on demand from nothing (growth rule: see the top).
    std::optional<rmm::mr::pool_memory_resource> pool;
    if (cap)
      pool.emplace(rmm::mr::limiting_resource_adaptor{stats, *cap}, std::size_t{0});
    else
      pool.emplace(stats, std::size_t{0});
    r.setup_ms  = (now_ns() - t0) / 1e6;
    r.pass      = replay(*pool, t);
    r.pool_size = pool->pool_size();
  } else if (kind == Kind::fixed) {
    // initial = maximum: the whole pool from cudaMalloc in the constructor, never more. A
    // size the card cannot give is an out-of-memory try like any other.
    std::size_t size = *cap / kAlign * kAlign;
    std::optional<rmm::mr::pool_memory_resource> pool;
    try {
      pool.emplace(stats, size, std::optional<std::size_t>(size));
    } catch (rmm::bad_alloc const& e) {
      r.pass.failure = std::string("pool construction: ") + e.what();
      return r;
    }
    r.setup_ms  = (now_ns() - t0) / 1e6;
    r.pass      = replay(*pool, t);
    r.pool_size = pool->pool_size();
  } else {
    // The arena's constructor takes the whole arena from cudaMalloc; failing that (a cap the
    // card cannot give) is an out-of-memory try like any other.
    std::optional<rmm::mr::arena_memory_resource> arena;
    try {
      arena.emplace(stats, cap ? std::optional<std::size_t>(*cap) : std::nullopt);
    } catch (rmm::bad_alloc const& e) {
      r.pass.failure = std::string("arena construction: ") + e.what();
      return r;
    } catch (rmm::logic_error const& e) {  // a cap under the 1 MiB superblock: no arena
      r.pass.failure = std::string("arena construction: ") + e.what();
      return r;
    }
    r.setup_ms   = (now_ns() - t0) / 1e6;
    r.arena_size = (uint64_t)stats.get_bytes_counter().value;
    r.pass       = replay(*arena, t);
  }
  r.upstream_peak = (uint64_t)stats.get_bytes_counter().peak;
  return r;
}

// The cached alloc+free pair of one size, as the anchors' torch_bench measures PyTorch's
// raw_alloc/raw_delete: 1,000 warm-up pairs (the first takes the memory from upstream),
// then the median of 5 batches of 200,000 pairs on the legacy default stream.
template <class MR>
double pair_ns(MR& mr, std::size_t size)
{
  cuda::stream_ref stream{cudaStream_t{nullptr}};
  for (int i = 0; i < 1000; i++) mr.deallocate(stream, mr.allocate(stream, size, kAlign), size, kAlign);
  constexpr int kPairs = 200000;
  std::vector<double> batch;
  for (int r = 0; r < 5; r++) {
    double t0 = now_ns();
    for (int i = 0; i < kPairs; i++) mr.deallocate(stream, mr.allocate(stream, size, kAlign), size, kAlign);
    batch.push_back((now_ns() - t0) / kPairs);
  }
  std::sort(batch.begin(), batch.end());
  return batch[2];
}

// `rmm_replay --pair`: the pair at the sizes of vramkit's `bench pair` and torch_bench, each
// size on a fresh resource over cudaMalloc (the pool from empty, the arena at its default
// size). One JSON line per allocator and size.
void measure_pairs(bool want_pool, bool want_arena)
{
  // rmm-pool-fixed's pair is rmm-pool's: the same resource, grown once.
  static constexpr std::size_t sizes[] = {512, 65536, 2u << 20, 64u << 20};
  for (Kind kind : {Kind::pool, Kind::arena}) {
    if (kind == Kind::pool ? !want_pool : !want_arena) continue;
    for (std::size_t size : sizes) {
      rmm::mr::cuda_memory_resource cuda_mr;
      double ns = 0;
      if (kind == Kind::pool) {
        rmm::mr::pool_memory_resource pool{cuda_mr, std::size_t{0}};
        ns = pair_ns(pool, size);
      } else {
        rmm::mr::arena_memory_resource arena{cuda_mr, std::nullopt};
        ns = pair_ns(arena, size);
      }
      check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the pairs");
      printf("{\"allocator\": \"%s\", \"size\": %zu, \"ns_per_pair\": %.1f, \"rmm_version\": \"%s\"}\n",
             label_of(kind), size, ns, RMM_VERSION);
      fflush(stdout);
    }
  }
}

double env_double(char const* name, double fallback)
{
  char const* v = getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  double x  = strtod(v, &end);
  if (*end || !(x > 0)) die(2, std::string(name) + " must be a positive number, not '" + v + "'");
  return x;
}

std::string num_or_null(std::optional<uint64_t> v) { return v ? std::to_string(*v) : "null"; }
std::string ratio_or_null(std::optional<uint64_t> v, uint64_t live)
{
  if (!v || !live) return "null";
  char b[32];
  snprintf(b, sizeof b, "%.4f", (double)*v / live);
  return b;
}

void measure(Kind kind, Trace const& t, uint64_t resolution, size_t device_total, double pool_over_live)
{
  char const* label = label_of(kind);
  std::optional<uint64_t> size;  // rmm-pool-fixed's measured size
  if (kind == Kind::fixed)
    size = ((uint64_t)(pool_over_live * (double)peak_live_of(t)) + kAlign - 1) / kAlign * kAlign;
  run(kind, t, size);  // warm-up: CUDA's lazy loading, the streams, RMM's code paths
  Try m              = run(kind, t, size);
  uint64_t live      = m.pass.peak_live;
  uint64_t reserved  = kind == Kind::arena ? m.pass.extent : m.upstream_peak;
  if (!m.pass.ok)
    fprintf(stderr, "rmm_replay: %s %s: the uncapped pass ran out of memory: %s\n", t.name.c_str(),
            label, m.pass.failure.c_str());
  if (kind == Kind::arena && m.pass.ok && reserved == 0)
    fprintf(stderr, "rmm_replay: %s %s: cuMemGetAddressRange failed: no arena extent (reported 0)\n",
            t.name.c_str(), label);

  // Bisection on the cap, as torch_replay: lo is taken to fail (peak live), hi to succeed.
  // Unlike torch_replay, hi is tried first, and doubled (up to the card) while it fails, so
  // that the figure reported is one a replay reached. Caps are multiples of 256 B, what RMM
  // works in, so the number reported is the cap imposed.
  std::optional<uint64_t> min_cap;
  std::string bisection = "done";
  int tries             = 0;
  auto fits             = [&](uint64_t cap) {
    double t0 = now_ns();
    Try r     = run(kind, t, cap);
    tries++;
    fprintf(stderr, "rmm_replay: %s %s cap=%.1f MiB %s (%.0f ms)%s%s\n", t.name.c_str(), label,
            (double)cap / kMiB, r.pass.ok ? "fits" : "out of memory", (now_ns() - t0) / 1e6,
            r.pass.ok ? "" : ": ", r.pass.failure.c_str());
    return r.pass.ok;
  };
  if (m.pass.ok && live > 0) {
    uint64_t const top = device_total / kAlign * kAlign;
    uint64_t lo = live, hi = std::max(reserved, live) * 2 / kAlign * kAlign;
    bool hi_fits = fits(hi);
    while (!hi_fits && hi < top) {
      lo      = hi;
      hi      = std::min(hi * 2, top);
      hi_fits = fits(hi);
    }
    if (hi_fits) {
      while (hi - lo > resolution) {
        uint64_t mid = (lo + (hi - lo) / 2) / kAlign * kAlign;  // > lo, < hi: resolution >= 512
        if (fits(mid)) hi = mid; else lo = mid;
      }
      min_cap = hi;
    } else {
      bisection = "failed (no cap up to the card's memory fits)";
    }
  } else {
    bisection = "skipped (the uncapped pass failed)";
  }

  printf("{\"trace\": \"%s\", \"allocator\": \"%s\", \"ok\": %d, \"ops\": %zu, \"peak_live_bytes\": %lu, "
         "\"peak_reserved_bytes\": %lu, \"reserved_over_live\": %.4f, \"ns_per_op\": %.1f, "
         "\"min_capacity_bytes\": %s, \"min_capacity_over_live\": %s, \"rmm_version\": \"%s\", "
         "\"reserved_measure\": \"%s\", \"upstream_peak_bytes\": %lu, \"%s\": %lu, "
         "\"setup_ms\": %.2f, \"cap_method\": \"%s\", \"bisection\": \"%s\", \"bisection_tries\": %d}\n",
         t.name.c_str(), label, m.pass.ok ? 1 : 0, t.ops.size(), (unsigned long)live,
         (unsigned long)reserved, live ? (double)reserved / live : 0.0, m.pass.ns_per_op,
         num_or_null(min_cap).c_str(), ratio_or_null(min_cap, live).c_str(), RMM_VERSION,
         kind != Kind::arena ? "cudaMalloc bytes, statistics_resource_adaptor on the upstream"
                             : "arena high-water extent (end of highest block - arena base)",
         (unsigned long)m.upstream_peak, kind != Kind::arena ? "pool_size_bytes" : "arena_size_bytes",
         (unsigned long)(kind != Kind::arena ? m.pool_size : m.arena_size), m.setup_ms,
         kind == Kind::pool    ? "limiting_resource_adaptor between the pool and cudaMalloc"
         : kind == Kind::fixed ? "initial_pool_size = maximum_pool_size"
                               : "arena_size",
         bisection.c_str(), tries);
  fflush(stdout);
}

}  // namespace

int main(int argc, char** argv)
{
  if (argc < 2)
    die(2, "usage: rmm_replay TRACE.trace.gz... | rmm_replay --pair (RMM " RMM_VERSION
           "; see the top of bench/rmm_replay.cpp)");
  bool pairs = std::string(argv[1]) == "--pair";
  if (pairs && argc > 2) die(2, "rmm_replay --pair takes no trace");
  for (int a = 1; a < argc && !pairs; a++) {  // a wrong path fails before anything is read
    FILE* f = fopen(argv[a], "rb");
    if (!f) die(2, std::string("cannot open trace ") + argv[a] + ": " + strerror(errno));
    fclose(f);
  }
  double mib          = env_double("RMM_REPLAY_BISECT_MIB", 1.0);
  uint64_t resolution = std::max<uint64_t>((uint64_t)(mib * kMiB), 2 * kAlign);
  std::string which   = getenv("RMM_REPLAY_ALLOCATORS") ? getenv("RMM_REPLAY_ALLOCATORS") : "rmm-pool,rmm-arena";
  bool want_pool = false, want_fixed = false, want_arena = false;
  for (std::size_t at = 0; at <= which.size();) {  // comma-separated names, each exact
    std::size_t end  = std::min(which.find(',', at), which.size());
    std::string name = which.substr(at, end - at);
    if (name == "rmm-pool") want_pool = true;
    else if (name == "rmm-pool-fixed") want_fixed = true;
    else if (name == "rmm-arena") want_arena = true;
    else die(2, "RMM_REPLAY_ALLOCATORS: '" + name + "' is not rmm-pool, rmm-pool-fixed or rmm-arena");
    at = end + 1;
  }
  double pool_over_live = env_double("RMM_REPLAY_POOL_OVER_LIVE", 2.0);

  // Every trace is read before CUDA starts: a bad file fails fast, by name, on any machine.
  std::vector<Trace> traces;
  for (int a = 1; a < argc && !pairs; a++) traces.push_back(load(argv[a]));
  if (getenv("RMM_REPLAY_CHECK")) {  // parse only, no GPU: ops and peak live of each trace
    for (Trace const& t : traces)
      printf("{\"trace\": \"%s\", \"ops\": %zu, \"peak_live_bytes\": %lu}\n", t.name.c_str(),
             t.ops.size(), (unsigned long)peak_live_of(t));
    return 0;
  }

  int devices = 0;
  cudaError_t rc = cudaGetDeviceCount(&devices);
  if (rc != cudaSuccess)
    die(1, std::string("CUDA initialisation failed (is there an NVIDIA GPU and driver?): ") +
             cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")");
  if (devices < 1) die(1, "no CUDA device");
  check_cuda(cudaFree(nullptr), "CUDA initialisation (cudaFree(0))");
  size_t free_bytes = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");

  if (pairs) {
    try {
      measure_pairs(want_pool, want_arena);
    } catch (std::exception const& e) {
      die(1, std::string("--pair: ") + e.what());
    }
    return 0;
  }
  for (Trace const& t : traces) {
    try {
      if (want_pool) measure(Kind::pool, t, resolution, total, pool_over_live);
      if (want_fixed) measure(Kind::fixed, t, resolution, total, pool_over_live);
      if (want_arena) measure(Kind::arena, t, resolution, total, pool_over_live);
    } catch (std::exception const& e) {  // not out of memory: a CUDA or RMM failure
      die(1, t.path + ": " + e.what());
    }
  }
  return 0;
}

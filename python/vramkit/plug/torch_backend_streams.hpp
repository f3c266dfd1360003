// torch_backend_streams.hpp - blocks used on other streams than their own: record_stream,
// the frees a CUDA graph's capture defers, and their reuse inside the capture once the
// graph orders every use before the next allocation (PyTorch's
// graph_capture_record_stream_reuse). Part of torch_backend.cpp, included after the class.
//
// Outside a capture, record_stream is the engine's: the block is reused on its stream once
// events recorded on the other streams complete. Inside one no event may be recorded, so a
// block used on another stream and freed during the capture is kept out of the pool. By
// default it stays out until the capture ends, as in PyTorch's allocator. With reuse on, the
// free also notes where the capture stood on each stream that used the block (the graph
// nodes each stream's next work would depend on: its capture frontier); an allocation
// later on the block's own stream returns the block to the pool first if the graph orders
// every one of those nodes before that stream's frontier then (each is the frontier or one
// of its ancestors). Whatever the graph cannot answer (a stream that does not capture, a
// failed query) keeps the block out until the capture ends: reuse is only ever given up,
// never guessed.
//
// The graph is asked through CaptureGraph, CUDA's runtime by default; the backend's driver
// tests put a graph of their own in its place (g_capture_graph).

// The capture graph as the reuse check asks it.
struct CaptureGraph {
  virtual ~CaptureGraph() = default;
  // The nodes the next work captured on `stream` would depend on; false if it does not
  // capture or CUDA cannot say.
  virtual bool frontier(cudaStream_t stream, std::vector<cudaGraphNode_t> *out) = 0;
  // The nodes `node` depends on; false if CUDA cannot say.
  virtual bool dependencies(cudaGraphNode_t node, std::vector<cudaGraphNode_t> *out) = 0;
};

struct RuntimeCaptureGraph final : CaptureGraph {
  bool frontier(cudaStream_t stream, std::vector<cudaGraphNode_t> *out) override {
    // No capture runs on the legacy default stream, and asking it while another stream
    // captures is an implicit synchronisation CUDA refuses (it would end the capture).
    if (stream == nullptr) return false;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaGraphNode_t *nodes = nullptr;
    size_t count = 0;
#if CUDART_VERSION >= 13000
    cudaError_t err =
        cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &nodes, nullptr, &count);
#else
    cudaError_t err =
        cudaStreamGetCaptureInfo_v2(stream, &status, nullptr, nullptr, &nodes, &count);
#endif
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // a query's failure is not left for PyTorch's next check
      return false;
    }
    if (status != cudaStreamCaptureStatusActive) return false;
    out->assign(nodes, nodes + count);  // CUDA's array lives only until the next call
    return true;
  }

  bool dependencies(cudaGraphNode_t node, std::vector<cudaGraphNode_t> *out) override {
    size_t count = 0;
    if (!query(node, nullptr, &count)) return false;
    out->resize(count);
    if (count && !query(node, out->data(), &count)) return false;
    out->resize(count);
    return true;
  }

 private:
  static bool query(cudaGraphNode_t node, cudaGraphNode_t *nodes, size_t *count) {
#if CUDART_VERSION >= 13000
    cudaError_t err = cudaGraphNodeGetDependencies(node, nodes, nullptr, count);
#else
    cudaError_t err = cudaGraphNodeGetDependencies(node, nodes, count);
#endif
    if (err != cudaSuccess) (void)cudaGetLastError();
    return err == cudaSuccess;
  }
};

RuntimeCaptureGraph g_runtime_capture_graph;
CaptureGraph *g_capture_graph = &g_runtime_capture_graph;

// A walk bigger than this gives up (the block waits for the capture's end): a bound on the
// time one allocation may spend in the graph.
constexpr size_t kMostNodesWalked = size_t{1} << 20;

// Whether every node of `marker` is one of `frontier` or an ancestor of one.
inline bool graph_orders(const std::vector<cudaGraphNode_t> &marker,
                         const std::vector<cudaGraphNode_t> &frontier) {
  std::unordered_set<cudaGraphNode_t> wanted(marker.begin(), marker.end());
  std::unordered_set<cudaGraphNode_t> seen;
  std::vector<cudaGraphNode_t> todo(frontier.begin(), frontier.end()), deps;
  while (!todo.empty() && !wanted.empty()) {
    cudaGraphNode_t node = todo.back();
    todo.pop_back();
    if (!seen.insert(node).second) continue;
    if (seen.size() > kMostNodesWalked) return false;
    wanted.erase(node);
    if (!g_capture_graph->dependencies(node, &deps)) return false;
    todo.insert(todo.end(), deps.begin(), deps.end());
  }
  return wanted.empty();
}

inline void Backend::recordStream(const c10::DataPtr &ptr, c10::cuda::CUDAStream stream) {
  void *p = ptr.get();
  if (!p) return;
  auto deleter = ptr.get_deleter();
  vram_pool_t *pool = nullptr;
  if (deleter == &free_any) {
    {
      std::lock_guard<std::mutex> g(mutex_);
      auto it = private_blocks_.find(p);
      if (it != private_blocks_.end()) {
        if (captures_[it->second->device].load() > 0) {
          // No events may be recorded into a capture: the block waits for the graph to
          // order its uses (with reuse on) or for the capture's end.
          note_use_in_capture_locked(p, stream.stream());
          return;
        }
        pool = it->second->pool;
      }
    }
    c10::DeviceIndex device = 0;
    if (!pool) pool = default_pool_holding(p, &device);  // raw_alloc's, in a default pool
  } else {
    int d = device_of_deleter(deleter);
    if (d < 0) return;  // not ours (shared from another process): nothing to order
    pool = used_[d].load();
  }
  if (!pool) return;
  int rc = vram_record_stream(pool, p, static_cast<vram_stream_t>(stream.stream()));
  if (rc != VRAM_OK) g_last_status.store(rc);
}

inline void Backend::note_use_in_capture_locked(void *ptr, cudaStream_t stream) {
  std::vector<cudaStream_t> &streams = deferred_uses_[ptr];
  if (std::find(streams.begin(), streams.end(), stream) == streams.end())
    streams.push_back(stream);
}

inline void Backend::free_private_block(void *ptr) {
  PrivatePool *pp = nullptr;
  {
    std::lock_guard<std::mutex> g(mutex_);
    auto it = private_blocks_.find(ptr);
    if (it == private_blocks_.end()) {
      g_last_status.store(VRAM_EFOREIGN);
      return;
    }
    pp = it->second;
    // A block used on another stream during a capture goes back when the graph orders its
    // uses before its stream's next work, or when the capture ends.
    auto uses = deferred_uses_.find(ptr);
    if (uses != deferred_uses_.end() && captures_[pp->device].load() > 0) {
      deferred_frees_.push_back(deferred_free_locked(pp, ptr, uses->second));
      if (deferred_frees_.back().reusable) reusable_frees_.fetch_add(1);
      return;
    }
    if (uses != deferred_uses_.end()) deferred_uses_.erase(uses);
    private_blocks_.erase(it);
  }
  free_in(pp->device, pp->pool, ptr);
  std::lock_guard<std::mutex> g(mutex_);
  pp->live--;
  maybe_destroy(pp);
}

// The deferred free of `ptr`, with where the capture stands on its own stream and on each
// stream that used it, if reuse is on and the graph can say.
inline DeferredFree Backend::deferred_free_locked(PrivatePool *pp, void *ptr,
                                                  const std::vector<cudaStream_t> &uses) {
  DeferredFree d;
  d.ptr = ptr;
  if (!capture_reuse_.load()) return d;
  vram_stream_t own = nullptr;
  size_t requested = 0;
  if (vram_block_info(pp->pool, ptr, &requested, &own) != VRAM_OK) return d;
  d.stream = static_cast<cudaStream_t>(own);
  std::vector<cudaGraphNode_t> nodes;
  for (cudaStream_t s : uses) {
    if (!g_capture_graph->frontier(s, &nodes)) return d;
    d.marker.insert(d.marker.end(), nodes.begin(), nodes.end());
  }
  if (!g_capture_graph->frontier(d.stream, &nodes)) return d;
  d.marker.insert(d.marker.end(), nodes.begin(), nodes.end());
  d.reusable = true;
  return d;
}

// Before an allocation on `stream` during a capture: the deferred frees of blocks of that
// stream whose uses the graph now orders before the stream's frontier go back to their pool.
inline void Backend::reclaim_in_capture(cudaStream_t stream) {
  std::vector<void *> ready;
  {
    std::lock_guard<std::mutex> g(mutex_);
    std::vector<cudaGraphNode_t> frontier;
    bool known = false;
    for (auto it = deferred_frees_.begin(); it != deferred_frees_.end();) {
      if (!it->reusable || it->stream != stream) {
        ++it;
        continue;
      }
      if (!known && !(known = g_capture_graph->frontier(stream, &frontier))) return;
      if (!graph_orders(it->marker, frontier)) {
        ++it;
        continue;
      }
      ready.push_back(it->ptr);
      deferred_uses_.erase(it->ptr);
      reusable_frees_.fetch_sub(1);
      it = deferred_frees_.erase(it);
    }
  }
  for (void *p : ready) free_private_block(p);
}

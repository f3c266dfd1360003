// torch_backend_capture_driver.cpp - graph_capture_record_stream_reuse in the complete
// PyTorch backend, on sim, with no GPU: compiled together with
// python/vramkit/plug/torch_backend.cpp (included below) by tests/python/test_torch_backend.py
// and run with VRAMKIT_SOURCE=sim.
//
// A capture's graph is played by FakeGraph in place of CUDA's runtime (g_capture_graph):
// streams that fork from and join one another, kernels that become nodes. A block used on
// a side stream (record_stream) and freed during the capture must not come back while the
// side stream's work may still read it, and must come back, at its address, once its
// stream's next work depends on every use; with the setting off, or where the graph cannot
// answer, it waits for the capture's end, as before.
//
// Prints "capture driver: all checks passed" and exits 0, or names the failed check.
#include "torch_backend.cpp"

#include <cstdio>
#include <cstdlib>
#include <map>

#include "backend_driver_checks.hpp"

using namespace vramkit_torch;
using c10::MempoolId_t;

namespace {

// A capture graph built as a program would build it: streams capturing into one graph,
// each with its frontier, and kernels that depend on their stream's frontier.
struct FakeGraph final : CaptureGraph {
  std::map<cudaStream_t, std::vector<cudaGraphNode_t>> frontiers;
  std::map<cudaGraphNode_t, std::vector<cudaGraphNode_t>> deps;
  uintptr_t next = 0x1000;

  bool frontier(cudaStream_t stream, std::vector<cudaGraphNode_t> *out) override {
    auto it = frontiers.find(stream);
    if (it == frontiers.end()) return false;  // not capturing
    *out = it->second;
    return true;
  }
  bool dependencies(cudaGraphNode_t node, std::vector<cudaGraphNode_t> *out) override {
    auto it = deps.find(node);
    out->clear();
    if (it != deps.end()) *out = it->second;
    return true;
  }
  void capture(cudaStream_t s) { frontiers[s]; }
  // A kernel launched on `s`: a node after everything `s` has captured so far.
  void kernel(cudaStream_t s) {
    auto node = reinterpret_cast<cudaGraphNode_t>(next++);
    deps[node] = frontiers.at(s);
    frontiers[s] = {node};
  }
  // waiter.wait_stream(waited): the waiter's next work also depends on the waited's.
  void wait(cudaStream_t waiter, cudaStream_t waited) {
    auto &f = frontiers.at(waiter);
    for (auto n : frontiers.at(waited)) f.push_back(n);
  }
};

// Aligned, as CUDA's stream handles are: c10 reads an external stream's kind from the low
// bits of its handle.
cudaStream_t stream(int i) { return reinterpret_cast<cudaStream_t>(uintptr_t(0x10000) * i); }

// record_stream as PyTorch calls it, on a block the backend handed out.
void record_stream(Backend &b, void *ptr, cudaStream_t s) {
  c10::DataPtr dp(ptr, ptr, &free_any, c10::Device(c10::DeviceType::CUDA, 0));
  b.recordStream(dp, c10::cuda::getStreamFromExternal(s, 0));
  dp.release_context();  // the block stays the caller's
}

struct Capture {
  Backend &b;
  MempoolId_t id;
  FakeGraph graph;
  Capture(Backend &backend, MempoolId_t pool, int streams) : b(backend), id(pool) {
    g_capture_graph = &graph;
    b.beginAllocateToPool(0, id, [](cudaStream_t) { return true; });
    for (int i = 1; i <= streams; i++) graph.capture(stream(i));
  }
  void *alloc(int s) {
    bool is_private = false;
    void *p = b.malloc_on(0, 32, stream(s), &is_private);
    CHECK(is_private);
    return p;
  }
  size_t live() { return b.getDeviceStats(0).allocation[0].current; }
  void end(std::vector<void *> blocks) {
    b.endAllocateToPool(0, id);
    for (void *p : blocks) free_any(p);
    b.releasePool(0, id);
    g_capture_graph = &g_runtime_capture_graph;
  }
};

// Two streams: the side stream reads data1; data1 is freed before the join (not reused:
// data2 gets another block) and comes back at its address after it (data3).
void reused_after_the_side_stream_joins(Backend &b) {
  b.set_capture_reuse(true);
  Capture c(b, {7, 0}, 2);
  void *sink = c.alloc(1);
  void *data1 = c.alloc(1);
  c.graph.wait(stream(2), stream(1));
  void *buf2 = c.alloc(2);
  c.graph.kernel(stream(2));  // reads data1, writes buf2
  record_stream(b, data1, stream(2));
  size_t before = c.live();
  free_any(data1);
  CHECK(c.live() == before);  // held back: the side stream may still read it
  void *data2 = c.alloc(1);
  CHECK(data2 != data1);
  c.graph.wait(stream(1), stream(2));
  c.graph.kernel(stream(1));  // sink.fill_(): the first work of stream 1 after the join
  void *data3 = c.alloc(1);
  CHECK(data3 == data1);
  c.end({sink, buf2, data2, data3});
}

// Four streams, three of them reading data1: joins of some (1 with 2, 3 with 4) leave it
// held; the join of all brings it back.
void reused_only_once_every_reader_joins(Backend &b) {
  b.set_capture_reuse(true);
  Capture c(b, {8, 0}, 4);
  void *data1 = c.alloc(1);
  c.graph.kernel(stream(1));  // torch.ones(): a fill
  void *sink1 = c.alloc(1);
  void *sink3 = c.alloc(1);
  std::vector<void *> bufs;
  for (int s = 2; s <= 4; s++) {
    c.graph.wait(stream(s), stream(1));
    bufs.push_back(c.alloc(s));
    c.graph.kernel(stream(s));
    record_stream(b, data1, stream(s));
  }
  free_any(data1);
  c.graph.wait(stream(1), stream(2));
  c.graph.kernel(stream(1));
  c.graph.wait(stream(3), stream(4));
  c.graph.kernel(stream(3));
  void *data2 = c.alloc(1);
  CHECK(data2 != data1);
  // Not on the side streams either: the block is stream 1's.
  void *other = c.alloc(3);
  CHECK(other != data1);
  c.graph.wait(stream(1), stream(3));
  c.graph.kernel(stream(1));
  void *data3 = c.alloc(1);
  CHECK(data3 == data1);
  bufs.insert(bufs.end(), {sink1, sink3, data2, other, data3});
  c.end(bufs);
}

// With the setting off (PyTorch's default), or with a stream the graph cannot answer for,
// the block waits for the capture's end, and goes back to the pool then.
void held_to_the_end_without_the_setting_or_an_answer(Backend &b) {
  for (bool answered : {false, true}) {
    b.set_capture_reuse(answered);
    Capture c(b, {9, answered ? 1 : 0}, 2);
    void *data1 = c.alloc(1);
    c.graph.wait(stream(2), stream(1));
    c.graph.kernel(stream(2));
    record_stream(b, data1, stream(2));
    if (answered) c.graph.frontiers.erase(stream(2));  // stream 2 no longer captures
    size_t before = c.live();
    free_any(data1);
    c.graph.frontiers[stream(2)];
    c.graph.wait(stream(1), stream(2));
    c.graph.kernel(stream(1));
    void *data3 = c.alloc(1);
    CHECK(data3 != data1);
    CHECK(c.live() == before + 1);  // data1 still held
    c.end({data3});
    CHECK(c.live() == 0);  // and freed at the capture's end
  }
  b.set_capture_reuse(false);
}

}  // namespace

int main() {
  auto backend = std::make_shared<Backend>();
  g_backend = backend.get();
  reused_after_the_side_stream_joins(*backend);
  reused_only_once_every_reader_joins(*backend);
  held_to_the_end_without_the_setting_or_an_answer(*backend);
  std::printf("capture driver: all checks passed\n");
  return 0;
}

"""PyTorch's memory features under vramkit's complete backend, side by side with PyTorch's
own allocator: every test runs twice, once per allocator ([native] and [vramkit]), each in a
fresh interpreter, with the same assertions (plus, under vramkit, that PyTorch's figures
are vramkit's). The -v listing of this file is the pass table of docs/performance.md.

Covered: memory statistics and their resets, out of memory as torch.OutOfMemoryError with
the out-of-memory observer called, streams with record_stream, a hand-made CUDA graph and
its private pool, two graphs sharing a pool, make_graphed_callables training, graph-tree
checkpoints saved and restored and every graph pool given back after them, empty_cache()
after a capture that failed (vramkit only), raw allocations (caching_allocator_alloc) and
cuDNN's benchmark mode, torch.cuda.MemPool (with an allocator of its own, and with
no_split), torch.compile(mode="reduce-overhead") (graph trees, inference over changing
shapes with checkpoints restored, and training) against eager, memory history and
snapshots read by torch.cuda._memory_viz and its command, the profiler's memory events,
a CUDA tensor shared with another process through torch.multiprocessing, and allocator
settings set at run time, which PyTorch's own parser reads first.
"""

from conftest import TORCH_PRELUDE as PRELUDE  # the run fixture is conftest.py's


def test_memory_stats_are_the_allocators(run):
    run("""
        x = torch.empty(10 * MiB, dtype=torch.uint8, device="cuda")
        a = torch.cuda.memory_allocated()
        assert a >= 10 * MiB, a
        stats = torch.cuda.memory_stats()
        assert stats["allocated_bytes.all.current"] == a
        assert stats["allocation.all.current"] >= 1
        assert torch.cuda.memory_reserved() >= a
        torch.cuda.reset_peak_memory_stats()
        y = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        del y
        assert torch.cuda.max_memory_allocated() >= a + 64 * MiB
        assert torch.cuda.memory_allocated() == a
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.max_memory_allocated() == a
        summary = torch.cuda.memory_summary()
        assert "Allocated memory" in summary, summary[:400]
        if VRAMKIT:
            assert vramkit.memory_allocated(0) == a
            assert vramkit.memory_reserved(0) == torch.cuda.memory_reserved()
        torch.cuda.reset_accumulated_memory_stats()
        assert torch.cuda.memory_stats()["allocation.all.allocated"] == 0
        z = torch.empty(MiB, device="cuda")
        assert torch.cuda.memory_stats()["allocation.all.allocated"] == 1
        del x, z
        torch.cuda.empty_cache()
        assert torch.cuda.memory_allocated() == 0
        assert torch.cuda.memory_reserved() == 0
        free, total = torch.cuda.mem_get_info()
        assert 0 < free <= total
    """)


def test_out_of_memory_raises_and_tells_the_observer(run):
    run("""
        seen = []
        torch._C._cuda_attach_out_of_memory_observer(lambda *args: seen.append(args))
        torch.cuda.set_per_process_memory_fraction(0.02)
        keep = torch.ones(MiB, device="cuda")
        try:
            torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as exc:
            assert str(exc).startswith("CUDA out of memory."), str(exc)[:300]
        else:
            raise AssertionError("no OutOfMemoryError")
        assert len(seen) == 1 and seen[0][0] == 0, seen
        assert torch.cuda.memory_stats()["num_ooms"] == 1
        assert float((keep * 2).sum()) == 2 * MiB    # the context and the live block live
    """)


def test_side_stream_with_record_stream(run):
    run("""
        side = torch.cuda.Stream()
        for _ in range(20):
            x = torch.full((4 * MiB,), 3.0, device="cuda")
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                torch.cuda._sleep(2_000_000)
                y = x * 2
            x.record_stream(side)
            del x    # must not be reused before the side stream is done with it
            z = torch.full((4 * MiB,), -1.0, device="cuda")
            torch.cuda.synchronize()
            assert float(y.min()) == 6.0 and float(y.max()) == 6.0
            assert float(z.max()) == -1.0
    """)


def test_cuda_graph_replays_into_its_own_pool(run):
    run("""
        w = torch.randn(1024, 1024, device="cuda")
        static_in = torch.randn(1024, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                (w @ static_in).relu()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            hidden = (w @ static_in).relu()
            static_out = hidden * 3
        del hidden       # freed inside the capture: the graph still owns its memory
        junk = [torch.full((MiB,), 7.0, device="cuda") for _ in range(8)]
        for _ in range(5):
            static_in.copy_(torch.randn(1024, device="cuda"))
            graph.replay()
            assert torch.allclose(static_out, (w @ static_in).relu() * 3)
        assert all(bool((j == 7).all()) for j in junk)   # eager memory left alone
        segments = torch.cuda.memory._snapshot()["segments"]
        pools = {tuple(s["segment_pool_id"]) for s in segments}
        assert (0, 0) in pools and len(pools) >= 2, pools
        owner = [s for s in segments if tuple(s["segment_pool_id"]) != (0, 0)]
        ptr = static_out.data_ptr()
        assert any(s["address"] <= ptr < s["address"] + s["total_size"] for s in owner)
        reserved = torch.cuda.memory_reserved()
        del graph, static_out
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() < reserved
    """)


def test_graphs_share_a_pool_and_graphed_callables_train(run):
    run("""
        pool = torch.cuda.graph_pool_handle()
        a = torch.randn(4096, device="cuda")
        first, second = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(first, pool=pool):
            b = a * 2
        with torch.cuda.graph(second, pool=pool):
            c = b + 1
        for _ in range(3):
            a.copy_(torch.randn(4096, device="cuda"))
            first.replay()
            second.replay()
            assert torch.allclose(c, a * 2 + 1)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 64)).cuda()
        x = torch.randn(32, 64, device="cuda", requires_grad=True)
        graphed = torch.cuda.make_graphed_callables(model, (x,))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for _ in range(10):
            loss = graphed(torch.randn(32, 64, device="cuda")).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            losses.append(float(loss))
        assert losses[-1] < losses[0], losses
    """)


def test_graph_pools_go_back_after_checkpoints(run):
    # What graph trees do between replays: a pool's state saved and restored. Restored, the
    # pool reads block by block as it was saved; once the graphs and their outputs are
    # gone, empty_cache() gives every graph pool back.
    run("""
        import gc
        def private_segments(pool=None):
            return [s for s in torch.cuda.memory_snapshot()
                    if tuple(s["segment_pool_id"]) != (0, 0)
                    and (pool is None or tuple(s["segment_pool_id"]) == tuple(pool))]
        def capture(fn, pool=None):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side, pool=pool):
                outputs = fn()
            return graph, outputs
        def small_ones():
            kept = [torch.ones(512, dtype=torch.uint8, device="cuda") for _ in range(11)]
            return kept[5], kept[8]
        gc.collect(); torch.cuda.empty_cache()
        assert private_segments() == [], private_segments()
        graph, outputs = capture(small_ones)
        pool = graph.pool()
        device = outputs[0].device.index
        before = private_segments(pool)
        state = torch._C._cuda_getCheckpointState(device, pool)
        torch._C._cuda_setCheckpointPoolState(device, state, [], [])
        after = private_segments(pool)
        fields = ("address", "total_size", "allocated_size", "active_size")
        assert [[s[f] for f in fields] for s in before] == [[s[f] for f in fields] for s in after]
        for b, a in zip(before, after):
            assert [(x["size"], x["state"]) for x in b["blocks"]] == \
                   [(x["size"], x["state"]) for x in a["blocks"]], (b["blocks"], a["blocks"])
        shared = torch.cuda.graph_pool_handle()
        second, kept = capture(lambda: torch.ones(4, device="cuda"), pool=shared)
        assert torch._C._cuda_checkPoolLiveAllocations(device, shared, {kept.data_ptr()})
        del kept
        assert torch._C._cuda_checkPoolLiveAllocations(device, shared, set())
        del graph, outputs, second, state
        gc.collect(); torch.cuda.synchronize(); torch.cuda.empty_cache()
        assert private_segments() == [], private_segments()
    """)


def test_empty_cache_after_a_failed_capture(gpu_run):
    # A capture that fails (here a synchronization inside it) ends without releasing its
    # allocation context: PyTorch's capture_end raises first. The graph's pool is lost with
    # it, as under PyTorch's allocator, but empty_cache() must still give back the rest.
    gpu_run(PRELUDE, """
        side = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        failed = False
        try:
            with torch.cuda.graph(graph, stream=side):
                x = torch.ones(MiB, device="cuda")
                torch.cuda.synchronize()
        except RuntimeError:
            failed = True
        assert failed
        assert not torch.cuda.is_current_stream_capturing()
        big = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
        del big
        reserved = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() <= reserved - 256 * MiB, \
            (reserved, torch.cuda.memory_reserved())
    """, env={"VK_ALLOC": "vramkit"})


def test_raw_allocations_and_cudnn_benchmark(run):
    run("""
        ptr = torch.cuda.caching_allocator_alloc(3 * MiB)
        assert ptr and torch.cuda.memory_allocated() >= 3 * MiB
        torch.cuda.caching_allocator_delete(ptr)
        assert torch.cuda.memory_allocated() == 0
        torch.backends.cudnn.benchmark = True     # sizes workspaces from the cache's state
        conv = torch.nn.Conv2d(64, 128, 3, padding=1).cuda()
        image = torch.randn(16, 64, 56, 56, device="cuda")
        out = conv(image)
        ref = torch.nn.functional.conv2d(image.double(), conv.weight.double(),
                                         conv.bias.double(), padding=1)
        assert torch.allclose(out.double(), ref, atol=1e-2), float((out.double() - ref).abs().max())
    """)


def test_allocator_settings_parse_as_pytorch_parses_them(run):
    run("""
        import warnings
        # A value PyTorch refuses raises PyTorch's own error under both allocators (a
        # ValueError from PyTorch 2.11's tokenizer, a RuntimeError from older parsers).
        try:
            torch.cuda.memory._set_allocator_settings("expandable_segments:1")
        except (ValueError, RuntimeError) as error:
            assert "True" in str(error) and "vramkit" not in str(error), error
        else:
            raise AssertionError("expandable_segments:1 was taken")
        # A bracketed list is one value: vramkit names it whole, once, and nothing else.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.memory._set_allocator_settings(
                "roundup_power2_divisions:[256:1,512:2,>:4]")
        said = [str(w.message) for w in caught if "vramkit" in str(w.message)]
        if VRAMKIT:
            assert len(said) == 1, said
            assert "roundup_power2_divisions:[256:1,512:2,>:4] has no effect" in said[0], said
        else:
            assert said == [], said
        x = torch.empty(MiB, device="cuda")
        assert torch.cuda.memory_allocated() >= MiB
        del x
    """)


def test_mempool_routes_allocations(run):
    run("""
        pool = torch.cuda.MemPool()
        assert pool.use_count() == 1
        with torch.cuda.use_mem_pool(pool):
            inside = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        outside = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        segments = pool.snapshot()
        live = [b for s in segments for b in s["blocks"] if b["state"] == "active_allocated"]
        assert sum(b["size"] for b in live) >= 4 * MiB
        def holds(ptr):
            return any(s["address"] <= ptr < s["address"] + s["total_size"] for s in segments)
        assert holds(inside.data_ptr()) and not holds(outside.data_ptr())
        inside.fill_(1)
        assert int(inside.sum()) == 4 * MiB
        del inside
        del pool
        torch.cuda.empty_cache()
    """)


# A MemPool's allocator of its own, as a CUDAPluggableAllocator brings it: cudaMalloc and
# cudaFree, counted.
COUNTED_ALLOCATOR = r"""
#include <cuda_runtime_api.h>
#include <stddef.h>
static long allocs, frees;
void *counted_alloc(size_t size, int device, cudaStream_t stream) {
  void *p = 0;
  (void)device; (void)stream;
  if (cudaMalloc(&p, size) != cudaSuccess) return 0;
  allocs++;
  return p;
}
void counted_free(void *p, size_t size, int device, cudaStream_t stream) {
  (void)size; (void)device; (void)stream;
  cudaFree(p);
  frees++;
}
long counted_allocs(void) { return allocs; }
long counted_frees(void) { return frees; }
"""


def test_mempool_takes_memory_from_its_own_allocator(run):
    run(f"""
        import ctypes, subprocess, tempfile
        from vramkit.plug import _torch_build
        include, cudart = _torch_build.cuda_runtime()
        folder = tempfile.mkdtemp()
        with open(folder + "/counted.c", "w") as f:
            f.write({COUNTED_ALLOCATOR!r})
        subprocess.run(["cc", "-shared", "-fPIC", "-I", include, folder + "/counted.c",
                        cudart, "-o", folder + "/counted.so"], check=True)
        counts = ctypes.CDLL(folder + "/counted.so")
        allocator = torch.cuda.memory.CUDAPluggableAllocator(
            folder + "/counted.so", "counted_alloc", "counted_free")
        pool = torch.cuda.MemPool(allocator.allocator())
        with torch.cuda.use_mem_pool(pool):
            inside = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        outside = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        assert counts.counted_allocs() >= 1 and counts.counted_frees() == 0
        segments = pool.snapshot()
        def holds(ptr):
            return any(s["address"] <= ptr < s["address"] + s["total_size"] for s in segments)
        assert holds(inside.data_ptr()) and not holds(outside.data_ptr())
        inside.fill_(3)
        assert int(inside.sum()) == 3 * 4 * MiB
        if VRAMKIT:
            assert torch.cuda.memory_allocated() >= 8 * MiB
        del inside
        del pool
        torch.cuda.empty_cache()
        assert counts.counted_frees() == counts.counted_allocs(), (
            counts.counted_frees(), counts.counted_allocs())
    """)


def test_mempool_no_split_gives_each_tensor_a_segment(run):
    run("""
        pool = torch.cuda.MemPool(no_split=True)
        with torch.cuda.use_mem_pool(pool):
            a = torch.empty(1000, dtype=torch.uint8, device="cuda")
            b = torch.empty(1000, dtype=torch.uint8, device="cuda")
            c = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        segments = pool.snapshot()
        def segment_of(ptr):
            return [i for i, s in enumerate(segments)
                    if s["address"] <= ptr < s["address"] + s["total_size"]]
        owners = [segment_of(t.data_ptr()) for t in (a, b, c)]
        assert all(len(o) == 1 for o in owners) and len({o[0] for o in owners}) == 3, owners
        if VRAMKIT:
            assert all(len(s["blocks"]) == 1 for s in segments), segments
        del a, b, c
        del pool
        torch.cuda.empty_cache()
    """)


def test_compile_reduce_overhead_matches_eager(run):
    run("""
        import copy
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                    torch.nn.Linear(512, 256)).cuda()
        compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
        # Changing shapes record new graphs in the tree, some of them while another path
        # is executing: the pool is checkpointed and restored (graph trees' own steps).
        with torch.no_grad():
            for rows in [64, 64, 64, 32, 64, 32, 16, 64, 16, 32]:
                x = torch.randn(rows, 256, device="cuda")
                out = compiled(x).clone()
                assert torch.allclose(out, model(x), atol=1e-4, rtol=1e-4), rows
        eager_model = copy.deepcopy(model)
        train_model = copy.deepcopy(model)
        step = torch.compile(train_model, mode="reduce-overhead", dynamic=False)
        opt_e = torch.optim.SGD(eager_model.parameters(), lr=0.01)
        opt_c = torch.optim.SGD(train_model.parameters(), lr=0.01)
        data = [torch.randn(64, 256, device="cuda") for _ in range(8)]
        for x in data:
            loss_e = eager_model(x).square().mean()
            loss_e.backward(); opt_e.step(); opt_e.zero_grad()
            loss_c = step(x).square().mean()
            loss_c.backward(); opt_c.step(); opt_c.zero_grad()
            assert abs(float(loss_c) - float(loss_e)) <= 1e-3 * abs(float(loss_e)) + 1e-5, \\
                (float(loss_c), float(loss_e))
        # The tree really did checkpoint and restore its pool on the way.
        from torch._inductor import cudagraph_trees
        manager = cudagraph_trees.get_container(0).tree_manager
        assert manager.debug_checkpointing_counter > 0, manager.debug_checkpointing_counter
        print("graph-tree checks passed")
    """, timeout=540)


def test_history_and_snapshot_open_in_memory_viz(run):
    run("""
        import pickle, tempfile
        from torch.cuda import _memory_viz
        torch.cuda.memory._record_memory_history(max_entries=10000)
        def make_weights():
            return torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        kept = make_weights()
        gone = torch.empty(1000, device="cuda")
        del gone
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        blocks = [b for s in snap["segments"] for b in s["blocks"]
                  if b["state"] == "active_allocated"]
        named = [b for b in blocks
                 if b["size"] >= 3 * MiB and any(f["name"] == "make_weights" for f in b["frames"])]
        assert named, [b["frames"][:2] for b in blocks]
        for seg in snap["segments"]:    # blocks tile each segment
            assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        trace = snap["device_traces"][0]
        actions = {e["action"] for e in trace}
        assert {"alloc", "free_requested"} <= actions or {"alloc", "free_completed"} <= actions, actions
        assert any(e["action"] == "alloc" and any(f["name"] == "make_weights" for f in e["frames"])
                   for e in trace)
        times = [e["time_us"] for e in trace]
        assert times == sorted(times) and times[0] > 1.6e15   # Unix microseconds
        with tempfile.NamedTemporaryFile(suffix=".pickle", delete=False) as f:
            pickle.dump(snap, f)
        with open(f.name, "rb") as f:
            again = pickle.load(f)
        assert len(_memory_viz.trace_plot(again)) > 1000
        assert len(_memory_viz.segment_plot(again)) > 1000
        assert "segment" in _memory_viz.segsum(again)
        # PyTorch's own dump and viewer command, as users run them.
        import subprocess, sys
        dump = f.name + ".dump.pickle"
        torch.cuda.memory._record_memory_history(max_entries=1000)
        extra = torch.empty(MiB, device="cuda")
        torch.cuda.memory._dump_snapshot(dump)
        torch.cuda.memory._record_memory_history(enabled=None)
        page = dump + ".html"
        done = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot",
                               dump, "-o", page], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        assert os.path.getsize(page) > 1000
        del kept, extra
    """)


def test_profiler_records_memory_events(run):
    run("""
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     profile_memory=True) as prof:
            a = torch.randn(4 * MiB, device="cuda")
            b = a * 2
            del a
            torch.cuda.synchronize()
        usage = [getattr(e, "self_device_memory_usage", 0) for e in prof.key_averages()]
        assert any(u > 0 for u in usage), usage
        assert any(u < 0 for u in usage), usage     # the free of `a`
        del b
    """)


def test_cuda_tensor_shared_with_another_process(run, tmp_path):
    (tmp_path / "vk_child.py").write_text(
        "def child(inbox, outbox):\n"
        "    t = inbox.get()\n"
        "    outbox.put(float(t.sum()))\n"
        "    del t\n")
    run(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import torch.multiprocessing as mp
        import vk_child
        ctx = mp.get_context("spawn")
        inbox, outbox = ctx.Queue(), ctx.Queue()
        proc = ctx.Process(target=vk_child.child, args=(inbox, outbox))
        proc.start()
        shared = torch.arange(1000, dtype=torch.float32, device="cuda")
        inbox.put(shared)
        assert outbox.get(timeout=240) == float(sum(range(1000)))
        proc.join(timeout=60)
        assert proc.exitcode == 0, proc.exitcode
    """)


def test_sharing_from_a_virtual_memory_pool_is_refused_clearly(gpu_run):
    # vramkit only: PyTorch has no such source. cuMemMap'd granules have no cudaIpc handle.
    gpu_run(PRELUDE, """
        import torch.multiprocessing.reductions as reductions
        shared = torch.arange(1000, dtype=torch.float32, device="cuda")
        try:
            reductions.reduce_tensor(shared)
        except RuntimeError as exc:
            assert "only from the 'cuda' source" in str(exc), str(exc)[:300]
        else:
            raise AssertionError("a vmm block was shared")
        assert float(shared.sum()) == float(sum(range(1000)))   # nothing lost
    """, env={"VK_ALLOC": "vramkit", "VRAMKIT_SOURCE": "vmm"})


def test_sharing_with_large_blocks_virtual(gpu_run):
    # vramkit only: by default (large blocks virtual) a large tensor lies in virtual memory,
    # which has no CUDA IPC handle: a clear refusal that names the setting, and the tensor
    # intact. A small one is in a fixed segment and still shares.
    gpu_run(PRELUDE, """
        import torch.multiprocessing.reductions as reductions
        small = torch.arange(1000, dtype=torch.float32, device="cuda")
        reductions.reduce_tensor(small)
        large = torch.arange(1 << 20, dtype=torch.float32, device="cuda")  # 4 MiB
        try:
            reductions.reduce_tensor(large)
        except RuntimeError as exc:
            assert "VRAMKIT_LARGE_BLOCKS=fixed" in str(exc), str(exc)[:300]
        else:
            raise AssertionError("a block in virtual memory was shared")
        assert float(large[-1]) == float((1 << 20) - 1)   # nothing lost
    """, env={"VK_ALLOC": "vramkit"})


def test_sharing_with_large_blocks_fixed(gpu_run):
    # vramkit only: VRAMKIT_LARGE_BLOCKS=fixed puts the same large tensor in a cuMemAlloc
    # segment of its own, which shares.
    gpu_run(PRELUDE, """
        import torch.multiprocessing.reductions as reductions
        large = torch.arange(1 << 20, dtype=torch.float32, device="cuda")  # 4 MiB
        reductions.reduce_tensor(large)
        assert float(large[-1]) == float((1 << 20) - 1)
    """, env={"VK_ALLOC": "vramkit", "VRAMKIT_LARGE_BLOCKS": "fixed"})


def test_free_stacks_and_history_kept_across_calls(run):
    # Under context="all" a free's entries name the code that freed; under "alloc" they do
    # not. A second _record_memory_history() call while recording keeps what was recorded
    # (an allocation made under stacks is still named after a call with context=None).
    run("""
        import json
        held = []
        def allocate_here():
            held.append(torch.rand(3, 4, device="cuda"))
        def free_here():
            held.pop()  # the last reference goes here, inside this frame
        def names(snapshot):
            return {f["name"] for e in snapshot["device_traces"][0] for f in e["frames"]}
        for context in ("alloc", "all"):
            torch.cuda.memory._record_memory_history(context=context)
            allocate_here()
            free_here()
            seen = names(torch.cuda.memory._snapshot())
            assert "allocate_here" in seen and ("free_here" in seen) == (context == "all"), seen
            torch.cuda.memory._record_memory_history(enabled=None)
        def kept_first():
            return torch.rand(4, 4, device="cuda")
        torch.cuda.memory._record_memory_history(context="all", stacks="python")
        x = kept_first()
        torch.cuda.memory._record_memory_history(context=None)
        x = torch.rand(3, 4, device="cuda")
        torch.cuda.memory._record_memory_history(context="all", stacks="python")
        assert "kept_first" in json.dumps(torch.cuda.memory._snapshot())
        torch.cuda.memory._record_memory_history(enabled=None)
    """)


def test_vramkit_history_started_before_the_first_allocation(gpu_run, tmp_path):
    # vramkit only: vramkit.record_memory_history() at the top of a script, before PyTorch
    # has allocated anything, keeps recording when the backend first takes the pool.
    gpu_run(PRELUDE, f"""
        vramkit.record_memory_history(stacks=None)
        x = torch.ones(3 * MiB, device="cuda")
        y = torch.ones(5 * MiB, device="cuda")
        del x
        torch.cuda.synchronize()
        actions = [e["action"] for e in vramkit.memory_history()]
        assert actions.count("alloc") >= 2 and "free_requested" in actions, actions
        ops = vramkit.save_trace({str(tmp_path / "t.trace.gz")!r})
        assert ops >= 3, ops
        # PyTorch's own switch, turned off, stops every pool's recording as before; what
        # was recorded stays readable.
        torch.cuda.memory._record_memory_history(enabled=None)
        z = torch.ones(7 * MiB, device="cuda")
        assert len(vramkit.memory_history()) == len(actions), vramkit.memory_history()[-2:]
    """, env={"VK_ALLOC": "vramkit"})


def test_an_op_s_scratch_is_read_as_the_blocks_it_made(run):
    # The estimator measures an op's scratch as the blocks the allocator's history saw it
    # make: a column sum of a large bf16 gradient (ATen's reduction) takes a staging buffer
    # and a semaphore, each freed inside the call; their peak is what the allocator's peak
    # rose by. A recording of the user's is left alone (then bytes are measured).
    run("""
        from vramkit.estimator import workspaces as ws, _transients as tr
        device = torch.device("cuda")
        x = torch.randn(16384, 3072, device="cuda", dtype=torch.bfloat16)
        make = lambda: (lambda: x.sum(0))
        steps = ws.measure_transient(make, device, blocks=True)
        nbytes = ws.measure_transient(make, device)
        assert isinstance(steps, tuple) and tr.is_transient(steps), steps
        assert sum(1 for s in steps if s > 0) >= 2, steps
        assert tr.outputs_marked(steps) == 1, steps  # the column sum's output, in its place
        assert tr.transient_bytes(steps) == nbytes, (steps, nbytes)
        assert not torch._C._cuda_isHistoryEnabled()
        torch.cuda.memory._record_memory_history(context=None)
        assert ws.measure_transient(make, device, blocks=True) == nbytes
        assert torch._C._cuda_isHistoryEnabled()
        torch.cuda.memory._record_memory_history(enabled=None)
    """)

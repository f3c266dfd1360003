"""PyTorch's newer memory interfaces under vramkit, side by side with PyTorch's allocator
(each test runs under both, conftest.py's `run`): torch.accelerator's statistics, the
memory fraction given in PYTORCH_CUDA_ALLOC_CONF, history entries naming the compiled region
and the user metadata of each call, skip_actions, a MemPool(use_on_oom=True) serving what
the default pool refuses under a fraction that counts every pool, a block used on a side
stream during a capture kept from the capture's later requests, and, with
graph_capture_record_stream_reuse, given back to them once the side stream has joined. What users rely on where
PyTorch's own tests assert PyTorch's exact addresses (docs/performance.md lists them).
"""

import pytest  # noqa: F401 - the run fixture comes from conftest.py


def test_accelerator_statistics_are_the_allocators(run):
    run("""
        first = torch.empty(MiB, device="cuda")  # before it, neither has statistics to give
        before = torch.accelerator.memory_stats()["active_bytes.all.current"]
        x = torch.randn(256, device="cuda")  # one 1 KiB block
        stats = torch.accelerator.memory_stats()
        assert stats["active_bytes.all.current"] == before + 1024, stats
        assert torch.accelerator.memory_allocated() == torch.cuda.memory_allocated()
        assert torch.accelerator.memory_reserved() == torch.cuda.memory_reserved()
        del x
        assert torch.accelerator.memory_stats()["active_bytes.all.current"] == before
    """)


@pytest.mark.parametrize("fraction", ["0.5", "0"])
def test_memory_fraction_from_the_environment(run, fraction):
    run(f"""
        fraction = {fraction}
        assert torch.cuda.get_per_process_memory_fraction(0) == fraction
        total = torch.cuda.get_device_properties(0).total_memory
        try:
            torch.empty(int(total * fraction) + 64 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            pass
        else:
            raise AssertionError("an allocation past the fraction was served")
        if fraction:
            x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    """, env={"PYTORCH_CUDA_ALLOC_CONF": f"per_process_memory_fraction:{fraction}"})


def test_history_names_regions_and_metadata(run):
    run("""
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        torch.cuda.memory._set_memory_metadata("phase one")
        torch.cuda.memory._record_memory_history(context="all")
        x = torch.rand(3, 4, device="cuda")
        del x
        torch.cuda.empty_cache()
        torch.cuda.memory._set_memory_metadata("")
        y = torch.rand(5, 4, device="cuda")
        entries = torch.cuda.memory._snapshot()["device_traces"][0]
        said = [(e["action"], e["user_metadata"]) for e in entries]
        # What came before the metadata was cleared says it, what came after does not.
        cleared = [m for _, m in said].index("")
        assert cleared >= 3 and said[-1] == ("alloc", ""), said
        assert all(m == "phase one" for _, m in said[:cleared]), said
        assert all(m == "" for _, m in said[cleared:]), said
        torch.cuda.memory._record_memory_history(None)

        # A graph break splits the function into two compiled regions; the allocations of
        # each name it, the others say N/A.
        def f(x):
            x = x * 2
            torch._dynamo.graph_break()
            return x + 1
        g = torch.compile(f)
        g(torch.randn(64, device="cuda"))
        torch.cuda.memory._record_memory_history(context="all", compile_context=True)
        g(torch.randn(64, device="cuda"))
        regions = []
        for e in torch.cuda.memory._snapshot()["device_traces"][0]:
            if e["compile_context"] != "N/A" and (not regions or regions[-1] != e["compile_context"]):
                regions.append(e["compile_context"])
        assert regions and all(r.startswith("Torch-Compiled Region") for r in regions), regions
        torch.cuda.memory._record_memory_history(None)
    """)


def test_history_skips_the_actions_asked(run):
    run("""
        for skipped in (["free_requested"], ["alloc", "segment_alloc"]):
            torch.cuda.memory._record_memory_history(context="all", skip_actions=skipped)
            x = torch.rand(128, 128, device="cuda")
            del x
            actions = {e["action"] for e in torch.cuda.memory._snapshot()["device_traces"][0]}
            assert actions and not actions & set(skipped), (skipped, actions)
            torch.cuda.memory._record_memory_history(None)
        try:
            torch.cuda.memory._record_memory_history(skip_actions=["frees"])
        except (RuntimeError, ValueError):
            pass  # an action neither allocator knows
        else:
            assert not VRAMKIT, "an unknown action was taken"
        torch.cuda.memory._record_memory_history(None)
    """)


def test_use_on_oom_mempool_serves_what_the_default_pool_refuses(run):
    run("""
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(0).total_memory
        held = torch.cuda.memory_reserved()
        torch.cuda.set_per_process_memory_fraction((held + 80 * MiB) / total)
        keep, lend = torch.cuda.MemPool(), torch.cuda.MemPool(use_on_oom=True)
        with torch.cuda.use_mem_pool(keep):
            a = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        with torch.cuda.use_mem_pool(lend):
            b = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        lent = b.data_ptr()
        try:  # the two pools hold the fraction's 80 MiB: the default pool has none left
            torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            pass
        else:
            raise AssertionError("the fraction did not count the MemPools' memory")
        del a, b
        c = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")  # from lend's free block
        assert lend.snapshot() and any(
            s["address"] <= c.data_ptr() < s["address"] + s["total_size"]
            for s in lend.snapshot()), "not served from the use_on_oom pool"
        try:  # lend has 10 MiB free, keep is not lent
            torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            pass
        else:
            raise AssertionError("served past the fraction")
        c.fill_(1)
        torch.cuda.synchronize()
        del c, keep, lend
        torch.cuda.set_per_process_memory_fraction(1.0)
    """)


def test_capture_keeps_a_side_streams_block_from_later_requests(run):
    run("""
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.stream(s1):
            g.capture_begin()
            data1 = torch.full((1 << 20,), 1.0, device="cuda")
            first = data1.data_ptr()
            s2.wait_stream(s1)
            with torch.cuda.stream(s2):
                out = data1 * 2
                data1.record_stream(s2)
            del data1
            data2 = torch.full((1 << 20,), 5.0, device="cuda")  # s2 may still read data1
            assert data2.data_ptr() != first
            s1.wait_stream(s2)
            g.capture_end()
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        assert float(out.min()) == float(out.max()) == 2.0
        assert float(data2.min()) == 5.0
    """)


def test_capture_reuses_a_side_streams_block_once_the_side_stream_joins(run):
    """graph_capture_record_stream_reuse: a block a side stream read, freed in the capture,
    is not reused while that stream may still read it, and is, at its address, once the
    capture's stream has joined it and captured work after the join."""
    run("""
        torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:True")
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.stream(s1):
            g.capture_begin()
            sink = torch.zeros(8, device="cuda")
            data1 = torch.full((8,), 1.0, device="cuda")
            first = data1.data_ptr()
            s2.wait_stream(s1)
            with torch.cuda.stream(s2):
                out = data1 + 2
                data1.record_stream(s2)
            del data1
            data2 = torch.full((8,), 5.0, device="cuda")  # s2 may still read data1
            assert data2.data_ptr() != first
            s1.wait_stream(s2)
            sink.fill_(1.0)
            data3 = torch.full((8,), 7.0, device="cuda")  # every read of data1 is before
            assert data3.data_ptr() == first
            g.capture_end()
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        assert out.tolist() == [3.0] * 8 and data3.tolist() == [7.0] * 8
        assert data2.tolist() == [5.0] * 8
        torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:False")
    """)

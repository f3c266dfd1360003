"""A cuda pool whose large blocks are in fixed segments (VRAMKIT_LARGE_BLOCKS=fixed) grows
into virtual memory near its cap (VRAMKIT_VIRTUAL_THRESHOLD, default 0.5 of it), on the real
driver, through PyTorch, CuPy and Numba: below the threshold
every block is in a cuMemAlloc segment; past it, blocks are in cuMemMap'd ranges that
PyTorch's snapshot shows as expandable segments; the data in both kinds is right through
every framework's kernels; the fixed segments left behind go back when the virtual range
needs their memory; and sharing a tensor in virtual memory with another process is refused
with a message that says how to keep every block shareable."""

TORCH = """
    try:
        import torch
    except ImportError:
        print("SKIP: PyTorch is not installed")
        raise SystemExit(0)
    import vramkit, vramkit.torch
    assert vramkit.torch.install() == "backend"
    MiB = 1 << 20

    def segment_of(t):
        p = t.data_ptr()
        for s in torch.cuda.memory_snapshot():
            if s["address"] <= p < s["address"] + s["total_size"]:
                return s
        raise AssertionError(f"{p:#x} is in no segment")
"""


# The pool's driver calls so far: allocations and releases, or maps and unmaps.
DRIVER_CALLS = """
    def calls():
        st = vramkit.memory_stats(0)
        return st["num_device_alloc"] + st["num_device_free"]
"""


def test_torch_tensors_on_both_sides_of_the_threshold(gpu_run):
    gpu_run(TORCH, """
        # A 1 GiB limit is the cap: fixed segments up to 512 MiB reserved.
        a = torch.full((300 * MiB // 4,), 1.0, device="cuda")
        assert not segment_of(a)["is_expandable"]
        b = torch.full((300 * MiB // 4,), 2.0, device="cuda")     # 300 + 300 > 512
        assert segment_of(b)["is_expandable"]
        c = torch.randn(2048, 2048, device="cuda")                 # 16 MiB, virtual too
        assert segment_of(c)["is_expandable"]
        assert float((a + b).sum()) == 3.0 * (300 * MiB // 4)
        ref = (c.double() @ c.double()).float()
        assert torch.allclose(c @ c, ref, rtol=1e-2, atol=1e-1)
        # Small requests keep their 2 MiB fixed segments.
        s = torch.ones(1000, device="cuda")
        assert not segment_of(s)["is_expandable"] and float(s.sum()) == 1000.0
        # The fixed segment left behind goes back when the range needs its memory: 650 MiB
        # fits beside b and c only once a's 300 MiB are given to the granules.
        del a, ref
        d = torch.full((650 * MiB // 4,), 3.0, device="cuda")
        assert segment_of(d)["is_expandable"]
        assert torch.cuda.memory_reserved() <= 1 << 30
        assert float(d[-5:].sum()) == 15.0 and float(b[:5].sum()) == 10.0
        stats = vramkit.memory_stats(0)
        assert stats["reserved_bytes.all.current"] == torch.cuda.memory_reserved()
        del b, c, d, s
        torch._C._cuda_clearCublasWorkspaces()   # the matmul's workspace is a live block
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() == 0, torch.cuda.memory_reserved()
    """, env={"VRAMKIT_LIMIT": "1G", "VRAMKIT_LARGE_BLOCKS": "fixed"})


def test_threshold_one_keeps_fixed_segments(gpu_run):
    gpu_run(TORCH, """
        a = torch.ones(300 * MiB // 4, device="cuda")
        b = torch.ones(300 * MiB // 4, device="cuda")
        assert not segment_of(a)["is_expandable"] and not segment_of(b)["is_expandable"]
    """, env={"VRAMKIT_LIMIT": "1G", "VRAMKIT_VIRTUAL_THRESHOLD": "1",
                 "VRAMKIT_LARGE_BLOCKS": "fixed"})


def test_sharing_a_tensor_in_virtual_memory_is_refused_clearly(gpu_run):
    gpu_run(TORCH, """
        import torch.multiprocessing.reductions as reductions
        fixed = torch.arange(1000, dtype=torch.float32, device="cuda")
        reductions.reduce_tensor(fixed)                           # a cuMemAlloc segment: fine
        big = torch.ones(600 * MiB // 4, device="cuda")           # past half of 1 GiB
        assert segment_of(big)["is_expandable"]
        try:
            reductions.reduce_tensor(big)
        except RuntimeError as exc:
            assert "VRAMKIT_VIRTUAL_THRESHOLD=1" in str(exc), str(exc)[:400]
            assert "VRAMKIT_LARGE_BLOCKS=fixed" in str(exc), str(exc)[:400]
        else:
            raise AssertionError("a tensor in virtual memory was shared")
        assert float(big[:10].sum()) == 10.0 and float(fixed.sum()) == 499500.0
    """, env={"VRAMKIT_LIMIT": "1G", "VRAMKIT_LARGE_BLOCKS": "fixed"})


def test_cupy_and_numba_arrays_in_virtual_memory(gpu_run):
    gpu_run("""
        try:
            import cupy
            from numba import cuda
        except ImportError:
            print("SKIP: CuPy or Numba is not installed")
            raise SystemExit(0)
        import numpy as np
        import vramkit, vramkit.cupy, vramkit.numba
        vramkit.configure(0, limit="1G", large_blocks="fixed")
        vramkit.cupy.install()
        MiB = 1 << 20
        n = 300 * MiB // 4
        fixed = cupy.arange(n, dtype=cupy.int32)
        virtual = cupy.arange(n, dtype=cupy.int32)                  # past half of the cap
        assert int((virtual - fixed).sum()) == 0
        assert int(virtual[-1]) == n - 1 and int(virtual[n // 2]) == n // 2

        def in_virtual(ptr):
            for seg in vramkit.snapshot(0)["segments"]:
                if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
                    return seg["is_expandable"]
            raise AssertionError(f"{ptr:#x} is in no segment")
        assert not in_virtual(fixed.data.ptr) and in_virtual(virtual.data.ptr)
        # Numba (the EMM plugin on the same pool): its array is virtual memory too; CuPy
        # doubles it in place through the CUDA array interface (no kernel compiled by
        # Numba, whose JIT the GPU machine's NumPy breaks), and Numba copies it back.
        arr = cuda.to_device(np.arange(1 << 20, dtype=np.float64))
        view = cupy.asarray(arr)
        view *= 2
        host = arr.copy_to_host()
        assert host[-1] == 2.0 * ((1 << 20) - 1) and host[0] == 0.0 and host[7] == 14.0
        assert in_virtual(arr.device_ctypes_pointer.value)
        assert type(cuda.current_context().memory_manager).__name__ == "VramkitMemoryManager"
        assert vramkit.memory_reserved(0) <= 1 << 30
    """, env={"NUMBA_CUDA_MEMORY_MANAGER": "vramkit.numba"})


def test_default_puts_large_tensors_in_virtual_ranges(gpu_run):
    # The default (large blocks virtual): a large tensor is mapped granules from the first
    # one, a small one is in its fixed 2 MiB segment, the data in both is right, and
    # everything goes back on empty_cache.
    gpu_run(TORCH, """
        a = torch.full((40 * MiB // 4,), 1.0, device="cuda")
        assert segment_of(a)["is_expandable"]
        s = torch.ones(1000, device="cuda")
        assert not segment_of(s)["is_expandable"]
        c = torch.randn(2048, 2048, device="cuda")
        ref = (c.double() @ c.double()).float()
        assert torch.allclose(c @ c, ref, rtol=1e-2, atol=1e-1)
        assert float(a.sum()) == 40 * MiB // 4 and float(s.sum()) == 1000.0
        del a, s, c, ref
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() == 0, torch.cuda.memory_reserved()
    """)


def test_default_training_loop_makes_no_driver_call_after_its_second_step(gpu_run):
    # The steady-state target through PyTorch on the card: a small transformer
    # trained under bf16 autocast with AdamW; from its third step the pool neither
    # allocates nor maps.
    gpu_run(TORCH, DRIVER_CALLS, """
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 4).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(16, 256, 512, device="cuda")

        per_step = []
        for step in range(6):
            before = calls()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            per_step.append(calls() - before)
        assert per_step[0] > 0, per_step
        assert sum(per_step[2:]) == 0, per_step
        assert torch.isfinite(loss).item()
    """)


def test_gpt2_loop_makes_no_driver_call_after_its_second_step(gpu_run):
    # tests/python/gpu_check.py's loop (GPT-2 with 4 layers from transformers, AdamW,
    # batch 8 x 512): its logits, four blocks of 785 MiB at the peak, move between holes
    # from step to step. Until the free-block index took the smallest block of a higher bin
    # (tlsf_inline.h) the layout drifted until step 5 and mapped once more there; its
    # recording is data/recordings/gpt2_4l_train.trace.gz.
    gpu_run(TORCH, DRIVER_CALLS, """
        try:
            from transformers import GPT2Config, GPT2LMHeadModel
        except ImportError:
            print("SKIP: transformers is not installed")
            raise SystemExit(0)
        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=4, n_head=12, n_embd=768, n_positions=1024,
                         attn_implementation="eager")
        model = GPT2LMHeadModel(cfg).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(1234)
        data = torch.randint(0, cfg.vocab_size, (8, 8, 512), generator=gen)

        per_step = []
        for step in range(8):
            before = calls()
            x = data[step].cuda()
            out = model(input_ids=x, labels=x)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            per_step.append(calls() - before)
        assert sum(per_step[2:]) == 0, per_step
        assert torch.isfinite(out.loss).item()
    """)

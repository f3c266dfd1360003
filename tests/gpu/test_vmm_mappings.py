"""The vmm source on the real driver, through PyTorch and CuPy: far from the cap (no limit)
it maps runs in mappings of up to 128 MiB, one physical handle each, and keeps them, so a
loop's second pass calls the driver no more; under a limit every 2 MiB granule is a mapping
of its own, so that the hole around a small block gives its memory back on empty_cache.
The data is right through each framework's kernels in both regimes."""

TORCH = """
    try:
        import torch
    except ImportError:
        print("SKIP: PyTorch is not installed")
        raise SystemExit(0)
    import vramkit, vramkit.torch
    assert vramkit.torch.install() == "backend"
    MiB = 1 << 20

    def calls():
        s = vramkit.memory_stats(0)
        return s["num_device_alloc"], s["num_device_free"]
"""


def test_torch_far_from_the_cap_maps_few_and_keeps_them(gpu_run):
    gpu_run(TORCH, """
        a0, _ = calls()
        x = torch.full((300 * MiB // 4,), 2.0, device="cuda")
        assert calls()[0] - a0 == 3, calls()                     # 128 + 128 + 44 MiB
        y = torch.randn(1024, 1024, device="cuda")
        assert float(x[-1000:].sum()) == 2000.0
        ref = (y.double() @ y.double()).float()
        assert torch.allclose(y @ y, ref, rtol=1e-2, atol=1e-1)
        after_first, _ = calls()
        # The same work again lands on mapped memory: no driver call.
        del x, y, ref
        for _ in range(3):
            x = torch.full((300 * MiB // 4,), 3.0, device="cuda")
            y = torch.randn(1024, 1024, device="cuda")
            assert float(x[:1000].sum()) == 3000.0
            del x, y
        assert calls()[0] == after_first, (after_first, calls())
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() == 0, torch.cuda.memory_reserved()
    """, env={"VRAMKIT_SOURCE": "vmm"})


def test_torch_under_a_limit_maps_granules(gpu_run):
    gpu_run(TORCH, """
        a0, f0 = calls()
        x = torch.full((100 * MiB // 4,), 1.0, device="cuda")
        assert calls()[0] - a0 == 50                              # one handle per 2 MiB
        del x
        small = torch.full((10 * MiB // 4,), 5.0, device="cuda")  # carved where x was
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() == 10 * MiB, torch.cuda.memory_reserved()
        assert float(small.sum()) == 5.0 * (10 * MiB // 4)
        big = torch.full((900 * MiB // 4,), 7.0, device="cuda")
        assert float(big[-10:].sum()) == 70.0 and float(small[:4].sum()) == 20.0
    """, env={"VRAMKIT_SOURCE": "vmm", "VRAMKIT_LIMIT": "4G"})


def test_cupy_on_large_mappings(gpu_run):
    gpu_run("""
        try:
            import cupy
        except ImportError:
            print("SKIP: CuPy is not installed")
            raise SystemExit(0)
        import vramkit, vramkit.cupy
        vramkit.cupy.install()
        def mapped():
            return vramkit.memory_stats(0)["num_device_alloc"]
        a = cupy.arange(200 << 18, dtype=cupy.float32)             # granules 0 to 99
        n = mapped()
        # 70 MiB from granule 100: pieces of up to 64 granules cut from where the unmapped
        # run begins, so its 35 granules are one piece (a's 100 were two: 64 + 36).
        assert n == 2, n
        b = cupy.ones(70 << 20, dtype=cupy.uint8)
        assert mapped() - n == 1, (n, mapped())
        assert float(a[:1000].sum()) == 499500.0
        assert int(b.sum()) == 70 << 20
        del a, b
        vramkit.empty_cache(0)
        assert vramkit.memory_reserved(0) == 0
    """, env={"VRAMKIT_SOURCE": "vmm"})

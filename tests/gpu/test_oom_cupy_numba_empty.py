"""Out of memory through CuPy (vramkit.cupy.install()), Numba (the EMM plugin) and
vramkit.empty: each framework's own exception, carrying vramkit's report; the memory comes
back after a free, and a computation on it afterwards gives the right answer."""


def test_cupy_out_of_memory_then_compute(gpu_run):
    gpu_run("""
        try:
            import cupy
        except ImportError:
            print("SKIP: CuPy is not installed")
            raise SystemExit(0)
        import vramkit, vramkit.cupy
        vramkit.configure(0, limit="512M")
        vramkit.cupy.install()
        keep = cupy.ones(300 << 20, dtype=cupy.uint8)
        try:
            cupy.empty(400 << 20, dtype=cupy.uint8)
        except cupy.cuda.memory.OutOfMemoryError as exc:
            error = exc
        else:
            raise AssertionError("400 MiB fit beside 300 MiB under a 512 MiB limit")
        assert isinstance(error, MemoryError)
        assert error.report and error.report == vramkit.last_oom_report(0)
        assert str(error).startswith("Out of memory allocating 419,430,400 bytes")
        assert error.report in str(error)
        del keep
        a = cupy.arange(400 << 18, dtype=cupy.float32)      # 400 MiB now fits
        assert float(a[:1000].sum()) == 499500.0

        # CuPy's pool collects garbage before it gives up; so does vramkit.cupy: memory
        # held only by a reference cycle comes back for the next request.
        del a
        class Holder:
            pass
        h = Holder(); h.self = h; h.array = cupy.ones(400 << 20, dtype=cupy.uint8)
        import gc; gc.disable(); del h
        b = cupy.ones(400 << 20, dtype=cupy.uint8)
        gc.enable()
        assert int(b[-10:].sum()) == 10
    """)


def test_numba_out_of_memory_then_compute(gpu_run):
    gpu_run("""
        try:
            from numba import cuda
            from numba.cuda.cudadrv.driver import CudaAPIError
        except ImportError:
            print("SKIP: Numba with CUDA is not installed")
            raise SystemExit(0)
        import numpy as np
        import vramkit, vramkit.numba
        assert type(cuda.current_context().memory_manager).__name__ == "VramkitMemoryManager"
        keep = cuda.device_array(300 << 20, dtype=np.uint8)
        try:
            cuda.device_array(400 << 20, dtype=np.uint8)
        except CudaAPIError as exc:
            error = exc
        else:
            raise AssertionError("400 MiB fit beside 300 MiB under a 512 MiB limit")
        assert int(error.code) == 2                    # CUDA_ERROR_OUT_OF_MEMORY
        assert error.report and error.report in str(error)
        del keep
        # 400 MiB now fits. The values go in and come back through Numba's own copies, and
        # CuPy, where present, computes on the same memory (through the CUDA array
        # interface); no kernel is compiled, so the check does not depend on Numba's JIT.
        host = np.arange(100 << 20, dtype=np.float32) % 7
        d = cuda.to_device(host)
        assert d.nbytes == 400 << 20
        assert np.array_equal(d.copy_to_host(), host)
        try:
            import cupy
        except ImportError:
            cupy = None
        if cupy is not None:
            assert float(cupy.asarray(d)[:700].sum()) == float(host[:700].sum())
    """, env={"NUMBA_CUDA_MEMORY_MANAGER": "vramkit.numba", "VRAMKIT_LIMIT": "512M"})


def test_vramkit_empty_out_of_memory_then_compute(gpu_run):
    gpu_run("""
        import vramkit
        vramkit.configure(0, limit="512M")
        keep = vramkit.empty(300 << 20)
        assert keep.ptr != 0
        try:
            vramkit.empty(400 << 20)
        except vramkit.OutOfMemoryError as exc:
            assert "out of memory on device 0" in str(exc)
        else:
            raise AssertionError("400 MiB fit beside 300 MiB under a 512 MiB limit")
        # Sizes no device holds are out of memory too, never a buffer at address 0.
        for size in ((1 << 48) + 1, 1 << 62):
            try:
                buf = vramkit.empty(size)
            except vramkit.OutOfMemoryError:
                pass
            else:
                raise AssertionError(f"empty({size}) gave ptr {buf.ptr}")
        keep.free()
        buf = vramkit.empty(400 << 20)
        assert buf.ptr != 0 and buf.ptr % 512 == 0
        zero = vramkit.empty(0)
        assert zero.nbytes == 0
        try:
            import torch
        except ImportError:
            torch = None
            print("no torch: the buffer is not computed on")
        if torch is not None:
            t = torch.as_tensor(buf, device="cuda")      # through __cuda_array_interface__
            t.fill_(2)
            assert t[-4096:].sum().item() == 8192
    """)

"""The PyTorch allocator hooks (libvramkit_torch.so), called through ctypes on sim as
PyTorch would call them, without PyTorch: they must share vramkit._core's pools."""


def test_hooks_share_the_default_pools(run):
    run("""
        import ctypes, os, vramkit
        MiB = 1 << 20
        lib = ctypes.CDLL(os.path.join(os.path.dirname(vramkit.__file__), "libvramkit_torch.so"))
        lib.vramkit_torch_malloc.restype = ctypes.c_void_p
        lib.vramkit_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        lib.vramkit_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                           ctypes.c_void_p]
        lib.vramkit_torch_set_memory_fraction.argtypes = [ctypes.c_double, ctypes.c_int]
        lib.vramkit_torch_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.vramkit_torch_device_used.argtypes = [ctypes.c_int]

        p = lib.vramkit_torch_malloc(1000, 1, None)
        assert p and p % 512 == 0
        assert vramkit.memory_allocated(1) == 1024          # one pool, seen from Python
        assert lib.vramkit_torch_device_used(1) == 1 and lib.vramkit_torch_device_used(0) == 0
        lib.vramkit_torch_record_stream(p, 7)
        lib.vramkit_torch_free(p, 1000, 1, None)
        assert vramkit.memory_allocated(1) == 0
        lib.vramkit_torch_empty_cache()
        assert vramkit.memory_reserved(1) == 0

        # set_per_process_memory_fraction reaches the pool; an OOM returns NULL and leaves
        # the report for vramkit.last_oom_report().
        lib.vramkit_torch_set_memory_fraction(0.25, 1)
        assert vramkit.memory_stats(1)["limit_bytes"] == 256 * MiB
        lib.vramkit_torch_set_memory_fraction(0.0, 1)      # PyTorch's "nothing at all"
        assert vramkit.memory_stats(1)["limit_bytes"] == 1
        assert lib.vramkit_torch_malloc(512 * MiB, 1, None) is None
        assert lib.vramkit_torch_last_status() == vramkit._core.VRAM_ENOMEM
        assert lib.vramkit_torch_last_oom_device() == 1
        assert len(vramkit.last_oom_report(1)) > 40
        assert lib.vramkit_torch_malloc(-1, 1, None) is None   # never aborts
        assert lib.vramkit_torch_malloc(16, 99, None) is None
        q = lib.vramkit_torch_malloc(0, 1, None)               # size 0: NULL, as PyTorch's
        assert q is None or q == 0
    """, env={"VRAMKIT_SIM_CAPACITY": "1G"})

"""Pools of one's own and neighbours that give back, on the real GPU: a vramkit.Pool on the
cuda source beside the default pool, read and written through CuPy; a process about to run
out on the card gets the idle cache of another vramkit process; Dask workers on vramkit.

Sizes come from the card's free memory when the test starts, so that the suite runs on any
card, and each process only asks for device memory (never managed memory)."""


def test_a_private_pool_beside_the_default_one(gpu_run):
    gpu_run("""
        import vramkit
        pool = vramkit.Pool(source="cuda", limit="1G")
        buf = pool.allocate(512 << 20)
        assert buf.pool is pool and pool.memory_allocated() >= 512 << 20
        assert vramkit.memory_allocated(0) == 0          # the default pool holds nothing
        try:
            pool.allocate(768 << 20)                     # past its own limit
        except vramkit.OutOfMemoryError as exc:
            assert exc.oom_info and exc.oom_info["cause"], exc.oom_info
        else:
            raise AssertionError("768 MiB fit beside 512 MiB under a 1 GiB limit")
        try:
            import cupy
        except ImportError:
            cupy = None
        if cupy is not None:
            view = cupy.asarray(buf).view(cupy.uint8)    # __cuda_array_interface__
            view[:] = 7
            assert int(view[-16:].sum()) == 7 * 16
            del view                                     # a view keeps its buffer alive
        del buf
        pool.empty_cache()
        assert pool.memory_reserved() == 0
        pool.close()
    """)


def test_a_neighbour_on_the_card_gives_its_idle_cache_back(gpu_run):
    out = gpu_run("""
        import os, subprocess, sys, tempfile
        folder = tempfile.mkdtemp()                     # the group's folder, before any pool
        os.environ["VRAMKIT_PUBLISH_DIR"] = folder
        import vramkit
        free, total = vramkit.mem_get_info(0)
        chunk = 256 << 20
        n = int(free * 0.6) // chunk                    # A peaks at 60% of what is free
        env = dict(os.environ)
        # A's code, one line each: a block at column 0 would undo the dedent of this one.
        holder_code = "\\n".join([
            "import sys, vramkit",
            f"blocks = [vramkit.empty({chunk}) for _ in range({n})]",
            "del blocks",                                # cached, idle
            "print('ready', flush=True)",
            "sys.stdin.read()"])
        holder = subprocess.Popen([sys.executable, "-c", holder_code], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "ready"
        free_now, _ = vramkit.mem_get_info(0)
        want = int(free * 0.6) // chunk * chunk         # more than is free beside A's cache
        assert want > free_now, (want, free_now)
        buf = vramkit.empty(want)
        stats = vramkit.memory_stats(0)
        holder.communicate("")
        print("asked", stats["giveback_requests"], "received", stats["giveback_received_bytes"],
              "waited_us", stats["giveback_wait_us"])
        assert stats["giveback_requests"] >= 1
        assert stats["giveback_received_bytes"] >= want - free_now
        assert holder.returncode == 0
    """)
    assert "asked" in out


def test_dask_workers_on_vramkit_with_cupy(gpu_run):
    gpu_run("""
        try:
            import cupy, dask.array as da
            from distributed import Client, LocalCluster
        except ImportError as missing:
            print(f"SKIP: {missing.name} is not installed")
            raise SystemExit(0)
        import vramkit.dask
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            vramkit.dask.install(client, pool_size="2G", maximum_pool_size="8G")
            x = da.ones((8192, 8192), chunks=(2048, 2048), dtype="float32")
            x = x.map_blocks(cupy.asarray)
            total = float(x.sum().compute())
            assert total == 8192.0 * 8192.0, total
            info = client.run(vramkit.dask.worker_pool_info)
            (worker,) = info.values()
            assert worker["cupy"] == "installed", worker
            assert worker["source"] == "cuda" and worker["peak_reserved"] >= 2 << 30, worker
    """)

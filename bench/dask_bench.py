"""bench/dask_bench.py - a Dask GPU worker on vramkit's pool against the same worker on RMM's.

Issue 39 asks whether vramkit.dask can stand in for dask-cuda's ``rmm_pool_size``: the same
dask.array workloads on CuPy, one worker on one GPU, run twice in fresh worker processes:

  rmm      LocalCUDACluster(rmm_pool_size=P, rmm_allocator_external_lib_list=["cupy"])
  vramkit  LocalCUDACluster() + vramkit.dask.install(client, pool_size=P, cupy=True)

Workloads, on a random float32 matrix persisted on the worker (--n, chunks of --chunk):
make (generate and persist it), sum (an elementwise step and a full reduction), matmul (a
square half of it times its transpose, summed) and rechunk (square chunks to tall strips,
by tasks, reduced along the strips). Each prints its wall time, the worker's peak of device
memory as the driver counts it (NVML, sampled from this process; context included), and
the allocator's own peak reserved (vramkit: max_memory_reserved on the worker; RMM: the
pool's size, which never shrinks). Then, in fresh workers with maximum_pool_size = --limit
for both: one allocation past the limit (the exception the client gets), whether the same
worker process allocates afterwards, and a persisted array bigger than the limit.

Needs a GPU, CuPy, dask, distributed, dask-cuda and RMM's Python package on the machine
(bench/dask_wheels.sh fetches and installs them on a machine without network). Without a
GPU it says so and exits with status 2. ``--cpu-check`` runs the same code paths on NumPy
blocks, a plain distributed LocalCluster and vramkit's sim source, at toy sizes, without
RMM: it checks the script, not the allocators.

    python3 bench/dask_bench.py [--n 98304] [--chunk 8192] [--pool-size 48G] [--limit 8G]
                                [--arms rmm,vramkit] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time

GiB = 1 << 30
NEEDS_GPU_STATUS = 2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=98304, help="side of the float32 matrix")
    p.add_argument("--chunk", type=int, default=8192, help="side of its square chunks")
    p.add_argument("--pool-size", default="48G", help="rmm_pool_size and pool_size")
    p.add_argument("--limit", default="8G", help="maximum_pool_size of the OOM test")
    p.add_argument("--arms", default="rmm,vramkit", help="which allocators, in this order")
    p.add_argument("--json", help="write the results here too")
    p.add_argument("--cpu-check", action="store_true",
                   help="NumPy blocks, LocalCluster and the sim source at toy sizes")
    args = p.parse_args(argv)
    if args.cpu_check:
        args.n, args.chunk, args.pool_size, args.limit = 2048, 256, "64M", "256M"
        args.arms = ",".join(a for a in args.arms.split(",") if a != "rmm")
    return args


def size_bytes(text: str) -> int:
    """A size as vramkit reads it ("48G" = 48 GiB), passed to both allocators as bytes so
    that dask-cuda's 1000-based units cannot make the pools differ."""
    from vramkit import _core
    return _core.parse_size(text, False)[0]


def missing_for_gpu_run(arms: list[str]) -> str | None:
    """Why this machine cannot run the GPU benchmark of these arms, or None."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CUDA sees no GPU"
    except Exception as exc:  # CuPy raises its CUDARuntimeError without a driver
        return f"CUDA cannot start ({exc})"
    # The rmm arm is dask-cuda's RMM set-up; the vramkit arm runs on a plain LocalCluster too.
    modules = ["dask", "distributed", "vramkit.dask"] + \
        (["dask_cuda", "rmm"] if "rmm" in arms else [])
    for module in modules:
        try:
            __import__(module)
        except ImportError as exc:
            return f"{module} does not import ({exc}); bench/dask_wheels.sh install"
    return None


# ---- what runs on the worker ---------------------------------------------------------------

def random_block(gpu: bool, block_info=None):
    info = block_info[None]
    row, column = info["chunk-location"]
    seed = row * 100_003 + column
    if gpu:
        import cupy
        return cupy.random.default_rng(seed).random(info["chunk-shape"], dtype=cupy.float32)
    import numpy
    return numpy.random.default_rng(seed).random(info["chunk-shape"], dtype=numpy.float32)


def allocate(nbytes: int, gpu: bool) -> int:
    """Hold nbytes of device memory for the task's length (through CuPy's allocator, so
    through whichever pool the worker's plugin installed); the worker's pid."""
    if gpu:
        import cupy
        held = cupy.empty(nbytes, dtype=cupy.uint8)
    else:
        import vramkit
        held = vramkit.empty(nbytes)
    del held
    return os.getpid()


def allocator_memory(arm: str) -> dict:
    """The allocator's own figures on this worker: reserved now and its peak."""
    if arm == "vramkit":
        import vramkit
        return {"reserved": vramkit.memory_reserved(), "peak_reserved": vramkit.max_memory_reserved()}
    import rmm
    resource = rmm.mr.get_current_device_resource()
    while not hasattr(resource, "pool_size") and hasattr(resource, "get_upstream"):
        resource = resource.get_upstream()
    size = resource.pool_size() if hasattr(resource, "pool_size") else None
    return {"reserved": size, "peak_reserved": size}  # a pool that never gives back


def reset_peak(arm: str) -> None:
    if arm == "vramkit":
        import vramkit
        vramkit.reset_peak_memory_stats()


# ---- the driver's view of the worker -------------------------------------------------------

def process_device_bytes(pid: int) -> int:
    """Device memory NVML counts for one process, over every GPU."""
    from vramkit.observe._nvml import nvml
    return sum(p.used_bytes or 0 for gpu in nvml().devices() for p in gpu.processes
               if p.pid == pid)


@contextlib.contextmanager
def device_memory_peak(pid: int, period_s: float = 0.02):
    """Polls the process's device memory in a thread while the block runs; yields a dict
    whose "peak" is the largest figure seen (None without NVML, as in the CPU check)."""
    seen = {"peak": None}
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            try:
                used = process_device_bytes(pid)
            except Exception:  # no NVML: no figure
                return
            seen["peak"] = used if seen["peak"] is None else max(seen["peak"], used)
            stop.wait(period_s)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


# ---- clusters ------------------------------------------------------------------------------

def start_client(arm: str, args, pool: int, limit: int | None):
    """A one-worker cluster whose worker allocates through arm's pool; (cluster, client)."""
    from distributed import Client, LocalCluster
    common = {"n_workers": 1, "threads_per_worker": 1, "dashboard_address": None}
    try:
        if args.cpu_check:
            raise ImportError("the CPU check runs on a plain LocalCluster")
        from dask_cuda import LocalCUDACluster
    except ImportError as exc:
        if arm == "rmm":
            raise SystemExit(f"dask_bench: the rmm arm needs dask-cuda ({exc})")
        cluster = LocalCluster(processes=True, **common)
    else:
        rmm_options = {"rmm_pool_size": pool, "rmm_maximum_pool_size": limit,
                       "rmm_allocator_external_lib_list": ["cupy"]} if arm == "rmm" else {}
        cluster = LocalCUDACluster(**common, **rmm_options)
    client = Client(cluster)
    if arm == "vramkit":
        import vramkit.dask
        sim = {"source": "sim", "sim_capacity": "4G"} if args.cpu_check else {}
        vramkit.dask.install(client, pool_size=pool, maximum_pool_size=limit,
                             cupy=not args.cpu_check, **sim)
    return cluster, client


def one_worker(client) -> str:
    return next(iter(client.scheduler_info()["workers"]))


# ---- the runs ------------------------------------------------------------------------------

def workloads(x, n: int, chunk: int):
    """(name, dask collection) of each timed workload on the persisted matrix x."""
    half = x[: n // 2, : n // 2]
    return [("sum", (x * 2 + 1).sum()),
            ("matmul", (half @ half.T).sum()),
            ("rechunk", x.rechunk((n, max(1, chunk // 8)), method="tasks").sum(axis=0).sum())]


def timed(client, arm: str, worker: str, pid: int, name: str, run) -> dict:
    client.run(reset_peak, arm, workers=[worker])
    with device_memory_peak(pid) as sampled:
        start = time.perf_counter()
        run()
        wall = time.perf_counter() - start
    memory = client.run(allocator_memory, arm, workers=[worker])[worker]
    return {"arm": arm, "workload": name, "wall_s": round(wall, 3),
            "nvml_peak_bytes": sampled["peak"], "peak_reserved_bytes": memory["peak_reserved"]}


def run_workloads(arm: str, args, pool: int) -> list[dict]:
    import dask.array as da
    cluster, client = start_client(arm, args, pool, None)
    try:
        worker = one_worker(client)
        gpu = not args.cpu_check
        pid = client.submit(allocate, 1 << 20, gpu, pure=False).result()  # warms CUDA up
        meta = random_block(gpu, {None: {"chunk-location": (0, 0), "chunk-shape": (0, 0)}})
        blocks = tuple([args.chunk] * (args.n // args.chunk))
        x = da.map_blocks(random_block, gpu, chunks=(blocks, blocks), dtype="float32", meta=meta)
        holder = {}

        def make():
            holder["x"], _, failed = persist(x)
            if failed:
                raise RuntimeError(f"the matrix did not fit: {failed[0].exception()!r}")

        rows = [timed(client, arm, worker, pid, "make", make)]
        for name, collection in workloads(holder["x"], len(blocks) * args.chunk, args.chunk):
            rows.append(timed(client, arm, worker, pid, name,
                              lambda c=collection: float(c.compute())))
        return rows
    finally:
        client.close()
        cluster.close()


def run_out_of_memory(arm: str, args, pool: int, limit: int) -> dict:
    """Past the limit: the exception, whether the worker allocates after, a dask.array past it."""
    import dask.array as da
    cluster, client = start_client(arm, args, min(pool, limit // 2), limit)
    gpu = not args.cpu_check
    row = {"arm": arm, "workload": "oom", "limit_bytes": limit}
    try:
        pid = client.submit(allocate, 1 << 20, gpu, pure=False).result()
        start = time.perf_counter()
        try:
            client.submit(allocate, limit + GiB, gpu, pure=False).result()
            row["past_limit"] = "no error"
        except Exception as exc:
            row["past_limit"] = f"{type(exc).__module__}.{type(exc).__name__}: " \
                                f"{str(exc).splitlines()[0][:160] if str(exc) else ''}"
        row["raise_s"] = round(time.perf_counter() - start, 3)
        try:
            after = client.submit(allocate, limit // 2, gpu, pure=False).result()
            row["after"] = "same worker allocates" if after == pid else "worker was restarted"
        except Exception as exc:
            row["after"] = f"fails: {type(exc).__name__}"
        side = int((1.5 * limit / 4) ** 0.5) // args.chunk * args.chunk or args.chunk
        blocks = tuple([args.chunk] * (side // args.chunk))
        meta = random_block(gpu, {None: {"chunk-location": (0, 0), "chunk-shape": (0, 0)}})
        big = da.map_blocks(random_block, gpu, chunks=(blocks, blocks), dtype="float32", meta=meta)
        row["array_past_limit"] = persist_outcome(big)
        return row
    finally:
        client.close()
        cluster.close()


def persist(array):
    """array persisted on the workers, once every chunk is computed or has failed; with its
    futures and the failed ones among them."""
    from distributed import futures_of, wait
    persisted = array.persist()
    futures = futures_of(persisted)
    wait(futures, timeout=300)
    return persisted, futures, [f for f in futures if f.status == "error"]


def persist_outcome(array) -> str:
    """Persist array and say how it went: held, or how many chunks failed and why."""
    _, futures, failed = persist(array)
    if not failed:
        return f"all {len(futures)} chunks held"
    exc = failed[0].exception()
    first_line = str(exc).splitlines()[0][:120] if str(exc) else ""
    return f"{len(failed)} of {len(futures)} chunks failed, {type(exc).__name__}: {first_line}"


def print_table(rows: list[dict]) -> None:
    def gib(value):
        return "-" if value is None else f"{value / GiB:.2f}"
    print(f"{'arm':8} {'workload':8} {'wall s':>8} {'NVML peak GiB':>14} {'peak reserved GiB':>18}")
    for r in rows:
        if r["workload"] != "oom":
            print(f"{r['arm']:8} {r['workload']:8} {r['wall_s']:8.3f} "
                  f"{gib(r['nvml_peak_bytes']):>14} {gib(r['peak_reserved_bytes']):>18}")
    for r in rows:
        if r["workload"] == "oom":
            print(f"{r['arm']}: over a limit of {gib(r['limit_bytes'])} GiB: {r['past_limit']} "
                  f"({r['raise_s']} s); then {r['after']}; an array past it: "
                  f"{r['array_past_limit']}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.cpu_check:
        why = missing_for_gpu_run(args.arms.split(","))
        if why:
            print(f"dask_bench: needs a GPU and CuPy (with dask, distributed, dask-cuda and "
                  f"RMM): {why}. bench/dask_bench.py --cpu-check runs the script's paths on "
                  f"NumPy and the sim source.", file=sys.stderr)
            return NEEDS_GPU_STATUS
    pool, limit = size_bytes(args.pool_size), size_bytes(args.limit)
    rows = []
    for arm in args.arms.split(","):
        rows += run_workloads(arm, args, pool)
    for arm in args.arms.split(","):
        rows.append(run_out_of_memory(arm, args, pool, limit))
    print_table(rows)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"args": vars(args), "rows": rows}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

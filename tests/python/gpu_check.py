"""gpu_check.py - the GPU checks of the Python package (run by hand on a GPU machine).

Not collected by pytest (the name does not start with test_). Needs CUDA, PyTorch,
transformers, CuPy and Numba, and vramkit installed (pip install .). Usage:

    python tests/python/gpu_check.py            # every check; one JSON line per result

Each check runs in its own interpreter, because PyTorch's allocator can be chosen only
once per process:
  train   GPT-2 (random weights, fixed seed, deterministic algorithms) trains a few steps
          with PyTorch's allocator and with vramkit; the losses must match exactly; step
          time, max reserved memory and the driver calls of the steps after the first two
          of both are reported. VRAMKIT_* variables reach the vramkit run (say,
          VRAMKIT_LARGE_BLOCKS=fixed VRAMKIT_TIGHT_THRESHOLD=0 to measure tight placement
          in a training loop).
  oom     under a vramkit limit, a batch too large raises a catchable OOM carrying
          vramkit's report; training continues at a smaller batch.
  interop CuPy (vramkit.cupy.install) and Numba (the EMM plugin) arrays backed by vramkit
          memory, and a vramkit.empty buffer shared through __cuda_array_interface__.
  micro   vramkit.empty(n)+del vs CuPy MemoryPool.malloc+free vs
          torch.cuda.caching_allocator_alloc+delete, from Python, same process.
"""

import json
import os
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def emit(**fields):
    print(json.dumps(fields), flush=True)


# ---------------------------------------------------------------------------------------
# train: GPT-2 losses, step time, peak reserved.
# ---------------------------------------------------------------------------------------
def run_train(allocator: str, steps: int = 8, batch: int = 8, seq: int = 512):
    path = None
    if allocator == "vramkit":
        import vramkit.torch
        path = vramkit.torch.install()
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    cfg = GPT2Config(n_layer=4, n_head=12, n_embd=768, n_positions=1024,
                     attn_implementation="eager")
    model = GPT2LMHeadModel(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1234)
    data = torch.randint(0, cfg.vocab_size, (steps, batch, seq), generator=gen)

    def device_calls():
        # cudaMalloc + cudaFree calls so far: PyTorch's and vramkit's counters share names.
        if allocator == "vramkit":
            import vramkit
            stats = vramkit.memory_stats(0)
        else:
            stats = torch.cuda.memory_stats(0)
        return stats["num_device_alloc"] + stats["num_device_free"]

    losses, times = [], []
    calls_at_warm = 0
    for step in range(steps):
        if step == 2:
            calls_at_warm = device_calls()
        x = data[step].cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(out.loss.item())
    if allocator == "vramkit":
        import vramkit
        max_reserved = vramkit.max_memory_reserved(0)
        max_allocated = vramkit.max_memory_allocated(0)
    else:
        max_reserved = torch.cuda.max_memory_reserved(0)
        max_allocated = torch.cuda.max_memory_allocated(0)
    warm = sorted(times[2:]) or times
    emit(check="train", allocator=allocator, losses=[repr(v) for v in losses],
         step_ms=1e3 * warm[len(warm) // 2], max_reserved_bytes=max_reserved,
         max_allocated_bytes=max_allocated,
         device_calls_warm=device_calls() - calls_at_warm, path=path,
         tight_threshold=os.environ.get("VRAMKIT_TIGHT_THRESHOLD"))


# ---------------------------------------------------------------------------------------
# oom: catch an OOM under a limit, go on with a smaller batch.
# ---------------------------------------------------------------------------------------
def run_oom():
    import vramkit
    import vramkit.torch
    vramkit.torch.install(device=0, limit="4G")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=4, attn_implementation="eager")
    model = GPT2LMHeadModel(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch):
        x = torch.randint(0, cfg.vocab_size, (batch, 1024), device="cuda")
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    caught, exc_type, report, message = False, None, "", ""
    try:
        with vramkit.torch.oom_report():
            step(64)
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as exc:
        caught, exc_type = True, type(exc).__name__
        report = getattr(exc, "report", "") or vramkit.last_oom_report()
        message = str(exc)[:400]
    opt.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()
    losses = [step(2) for _ in range(3)]
    emit(check="oom", caught=caught, exception=exc_type, report_len=len(report),
         report_in_message=bool(report) and report in message,
         report_head=report[:300], continued_losses=losses,
         num_ooms=vramkit.memory_stats(0)["num_ooms"],
         ok=caught and bool(report) and all(v == v for v in losses))


# ---------------------------------------------------------------------------------------
# interop: CuPy and Numba arrays on vramkit memory.
# ---------------------------------------------------------------------------------------
def run_interop():
    import numpy as np
    import vramkit

    results = {}
    # CuPy through cupy.cuda.set_allocator.
    import cupy
    import vramkit.cupy
    vramkit.cupy.install()
    before = vramkit.memory_allocated(0)
    host = np.arange(1 << 20, dtype=np.float32)
    a = cupy.asarray(host)
    b = a * 2
    grew = vramkit.memory_allocated(0) - before
    results["cupy_roundtrip"] = bool(np.array_equal(cupy.asnumpy(b), host * 2))
    results["cupy_bytes_from_vramkit"] = grew
    del a, b
    results["cupy_freed"] = vramkit.memory_allocated(0) == before

    # Numba through the EMM plugin.
    from numba import cuda
    import vramkit.numba
    cuda.set_memory_manager(vramkit.numba.VramkitMemoryManager)
    before = vramkit.memory_allocated(0)
    d = cuda.to_device(host)
    grew = vramkit.memory_allocated(0) - before
    results["numba_roundtrip"] = bool(np.array_equal(d.copy_to_host(), host))
    results["numba_bytes_from_vramkit"] = grew
    del d

    # One vramkit buffer seen by both through __cuda_array_interface__.
    buf = vramkit.empty(host.nbytes)
    c_view = cupy.asarray(buf).view(cupy.float32)
    c_view[...] = cupy.asarray(host)
    n_view = cuda.as_cuda_array(buf)
    results["cai_shared"] = bool(np.array_equal(n_view.copy_to_host().view(np.float32), host))
    del c_view, n_view, buf
    emit(check="interop", ok=all(v for k, v in results.items()), **results)


# ---------------------------------------------------------------------------------------
# managed: a pool on the managed source; the host writes, the device reads and writes, the
# host reads back (pages migrate both ways). Small: never more managed memory than is free.
# ---------------------------------------------------------------------------------------
def run_managed(nbytes: int = 64 << 20):
    import ctypes
    import numpy as np
    import cupy
    import vramkit

    vramkit.configure(0, source="managed")
    buf = vramkit.empty(nbytes)
    n = nbytes // 4
    host = np.ctypeslib.as_array((ctypes.c_float * n).from_address(buf.ptr))
    pattern = np.arange(n, dtype=np.float32)
    host[...] = pattern                          # written on the host
    dev = cupy.asarray(buf).view(cupy.float32)   # the same pages, seen by the device
    total = float(dev.sum())                     # read on the device
    dev *= 2                                     # written on the device
    cupy.cuda.runtime.deviceSynchronize()
    back = np.array(host)                        # read back on the host
    ok_read = abs(total - float(pattern.astype(np.float64).sum())) < 1e-3 * total
    ok_back = bool(np.array_equal(back, pattern * 2))
    emit(check="managed", source=vramkit.source(0), device_sum_ok=ok_read, host_roundtrip=ok_back,
         ok=ok_read and ok_back and vramkit.source(0) == "managed")


# ---------------------------------------------------------------------------------------
# micro: alloc+free pair from Python.
# ---------------------------------------------------------------------------------------
def _per_op(fn, n):
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        fn(n)
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def run_micro(n: int = 200_000):
    import cupy
    import torch
    import vramkit

    torch.cuda.init()
    pool = cupy.cuda.MemoryPool()
    empty = vramkit.empty
    alloc, delete = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete

    for size in (512, 64 << 10, 2 << 20):
        def vk(k, size=size):
            for _ in range(k):
                b = empty(size)
                del b

        def cp(k, size=size):
            for _ in range(k):
                p = pool.malloc(size)
                del p

        def th(k, size=size):
            for _ in range(k):
                p = alloc(size)
                delete(p)

        for f in (vk, cp, th):
            f(1000)  # warm the caches
        emit(check="micro", size=size, vramkit_ns=_per_op(vk, n), cupy_pool_ns=_per_op(cp, n),
             torch_caching_ns=_per_op(th, n), source=vramkit.source(0))


# ---------------------------------------------------------------------------------------
def child(args):
    mode = args[0]
    if mode == "train":
        run_train(args[1])
    elif mode == "oom":
        run_oom()
    elif mode == "interop":
        run_interop()
    elif mode == "micro":
        run_micro()
    elif mode == "managed":
        run_managed()
    else:
        raise SystemExit(f"unknown mode {mode}")


def spawn(*args):
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONHASHSEED="0")
    proc = subprocess.run([sys.executable, HERE, "--child", *args], env=env,
                          capture_output=True, text=True, timeout=900)
    records = []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
            print(line, flush=True)
    if proc.returncode != 0:
        emit(check=args[0], args=list(args), ok=False, returncode=proc.returncode,
             stderr=proc.stderr[-3000:])
    return records


def main():
    checks = sys.argv[1:] or ["train", "oom", "interop", "managed", "micro"]
    if "train" in checks:
        ref = spawn("train", "torch")
        mine = spawn("train", "vramkit")
        if ref and mine:
            r, m = ref[0], mine[0]
            emit(check="train_compare", losses_equal=r["losses"] == m["losses"],
                 step_ms_torch=r["step_ms"], step_ms_vramkit=m["step_ms"],
                 step_time_ratio=m["step_ms"] / r["step_ms"],
                 max_reserved_torch=r["max_reserved_bytes"],
                 max_reserved_vramkit=m["max_reserved_bytes"],
                 reserved_ratio=m["max_reserved_bytes"] / max(1, r["max_reserved_bytes"]),
                 device_calls_warm_torch=r["device_calls_warm"],
                 device_calls_warm_vramkit=m["device_calls_warm"])
    for name in ("oom", "interop", "managed", "micro"):
        if name in checks:
            spawn(name)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()

"""Set-up of the GPU suite: out of memory through PyTorch, CuPy, Numba and vramkit.empty,
each in a fresh interpreter, on a real GPU.

Every test runs its body in a child process, because an allocator is chosen once per
process (vramkit.torch.install() must precede PyTorch's first CUDA allocation) and limits
are set when a pool is created. The `run` fixture runs a PyTorch body twice, under PyTorch's
allocator ([native]) and under vramkit's complete backend ([vramkit]). Without a GPU the whole suite is skipped, saying so; a test
whose framework is absent skips itself, naming it.
"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest


def _gpu_present() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and "GPU" in done.stdout


GPU = _gpu_present()
# Printed by the child after the last line of its code: a body that returned early (or
# was swallowed by a block above it) fails instead of passing silently.
DONE = "-- gpu_run: the end of the code was reached --"


def pytest_collection_modifyitems(config, items):
    if GPU:
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU here: the GPU suite runs on the GPU machine "
                                   "(bench/gpu_bench.sh)")
    for item in items:
        item.add_marker(skip)


@pytest.fixture
def gpu_run():
    """gpu_run(*parts, env=None): run the code parts (each dedented on its own, then
    joined) in a fresh interpreter on the real GPU (source cuda unless env says otherwise)
    and return its stdout. A child that prints SKIP: <why> skips the test; one that exits
    non-zero, or does not reach the end of its code, fails it with its output."""

    def run(*parts: str, env: dict | None = None, timeout: int = 300) -> str:
        code = "\n".join(textwrap.dedent(part) for part in parts) + f"\nprint({DONE!r})\n"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMKIT_")}
        full_env.update({"VRAMKIT_SOURCE": "cuda", "PYTHONUNBUFFERED": "1"})
        full_env.update(env or {})
        proc = subprocess.run([sys.executable, "-c", code], env=full_env,
                              capture_output=True, text=True, timeout=timeout)
        for line in proc.stdout.splitlines():
            if line.startswith("SKIP:"):
                pytest.skip(line[5:].strip())
        if proc.returncode != 0 or DONE not in proc.stdout:
            pytest.fail(f"child exited {proc.returncode}:\n--- stdout\n{proc.stdout}\n"
                        f"--- stderr\n{proc.stderr[-6000:]}", pytrace=False)
        return proc.stdout

    return run


TORCH_ALLOCATORS = ["native", "vramkit"]

# What every `run` body starts with: PyTorch, and under [vramkit] the complete backend
# installed before anything touches CUDA. VRAMKIT is true there; MiB is a mebibyte.
TORCH_PRELUDE = """
    import os
    try:
        import torch
    except ImportError:
        print("SKIP: PyTorch is not installed")
        raise SystemExit(0)
    import vramkit, vramkit.torch
    ALLOC = os.environ["VK_ALLOC"]
    VRAMKIT = ALLOC == "vramkit"
    if VRAMKIT:
        took = vramkit.torch.install()
        assert took == "backend", took
        assert vramkit.torch.backend() == "backend"
    MiB = 1 << 20
"""


@pytest.fixture(params=TORCH_ALLOCATORS)
def run(request, gpu_run):
    """run(body, env=None, timeout=300): the body after TORCH_PRELUDE, once per allocator."""
    def go(body, env=None, timeout=300):
        return gpu_run(TORCH_PRELUDE, body, env={"VK_ALLOC": request.param, **(env or {})},
                       timeout=timeout)
    return go

"""The complete PyTorch backend (python/vramkit/plug/torch_backend.cpp) without a GPU.

Built by vramkit.plug._torch_build against the torch installed in the test environment, as
vramkit.torch.install() builds it, then: its own logic driven on sim by a C++ program
compiled together with it (torch_backend_driver.cpp), and its installation into a real
torch, after which PyTorch's own statistics call reaches vramkit. Everything a CUDA device
is needed for runs through PyTorch on the GPU (tests/gpu/test_torch_backend.py).
"""

import ctypes
import os
import pathlib
import subprocess

import pytest

torch = pytest.importorskip("torch")

from vramkit.plug import _torch_build  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def toolchain():
    compiler = _torch_build.find_compiler()
    if compiler is None:
        pytest.skip("no C++ compiler")
    try:
        cuda_include, cudart = _torch_build.cuda_runtime()
    except _torch_build.BuildError as exc:
        pytest.skip(f"torch here has no CUDA runtime headers: {exc}")
    include_dir, lib_dir, abi = _torch_build.torch_paths()
    return compiler, include_dir, lib_dir, abi, cuda_include, cudart


@pytest.mark.parametrize("source, passed", [
    ("torch_backend_driver.cpp", "backend driver: all checks passed"),
    # graph_capture_record_stream_reuse, over a capture graph the driver plays
    ("torch_backend_capture_driver.cpp", "capture driver: all checks passed"),
])
def test_backend_logic_on_sim(toolchain, tmp_path, source, passed):
    compiler, include_dir, lib_dir, abi, cuda_include, cudart = toolchain
    driver = tmp_path / "driver"
    command = _torch_build.backend_command(
        compiler, str(HERE / source), str(driver), include_dir, lib_dir,
        abi, cuda_include, cudart, _torch_build.package_dir(),
        _torch_build.vramkit_include_dir())
    command = [c for c in command if c != "-shared"]          # a program, not a library
    command[1:1] = ["-I", _torch_build.source_dir(), "-Wall", "-Wextra", "-Werror"]
    built = subprocess.run(command, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-4000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMKIT_")}
    env.update(VRAMKIT_SOURCE="sim", VRAMKIT_SIM_CAPACITY="1G")
    done = subprocess.run([str(driver)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == passed


def test_backend_builds_once_and_installs_into_torch(toolchain, tmp_path, run):
    compiler = toolchain[0]
    cache = tmp_path / "cache"
    lib = _torch_build.build_backend(compiler=compiler, directory=str(cache))
    built_at = os.stat(lib).st_mtime_ns
    assert _torch_build.build_backend(compiler=compiler, directory=str(cache)) == lib
    assert os.stat(lib).st_mtime_ns == built_at            # cached: nothing compiled again
    assert [p.name for p in cache.iterdir()] == [os.path.basename(lib)]
    handle = ctypes.CDLL(lib)
    for name in ("vramkit_torch_backend_install", "vramkit_torch_backend_last_status"):
        assert hasattr(handle, name), name
    # In a fresh process: PyTorch's own statistics call answers from vramkit's pools. On a
    # machine with no GPU PyTorch's caching allocator has no device to report and raises.
    run(f"""
        import ctypes, torch
        try:
            torch._C._cuda_memoryStats(0)
        except RuntimeError:
            pass
        else:
            raise AssertionError("PyTorch's own allocator answered for a missing device")
        lib = ctypes.CDLL({lib!r})
        message = ctypes.create_string_buffer(4096)
        assert lib.vramkit_torch_backend_install(message, 4096) == 0, message.value
        stats = torch._C._cuda_memoryStats(0)
        assert stats["allocated_bytes"]["all"]["current"] == 0, stats
        assert stats["num_ooms"] == 0
    """, env={"VRAMKIT_SOURCE": "sim"})

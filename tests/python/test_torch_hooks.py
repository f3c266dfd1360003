"""The PyTorch allocator hooks without PyTorch, on sim.

The C side (libvramkit_torch.so) is called through ctypes as the C++ side calls it; the C++
side (torch_oom.cpp) is built by vramkit.plug._torch_build, as install() builds it, but against a
stand-in for c10's exception header (fake_c10/), and called by a small C++ program the way
CUDAPluggableAllocator calls it. The same source, built against the real PyTorch, is tested
through PyTorch itself on the GPU (tests/gpu).
"""

import ctypes
import os
import pathlib
import shutil
import subprocess

import pytest

HERE = pathlib.Path(__file__).resolve().parent
FAKE_C10 = HERE / "fake_c10"
MiB, GiB = 1 << 20, 1 << 30


def test_c_hooks_share_the_default_pools(run):
    run(r"""
        import ctypes, re, vramkit
        from vramkit.plug import _torch_build
        MiB = 1 << 20
        lib = ctypes.CDLL(_torch_build.c_hooks_path())
        lib.vramkit_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                                            ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
                                            ctypes.c_size_t]
        lib.vramkit_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                           ctypes.c_void_p]
        lib.vramkit_torch_set_memory_fraction.argtypes = [ctypes.c_double, ctypes.c_int]
        lib.vramkit_torch_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.vramkit_torch_device_used.argtypes = [ctypes.c_int]

        def alloc(size, device):
            out = ctypes.c_void_p(0xdead)
            msg = ctypes.create_string_buffer(8192)
            rc = lib.vramkit_torch_alloc(size, device, None, ctypes.byref(out), msg, 8192)
            return rc, out.value, msg.value.decode()

        rc, p, _ = alloc(1000, 1)
        assert rc == 0 and p and p % 512 == 0
        assert vramkit.memory_allocated(1) == 1024          # one pool, seen from Python
        assert lib.vramkit_torch_device_used(1) == 1 and lib.vramkit_torch_device_used(0) == 0
        lib.vramkit_torch_record_stream(p, 7)
        lib.vramkit_torch_free(p, 1000, 1, None)
        assert vramkit.memory_allocated(1) == 0
        lib.vramkit_torch_empty_cache()
        assert vramkit.memory_reserved(1) == 0

        # set_per_process_memory_fraction reaches the pool; out of memory is outcome 1, with
        # the message PyTorch's users and batch finders expect, the report inside it, and
        # the pointer left alone.
        lib.vramkit_torch_set_memory_fraction(0.25, 1)
        assert vramkit.memory_stats(1)["limit_bytes"] == 256 * MiB
        lib.vramkit_torch_set_memory_fraction(0.0, 1)      # PyTorch's "nothing at all"
        assert vramkit.memory_stats(1)["limit_bytes"] == 1
        rc, p, msg = alloc(512 * MiB, 1)
        assert rc == 1 and p == 0xdead
        # PyTorch's sentences and units first (MiB up to 1 GiB inclusive), the cap it
        # names "allowed".
        head = re.match(
            r"CUDA out of memory\. Tried to allocate 512\.00 MiB\. GPU 1 has a total capacity "
            r"of 1024\.00 MiB of which \d+\.\d\d MiB is free\. Including non-PyTorch "
            r"memory, this process has [\d.]+ (bytes|KiB|MiB) memory in use\. 1 bytes "
            r"allowed; Of the allocated memory 0 bytes is allocated by PyTorch, and 0 bytes "
            r"is reserved by PyTorch but unallocated\. ", msg)
        assert head, msg
        report = vramkit.last_oom_report(1)
        assert len(report) > 40 and report in msg
        assert lib.vramkit_torch_last_status() == vramkit._core.VRAM_ENOMEM
        assert lib.vramkit_torch_last_oom_device() == 1
        # A device that does not exist is another error (outcome 2), not out of memory.
        rc, p, msg = alloc(16, 99, )
        assert rc == 2 and p == 0xdead and "device 99" in msg
        assert not msg.startswith("CUDA out of memory")
        rc, p, _ = alloc(0, 1)                              # size 0: NULL, as PyTorch's
        assert rc == 0 and p is None
        # No function here may be handed to PyTorch as its alloc function: C cannot throw,
        # and a NULL from it becomes a tensor at address 0.
        assert not hasattr(lib, "vramkit_torch_malloc")
    """, env={"VRAMKIT_SIM_CAPACITY": "1G"})


@pytest.fixture
def fake_torch(tmp_path):
    """An include dir with the stand-in c10 header and a lib dir with an empty libc10.so, in
    the layout vramkit.plug._torch_build expects of an installed torch."""
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    lib_dir = tmp_path / "lib"
    lib_dir.mkdir()
    empty = tmp_path / "empty.cpp"
    empty.write_text("// nothing: the stand-in c10 is header-only\n")
    subprocess.run([compiler, "-shared", "-fPIC", str(empty), "-o", str(lib_dir / "libc10.so")],
                   check=True)
    return compiler, str(FAKE_C10), str(lib_dir)


def test_cpp_hooks_throw_and_are_cached(fake_torch, tmp_path):
    from vramkit.plug import _torch_build

    compiler, include_dir, lib_dir = fake_torch
    cache = tmp_path / "cache"
    lib = _torch_build.build(include_dir=include_dir, lib_dir=lib_dir, abi=1, directory=str(cache))
    assert os.path.dirname(lib) == str(cache) and os.path.isfile(lib)
    built_at = os.stat(lib).st_mtime_ns
    # The second call finds the cached library and compiles nothing.
    assert _torch_build.build(include_dir=include_dir, lib_dir=lib_dir, abi=1,
                              directory=str(cache)) == lib
    assert os.stat(lib).st_mtime_ns == built_at
    assert [p.name for p in cache.iterdir()] == [os.path.basename(lib)]  # no leftovers
    # Another ABI is another library.
    other = _torch_build.build(include_dir=include_dir, lib_dir=lib_dir, abi=0,
                               directory=str(cache))
    assert other != lib

    driver = tmp_path / "driver"
    subprocess.run([compiler, "-std=c++17", "-isystem", include_dir,
                    str(HERE / "torch_hook_driver.cpp"), "-o", str(driver), "-ldl"], check=True)
    env = dict(os.environ, VRAMKIT_SOURCE="sim", VRAMKIT_SIM_CAPACITY="1G", VRAMKIT_LIMIT="64M")
    done = subprocess.run([str(driver), lib, "0", str(MiB), str(2 * GiB), str(MiB), "0"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("ok ") and int(lines[0].split()[1]) != 0
    kind, message = lines[1].split(" ", 1)
    assert kind == "oom"
    assert message.startswith("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
                              "total capacity of 1024.00 MiB of which ")
    assert "vramkit: out of memory on device 0" in message       # the engine's report
    # After the failure the pool serves again; size 0 is NULL, not an error.
    assert lines[2].startswith("ok ") and int(lines[2].split()[1]) != 0
    assert lines[3] == "ok 0"
    done = subprocess.run([str(driver), lib, "99", "16"], capture_output=True, text=True,
                          env=env, timeout=60)
    kind, message = done.stdout.strip().split(" ", 1)
    assert kind == "error" and "device 99" in message


def test_no_compiler_is_a_clear_error(fake_torch, tmp_path, monkeypatch):
    from vramkit.plug import _torch_build

    _, include_dir, lib_dir = fake_torch
    monkeypatch.setenv("CXX", "no-such-compiler-anywhere")
    with pytest.raises(_torch_build.BuildError, match="needs a C\\+\\+ compiler") as caught:
        _torch_build.build(include_dir=include_dir, lib_dir=lib_dir, abi=1,
                           directory=str(tmp_path / "cache"))
    assert "VRAMKIT_TORCH_HOOKS" in str(caught.value)
    assert not (tmp_path / "cache").exists()


def test_failed_compile_names_the_command(fake_torch, tmp_path):
    from vramkit.plug import _torch_build

    compiler, _, lib_dir = fake_torch
    empty_include = tmp_path / "no_headers"
    empty_include.mkdir()
    with pytest.raises(_torch_build.BuildError, match="could not build") as caught:
        _torch_build.build(include_dir=str(empty_include), lib_dir=lib_dir, abi=1,
                           compiler=compiler, directory=str(tmp_path / "cache"))
    assert "c10/util/Exception.h" in str(caught.value)
    assert list((tmp_path / "cache").iterdir()) == []     # no half-written library


def test_prebuilt_library_from_the_environment(tmp_path, monkeypatch):
    from vramkit.plug import _torch_build

    monkeypatch.setenv("VRAMKIT_TORCH_HOOKS", str(tmp_path / "missing.so"))
    with pytest.raises(_torch_build.BuildError, match="no such file"):
        _torch_build.hook_library()
    prebuilt = tmp_path / "hooks.so"
    prebuilt.write_bytes(b"")
    monkeypatch.setenv("VRAMKIT_TORCH_HOOKS", str(prebuilt))
    assert _torch_build.hook_library() == str(prebuilt)


@pytest.mark.parametrize("module, framework, hint", [
    ("vramkit.torch", "torch", "pip install torch"),
    ("vramkit.cupy", "cupy", "pip install cupy"),
    ("vramkit.numba", "numba", "pip install numba"),
])
def test_integration_without_its_framework_says_what_to_install(run, module, framework, hint):
    # The framework is made unimportable in the child (sys.modules[name] = None), so the
    # test means the same whether or not it is installed here.
    proc = run(f"""
        import sys
        sys.modules[{framework!r}] = None
        import importlib
        try:
            importlib.import_module({module!r})
        except ImportError as exc:
            print("ImportError:", exc)
    """)
    assert f"ImportError: {module} needs" in proc.stdout and hint in proc.stdout

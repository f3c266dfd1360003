"""The vramkit Python API on the sim source: allocation, statistics, errors, arguments.

Tests here share the process's default pools (sim, set up by conftest), so they assert on
differences; tests that need exact figures from fresh pools are in test_exact.py.
"""

import gc
import sys
import threading

import pytest

import vramkit
from vramkit import _core
from helpers import KiB, MiB, run_python

# Device 0 is shared by the in-process tests; each test frees what it allocates.
DEV = 0


def allocated(device=DEV):
    return vramkit.memory_allocated(device)


def test_empty_returns_device_buffer_with_cuda_array_interface():
    before = allocated()
    buf = vramkit.empty(1000)
    assert isinstance(buf, vramkit.DeviceBuffer)
    assert buf.nbytes == 1000 and buf.device == 0 and buf.stream is None
    assert buf.ptr != 0 and buf.ptr % 512 == 0
    cai = buf.__cuda_array_interface__
    assert cai == {"shape": (1000,), "typestr": "|u1", "data": (buf.ptr, False),
                   "strides": None, "version": 3, "stream": None}
    assert allocated() - before == 1024
    del buf
    assert allocated() == before


def test_stream_is_reported_in_interface():
    buf = vramkit.empty(512, stream=0x1234)
    assert buf.stream == 0x1234
    assert buf.__cuda_array_interface__["stream"] == 0x1234
    # The interface reserves 0: the legacy default stream is 1 there.
    assert vramkit.empty(512, stream=0).__cuda_array_interface__["stream"] == 1

    class TorchLikeStream:
        cuda_stream = 0x55

    class CupyLikeStream:
        ptr = 0x66

    assert vramkit.empty(16, stream=TorchLikeStream()).stream == 0x55
    assert vramkit.empty(16, stream=CupyLikeStream()).stream == 0x66
    with pytest.raises(TypeError, match="stream"):
        vramkit.empty(16, stream="default")


def test_refcount_frees_when_last_reference_goes():
    before = allocated()
    buf = vramkit.empty(4096)
    alias = buf
    holder = [buf]
    del buf
    assert allocated() - before == 4096
    del alias
    assert allocated() - before == 4096
    holder.clear()
    assert allocated() == before
    assert sys.getrefcount(vramkit.empty(8)) == 2  # no hidden references


def test_manual_free_and_double_free():
    before = allocated()
    buf = vramkit.empty(2048)
    ptr = buf.ptr
    buf.free()
    assert allocated() == before and buf.freed and buf.ptr == 0
    with pytest.raises(vramkit.DoubleFreeError) as info:
        buf.free()
    assert isinstance(info.value, vramkit.AllocatorError)
    assert isinstance(info.value, RuntimeError)
    assert info.value.errname == "VRAM_EDOUBLEFREE" and info.value.status == -3
    with pytest.raises(vramkit.DoubleFreeError):
        buf.__cuda_array_interface__
    assert "freed" in repr(buf) and hex(ptr)[2:] not in repr(buf)
    del buf  # dealloc after free() must not free again
    gc.collect()
    assert allocated() == before


def test_size_zero():
    before = vramkit.memory_stats()
    buf = vramkit.empty(0)
    assert buf.ptr == 0 and buf.nbytes == 0
    assert buf.__cuda_array_interface__["shape"] == (0,)
    assert vramkit.memory_allocated() == before["allocated_bytes.all.current"]
    buf.free()


def test_bad_arguments():
    # The size rules have their own tests (test_errors.py); these are the call's shape.
    with pytest.raises(TypeError):
        vramkit.empty()
    with pytest.raises(TypeError):
        vramkit.empty(16, bogus=1)
    with pytest.raises(TypeError):
        vramkit.DeviceBuffer()


def test_unknown_devices_are_clear_errors():
    with pytest.raises(vramkit.InvalidDeviceError) as info:
        vramkit.empty(16, device=99)
    assert isinstance(info.value, ValueError) and info.value.errname == "VRAM_EDEVICE"
    for bad in (99, "cuda:99", "GPU:99", -1):
        with pytest.raises(vramkit.InvalidDeviceError):
            vramkit.memory_allocated(bad)
    for bad in ("tpu:0", "cuda:x", "GPU0x", ""):
        with pytest.raises(vramkit.InvalidDeviceError, match="unknown device"):
            vramkit.memory_allocated(bad)
    for bad in (1.0, True, [0]):
        with pytest.raises(TypeError):
            vramkit.memory_allocated(bad)
        with pytest.raises(TypeError):
            vramkit.empty(16, device=bad)
    for bad in (-1, "cuda:99", "tpu:0"):
        with pytest.raises(vramkit.InvalidDeviceError):
            vramkit.empty(16, device=bad)


def test_device_names():
    class TorchDevice:
        type, index = "cuda", 1

    class TfDevice:
        name, device_type = "/physical_device:GPU:1", "GPU"

    names = [1, "cuda:1", "GPU:1", "gpu:1", "/device:GPU:1", "/physical_device:GPU:1",
             TorchDevice(), TfDevice()]
    buf = vramkit.empty(1536, device=1)
    assert vramkit.empty(0, device="cuda:1").device == 1
    assert vramkit.empty(0, device=TorchDevice()).device == 1
    for name in names:
        assert vramkit.get_memory_info(name)["current"] == 1536, name
    assert vramkit._device("cuda") == 0 and vramkit._device(None) == 0
    del buf


def test_memory_stats_keys_follow_pytorch():
    stats = vramkit.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                "allocated_bytes.all.allocated", "allocated_bytes.all.freed",
                "reserved_bytes.all.current", "reserved_bytes.all.peak",
                "active_bytes.all.current", "requested_bytes.all.current",
                "segment.all.current", "allocation.all.current", "active.all.current",
                "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
                "largest_free_block", "fragmentation", "limit_bytes"):
        assert key in stats, key
    assert stats["allocated_bytes.all.current"] == vramkit.memory_allocated()
    assert stats["reserved_bytes.all.peak"] == vramkit.max_memory_reserved()
    raw = vramkit.memory_stats_raw()
    assert raw["allocated_bytes"][0] == stats["allocated_bytes.all.current"]


def test_peaks_and_reset():
    d = 4
    a = vramkit.empty(8 * KiB, device=d)
    b = vramkit.empty(8 * KiB, device=d)
    peak = vramkit.max_memory_allocated(d)
    del b
    assert vramkit.max_memory_allocated(d) == peak
    assert vramkit.memory_allocated(d) == peak - 8 * KiB
    vramkit.reset_peak_memory_stats(d)
    assert vramkit.max_memory_allocated(d) == vramkit.memory_allocated(d)
    vramkit.reset_memory_stats(f"GPU:{d}")
    info = vramkit.get_memory_info(f"GPU:{d}")
    assert info == {"current": 8 * KiB, "peak": 8 * KiB}
    del a


def test_empty_cache_returns_free_segments():
    d = 5
    bufs = [vramkit.empty(3 * MiB, device=d) for _ in range(3)]
    assert vramkit.memory_reserved(d) >= 9 * MiB
    del bufs
    assert vramkit.memory_reserved(d) >= 9 * MiB  # cached, not returned
    vramkit.empty_cache(d)
    assert vramkit.memory_reserved(d) == 0
    assert vramkit.max_memory_reserved(d) >= 9 * MiB
    vramkit.empty_cache()  # every pool this process used


def test_mem_get_info_and_summary_and_source():
    free, total = vramkit.mem_get_info()
    assert total == 4 << 30 and 0 <= free <= total
    text = vramkit.memory_summary()
    assert isinstance(text, str) and "allocated" in text
    assert vramkit.source() == "sim"
    assert vramkit.device_count("sim") == 8


def test_per_process_memory_fraction():
    d = 6
    vramkit.set_per_process_memory_fraction(0.25, d)
    assert vramkit.memory_stats(d)["limit_bytes"] == 1 << 30
    with pytest.raises(vramkit.OutOfMemoryError):
        vramkit.empty(2 << 30, device=d)
    vramkit.set_per_process_memory_fraction(1.0, d)
    with pytest.raises(ValueError):
        vramkit.set_per_process_memory_fraction(1.5, d)
    with pytest.raises(TypeError):
        vramkit.set_per_process_memory_fraction("half", d)


def test_memory_growth_after_use_raises():
    d = 0
    vramkit.memory_allocated(d)  # the pool is in use now
    vramkit.set_memory_growth(d, True)  # already so: accepted, as TensorFlow does
    with pytest.raises(RuntimeError, match="cannot be modified after being initialized"):
        vramkit.set_memory_growth(d, False)
    with pytest.raises(RuntimeError, match="already created"):
        vramkit.configure(d, limit="1G")
    with pytest.raises(TypeError):
        vramkit.set_memory_growth(d, "yes")


def test_configure_rejects_bad_options():
    with pytest.raises(ValueError, match="source"):
        vramkit.configure(7, source="tpu")
    with pytest.raises(ValueError, match="limit"):
        vramkit.configure(7, limit="lots")
    with pytest.raises(ValueError, match="limit"):
        vramkit.configure(7, limit=-5)
    with pytest.raises(ValueError, match="preallocate"):
        vramkit.configure(7, preallocate=1.5)
    with pytest.raises(TypeError):
        vramkit.configure(7, sim_capacity=[1])
    for share in (1.5, -0.1, float("nan"), "150%", "most"):
        with pytest.raises(ValueError, match="tight_threshold"):
            vramkit.configure(7, tight_threshold=share)
    with pytest.raises(TypeError):
        vramkit.configure(7, tight_threshold=True)
    assert not _core.pool_touched(7)  # nothing was created by the failures


def test_configure_large_blocks_virtual():
    # A fresh interpreter: the default pools are process-wide. On sim, large blocks go to a
    # virtual range (an expandable segment in the snapshot) from the first one; small blocks
    # keep a fixed segment; the same large request again maps nothing new.
    out = run_python("""
        import vramkit
        vramkit.configure(0, large_blocks="virtual")
        big, small = vramkit.empty(40 << 20), vramkit.empty(4096)
        kinds = {s["is_expandable"] for s in vramkit.snapshot()["segments"]}
        calls = vramkit.memory_stats()["num_device_alloc"]
        del big
        big = vramkit.empty(40 << 20)
        print(sorted(kinds), calls, vramkit.memory_stats()["num_device_alloc"])
    """).stdout.split()
    assert out == ["[False,", "True]", "2", "2"], out


def test_set_memory_limit_takes_sizes_as_configure_does():
    d = 3
    for limit, expected in ((64 * MiB, 64 * MiB), ("1G", 1 << 30), ("512MiB", 512 * MiB),
                            ("25%", 1 << 30), (0.5, 2 << 30)):
        vramkit.set_memory_limit(d, limit)
        assert vramkit.memory_stats(d)["limit_bytes"] == expected, limit
    vramkit.set_memory_limit(d, "1G")
    with pytest.raises(vramkit.OutOfMemoryError):
        vramkit.empty(2 << 30, device=d)
    vramkit.set_memory_limit(d, 0)
    assert vramkit.memory_stats(d)["limit_bytes"] == 0


def test_every_status_maps_to_its_exception():
    expected = {
        _core.VRAM_ENOMEM: (vramkit.OutOfMemoryError, MemoryError),
        _core.VRAM_EINVAL: (vramkit.InvalidArgumentError, ValueError),
        _core.VRAM_EDOUBLEFREE: (vramkit.DoubleFreeError, vramkit.AllocatorError),
        _core.VRAM_EFOREIGN: (vramkit.ForeignPointerError, vramkit.AllocatorError),
        _core.VRAM_EDEVICE: (vramkit.InvalidDeviceError, ValueError),
        _core.VRAM_ENODRIVER: (vramkit.NoDriverError, RuntimeError),
        _core.VRAM_EDRIVER: (vramkit.DriverError, RuntimeError),
        _core.VRAM_EBUSY: (vramkit.BusyError, vramkit.AllocatorError),
        _core.VRAM_EENV: (vramkit.ConfigError, ValueError),
        _core.VRAM_ETRACE: (vramkit.InvalidArgumentError, ValueError),
        _core.VRAM_EIO: (vramkit.DriverError, RuntimeError),
        _core.VRAM_EHOSTMEM: (vramkit.HostMemoryError, MemoryError),
        _core.VRAM_EUNSUPPORTED: (vramkit.UnsupportedError, NotImplementedError),
        _core.VRAM_EFAULT: (vramkit.DriverError, RuntimeError),
        _core.VRAM_ESIMCAPACITY: (vramkit.ConfigError, ValueError),
        _core.VRAM_ELIMIT: (vramkit.InvalidArgumentError, ValueError),
    }
    for status, (cls, base) in expected.items():
        with pytest.raises(cls) as info:
            _core.raise_status(status, "probe")
        exc = info.value
        assert isinstance(exc, base) and isinstance(exc, vramkit.VramError)
        assert exc.status == status
        name, message = _core.strerror(status)
        assert exc.errname == name and message in str(exc) and "probe" in str(exc)
    assert _core.raise_status(0) is None
    with pytest.raises(vramkit.VramError):
        _core.raise_status(-999)


def test_threads_allocate_and_free_concurrently():
    d = 2
    base = vramkit.memory_allocated(d)
    errors = []

    def work(seed):
        try:
            for i in range(2000):
                bufs = [vramkit.empty(512 * ((seed + i + k) % 64 + 1), device=d)
                        for k in range(4)]
                del bufs
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert vramkit.memory_allocated(d) == base


def test_last_oom_report_without_torch():
    assert isinstance(vramkit.last_oom_report(), str)


# Makes the frameworks unimportable in a child interpreter, whether or not they are installed
# here, and records every attempt to import one.
_BLOCK_FRAMEWORKS = """
    import sys
    tried = []

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "cupy", "numba"):
                tried.append(name)
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Block())
"""


def test_import_vramkit_tries_no_framework(run):
    """import vramkit and everyday calls neither import a framework nor try to: with every
    framework blocked, nothing was attempted and the integrations are not loaded."""
    run(_BLOCK_FRAMEWORKS + """
    import vramkit
    b = vramkit.empty(1024)
    vramkit.memory_stats(); vramkit.memory_summary(); del b
    assert tried == [], tried
    assert not any(m.startswith("vramkit.") and m != "vramkit._core" for m in sys.modules), \
        sorted(m for m in sys.modules if m.startswith("vramkit"))
    """)


def test_integrations_load_only_when_asked_for(run):
    """vramkit.torch is imported on first access: without torch, that access is an
    ImportError about torch, and the failed attempt leaves vramkit usable."""
    out = run(_BLOCK_FRAMEWORKS + """
    import vramkit
    for name in ("torch", "cupy", "numba"):
        try:
            getattr(vramkit, name)
        except ImportError as exc:
            print(name, "ImportError", name in str(exc))
        else:
            print(name, "imported")
    assert "vramkit.torch" not in sys.modules
    assert vramkit.memory_allocated() == 0
    try:
        vramkit.no_such_thing
    except AttributeError:
        print("AttributeError")
    """).stdout.split("\n")
    assert out[:4] == ["torch ImportError True", "cupy ImportError True",
                       "numba ImportError True", "AttributeError"], out


def test_prefetch_and_peer_access_are_unsupported_on_fixed_sim():
    """Prefetch belongs to the managed source and peer access to the virtual-memory ones:
    on the fixed sim both are a clear NotImplementedError and the buffer stays usable."""
    assert vramkit.source(DEV) == "sim"
    before = allocated()
    buf = vramkit.empty(4096)
    with pytest.raises(NotImplementedError):
        buf.prefetch()
    with pytest.raises(NotImplementedError):
        vramkit.enable_peer_access(DEV, 1)
    assert allocated() == before + 4096
    buf.free()
    with pytest.raises(vramkit.DoubleFreeError):
        buf.prefetch(to_device=False)


def test_parse_size_beyond_two_to_the_63():
    """Sizes are unsigned: 2**63 bytes and more come back positive, not wrapped."""
    assert _core.parse_size("10000000T") == (10000000 << 40, 0.0)


@pytest.mark.parametrize("text, words", [
    ("0x10G", "hexadecimal"), ("1.5", "fraction of a byte"), ("1e-300", "exponents"),
    ("5 G", "spaces"), ("1G ", "spaces"), ("-1G", "negative"), ("99999999999999T", "2^64"),
])
def test_one_size_grammar_refuses_with_the_text_and_the_reason(text, words):
    """The C grammar decides; Python quotes the text and says what is wrong with it."""
    with pytest.raises(vramkit.InvalidArgumentError) as info:
        _core.parse_size(text)
    assert f"'{text}' is not a size: " in str(info.value) and words in str(info.value)
    with pytest.raises(vramkit.InvalidArgumentError) as info:
        vramkit.configure(9, limit=text)
    assert str(info.value).startswith(f"limit: '{text}' is not a size: "), str(info.value)
    assert not _core.pool_touched(9)


def test_sizes_keep_their_units():
    assert _core.parse_size("8GB") == (8 << 30, 0.0)
    assert _core.parse_size("2MiB") == (2 << 20, 0.0)
    assert _core.parse_size("0.1G") == (107374183, 0.0)  # rounded up to a whole byte
    assert _core.parse_size("30%", True)[1] == pytest.approx(0.30)


def test_the_variables_python_reads_are_in_the_c_table():
    """One table, in C: every VRAMKIT_* name the package reads is one the library knows, so
    that none of them draws the unknown-variable warning."""
    import pathlib
    import re

    known = {name for name, _, _ in _core.env_variables()}
    package = pathlib.Path(vramkit.__file__).parent
    read = set()
    for path in package.rglob("*.py"):
        read |= set(re.findall(r"""environ(?:\.get)?\(?\[?["'](VRAMKIT_[A-Z_]+)""",
                               path.read_text()))
    assert read and read <= known, read - known
    pool_options = {name for name, _, pool in _core.env_variables() if pool}
    assert {"VRAMKIT_LIMIT", "VRAMKIT_SOURCE", "VRAMKIT_SIM_CAPACITY"} <= pool_options
    assert "VRAMKIT_PUBLISH_DIR" in known - pool_options


def test_an_unknown_variable_is_named_once_with_the_nearest(run):
    proc = run("""
        import vramkit
        vramkit.memory_allocated()
        vramkit.memory_allocated(1)
        vramkit.configure(2, limit="1G")
    """, env={"VRAMKIT_LIMT": "1G"})
    lines = [line for line in proc.stderr.splitlines() if "VRAMKIT_LIMT" in line]
    assert len(lines) == 1 and "did you mean VRAMKIT_LIMIT?" in lines[0], proc.stderr


@pytest.mark.parametrize("variable, value, words", [
    ("VRAMKIT_LIMIT", "0", "leave it unset"),
    ("VRAMKIT_LEAK_REPORT", "abc", "not a switch"),
    ("VRAMKIT_PREALLOCATE", "18446744073709551616", "2^64"),
])
def test_a_refused_variable_is_named_and_quoted(run, variable, value, words):
    proc = run("""
        import vramkit
        try:
            vramkit.memory_allocated()
        except vramkit.ConfigError as exc:
            print(exc)
        else:
            raise AssertionError("accepted")
    """, env={variable: value})
    assert f"{variable}: '{value}'" in proc.stdout and words in proc.stdout, proc.stdout


def test_a_bad_torch_backend_variable_is_named(monkeypatch):
    """The variable is blamed, not an install(backend=...) argument the user never wrote."""
    import vramkit.torch as vtorch

    monkeypatch.setenv("VRAMKIT_TORCH_BACKEND", "nope")
    with pytest.raises(ValueError, match="VRAMKIT_TORCH_BACKEND: 'nope' is not a backend"):
        vtorch._chosen_path(None)
    with pytest.raises(ValueError, match=r"install\(backend='x'\)"):
        vtorch._chosen_path("x")


def test_annotation_contexts_out_of_64_bits_are_refused():
    done = run_python("""
        import vramkit
        from vramkit import _core
        vramkit.record_memory_history()
        for context in (-1, 2**64, 2**200):
            try:
                _core.history_annotate(0, context)
            except OverflowError as error:
                assert "context must be from 0 to 2**64 - 1" in str(error), error
            else:
                raise AssertionError(f"context {context} accepted")
        _core.history_annotate(0, 2**64 - 1)  # the largest is fine
        print("ok")
    """)
    assert done.stdout.strip() == "ok"


def test_bools_are_neither_devices_nor_streams():
    buf = vramkit.empty(512)
    for call in (lambda: vramkit.empty(512, stream=True), lambda: buf.record_stream(True),
                 lambda: _core.stats(True), lambda: _core.mem_get_info(False),
                 lambda: _core.history_annotate(True, 1)):
        with pytest.raises(TypeError, match="not bool"):
            call()
    with pytest.raises(OverflowError, match="device 4294967296 is out of range"):
        _core.stats(1 << 32)
    # A negative handle is no pointer, as one past 64 bits is not: never the all-ones one.
    for handle in (-1, 2**64):
        with pytest.raises(OverflowError, match="is not a pointer"):
            vramkit.empty(512, stream=handle)
        with pytest.raises(OverflowError, match="is not a pointer"):
            buf.record_stream(handle)
    buf.free()


def test_a_second_configure_says_the_pool_exists_not_that_it_is_in_use():
    done = run_python("""
        import vramkit
        from vramkit import _core
        vramkit.configure(0, source="sim")  # nothing allocated, nothing live
        for call in (lambda: vramkit.configure(0, source="sim"),
                     lambda: _core.init_pool(0, {})):
            try:
                call()
            except (RuntimeError, vramkit.BusyError) as error:
                text = str(error)
                assert "already created" in text, text
                assert "in use" not in text and "live allocations" not in text, text
            else:
                raise AssertionError("accepted")
        print("ok")
    """)
    assert done.stdout.strip() == "ok"


def test_numpy_does_not_wrap_device_memory_for_the_host():
    np = pytest.importorskip("numpy")
    buf = vramkit.empty(4096)
    assert not hasattr(buf, "__array_interface__")
    with pytest.raises(TypeError, match="device memory, which numpy cannot read"):
        np.asarray(buf)
    buf.free()

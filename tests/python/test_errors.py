"""The errors a user meets, each as a user would meet it: sizes, devices, options, freed
buffers. Each message must name what the user gave (the argument, the device, the variable)
and never this package's internals (C function names, VRAMKIT_* variables nobody set).

In-process tests share the sim pools of 4 GiB that conftest sets up; the rest run in a
fresh interpreter.
"""

import re

import pytest

import vramkit
from vramkit import _core
from helpers import GiB, MiB, run_python

CAPACITY = 4 * GiB  # helpers.SIM_ENV


def _assert_user_facing(exc: BaseException) -> None:
    """No message names a C function of the extension or a variable the user never set."""
    text = str(exc)
    for internal in ("stats:", "init_pool", "set_limit", "summary:", "VRAMKIT_",
                     "vram_for_each_block", "(nil)"):
        assert internal not in text, (internal, text)


# --- sizes -------------------------------------------------------------------------------

@pytest.mark.parametrize("nbytes", [1 << 47, (1 << 48) + 1, 1 << 63, (1 << 64) - 1, 1 << 64,
                                    1 << 80, 1 << 300])
def test_a_size_no_device_holds_is_out_of_memory(nbytes):
    """One rule from 2**47 to past 64 bits: OutOfMemoryError naming the size in bytes and
    the device's capacity; never ValueError or OverflowError."""
    before = vramkit.memory_allocated()
    with pytest.raises(vramkit.OutOfMemoryError) as info:
        vramkit.empty(nbytes)
    exc = info.value
    assert isinstance(exc, MemoryError)
    assert exc.status == _core.VRAM_ENOMEM and exc.errname == "VRAM_ENOMEM"
    text = str(exc)
    assert f"{nbytes} bytes" in text, text
    assert "capacity" in text and "4.00 GiB" in text, text
    assert "device 0" in text
    assert isinstance(exc.report, str) and exc.report
    # The figures, as the pool kept them: the request alone past the device.
    if nbytes < 1 << 64:
        assert exc.oom_info["cause"] == "live" and exc.oom_info["requested"] == nbytes
        assert exc.oom_info["max_request"] and exc.oom_info == _core.oom_info(0)
    _assert_user_facing(exc)
    assert vramkit.memory_allocated() == before
    # The pool goes on serving.
    vramkit.empty(MiB).free()


def test_a_size_past_64_bits_on_another_device_names_that_device():
    with pytest.raises(vramkit.OutOfMemoryError, match=r"device 2\b.*capacity"):
        vramkit.empty(1 << 70, device="cuda:2")


def test_a_capacity_just_under_a_unit_is_named_in_the_next():
    # A device of 1 GiB less 512 bytes was "a capacity of 1024.00 MiB".
    proc = run_python("""
        import vramkit
        try:
            vramkit.empty(1 << 70)
        except vramkit.OutOfMemoryError as error:
            print(error)
    """, env={"VRAMKIT_SIM_CAPACITY": str(GiB - 512)})
    assert f"capacity of 1.00 GiB ({GiB - 512} bytes)" in proc.stdout, proc.stdout


@pytest.mark.parametrize("nbytes", [-1, -(1 << 20), -(1 << 70)])
def test_a_negative_size_is_a_value_error_naming_the_argument(nbytes):
    with pytest.raises(vramkit.InvalidArgumentError) as info:
        vramkit.empty(nbytes)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == f"nbytes must be >= 0, got {nbytes}"
    assert info.value.status == _core.VRAM_EINVAL


@pytest.mark.parametrize("nbytes", [1.0, 1.5, "1024", "1G", True, False, None, [16], 1j])
def test_a_size_that_is_not_an_int_is_a_type_error_naming_the_argument(nbytes):
    with pytest.raises(TypeError) as info:
        vramkit.empty(nbytes)
    assert str(info.value).startswith("nbytes must be an int"), info.value
    assert type(nbytes).__name__ in str(info.value)


def test_integer_like_sizes_are_taken():
    """numpy's integers (anything with __index__) are sizes, as they are to CuPy."""
    np = pytest.importorskip("numpy")
    buf = vramkit.empty(np.int64(3000))
    assert buf.nbytes == 3000 and isinstance(buf.nbytes, int)
    buf.free()
    with pytest.raises(vramkit.InvalidArgumentError, match="nbytes must be >= 0"):
        vramkit.empty(np.int32(-5))


def test_set_memory_limit_sizes():
    d = 6
    limit = vramkit.memory_stats(d)["limit_bytes"]
    for bad in ("lots", "-1G", "0%", "150%", 1.5, 0.0):
        with pytest.raises(vramkit.InvalidArgumentError, match="^limit") as info:
            vramkit.set_memory_limit(d, bad)
        assert isinstance(info.value, ValueError) and info.value.status == _core.VRAM_EINVAL
    with pytest.raises(vramkit.InvalidArgumentError, match="^limit must be >= 0, got -1$"):
        vramkit.set_memory_limit(d, -1)
    # A limit asks for nothing: past what any device holds it is no out-of-memory error.
    with pytest.raises(vramkit.InvalidArgumentError, match="^limit: .* more than any device"):
        vramkit.set_memory_limit(d, 1 << 70)
    for bad in (True, None, [1]):
        with pytest.raises(TypeError, match="^limit"):
            vramkit.set_memory_limit(d, bad)
    assert vramkit.memory_stats(d)["limit_bytes"] == limit  # no failure set anything


# --- devices -----------------------------------------------------------------------------

@pytest.mark.parametrize("call", [
    vramkit.memory_stats, vramkit.memory_allocated, vramkit.memory_summary,
    vramkit.empty_cache, vramkit.reset_peak_memory_stats, vramkit.reset_memory_stats,
    vramkit.mem_get_info, vramkit.last_oom_report, vramkit.source,
    vramkit.get_memory_info, lambda d: vramkit.empty(16, device=d),
    lambda d: vramkit.set_memory_limit(d, "1G"),
])
def test_a_missing_device_is_named_with_the_devices_there_are(call):
    with pytest.raises(vramkit.InvalidDeviceError) as info:
        call(99)
    assert str(info.value) == "device 99: invalid device ordinal (the sim source has 8 devices)"
    assert info.value.errname == "VRAM_EDEVICE" and isinstance(info.value, ValueError)


def test_device_names_and_odd_ordinals():
    with pytest.raises(vramkit.InvalidDeviceError, match=r"^device 99: .*8 devices"):
        vramkit.memory_stats("cuda:99")
    with pytest.raises(vramkit.InvalidDeviceError,
                       match=r"^device -1: invalid device ordinal \(ordinals start at 0\)$"):
        vramkit.memory_stats(-1)
    for huge in (1 << 31, 1 << 40, 1 << 70):
        with pytest.raises(vramkit.InvalidDeviceError, match=f"^device {huge}: "):
            vramkit.memory_stats(huge)
        with pytest.raises(vramkit.InvalidDeviceError, match=f"^device {huge}: "):
            vramkit.empty(16, device=huge)
    with pytest.raises(vramkit.InvalidDeviceError) as info:
        vramkit.memory_stats("tpu:0")
    assert info.value.status == _core.VRAM_EDEVICE  # raised in Python, same attributes


def test_a_device_name_is_held_to_the_rules_of_an_ordinal():
    # "cuda:2147483648" raised a bare OverflowError where the ordinal 2**31 raises
    # InvalidDeviceError, and "cuda:\u0663" (an Arabic-Indic three) was read as device 3.
    for name in ("cuda:2147483648", "GPU:99999999999999999999", "/device:GPU:4294967296"):
        for call in (vramkit.memory_stats, vramkit.empty_cache, vramkit.default_pool,
                     lambda d: vramkit.set_memory_growth(d, True)):
            with pytest.raises(vramkit.InvalidDeviceError, match=r"^device \d+: invalid"):
                call(name)
    for name in ("cuda:\u0663", "GPU:\uff11"):
        with pytest.raises(vramkit.InvalidDeviceError, match="^unknown device '"):
            vramkit.memory_stats(name)


def test_missing_device_on_a_configured_source(run):
    run("""
        import vramkit
        try:
            vramkit.configure(8, source="sim")
        except vramkit.InvalidDeviceError as exc:
            assert str(exc) == ("device 8: invalid device ordinal (the sim source has 8 "
                                "devices)"), exc
        else:
            raise AssertionError("device 8 exists")
    """)


def test_unknown_source_names_the_argument():
    with pytest.raises(vramkit.InvalidArgumentError, match="^source: unknown source 'tpu'"):
        vramkit.device_count("tpu")


# --- options -----------------------------------------------------------------------------

# Each configure() option with values only Python rejects and values only the engine does.
BAD_OPTIONS = [
    ("source", "tpu", ValueError), ("source", 3, TypeError),
    ("limit", "lots", ValueError), ("limit", -5, ValueError), ("limit", 1.5, ValueError),
    ("limit", 1 << 70, ValueError), ("limit", True, TypeError),
    ("preallocate", "200%", ValueError), ("preallocate", 0.0, ValueError),
    ("preallocate", [1], TypeError),
    ("release_threshold", "10%", ValueError), ("release_threshold", 0.5, TypeError),
    ("release_threshold", "big", ValueError),
    ("tight_threshold", 1.5, ValueError), ("tight_threshold", "most", ValueError),
    ("tight_threshold", True, TypeError),
    ("large_blocks", "vmm", ValueError), ("large_blocks", 1, TypeError),
    ("sim_capacity", "bad", ValueError), ("sim_capacity", 0, ValueError),
    ("sim_capacity", "0G", ValueError), ("sim_capacity", [1], TypeError),
]


@pytest.mark.parametrize("option,value,error", BAD_OPTIONS,
                         ids=[f"{o}={v!r}" for o, v, _ in BAD_OPTIONS])
def test_configure_blames_the_argument_not_the_variable(option, value, error):
    with pytest.raises(error) as info:
        vramkit.configure(7, **{option: value})
    text = str(info.value)
    assert text.startswith(option), text
    _assert_user_facing(info.value)
    if error is ValueError:
        assert isinstance(info.value, vramkit.InvalidArgumentError)
        assert info.value.status == _core.VRAM_EINVAL
    assert not _core.pool_touched(7)  # a refused option creates no pool


def test_a_bad_environment_variable_is_blamed_on_the_variable(run):
    out = run("""
        import vramkit
        for call in (vramkit.memory_allocated, lambda: vramkit.configure(1, limit="1G"),
                     lambda: vramkit.empty(16, device=2)):
            try:
                call()
            except vramkit.ConfigError as exc:
                assert isinstance(exc, ValueError) and exc.errname == "VRAM_EENV"
                print(exc)
    """, env={"VRAMKIT_SIM_CAPACITY": "huge"}).stdout.splitlines()
    assert out == ["environment variable VRAMKIT_SIM_CAPACITY: 'huge' is not a capacity: a "
                   "size starts with a digit; expected a positive size such as 16G"] * 3, out


# --- defaults, summaries, freed buffers ---------------------------------------------------

def test_reset_memory_stats_defaults_to_device_0():
    keep = vramkit.empty(8 * MiB)
    peak = vramkit.empty(8 * MiB)
    del peak
    assert vramkit.get_memory_info("GPU:0")["peak"] > vramkit.get_memory_info("GPU:0")["current"]
    vramkit.reset_memory_stats()
    info = vramkit.get_memory_info("GPU:0")
    assert info["peak"] == info["current"]
    del keep


def test_abbreviated_summary_keeps_the_headline_rows():
    keep = vramkit.empty(5000)
    full = vramkit.memory_summary()
    short = vramkit.memory_summary(abbreviated=True)
    assert len(short.splitlines()) < len(full.splitlines())
    rows = [line.split("|")[1].strip() for line in short.splitlines()
            if line.startswith("| ") and "summary" not in line]
    assert rows == ["metric", "allocated_bytes", "reserved_bytes", "largest_free_block",
                    "fragmentation", "limit"], short
    # The kept rows read as in the full table, figure for figure.
    for line in short.splitlines():
        assert line in full.splitlines(), line
    assert not re.search(r"\|-+\|\n\|-+\|", short)  # no empty section left behind
    del keep


def test_a_freed_buffer_says_so():
    buf = vramkit.empty(4096, device=1)
    assert repr(buf) == f"<vramkit.DeviceBuffer ptr={hex(buf.ptr)} nbytes=4096 device=1>"
    buf.free()
    assert repr(buf) == "<vramkit.DeviceBuffer freed device=1>"
    assert buf.freed and buf.ptr == 0 and buf.nbytes == 0 and buf.device == 1
    for use in (buf.free, buf.prefetch, lambda: buf.record_stream(None),
                lambda: buf.__cuda_array_interface__):
        with pytest.raises(vramkit.DoubleFreeError, match=r"^DeviceBuffer\..*already freed"):
            use()


def test_preallocation_past_the_device_carries_a_report(run):
    # The pool cannot be made, so the report comes from its failed creation.
    run("""
        import vramkit as v
        try:
            v.empty(1 << 20)
            raise AssertionError("no OOM")
        except v.OutOfMemoryError as exc:
            assert exc.report and "cause: preallocate" in exc.report, exc.report
            assert exc.oom_info["cause"] == "preallocate", exc.oom_info
            assert exc.oom_info["requested"] == 100 << 30
            assert "could not preallocate 100.00 GiB" in str(exc), exc
    """, env={"VRAMKIT_PREALLOCATE": "100G", "VRAMKIT_SIM_CAPACITY": "80G"})


def test_an_out_of_memory_error_crosses_processes_as_itself():
    """Pickle, and tblib (how dask's distributed sends a task's exception back), give the
    client the same class with its report and status, not a plain Exception."""
    import pickle

    tblib = pytest.importorskip("tblib.pickling_support")
    with pytest.raises(vramkit.OutOfMemoryError) as caught:
        vramkit.empty(1 << 62)
    error = caught.value
    plain = pickle.loads(pickle.dumps(error))
    tblib.install(error)  # this instance (and its traceback) now pickles through tblib
    for name, back in (("pickle", plain), ("tblib", pickle.loads(pickle.dumps(error)))):
        assert type(back) is vramkit.OutOfMemoryError, name
        assert back.args == error.args and back.report == error.report, name
        assert back.status == error.status and back.errname == error.errname, name


def test_a_nul_in_a_size_or_source_is_refused_by_name(run):
    # The engine reads C strings: a NUL raised a bare ValueError "embedded null character"
    # that named neither the option nor the value.
    run(r"""
        import vramkit
        calls = [(lambda: vramkit.set_memory_limit(0, "1G\x00x"), "limit"),
                 (lambda: vramkit.configure(1, limit="1G\x00x"), "limit"),
                 (lambda: vramkit.configure(2, sim_capacity="8G\x00x"), "sim_capacity"),
                 (lambda: vramkit.configure(3, group_limit="8G\x00x"), "group_limit"),
                 (lambda: vramkit.default_pool(0).set_limit("1G\x00x"), "limit")]
        for call, name in calls:
            try:
                call()
            except vramkit.InvalidArgumentError as exc:
                assert str(exc).startswith(f"{name} holds a NUL character: '"), exc
                assert "\\x00x'" in str(exc), exc
            else:
                raise AssertionError(name)
        assert vramkit.memory_stats(0)["limit_bytes"] == 0  # no limit was set
        for source, quoted in (("sim\x00x", "'sim\\x00x'"), ("\x1b[2J", "'\\x1b[2J'")):
            try:
                vramkit.device_count(source)
            except vramkit.InvalidArgumentError as exc:
                assert str(exc).startswith(f"source: unknown source {quoted}"), exc
            else:
                raise AssertionError(source)
    """)


# A stand-in for the few names of CuPy that vramkit.cupy.malloc touches; its
# OutOfMemoryError keeps CuPy's arguments, (size, total, limit), where CuPy's pool passes as
# total the bytes it holds from the device (its total_bytes), the figure its limit bounds.
_FAKE_CUPY = """
import sys, types
cupy = types.ModuleType("cupy")
cuda = cupy.cuda = types.ModuleType("cupy.cuda")
cuda.memory = types.ModuleType("cupy.cuda.memory")
cuda.runtime = types.SimpleNamespace(getDevice=lambda: 0)
cuda.get_current_stream = lambda: types.SimpleNamespace(ptr=0)
cuda.set_allocator = lambda malloc: None
class OutOfMemoryError(MemoryError):
    def __init__(self, size, total, limit=0):
        self.figures = (size, total, limit)
        super().__init__(f"Out of memory allocating {size:,} bytes")
cuda.memory.OutOfMemoryError = OutOfMemoryError
cupy.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)
sys.modules.update({"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.memory": cuda.memory})
"""


def test_cupy_out_of_memory_carries_cupys_figures(run):
    proc = run(_FAKE_CUPY + """
import vramkit, vramkit.cupy
vramkit.set_memory_limit(0, "64M")
keep = [vramkit.empty(40 << 20), vramkit.empty(1000)]  # the small one holds a 2 MiB segment
try:
    vramkit.cupy.malloc(32 << 20)
except cupy.cuda.memory.OutOfMemoryError as exc:
    print(*exc.figures, vramkit.memory_reserved(), vramkit.memory_allocated())
""")
    size, total, limit, reserved, allocated = map(int, proc.stdout.split())
    assert (size, limit) == (32 << 20, 64 << 20)
    assert reserved > allocated                 # the segment's free part is held, not live
    assert total == reserved                    # CuPy's "allocated so far": what the pool holds

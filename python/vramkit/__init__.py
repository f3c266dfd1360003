"""vramkit: a caching GPU memory allocator, in the vocabulary of PyTorch and TensorFlow.

The pools are the C library's process-wide default pools, one per device, created on first
use from the ``VRAMKIT_*`` environment variables (``VRAMKIT_SOURCE``, ``VRAMKIT_LIMIT``,
``VRAMKIT_PREALLOCATE``, ``VRAMKIT_RELEASE_THRESHOLD``, ``VRAMKIT_TIGHT_THRESHOLD``,
``VRAMKIT_VIRTUAL_THRESHOLD``, ``VRAMKIT_LARGE_BLOCKS``, ``VRAMKIT_SIM_CAPACITY``) or from
:func:`configure` called before that first use.

``import vramkit`` needs no GPU and imports no framework: the integrations live in
``vramkit.torch``, ``vramkit.cupy`` and ``vramkit.numba`` and are imported on first access.
"""

from __future__ import annotations

import importlib as _importlib
import os as _os
import re as _re
import sys as _sys
import threading as _threading

from . import _core
from ._core import (
    AllocatorError,
    BusyError,
    ConfigError,
    DeviceBuffer,
    DoubleFreeError,
    DriverError,
    ForeignPointerError,
    HostMemoryError,
    InvalidArgumentError,
    InvalidDeviceError,
    NoDriverError,
    OutOfMemoryError,
    UnsupportedError,
    VramError,
    empty,
)

# The version has one source, VRAMKIT_VERSION in include/vramkit.h: the extension is
# compiled with it, and CMake and the wheel's metadata read it from there.
__version__: str = _core.VERSION

__all__ = [
    "AllocatorError", "BusyError", "ConfigError", "DeviceBuffer", "DoubleFreeError",
    "DriverError", "ForeignPointerError", "HostMemoryError", "InvalidArgumentError",
    "InvalidDeviceError", "NoDriverError", "OutOfMemoryError", "UnsupportedError",
    "VramError", "annotate", "configure", "device_count", "empty", "empty_cache", "get_memory_info",
    "enable_peer_access", "last_oom_info", "last_oom_report", "max_memory_allocated",
    "max_memory_reserved", "mem_get_info",
    "memory_allocated", "memory_reserved", "memory_stats", "memory_stats_raw",
    "memory_summary", "reset_memory_stats", "reset_peak_memory_stats",
    "set_memory_growth", "set_memory_limit", "set_per_process_memory_fraction", "source",
    "Pool", "default_pool",  # pools as objects (pool.py)
    # Memory history, snapshots and leaks (history.py, leaks.py).
    "LeakDetector", "LeakReport", "MemoryLeakWarning", "dump_snapshot", "history_mark",
    "leak_check", "leaks", "memory_history", "record_memory_history", "save_trace",
    # Estimates before a run (estimator/).
    "Estimate", "advise", "doctor_estimates", "estimate", "find_max_batch",
    "plan_checkpointing",
    "snapshot",
    "diagnose",  # the OOM doctor (doctor.py)
    "replay",  # a trace through the engine, in this process (_replaying.py)
    # Training-loop logging (logger.py).
    "MemoryLogger", "tqdm_postfix",
]

# vramkit.prometheus imports prometheus_client only when its server starts, but loads
# lazily like the framework integrations so that `import vramkit` never pays for it.
_INTEGRATIONS = ("torch", "cupy", "numba", "dask", "prometheus", "distributed")

# The modules live in subpackages by what users do with them (plug/, observe/, plan/), but
# users and the docs name them at the top: `import vramkit.torch`, `vramkit.history`,
# `from vramkit.estimator import estimate`, `python -m vramkit.torch build`. This table is
# the one place that keeps those names: the finder below makes `vramkit.NAME` (and each of
# its submodules) the very module object of its home `vramkit.HOME`, imported only when
# first named, so that `import vramkit` still imports no framework. The module's __name__
# and __spec__ stay those of its home.
_PUBLIC_NAMES = {
    "torch": "plug.torch", "cupy": "plug.cupy", "numba": "plug.numba", "dask": "plug.dask",
    "integrations": "plug.integrations",
    "history": "observe.history", "leaks": "observe.leaks", "logger": "observe.logger",
    "records": "observe.records", "top": "observe.top", "export": "observe.export",
    "prometheus": "observe.prometheus", "distributed": "observe.distributed",
    "estimator": "plan.estimator", "doctor": "plan.doctor",
}


def _home_of(fullname: str) -> str | None:
    """The home of `vramkit.NAME[.SUB]` when NAME is a public name, else None."""
    prefix, _, rest = fullname.partition(".")
    name, dot, sub = rest.partition(".")
    if prefix != __name__ or name not in _PUBLIC_NAMES:
        return None
    return f"{__name__}.{_PUBLIC_NAMES[name]}{dot}{sub}"


class _PublicNameFinder:
    """Finder and loader of the public names: the loader hands back the home module itself
    (creating it is importing the home), and `python -m vramkit.NAME` runs the home."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        home = _home_of(fullname)
        if home is None:
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(fullname, _PublicNameFinder, loader_state=home)

    @staticmethod
    def create_module(spec):
        module = _importlib.import_module(spec.loader_state)
        spec.loader_state = (spec.loader_state, module.__spec__)
        return module

    @staticmethod
    def exec_module(module):
        # The import machinery set __spec__ to the public name's spec: give back the home's.
        home, home_spec = module.__spec__.loader_state
        module.__spec__ = home_spec

    @staticmethod
    def get_code(fullname):
        # For runpy (`python -m vramkit.NAME`): run the home as __main__, with its own package
        # for its relative imports.
        return compile(f"import runpy\nrunpy.run_module({_home_of(fullname)!r}, "
                       f"run_name='__main__', alter_sys=True)\n", f"<{fullname}>", "exec")

    @staticmethod
    def is_package(fullname):
        return False


if not any(finder is _PublicNameFinder for finder in _sys.meta_path):
    _sys.meta_path.insert(0, _PublicNameFinder)

# Memory history and leaks live in submodules loaded on first use, so that `import vramkit`
# stays as light as it was for programs that never record.
_LAZY = {
    "annotate": "observe.history", "dump_snapshot": "observe.history",
    "memory_history": "observe.history", "record_memory_history": "observe.history",
    "save_trace": "observe.history", "snapshot": "observe.history",
    "LeakDetector": "observe.leaks", "LeakReport": "observe.leaks",
    "MemoryLeakWarning": "observe.leaks", "history_mark": "observe.leaks",
    "leak_check": "observe.leaks", "leaks": "observe.leaks",
    "MemoryLogger": "observe.logger", "tqdm_postfix": "observe.logger",
    "diagnose": "plan.doctor",
    "replay": "plan._replaying",
    # Pools as objects: private ones, and each device's default pool.
    "Pool": "pool", "default_pool": "pool",
    "Estimate": "plan.estimator", "estimate": "plan.estimator", "find_max_batch": "plan.estimator",
    "advise": "plan.estimator", "plan_checkpointing": "plan.estimator",
    "doctor_estimates": "plan.estimator",
}


def __getattr__(name):
    # vramkit.torch and friends import their framework: load them only when asked for.
    if name in _INTEGRATIONS:
        return _importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY:
        value = getattr(_importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value  # found directly from now on
        return value
    raise AttributeError(f"module 'vramkit' has no attribute {name!r}")


# ---------------------------------------------------------------------------------------
# Devices, named the ways the frameworks name them.
# ---------------------------------------------------------------------------------------
# ASCII digits only: Python's \d and int() also read other scripts' digits ("cuda:\u0663").
_DEVICE_RE = _re.compile(
    r"^(?:/(?:physical_)?device:)?(?:(?:cuda|gpu)(?::(\d+))?)$", _re.IGNORECASE | _re.ASCII
)


def _error(status: int, message: str) -> VramError:
    """The exception of a status code with this message, carrying .status and .errname as
    the engine's own errors do."""
    return _core.error(status, message)


def _invalid(message: str) -> VramError:
    return _error(_core.VRAM_EINVAL, message)


def _escaped(text: str) -> str:
    """A value as messages quote foreign text (vramkit._shown, loaded only for a message:
    `import vramkit` stays as light as it is)."""
    from ._shown import shown

    return shown(text)


def _device(device) -> int:
    """Device ordinal of 0, "cuda", "cuda:1", "GPU:0", "/device:GPU:0", a torch.device or a
    TensorFlow PhysicalDevice; None means device 0."""
    if device is None:
        return 0
    if isinstance(device, bool):
        raise TypeError("device must be an int or a device name, not bool")
    if isinstance(device, int):
        if device < 0:
            raise _error(_core.VRAM_EDEVICE,
                         f"device {device}: invalid device ordinal (ordinals start at 0)")
        if device >= 1 << 31:
            # Past a C int: no source numbers its devices so far, and the engine never sees it.
            raise _error(_core.VRAM_EDEVICE, f"device {device}: invalid device ordinal")
        return device
    if isinstance(device, str):
        m = _DEVICE_RE.match(device.strip())
        if m is None:
            raise _error(
                _core.VRAM_EDEVICE,
                f"unknown device {device!r}: expected an ordinal, 'cuda:N', 'GPU:N' or "
                f"'/device:GPU:N'",
            )
        return _device(int(m.group(1) or 0))  # held to an ordinal's bounds
    # torch.device: .type == "cuda" and .index (None = current device, taken as 0 here).
    dtype = getattr(device, "type", None)
    if isinstance(dtype, str) and hasattr(device, "index"):
        if dtype != "cuda":
            raise _error(_core.VRAM_EDEVICE, f"not a CUDA device: {device!r}")
        return device.index or 0
    # tf.config.PhysicalDevice / LogicalDevice: .name == "/physical_device:GPU:0".
    name = getattr(device, "name", None)
    if isinstance(name, str):
        return _device(name)
    raise TypeError(f"device must be an int or a device name, not {type(device).__name__}")


_core.set_device_resolver(_device)


# ---------------------------------------------------------------------------------------
# PyTorch's vocabulary.
# ---------------------------------------------------------------------------------------

def memory_stats_raw(device=None) -> dict:
    """The engine's statistics as it keeps them: each stat a (current, peak, total) tuple,
    each counter an int, plus largest_free_block, fragmentation and limit_bytes."""
    return _core.stats(_device(device))


# Stats vramkit reads from the layout at the call rather than tracking them: no totals.
_LAYOUT_STATS = ("inactive_split", "inactive_split_bytes")
# What PyTorch reports for max_split_size when no PYTORCH_CUDA_ALLOC_CONF limit is set (its
# "no limit", SIZE_MAX, as a signed 64-bit figure): vramkit splits blocks of any size.
_NO_MAX_SPLIT = -1


def _stat_keys(out: dict, name: str, pool: str, value: tuple) -> None:
    # PyTorch spells a stat "<name>.<pool>.<current|peak|allocated|freed>", where
    # "allocated" is the sum of increases and "freed" the sum of decreases.
    current, peak, total = value
    untracked = name in _LAYOUT_STATS
    out[f"{name}.{pool}.current"] = current
    out[f"{name}.{pool}.peak"] = peak
    out[f"{name}.{pool}.allocated"] = 0 if untracked else total
    out[f"{name}.{pool}.freed"] = 0 if untracked else total - current


def memory_stats(device=None) -> dict:
    """A flat dict keyed as torch.cuda.memory_stats() is, with every key PyTorch's caching
    allocator reports ("allocated_bytes.all.current", "active_bytes.small_pool.peak",
    "inactive_split_bytes.large_pool.current", "num_ooms", "max_split_size", ...), plus
    vramkit's own ("largest_free_block", "fragmentation", "limit_bytes", "num_mallocs",
    ...). small_pool is the memory of vramkit's small segments (requests up to 1 MiB), as
    PyTorch's; docs/python.md says which figures have no vramkit equivalent."""
    d = _device(device)
    return _flat_stats(_core.stats(d), _core.split_stats(d))


def _flat_stats(raw: dict, split: dict) -> dict:
    """memory_stats()'s flat dict of a pool's stats and split_stats."""
    out = {}
    for name, value in raw.items():
        if isinstance(value, tuple):
            _stat_keys(out, name, "all", value)
        else:
            # Counters keep their names: num_alloc_retries, num_ooms, num_device_alloc and
            # num_device_free are PyTorch's too; the rest are vramkit's own.
            out[name] = value
    for pool in ("small_pool", "large_pool"):
        for name, value in split[pool].items():
            _stat_keys(out, name, pool, value)
    for name in _LAYOUT_STATS:
        both = [split[p][name] for p in ("small_pool", "large_pool")]
        _stat_keys(out, name, "all", tuple(a + b for a, b in zip(*both)))
    # No block is ever "oversize" without a max_split_size: PyTorch reports 0 then too.
    for name in ("oversize_allocations", "oversize_segments"):
        for field in ("current", "peak", "allocated", "freed"):
            out[f"{name}.{field}"] = 0
    out["num_sync_all_streams"] = split["num_sync_all_streams"]
    out["max_split_size"] = _NO_MAX_SPLIT
    return dict(sorted(out.items()))


def memory_allocated(device=None) -> int:
    """Bytes held by live blocks (rounded block sizes), as torch.cuda.memory_allocated()."""
    return _core.stats(_device(device))["allocated_bytes"][0]


def max_memory_allocated(device=None) -> int:
    """Peak of memory_allocated() since start or the last reset_peak_memory_stats()."""
    return _core.stats(_device(device))["allocated_bytes"][1]


def memory_reserved(device=None) -> int:
    """Bytes held from the driver, cached or in use, as torch.cuda.memory_reserved()."""
    return _core.stats(_device(device))["reserved_bytes"][0]


def max_memory_reserved(device=None) -> int:
    """Peak of memory_reserved() since start or the last reset_peak_memory_stats()."""
    return _core.stats(_device(device))["reserved_bytes"][1]


# The rows memory_summary(abbreviated=True) keeps: what a user looks at first.
_SUMMARY_ROWS = ("allocated_bytes", "reserved_bytes", "largest_free_block", "fragmentation",
                 "limit")


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A human-readable table of the device's statistics, as torch.cuda.memory_summary().
    abbreviated=True keeps the title and the rows of allocated and reserved bytes (current,
    peak, total), the largest free block, the fragmentation and the limit."""
    text = _core.summary(_device(device))
    if not abbreviated:
        return text
    kept = []
    for line in text.splitlines(keepends=True):
        cells = line.strip("| \n").split("|")
        name = cells[0].strip() if cells else ""
        # Rules, the title and the column heads frame the kept rows; other rows go.
        if line.startswith("|=") or line.startswith("|-") or "summary" in name or \
                name == "metric" or name in _SUMMARY_ROWS:
            if kept and line.startswith("|-") and kept[-1].startswith("|-"):
                continue  # two rules in a row where the dropped rows were
            kept.append(line)
    return "".join(kept)


def empty_cache(device=None) -> None:
    """Return every fully free cached segment to the driver. With no device, empty every
    pool this process has used (torch.cuda.empty_cache() does so too)."""
    if device is not None:
        _core.empty_cache(_device(device))
        return
    for d in range(_TRACKED_DEVICES):
        if _pool_in_use(d):
            _core.empty_cache(d)


def reset_peak_memory_stats(device=None) -> None:
    """Set every peak statistic of the device to its current value."""
    _core.reset_peak_stats(_device(device))


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Cap the memory the device's pool may reserve at fraction * total device memory,
    as torch.cuda.set_per_process_memory_fraction()."""
    if isinstance(fraction, bool) or not isinstance(fraction, (float, int)):
        raise TypeError(f"fraction must be a float, not {type(fraction).__name__}")
    if not 0.0 <= fraction <= 1.0:
        raise _invalid(f"fraction must be within [0, 1], got {fraction}")
    if fraction == 0.0:
        # A zero cap would fail every allocation; PyTorch means the same by 0.
        _core.set_limit(_device(device), 1, 0.0)
    else:
        _core.set_limit(_device(device), 0, float(fraction))


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the device, as torch.cuda.mem_get_info()."""
    return _core.mem_get_info(_device(device))


def enable_peer_access(device, peer) -> None:
    """Let device `peer` read and write the memory of `device`'s pool, what is mapped now and
    later (the vmm source; NotImplementedError on the others)."""
    _core.enable_peer_access(_device(device), _device(peer))


def last_oom_report(device=None) -> str:
    """The report of the last out-of-memory failure ("" if none). With no device: the device
    on which PyTorch's allocations (through vramkit.torch) last ran out, else device 0."""
    if device is None:
        hooks = _torch_hooks_if_loaded()
        d = hooks.vramkit_torch_last_oom_device() if hooks is not None else -1
        device = d if d >= 0 else 0
    return _core.oom_report(_device(device))


def last_oom_info(device=None) -> dict | None:
    """The figures of the last out-of-memory failure as the engine kept them (None if
    none): the cause by name, requested, capacity, device_free, limit, reserved, allocated,
    cached_free, largest_free_block, raise_limit_by, others_used, shortfall, neighbours...
    (vram_oom_info_t). The device as last_oom_report chooses it."""
    if device is None:
        hooks = _torch_hooks_if_loaded()
        d = hooks.vramkit_torch_last_oom_device() if hooks is not None else -1
        device = d if d >= 0 else 0
    return _core.oom_info(_device(device))


def source(device=None) -> str:
    """Name of the memory source behind the device's pool ("sim", "cuda", "vmm", ...)."""
    return _core.source(_device(device))


def device_count(source: str = "auto") -> int:
    """Number of devices the source can see (the sim source models 8)."""
    if isinstance(source, str) and source not in _SOURCES:
        # Checked here, where the name can be quoted escaped: a NUL or an escape sequence
        # would reach the engine's message raw, or stop the engine's reading of it.
        raise _invalid(f"source: unknown source '{_escaped(source)}'; expected "
                       f"{', '.join(_SOURCES[:-1])} or {_SOURCES[-1]}")
    return _core.device_count(source)


# ---------------------------------------------------------------------------------------
# TensorFlow's vocabulary.
# ---------------------------------------------------------------------------------------


def get_memory_info(device) -> dict:
    """{"current": bytes in use, "peak": peak bytes in use}, as
    tf.config.experimental.get_memory_info(); device may be "GPU:0" or "/device:GPU:0"."""
    current, peak, _ = _core.stats(_device(device))["allocated_bytes"]
    return {"current": current, "peak": peak}


def reset_memory_stats(device=None) -> None:
    """Reset the peak of get_memory_info() to the current value, as TensorFlow's."""
    _core.reset_peak_stats(_device(device))


# Options given by set_memory_growth() per device, waiting for the pool to be created.
_modes: dict[int, bool] = {}
_config_lock = _threading.Lock()
_TRACKED_DEVICES = 64  # the extension tracks which pools it touched for this many devices


def set_memory_growth(device, enabled: bool) -> None:
    """enabled=True: grow on demand (vramkit's default). enabled=False: preallocate, as
    TensorFlow does without memory growth: the pool reserves VRAMKIT_LIMIT if that is set,
    else 90% of the device, when it is created (here, at once). Like TensorFlow, this must
    come before the device's pool is first used; afterwards it raises RuntimeError (so
    set_memory_limit, which creates the pool, comes after it)."""
    if not isinstance(enabled, bool):
        raise TypeError("enabled must be a bool")
    d = _device(device)
    with _config_lock:
        if _pool_in_use(d):
            if _modes.get(d, True) == enabled:
                return  # already so; TensorFlow accepts a repeat too
            raise RuntimeError(
                f"Physical devices cannot be modified after being initialized: the vramkit "
                f"pool of device {d} was already created; call set_memory_growth() first"
            )
        _modes[d] = enabled
        if enabled:
            _create_pool(d, {"VRAMKIT_PREALLOCATE": "0"})
        else:
            limit = _os.environ.get("VRAMKIT_LIMIT")
            _create_pool(d, {"VRAMKIT_PREALLOCATE": limit or "90%"})


def set_memory_limit(device, limit: int | float | str) -> None:
    """Hard limit on the memory the device's pool reserves (TensorFlow's memory_limit of a
    logical device), written as configure(limit=...) is: bytes (int), a size string ("1G"),
    a percentage ("50%") or a fraction (0.5) of device memory. Allowed at any time; 0
    removes the limit."""
    if isinstance(limit, int) and not isinstance(limit, bool):
        # The extension checks ints itself: negative, or more than any device holds.
        _core.set_limit(_device(device), limit, 0.0)
        return
    _core.set_limit(_device(device), *_limit_args(limit))


def _limit_args(limit) -> tuple[int, float]:
    """(bytes, fraction) of a limit given as a size string, a percentage or a fraction."""
    return _core.parse_size(_size_text("limit", limit, True), True)


# ---------------------------------------------------------------------------------------
# Options before first use.
# ---------------------------------------------------------------------------------------
_SOURCES = _core.source_names()  # the engine's names, in its order


def _size_text(name: str, value, allow_percent: bool) -> str:
    """A size option as the VRAMKIT_* variables spell it: 123, "64M", "30%" or a float
    fraction of device memory such as 0.3. Checked here so a bad value names its option."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a size, not bool")
    if isinstance(value, int):
        if value < 0:
            raise _invalid(f"{name} must be >= 0, got {value}")
        if value >= 1 << 64:
            # An option caps or reserves; past 64 bits it names no device at all.
            raise _invalid(f"{name}: {value} bytes is more than any device holds")
        return str(value)
    if isinstance(value, float):
        if not allow_percent:
            raise TypeError(f"{name} must be a size in bytes or a string such as '64M', "
                            f"not float")
        if not 0.0 < value <= 1.0:
            raise _invalid(f"{name} as a fraction must be within (0, 1], got {value}")
        return f"{value * 100:.10g}%"
    if isinstance(value, str):
        if "\x00" in value:  # the engine reads C strings: the rest would go unseen
            raise _invalid(f"{name} holds a NUL character: '{_escaped(value[:60])}'")
        try:
            _core.parse_size(value, allow_percent)
        except VramError as exc:
            # The engine's message quotes the text and says what is wrong with it.
            kinds = "a size such as '8G' or a percentage such as '50%'" if allow_percent \
                else "a size such as '8G'"
            raise _invalid(f"{name}: {exc} (expected {kinds})") from None
        return value
    raise TypeError(f"{name} must be an int, float or str, not {type(value).__name__}")


def _share_text(name: str, value) -> str:
    """A share in [0, 1] (a number, or a string such as "90%") as VRAMKIT_* text."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number from 0 to 1, not bool")
    if isinstance(value, (int, float)):
        if not 0.0 <= value <= 1.0:  # NaN fails too
            raise _invalid(f"{name} must be within [0, 1], got {value}")
        return repr(float(value))
    if isinstance(value, str):
        text = value.strip()
        try:
            share = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            raise _invalid(f"{name}: cannot read {value!r} as a share") from None
        if not 0.0 <= share <= 1.0:
            raise _invalid(f"{name} must be within [0, 1], got {value!r}")
        return text
    raise TypeError(f"{name} must be a number or a string, not {type(value).__name__}")


def configure(
    device=0,
    *,
    source: str | None = None,
    limit=None,
    preallocate=None,
    release_threshold=None,
    tight_threshold=None,
    virtual_threshold=None,
    large_blocks: str | None = None,
    sim_capacity=None,
    give_back: bool | None = None,
    give_back_timeout=None,
    group_limit=None,
    soft_limit=None,
) -> None:
    """Create the device's pool now with these options (each None: from VRAMKIT_*).

    source: "auto", "sim", "sim:vmm", "cuda", "vmm" or "managed". limit, preallocate:
    bytes (int), a size string ("8G"), a percentage ("50%") or a fraction (0.5) of device
    memory. release_threshold, sim_capacity: bytes or a size string. tight_threshold: a
    share of the memory cap from 0 to 1 (or "90%") past which large requests get segments of
    their own size instead of cuts of bigger cached ones: less memory, more driver calls
    (0 = always; default 1 = never; fixed large segments only: large_blocks "fixed", or
    the managed source). virtual_threshold: the share of device memory up to which large
    blocks in virtual memory are mapped in pieces of up to 128 MiB and kept (0: 2 MiB
    granules one by one from the start, as under any limit); with large_blocks "fixed",
    the share of the cap past which the cuda (and sim) source's large requests go to
    virtual memory mapped where live blocks are, so that a pool near its cap fits as
    tightly as the vmm source (0 = from the start; default 0.5;
    1 = never: fixed segments only, every tensor shareable between processes by CUDA IPC).
    large_blocks: "virtual" (default) or "fixed": with "virtual" the cuda (and sim)
    source's large requests go to virtual memory from the first one and map as on the vmm
    source; small ones keep their fixed 2 MiB segments, and only those can be shared
    between processes by CUDA IPC. "fixed" gives each large request a cuMemAlloc segment
    of its own size (shareable by CUDA IPC) until virtual_threshold. give_back (False: this
    process keeps its cache whatever its neighbours ask), give_back_timeout (milliseconds
    this pool waits for its neighbours' answer), group_limit (every vramkit process of the
    device together) and soft_limit (past it this pool gives all its idle memory at the
    first request): the sharing of one GPU (VRAMKIT_GIVE_BACK and the others). Must come
    before the device's pool is first used; afterwards it raises RuntimeError (use set_memory_limit or
    set_per_process_memory_fraction to change the limit of a live pool).
    """
    d = _device(device)
    # Each override travels with the argument it came from: a value the engine refuses is
    # then blamed on sim_capacity=..., not on a VRAMKIT_SIM_CAPACITY the user never set.
    env = {}
    if source is not None:
        if not isinstance(source, str):
            raise TypeError(f"source must be a str, not {type(source).__name__}")
        if source not in _SOURCES:
            raise _invalid(f"source must be one of {', '.join(_SOURCES)}, got {source!r}")
        env["VRAMKIT_SOURCE"] = ("source", source)
    sizes = (("limit", "VRAMKIT_LIMIT", limit, True),
             ("preallocate", "VRAMKIT_PREALLOCATE", preallocate, True),
             ("release_threshold", "VRAMKIT_RELEASE_THRESHOLD", release_threshold, False),
             ("sim_capacity", "VRAMKIT_SIM_CAPACITY", sim_capacity, False))
    for name, variable, value, allow_percent in sizes:
        if value is not None:
            env[variable] = (name, _size_text(name, value, allow_percent))
    for name, variable, value in (("group_limit", "VRAMKIT_GROUP_LIMIT", group_limit),
                                  ("soft_limit", "VRAMKIT_SOFT_LIMIT", soft_limit)):
        if value is not None:
            env[variable] = (name, _size_text(name, value, True))
    if give_back is not None:
        if not isinstance(give_back, bool):
            raise TypeError(f"give_back must be a bool, not {type(give_back).__name__}")
        env["VRAMKIT_GIVE_BACK"] = ("give_back", "1" if give_back else "0")
    if give_back_timeout is not None:
        if isinstance(give_back_timeout, bool) or not isinstance(give_back_timeout, int):
            raise TypeError("give_back_timeout must be an int (milliseconds), not "
                            f"{type(give_back_timeout).__name__}")
        env["VRAMKIT_GIVE_BACK_TIMEOUT"] = ("give_back_timeout", str(give_back_timeout))
    for name, variable, value in (("tight_threshold", "VRAMKIT_TIGHT_THRESHOLD", tight_threshold),
                                  ("virtual_threshold", "VRAMKIT_VIRTUAL_THRESHOLD",
                                   virtual_threshold)):
        if value is not None:
            env[variable] = (name, _share_text(name, value))
    if large_blocks is not None:
        if not isinstance(large_blocks, str):
            raise TypeError(f"large_blocks must be a str, not {type(large_blocks).__name__}")
        if large_blocks not in ("fixed", "virtual"):
            raise _invalid(f"large_blocks must be 'fixed' or 'virtual', got {large_blocks!r}")
        env["VRAMKIT_LARGE_BLOCKS"] = ("large_blocks", large_blocks)
    with _config_lock:
        if _pool_in_use(d):
            # The pool exists (a live block or not): its options were fixed when it was made.
            raise RuntimeError(
                f"vramkit.configure(): the pool of device {d} was already created (by an "
                f"earlier configure(), an allocation, a statistics call or PyTorch), and its "
                f"options are fixed then; configure it before any of those"
            )
        pre = env["VRAMKIT_PREALLOCATE"][1] if "VRAMKIT_PREALLOCATE" in env else \
            _os.environ.get("VRAMKIT_PREALLOCATE", "0")
        _modes[d] = pre in ("0", "")
        _create_pool(d, env)


def _create_pool(device: int, env: dict) -> None:
    """Create the default pool of a device with these VRAMKIT_* overrides (text, or
    (argument, text) to blame the argument for a bad value) on top of the environment; the
    environment itself is left alone (other threads may be reading it)."""
    _core.init_pool(device, env)


def _pool_in_use(device: int) -> bool:
    """Whether the device's default pool exists: used from Python, or by PyTorch through
    the vramkit.torch hooks."""
    if _core.pool_touched(device):
        return True
    hooks = _torch_hooks_if_loaded()
    return bool(hooks is not None and hooks.vramkit_torch_device_used(device))


def _torch_hooks_if_loaded():
    """The ctypes handle of libvramkit_torch if vramkit.torch loaded it, else None."""
    import sys

    mod = sys.modules.get(f"{__name__}.plug.torch")
    return getattr(mod, "_hooks", None) if mod is not None else None

"""vramkit.torch: make vramkit PyTorch's CUDA allocator.

    import vramkit.torch
    vramkit.torch.install()          # before PyTorch allocates any CUDA memory

PyTorch then allocates through libvramkit_torch.so (torch.cuda.memory.CUDAPluggableAllocator);
torch.cuda.empty_cache(), torch.cuda.set_per_process_memory_fraction() and
Tensor.record_stream() reach vramkit. PyTorch's own memory_stats()/memory_summary() do not
work under a pluggable allocator: use vramkit.memory_stats() and vramkit.memory_summary(),
which see every PyTorch allocation (the hooks and vramkit._core share one libvramkit).

An allocation that runs out of memory makes PyTorch raise torch.OutOfMemoryError; the
engine's report is vramkit.last_oom_report(), and inside ``with vramkit.torch.oom_report():``
the exception's message carries the report and gains a ``.report`` attribute.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

import torch

import vramkit

_LIB_NAME = "libvramkit_torch.so"
_hooks = None  # ctypes.CDLL of libvramkit_torch once installed
_allocator = None  # the CUDAPluggableAllocator, kept alive for the life of the process


def library_path() -> str:
    """Path of the shared library holding the allocator hooks."""
    return os.path.join(os.path.dirname(os.path.abspath(vramkit.__file__)), _LIB_NAME)


def _fn_addr(lib, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def installed() -> bool:
    """True once install() has made vramkit PyTorch's allocator."""
    return _allocator is not None


def install(device=None, **options) -> None:
    """Make vramkit PyTorch's CUDA allocator. Call before PyTorch allocates CUDA memory.

    options are vramkit.configure()'s (source, limit, preallocate, release_threshold,
    tight_threshold); they configure the pool of `device` (default: every visible device)
    before first use.
    """
    global _hooks, _allocator
    if _allocator is not None:
        if options:
            raise RuntimeError("vramkit.torch.install(): already installed; options can no "
                               "longer change")
        return
    if not torch.cuda.is_available():
        raise RuntimeError("vramkit.torch.install(): PyTorch sees no CUDA device")
    if torch.cuda.is_initialized():
        used = 0
        try:
            used = torch.cuda.memory_reserved()
        except RuntimeError:
            pass
        detail = (f"PyTorch has already reserved {used} bytes of CUDA memory"
                  if used else "PyTorch's CUDA state is already initialized")
        raise RuntimeError(
            f"vramkit.torch.install() must run before PyTorch allocates CUDA memory, but "
            f"{detail}, so its caching allocator can no longer be replaced. Call it at the "
            f"start of the program, before the first tensor or module is moved to CUDA.")

    if options:
        devices = ([device] if device is not None
                   else range(torch.cuda.device_count()))
        for d in devices:
            vramkit.configure(d, **options)

    path = library_path()
    lib = ctypes.CDLL(path)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        path, "vramkit_torch_malloc", "vramkit_torch_free")
    native = allocator.allocator()
    # Optional hooks: present in the PyTorch versions that have them, skipped elsewhere.
    for setter, fn in (("set_reset_fn", "vramkit_torch_empty_cache"),
                       ("set_memory_fraction_fn", "vramkit_torch_set_memory_fraction"),
                       ("set_record_stream_fn", "vramkit_torch_record_stream")):
        if hasattr(native, setter):
            getattr(native, setter)(_fn_addr(lib, fn))
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as exc:
        raise RuntimeError(
            "vramkit.torch.install() must run before PyTorch allocates CUDA memory: "
            f"PyTorch refused to change its allocator ({exc})") from exc
    lib.vramkit_torch_last_oom_device.restype = ctypes.c_int
    lib.vramkit_torch_last_status.restype = ctypes.c_int
    lib.vramkit_torch_device_used.restype = ctypes.c_int
    lib.vramkit_torch_device_used.argtypes = [ctypes.c_int]
    _hooks, _allocator = lib, allocator


def last_status() -> int:
    """Status code of the last failure inside the hooks (0 if none)."""
    return _hooks.vramkit_torch_last_status() if _hooks is not None else 0


def _oom_count() -> int:
    hooks = _hooks
    if hooks is None:
        return 0
    return sum(vramkit.memory_stats(d)["num_ooms"] for d in range(torch.cuda.device_count())
               if hooks.vramkit_torch_device_used(d))


@contextlib.contextmanager
def oom_report():
    """Within this block, an allocation through vramkit that runs out of memory raises
    torch.OutOfMemoryError carrying vramkit's report, appended to its message and as
    ``exc.report``. PyTorch's pluggable-allocator path reports a failed allocation as a
    plain RuntimeError; when vramkit counted an OOM during the block, that error is raised
    again as torch.OutOfMemoryError (chained to the original)."""
    before = _oom_count()
    try:
        yield
    except RuntimeError as exc:
        is_oom = isinstance(exc, torch.OutOfMemoryError)
        if not is_oom and _oom_count() == before:
            raise
        report = vramkit.last_oom_report()
        message = f"{exc.args[0] if exc.args else exc}\n{report}" if report else str(exc)
        if is_oom:
            exc.report = report
            exc.args = (message,) + tuple(exc.args[1:])
            raise
        oom = torch.OutOfMemoryError(message)
        oom.report = report
        raise oom from exc

"""vramkit.cupy: serve CuPy's device allocations from vramkit.

    import vramkit.cupy
    vramkit.cupy.install()     # cupy.cuda.set_allocator(vramkit.cupy.malloc)

Each allocation is a vramkit DeviceBuffer on CuPy's current device and stream, wrapped in
a cupy.cuda.UnownedMemory whose owner is the buffer: when CuPy drops the memory, the
buffer's last reference goes and vramkit frees the block (reusable at once on that stream).

Out of memory raises cupy.cuda.memory.OutOfMemoryError, the exception CuPy's own pool
raises, with vramkit's report appended to its message and as ``.report``. Before giving up,
malloc does what CuPy's pool does: it frees what can be freed (unreachable arrays, through
the garbage collector, and the blocks CuPy's default pool caches) and tries once more.
"""

from __future__ import annotations

import gc

try:
    import cupy
except ImportError as _exc:  # say what to install rather than "No module named cupy"
    raise ImportError("vramkit.cupy needs CuPy: pip install cupy-cuda12x (or the wheel for "
                      "your CUDA version; or pip install 'vramkit[cupy]')") from _exc

import vramkit


def _release_cupy_memory() -> None:
    """What CuPy's pool does before it reports out of memory: collect garbage, so arrays
    kept only by reference cycles give their vramkit blocks back, and empty CuPy's own
    cache of blocks, which may hold memory from before install()."""
    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()


def _out_of_memory(nbytes: int, device: int, exc: vramkit.OutOfMemoryError):
    report = vramkit.last_oom_report(device)
    # CuPy's "allocated so far" is its pool's total_bytes, what the pool holds from the
    # device (the figure its limit bounds), so vramkit's reserved bytes, not its live ones;
    # both as of the failure itself. CuPy's limit 0 means none, as vramkit's.
    info = exc.oom_info
    if info is not None:
        held, limit = info["reserved"], info["limit"] or 0  # oom_info's limit None: none
    else:
        held, limit = vramkit.memory_reserved(device), \
            vramkit.memory_stats_raw(device)["limit_bytes"]
    error = cupy.cuda.memory.OutOfMemoryError(nbytes, held, limit)
    message = error.args[0] if error.args else str(error)
    error.args = (f"{message}\n{report}" if report else message,)
    error.report = report
    return error


def malloc(nbytes: int) -> "cupy.cuda.MemoryPointer":
    """A cupy.cuda.MemoryPointer over nbytes of vramkit memory (CuPy's allocator signature)."""
    device = cupy.cuda.runtime.getDevice()
    stream = cupy.cuda.get_current_stream().ptr
    try:
        buf = vramkit.empty(nbytes, device=device, stream=stream)
    except vramkit.OutOfMemoryError:
        _release_cupy_memory()
        try:
            buf = vramkit.empty(nbytes, device=device, stream=stream)
        except vramkit.OutOfMemoryError as exc:
            raise _out_of_memory(nbytes, device, exc) from exc
    mem = cupy.cuda.UnownedMemory(buf.ptr, nbytes, buf, device)
    return cupy.cuda.MemoryPointer(mem, 0)


def install() -> None:
    """Make vramkit CuPy's device memory allocator (cupy.cuda.set_allocator)."""
    cupy.cuda.set_allocator(malloc)


def uninstall() -> None:
    """Give CuPy back its default memory pool."""
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)

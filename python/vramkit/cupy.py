"""vramkit.cupy: serve CuPy's device allocations from vramkit.

    import vramkit.cupy
    vramkit.cupy.install()     # cupy.cuda.set_allocator(vramkit.cupy.malloc)

Each allocation is a vramkit DeviceBuffer on CuPy's current device and stream, wrapped in
a cupy.cuda.UnownedMemory whose owner is the buffer: when CuPy drops the memory, the
buffer's last reference goes and vramkit frees the block (reusable at once on that stream).
"""

from __future__ import annotations

import cupy

import vramkit


def malloc(nbytes: int) -> "cupy.cuda.MemoryPointer":
    """A cupy.cuda.MemoryPointer over nbytes of vramkit memory (CuPy's allocator signature)."""
    device = cupy.cuda.runtime.getDevice()
    stream = cupy.cuda.get_current_stream().ptr
    buf = vramkit.empty(nbytes, device=device, stream=stream)
    mem = cupy.cuda.UnownedMemory(buf.ptr, nbytes, buf, device)
    return cupy.cuda.MemoryPointer(mem, 0)


def install() -> None:
    """Make vramkit CuPy's device memory allocator (cupy.cuda.set_allocator)."""
    cupy.cuda.set_allocator(malloc)


def uninstall() -> None:
    """Give CuPy back its default memory pool."""
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)

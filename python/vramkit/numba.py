"""vramkit.numba: a Numba External Memory Management (EMM) plugin.

    NUMBA_CUDA_MEMORY_MANAGER=vramkit.numba python app.py

or, before Numba touches the GPU:

    from numba import cuda
    import vramkit.numba
    cuda.set_memory_manager(vramkit.numba.VramkitMemoryManager)

Device allocations come from vramkit's pool of the current device; host allocations stay
with Numba (HostOnlyCUDAMemoryManager).
"""

from __future__ import annotations

import contextlib
import ctypes

from numba.cuda.cudadrv.driver import (GetIpcHandleMixin, HostOnlyCUDAMemoryManager, MemoryInfo,
                                       MemoryPointer)
from numba.cuda.cudadrv import driver as _driver

import vramkit


def _device_pointer(address: int):
    """The pointer type this Numba's driver layer expects: the NVIDIA binding's CUdeviceptr
    where Numba uses it, a ctypes integer otherwise."""
    uses_binding = getattr(_driver, "USE_NV_BINDING", hasattr(_driver, "binding"))
    if uses_binding:
        return _driver.binding.CUdeviceptr(address)
    return ctypes.c_uint64(address)


class VramkitMemoryManager(GetIpcHandleMixin, HostOnlyCUDAMemoryManager):
    """Numba EMM plugin allocating device memory from vramkit's default pools."""

    def _device_id(self) -> int:
        # The context Numba made this manager for, not cuda.get_current_device(): that
        # asks for the current context, which is still being created while initialize()
        # runs, and would create it again (endless recursion).
        return self.context.device.id

    def initialize(self):
        # Create the pool up front so that configuration errors surface here, not in the
        # first kernel's allocation.
        super().initialize()
        vramkit.memory_reserved(self._device_id())

    def memalloc(self, size):
        buf = vramkit.empty(size, device=self._device_id())
        # The finalizer holds the buffer; Numba calls it when the array dies.
        return MemoryPointer(self.context, _device_pointer(buf.ptr), size,
                             finalizer=buf.free)

    def get_memory_info(self):
        free, total = vramkit.mem_get_info(self._device_id())
        return MemoryInfo(free=free, total=total)

    def reset(self):
        super().reset()
        vramkit.empty_cache(self._device_id())

    @contextlib.contextmanager
    def defer_cleanup(self):
        # vramkit frees are stream-ordered and cheap; nothing needs deferring.
        with super().defer_cleanup():
            yield

    @property
    def interface_version(self):
        return 1


# The name Numba looks for when NUMBA_CUDA_MEMORY_MANAGER=vramkit.numba.
_numba_memory_manager = VramkitMemoryManager

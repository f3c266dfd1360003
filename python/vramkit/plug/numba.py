"""vramkit.numba: a Numba External Memory Management (EMM) plugin.

    NUMBA_CUDA_MEMORY_MANAGER=vramkit.numba python app.py

or, before Numba touches the GPU:

    from numba import cuda
    import vramkit.numba
    cuda.set_memory_manager(vramkit.numba.VramkitMemoryManager)

Device allocations come from vramkit's pool of the current device; host allocations stay
with Numba (HostOnlyCUDAMemoryManager).

Out of memory raises what Numba's own memory manager raises, and what numba.cuda users
catch: numba.cuda.cudadrv.driver.CudaAPIError with the CUDA_ERROR_OUT_OF_MEMORY code, its
message carrying vramkit's report (also as ``.report``). Before giving up, memalloc does
what Numba's manager does: it flushes Numba's pending deallocations (and collects
garbage, so unreachable arrays give their blocks back) and tries once more.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc

try:
    from numba.cuda.cudadrv.driver import (CudaAPIError, GetIpcHandleMixin,
                                           HostOnlyCUDAMemoryManager, MemoryInfo, MemoryPointer)
    from numba.cuda.cudadrv import driver as _driver
except ImportError as _exc:  # say what to install rather than "No module named numba"
    raise ImportError("vramkit.numba needs Numba with CUDA: pip install numba numba-cuda "
                      "(or pip install 'vramkit[numba]')") from _exc

import vramkit


def _device_pointer(address: int):
    """The pointer type this Numba's driver layer expects: the NVIDIA binding's CUdeviceptr
    where Numba uses it, a ctypes integer otherwise."""
    if _uses_binding():
        return _driver.binding.CUdeviceptr(address)
    return ctypes.c_uint64(address)


def _uses_binding() -> bool:
    return bool(getattr(_driver, "USE_NV_BINDING", hasattr(_driver, "binding")))


# The driver API's code for out of memory, the same in every CUDA version.
_CUDA_ERROR_OUT_OF_MEMORY = 2


def _out_of_memory_code():
    """CUDA_ERROR_OUT_OF_MEMORY as this Numba's driver layer spells error codes: the NVIDIA
    binding's CUresult where Numba uses it (an IntEnum, equal to the plain code too), the
    plain int otherwise. Numba's own manager compares CudaAPIError.code with it."""
    if _uses_binding():
        return _driver.binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    return _CUDA_ERROR_OUT_OF_MEMORY


def _out_of_memory(size: int, device: int) -> CudaAPIError:
    report = vramkit.last_oom_report(device)
    message = (f"CUDA_ERROR_OUT_OF_MEMORY: vramkit could not allocate {size} bytes on device "
               f"{device}")
    error = CudaAPIError(_out_of_memory_code(), f"{message}\n{report}" if report else message)
    error.report = report
    return error


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
        device = self._device_id()
        try:
            buf = vramkit.empty(size, device=device)
        except vramkit.OutOfMemoryError:
            # Numba's own manager retries once after flushing its deferred frees.
            pending = getattr(self, "deallocations", None)
            if pending is not None:
                pending.clear()
            gc.collect()
            try:
                buf = vramkit.empty(size, device=device)
            except vramkit.OutOfMemoryError as exc:
                raise _out_of_memory(size, device) from exc
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

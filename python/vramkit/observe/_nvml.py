"""NVML, the driver's management library, through ctypes: what the GPUs hold, as the driver sees it.

``vramkit top``, ``vramkit export`` and the training-loop logger need each GPU's total / used /
free memory, its utilisation and the processes holding memory on it. NVML is opened at run time
(``libnvidia-ml.so.1``, installed with the driver), like the CUDA driver itself, so the package
has no build-time or pip dependency on it and works, with a clear reason, where it is missing.
``VRAMKIT_NVML_LIBRARY`` names another library to open instead (the tests point it at a fake).

    from vramkit.observe._nvml import nvml, NvmlError
    try:
        gpus = nvml().devices()
    except NvmlError as error:
        print("no NVML:", error)

:func:`visible_uuids` maps the device ordinals a CUDA program uses (``CUDA_VISIBLE_DEVICES``,
``NVIDIA_VISIBLE_DEVICES``) to the physical GPUs' UUIDs, the one name NVML and CUDA share.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["GpuInfo", "GpuProcess", "Nvml", "NvmlError", "nvml", "process_name", "visible_uuids"]

LIBRARY_VARIABLE = "VRAMKIT_NVML_LIBRARY"
DEFAULT_LIBRARY = "libnvidia-ml.so.1"

# nvmlReturn_t values this module acts on (nvml.h).
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_FUNCTION_NOT_FOUND = 13

# The largest buffers the driver fills: NVML_DEVICE_UUID_V2_BUFFER_SIZE and
# NVML_DEVICE_NAME_V2_BUFFER_SIZE.
_UUID_BUFFER = 96
_NAME_BUFFER = 96


class NvmlError(RuntimeError):
    """NVML cannot be used: the library is missing, its initialisation failed, or a call failed.
    The message says which, with NVML's own words (nvmlErrorString) where it gave any."""


@dataclass
class GpuProcess:
    """A process NVML lists as holding memory on a GPU. used_bytes is None where the driver
    does not say (NVML_VALUE_NOT_AVAILABLE, e.g. under WDDM or without the privilege)."""

    pid: int
    used_bytes: int | None
    name: str


@dataclass
class GpuInfo:
    """One physical GPU as NVML reports it; memory in bytes, utilization_gpu in percent or
    None where the device does not report it."""

    index: int
    uuid: str
    name: str
    total: int
    used: int
    free: int
    utilization_gpu: int | None
    processes: list[GpuProcess] = field(default_factory=list)


# The C structs, as nvml.h lays them out.
class _Memory(ctypes.Structure):  # nvmlMemory_t: "used" counts the driver's reserve too
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class _MemoryV2(ctypes.Structure):  # nvmlMemory_v2_t: the reserve is apart from "used"
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong),
                ("reserved", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


_MEMORY_V2_VERSION = ctypes.sizeof(_MemoryV2) | (2 << 24)  # nvmlMemory_v2


class _Utilization(ctypes.Structure):  # nvmlUtilization_t
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _ProcessInfoV1(ctypes.Structure):  # for nvmlDeviceGetComputeRunningProcesses (no suffix)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _ProcessInfoV2(ctypes.Structure):  # for the _v2 and _v3 calls (nvmlProcessInfo_t)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


# The per-process calls, newest first, with the struct each fills: _v3 needs driver >= 510,
# _v2 >= 470; the unversioned one is in every driver.
_PROCESS_CALLS = (("nvmlDeviceGetComputeRunningProcesses_v3", _ProcessInfoV2),
                  ("nvmlDeviceGetComputeRunningProcesses_v2", _ProcessInfoV2),
                  ("nvmlDeviceGetComputeRunningProcesses", _ProcessInfoV1))

_NOT_AVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long


def process_name(pid: int) -> str:
    """The process's name (/proc/<pid>/comm), or "" where it is gone or not ours to read."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as comm:
            return comm.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


class Nvml:
    """An initialised NVML library. Get it from :func:`nvml`, which opens it once."""

    def __init__(self, library: str | None = None):
        path = library or os.environ.get(LIBRARY_VARIABLE) or DEFAULT_LIBRARY
        try:
            self._lib = ctypes.CDLL(path)
        except OSError as error:
            raise NvmlError(f"the NVML library {path} cannot be opened ({error}); it comes "
                            f"with the NVIDIA driver, which this machine or container "
                            f"lacks or does not expose") from None
        init = self._function("nvmlInit_v2") or self._function("nvmlInit")
        if init is None or self._function("nvmlErrorString") is None:
            raise NvmlError(f"{path} has no nvmlInit: it is not an NVML library")
        self._lib.nvmlErrorString.restype = ctypes.c_char_p
        status = init()
        if status != NVML_SUCCESS:
            raise NvmlError(f"NVML initialisation failed: {self.error_string(status)} "
                            f"(nvmlReturn {status})")
        self.path = path
        self._lock = threading.Lock()  # NVML is thread-safe; the cached lookups below are not
        self._process_call: tuple | None = None

    def _function(self, name: str):
        try:
            return getattr(self._lib, name)
        except AttributeError:
            return None

    def error_string(self, status: int) -> str:
        """NVML's words for a return code."""
        text = self._lib.nvmlErrorString(status)
        return text.decode("utf-8", "replace") if text else f"error {status}"

    def _check(self, status: int, what: str) -> None:
        if status != NVML_SUCCESS:
            raise NvmlError(f"{what} failed: {self.error_string(status)} (nvmlReturn {status})")

    def device_count(self) -> int:
        count = ctypes.c_uint(0)
        get = self._function("nvmlDeviceGetCount_v2") or self._function("nvmlDeviceGetCount")
        self._check(get(ctypes.byref(count)), "nvmlDeviceGetCount")
        return count.value

    def _handle(self, index: int) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        get = (self._function("nvmlDeviceGetHandleByIndex_v2")
               or self._function("nvmlDeviceGetHandleByIndex"))
        self._check(get(ctypes.c_uint(index), ctypes.byref(handle)),
                    f"nvmlDeviceGetHandleByIndex({index})")
        return handle

    def _string(self, function: str, handle, size: int) -> str:
        buffer = ctypes.create_string_buffer(size)
        self._check(getattr(self._lib, function)(handle, buffer, ctypes.c_uint(size)), function)
        return buffer.value.decode("utf-8", "replace")

    def _memory(self, handle) -> tuple[int, int, int]:
        """(total, used, free). The _v2 call keeps the driver's reserve out of "used", as
        nvidia-smi reports it; drivers before 515 have only the first form."""
        v2 = self._function("nvmlDeviceGetMemoryInfo_v2")
        if v2 is not None:
            memory = _MemoryV2(version=_MEMORY_V2_VERSION)
            status = v2(handle, ctypes.byref(memory))
            if status == NVML_SUCCESS:
                return memory.total, memory.used, memory.free
            if status not in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
                self._check(status, "nvmlDeviceGetMemoryInfo_v2")
        memory_v1 = _Memory()
        self._check(self._lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory_v1)),
                    "nvmlDeviceGetMemoryInfo")
        return memory_v1.total, memory_v1.used, memory_v1.free

    def _utilization(self, handle) -> int | None:
        rates = _Utilization()
        # Not supported on some devices (and on MIG instances): no figure, not an error.
        if self._lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(rates)) != NVML_SUCCESS:
            return None
        return rates.gpu

    def _processes_with(self, call, struct, handle) -> tuple[int, list]:
        """One query: size with count 0, then fill; the list may grow in between, so retry."""
        count = ctypes.c_uint(0)
        status = call(handle, ctypes.byref(count), None)
        for _ in range(8):
            if status == NVML_SUCCESS and count.value == 0:
                return status, []
            if status not in (NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE):
                return status, []
            room = count.value + 8  # room for processes that start meanwhile
            infos = (struct * room)()
            count = ctypes.c_uint(room)
            status = call(handle, ctypes.byref(count), infos)
            if status == NVML_SUCCESS:
                return status, list(infos[:count.value])
        return status, []

    def processes(self, handle) -> list[GpuProcess]:
        """The compute processes on a device, through the newest call this driver has."""
        with self._lock:
            calls = [self._process_call] if self._process_call else [
                (getattr(self._lib, name), struct) for name, struct in _PROCESS_CALLS
                if self._function(name) is not None]
        status = NVML_ERROR_FUNCTION_NOT_FOUND
        for call, struct in calls:
            status, infos = self._processes_with(call, struct, handle)
            if status in (NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED):
                continue  # exported by the library, but this driver answers only an older form
            with self._lock:
                self._process_call = (call, struct)
            self._check(status, "nvmlDeviceGetComputeRunningProcesses")
            return [GpuProcess(pid=info.pid,
                               used_bytes=None if info.usedGpuMemory == _NOT_AVAILABLE
                               else info.usedGpuMemory,
                               name=process_name(info.pid)) for info in infos]
        self._check(status, "nvmlDeviceGetComputeRunningProcesses")
        return []

    def device(self, index: int) -> GpuInfo:
        handle = self._handle(index)
        total, used, free = self._memory(handle)
        return GpuInfo(index=index, uuid=self._string("nvmlDeviceGetUUID", handle, _UUID_BUFFER),
                       name=self._string("nvmlDeviceGetName", handle, _NAME_BUFFER),
                       total=total, used=used, free=free,
                       utilization_gpu=self._utilization(handle),
                       processes=self.processes(handle))

    def devices(self) -> list[GpuInfo]:
        """Every GPU NVML sees (in a container: those given to it), in NVML's order (PCI bus)."""
        return [self.device(index) for index in range(self.device_count())]

    def uuids(self) -> list[str]:
        """The UUIDs of the GPUs, in NVML's order, without the per-device queries."""
        return [self._string("nvmlDeviceGetUUID", self._handle(index), _UUID_BUFFER)
                for index in range(self.device_count())]

    def visible_uuids(self, environ: Mapping[str, str] | None = None) -> list[str]:
        """See :func:`visible_uuids`."""
        return select_visible(self.uuids(), os.environ if environ is None else environ)


_cached: Nvml | None = None
_cached_error: NvmlError | None = None
_cache_lock = threading.Lock()


def nvml() -> Nvml:
    """The process's NVML, initialised on the first call; later calls return it (or raise the
    same NvmlError again: a missing driver does not appear while a process runs)."""
    global _cached, _cached_error
    with _cache_lock:
        if _cached is None and _cached_error is None:
            try:
                _cached = Nvml()
            except NvmlError as error:
                _cached_error = error
        if _cached_error is not None:
            raise NvmlError(str(_cached_error))
        return _cached


def _reset_for_tests() -> None:
    """Forget the cached library, so a test can open another one."""
    global _cached, _cached_error
    with _cache_lock:
        _cached, _cached_error = None, None


def _select(uuids: list[str], spec: str) -> list[str]:
    """The devices a CUDA_VISIBLE_DEVICES-style list picks out of uuids, in its order. As CUDA
    does: entries are indices, "GPU-" UUIDs or unique prefixes of them; the list ends at the
    first entry that names no device, and a device named twice ends it too."""
    spec = spec.strip()
    if spec.lower() == "all":
        return list(uuids)
    if spec.lower() in ("none", "void", ""):
        return []
    chosen: list[str] = []
    for entry in spec.split(","):
        entry = entry.strip()
        if entry.isdigit():
            found = uuids[int(entry)] if int(entry) < len(uuids) else None
        else:
            if not entry.upper().startswith("GPU-"):
                entry = "GPU-" + entry
            matches = [uuid for uuid in uuids if uuid.lower().startswith(entry.lower())]
            found = matches[0] if len(matches) == 1 else None
        if found is None or found in chosen:
            break
        chosen.append(found)
    return chosen


def select_visible(uuids: list[str], environ: Mapping[str, str]) -> list[str]:
    """The physical GPUs (UUIDs, from NVML's list) a process with this environment sees as CUDA
    devices 0, 1, ... NVIDIA_VISIBLE_DEVICES is the container runtime's choice among the host's
    GPUs; CUDA_VISIBLE_DEVICES then chooses among those."""
    devices = list(uuids)
    container = environ.get("NVIDIA_VISIBLE_DEVICES")
    if container is not None:
        entries = [entry.strip() for entry in container.split(",") if entry.strip()]
        # Inside a container NVML already sees only the runtime's GPUs, numbered from 0, while
        # the variable holds the host's indices: when it lists as many indices as NVML shows
        # GPUs, NVML's list is that selection already. UUIDs select the same in both views.
        if not (entries and all(entry.isdigit() for entry in entries)
                and len(entries) == len(devices)):
            devices = _select(devices, container)
    cuda = environ.get("CUDA_VISIBLE_DEVICES")
    if cuda is not None:
        devices = _select(devices, cuda)
    return devices


def visible_uuids(environ: Mapping[str, str] | None = None) -> list[str] | None:
    """The UUIDs of the GPUs a process sees as its CUDA devices 0, 1, ... (in that order),
    from its CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES (this process's environment unless
    environ is given, e.g. another process's from /proc/<pid>/environ); None where NVML is
    not available to say. CUDA orders devices fastest first unless CUDA_DEVICE_ORDER is
    PCI_BUS_ID; on a machine of identical GPUs both are NVML's (PCI bus) order."""
    try:
        return nvml().visible_uuids(environ)
    except NvmlError:
        return None

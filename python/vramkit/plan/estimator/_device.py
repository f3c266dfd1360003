"""What the estimator reads of the device it measures transient blocks on, and how it keeps
what it measured: the statistics of the allocator PyTorch allocates through (PyTorch's own,
or vramkit's under its pluggable fallback), the identity of the device that a kept
measurement holds for, and the file it is kept in. Shared by the convolution workspaces
(workspaces.py) and the other ops' scratch buffers (scratch.py).
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import tempfile

__all__ = ["allocator_reader", "cache_path", "device_identity", "write_json_atomic"]


class _TorchReader:
    """PyTorch's allocator statistics: its caching allocator's, or vramkit's complete
    backend's, which reports through the same functions."""

    def allocated(self, device) -> int:
        import torch
        return torch.cuda.memory_allocated(device)

    def reset_peak(self, device) -> None:
        import torch
        torch.cuda.reset_peak_memory_stats(device)

    def peak(self, device) -> int:
        import torch
        return torch.cuda.max_memory_allocated(device)

    def reserved(self, device) -> int:
        import torch
        return torch.cuda.memory_reserved(device)

    def empty_cache(self, device) -> None:
        import torch
        torch.cuda.empty_cache()

    def available(self, device) -> int:
        """What an allocation could still get: the device's free memory, and what the
        allocator holds cached but unused."""
        import torch
        free, _total = torch.cuda.mem_get_info(device)
        return free + max(0, self.reserved(device) - self.allocated(device))

    def observe(self, out) -> None:
        """Told each measured call's outputs (a reader without real figures uses them)."""

    def blocks_recorded(self, device):
        """A context that sees each block made inside it (_transients.blocks_recorded)."""
        from ._transients import blocks_recorded
        return blocks_recorded(device)


class _VramkitReader(_TorchReader):
    """vramkit's own statistics, under vramkit.torch's CUDAPluggableAllocator fallback,
    where PyTorch's memory functions report nothing."""

    def allocated(self, device) -> int:
        import vramkit
        return vramkit.memory_allocated(device.index or 0)

    def reset_peak(self, device) -> None:
        import vramkit
        vramkit.reset_peak_memory_stats(device.index or 0)

    def peak(self, device) -> int:
        import vramkit
        return vramkit.max_memory_allocated(device.index or 0)

    def reserved(self, device) -> int:
        import vramkit
        return vramkit.memory_reserved(device.index or 0)

    def empty_cache(self, device) -> None:
        import vramkit
        vramkit.empty_cache(device.index or 0)

    def blocks_recorded(self, device):
        """None: PyTorch's history does not reach a pluggable allocator (bytes only)."""
        import contextlib
        return contextlib.nullcontext(None)


def allocator_reader():
    """The statistics of whichever allocator PyTorch allocates CUDA memory through."""
    hooks = sys.modules.get("vramkit.plug.torch")
    if hooks is not None and hooks.installed() and hooks.backend() == "pluggable":
        return _VramkitReader()
    return _TorchReader()


def device_identity(device) -> dict:
    """What a measurement holds for: the device's name, PyTorch's and cuDNN's versions."""
    import torch
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return {"device": name, "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version()}


def cache_path(identity: dict, folder: str = "cudnn-workspaces") -> str:
    """Where the measurements on one kind of device are kept: $VRAMKIT_CACHE_DIR, else
    $XDG_CACHE_HOME/vramkit, else ~/.cache/vramkit, then <folder>/<identity>.json (the
    convolutions' in cudnn-workspaces, the other ops' scratch buffers in op-scratch), the
    identity naming the version of the sequences kept (_transients.SEQUENCE_VERSION)."""
    from ...plug._torch_build import cache_dir
    from ._transients import SEQUENCE_VERSION
    name = (f"{identity['device']}-torch{identity['torch']}-cudnn{identity['cudnn']}"
            f"-blocks{SEQUENCE_VERSION}")
    return os.path.join(cache_dir(), folder,
                        re.sub(r"[^A-Za-z0-9._+-]+", "_", name) + ".json")


def write_json_atomic(path: str, data) -> None:
    """Write ``data`` as JSON to ``path`` in one step: a scratch file in the same folder,
    then renamed over it, so that a reader (another estimate, at the same time) never
    sees half a file. A file written over keeps its permissions (a table others read
    stays readable); a new one is the owner's alone, as a cache is."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, scratch = tempfile.mkstemp(prefix=".workspaces-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        try:
            os.chmod(scratch, stat.S_IMODE(os.stat(path).st_mode))
        except FileNotFoundError:
            pass
        os.replace(scratch, path)
    except BaseException:
        if os.path.exists(scratch):
            os.unlink(scratch)
        raise

"""vramkit.plug.torch_settings: PyTorch's allocator settings under vramkit's backend.

PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) and torch.cuda.memory._set_allocator_settings()
configure PyTorch's caching allocator, which vramkit replaces: each key is honoured, mapped
to vramkit's equivalent, or refused or warned about with a message naming the equivalent.
None is dropped silently. vramkit.torch.install() reads the variable (map_settings) and
routes later calls through settings_hook.
"""

from __future__ import annotations

import os
import warnings

from .._core import ConfigError
from .._shown import shown

# Keys PyTorch itself still serves under vramkit: its pinned host allocator is not replaced.
_HOST_KEYS = ("pinned_use_cuda_host_register", "pinned_num_register_threads",
              "pinned_use_background_threads", "pinned_reserve_segment_size_mb",
              "pinned_use_host_register")

# Keys with no vramkit equivalent: what vramkit does instead, named in the warning.
_NO_EQUIVALENT = {
    "max_split_size_mb": "vramkit splits blocks of any size and keeps fragmentation down by "
                         "placement instead: tight_threshold (VRAMKIT_TIGHT_THRESHOLD) places "
                         "large blocks tightly, large_blocks='virtual' maps them",
    "max_non_split_rounding_mb": "vramkit rounds every request to 512 bytes and never hands "
                                 "out a larger block whole",
    "roundup_power2_divisions": "vramkit rounds every request to 512 bytes; there are no "
                                "power-of-two size classes to divide",
    "garbage_collection_threshold": "vramkit keeps cached memory under release_threshold "
                                    "(VRAMKIT_RELEASE_THRESHOLD) instead",
    "release_lock_on_cudamalloc": "vramkit's engine already calls the driver outside its "
                                  "hot path; there is no lock to release",
}


# The fraction as PyTorch was given it, which get_per_process_memory_fraction() answers:
# not a vramkit.configure() option, install() takes it out.
TORCH_FRACTION = "torch_memory_fraction"
# graph_capture_record_stream_reuse, True or False: the complete backend's switch, which
# install() and later settings calls hand to it (not a vramkit.configure() option either).
TORCH_CAPTURE_REUSE = "graph_capture_record_stream_reuse"


class SettingsError(ConfigError):
    """A setting vramkit cannot serve at all (backend:cudaMallocAsync), or a value PyTorch
    itself would refuse (expandable_segments:yes, per_process_memory_fraction:2)."""


def _pairs(conf: str, where: str):
    """The key:value items of a settings string, split as PyTorch splits it: at commas
    outside brackets (roundup_power2_divisions:[256:1,512:2,>:4] is one item), with
    whitespace ignored. A bracket left open or closed twice is refused: the rest of the
    string would otherwise vanish into one value."""
    item, depth = [], 0
    for char in conf + ",":
        if char == "," and depth == 0:
            key, _, value = "".join(item).partition(":")
            if key or value:
                yield key, value
            item = []
            continue
        if char == "]" and depth == 0:
            raise SettingsError(f"{where}: {shown(''.join(item))}]: a ']' without its '['")
        depth += (char == "[") - (char == "]")
        if not char.isspace():
            item.append(char)
    if depth:
        raise SettingsError(f"{where}: {shown(''.join(item)[:-1])}: a '[' without its ']'")


def _warn(message: str) -> None:
    warnings.warn(f"vramkit.torch: {message}", RuntimeWarning, stacklevel=3)


def _refuse(where: str, key: str, value: str, why: str) -> SettingsError:
    return SettingsError(f"{where}: {shown(key)}:{shown(value)}: {why}")


def _check_no_equivalent(where: str, key: str, value: str) -> None:
    """Refuse a value PyTorch would refuse for a key vramkit only warns about: a size in
    MiB (ASCII digits), a threshold strictly between 0 and 1, a True or False switch.
    roundup_power2_divisions, with its list forms, is left to the warning."""
    if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
        if not (value.isascii() and value.isdigit()):
            raise _refuse(where, key, value, "expected a size in MiB, as 512")
    elif key == "garbage_collection_threshold":
        try:
            threshold = float(value) if value.isascii() else float("nan")
        except ValueError:
            threshold = float("nan")
        if not 0.0 < threshold < 1.0:  # NaN fails both
            raise _refuse(where, key, value, "expected a share strictly between 0 and 1")
    elif key == "release_lock_on_cudamalloc" and value not in ("True", "False"):
        raise _refuse(where, key, value, "expected True or False")


def _fraction(where: str, value: str) -> float:
    """per_process_memory_fraction's value: a share of the device from 0 to 1, as PyTorch
    takes it (0: nothing may be allocated). Refused in PyTorch's words otherwise."""
    try:
        fraction = float(value)
    except ValueError:
        fraction = float("nan")
    if not 0.0 <= fraction <= 1.0:  # NaN fails both
        raise _refuse(where, "per_process_memory_fraction", value,
                      "per_process_memory_fraction is invalid: expected a share of the "
                      "device from 0 to 1, as 0.5")
    return fraction


def map_settings(conf: str, where: str = "PYTORCH_CUDA_ALLOC_CONF") -> dict:
    """vramkit.configure() options for PyTorch's settings string `conf`; warns for every key
    with no equivalent, raises SettingsError (a vramkit.ConfigError) for one that cannot run
    under vramkit or a value PyTorch would refuse. What the string says is shown escaped."""
    options: dict = {}
    for key, value in _pairs(conf, where):
        if key == "backend":
            if value == "cudaMallocAsync":
                raise _refuse(where, key, value,
                              "asks for another allocator than PyTorch's native one, which "
                              "vramkit replaces; drop it (or do not install vramkit)")
            if value != "native":
                raise _refuse(where, key, value, "expected native or cudaMallocAsync")
        elif key == "expandable_segments":
            # PyTorch's expandable segments are vramkit's virtual large blocks; PyTorch
            # takes the two words alone, so vramkit does too.
            if value not in ("True", "False"):
                raise _refuse(where, key, value, "expected True or False")
            options["large_blocks"] = "virtual" if value == "True" else "fixed"
        elif key == "per_process_memory_fraction":
            fraction = _fraction(where, value)
            # A limit of 0 reads as "none" to vramkit: one byte is PyTorch's "nothing".
            options["limit"] = fraction if fraction > 0 else 1
            options[TORCH_FRACTION] = fraction
        elif key == TORCH_CAPTURE_REUSE:
            # A block used on another stream and freed during a CUDA graph's capture is
            # reused in the capture once the graph orders those uses (the backend checks).
            if value not in ("True", "False"):
                raise _refuse(where, key, value, "expected True or False")
            options[TORCH_CAPTURE_REUSE] = value == "True"
        elif key in _HOST_KEYS:
            continue  # PyTorch's host allocator serves it, as without vramkit
        elif key in _NO_EQUIVALENT:
            _check_no_equivalent(where, key, value)
            _warn(f"{where}: {key}:{shown(value)} has no effect under vramkit: "
                  f"{_NO_EQUIVALENT[key]}")
        else:
            _warn(f"{where}: {shown(key)}:{shown(value)} is not a setting vramkit knows; "
                  f"it has no effect")
    return options


def from_environment(pytorch_parser=None) -> dict:
    """map_settings() of the variable PyTorch reads (the CUDA one first, as PyTorch does).
    ``pytorch_parser(conf)``, when given, is PyTorch's own parser of settings: it sees the
    string first, so that what PyTorch refuses (a key mistyped, "expandable_segment:True")
    raises PyTorch's own error, as PyTorch's allocator would at its first allocation,
    rather than a warning of vramkit's that the key has no effect."""
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        conf = os.environ.get(name)
        if conf:
            if pytorch_parser is not None:
                pytorch_parser(conf)
            return map_settings(conf, name)
    return {}


def pytorch_parser_of(torch):
    """PyTorch's setter of allocator settings, which parses a settings string as its
    allocator does (the accelerator's, where this PyTorch has it, without the CUDA one's
    deprecation warning); None where this PyTorch has neither."""
    return (getattr(torch._C, "_accelerator_setAllocatorSettings", None)
            or getattr(torch.cuda.memory, "_set_allocator_settings", None))


def settings_hook(original, capture_reuse=None):
    """A stand-in for torch's setter of allocator settings, installed once vramkit is the
    allocator: PyTorch still records the settings (its host allocator reads them), and
    vramkit says what they do under it. Its pools are configured already, so keys that map
    to a vramkit option are refused with the option's name rather than half applied;
    graph_capture_record_stream_reuse, a switch of the backend's, is handed to
    ``capture_reuse(on)`` at once."""

    def set_allocator_settings(conf: str):
        where = "torch.cuda.memory._set_allocator_settings"
        # PyTorch's own parser first: a value it refuses raises PyTorch's own error, as
        # without vramkit, before vramkit says anything about the string.
        result = original(conf)
        options = map_settings(conf, where)
        options.pop(TORCH_FRACTION, None)  # said by its limit
        reuse = options.pop(TORCH_CAPTURE_REUSE, None)
        if reuse is not None and capture_reuse is not None:
            capture_reuse(reuse)
        for key, value in options.items():
            _warn(f"{where}: takes effect only before the first CUDA allocation under vramkit; "
                  f"pass {key}={value!r} to vramkit.torch.install() (or set the matching "
                  f"VRAMKIT_ variable) instead")
        return result

    set_allocator_settings.__wrapped__ = original
    return set_allocator_settings

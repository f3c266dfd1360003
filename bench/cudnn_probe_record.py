"""The record path of bench/cudnn_workspace_probe.py: reading PyTorch's allocator around
each ATen op (on the GPU, or with made-up figures for --dry-run), its memory history cut
into one window per op, the signature of a convolution as
vramkit.estimator.workspaces.ConvSignature holds it, and the dispatch mode that runs a
real step through all of them (StepProbe). The probe's workloads, sweep and summary stay
in cudnn_workspace_probe.py, which imports this module from its own folder.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

try:  # the estimator's scratch model: its signatures and its measuring code
    from vramkit.estimator import scratch as op_scratch
except ImportError:  # vramkit not installed: the convolutions only
    op_scratch = None

PARTS = ("forward", "backward_input", "backward_weight", "backward_bias")
# Requests of these odd byte counts mark where an op begins and ends in the allocator's
# memory history: no tensor of the steps asks for them (their sizes are whole elements).
MARK_START, MARK_END = 333, 337


# ---------------------------------------------------------------------------------------
# Reading the allocator.
# ---------------------------------------------------------------------------------------

class CudaReader:
    """PyTorch's allocator statistics on one device."""

    def __init__(self, device):
        self.device = device

    def allocated(self):
        return torch.cuda.memory_allocated(self.device)

    def reset_peak(self):
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self):
        return torch.cuda.max_memory_allocated(self.device)

    def reserved(self):
        return torch.cuda.memory_reserved(self.device)

    def observe(self, out, kind):
        """Told each op's outputs, and "conv", "scratch" or None for what the op is; the
        real allocator needs nothing of them."""


class DryReader:
    """Made-up figures for --dry-run on a CPU: each op's outputs count their bytes, a
    convolution 'uses' a workspace of a quarter of its outputs and a scratch op one of an
    eighth, written to a fake memory history as the real allocator would write it, so that
    every path of the record code runs on figures of the right shape."""

    def __init__(self, trace):
        self.trace = trace
        self.level = 0
        self.top = 0
        self.address = 1 << 40

    def allocated(self):
        return self.level

    def reset_peak(self):
        self.top = self.level

    def peak(self):
        return self.top

    def reserved(self):
        return self.level

    def _block(self, size):
        self.address += 1 << 30
        self.trace.append({"action": "alloc", "addr": self.address, "size": size})
        return self.address

    def observe(self, out, kind):
        sizes = [t.untyped_storage().nbytes() for t in tree_leaves(out)
                 if isinstance(t, torch.Tensor)]
        for size in sizes:
            self._block(size)
        self.level += sum(-(-s // 512) * 512 for s in sizes)
        self.top = max(self.top, self.level)
        if kind in ("conv", "scratch") and sizes:
            share = 4 if kind == "conv" else 8
            workspace = max(512, -(-sum(sizes) // share // 512) * 512)
            address = self._block(workspace)
            self.top = max(self.top, self.level + workspace)
            for action in ("free_requested", "free_completed"):
                self.trace.append({"action": action, "addr": address, "size": workspace})


class History:
    """The allocator's memory history (torch.cuda.memory._record_memory_history, without
    stack traces), split into the windows between a start and an end mark."""

    def __init__(self, device, enabled=True):
        self.device = device
        self.enabled = enabled
        self.marks = 0
        self.error = None

    def start(self):
        self.marks = 0
        if not self.enabled:
            return
        try:
            torch.cuda.memory._record_memory_history(
                enabled="all", context=None, stacks="python", max_entries=4_000_000,
                clear_history=True, device=self.device)
        except Exception as error:  # noqa: BLE001 - the probe goes on without it
            self.enabled, self.error = False, f"{type(error).__name__}: {error}"

    def _mark(self, size):
        if self.enabled:  # made and freed at once: an alloc and a free in the history
            torch.empty(size, dtype=torch.uint8, device=self.device)

    def mark_start(self) -> int | None:
        if not self.enabled:
            return None
        self._mark(MARK_START)
        self.marks += 1
        return self.marks - 1

    def mark_end(self):
        self._mark(MARK_END)

    def entries(self):
        snapshot = torch.cuda.memory._snapshot(self.device)
        return snapshot["device_traces"][self.device.index or 0]

    def windows(self) -> list:
        if not self.enabled:
            return []
        windows = split_windows(self.entries())
        torch.cuda.memory._record_memory_history(enabled=None, device=self.device)
        return windows


class DryHistory(History):
    """--dry-run's memory history: the list DryReader writes, marks added to it."""

    def __init__(self, trace):
        super().__init__(torch.device("cpu"))
        self.trace = trace
        self.address = 1

    def start(self):
        self.marks = 0
        self.trace.clear()

    def _mark(self, size):
        self.address += 2
        for action in ("alloc", "free_requested", "free_completed"):
            self.trace.append({"action": action, "addr": self.address, "size": size})

    def entries(self):
        return list(self.trace)

    def windows(self):
        return split_windows(self.entries())


def split_windows(entries) -> list:
    """The trace entries between each start and end mark, as the blocks the op made: the
    events in order (["a", id, size], ["f", id, size]; "f" with id None frees a block
    from before the op; segment_* and oom entries as [action, None, size]), the sizes of
    the blocks made and freed inside it (transient: the workspaces), made and kept (the
    outputs), and freed from before."""
    windows, current = [], None
    markers = {}   # address -> the frees of a marker still to come
    for entry in entries:
        action, address, size = entry.get("action"), entry.get("addr"), entry.get("size")
        if action == "alloc" and size in (MARK_START, MARK_END):
            markers[address] = 2
            if size == MARK_START:
                current = {"events": [], "open": {}, "transient": [], "freed_from_before": []}
            elif current is not None:
                windows.append({"events": current["events"], "transient": current["transient"],
                                "kept": [s for _, s in current["open"].values()],
                                "freed_from_before": current["freed_from_before"]})
                current = None
            continue
        if address in markers:
            if action in ("free_requested", "free_completed"):
                markers[address] -= 1
                if markers[address] == 0:
                    del markers[address]
                continue
            del markers[address]  # the address serves a real block now
        if current is None:
            continue
        if action == "alloc":
            ident = len(current["events"])
            current["open"][address] = (ident, size)
            current["events"].append(["a", ident, size])
        elif action == "free_requested":
            if address in current["open"]:
                ident, size = current["open"].pop(address)
                current["events"].append(["f", ident, size])
                current["transient"].append(size)
            else:
                current["events"].append(["f", None, size])
                current["freed_from_before"].append(size)
        elif action in ("segment_alloc", "segment_free", "segment_map", "segment_unmap",
                        "oom"):
            current["events"].append([action, None, size])
    return windows


# ---------------------------------------------------------------------------------------
# Signatures: the fields vramkit.estimator.workspaces.ConvSignature is made of.
# ---------------------------------------------------------------------------------------

def _conv_kinds():
    aten = torch.ops.aten
    return {aten.convolution.default: "forward", aten._convolution.default: "forward",
            aten.convolution_backward.default: "backward"}


_KINDS = None


def _bound(func, args, kwargs):
    bound = {a.name: v for a, v in zip(func._schema.arguments, args)}
    bound.update(kwargs)
    for a in func._schema.arguments:
        if a.name not in bound and a.has_default_value():
            bound[a.name] = a.default_value
    return bound


def _expand(values, dims):
    values = [int(v) for v in (values if isinstance(values, (list, tuple)) else [values])]
    return values * dims if len(values) == 1 else values


def _layout(x, w):
    for t in (x, w):
        if t.is_contiguous():
            continue
        if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
            return "channels_last"
        if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
            return "channels_last_3d"
    return "contiguous" if x.is_contiguous() and w.is_contiguous() else "strided"


def cudnn_flags():
    cudnn = torch.backends.cudnn
    return {"benchmark": bool(cudnn.benchmark),
            "deterministic": bool(cudnn.deterministic
                                  or torch.are_deterministic_algorithms_enabled()),
            "tf32": bool(cudnn.allow_tf32), "cudnn": bool(cudnn.enabled)}


def conv_signature(func, args, kwargs):
    """(fields, parts) of a dispatched convolution op, None for any other op. The fields
    are those of vramkit.estimator.workspaces.signatures_of_call, less the part."""
    global _KINDS
    if _KINDS is None:
        _KINDS = _conv_kinds()
    kind = _KINDS.get(func)
    if kind is None:
        return None
    bound = _bound(func, args, kwargs)
    x, w = bound["input"], bound["weight"]
    if x.dim() != w.dim() or x.shape[0] == 0:
        return None
    dims = w.dim() - 2
    transposed = bool(bound["transposed"])
    if "cudnn_enabled" in bound:
        flags = {"benchmark": bool(bound["benchmark"]),
                 "deterministic": bool(bound["deterministic"]),
                 "tf32": bool(bound["allow_tf32"]), "cudnn": bool(bound["cudnn_enabled"])}
    else:
        flags = cudnn_flags()
    fields = {"batch": int(x.shape[0]), "input": [int(v) for v in x.shape[1:]],
              "weight": [int(v) for v in w.shape],
              "stride": _expand(bound["stride"], dims),
              "padding": _expand(bound["padding"], dims),
              "dilation": _expand(bound["dilation"], dims), "transposed": transposed,
              "output_padding": _expand(bound["output_padding"], dims) if transposed
              else [0] * dims,
              "groups": int(bound["groups"]), "dtype": str(x.dtype).replace("torch.", ""),
              "layout": _layout(x, w), **flags}
    if kind == "forward":
        return fields, ["forward"]
    mask = [bool(m) for m in bound["output_mask"]]
    fields["output_mask"] = mask
    return fields, [p for p, m in zip(PARTS[1:], mask) if m]


def output_of(fields):
    """One sample's output shape (channels, spatial sizes) of a signature."""
    kernel = fields["weight"][2:]
    spatial = []
    for i, size in enumerate(fields["input"][1:]):
        s, p, d, k = (fields["stride"][i], fields["padding"][i], fields["dilation"][i],
                      kernel[i])
        if fields["transposed"]:
            spatial.append((size - 1) * s - 2 * p + d * (k - 1)
                           + fields["output_padding"][i] + 1)
        else:
            spatial.append((size + 2 * p - d * (k - 1) - 1) // s + 1)
    channels = (fields["weight"][1] * fields["groups"] if fields["transposed"]
                else fields["weight"][0])
    return [channels, *spatial]


# ---------------------------------------------------------------------------------------
# The in-step records.
# ---------------------------------------------------------------------------------------

class StepProbe(TorchDispatchMode):
    """Reads the allocator around every op of a real step; keeps the convolutions and the
    estimator's scratch ops (with the template of each scratch signature, to measure it on
    its own afterwards)."""

    def __init__(self, reader, history, workload, device_type="cuda"):
        super().__init__()
        self.reader = reader
        self.history = history
        self.workload = workload
        self.device_type = device_type
        self.step = 0
        self.phase = "forward"
        self.index = 0
        self.records = []
        self.scratch_records = []
        self.scratch_calls = {}   # key -> vramkit.estimator.scratch.OpCall
        self.other = {}
        self.step_peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        signature = conv_signature(func, args, kwargs)
        call = None
        if signature is None and op_scratch is not None:
            call = op_scratch.call_of(func, args, kwargs, self.device_type)
        kind = "conv" if signature else "scratch" if call is not None else None
        window = self.history.mark_start() if kind else None
        before = self.reader.allocated()
        self.reader.reset_peak()
        out = func(*args, **kwargs)
        self.reader.observe(out, kind)
        peak, after = self.reader.peak(), self.reader.allocated()
        if kind:
            self.history.mark_end()
        self.step_peak = max(self.step_peak, peak)
        excess = max(0, peak - max(before, after))
        phase = "backward" if torch._C._current_graph_task_id() != -1 else self.phase
        name = getattr(func, "__name__", str(func))
        if signature:
            fields, parts = signature
            self.records.append({"workload": self.workload, "step": self.step,
                                 "phase": phase, "index": self.index, "op": name,
                                 "signature": fields, "parts": parts, "before": before,
                                 "peak": peak, "after": after, "excess": excess,
                                 "window": window})
        elif call is not None:
            self.scratch_calls.setdefault(call.key, call)
            self.scratch_records.append({"workload": self.workload, "step": self.step,
                                         "phase": phase, "index": self.index, "op": name,
                                         "key": call.key, "before": before, "peak": peak,
                                         "after": after, "excess": excess,
                                         "window": window})
        elif excess:
            entry = self.other.setdefault(name, {"count": 0, "total_excess": 0,
                                                 "max_excess": 0, "shapes_at_max": None})
            entry["count"] += 1
            entry["total_excess"] += excess
            if excess > entry["max_excess"]:
                entry["max_excess"] = excess
                entry["shapes_at_max"] = [list(a.shape) for a in tree_leaves(args)
                                          if isinstance(a, torch.Tensor)][:4]
        self.index += 1
        return out

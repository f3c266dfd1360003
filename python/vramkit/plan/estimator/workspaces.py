"""cuDNN's convolution workspaces: the blocks inside a convolution that fake tensors never see.

PyTorch's cuDNN convolutions (forward, backward data, backward weight) each ask PyTorch's
caching allocator for a workspace inside the call and free it before they return. Under
fake tensors no kernel runs, so a recorded step has no such block; in the real step these
transient blocks raise the peak where they sit and split PyTorch's cached segments (on an
H200, PyTorch 2.11, ResNet-50's peak reserved was predicted 6.6% to 9% low without them).

Each convolution op of the recorded step gets, per part it computes (forward; backward
input, weight, bias), the blocks a measurement saw, each where the part made it beside
its output, or the table's bytes as one block after the op's outputs, freed at once. A
part's size is found by its signature (:class:`ConvSignature`: the part, shapes, stride,
padding, dilation, groups,
dtype, memory layout and cuDNN flags), in this order:

1. on a machine with the GPU: measured there, once per signature, by running that part on
   real tensors of the same shapes (:func:`measure_on_device`, through
   :func:`measure_transient`, the measuring path the other ops' scratch buffers of
   scratch.py share); kept for the process and on disk (:func:`cache_path`, per device
   name, PyTorch version and cuDNN version);
2. without one, or where the device lacks the memory to run the part: the table shipped
   with the package (``data/cudnn_workspaces.json``, the measurements of
   ``bench/cudnn_workspace_probe.py`` on an H200, and on an H100 where the H200 measured
   none), by :meth:`Table.lookup`: the exact signature, else the same layer measured at
   other batch sizes, scaled to this batch, else the median of the three nearest
   layers of its kind, else the table's size rule, fitted to all its measurements;
3. else 0, and the estimate's notes say convolution workspaces were not modelled.

The table is filled from the probe's output by :mod:`vramkit.estimator.workspace_table`
(``python -m vramkit.estimator.workspace_table import PROBE.json``), which also shows it.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import warnings
from collections import Counter, defaultdict
from dataclasses import replace

from ._conv_signature import PARTS, ConvSignature
from ._device import allocator_reader, cache_path, device_identity, write_json_atomic
from ._transients import as_transient, is_transient, transient_bytes

TABLE_FORMAT = "vramkit-cudnn-workspaces/1"
PROBE_FORMAT = "vramkit-cudnn-workspace-probe/1"
TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                          "cudnn_workspaces.json")
LABEL = "cuDNN workspace"

# How a workspace grows with the batch where the table has one batch size of a layer and
# no layer measured at two to fit the exponent from: in proportion, as the workspaces of
# cuDNN's layout transforms and GEMM-based algorithms, which cover the whole batch, do.
ASSUMED_BATCH_EXPONENT = 1.0

# A layer the table lacks takes the median of its nearest measured layers of its kind:
# cuDNN's choice moves one layer's workspace by orders of magnitude between neighbours,
# and one neighbour alone lets a single new measurement swing a step's figure.
NEAREST_LAYERS = 3


class WorkspaceTableError(ValueError):
    """A workspace table, or a probe's output to import, that cannot be read as one."""


_CONV_OPS = None


def _conv_ops() -> dict:
    """The ATen ops a convolution reaches the dispatch modes as, and their kind."""
    global _CONV_OPS
    if _CONV_OPS is None:
        import torch
        aten = torch.ops.aten
        _CONV_OPS = {aten.convolution.default: "forward",
                     aten._convolution.default: "forward",
                     aten.convolution_backward.default: "backward"}
    return _CONV_OPS


def _bound(func, args, kwargs) -> dict:
    """The op's arguments by name, defaults filled in."""
    bound = {}
    schema = func._schema.arguments
    for argument, value in zip(schema, args):
        bound[argument.name] = value
    bound.update(kwargs or {})
    for argument in schema:
        if argument.name not in bound and argument.has_default_value():
            bound[argument.name] = argument.default_value
    return bound


def _expand(values, dims: int) -> tuple:
    values = [int(v) for v in (values if isinstance(values, (list, tuple)) else [values])]
    return tuple(values * dims) if len(values) == 1 else tuple(values)


def _layout(x, w) -> str:
    """The memory layout cuDNN runs in: channels-last when the input or the weight is (as
    PyTorch's cudnn_conv_suggest_memory_format decides)."""
    import torch
    for t in (x, w):
        if t.is_contiguous():
            continue
        if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
            return "channels_last"
        if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
            return "channels_last_3d"
    return "contiguous" if x.is_contiguous() and w.is_contiguous() else "strided"


def _flags(bound: dict) -> dict:
    import torch
    if "cudnn_enabled" in bound:  # aten._convolution carries its own
        return dict(benchmark=bool(bound["benchmark"]),
                    deterministic=bool(bound["deterministic"]),
                    tf32=bool(bound["allow_tf32"]), cudnn=bool(bound["cudnn_enabled"]))
    cudnn = torch.backends.cudnn
    return dict(benchmark=bool(cudnn.benchmark),
                deterministic=bool(cudnn.deterministic
                                   or torch.are_deterministic_algorithms_enabled()),
                tf32=bool(cudnn.allow_tf32), cudnn=bool(cudnn.enabled))


def signatures_of_call(func, args, kwargs, device_type: str | None = None) -> list:
    """The signatures of the parts one dispatched op computes, in the order it computes
    them; empty for an op that is no convolution (or whose input is not on device_type)."""
    kind = _conv_ops().get(func)
    if kind is None:
        return []
    import torch
    bound = _bound(func, args, kwargs)
    x, w = bound.get("input"), bound.get("weight")
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor) \
            or x.dim() != w.dim() or x.dim() < 3 or x.shape[0] == 0:
        return []
    if device_type is not None and x.device.type != device_type:
        return []
    spatial = w.dim() - 2
    transposed = bool(bound["transposed"])
    fields = dict(batch=int(x.shape[0]), input=[int(v) for v in x.shape[1:]],
                  weight=[int(v) for v in w.shape],
                  stride=list(_expand(bound["stride"], spatial)),
                  padding=list(_expand(bound["padding"], spatial)),
                  dilation=list(_expand(bound["dilation"], spatial)),
                  transposed=transposed,
                  output_padding=list(_expand(bound["output_padding"], spatial))
                  if transposed else [0] * spatial,
                  groups=int(bound["groups"]), dtype=str(x.dtype).replace("torch.", ""),
                  layout=_layout(x, w), **_flags(bound))
    if kind == "forward":
        parts = ["forward"]
    else:
        parts = [p for p, wanted in zip(PARTS[1:], bound["output_mask"]) if wanted]
    try:
        return [ConvSignature.from_fields(dict(fields, part=p)) for p in parts]
    except ValueError:
        return []  # a shape no kernel runs (an empty output): nothing to model


# ---------------------------------------------------------------------------------------
# The table.
# ---------------------------------------------------------------------------------------

def _table_error(path: str, problem: str) -> WorkspaceTableError:
    error = WorkspaceTableError(
        f"{path}: not a usable cuDNN workspace table ({problem}). The estimator reads it "
        f"to model convolution workspaces without a GPU: reinstall vramkit to restore the "
        f"shipped table, rebuild it with `python -m vramkit.estimator.workspace_table import "
        f"PROBE.json --table {path} --replace`, or estimate with model_workspaces=\"cublas\" "
        f"(or False) to leave convolution workspaces out.")
    error.problem = problem
    return error


class Table:
    """Measured workspace sizes by signature key, and the rule fitted to them."""

    def __init__(self, entries: dict, rule: dict | None = None,
                 measured_on: dict | None = None, path: str | None = None):
        self.entries = dict(entries)
        self.rule = dict(rule or {})
        self.measured_on = measured_on
        self.path = path
        self._layers: dict = defaultdict(list)
        for key, size in self.entries.items():
            signature = ConvSignature.from_key(key)
            self._layers[signature.layer()].append((signature.batch, transient_bytes(size)))
        for points in self._layers.values():
            points.sort()
        # The measured layers by kind (Table._nearest), each with where it sits.
        self._kinds: dict = defaultdict(list)
        for layer in self._layers:
            self._kinds[layer.kind()].append((layer.position(), layer))

    @classmethod
    def load(cls, path: str) -> "Table":
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            raise _table_error(path, "the file is missing") from None
        except (OSError, UnicodeDecodeError) as error:
            raise _table_error(path, f"unreadable: {error}") from None
        except json.JSONDecodeError as error:
            raise _table_error(path, f"not JSON: {error}") from None
        return cls.from_json(data, path)

    @classmethod
    def from_json(cls, data, path: str = "<table>") -> "Table":
        if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise _table_error(path, f"format {found!r}, expected {TABLE_FORMAT!r}")
        entries = data.get("entries")
        if not isinstance(entries, dict):
            raise _table_error(path, "'entries' must be an object of key: bytes")
        for key, size in entries.items():
            if not is_transient(size):  # bytes, or a measured sequence of blocks
                raise _table_error(path, f"entry {key!r}: {size!r} is not a size in bytes")
            try:
                ConvSignature.from_key(key)
            except ValueError as error:
                raise _table_error(path, f"entry {key!r}: {error}") from None
        rule = data.get("rule", {})
        if not isinstance(rule, dict):
            raise _table_error(path, "'rule' must be an object")
        for name, allowed in (("batch_exponent", set(PARTS)),
                              ("workspace_per_activation_byte", None)):
            values = rule.get(name, {})
            if not isinstance(values, dict) or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool)
                    and math.isfinite(v) and v >= 0 for v in values.values()):
                raise _table_error(path, f"rule {name!r} must map names to numbers >= 0")
            if allowed is not None and not set(values) <= allowed:
                raise _table_error(path, f"rule {name!r} names parts not in "
                                         f"{', '.join(PARTS)}")
        measured_on = data.get("measured_on")
        if measured_on is not None and not isinstance(measured_on, dict):
            raise _table_error(path, "'measured_on' must be an object or null")
        return cls({k: as_transient(v) for k, v in entries.items()}, rule, measured_on, path)

    def to_json(self) -> dict:
        return {"format": TABLE_FORMAT,
                "about": "cuDNN convolution workspace sizes in bytes by signature "
                         "(vramkit.estimator.workspaces.ConvSignature.key), measured by "
                         "bench/cudnn_workspace_probe.py; `python -m "
                         "vramkit.estimator.workspace_table import PROBE.json --table FILE` "
                         "fills it and fits the rule.",
                "measured_on": self.measured_on,
                "entries": dict(sorted(self.entries.items())),
                "rule": self.rule}

    def save(self, path: str) -> None:
        """Write the table in one step (a reader never sees half a file)."""
        write_json_atomic(path, self.to_json())

    def describe_source(self) -> str:
        on = self.measured_on or {}
        if not on.get("device"):
            return "an unnamed device"
        devices = [on] + [a for a in on.get("also", ()) if isinstance(a, dict)]
        named = (f"{d.get('device', '?')} (PyTorch {d.get('torch', '?')}, "
                 f"cuDNN {d.get('cudnn', '?')})" for d in devices)
        return " and ".join(dict.fromkeys(named))  # each setup once, in the table's order

    def batch_exponent(self, part: str) -> float:
        return float(self.rule.get("batch_exponent", {}).get(part, ASSUMED_BATCH_EXPONENT))

    def lookup(self, signature: ConvSignature) -> tuple:
        """(bytes, how) for a signature: how is "exact" (measured), "batch" (the layer
        measured at other batch sizes: interpolated between the nearest two along the
        power law through them, or beyond them scaled by batch ** the table's fitted
        exponent), "nearest" (the median of the nearest measured layers of the same
        kind, each scaled by bytes of input and output: :meth:`_nearest`), "size" (the
        size rule: the median, over the table's signatures of the same part, dtype,
        layout and flags, of workspace bytes per byte of input and output, times this
        one's) or (None, None) when none of these applies."""
        key = signature.key()
        if key in self.entries:
            return self.entries[key], "exact"
        points = self._layers.get(signature.layer())
        if points:
            return self._scaled(signature, points), "batch"
        nearest = self._nearest(signature)
        if nearest is not None:
            return nearest, "nearest"
        ratio = self.rule.get("workspace_per_activation_byte", {}).get(signature.size_group())
        if ratio is not None:
            return int(round(ratio * signature.activation_bytes())), "size"
        return None, None

    def _nearest(self, signature: ConvSignature, excluding=None) -> int | None:
        """The median, over the NEAREST_LAYERS measured layers of the same kind (part,
        dtype, layout, flags, kernel, stride, padding, dilation, grouping) nearest in
        channels and pixels (on a log scale), of each one's workspace at its batch
        nearest this one's, times this signature's bytes of input and output over that
        one's. cuDNN picks among few algorithms for one kind of layer, and their
        workspaces follow the tensors they transform or tile; across kinds (a 1x1
        against a 3x3, channels-last against contiguous) they do not, so no other kind
        stands in. None where the table has no layer of this kind
        (``excluding``: a layer left out, to check the lookup on the table itself)."""
        candidates = [c for c in self._kinds.get(signature.kind(), ()) if c[1] != excluding]
        if not candidates:
            return None
        here = signature.position()
        nearest = sorted(candidates, key=lambda c: (
            sum(abs(a - b) for a, b in zip(c[0], here)), c[1].key()))[:NEAREST_LAYERS]
        sizes = []
        for _, layer in nearest:
            batch, size = min(self._layers[layer], key=lambda p: (
                abs(math.log(p[0] / signature.batch)), p[0]))
            measured = replace(layer, batch=batch)
            sizes.append(size * signature.activation_bytes() / measured.activation_bytes())
        return int(round(statistics.median(sizes)))

    def _scaled(self, signature: ConvSignature, points: list) -> int:
        n = signature.batch
        below = [p for p in points if p[0] < n]
        above = [p for p in points if p[0] > n]
        if below and above:
            (b1, s1), (b2, s2) = below[-1], above[0]
            if s1 > 0 and s2 > 0:
                exponent = math.log(s2 / s1) / math.log(b2 / b1)
                return int(round(s1 * (n / b1) ** exponent))
            return int(round(s1 + (s2 - s1) * (n - b1) / (b2 - b1)))
        b0, s0 = below[-1] if below else above[0]
        return int(round(s0 * (n / b0) ** self.batch_exponent(signature.part)))


def fit_rule(entries: dict) -> dict:
    """The rule Table.lookup falls back on, fitted to measured entries: per part, the
    median exponent of workspace against batch over layers measured at two batch sizes
    (clamped to [0, 2]); per size group, the median workspace per activation byte."""
    signatures = [(ConvSignature.from_key(k), v) for k, v in entries.items()]
    layers: dict = defaultdict(list)
    for signature, size in signatures:
        layers[signature.layer()].append((signature.batch, size))
    exponents: dict = defaultdict(list)
    for layer, points in layers.items():
        points.sort()
        for (b1, s1), (b2, s2) in zip(points, points[1:]):
            if s1 > 0 and s2 > 0 and b2 > b1:
                exponents[layer.part].append(math.log(s2 / s1) / math.log(b2 / b1))
    ratios: dict = defaultdict(list)
    for signature, size in signatures:
        ratios[signature.size_group()].append(size / signature.activation_bytes())
    rule: dict = {}
    if exponents:
        rule["batch_exponent"] = {part: round(min(2.0, max(0.0, statistics.median(v))), 4)
                                  for part, v in sorted(exponents.items())}
    if ratios:
        rule["workspace_per_activation_byte"] = {
            group: float(f"{statistics.median(v):.6g}") for group, v in sorted(ratios.items())}
    return rule


def empty_table(path: str | None = None) -> Table:
    return Table({}, {}, None, path)


# ---------------------------------------------------------------------------------------
# Measuring on the device.
# ---------------------------------------------------------------------------------------

def _runner(signature: ConvSignature, device):
    """A call of the signature's part on real (uninitialised) tensors of its shapes."""
    import torch
    dtype = getattr(torch, signature.dtype)
    memory_format = {"channels_last": torch.channels_last,
                     "channels_last_3d": torch.channels_last_3d}.get(signature.layout)
    dims = len(signature.weight)

    def make(shape):
        if memory_format is not None and len(shape) == dims:
            return torch.empty(shape, dtype=dtype, device=device, memory_format=memory_format)
        return torch.empty(shape, dtype=dtype, device=device)

    x = make((signature.batch, *signature.input))
    w = make(signature.weight)
    geometry = (list(signature.stride), list(signature.padding), list(signature.dilation),
                signature.transposed, list(signature.output_padding), signature.groups)
    aten = torch.ops.aten
    if signature.part == "forward":
        return lambda: aten.convolution.default(x, w, None, *geometry)
    grad_out = make((signature.batch, *signature.output()))
    mask = [signature.part == p for p in PARTS[1:]]
    bias_sizes = [signature.output()[0]] if signature.part == "backward_bias" else None
    return lambda: aten.convolution_backward.default(grad_out, x, w, bias_sizes, *geometry,
                                                     mask)


def measure_transient(make_call, device, reader=None, settings=None, blocks=False):
    """What one call allocates and frees inside itself, measured on the device: the bytes
    the allocator's peak during the call rises above what it holds before and after it,
    or with ``blocks``, where the allocator's history can be read, the transient sequence
    of the blocks it made (_transients.py).

    ``make_call()`` builds the call's real inputs (here, out of the recording: real
    tensors, not fake ones) and returns a function of no arguments that makes the call.
    The call runs once to let the libraries set themselves up (cuDNN chooses its
    algorithm, or times them all in benchmark mode; attention kernels build their plans),
    then again with the allocator's peak reset: that second call is measured, as a
    training loop's steady steps run it. ``settings`` is a context the calls run under
    (cuDNN's flags). None when the device lacks the memory; any other error of the call
    reaches the caller. It resets the device's peak statistics (reset_peak_memory_stats);
    everything it allocates is freed before it returns."""
    import contextlib

    import torch
    from torch.utils._python_dispatch import _disable_current_modes
    reader = reader or allocator_reader()
    with contextlib.ExitStack() as stack:
        # Out of the recording: no fake tensors, no recorder, no autocast, no autograd.
        stack.enter_context(_disable_current_modes())
        stack.enter_context(torch.no_grad())
        stack.enter_context(torch.autocast(device.type, enabled=False))
        # A call that draws random numbers (attention with dropout) would move the user's
        # generators on: their state is put back afterwards.
        stack.enter_context(torch.random.fork_rng(
            devices=[device] if device.type == "cuda" else [], device_type="cuda"))
        if settings is not None:
            stack.enter_context(settings)
        if device.type == "cuda":
            stack.enter_context(torch.cuda.device(device))
        try:
            run = make_call()
            first = run()
            del first
            before = reader.allocated(device)
            reader.reset_peak(device)
            watch = getattr(reader, "blocks_recorded", None) if blocks else None
            with watch(device) if watch else contextlib.nullcontext() as seen:
                out = run()
            reader.observe(out)
            peak = reader.peak(device)
            after = reader.allocated(device)
            del out, run
        except torch.OutOfMemoryError:
            return None
    if seen is not None and seen.steps is not None:
        return seen.steps
    return max(0, peak - max(before, after))


def measure_on_device(signature: ConvSignature, device, reader=None, blocks=False):
    """One convolution part's workspace, measured (:func:`measure_transient`): the part
    runs on real tensors of the signature's shapes under its cuDNN flags. None when the
    device lacks the memory."""
    import torch
    flags = torch.backends.cudnn.flags(
        enabled=signature.cudnn, benchmark=signature.benchmark,
        deterministic=signature.deterministic, allow_tf32=signature.tf32)
    return measure_transient(lambda: _runner(signature, device), device, reader, flags, blocks)


# Measurements made in this process, by cache file (the convolutions' and the other ops'
# each have their own): a search over batch sizes measures each signature once.
_MEASURED: dict = {}


def _read_cache(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    try:
        return Table.load(path).entries
    except WorkspaceTableError as error:
        warnings.warn(f"vramkit.estimate: {path}, the cache of measured cuDNN workspaces, "
                      f"is ignored and will be rewritten: {getattr(error, 'problem', error)}",
                      RuntimeWarning, stacklevel=3)
        return {}


# ---------------------------------------------------------------------------------------
# The models the recorder calls.
# ---------------------------------------------------------------------------------------

class DeviceMeasuredSizes:
    """What the two models of transient blocks share (convolutions' workspaces here,
    other ops' scratch in scratch.py): sizes by signature key, measured on ``device``
    once per kind of device and kept on disk in ``cache_folder``, how each size was found,
    and the allocator's cache given back after measuring. A subclass says how its cache
    file is read and written (_read_kept, _save_kept) and what it measures (_what)."""

    _what = "sizes"

    def __init__(self, device, device_type, reader, cache_folder: str):
        self.device = device
        self.device_type = device_type
        self._reader = reader
        self._cache_folder = cache_folder
        self._size: dict = {}          # key -> bytes, once found
        self._how: dict = {}           # key -> how it was found ("measured", "cached", ...)
        self._failed: dict = {}        # key -> why its measurement failed
        self._measured: dict | None = None
        self._identity: dict | None = None
        self._cache_file: str | None = None
        self._measured_new = False
        self._reserved_before: int | None = None

    def _reader_here(self):
        return self._reader or allocator_reader()

    def _kept_measurements(self) -> dict:
        """This kind of device's measurements, read from disk once per process."""
        if self._measured is None:
            self._identity = device_identity(self.device)
            self._cache_file = cache_path(self._identity, self._cache_folder)
            if self._cache_file not in _MEASURED:
                _MEASURED[self._cache_file] = self._read_kept(self._cache_file)
            self._measured = _MEASURED[self._cache_file]
        return self._measured

    def _before_measuring(self, reader) -> None:
        if self._reserved_before is None:
            self._reserved_before = reader.reserved(self.device)

    def _read_kept(self, path: str) -> dict:
        raise NotImplementedError

    def _save_kept(self, path: str, entries: dict) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """After the recording: keep the new measurements on disk, and give back what
        measuring added to the allocator's cache."""
        if self._measured_new and self._cache_file:
            entries = self._read_kept(self._cache_file)
            entries.update(self._measured)
            try:
                self._save_kept(self._cache_file, entries)
                self._measured_new = False
            except OSError as error:
                warnings.warn(f"vramkit.estimate: could not keep the measured {self._what} "
                              f"in {self._cache_file} ({error}); they will be measured "
                              f"again", RuntimeWarning, stacklevel=2)
        if self._reserved_before is not None:
            reader = self._reader_here()
            if reader.reserved(self.device) > self._reserved_before:
                reader.empty_cache(self.device)
            self._reserved_before = None

    def counts(self) -> Counter:
        """How many of the step's signatures got their size each way."""
        return Counter(self._how.values())

    def _on_device_note(self, what: str, signatures: str) -> list:
        """The note on the sizes measured on this GPU, now or earlier (none if none)."""
        counts = self.counts()
        on_device = counts["measured"] + counts["cached"]
        if not on_device:
            return []
        kept = (f", {counts['cached']} of them from earlier measurements kept in "
                f"{self._cache_file}" if counts["cached"] else "")
        return [f"{what} measured on this GPU ({self._identity['device']}) for {on_device} "
                f"of the step's {len(self._how)} {signatures}{kept}"]


class ConvWorkspaceModel(DeviceMeasuredSizes):
    """The recorder's hook for convolutions: one transient block per part with a
    workspace, after the op's outputs. ``device``: the real device to measure on (None:
    use the table); ``device_type``: count only convolutions whose input is there."""

    _what = "cuDNN workspaces"

    def __init__(self, device=None, *, device_type: str | None = None,
                 table_path: str | None = None, reader=None):
        super().__init__(device, device_type, reader, "cudnn-workspaces")
        self.table_path = table_path or TABLE_PATH
        self._table: Table | None = None
        self._no_memory: set = set()   # keys the device lacked the memory to measure

    def table(self) -> Table:
        if self._table is None:
            self._table = Table.load(self.table_path)
        return self._table

    def watched_ops(self):
        """The ops whose calls :meth:`hook` looks at: the convolutions'."""
        return _conv_ops().keys()

    def hook(self, recorder, func, args, kwargs, out) -> None:
        signatures = signatures_of_call(func, args, kwargs, self.device_type)
        if not signatures:
            return
        op = getattr(func, "__name__", str(func))
        for signature in signatures:
            transient = self.size_of(signature)
            if transient:
                recorder.allocate_transients(transient, op, LABEL, "workspaces")

    def size_of(self, signature: ConvSignature):
        """The signature's transient (_transients.py): measured, or the table's bytes."""
        key = signature.key()
        size = self._size.get(key)
        if size is not None:
            return size
        how = None
        if self.device is not None:
            size, how = self._from_device(signature, key)
        if size is None:
            size, how = self.table().lookup(signature)
        if size is None:
            size, how = 0, "none"
        self._size[key], self._how[key] = size, how
        return size

    def _read_kept(self, path: str) -> dict:
        return _read_cache(path)

    def _save_kept(self, path: str, entries: dict) -> None:
        Table(entries, {}, self._identity).save(path)

    def _from_device(self, signature: ConvSignature, key: str) -> tuple:
        measured = self._kept_measurements()
        if key in measured:
            return measured[key], "cached"
        reader = self._reader_here()
        self._before_measuring(reader)
        try:
            size = measure_on_device(signature, self.device, reader, blocks=True)
        except RuntimeError as error:
            # A configuration the real kernels refuse in isolation (say, a cuDNN status
            # error) is no reason to give no estimate: the table stands in for it.
            self._failed[key] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            return None, None
        if size is None:
            self._no_memory.add(key)
            return None, None
        self._measured[key] = size
        self._measured_new = True
        return size, "measured"

    def notes(self) -> list:
        if not self._how:
            return []
        counts = self.counts()
        total = len(self._how)
        notes = self._on_device_note("cuDNN workspaces", "convolution signatures")
        if self._no_memory:
            notes.append(f"the GPU lacked the memory to measure the cuDNN workspaces of "
                         f"{len(self._no_memory)} convolution signatures: the table's "
                         f"sizes were used for them where it has some")
        if self._failed:
            notes.append(f"the cuDNN workspaces of {len(self._failed)} convolution "
                         f"signatures could not be measured on this GPU (the first: "
                         f"{next(iter(self._failed.values()))}): the table's sizes were "
                         f"used for them where it has some")
        from_table = counts["exact"] + counts["batch"] + counts["nearest"] + counts["size"]
        if from_table:
            notes.append(f"cuDNN workspaces from the table measured on "
                         f"{self.table().describe_source()}: {counts['exact']} of the "
                         f"step's {total} convolution signatures measured as they are, "
                         f"{counts['batch']} scaled from other batch sizes, "
                         f"{counts['nearest']} from the nearest layers of their kind, "
                         f"{counts['size']} by the table's size rule (rough)")
        if counts["none"]:
            notes.append(f"convolution workspaces were not modelled for {counts['none']} "
                         f"of the step's {total} convolution signatures (no measurement in "
                         f"{self.table_path} fits them), so the predicted peaks may be low "
                         f"by cuDNN's workspaces; bench/cudnn_workspace_probe.py measures "
                         f"them on a GPU, and `python -m vramkit.estimator.workspace_table "
                         f"import PROBE.json` adds them to the table")
        return notes

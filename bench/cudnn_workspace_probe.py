"""Measure cuDNN's convolution workspaces on the GPU, for vramkit.estimate's workspace table,
and check the estimator's measurement of other ops' scratch buffers against real steps.

PyTorch's cuDNN convolutions (forward, backward data, backward weight) allocate a workspace
through PyTorch's caching allocator inside each call and free it before returning; fake
tensors never see it. This probe measures those transient blocks:

  in_step   real training steps (ResNet-50 in fp32 and fp16 autocast at batches 32, 128
            and 256, ViT-B/16, whose one convolution is its patch embedding), under a
            dispatch mode that reads the allocator around every ATen op: memory_allocated
            before, the peak during (reset_peak_memory_stats, then max_memory_allocated)
            and allocated after. For convolution and convolution_backward it also keeps
            the op's signature and, from the allocator's memory history, the blocks
            allocated and freed inside the op, in order (the workspaces). The ops
            vramkit.estimate models as having scratch buffers (layer norm, reductions,
            softmax, losses: vramkit.estimator.scratch.SCRATCH_OPS) are kept
            the same way by their signature, in "scratch"; the other ops that allocate
            transiently are summed up by name in "other_ops".
  isolated  each distinct convolution part of those steps (forward, backward input,
            backward weight, backward bias), and a sweep of shapes (channels, sizes,
            strides, kernels, groups, batches, dtypes, layouts, cuDNN flags), run on their
            own exactly as vramkit.estimate measures one on a GPU: a first call (cuDNN
            chooses its algorithm), then a second with the peak reset; the workspace is
            the peak during it less what the allocator holds before and after. Each
            distinct signature of the scratch ops of a step is measured on its own too,
            by vramkit.estimator.scratch.measure_op, the estimator's own code, and the
            summary compares it with what the op took inside the step.

The JSON written to --out (format vramkit-cudnn-workspace-probe/1) holds every record and
the environment (device, PyTorch, CUDA and cuDNN versions, cuDNN flags, allocator
settings); a summary goes to stdout. The isolated records fill the estimator's table:

    python3 bench/cudnn_workspace_probe.py --out bench/results/cudnn_workspaces.json
    python -m vramkit.estimator.workspace_table import bench/results/cudnn_workspaces.json \\
        --table python/vramkit/plan/estimator/data/cudnn_workspaces.json

Needs a CUDA GPU and PyTorch; torchvision for the models (else transformers' ResNet-50 and
ViT-B/16, whose convolutions have the same shapes). It runs in about three minutes on an
H200 (--budget-s stops the sweep in time) and never lets PyTorch's allocator take more than
--max-memory (30 GiB; set_per_process_memory_fraction). --dry-run runs the record path on
the CPU with made-up allocator figures (no GPU needed), to check the probe itself.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import sys
import time
import traceback

import torch
import torch.nn.functional as F

# The record path lives beside this file (the folder is not a package).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cudnn_probe_record import (  # noqa: E402
    PARTS, CudaReader, DryHistory, DryReader, History, StepProbe, cudnn_flags, op_scratch,
    output_of)
# Reached through this module by the tests, which load it alone.
from cudnn_probe_record import MARK_END, MARK_START, split_windows  # noqa: E402,F401

PROBE_FORMAT = "vramkit-cudnn-workspace-probe/1"
GiB = 1 << 30
ENV_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUDNN_CONV_WSCAP_DBG",
            "TORCH_CUDNN_V8_API_DISABLED", "TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT",
            "TORCH_CUDNN_SDPA_ENABLED", "CUBLAS_WORKSPACE_CONFIG", "CUDA_VISIBLE_DEVICES",
            "CUDA_MODULE_LOADING")

# The in-step workloads: (model, precision, batch), most wanted first (the budget may
# leave the last out).
WORKLOADS = [("resnet50", "fp32", 32), ("resnet50", "fp16-amp", 128),
             ("resnet50", "fp32", 128), ("resnet50", "fp16-amp", 256),
             ("vit_b16", "fp32", 32), ("vit_b16", "fp16-amp", 128)]
QUICK_WORKLOADS = [("resnet50", "fp32", 32), ("resnet50", "fp16-amp", 128),
                   ("vit_b16", "fp32", 32)]

# The sweep's layers, (in channels, out channels, size, kernel, stride, padding, groups):
# ResNet-50's kinds of layer (stem, 1x1 and 3x3 at each stage, strided ones, projections)
# plus a depthwise, a 5x5 and ViT-B/16's patch embedding.
SWEEP_LAYERS = [
    (3, 64, 224, 7, 2, 3, 1),
    (64, 64, 56, 1, 1, 0, 1),
    (64, 64, 56, 3, 1, 1, 1),
    (64, 256, 56, 1, 1, 0, 1),
    (256, 512, 56, 1, 2, 0, 1),
    (128, 128, 56, 3, 2, 1, 1),
    (128, 128, 28, 3, 1, 1, 1),
    (512, 128, 28, 1, 1, 0, 1),
    (256, 256, 14, 3, 1, 1, 1),
    (1024, 2048, 14, 1, 2, 0, 1),
    (512, 512, 7, 3, 1, 1, 1),
    (2048, 512, 7, 1, 1, 0, 1),
    (256, 256, 28, 3, 1, 1, 256),
    (64, 64, 56, 5, 1, 2, 1),
    (3, 768, 224, 16, 16, 0, 1),
]
SWEEP_BATCHES = (8, 32, 128, 256)
QUICK_BATCHES = (32, 128)
SWEEP_DTYPES = ("float32", "float16", "bfloat16")
# Layers the sweep also runs under other cuDNN flags (at batch 32, fp32 and fp16).
FLAG_LAYERS = (1, 2, 8)
FLAG_VARIANTS = ({"benchmark": True}, {"deterministic": True}, {"tf32": False})
# A sweep configuration whose input and output together exceed this is left out.
SWEEP_TENSOR_LIMIT = 4 * GiB


def _tiny_net():
    """--dry-run's model: two convolutions (one with a bias, one strided), a batch norm
    and a classifier, small enough for a CPU."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(), torch.nn.Conv2d(8, 16, 3, padding=1, bias=False), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))


def tiny_batch(batch=4):
    """--dry-run's batch, for the tiny model."""
    return torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))


def build_model(name):
    """The model, with random weights: torchvision's, else transformers' of the same
    shapes. Returns (module, where it came from)."""
    if name == "tiny":
        return _tiny_net(), "dry run"
    try:
        import torchvision
        model = {"resnet50": torchvision.models.resnet50,
                 "vit_b16": torchvision.models.vit_b_16}[name](weights=None)
        return model, f"torchvision {torchvision.__version__}"
    except ImportError:
        import transformers
        if name == "resnet50":
            model = transformers.ResNetForImageClassification(transformers.ResNetConfig())
        else:
            model = transformers.ViTForImageClassification(transformers.ViTConfig())
        return model, f"transformers {transformers.__version__}"


def _logits(out):
    return out if isinstance(out, torch.Tensor) else out.logits


def run_workload(name, precision, batch, device, reader, history, optimizer, log):
    """Two training steps of the model under StepProbe; (records, other ops, info, probe):
    the probe holds the scratch ops' records and signatures."""
    model, origin = build_model(name)
    model = model.to(device).train()
    opt = (torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if optimizer == "sgd"
           else torch.optim.AdamW(model.parameters(), lr=1e-4))
    if name == "tiny":
        x, y = tiny_batch(batch)
        x, y = x.to(device), y.to(device)
    else:
        x = torch.randn(batch, 3, 224, 224, device=device)
        # Two classes: transformers' models have two by default, torchvision's 1000.
        y = torch.randint(0, 2, (batch,), device=device)
    amp_dtype = {"fp16-amp": torch.float16, "bf16-amp": torch.bfloat16}.get(precision)
    scaler = (torch.amp.GradScaler(device.type) if precision == "fp16-amp"
              and device.type == "cuda" else None)
    key = f"{name} {precision} b{batch}"
    probe = StepProbe(reader, history, key, device.type)
    history.start()
    times = []
    for step in range(2):
        probe.step, probe.phase, probe.index = step, "forward", 0
        t0 = time.perf_counter()
        autocast = (torch.autocast(device.type, dtype=amp_dtype) if amp_dtype
                    else contextlib.nullcontext())
        with probe:
            with autocast:
                loss = F.cross_entropy(_logits(model(x)).float(), y)
            (scaler.scale(loss) if scaler else loss).backward()
            probe.phase = "optimizer"
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(round(time.perf_counter() - t0, 3))
        del loss
    windows = history.windows()
    for record in (*probe.records, *probe.scratch_records):
        index = record.pop("window")
        if index is not None and index < len(windows):
            record["trace"] = windows[index]
    info = {"workload": key, "model": origin, "optimizer": optimizer,
            "step_seconds": times, "max_op_peak": probe.step_peak,
            "convolution_ops": len(probe.records),
            "scratch_ops": len(probe.scratch_records),
            "scratch_signatures": len(probe.scratch_calls),
            "history": history.enabled, "windows": len(windows)}
    log(f"  {key}: {len(probe.records)} convolution ops, {len(probe.scratch_records)} "
        f"scratch ops ({len(probe.scratch_calls)} signatures) in 2 steps, "
        f"{times} s, peak over ops {probe.step_peak / GiB:.2f} GiB")
    del model, opt, x, y, scaler
    return probe.records, probe.other, info, probe


# ---------------------------------------------------------------------------------------
# The isolated measurements.
# ---------------------------------------------------------------------------------------

def make_runner(fields, part, device):
    """A call of one part on real (uninitialised) tensors of the signature's shapes:
    vramkit.estimator.workspaces._runner, which the estimator measures a GPU with."""
    dtype = getattr(torch, fields["dtype"])
    memory_format = {"channels_last": torch.channels_last,
                     "channels_last_3d": torch.channels_last_3d}.get(fields["layout"])
    dims = len(fields["weight"])

    def make(shape):
        if memory_format is not None and len(shape) == dims:
            return torch.empty(shape, dtype=dtype, device=device, memory_format=memory_format)
        return torch.empty(shape, dtype=dtype, device=device)

    x = make((fields["batch"], *fields["input"]))
    w = make(fields["weight"])
    geometry = (fields["stride"], fields["padding"], fields["dilation"],
                fields["transposed"], fields["output_padding"], fields["groups"])
    aten = torch.ops.aten
    if part == "forward":
        return lambda: aten.convolution.default(x, w, None, *geometry)
    out = output_of(fields)
    grad_out = make((fields["batch"], *out))
    mask = [part == p for p in PARTS[1:]]
    bias_sizes = [out[0]] if part == "backward_bias" else None
    return lambda: aten.convolution_backward.default(grad_out, x, w, bias_sizes, *geometry,
                                                     mask)


def measure_part(fields, part, device, reader, history, source):
    """One part on its own: the first call's excess, then the steady call's (the
    workspace the table keeps), with its blocks from the memory history."""
    fields = {k: v for k, v in fields.items() if k != "output_mask"}
    record = {"source": source, "signature": dict(fields, part=part)}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    try:
        with torch.no_grad(), torch.autocast(device.type, enabled=False), \
                torch.backends.cudnn.flags(enabled=fields["cudnn"],
                                           benchmark=fields["benchmark"],
                                           deterministic=fields["deterministic"],
                                           allow_tf32=fields["tf32"]):
            run = make_runner(fields, part, device)
            t0 = time.perf_counter()
            before = reader.allocated()
            reader.reset_peak()
            out = run()
            reader.observe(out, "conv")
            peak, after = reader.peak(), reader.allocated()
            del out
            sync(device)
            record["first_call_excess"] = max(0, peak - max(before, after))
            record["first_call_s"] = round(time.perf_counter() - t0, 4)
            window = history.mark_start()
            before = reader.allocated()
            reader.reset_peak()
            out = run()
            reader.observe(out, "conv")
            peak, after = reader.peak(), reader.allocated()
            history.mark_end()
            del out, run
            sync(device)
    except torch.OutOfMemoryError:
        record["error"] = "out of memory"
        return record, None
    except RuntimeError as error:  # a configuration cuDNN or PyTorch refuses
        record["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
        return record, None
    record.update(workspace=max(0, peak - max(before, after)), before=before, peak=peak,
                  after=after)
    return record, window


# The wider sweep ("layers" in --only): the kinds of layer of diffusion UNets (3x3 over
# 32 to 1280 channels at 8 to 128 pixels, the up path's concatenated inputs, 1x1 skips,
# strided downsampling) and of ConvNeXt-style nets (4x4 patchify stem, depthwise 7x7, 2x2
# strided downsampling), in every layout, for the table's nearest-layer lookup.
_UNET_WIDTHS = (32, 64, 128, 256, 320, 512, 640, 1280)
WIDE_LAYERS = (
    [(c, c, size, 3, 1, 1, 1) for c in _UNET_WIDTHS for size in (8, 16, 32, 64, 128)]
    + [(2 * c, c, size, 3, 1, 1, 1) for c in (64, 128, 256, 320, 640, 1280)
       for size in (16, 64)]
    + [(3 * c // 2, c, 32, 3, 1, 1, 1) for c in (128, 320, 640)]
    + [(2 * c, c, size, 1, 1, 0, 1) for c in (64, 128, 320, 640) for size in (16, 64)]
    + [(c, c, size, 3, 2, 1, 1) for c in (64, 128, 320, 640) for size in (16, 64)]
    + [(3, c, 128, 3, 1, 1, 1) for c in (32, 128, 320)]
    + [(3, c, 224, 4, 4, 0, 1) for c in (64, 96, 128)]
    + [(c, c, size, 7, 1, 3, c) for c in (64, 96, 128, 192, 384, 768)
       for size in (7, 14, 28, 56)]
    + [(c, 2 * c, size, 2, 2, 0, 1) for c in (96, 192, 384) for size in (14, 28, 56)])
WIDE_BATCHES = (8, 32)
# (dtype, layout): the wider sweep covers fp32 in channels-last too.
WIDE_KINDS = (("float32", "contiguous"), ("float32", "channels_last"),
              ("float16", "contiguous"), ("float16", "channels_last"),
              ("bfloat16", "contiguous"), ("bfloat16", "channels_last"))


def layer_fields(layer, batch, dtype, layout, flags):
    """A probe record's signature fields for a square layer of the sweeps' form (in
    channels, out channels, size, kernel, stride, padding, groups)."""
    cin, cout, size, k, s, p, g = layer
    return {"batch": batch, "input": [cin, size, size], "weight": [cout, cin // g, k, k],
            "stride": [s, s], "padding": [p, p], "dilation": [1, 1], "transposed": False,
            "output_padding": [0, 0], "groups": g, "dtype": dtype, "layout": layout,
            **flags}


def wide_configs(dry_run=False):
    """The wider sweep's (fields, parts, source), in order: every layer at the smaller
    batch first, so that a budget that runs out leaves whole batches out, not layers."""
    layers = DRY_LAYERS if dry_run else WIDE_LAYERS
    batches = (2,) if dry_run else WIDE_BATCHES
    defaults = cudnn_flags()
    for batch in batches:
        for dtype, layout in WIDE_KINDS:
            for layer in layers:
                yield layer_fields(layer, batch, dtype, layout, defaults), \
                    ["forward", "backward_input", "backward_weight"], "layers"


def listed_configs(path):
    """(fields, parts, source) for each table key listed in the JSON file at ``path`` (a
    list of keys, or a mapping whose keys are table keys), grouped by layer."""
    from vramkit.estimator.workspaces import ConvSignature
    with open(path) as f:
        keys = list(json.load(f))
    grouped: dict = {}
    for key in keys:
        fields = ConvSignature.from_key(key).fields()
        part = fields.pop("part")
        grouped.setdefault(json.dumps(fields, sort_keys=True), (fields, []))[1].append(part)
    for fields, parts in grouped.values():
        yield fields, parts, "listed"


# --dry-run's sweep: two small layers a CPU runs at once.
DRY_LAYERS = [(8, 16, 16, 3, 1, 1, 1), (16, 16, 8, 1, 2, 0, 1)]


def sweep_configs(quick, dry_run=False):
    """The sweep's (fields, parts, source), in order."""
    layers = DRY_LAYERS if dry_run else SWEEP_LAYERS
    batches = (2, 4) if dry_run else QUICK_BATCHES if quick else SWEEP_BATCHES
    dtypes = ("float32", "bfloat16") if dry_run else ("float32", "float16") if quick \
        else SWEEP_DTYPES
    flag_layers = () if dry_run else FLAG_LAYERS
    defaults = cudnn_flags()
    for index, layer in enumerate(layers):
        with_bias = layer[0] == 3 and layer[3] == 16  # ViT's patch embedding has a bias
        parts = ["forward", "backward_input", "backward_weight"] + (
            ["backward_bias"] if with_bias else [])
        for dtype in dtypes:
            layouts = ("contiguous",) if dtype == "float32" or quick or dry_run else \
                ("contiguous", "channels_last")
            for layout in layouts:
                for batch in batches:
                    yield layer_fields(layer, batch, dtype, layout, defaults), parts, "sweep"
        if index in flag_layers:
            for dtype in ("float32", "float16"):
                for variant in FLAG_VARIANTS:
                    if "tf32" in variant and dtype != "float32":
                        continue
                    fields = layer_fields(layer, 32, dtype, "contiguous",
                                          dict(defaults, **variant))
                    name = ",".join(f"{k}={v}" for k, v in variant.items())
                    yield fields, ["forward", "backward_input", "backward_weight"], \
                        f"sweep flags {name}"


def tensor_bytes(fields):
    itemsize = torch.empty((), dtype=getattr(torch, fields["dtype"])).element_size()
    count = fields["batch"] * (_prod(fields["input"]) + _prod(output_of(fields)))
    return count * itemsize


def _prod(values):
    out = 1
    for v in values:
        out *= v
    return out


def run_isolated(signatures, device, reader, history, log, deadline):
    """Measure each (fields, parts, source) until the deadline; (records, skipped)."""
    records, windows_of = [], []
    skipped = 0
    history.start()
    for fields, parts, source in signatures:
        if time.perf_counter() > deadline:
            skipped += len(parts)
            continue
        if tensor_bytes(fields) > SWEEP_TENSOR_LIMIT:
            records.append({"source": source, "signature": dict(fields, part=parts[0]),
                            "skipped": "tensors over the probe's limit"})
            continue
        for part in parts:
            record, window = measure_part(fields, part, device, reader, history, source)
            records.append(record)
            windows_of.append((record, window))
    windows = history.windows()
    for record, window in windows_of:
        if window is not None and window < len(windows):
            record["trace"] = windows[window]
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return records, skipped


def distinct_parts(in_step):
    """Each (fields, parts) of the steps' convolutions once, by signature less the mask."""
    seen = {}
    for record in in_step:
        fields = {k: v for k, v in record["signature"].items() if k != "output_mask"}
        key = json.dumps(fields, sort_keys=True)
        parts = seen.setdefault(key, (fields, []))[1]
        for part in record["parts"]:
            if part not in parts:
                parts.append(part)
    return list(seen.values())


class EstimatorReader:
    """A probe reader as vramkit.estimator's measuring code reads the allocator (its
    methods take the device), so that an isolated scratch measurement here runs exactly
    the estimator's code."""

    def __init__(self, reader, device, cap=None):
        self.reader = reader
        self.cuda = device.type == "cuda"
        self.cap = cap

    def allocated(self, device):
        return self.reader.allocated()

    def reset_peak(self, device):
        self.reader.reset_peak()

    def peak(self, device):
        return self.reader.peak()

    def reserved(self, device):
        return self.reader.reserved()

    def empty_cache(self, device):
        if self.cuda:
            torch.cuda.empty_cache()

    def available(self, device):
        if not self.cuda:
            return 1 << 62  # --dry-run: no bound
        free, _total = torch.cuda.mem_get_info(device)
        room = free + max(0, self.reserved(device) - self.allocated(device))
        if self.cap is not None:
            # Under the probe's cap (set_per_process_memory_fraction) the allocator may
            # take less than the device has free.
            room = min(room, max(0, self.cap - self.allocated(device)))
        return room

    def observe(self, out):
        self.reader.observe(out, "scratch")


def run_scratch_isolated(workload, calls, device, reader, deadline, cap=None):
    """Each scratch signature of a workload's steps measured on its own, as the estimator
    measures it on a GPU; (records, skipped by the time budget)."""
    records, skipped = [], 0
    wrapped = EstimatorReader(reader, device, cap)
    for key, call in calls.items():
        if time.perf_counter() > deadline:
            skipped += 1
            continue
        record = {"workload": workload, "op": call.op, "key": key,
                  "input_bytes": call.input_bytes(),
                  "largest_elements": max((_prod(t.shape) for t in call.tensors()),
                                          default=0)}
        t0 = time.perf_counter()
        try:
            size = op_scratch.measure_op(call, device, wrapped)
        except Exception as error:  # noqa: BLE001 - recorded, as the estimator counts it
            record["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
        else:
            if size is None:
                record["error"] = "out of memory (or over the estimator's share)"
            else:
                record["isolated"] = size
        record["seconds"] = round(time.perf_counter() - t0, 4)
        records.append(record)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return records, skipped


def scratch_comparison(result) -> list:
    """Per scratch signature of each workload: the largest excess inside the steady step
    (the second; the first where there is none) beside the isolated measurement."""
    in_step = {}
    for record in result["scratch"]["in_step"]:
        entry = in_step.setdefault((record["workload"], record["key"]), {})
        entry.setdefault(record["step"], []).append(record["excess"])
    rows = []
    for record in result["scratch"]["isolated"]:
        steps = in_step.get((record["workload"], record["key"]))
        if not steps or "isolated" not in record:
            continue
        seen = max(steps.get(1) or steps[min(steps)])
        rows.append({"workload": record["workload"], "op": record["op"],
                     "key": record["key"], "in_step": seen, "isolated": record["isolated"],
                     "largest_elements": record["largest_elements"],
                     "match": abs(seen - record["isolated"])
                     <= max(SCRATCH_MATCH_BYTES, SCRATCH_MATCH_SHARE * max(seen, 1))})
    return rows


# In-step and isolated sizes of a scratch signature agree within this (the allocator's
# rounding, a block of the small pool).
SCRATCH_MATCH_BYTES = 64 << 10
SCRATCH_MATCH_SHARE = 0.05


# ---------------------------------------------------------------------------------------
# The run.
# ---------------------------------------------------------------------------------------

def environment(device, cap, dry_run):
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
           "cudnn_flags": cudnn_flags(), "dry_run": dry_run,
           "env": {k: os.environ[k] for k in ENV_VARS if k in os.environ},
           "memory_cap": cap}
    for module in ("torchvision", "transformers"):
        try:
            env[module] = __import__(module).__version__
        except ImportError:
            env[module] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device=torch.cuda.get_device_name(device), total_memory=props.total_memory,
                   capability=f"{props.major}.{props.minor}",
                   allocator_backend=torch.cuda.get_allocator_backend())
    else:
        env.update(device="cpu (dry run)", total_memory=None)
    return env


def _size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = str(text).strip().upper().rstrip("B").rstrip("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Measure cuDNN's convolution workspaces on "
                                            "the GPU (for vramkit.estimate's table).")
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--quick", action="store_true",
                   help="fewer workloads, batches and dtypes (about a minute)")
    p.add_argument("--budget-s", type=float, default=170.0,
                   help="stop starting measurements after this many seconds (default 170)")
    p.add_argument("--max-memory", type=_size, default=30 * GiB,
                   help="the most PyTorch's allocator may take (default 30G)")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    p.add_argument("--only", default="resnet50,vit_b16,sweep",
                   help="comma list of resnet50, vit_b16, sweep, layers (the wider sweep "
                        "of UNet and ConvNeXt layers) (default resnet50,vit_b16,sweep)")
    p.add_argument("--signatures", default=None, metavar="JSON",
                   help="also measure each table key this file lists (first)")
    p.add_argument("--benchmark", action="store_true",
                   help="run everything with torch.backends.cudnn.benchmark = True")
    p.add_argument("--no-history", action="store_true",
                   help="skip the memory history (no per-block traces)")
    p.add_argument("--dry-run", action="store_true",
                   help="on the CPU, with made-up allocator figures: checks the probe")
    return p.parse_args(argv)


def summarize(result, log):
    log("\nin-step convolutions (the workspace of an op: peak during it less what is "
        "held before and after)")
    by_workload = {}
    for record in result["in_step"]:
        by_workload.setdefault(record["workload"], []).append(record)
    for workload, records in by_workload.items():
        steady = [r for r in records if r["step"] == 1] or records
        with_ws = [r for r in steady if r["excess"]]
        biggest = max(steady, key=lambda r: r["excess"])
        transient = sum(len(r.get("trace", {}).get("transient", [])) for r in steady)
        log(f"  {workload:<28} {len(steady):>4} ops/step, {len(with_ws):>4} with a "
            f"workspace, {transient:>4} transient blocks, largest "
            f"{biggest['excess'] / (1 << 20):8.1f} MiB ({biggest['op']} "
            f"{biggest['signature']['input']} w={biggest['signature']['weight']})")
    measured = [r for r in result["isolated"] if "workspace" in r]
    failed = [r for r in result["isolated"] if "error" in r]
    log(f"\nisolated parts: {len(measured)} measured, {len(failed)} failed, "
        f"{result['skipped']} left out by the time budget")
    table = {}
    for record in measured:
        sig = record["signature"]
        key = (sig["part"], sig["dtype"], sig["layout"])
        entry = table.setdefault(key, [0, 0, 0])
        entry[0] += 1
        entry[1] += record["workspace"] > 0
        entry[2] = max(entry[2], record["workspace"])
    log(f"  {'part':<16}{'dtype':<10}{'layout':<15}{'parts':>6}{'with ws':>9}"
        f"{'largest MiB':>13}")
    for (part, dtype, layout), (count, nonzero, largest) in sorted(table.items()):
        log(f"  {part:<16}{dtype:<10}{layout:<15}{count:>6}{nonzero:>9}"
            f"{largest / (1 << 20):>13.1f}")
    rows = scratch_comparison(result)
    if rows:
        log(f"\nscratch ops, in the steady step vs on their own (as the estimator measures "
            f"them): {sum(r['match'] for r in rows)} of {len(rows)} signatures agree "
            f"within {SCRATCH_MATCH_SHARE:.0%} or {SCRATCH_MATCH_BYTES >> 10} KiB")
        log(f"  {'op':<52}{'sigs':>5}{'agree':>6}{'in step MiB':>13}{'isolated':>10}"
            f"{'B/elem':>8}")
        by_op = {}
        for row in rows:
            by_op.setdefault(row["op"], []).append(row)
        for op, group in sorted(by_op.items(), key=lambda kv: -max(r["in_step"]
                                                                 for r in kv[1])):
            top = max(group, key=lambda r: r["in_step"])
            # Isolated bytes per element of the op's largest tensor, the most over its
            # signatures: what a size rule for machines without a GPU would be fitted from.
            per = max((r["isolated"] / r["largest_elements"] for r in group
                       if r["largest_elements"]), default=0.0)
            log(f"  {op:<52}{len(group):>5}{sum(r['match'] for r in group):>6}"
                f"{top['in_step'] / (1 << 20):>13.2f}{top['isolated'] / (1 << 20):>10.2f}"
                f"{per:>8.2f}")
        worst = sorted((r for r in rows if not r["match"]),
                       key=lambda r: -abs(r["in_step"] - r["isolated"]))[:5]
        for row in worst:
            log(f"  differs: {row['workload']}: {row['key'][:150]}: in step "
                f"{row['in_step'] / (1 << 20):.2f} MiB, isolated "
                f"{row['isolated'] / (1 << 20):.2f} MiB")
    failed = [r for r in result["scratch"]["isolated"] if "error" in r]
    if failed:
        log(f"  {len(failed)} scratch signatures not measured on their own (the first: "
            f"{failed[0]['op']}: {failed[0]['error'][:200]})")
    others = {}
    for ops in result["other_ops"].values():
        for name, entry in ops.items():
            others[name] = max(others.get(name, 0), entry["max_excess"])
    if others:
        top = sorted(others.items(), key=lambda kv: -kv[1])[:8]
        log("\nother ops with transient blocks, not modelled (largest): " + ", ".join(
            f"{name} {size / (1 << 20):.1f} MiB" for name, size in top))
    for error in result["errors"]:
        log(f"error: {error['where']}: {error['error']}")


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    deadline = start + args.budget_s

    def log(text):
        print(text, flush=True)

    trace = []
    if args.dry_run:
        device = torch.device("cpu")
        reader, history = DryReader(trace), DryHistory(trace)
        workloads = [("tiny", "fp32", 4), ("tiny", "bf16-amp", 4)]
    else:
        if not torch.cuda.is_available():
            print("cudnn_workspace_probe: needs a CUDA GPU (or --dry-run)", file=sys.stderr)
            return 1
        device = torch.device("cuda", 0)
        torch.cuda.init()
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.max_memory / total), device)
        reader, history = CudaReader(device), History(device, not args.no_history)
        workloads = QUICK_WORKLOADS if args.quick else WORKLOADS
    if args.benchmark:
        torch.backends.cudnn.benchmark = True
    only = set(args.only.split(","))
    torch.manual_seed(0)
    result = {"format": PROBE_FORMAT, "dry_run": args.dry_run,
              "environment": environment(device, None if args.dry_run else args.max_memory,
                                         args.dry_run),
              "workloads": [], "in_step": [], "other_ops": {}, "isolated": [],
              "scratch": {"in_step": [], "isolated": [], "skipped": 0,
                          "available": op_scratch is not None},
              "skipped": 0, "errors": [], "seconds": None}

    def write():
        result["seconds"] = round(time.perf_counter() - start, 1)
        folder = os.path.dirname(os.path.abspath(args.out))
        os.makedirs(folder, exist_ok=True)
        scratch = args.out + ".partial"
        with open(scratch, "w") as f:
            json.dump(result, f)
        os.replace(scratch, args.out)

    log(f"cudnn_workspace_probe on {result['environment']['device']}, PyTorch "
        f"{torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    for name, precision, batch in workloads:
        if name not in only and name != "tiny":
            continue
        if time.perf_counter() > deadline:
            result["errors"].append({"where": f"{name} {precision} b{batch}",
                                     "error": "left out by the time budget"})
            continue
        try:
            records, other, info, probe = run_workload(name, precision, batch, device,
                                                       reader, history, args.optimizer, log)
        except Exception as error:  # noqa: BLE001 - recorded; the rest goes on
            result["errors"].append({"where": f"{name} {precision} b{batch}",
                                     "error": f"{type(error).__name__}: {error}"[:500],
                                     "traceback": traceback.format_exc()[-2000:]})
            log(f"  {name} {precision} b{batch}: {type(error).__name__}: {error}"[:300])
            records, other, info, probe = [], {}, None, None
        finally:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        result["in_step"].extend(records)
        if other:
            result["other_ops"][f"{name} {precision} b{batch}"] = other
        if info:
            result["workloads"].append(info)
            # The parts of this workload's convolutions, measured on their own at once,
            # while the budget is surest to allow it.
            parts = [(fields, parts, info["workload"])
                     for fields, parts in distinct_parts(records)]
            isolated, skipped = run_isolated(parts, device, reader, history, log, deadline)
            result["isolated"].extend(isolated)
            result["skipped"] += skipped
        if probe is not None and probe.scratch_calls:
            result["scratch"]["in_step"].extend(probe.scratch_records)
            isolated, skipped = run_scratch_isolated(
                info["workload"], probe.scratch_calls, device, reader, deadline,
                None if args.dry_run else args.max_memory)
            result["scratch"]["isolated"].extend(isolated)
            result["scratch"]["skipped"] += skipped
        del probe
        write()
    if history.error:
        result["errors"].append({"where": "memory history", "error": history.error})
    if args.signatures:
        isolated, skipped = run_isolated(list(listed_configs(args.signatures)), device,
                                         reader, history, log, deadline)
        result["isolated"].extend(isolated)
        result["skipped"] += skipped
        log(f"  listed: {len(isolated)} parts measured or tried, {skipped} left out")
        write()
    if "layers" in only:
        isolated, skipped = run_isolated(list(wide_configs(args.dry_run)), device, reader,
                                         history, log, deadline)
        result["isolated"].extend(isolated)
        result["skipped"] += skipped
        log(f"  layers: {len(isolated)} parts measured or tried, {skipped} left out "
            f"by the time budget")
        write()
    if "sweep" in only:
        configs = list(sweep_configs(args.quick, args.dry_run))
        isolated, skipped = run_isolated(configs, device, reader, history, log, deadline)
        result["isolated"].extend(isolated)
        result["skipped"] += skipped
        log(f"  sweep: {len(isolated)} parts measured or tried, {skipped} left out "
            f"by the time budget")
    write()
    summarize(result, log)
    log(f"\nwrote {args.out} in {result['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

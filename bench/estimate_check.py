"""How close vramkit.estimate comes to the real step, on the GPU, side by side in one run.

For each workload (model, precision, batch, checkpointing) it measures, each in its own
process so that no allocator sees another's memory:
  - the real step (two training steps, from a fresh model) under PyTorch's caching
    allocator, under PyTorch's allocator with expandable_segments:True, and under
    vramkit.torch.install(): peak allocated and peak reserved;
  - vramkit.estimate on this machine (fake CUDA tensors), the same with the CPU stand-in
    a machine without a GPU uses (emulate=True), and PyTorch's MemTracker under fake
    tensors (peak allocated only);
and prints one table of the estimates' errors. It also measures the two constants the
estimator models (the cuBLAS workspace per thread and the CUDA context), on lines
"workspace" and "context".

    python3 bench/estimate_check.py --out DIR [--only gpt2]
    python3 bench/estimate_check.py --estimates-only --small   # any machine: every
                                                               # workload builds, estimates

Needs a CUDA GPU, PyTorch, transformers and vramkit installed (timm for ConvNeXt, which
is skipped with a note without it); --estimates-only needs no GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

# (family, precision, batch, seq or image size, optimizer, checkpointing): each step is
# written as a user writes it (the model made, then moved with .to("cuda"); autocast
# around forward; the optimizer's step), in families the issue names: two decoder-LM
# families and a mixture-of-experts decoder, an encoder, an encoder-decoder, a ViT, two
# convnets and a diffusion-style UNet. Precision "bf16" is bf16 weights (and so optimizer
# state). Checkpointing "all" or "some" (every second repeated block).
WORKLOADS = [
    ("gpt2", "fp32", 1, 1024, "adamw", "none"),
    ("gpt2", "fp32", 8, 1024, "adamw", "none"),
    ("gpt2", "fp32", 64, 1024, "adamw", "none"),        # near the card's edge
    ("gpt2", "bf16-amp", 16, 1024, "adamw", "none"),
    ("gpt2", "bf16-amp", 32, 1024, "adamw", "all"),
    ("gpt2", "bf16-amp", 16, 1024, "adamw", "some"),
    ("gpt2", "fp16-amp", 8, 1024, "sgd", "none"),
    ("gpt2", "bf16", 16, 1024, "adafactor", "none"),
    ("llama", "bf16-amp", 1, 1024, "adamw", "none"),
    ("llama", "bf16-amp", 4, 1024, "adamw", "all"),
    ("llama", "bf16-amp", 2, 1024, "sgd", "some"),
    ("llama", "bf16", 4, 1024, "adafactor", "none"),
    ("mixtral", "bf16-amp", 4, 1024, "adamw", "none"),  # experts: grouped products
    ("bert", "fp32", 16, 512, "adamw", "none"),
    ("bert", "bf16-amp", 32, 512, "adamw", "all"),
    ("t5", "fp32", 16, 512, "adamw", "none"),
    ("t5", "bf16-amp", 16, 512, "adafactor", "some"),
    ("vit", "fp32", 32, 224, "adamw", "none"),
    ("vit", "fp16-amp", 128, 224, "adamw", "none"),
    ("vit", "bf16-amp", 64, 224, "sgd", "some"),
    ("resnet50", "fp32", 32, 224, "sgd", "none"),
    ("resnet50", "fp16-amp", 256, 224, "sgd", "none"),
    ("resnet50", "bf16", 64, 224, "adamw", "none"),
    ("convnext", "fp32", 32, 224, "adamw", "none"),
    ("convnext", "bf16-amp", 128, 224, "adamw", "all"),
    ("unet", "fp32", 8, 64, "adamw", "none"),
    ("unet", "bf16-amp", 32, 64, "adamw", "all"),
    ("unet", "fp16-amp", 16, 64, "adafactor", "some"),
]


# The batch finder's check: the largest batch under a 24 GiB allocator cap, predicted and
# measured, for these (model, precision, seq).
FINDER = [("gpt2", "fp32", 1024), ("gpt2", "bf16-amp", 1024), ("resnet50", "fp32", 0),
          ("resnet50", "fp16-amp", 0)]
CAP = 24 << 30


class SkipWorkload(Exception):
    """A workload whose library is not installed here (timm): skipped with a note."""


class Work:
    def __init__(self, build, step):
        self.build, self.step = build, step


def _text_model(family: str, small: bool):
    """A language model of ``family`` from its configuration (tiny when ``small``) and
    its vocabulary size."""
    import transformers as t
    tiny = dict(vocab_size=1000)
    if family == "gpt2":
        config = (t.GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=128, **tiny)
                  if small else t.GPT2Config())
        net = t.GPT2LMHeadModel(config)
    elif family == "llama":
        config = (t.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, **tiny)
                  if small else
                  t.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                                num_attention_heads=32, num_key_value_heads=8,
                                vocab_size=32000, max_position_embeddings=4096))
        net = t.LlamaForCausalLM(config)
    elif family == "mixtral":
        # A mixture-of-experts decoder: eight experts a layer, two per token, its weights
        # in fp32 under autocast (transformers' grouped products then run CUDA's fallback).
        shape = (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, **tiny) if small else
                 dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=4, vocab_size=32000))
        config = t.MixtralConfig(num_local_experts=8, num_experts_per_tok=2,
                                 max_position_embeddings=4096, **shape)
        net = t.MixtralForCausalLM(config)
    elif family == "bert":
        config = (t.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=2, **tiny) if small else t.BertConfig())
        net = t.BertForMaskedLM(config)
    else:  # t5: T5Config() is t5-small. The decoder's start token is the pad token, 0, as
        # t5-small's config says; newer transformers releases no longer default it.
        config = (t.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=2, d_kv=32,
                             decoder_start_token_id=0, **tiny) if small
                  else t.T5Config(decoder_start_token_id=0))
        net = t.T5ForConditionalGeneration(config)
    return net, config.vocab_size


def _vision_model(family: str, small: bool, size: int):
    import transformers as t
    if family == "vit":
        config = (t.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=128, image_size=size, patch_size=8)
                  if small else t.ViTConfig(image_size=size))
        return t.ViTForImageClassification(config)
    if family == "resnet50":
        config = (t.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128],
                                 depths=[1, 1, 1, 1]) if small else t.ResNetConfig())
        return t.ResNetForImageClassification(config)
    if family == "convnext":
        try:
            import timm
        except ImportError as error:
            raise SkipWorkload("timm is not installed here") from error
        shape = dict(depths=(1, 1, 1, 1), dims=(16, 32, 64, 128)) if small else {}
        return timm.create_model("convnext_tiny", drop_path_rate=0.1, **shape)
    return UNet(base=16, levels=(1, 2), attention=False) if small else UNet()


def UNet(base: int = 128, levels=(1, 2, 2, 4), attention: bool = True):
    """A diffusion-style UNet (diffusers is not needed): residual blocks with group norm
    and a timestep embedding, downsampling and upsampling with skip connections, and
    self-attention in the middle. Defined on first use: the measuring processes set the
    allocator's settings before PyTorch is imported."""
    return _unet_classes()(base, levels, attention)


def _unet_classes():
    import math

    import torch
    import torch.nn.functional as F
    from torch import nn

    class ResBlock(nn.Module):
        def __init__(self, cin, cout, tdim):
            super().__init__()
            self.norm1, self.conv1 = nn.GroupNorm(8, cin), nn.Conv2d(cin, cout, 3, padding=1)
            self.time = nn.Linear(tdim, cout)
            self.norm2, self.conv2 = nn.GroupNorm(8, cout), nn.Conv2d(cout, cout, 3, padding=1)
            self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

        def forward(self, x, t):
            h = self.conv1(F.silu(self.norm1(x))) + self.time(t)[:, :, None, None]
            return self.conv2(F.silu(self.norm2(h))) + self.skip(x)

    class Attention(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.norm, self.qkv, self.out = nn.GroupNorm(8, c), nn.Conv2d(c, 3 * c, 1), \
                nn.Conv2d(c, c, 1)

        def forward(self, x):
            b, c, h, w = x.shape
            q, k, v = self.qkv(self.norm(x)).reshape(b, 3, 4, c // 4, h * w) \
                .permute(1, 0, 2, 4, 3).unbind(0)
            y = F.scaled_dot_product_attention(q, k, v)
            return x + self.out(y.transpose(-1, -2).reshape(b, c, h, w))

    class Net(nn.Module):
        def __init__(self, base, levels, attention):
            super().__init__()
            tdim, self.base = 4 * base, base
            self.time = nn.Sequential(nn.Linear(base, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
            self.inp = nn.Conv2d(3, base, 3, padding=1)
            widths = [base * m for m in levels]
            self.down = nn.ModuleList(ResBlock(c_in, c, tdim) for c_in, c in
                                      zip([base] + widths[:-1], widths))
            self.mid = nn.ModuleList([ResBlock(widths[-1], widths[-1], tdim),
                                      ResBlock(widths[-1], widths[-1], tdim)])
            self.attention = Attention(widths[-1]) if attention else nn.Identity()
            self.up = nn.ModuleList(ResBlock(2 * c, c_out, tdim) for c, c_out in
                                    zip(widths[::-1], widths[::-1][1:] + [base]))
            self.norm, self.outp = nn.GroupNorm(8, base), nn.Conv2d(base, 3, 3, padding=1)

        def forward(self, x, steps):
            half = self.base // 2
            freqs = torch.exp(-math.log(10000) * torch.arange(half, device=x.device) / half)
            angles = steps[:, None].float() * freqs[None]
            t = self.time(torch.cat([angles.sin(), angles.cos()], -1).to(x.dtype))
            h, skips = self.inp(x), []
            for i, block in enumerate(self.down):
                h = block(h, t)
                skips.append(h)
                if i < len(self.down) - 1:
                    h = F.avg_pool2d(h, 2)
            h = self.attention(self.mid[0](h, t))
            h = self.mid[1](h, t)
            for i, block in enumerate(self.up):
                if i:
                    h = F.interpolate(h, scale_factor=2.0, mode="nearest")
                h = block(torch.cat([h, skips.pop()], 1), t)
            return self.outp(F.silu(self.norm(h)))

    return Net


def _optimizer(name: str, params):
    import torch
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-2)
    return torch.optim.AdamW(params, lr=1e-4)


def _checkpoint(net, how: str) -> None:
    """Activation checkpointing of all the repeated blocks (transformers' own switch
    where the model has one) or of every second one."""
    from vramkit.estimator import models, variants
    if how == "all" and getattr(net, "supports_gradient_checkpointing", False):
        models.checkpoint_every_block(net)
    elif how != "none":
        blocks = variants.repeated_blocks(net)
        variants.apply_checkpointing(net, blocks if how == "all" else blocks[::2])


def _workload(w, small: bool = False) -> Work:
    """The build() and step of workload ``w``; ``small``: tiny models and batches, for
    checking on a CPU that every workload builds and is estimated."""
    import torch
    family, precision, batch, size, optimizer, ckpt = w
    if small:
        batch, size = min(batch, 2), (16 if family in ("resnet50", "unet") else 32)
    amp = {"bf16-amp": torch.bfloat16, "fp16-amp": torch.float16}.get(precision)
    weights = torch.bfloat16 if precision == "bf16" else torch.float32
    text = family in _TEXT
    if family == "convnext":
        _vision_model(family, small, size)  # SkipWorkload now, not inside build()

    def build():
        if text:
            net, vocab = _text_model(family, small)
        else:
            net = _vision_model(family, small, size)
        net = net.to("cuda", dtype=weights)
        _checkpoint(net, ckpt)
        net.train()
        if text:
            ids = torch.randint(0, vocab, (batch, size), device="cuda")
            data = (ids, ids)
        elif family == "unet":
            data = (torch.randn(batch, 3, size, size, device="cuda", dtype=weights),
                    torch.randint(0, 1000, (batch,), device="cuda"))
        else:
            data = (torch.randn(batch, 3, size, size, device="cuda", dtype=weights),
                    torch.randint(0, 2, (batch,), device="cuda"))
        return net, _optimizer(optimizer, net.parameters()), data

    def step(net, opt, data):
        with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
            loss = _loss(family, net, data)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return Work(build, step)


def _loss(family: str, net, data):
    import torch.nn.functional as F
    inputs, labels = data
    if family in _TEXT:
        return net(input_ids=inputs, labels=labels).loss
    if family in ("vit", "resnet50"):
        return net(pixel_values=inputs, labels=labels).loss
    if family == "convnext":
        return F.cross_entropy(net(inputs).float(), labels)
    noise = inputs.new_empty(inputs.shape).normal_()
    return F.mse_loss(net(inputs + noise, labels).float(), noise.float())


def _key(w) -> str:
    family, precision, batch, size, optimizer, ckpt = w
    return (f"{family} {precision} b{batch}" + (f"x{size}" if family in _TEXT else "")
            + f" {optimizer}" + ("" if ckpt == "none" else f" ckpt-{ckpt}"))


_TEXT = ("gpt2", "llama", "mixtral", "bert", "t5")


def measure(allocator: str, workloads, work_of=_workload, key_of=_key) -> None:
    """One process, one allocator: the real steps, one JSON line each. ``work_of`` and
    ``key_of`` give a workload's build and step and its name (this file's by default;
    bench/estimate_families.py passes its own)."""
    if allocator == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if allocator == "vramkit":
        import vramkit
        import vramkit.torch
        vramkit.torch.install()
    import torch
    torch.manual_seed(0)
    if allocator == "vramkit":
        import vramkit
        peaks = lambda: (vramkit.max_memory_allocated(0), vramkit.max_memory_reserved(0))
        held = lambda: vramkit.memory_reserved(0)
        def reset():
            vramkit.empty_cache(0)
            vramkit.reset_peak_memory_stats(0)
    else:
        peaks = lambda: (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
        held = torch.cuda.memory_reserved
        def reset():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    if allocator == "native":
        _constants(torch)
    for w in workloads:
        try:
            work = work_of(w)
        except SkipWorkload as why:
            print(json.dumps({"workload": key_of(w), "allocator": allocator,
                              "skipped": str(why)}), flush=True)
            continue
        gc.collect()
        torch._C._cuda_clearCublasWorkspaces()
        reset()
        # What the cache could not give back before this step began (blocks earlier steps
        # left live): a peak that cannot fall below it.
        held_at_start = held()
        try:
            model, opt, batch = work.build()
            for _ in range(2):
                work.step(model, opt, batch)
            torch.cuda.synchronize()
            allocated, reserved = peaks()
            row = {"workload": key_of(w), "allocator": allocator, "peak_allocated": allocated,
                   "peak_reserved": reserved, "reserved_at_start": held_at_start,
                   **_segments(torch)}
        except torch.OutOfMemoryError:
            row = {"workload": key_of(w), "allocator": allocator, "oom": True}
        except Exception as error:  # noqa: BLE001 - one workload's failure is its row's
            row = {"workload": key_of(w), "allocator": allocator,
                   "error": f"{type(error).__name__}: {error}"[:300]}
        print(json.dumps(row), flush=True)
        del work
        model = opt = batch = None
        gc.collect()


def _segments(torch) -> dict:
    """What the allocator holds after the step, before anything is emptied: how many
    segments and the largest, which tells a large workspace kept in the cache from a
    spread of ordinary blocks when two allocators' peaks differ."""
    try:
        sizes = [s["total_size"] for s in torch.cuda.memory_snapshot()]
    except Exception as error:  # noqa: BLE001 - a figure to explain others, not one to fail on
        return {"segments_error": str(error)[:200]}
    return {"segments": len(sizes), "largest_segment": max(sizes, default=0)}


def _constants(torch) -> None:
    """The cuBLAS workspace a thread's first matrix product adds, and the context size."""
    import threading
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        mine = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                if p.pid == os.getpid()]
        context = mine[0] if mine else None
    except Exception as error:  # noqa: BLE001 - reported, not needed
        context = f"unavailable: {error}"
    print(json.dumps({"context": context, "total": total, "free": free}), flush=True)
    a = torch.randn(256, 256, device="cuda")
    before = torch.cuda.memory_allocated()
    a @ a
    main = torch.cuda.memory_allocated() - before
    other = {}

    def on_thread():
        b = torch.cuda.memory_allocated()
        a @ a
        other["bytes"] = torch.cuda.memory_allocated() - b

    t = threading.Thread(target=on_thread)
    t.start()
    t.join()
    x = torch.randn(64, 64, device="cuda", requires_grad=True)
    b = torch.cuda.memory_allocated()
    (x @ x).sum().backward()
    print(json.dumps({"workspace": main, "workspace_other_thread": other["bytes"],
                      "backward_adds": torch.cuda.memory_allocated() - b
                      - x.grad.numel() * 4}), flush=True)


def estimates(workloads, small: bool = False, stand_ins: bool = True, work_of=_workload,
              key_of=_key) -> None:
    """Each workload estimated on this machine: with fake CUDA tensors where there is a
    GPU, with the CPU stand-in (as a machine without one does), and with PyTorch's
    MemTracker on the GPU. ``small``: the tiny versions, to check every workload builds
    and is estimated. ``stand_ins=False``: the GPU's estimate only (the CPU stand-in and
    MemTracker left out), where a device call has time for little else."""
    import torch
    import vramkit
    from vramkit.estimator import UntraceableStep
    gpu = torch.cuda.is_available()
    for w in workloads:
        try:
            work = work_of(w, small)
        except SkipWorkload as why:
            print(json.dumps({"workload": key_of(w), "allocator": "estimate",
                              "skipped": str(why)}), flush=True)
            continue
        for emulate in ((False, True) if gpu and stand_ins else (not gpu,)):
            kind = "estimate-cpu" if emulate else "estimate"
            t0 = time.perf_counter()
            try:
                e = vramkit.estimate(work.step, build=work.build, device_memory="24G",
                                     emulate=emulate)
            except UntraceableStep as error:
                print(json.dumps({"workload": key_of(w), "allocator": kind,
                                  "error": str(error)[:300]}), flush=True)
                continue
            print(json.dumps({"workload": key_of(w), "allocator": kind,
                              "peak_allocated": e.peak_allocated,
                              "peak_reserved": e.peak_reserved,
                              "torch_peak_reserved": e.torch_peak_reserved,
                              "torch_expandable_peak_reserved":
                                  e.torch_expandable_peak_reserved,
                              "torch_peak_allocated": e.torch_peak_allocated,
                              "torch_expandable_peak_allocated":
                                  e.torch_expandable_peak_allocated,
                              # Where the peak is, to compare the two paths by:
                              "breakdown": e.breakdown,
                              "top_sites": [list(site) for site in e.top_sites[:6]],
                              "seconds": round(time.perf_counter() - t0, 2)}), flush=True)
        if gpu and stand_ins:
            _memtracker(w, work, key_of)


def _memtracker(w, work, key_of=_key) -> None:
    """PyTorch's MemTracker under fake tensors: peak allocated only."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from vramkit.estimator._moves import fake_module_moves
    t0 = time.perf_counter()
    try:
        # The build moves its fake model with .to("cuda"), which PyTorch refuses for
        # tensors its fake mode holds weak references to; the estimator's moves do it.
        with FakeTensorMode(allow_non_fake_inputs=True), fake_module_moves():
            model, opt, batch = work.build()
            tracker = MemTracker()
            tracker.track_external(model, opt)
            peak = 0
            with tracker:
                for _ in range(2):  # MemTracker wants its module statistics reset per step
                    work.step(model, opt, batch)
                    snap = tracker.get_tracker_snapshot("peak")[torch.device("cuda", 0)]
                    peak = max(peak, snap["Total"])
                    tracker.reset_mod_stats()
    except Exception as error:  # noqa: BLE001 - MemTracker's failures are its own
        print(json.dumps({"workload": key_of(w), "allocator": "memtracker",
                          "error": f"{type(error).__name__}: {error}"[:300]}), flush=True)
        return
    print(json.dumps({"workload": key_of(w), "allocator": "memtracker",
                      "peak_allocated": peak,
                      "seconds": round(time.perf_counter() - t0, 2)}), flush=True)


def _finder_workload(f, batch):
    from vramkit.estimator import models
    model, precision, seq = f
    return models.workload(model, batch, seq=seq or 1024, precision=precision)


def predict_batches(finders) -> dict:
    """Largest batch under CAP by the estimate, for vramkit and PyTorch's allocator."""
    import vramkit
    from vramkit.estimator import predict_largest
    out = {}
    for f in finders:
        cache = {}

        def est(n, f=f, cache=cache):
            if n not in cache:
                w = _finder_workload(f, n)
                cache[n] = vramkit.estimate(w.step, build=w.build, memory_limit=CAP)
            return cache[n]
        t0 = time.perf_counter()
        for allocator, attr in (("vramkit", "fits"), ("native", "torch_fits")):
            best = predict_largest(est, attr)
            out[f"{f[0]} {f[1]} {allocator}"] = best
            print(json.dumps({"finder": f"{f[0]} {f[1]}", "allocator": allocator,
                              "predicted": best, "estimates": len(cache),
                              "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    return out


def measure_batches(allocator: str, predicted: dict, finders) -> None:
    """Largest batch under CAP by real steps, starting from the prediction."""
    if allocator == "vramkit":
        import vramkit.torch
        vramkit.torch.install()
    from vramkit.estimator import _measure
    for f in finders:
        guess = predicted.get(f"{f[0]} {f[1]} {allocator}") or 1
        tries = []

        def make_batch(n, f=f):
            tries.append(n)
            w = _finder_workload(f, n)
            make_batch.step = w.step
            return w.build()

        def step(model, opt, batch):
            make_batch.step(model, opt, batch)

        t0 = time.perf_counter()
        best = _measure.largest_batch(step, make_batch, guess, CAP, 4096)
        print(json.dumps({"finder": f"{f[0]} {f[1]}", "allocator": allocator,
                          "measured": best, "tries": tries,
                          "seconds": round(time.perf_counter() - t0, 1)}), flush=True)


def check_plan() -> None:
    """The checkpoint planner on the card: GPT-2 fp32 at batch 8 (15.8 GB at its peak)
    under a 10 GiB cap. The planned blocks are checkpointed in the real model and two
    real steps run under vramkit with the cap; without the plan the step runs out."""
    import vramkit
    import vramkit.torch
    vramkit.torch.install()
    import torch
    from vramkit.estimator import models, variants
    cap = 10 << 30
    work = models.workload("gpt2", 8, seq=1024, precision="fp32")
    t0 = time.perf_counter()
    plan = vramkit.plan_checkpointing(work.step, build=work.build, memory_limit=cap)
    seconds = round(time.perf_counter() - t0, 1)
    vramkit.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(0).total_memory, 0)
    results = {}
    for label, names in (("planned", plan.names), ("none", [])):
        gc.collect()
        vramkit.empty_cache(0)
        vramkit.reset_peak_memory_stats(0)
        try:
            with torch.device("cuda"):
                model, opt, batch = work.build()
            variants.apply_checkpointing(model, names)
            for _ in range(2):
                work.step(model, opt, batch)
            torch.cuda.synchronize()
            results[label] = {"ok": True, "peak_reserved": vramkit.max_memory_reserved(0)}
        except torch.OutOfMemoryError:
            results[label] = {"ok": False}
        model = opt = batch = None
    print(json.dumps({"plan": plan.names, "blocks": plan.blocks, "seconds": seconds,
                      "predicted_peak_reserved": plan.estimate.peak_reserved,
                      "cap": cap, **{f"real_{k}": v for k, v in results.items()}}), flush=True)


def _pct(estimate, real) -> str:
    if not estimate or not real:
        return "-"
    return f"{100.0 * (estimate - real) / real:+.2f}%"


def table(rows: list[dict]) -> str:
    """Each estimate against the real figure of the allocator it predicts: peak allocated
    as each allocator counts it (PyTorch's large pool counts unsplit remainders, vramkit
    and expandable segments do not), then peak reserved. MemTracker's allocated is set
    against PyTorch's, the figure it aims at."""
    by = {}
    for r in rows:
        if "workload" in r:
            by.setdefault(r["workload"], {})[r["allocator"]] = r
    gb = lambda n: f"{n / 1e9:.2f}" if n else "-"
    out = ["| workload | allocated PyTorch | est. | CPU stand-in | MemTracker | "
           "allocated vramkit | est. | allocated expandable | est. | "
           "reserved PyTorch | est. | expandable | est. | vramkit | est. |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in by.items():
        nat, exp, vk = r.get("native", {}), r.get("expandable", {}), r.get("vramkit", {})
        est, cpu, mt = r.get("estimate", {}), r.get("estimate-cpu", {}), r.get("memtracker", {})
        real = nat.get("peak_allocated")
        out.append(" | ".join([
            f"| {name}", gb(real), _pct(est.get("torch_peak_allocated"), real),
            _pct(cpu.get("torch_peak_allocated"), real), _pct(mt.get("peak_allocated"), real),
            gb(vk.get("peak_allocated")), _pct(est.get("peak_allocated"),
                                              vk.get("peak_allocated")),
            gb(exp.get("peak_allocated")), _pct(est.get("torch_expandable_peak_allocated"),
                                               exp.get("peak_allocated")),
            gb(nat.get("peak_reserved")), _pct(est.get("torch_peak_reserved"),
                                              nat.get("peak_reserved")),
            gb(exp.get("peak_reserved")), _pct(est.get("torch_expandable_peak_reserved"),
                                              exp.get("peak_reserved")),
            gb(vk.get("peak_reserved")), _pct(est.get("peak_reserved"),
                                             vk.get("peak_reserved")) + " |"]))
    return "\n".join(out)


def _estimates_only(workloads, small: bool) -> int:
    """--estimates-only: every workload estimated here, then a count of those that were
    (and those skipped, with why); exit status 1 if one could not be estimated."""
    import contextlib
    import io
    rows = []
    for w in workloads:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            estimates([w], small)
        for line in out.getvalue().splitlines():
            row = json.loads(line)
            rows.append(row)
            print(line, flush=True)
    done = {r["workload"] for r in rows if "peak_allocated" in r}
    skipped = {r["workload"]: r["skipped"] for r in rows if "skipped" in r}
    failed = {r["workload"] for r in rows if "error" in r} - done
    print(f"{len(done)} of {len(workloads)} workloads built and estimated"
          + (" (small sizes)" if small else "")
          + "".join(f"; skipped {k}: {v}" for k, v in skipped.items())
          + "".join(f"; FAILED {k}" for k in sorted(failed)))
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--only", default=None,
                        help="only workloads whose name has one of these (comma-separated)")
    parser.add_argument("--skip", default=None,
                        help="leave out workloads whose name has one of these (comma-separated)")
    parser.add_argument("--table", nargs="+", metavar="JSONL", default=None,
                        help="print the table of rows saved earlier (each role's JSON lines, "
                             "from runs split across device calls), measure nothing")
    parser.add_argument("--role", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--skip-finder", action="store_true")
    parser.add_argument("--plan-only", action="store_true")
    parser.add_argument("--skip-plan", action="store_true")
    parser.add_argument("--without-stand-ins", action="store_true",
                        help="with --role estimate: the GPU's estimates only, without the "
                             "CPU stand-in's and MemTracker's")
    parser.add_argument("--estimates-only", action="store_true",
                        help="estimate each workload in this process, measure nothing "
                             "(no GPU needed)")
    parser.add_argument("--small", action="store_true",
                        help="tiny models and batches: checks on a CPU that every "
                             "workload builds and is estimated")
    args = parser.parse_args()
    wanted = args.only.split(",") if args.only else None
    unwanted = args.skip.split(",") if args.skip else []
    workloads = [w for w in WORKLOADS if (not wanted or any(x in _key(w) for x in wanted))
                 and not any(x in _key(w) for x in unwanted)]
    if args.table:
        rows = []
        for path in args.table:
            with open(path) as f:
                rows += [json.loads(line) for line in f if line.startswith("{")]
        print(table(rows))
        return 0
    if args.estimates_only:
        return _estimates_only(workloads, args.small)
    finders = [f for f in FINDER if not wanted or any(x in f"{f[0]} {f[1]}" for x in wanted)]
    if args.role == "estimate":
        estimates(workloads, stand_ins=not args.without_stand_ins)
        return 0
    if args.role == "plan":
        check_plan()
        return 0
    if args.role == "predict":
        predict_batches(finders)
        return 0
    if args.role and args.role.startswith("finder-"):
        measure_batches(args.role[len("finder-"):], json.loads(os.environ["PREDICTED"]),
                        finders)
        return 0
    if args.role:
        measure(args.role, workloads)
        return 0
    rows = []
    roles = [] if args.skip_accuracy else ["native", "expandable", "vramkit", "estimate"]
    if not args.skip_finder:
        roles += ["predict", "finder-native", "finder-vramkit"]
    if not args.skip_plan:
        roles += ["plan"]
    if args.plan_only:
        roles = ["plan"]
    predicted = {}
    for role in roles:
        cmd = ([sys.executable, __file__, "--role", role]
               + (["--only", args.only] if args.only else [])
               + (["--skip", args.skip] if args.skip else []))
        env = dict(os.environ, PREDICTED=json.dumps(predicted))
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        sys.stderr.write(proc.stderr[-3000:])
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                rows.append(row)
                if "predicted" in row:
                    predicted[f"{row['finder']} {row['allocator']}"] = row["predicted"]
                print(line, flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "estimate_check.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

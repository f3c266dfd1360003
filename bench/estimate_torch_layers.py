"""estimate_torch_layers.py - steps built from torch.nn's own layers, real and estimated.

The checks of bench/estimate_check.py and bench/estimate_families.py take their models
from transformers, timm and torchvision. These four are written with torch.nn alone, as
a user writes a model of their own: a two-layer nn.LSTM, a six-layer
nn.TransformerEncoder under bf16 autocast with a padding mask, an nn.EmbeddingBag of a
million rows, and a small nn.Conv3d network. Each is run in its own process per role,
so that no allocator sees another's memory:

    python3 bench/estimate_torch_layers.py ROLE [NAME]

ROLE is "native" (PyTorch's caching allocator), "expandable" (the same; set
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), "vramkit" (vramkit.torch.install())
or "estimate" (vramkit.estimate on this machine: on a GPU its fake CUDA tensors, without
one the CPU stand-in). A real role runs two steps from a fresh model and prints peak
allocated and reserved; one JSON line per step, with "error" where it could not run.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch import nn


def lstm():
    def build():
        net = nn.LSTM(512, 1024, num_layers=2, batch_first=True).to("cuda")
        head = nn.Linear(1024, 10).cuda()
        opt = torch.optim.Adam(list(net.parameters()) + list(head.parameters()))
        return (net, head), opt, torch.randn(32, 256, 512, device="cuda")

    def step(models, opt, x):
        net, head = models
        out, _ = net(x)
        head(out[:, -1]).sum().backward()
        opt.step()
        opt.zero_grad()
    return build, step


def encoder():
    def build():
        layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
        net = nn.TransformerEncoder(layer, 6).cuda()
        opt = torch.optim.AdamW(net.parameters())
        x = torch.randn(16, 512, 512, device="cuda")
        padding = torch.zeros(16, 512, dtype=torch.bool, device="cuda")
        padding[:, 400:] = True
        return net, opt, (x, padding)

    def step(net, opt, batch):
        x, padding = batch
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = net(x, src_key_padding_mask=padding)
        y.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return build, step


def embedding_bag():
    def build():
        net = nn.EmbeddingBag(1_000_000, 128, mode="sum").cuda()
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        indices = torch.randint(0, 1_000_000, (4096 * 20,), device="cuda")
        offsets = torch.arange(0, 4096 * 20, 20, device="cuda")
        return net, opt, (indices, offsets)

    def step(net, opt, batch):
        net(*batch).sum().backward()
        opt.step()
        opt.zero_grad()
    return build, step


def conv3d():
    def build():
        net = nn.Sequential(nn.Conv3d(3, 32, 3, padding=1), nn.BatchNorm3d(32), nn.ReLU(),
                            nn.Conv3d(32, 64, 3, stride=2, padding=1),
                            nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(64, 5)).cuda()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        return net, opt, (torch.randn(4, 3, 32, 112, 112, device="cuda"),
                          torch.randint(0, 5, (4,), device="cuda"))

    def step(net, opt, batch):
        x, y = batch
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        opt.zero_grad()
    return build, step


STEPS = {"lstm": lstm, "encoder": encoder, "embedding_bag": embedding_bag, "conv3d": conv3d}
ROLES = ("native", "expandable", "vramkit", "estimate")


def run(role: str, name: str) -> dict:
    build, step = STEPS[name]()
    if role == "estimate":
        import vramkit
        e = vramkit.estimate(step, build=build)
        return {"peak_allocated": e.peak_allocated, "peak_reserved": e.peak_reserved,
                "torch_peak_reserved": e.torch_peak_reserved,
                "torch_expandable_peak_reserved": e.torch_expandable_peak_reserved}
    if role == "vramkit":
        import vramkit.torch
        vramkit.torch.install()
    torch.cuda.reset_peak_memory_stats()
    net, opt, batch = build()
    for _ in range(2):
        step(net, opt, batch)
    torch.cuda.synchronize()
    return {"peak_allocated": torch.cuda.max_memory_allocated(),
            "peak_reserved": torch.cuda.max_memory_reserved()}


def main() -> int:
    if len(sys.argv) not in (2, 3) or sys.argv[1] not in ROLES or \
            (len(sys.argv) == 3 and sys.argv[2] not in STEPS):
        print(f"usage: estimate_torch_layers.py {{{','.join(ROLES)}}} "
              f"[{'|'.join(STEPS)}]", file=sys.stderr)
        return 2
    role = sys.argv[1]
    if role == "expandable" and "expandable_segments:True" not in \
            os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        print("expandable: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
              file=sys.stderr)
        return 2
    for name in [sys.argv[2]] if len(sys.argv) == 3 else list(STEPS):
        try:
            row = run(role, name)
        except Exception as error:  # noqa: BLE001 - a row that says why, and the rest go on
            row = {"error": f"{type(error).__name__}: {str(error)[:400]}"}
        print(json.dumps({"workload": name, "role": role, **row}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

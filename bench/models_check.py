"""models_check.py - issue 14's steady-state targets on models other than GPT-2, on a GPU
machine: step time, peak memory and driver calls once the loop repeats itself, for
PyTorch's allocator (native and expandable_segments) and vramkit (its default source,
vmm, and with --only the other settings of bench/fit_check.py or the managed source), each
in a fresh process, side by side in one run.

The models (random weights, nothing downloaded):
  - resnet50_train: torchvision ResNet-50, SGD with momentum, bf16 autocast, batch 64 of
    224 x 224 images, 16 steps; the loop repeats itself from the second step, so driver
    calls are counted over the steps after the second.
  - bert_infer_varlen: transformers BERT-base in inference mode under bf16 autocast, batch
    32, sequence lengths cycling through six values; the loop repeats itself from the second
    cycle, so driver calls are counted over the cycles after the first.
More models, by name with --models (first run on an H200 on 2026-12-01 with --trace-dir,
docs/performance.md):
  - vit_train: torchvision ViT-B/16, AdamW, bf16 autocast, batch 32, 12 steps.
  - gpt2_train_varlen: transformers GPT-2 (6 layers) trained with AdamW under bf16 autocast,
    batch 8, sequence lengths cycling through six values as dynamic padding gives them; the
    loop repeats itself from the second cycle.
  - llama_decode: a transformers Llama of 8 layers (hidden 1024, bf16) generating 128
    tokens greedily after a 128-token prompt, batch 8, six generations; its key-value
    cache grows by one token a step, so every token asks for larger blocks than the last.
Driver calls are also counted over the last half of the steps alone, where a pool that
settles late shows none. Step time is the median of the steps after the warm-up; peak
reserved and allocated are the allocator's own maxima over the run.

    python3 bench/models_check.py [--only native,vramkit] [--models resnet50_train]
                                  [--rounds 3] [--trace-dir DIR]

One JSON line per result on stdout, then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fit_check import ALLOCATORS, _stats  # noqa: E402  (one list of allocators for both)

# Unified memory too, here alone: these models hold a few GB, far from the card's free
# memory, while fit_check's batch search would push a managed pool towards oversubscription.
ALLOCATORS = dict(ALLOCATORS, **{"vramkit-managed": {"VRAMKIT_SOURCE": "managed"}})

BERT_LENGTHS = (128, 384, 256, 512, 64, 320)


def _image_classifier_train(model, opt, batch):
    """One step of a torchvision classifier under bf16 autocast, on a fixed random batch of
    224 x 224 images."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")

    def step(i):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _resnet50_train():
    import torch
    import torchvision

    model = torchvision.models.resnet50(weights=None).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return _image_classifier_train(model, opt, 64), 16, 2


def _bert_infer_varlen():
    import torch
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig()).cuda().eval()
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 30522, (32, n), generator=gen).cuda() for n in BERT_LENGTHS]

    def step(i):
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            model(input_ids=batches[i % len(batches)]).last_hidden_state.sum().item()

    return step, 3 * len(BERT_LENGTHS), len(BERT_LENGTHS)


def _vit_train():
    import torch
    import torchvision

    model = torchvision.models.vit_b_16(weights=None).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return _image_classifier_train(model, opt, 32), 12, 2


GPT2_LENGTHS = (256, 512, 384, 128, 1024, 640)


def _gpt2_train_varlen():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=6)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 50257, (8, n), generator=gen).cuda() for n in GPT2_LENGTHS]

    def step(i):
        ids = batches[i % len(batches)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, 3 * len(GPT2_LENGTHS), len(GPT2_LENGTHS)


def _llama_decode():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                         num_hidden_layers=8, num_attention_heads=16,
                         num_key_value_heads=16, max_position_embeddings=1024)
    model = LlamaForCausalLM(config).cuda().to(torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 32000, (8, 128), generator=gen).cuda()

    def step(i):
        with torch.inference_mode():
            model.generate(prompt, attention_mask=torch.ones_like(prompt),
                           max_new_tokens=128, min_new_tokens=128, do_sample=False,
                           pad_token_id=0)

    return step, 6, 2


MODELS = {"resnet50_train": _resnet50_train, "bert_infer_varlen": _bert_infer_varlen,
          "vit_train": _vit_train, "gpt2_train_varlen": _gpt2_train_varlen,
          "llama_decode": _llama_decode}


def child(allocator: str, model: str, trace_dir: str | None) -> None:
    if allocator.startswith("vramkit"):
        import vramkit
        import vramkit.torch
        vramkit.torch.install()
        if trace_dir:
            vramkit.record_memory_history("all", stacks=None, max_entries=4_000_000)
    import torch

    torch.manual_seed(0)
    step, steps, warm = MODELS[model]()
    times, calls_by_step = [], []  # calls_by_step[i]: driver calls up to the end of step i
    for i in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(i)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        calls_by_step.append(_stats(allocator)[0])
    calls, allocated, reserved = _stats(allocator)
    if trace_dir and allocator.startswith("vramkit"):
        vramkit.save_trace(os.path.join(trace_dir, f"{model}.{allocator}.trace.gz"))
    print(json.dumps({"model": model, "allocator": allocator,
                      "step_ms": round(statistics.median(times[warm:]) * 1e3, 2),
                      "peak_reserved": reserved, "peak_allocated": allocated,
                      "calls_after_warmup": calls - calls_by_step[warm - 1],
                      "calls_last_half": calls - calls_by_step[steps - steps // 2 - 1],
                      "calls_per_step": [c - p for c, p in
                                         zip(calls_by_step, [0] + calls_by_step[:-1])],
                      "steps": steps,
                      "warmup_steps": warm}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="native,expandable,vramkit,vramkit-vmm")
    ap.add_argument("--models", default="resnet50_train,bert_infer_varlen",
                    help=f"a comma-separated list of: {', '.join(MODELS)}")
    ap.add_argument("--trace-dir", help="also save each vramkit run as a trace (vramkit "
                    "replay reads it) in this folder; recording slows vramkit's steps, so "
                    "their times are not comparable with the others'")
    ap.add_argument("--rounds", type=int, default=1, help="run every allocator this many "
                    "times, alternated, each in a fresh process; the table shows the "
                    "median step time")
    ap.add_argument("--child", nargs=2, metavar=("ALLOCATOR", "MODEL"))
    a = ap.parse_args()
    if a.child:
        child(*a.child, a.trace_dir)
        return
    rows = []
    for rnd in range(a.rounds):
        for model in a.models.split(","):
            for allocator in a.only.split(","):
                row = run_child(allocator, model, a.trace_dir if rnd == 0 else None)
                row["round"] = rnd
                print(json.dumps(row), flush=True)
                if "error" not in row:
                    rows.append(row)
    # One line per model and allocator: the median step time over the rounds; the memory
    # figures and calls of the first round (the same in every round on one machine).
    print(f"\n{'model':<18} {'allocator':<12} {'step ms':>8} {'reserved GB':>12} "
          f"{'allocated GB':>13} {'calls after warm-up':>20} {'in the last half':>17}")
    seen = {}
    for r in rows:
        seen.setdefault((r["model"], r["allocator"]), []).append(r)
    for (model, allocator), runs in seen.items():
        r = runs[0]
        step = statistics.median(x["step_ms"] for x in runs)
        print(f"{model:<18} {allocator:<12} {step:>8.2f} "
              f"{r['peak_reserved'] / 1e9:>12.3f} {r['peak_allocated'] / 1e9:>13.3f} "
              f"{r['calls_after_warmup']:>20} {r['calls_last_half']:>17}")


def run_child(allocator: str, model: str, trace_dir: str | None) -> dict:
    env = dict(os.environ, **ALLOCATORS[allocator])
    extra = ["--trace-dir", trace_dir] if trace_dir else []
    p = subprocess.run([sys.executable, __file__, "--child", allocator, model, *extra],
                       env=env, capture_output=True, text=True, timeout=600)
    line = p.stdout.strip().splitlines()[-1:] if p.returncode == 0 else []
    if not line:
        return {"model": model, "allocator": allocator,
                "error": p.stderr.strip().splitlines()[-1:]}
    return json.loads(line[0])

if __name__ == "__main__":
    main()

"""Estimates of steps from families the estimator was never checked on, against the real
steps on the GPU, side by side in one run.

bench/estimate_check.py's 27 workloads are the ones the estimator's work was measured
on. These are others, each written as a user writes it (built on the CPU, moved with
``.to("cuda")`` or ``.cuda()``, autocast around the forward pass): decoders of other
families (Qwen2, GPT-NeoX, OPT, a mixture of experts of Qwen3's), encoders (RoBERTa,
DeBERTa-v2, DistilBERT), an encoder-decoder (BART), torchvision's and timm's convnets
and vision transformers (Swin, EfficientNet, DenseNet, MobileNetV3, RegNet, ConvNeXt-V2,
a ViT with timm's own checkpointing), a segmentation model, gradient accumulation over
micro-batches, inference under ``torch.no_grad()`` and KV-cache generation; and steps
that select by values the estimate cannot know (a loss over the tokens that are not
padding, over the pixels that are not "ignore"; detectors matching boxes to anchors). Each runs
under PyTorch's allocator, expandable segments and vramkit, each allocator in its own
process, and is estimated on the same machine; the table is estimate_check.py's.

    python3 bench/estimate_families.py --out DIR [--only swin,bart] [--skip ...]
    python3 bench/estimate_families.py --estimates-only --small   # any machine

Needs a CUDA GPU, PyTorch, torchvision, transformers, timm and vramkit; --small
--estimates-only needs no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import estimate_check  # noqa: E402  (this folder's module, found by the line above)

# name: (builder, precision, batch, size). Builders import inside: the measuring
# processes set the allocator's settings before PyTorch is imported.
FAMILIES = {
    "qwen2-0.5b bf16-amp b4x1024 adamw": ("qwen2", "bf16-amp", 4, 1024),
    "pythia-410m fp16-amp b8x1024 adamw ckpt-all": ("neox", "fp16-amp", 8, 1024),
    "opt-125m fp32 b8x1024 adamw": ("opt", "fp32", 8, 1024),
    "qwen3-moe bf16-amp b4x1024 adamw": ("moe", "bf16-amp", 4, 1024),
    "roberta-base fp16-amp b32x512 adamw accumulate-4": ("roberta", "fp16-amp", 32, 512),
    "deberta-v2-base bf16-amp b16x512 adamw": ("deberta", "bf16-amp", 16, 512),
    "distilbert fp32 b64x512 sgd": ("distilbert", "fp32", 64, 512),
    "bart-base fp32 b16x512 adamw": ("bart", "fp32", 16, 512),
    "swin-t bf16-amp b64 adamw": ("swin", "bf16-amp", 64, 224),
    "efficientnet-b0 fp16-amp b128 sgd": ("efficientnet", "fp16-amp", 128, 224),
    "densenet121 fp32 b32 sgd": ("densenet", "fp32", 32, 224),
    "mobilenet-v3-large fp16-amp b256 sgd": ("mobilenet", "fp16-amp", 256, 224),
    "regnety-016 fp32 b64 sgd": ("regnet", "fp32", 64, 224),
    "convnextv2-nano bf16-amp b64 adamw": ("convnextv2", "bf16-amp", 64, 224),
    "vit-small bf16-amp b128 adamw ckpt-timm": ("vit_small", "bf16-amp", 128, 224),
    "fcn-resnet50 bf16-amp b8 512px sgd": ("fcn", "bf16-amp", 8, 512),
    "qwen2-0.5b bf16 inference b16x1024": ("qwen2_infer", "bf16", 16, 1024),
    "pythia-410m fp16 generate b8 512+64": ("neox_generate", "fp16", 8, 512),
    # Selections by values the estimate cannot know, taken at their largest: a loss over
    # the tokens that are not padding (a quarter is), over the pixels that are not
    # "ignore" (a tenth is), and detectors that match boxes to anchors.
    "bert-base token-classes fp32 b32x512 adamw masked-loss": ("tokens", "fp32", 32, 512),
    "fcn-resnet50 masked-pixels fp32 b8 512px sgd": ("fcn_masked", "fp32", 8, 512),
    "ssdlite320 fp32 b32 sgd": ("ssdlite", "fp32", 32, 320),
    "maskrcnn-resnet50-fpn fp32 b2 512px sgd": ("maskrcnn", "fp32", 2, 512),
}

_DECODERS = {"qwen2", "neox", "opt", "moe", "qwen2_infer", "neox_generate"}
_ENCODERS = {"roberta", "deberta", "distilbert", "tokens"}
_DETECTORS = {"ssdlite", "maskrcnn"}


def _text(kind: str, small: bool):
    import transformers as t
    tiny = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, vocab_size=1000)
    if kind in ("qwen2", "qwen2_infer"):
        shape = (dict(tiny, num_key_value_heads=2) if small else
                 dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                      tie_word_embeddings=True))
        return t.Qwen2ForCausalLM(t.Qwen2Config(**shape))
    if kind in ("neox", "neox_generate"):
        shape = tiny if small else dict(hidden_size=1024, intermediate_size=4096,
                                        num_hidden_layers=24, num_attention_heads=16,
                                        vocab_size=50304)
        return t.GPTNeoXForCausalLM(t.GPTNeoXConfig(**shape))
    if kind == "opt":
        shape = (dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                      vocab_size=1000, word_embed_proj_dim=64) if small else {})
        return t.OPTForCausalLM(t.OPTConfig(**shape))
    if kind == "moe":
        shape = (dict(tiny, num_key_value_heads=2, moe_intermediate_size=64) if small else
                 dict(hidden_size=512, intermediate_size=1536, moe_intermediate_size=384,
                      num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                      vocab_size=32000))
        return t.Qwen3MoeForCausalLM(t.Qwen3MoeConfig(num_experts=16, num_experts_per_tok=2,
                                                      **shape))
    if kind == "roberta":  # roberta-base's 514 positions: 512 tokens after the pad offset
        return t.RobertaForMaskedLM(t.RobertaConfig(max_position_embeddings=514,
                                                    **(tiny if small else {})))
    if kind == "deberta":  # DebertaV2Config() is the 900M xlarge; this is the base's shape
        shape = tiny if small else dict(hidden_size=768, intermediate_size=3072,
                                        num_hidden_layers=12, num_attention_heads=12)
        return t.DebertaV2ForMaskedLM(t.DebertaV2Config(**shape))
    if kind == "tokens":  # bert-base with a head of 9 token classes
        return t.BertForTokenClassification(t.BertConfig(num_labels=9,
                                                         **(tiny if small else {})))
    if kind == "distilbert":
        shape = (dict(dim=64, hidden_dim=128, n_layers=2, n_heads=4, vocab_size=1000)
                 if small else {})
        return t.DistilBertForMaskedLM(t.DistilBertConfig(**shape))
    # bart-base's published shape is BartConfig's default but for its 6+6 layers.
    shape = (dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                  vocab_size=1000) if small else
             dict(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                  decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072))
    return t.BartForConditionalGeneration(t.BartConfig(**shape))


def _vision(kind: str, small: bool):
    import timm
    import torchvision.models as tv
    if kind == "swin":
        return tv.swin_t(num_classes=10) if small else tv.swin_t()
    if kind == "efficientnet":
        return tv.efficientnet_b0()
    if kind == "densenet":
        return tv.densenet121()
    if kind == "mobilenet":
        return tv.mobilenet_v3_large()
    if kind == "regnet":
        return timm.create_model("regnety_016")
    if kind == "convnextv2":
        return timm.create_model("convnextv2_nano", drop_path_rate=0.1)
    if kind == "vit_small":
        net = timm.create_model("vit_small_patch16_224")
        net.set_grad_checkpointing(True)
        return net
    if kind == "ssdlite":
        return tv.detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None,
                                                          num_classes=5)
    if kind == "maskrcnn":
        return tv.detection.maskrcnn_resnet50_fpn(weights=None, weights_backbone=None,
                                                  num_classes=5, min_size=512, max_size=512)
    return tv.segmentation.fcn_resnet50(weights=None, weights_backbone=None, num_classes=21)


def _detection_targets(batch: int, size: int, masks: bool):
    """Two boxes per image, of class 1 and 2 (with their masks for Mask R-CNN)."""
    import torch
    boxes = torch.tensor([[0.1, 0.1, 0.4, 0.5], [0.3, 0.2, 0.9, 0.8]], device="cuda") * size
    targets = []
    for _ in range(batch):
        t = {"boxes": boxes.clone(), "labels": torch.tensor([1, 2], device="cuda")}
        if masks:
            t["masks"] = torch.zeros(2, size, size, dtype=torch.uint8, device="cuda")
            for i, (x0, y0, x1, y1) in enumerate(boxes.long().tolist()):
                t["masks"][i, y0:y1, x0:x1] = 1
        targets.append(t)
    return targets


def work_of(name: str, small: bool = False):
    """The build() and step of the workload ``name``, as its user writes them."""
    import torch
    kind, precision, batch, size = FAMILIES[name]
    if small:
        # timm's ViT is made for 224-pixel images; the rest take smaller ones.
        batch, size = min(batch, 2), (32 if kind in _DECODERS | _ENCODERS | {"bart"}
                                      else 224 if kind == "vit_small" else 64)
    amp = {"bf16-amp": torch.bfloat16, "fp16-amp": torch.float16}.get(precision)
    weights = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    text = kind in _DECODERS | _ENCODERS or kind == "bart"
    training = kind not in ("qwen2_infer", "neox_generate")

    def build():
        net = _text(kind, small) if text else _vision(kind, small)
        # Half the moves through .cuda(), half through .to(): both are how users write it.
        net = net.cuda().to(dtype=weights) if kind in _ENCODERS else \
            net.to("cuda", dtype=weights)
        if kind == "neox":
            net.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        if not training:
            return net.eval(), None, torch.randint(0, 1000, (batch, size), device="cuda")
        net.train()
        if "sgd" in name:
            opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
        else:
            opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
        if kind == "tokens":  # the last quarter of each sequence is padding
            ids = torch.randint(0, net.config.vocab_size, (batch, size), device="cuda")
            attention = torch.ones(batch, size, dtype=torch.long, device="cuda")
            attention[:, size * 3 // 4:] = 0
            data = (ids, attention, torch.randint(0, 9, (batch, size), device="cuda"))
        elif text:
            vocab = net.config.vocab_size
            data = torch.randint(0, vocab, (batch, size), device="cuda")
        elif kind in _DETECTORS:
            data = ([torch.rand(3, size, size, device="cuda") for _ in range(batch)],
                    _detection_targets(batch, size, masks=kind == "maskrcnn"))
        else:
            data = (torch.randn(batch, 3, size, size, device="cuda"),
                    torch.randint(0, 10 if small else 21 if "fcn" in kind else 1000,
                                  (batch,), device="cuda"))
        return net, opt, data

    def loss_of(net, data):
        if kind == "tokens":  # the loss over the tokens that are not padding
            ids, attention, labels = data
            logits = net(input_ids=ids, attention_mask=attention).logits
            active = attention.view(-1) == 1
            return torch.nn.functional.cross_entropy(
                logits.view(-1, logits.shape[-1])[active], labels.view(-1)[active])
        if text:
            return net(input_ids=data, labels=data).loss
        if kind in _DETECTORS:
            return sum(net(*data).values())
        images, labels = data
        out = net(images)
        if kind in ("fcn", "fcn_masked"):  # per-pixel classes: each image's label everywhere
            out = out["out"]
            per_pixel = labels[:, None, None].expand(-1, *out.shape[2:])
            if kind == "fcn_masked":  # a tenth of the pixels, a band at the top, "ignore"
                per_pixel = per_pixel.clone()
                per_pixel[:, :out.shape[2] // 10] = 255
                valid = per_pixel != 255
                return torch.nn.functional.cross_entropy(
                    out.float().permute(0, 2, 3, 1)[valid], per_pixel[valid])
            return torch.nn.functional.cross_entropy(
                out.float(), per_pixel)
        return torch.nn.functional.cross_entropy(out.float(), labels)

    def step(net, opt, data):
        if kind == "qwen2_infer":
            with torch.no_grad():
                net(input_ids=data).logits.float().softmax(-1).max()
            return
        if kind == "neox_generate":
            with torch.no_grad():
                net.generate(data, max_new_tokens=64, min_new_tokens=64, do_sample=False,
                             pad_token_id=0)
            return
        micro = 4 if "accumulate" in name else 1
        for part in (data.chunk(micro) if micro > 1 else (data,)):
            with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
                loss = loss_of(net, part) / micro
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return estimate_check.Work(build, step)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--only", default=None, help="names with one of these (comma-separated)")
    parser.add_argument("--skip", default=None, help="leave out names with one of these")
    parser.add_argument("--role", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--estimates-only", action="store_true",
                        help="estimate each workload in this process, measure nothing")
    parser.add_argument("--small", action="store_true",
                        help="tiny models and batches (with --estimates-only, on a CPU)")
    args = parser.parse_args()
    wanted = args.only.split(",") if args.only else None
    unwanted = args.skip.split(",") if args.skip else []
    names = [n for n in FAMILIES if (not wanted or any(x in n for x in wanted))
             and not any(x in n for x in unwanted)]
    key_of = lambda n: n  # noqa: E731
    if args.estimates_only or args.role == "estimate":
        estimate_check.estimates(names, small=args.small, stand_ins=False,
                                 work_of=work_of, key_of=key_of)
        return 0
    if args.role:
        estimate_check.measure(args.role, names, work_of=work_of, key_of=key_of)
        return 0
    rows = []
    for role in ("native", "expandable", "vramkit", "estimate"):
        cmd = [sys.executable, __file__, "--role", role] + \
            (["--only", args.only] if args.only else []) + \
            (["--skip", args.skip] if args.skip else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        sys.stderr.write(proc.stderr[-3000:])
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                rows.append(json.loads(line))
                print(line, flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "estimate_families.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(estimate_check.table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""List the convolution signatures of common convnets that vramkit's workspace table lacks,
for `cudnn_workspace_probe.py --signatures` to measure on a card.

The estimator's CPU stand-in takes each convolution's cuDNN workspace from the shipped table
(vramkit/plan/estimator/data/cudnn_workspaces.json): measured where the table has the layer,
else the nearest measured layer of its kind, else a size rule. Where a step's peak falls
on a layer the table has never seen, its reserved figure is only as good as that guess, so
the table gains most from the layers of the models people train. This script builds each
model named on the meta device (no memory, no GPU), runs one forward pass with a hook on
every 2-d convolution, and writes, as a JSON list of table keys, every part (forward,
backward to the input, backward to the weight, and to the bias where there is one) of every
layer the table holds at no batch size, at one batch and for each dtype asked:

    python3 bench/conv_signatures.py OUT.json                    # the default model list
    python3 bench/conv_signatures.py OUT.json --models tv:resnet18,timm:regnety_032:224
    python3 bench/cudnn_workspace_probe.py --only none --signatures OUT.json --out PROBE.json
    python -m vramkit.estimator.workspace_table import PROBE.json --other-device  # if so

A model is `tv:NAME` (torchvision.models.get_model), `seg:NAME` (torchvision's segmentation
models) or `timm:NAME`, with `:SIZE` for its input's side (224 by default). The list is in
the order of the models, so a probe stopped by its time budget has measured the first ones.
Needs PyTorch, and torchvision or timm for their models; a model that cannot be built on the
meta device is reported and left out.
"""

from __future__ import annotations

import argparse
import json
import sys

# Classification, detection backbones and segmentation nets trained from Python most,
# beyond the ones the table was filled from (ResNet-50, ViT-B/16, the UNet and ConvNeXt
# layers, the sweep): most common first.
DEFAULT_MODELS = (
    "tv:resnet18,tv:resnet101,tv:resnext50_32x4d,tv:wide_resnet50_2,tv:convnext_tiny,"
    "tv:efficientnet_b0,tv:efficientnet_v2_s,tv:mobilenet_v2,tv:vgg16,tv:densenet121,"
    "tv:shufflenet_v2_x1_0,tv:mnasnet1_0,tv:inception_v3:299,seg:deeplabv3_resnet50:512,"
    "seg:lraspp_mobilenet_v3_large:512,timm:resnet50d,timm:efficientnet_b3:288,"
    "timm:regnety_032,timm:mobilenetv3_large_100,timm:cspdarknet53:256,"
    "timm:efficientnetv2_rw_s:288,timm:seresnext50_32x4d,timm:ghostnet_100,timm:repvgg_a2,"
    "timm:hrnet_w18_small,timm:dla34")


def build_on_meta(spec: str):
    """(model, input side) for `LIB:NAME[:SIZE]`, built on the meta device."""
    import torch
    lib, _, rest = spec.partition(":")
    name, _, size = rest.partition(":")
    if lib not in ("tv", "seg", "timm") or not name or (size and not size.isdigit()):
        raise ValueError(f"{spec!r}: a model is tv:NAME, seg:NAME or timm:NAME, then "
                         f"optionally :SIZE")
    side = int(size) if size else 224
    with torch.device("meta"):
        if lib == "tv":
            import torchvision.models as models
            return models.get_model(name, weights=None), side
        if lib == "seg":
            import torchvision.models.segmentation as segmentation
            return segmentation.__dict__[name](weights=None, weights_backbone=None), side
        if lib == "timm":
            import timm
            return timm.create_model(name), side


def layers_of(model, side: int) -> list[dict]:
    """Each distinct 2-d convolution of one forward pass: the fields of its signature but
    the part, batch and dtype, with whether it has a bias."""
    import torch
    found: list[dict] = []

    def hook(module, args, _out):
        if isinstance(module.padding, str):  # "same"/"valid": resolved inside the call
            return
        found.append({"input": list(args[0].shape[1:]), "weight": list(module.weight.shape),
                      "stride": list(module.stride), "padding": list(module.padding),
                      "dilation": list(module.dilation), "groups": module.groups,
                      "transposed": isinstance(module, torch.nn.ConvTranspose2d),
                      "output_padding": list(getattr(module, "output_padding", (0, 0))),
                      "bias": module.bias is not None})

    for module in model.modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)):
            module.register_forward_hook(hook)
    model.train()
    model(torch.empty(2, 3, side, side, device="meta"))
    unique = {json.dumps(layer, sort_keys=True): layer for layer in found}
    return list(unique.values())


def missing_keys(layers: list[dict], known_layers: set, batch: int, dtypes) -> list[str]:
    """The table keys of every part of each layer at `batch` in each dtype, but those of
    layers the table holds at some batch."""
    from vramkit.plan.estimator._conv_signature import ConvSignature
    keys: list[str] = []
    for dtype in dtypes:
        for layer in layers:
            fields = {k: v for k, v in layer.items() if k != "bias"}
            parts = ["forward", "backward_input", "backward_weight"] + \
                (["backward_bias"] if layer["bias"] else [])
            for part in parts:
                signature = ConvSignature.from_fields(
                    dict(fields, part=part, batch=batch, dtype=dtype, layout="contiguous"))
                if signature.layer() not in known_layers:
                    keys.append(signature.key())
    return list(dict.fromkeys(keys))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the JSON list of table keys to write")
    parser.add_argument("--models", default=DEFAULT_MODELS,
                        help="comma-separated LIB:NAME[:SIZE] (default: a list of common "
                             "torchvision and timm convnets)")
    parser.add_argument("--batch", type=int, default=64, help="the batch of every key (64)")
    parser.add_argument("--dtypes", default="float32,bfloat16",
                        help="comma-separated dtypes (default float32,bfloat16)")
    parser.add_argument("--table", default=None,
                        help="the workspace table to leave out the layers of (default: "
                             "the installed vramkit's)")
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error(f"--batch must be at least 1, not {args.batch}")
    from vramkit.plan.estimator._conv_signature import ConvSignature
    from vramkit.plan.estimator.workspaces import TABLE_PATH, Table
    table = Table.load(args.table or TABLE_PATH)
    known = {ConvSignature.from_key(key).layer() for key in table.entries}
    layers: list[dict] = []
    seen: set = set()
    for spec in filter(None, args.models.split(",")):
        try:
            model, side = build_on_meta(spec)
            these = layers_of(model, side)
        except Exception as error:  # noqa: BLE001 - reported; the other models go on
            print(f"{spec}: left out ({type(error).__name__}: {str(error)[:120]})",
                  file=sys.stderr)
            continue
        new = [layer for layer in these if json.dumps(layer, sort_keys=True) not in seen]
        seen.update(json.dumps(layer, sort_keys=True) for layer in new)
        layers.extend(new)
        print(f"{spec}: {len(these)} distinct convolutions, {len(new)} not seen before",
              file=sys.stderr)
    keys = missing_keys(layers, known, args.batch, args.dtypes.split(","))
    with open(args.out, "w") as f:
        json.dump(keys, f, indent=0)
    print(f"{len(layers)} layers; {len(keys)} signatures the table lacks -> {args.out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

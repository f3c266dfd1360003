"""Training steps of well-known models, built from their configuration alone.

``vramkit estimate --model gpt2`` and the accuracy check (bench/estimate_check.py) need a
model without its weights: the Hugging Face ``transformers`` configuration classes give
the architecture of each family with its published defaults (GPT2Config() is GPT-2 124M,
ViTConfig() is ViT-B/16, ResNetConfig() is ResNet-50), so nothing is downloaded. A
``config.json`` path or a model id already in the local Hugging Face cache works too.

Each workload is a pair: ``build()`` makes (model, optimizer, batch) on the current
device (under the estimator's fake tensors, or for real on a GPU), and ``step(model,
optimizer, batch)`` runs forward, backward and the optimizer step.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Callable

PRECISIONS = ("fp32", "bf16-amp", "fp16-amp", "bf16")
OPTIMIZERS = ("adamw", "sgd")

# Families by transformers model_type: how to build the model and a batch for it.
_LANGUAGE = {"gpt2", "llama", "mistral", "qwen2", "gpt_neox", "opt", "bert", "roberta"}
_VISION = {"vit", "resnet"}

# A Llama-style decoder the size of a small production model, for `--model llama-1b`.
_NAMED = {
    "llama-1b": ("llama", dict(hidden_size=2048, intermediate_size=5632,
                               num_hidden_layers=16, num_attention_heads=32,
                               num_key_value_heads=8, vocab_size=32000,
                               max_position_embeddings=4096)),
    # Llama 3 8B's published configuration: too large to build on most machines that
    # would estimate it, which the estimator never does (its weights are fake tensors).
    "llama-3-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336,
                                 num_hidden_layers=32, num_attention_heads=32,
                                 num_key_value_heads=8, vocab_size=128256,
                                 max_position_embeddings=8192, rope_theta=500000.0)),
    "gpt2-medium": ("gpt2", dict(n_embd=1024, n_layer=24, n_head=16)),
    "gpt2-large": ("gpt2", dict(n_embd=1280, n_layer=36, n_head=20)),
    "vit-b16": ("vit", {}),
    "resnet50": ("resnet", {}),
}


class UnknownModel(ValueError):
    """The model name is neither a known family, a named size, nor a local config."""


class BadConfig(ValueError):
    """A configuration file that names no model transformers can build: unreadable, not
    JSON, or with values of the wrong kind. The message names the file."""


class PastPositions(ValueError):
    """A sequence longer than the model's table of learned positions: the real step fails
    indexing it, where fake tensors, which check no index, would give an estimate."""


class MissingPackage(ImportError):
    """transformers (or PyTorch) is not installed; the message says what to install."""


@dataclass
class Workload:
    name: str
    build: Callable
    step: Callable
    parameters: int | None = None


def config_for(model: str):
    """The transformers configuration for ``model``: a family (``gpt2``), a named size
    (``llama-1b``), a path to a ``config.json``, or a model id in the local cache."""
    try:
        import transformers
    except ImportError as error:
        raise MissingPackage("estimating a model by name needs the transformers package "
                             "(pip install transformers)") from error
    if model in _NAMED:
        family, overrides = _NAMED[model]
        return transformers.AutoConfig.for_model(family, **overrides)
    if os.path.exists(model):
        return _config_file(transformers, model)
    if model.endswith(".json") or model.startswith(("/", "./", "../", "~")):
        from ..._shown import shown
        raise BadConfig(f"{shown(model)}: no such file")
    try:
        return transformers.AutoConfig.for_model(model)
    except ValueError:
        pass
    try:
        return transformers.AutoConfig.from_pretrained(model, local_files_only=True)
    except (OSError, ValueError) as error:
        known = sorted(_LANGUAGE | _VISION | set(_NAMED))
        raise UnknownModel(f"unknown model '{model}': give a family ({', '.join(known)}), "
                           f"a path to a config.json, or a model id already in the local "
                           f"Hugging Face cache (nothing is downloaded)") from error


def _config_file(transformers, model: str):
    """The configuration in a config.json, or in the one of a model folder."""
    from ..._shown import ShownText, shown

    path = os.path.join(model, "config.json") if os.path.isdir(model) else model
    if not os.path.isfile(path):
        raise BadConfig(ShownText(f"{shown(model)}: a folder without a config.json"))
    try:
        config = transformers.AutoConfig.from_pretrained(path)
    except ImportError:
        raise
    except Exception as error:  # noqa: BLE001
        # transformers says "not a valid JSON file" as an OSError, and its newer releases
        # check the kinds of the fields with exceptions of huggingface_hub's own: whatever
        # it raises on reading this file is the file's fault.
        why = " ".join(str(error).split())[:300] or type(error).__name__
    else:
        why = _out_of_range(config)
        if why is None:
            return config
    raise BadConfig(unusable_config(path, why))


def unusable_config(path: str, why: str):
    """The message of a configuration file that makes no usable model, as shown text: the
    file named and escaped once. Where the reason quotes the path as Python writes it
    (with escapes already), it quotes the path as given, so that it is not escaped twice."""
    from ..._shown import ShownText, shown

    why = why.replace(repr(path), f"'{path}'")
    return ShownText(f"{shown(path)}: not a usable model configuration: {shown(why)}")


# Fields that count modules the model builds one by one (blocks, experts): the estimate
# makes each as a Python object, so a count no model has would run for hours.
_MODULE_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers",
                  "encoder_layers", "decoder_layers", "num_encoder_layers",
                  "num_decoder_layers", "num_local_experts", "num_experts",
                  "n_routed_experts")
MOST_MODULES = 10_000
# The sizes of a table of positions (learned, or the rotary cache's length): 1 or more.
_POSITION_COUNTS = ("n_positions", "max_position_embeddings", "n_ctx")
# Sizes of a table the model looks tokens up in: none can be empty.
_TABLE_SIZES = ("vocab_size",)


def _out_of_range(config) -> str | None:
    """Why a configuration's numbers cannot describe a model, None if they can: a count of
    blocks or experts below 0 or above MOST_MODULES, a table of fewer than one position or
    token, an integer past 64 bits, an image smaller than one patch."""
    fields = config.to_dict()
    for name, value in fields.items():
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        if name in _MODULE_COUNTS and not 0 <= value <= MOST_MODULES:
            return f"{name} is {value}: a count of blocks from 0 to {MOST_MODULES:,}"
        if name in _POSITION_COUNTS and value < 1:
            return f"{name} is {value}: a number of positions, 1 or more"
        if name in _TABLE_SIZES and value < 1:
            return f"{name} is {value}: the size of a table of tokens, 1 or more"
        if not -(1 << 63) <= value < (1 << 63):
            return f"{name} is {value}, past a 64-bit integer"
    image, patch = fields.get("image_size"), fields.get("patch_size")
    if isinstance(image, int) and isinstance(patch, int) and 0 < image < patch:
        return f"image_size is {image}, smaller than patch_size {patch}: no patch fits"
    return None


def position_limit(config) -> tuple[int, str] | None:
    """(the most tokens, the setting that says so) of a family whose positions are a
    learned table (absolute position embeddings), else None: rotary and relative
    positions have no table to run past."""
    family = config.model_type
    if family == "gpt2":
        return int(config.n_positions), "n_positions"
    absolute = getattr(config, "position_embedding_type", "absolute") == "absolute"
    if family in ("bert", "opt") and absolute:
        return int(config.max_position_embeddings), "max_position_embeddings"
    if family == "roberta" and absolute:
        # RoBERTa numbers positions from its padding index + 1.
        pad = getattr(config, "pad_token_id", None)
        first = (1 if pad is None else int(pad)) + 1
        return int(config.max_position_embeddings) - first, "max_position_embeddings"
    return None


def workload(model: str, batch: int, seq: int = 1024, precision: str = "fp32",
             optimizer: str = "adamw", checkpointing: bool = False,
             image_size: int | None = None) -> Workload:
    """The training step of ``model`` at ``batch`` (and ``seq`` tokens for language
    models), in ``precision``, with ``optimizer``, optionally with activation
    checkpointing of every block."""
    import torch
    import transformers

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {optimizer!r}")
    if batch < 1:
        raise ValueError(f"batch must be at least 1, not {batch}")
    config = config_for(model)
    family = config.model_type
    amp_dtype = {"bf16-amp": torch.bfloat16, "fp16-amp": torch.float16}.get(precision)
    weights_dtype = torch.bfloat16 if precision == "bf16" else torch.float32

    if family in _VISION:
        size = image_size or getattr(config, "image_size", 224)
        cls = (transformers.ResNetForImageClassification if family == "resnet"
               else transformers.ViTForImageClassification)
        labels = getattr(config, "num_labels", 2) or 2

        def make_batch():
            return (torch.randn(batch, 3, size, size, dtype=weights_dtype),
                    torch.randint(0, labels, (batch,)))
    elif family in _LANGUAGE or hasattr(config, "vocab_size"):
        positions = position_limit(config)
        if positions is not None and seq > positions[0]:
            raise PastPositions(f"seq {seq} is past the {positions[0]} positions of "
                                f"{model}'s learned position table ({positions[1]}): the "
                                f"real step fails indexing it")
        cls = (transformers.AutoModelForCausalLM if family not in ("bert", "roberta")
               else transformers.AutoModelForMaskedLM)
        vocab = config.vocab_size

        def make_batch():
            ids = torch.randint(0, vocab, (batch, seq))
            return ids, ids
    else:
        raise UnknownModel(f"model family '{family}' is not one the estimator builds")

    def build():
        if cls is transformers.AutoModelForCausalLM or cls is transformers.AutoModelForMaskedLM:
            net = cls.from_config(config, attn_implementation="sdpa")
            # Named as transformers names the loss of a model whose class name does not say
            # (GPT2LMHeadModel): left unset, transformers warns that it guessed.
            if getattr(net, "loss_type", None) is None:
                net.loss_type = ("ForCausalLM" if cls is transformers.AutoModelForCausalLM
                                 else "ForMaskedLM")
        else:
            net = cls(config)
        if weights_dtype is not torch.float32:
            net = net.to(dtype=weights_dtype)
        if checkpointing:
            checkpoint_every_block(net)
        net.train()
        if optimizer == "sgd":
            opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
        else:
            opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
        inputs, labels = make_batch()
        return net, opt, (inputs, labels)

    autocast = (lambda: torch.autocast("cuda", dtype=amp_dtype)) if amp_dtype else \
        contextlib.nullcontext

    def step(net, opt, batch_):
        inputs, labels = batch_
        with autocast():
            if family in _VISION:
                loss = net(pixel_values=inputs, labels=labels).loss
            else:
                loss = net(input_ids=inputs, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return Workload(f"{model} batch {batch}" + (f"x{seq}" if family not in _VISION else "")
                    + f" {precision}" + (" checkpointing" if checkpointing else ""),
                    build, step)


def checkpoint_every_block(net) -> None:
    """transformers' own activation checkpointing of every block, non-reentrant, as a
    user turns it on for training: under the name the installed transformers gives it
    (``activation_checkpointing_enable`` since version 5, where the older name warns
    that it is deprecated), with the key-value cache off, which transformers otherwise
    turns off itself at the first forward with a message."""
    kwargs = {"use_reentrant": False}
    if getattr(net.config, "use_cache", None):
        net.config.use_cache = False
    enable = getattr(net, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)

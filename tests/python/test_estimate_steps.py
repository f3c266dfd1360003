"""Tests of vramkit.estimate on the steps users write (issue 38): models moved with
.to("cuda"), .cuda() or .to(dtype) inside build(), real models on the CPU or the meta
device, a step that is a module's method, gradient accumulation, inference under
no_grad, and a model too large to build on the machine making the estimate. They run on
the CPU stand-in for CUDA; sizes are checked against hand counts.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
import vramkit  # noqa: E402
import vramkit.estimator  # noqa: E402,F401 - vramkit.estimator.UntraceableStep, alone too


def _rounded(n: int) -> int:
    return max(512, -(-n // 512) * 512)


class _Plain(torch.nn.Module):
    """One of each layer whose move failed: an embedding, a convolution, a layer norm, a
    linear layer."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(100, 32)
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.norm = torch.nn.LayerNorm(32)
        self.head = torch.nn.Linear(32, 8)

    def forward(self, ids):
        x = self.embed(ids)                                  # (batch, 16, 32)
        x = x + self.conv(x.unsqueeze(1)).mean(1)
        return self.head(self.norm(x))


# Each parameter is a block of its own: the weights and biases of the four layers.
_PLAIN_ELEMENTS = (100 * 32, 4 * 1 * 3 * 3, 4, 32, 32, 8 * 32, 8)


def _plain_bytes(itemsize: int) -> int:
    return sum(_rounded(n * itemsize) for n in _PLAIN_ELEMENTS)


def _plain_step(net, opt, ids):
    net(ids).float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


_MOVES = {
    "to('cuda')": (lambda m: m.to("cuda"), 4),
    ".cuda()": (lambda m: m.cuda(), 4),
    "to(device=)": (lambda m: m.to(device=torch.device("cuda")), 4),
    "to(dtype)": (lambda m: m.to(torch.bfloat16), 2),
    "to('cuda', dtype)": (lambda m: m.to("cuda", torch.bfloat16), 2),
    ".cuda().half()": (lambda m: m.cuda().half(), 2),
    "to(device=, dtype=)": (lambda m: m.to(device="cuda:0", dtype=torch.bfloat16), 2),
}


@pytest.mark.parametrize("how", list(_MOVES))
def test_a_model_moved_inside_build(how):
    """A build() that makes the model and moves it (every form of .to and .cuda): the
    parameters are counted in the dtype they were moved to, and a move to the device they
    are already on changes nothing."""
    move, itemsize = _MOVES[how]

    def build():
        net = move(_Plain())
        return net, torch.optim.SGD(net.parameters(), lr=0.1), \
            torch.randint(0, 100, (4, 16), device="cuda")

    e = vramkit.estimate(_plain_step, build=build, model_workspaces=False)
    assert e.breakdown["parameters"] == _plain_bytes(itemsize)
    assert e.breakdown["inputs"] == _rounded(4 * 16 * 8)
    if itemsize == 4:
        def unmoved():
            net = _Plain()
            return net, torch.optim.SGD(net.parameters(), lr=0.1), \
                torch.randint(0, 100, (4, 16), device="cuda")
        same = vramkit.estimate(_plain_step, build=unmoved, model_workspaces=False)
        assert e.peak_allocated == same.peak_allocated


transformers = None


def _gpt2_config():
    global transformers
    transformers = pytest.importorskip("transformers")
    return transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000,
                                   n_positions=64, bos_token_id=0, eos_token_id=0)


def _lm_step(net, opt, ids):
    net(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _gpt2_parameter_bytes(net, itemsize: int = 4) -> int:
    return sum(_rounded(p.numel() * itemsize) for p in net.parameters())


@pytest.mark.parametrize("how", ["to('cuda')", ".cuda()", "to('cuda', dtype)"])
def test_a_transformer_moved_inside_build(how):
    config = _gpt2_config()
    move, itemsize = _MOVES[how]

    def build():
        net = move(transformers.GPT2LMHeadModel(config))
        ids = torch.randint(0, 1000, (2, 32), device="cuda")
        return net, torch.optim.AdamW(net.parameters()), ids

    e = vramkit.estimate(_lm_step, build=build)
    expected = _gpt2_parameter_bytes(transformers.GPT2LMHeadModel(config), itemsize)
    assert e.breakdown["parameters"] == expected
    assert e.breakdown["optimizer state"] >= 2 * expected


def test_real_models_on_the_cpu_and_on_the_meta_device():
    """A model built for real on the CPU and the same model on the meta device (no
    memory) give the same estimate, and neither is touched."""
    config = _gpt2_config()
    ids = torch.randint(0, 1000, (2, 32))
    real = transformers.GPT2LMHeadModel(config)
    with torch.device("meta"):
        meta = transformers.GPT2LMHeadModel(config)
    on_cpu = vramkit.estimate(_lm_step, real, torch.optim.AdamW(real.parameters()), ids)
    on_meta = vramkit.estimate(_lm_step, meta, torch.optim.AdamW(meta.parameters()), ids)
    assert on_cpu.peak_allocated == on_meta.peak_allocated
    assert on_meta.breakdown["parameters"] == _gpt2_parameter_bytes(real)
    assert all(p.device.type == "meta" and p.grad is None for p in meta.parameters())
    assert all(p.device.type == "cpu" and p.grad is None for p in real.parameters())


class _Trainer(torch.nn.Module):
    """A step written as a method of the module that holds the model and its optimizer."""

    def __init__(self, config):
        super().__init__()
        self.net = transformers.GPT2LMHeadModel(config)
        self.opt = torch.optim.AdamW(self.net.parameters())

    def train_step(self, ids):
        _lm_step(self.net, self.opt, ids)


def test_a_step_that_is_a_method_of_the_model():
    """estimate(trainer.train_step, batch): the method runs on a fake twin of its module,
    so the parameters and the optimizer's state are counted, and the real module keeps
    its weights, no gradient and an optimizer without state."""
    config = _gpt2_config()
    trainer = _Trainer(config)
    before = [p.detach().clone() for p in trainer.parameters()]
    ids = torch.randint(0, 1000, (2, 32))
    e = vramkit.estimate(trainer.train_step, ids)
    as_function = vramkit.estimate(_lm_step, trainer.net, trainer.opt, ids)
    assert e.breakdown["parameters"] == _gpt2_parameter_bytes(trainer.net)
    assert e.breakdown["optimizer state"] == as_function.breakdown["optimizer state"] > 0
    assert e.peak_allocated == as_function.peak_allocated
    assert not trainer.opt.state
    for p, old in zip(trainer.parameters(), before):
        assert p.grad is None and torch.equal(p.detach(), old)


def _moved_gpt2_build(batch: int, train: bool = True):
    config = _gpt2_config()

    def build():
        net = transformers.GPT2LMHeadModel(config).cuda()
        net.train(train)
        ids = torch.randint(0, 1000, (batch, 32), device="cuda")
        return net, torch.optim.AdamW(net.parameters()), ids
    return build


def test_gradient_accumulation_over_micro_batches():
    """Four micro-batches of 2 before one optimizer step: the same parameters, gradients
    and optimizer state as one batch of 8, and less kept for backward at the peak."""
    def accumulating(net, opt, ids):
        for micro in ids.chunk(4):
            (net(input_ids=micro, labels=micro).loss / 4).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    micro = vramkit.estimate(accumulating, build=_moved_gpt2_build(8))
    whole = vramkit.estimate(_lm_step, build=_moved_gpt2_build(8))
    assert micro.breakdown["parameters"] == whole.breakdown["parameters"]
    assert micro.peak_allocated < whole.peak_allocated
    assert micro.breakdown["activations"] < whole.breakdown["activations"]


def test_inference_under_no_grad():
    """Forward alone under torch.no_grad(): nothing is kept for a backward pass, there
    are no gradients and no optimizer state, and the peak is below the training step's."""
    def infer(net, opt, ids):
        with torch.no_grad():
            net(input_ids=ids)

    e = vramkit.estimate(infer, build=_moved_gpt2_build(4, train=False))
    train = vramkit.estimate(_lm_step, build=_moved_gpt2_build(4))
    assert e.breakdown["gradients"] == e.breakdown["optimizer state"] == 0
    assert e.breakdown["activations"] == 0
    assert e.breakdown["parameters"] == train.breakdown["parameters"]
    assert e.peak_allocated < train.peak_allocated


def _bf16_autocast_step(net, opt, ids):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = net(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_what_if_lists_only_changes_to_the_step():
    """On a step under bf16 autocast, "bf16 autocast" changes nothing and is not listed
    (nor bf16 autocast with checkpointing, which is checkpointing alone there), and
    neither is fp16 autocast: two bytes an element either way, the same memory."""
    advice = vramkit.advise(_bf16_autocast_step, build=_moved_gpt2_build(2),
                            memory_limit="8G")
    rows = {r.variant: r for r in advice.rows}
    assert not [name for name in rows if "autocast" in name]
    assert "checkpointing all 2 blocks" in rows
    assert "bf16 weights and optimizer state" in rows


def test_a_change_that_cannot_be_estimated_says_why_whole():
    """A step that decides on a value only under autocast: the autocast rows are listed as
    not estimated, with no numbers, and the reason is printed whole under the table."""
    from vramkit.estimator import variants

    def step(net, opt, x):
        if torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu"):
            if x.sum() > 0:
                pass
        _plain_step(net, opt, x)

    def build():
        net = _Plain()
        return net, torch.optim.SGD(net.parameters(), lr=0.1), \
            torch.randint(0, 100, (4, 16), device="cuda")

    chosen = [variants.Variant("as written"),
              variants.Variant("fp16 autocast", autocast=torch.float16)]
    advice = vramkit.advise(step, build=build, variants=chosen, model_workspaces=False)
    row = advice.rows[1]
    assert row.variant == "fp16 autocast" and row.peak_reserved is None
    with pytest.raises(vramkit.estimator.UntraceableStep) as info:
        vramkit.estimate(step, build=build, variant=chosen[1], model_workspaces=False)
    text = str(advice)
    assert " ".join(str(info.value).split()) in " ".join(text.split())
    assert "0.00" not in text.splitlines()[3]


def test_max_batch_for_a_card_and_under_a_cap(tmp_path):
    """--device-memory is a card, of which the CUDA context takes its share before the
    allocator gets the rest; --cap is an allocator limit, which the context is not
    counted against. The two answers differ by the context, each output says which
    question it answered, and the card's answer is find_max_batch under a cap of the
    card less the context."""
    import subprocess
    import sys

    from vramkit.estimator import CUDA_CONTEXT_BYTES, models
    config = _gpt2_config()
    config.n_positions = 256  # the sequence asked below: past it the real step fails
    config.to_json_file(str(tmp_path / "config.json"))
    model = str(tmp_path / "config.json")

    def ask(*question):
        out = subprocess.run([sys.executable, "-m", "vramkit", "estimate", "--model", model,
                              "--seq", "256", "--max-batch", *question],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout

    card, cap = ask("--device-memory", "1G"), ask("--cap", "1G")
    assert "a 1G card (less the CUDA context)" in card
    assert "an allocator cap of 1G" in cap
    on_card, under_cap = (int(text.split(":")[-1]) for text in (card, cap))
    assert 0 < on_card < under_cap
    work = lambda n: models.workload(model, n, seq=256)  # noqa: E731
    assert vramkit.find_max_batch(work(1).step, lambda n: work(n).build(),
                                  memory_limit=(1 << 30) - CUDA_CONTEXT_BYTES) == on_card
    # Given both, the tighter answers, and the text and --json say which bound it was.
    card_binds = ask("--device-memory", "1G", "--cap", "1G")
    cap_binds = json.loads(ask("--device-memory", "2G", "--cap", "1G", "--json"))
    assert card_binds.startswith(card.split(" under vramkit")[0] + ", tighter than an allocator")
    assert int(card_binds.split(":")[-1]) == on_card
    assert cap_binds["bound"] == "cap" and cap_binds["max_batch"] == under_cap
    assert cap_binds["answered_for"].startswith(
        "an allocator cap of 1G (the CUDA context not counted), tighter than a 2G card")
    assert cap_binds["allocator_bytes"] == 1 << 30


def test_max_batch_that_fits_at_the_end_of_the_search_is_a_lower_bound(tmp_path):
    """A model small enough to fit at the largest batch the search tries: the answer is
    "at least" that batch, never "largest", since larger batches were not tried."""
    import subprocess
    import sys

    config = _gpt2_config()
    config.n_layer, config.n_embd, config.n_head, config.vocab_size = 1, 16, 2, 64
    config.n_positions = 8
    config.to_json_file(str(tmp_path / "config.json"))
    out = subprocess.run([sys.executable, "-m", "vramkit", "estimate", "--model",
                          str(tmp_path / "config.json"), "--seq", "8", "--max-batch",
                          "--device-memory", "4G"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "largest batch" not in out.stdout
    assert "larger batches were not tried: the largest is at least 4096" in out.stdout
    as_json = subprocess.run([sys.executable, "-m", "vramkit", "estimate", "--model",
                              str(tmp_path / "config.json"), "--seq", "8", "--max-batch",
                              "--device-memory", "4G", "--json"],
                             capture_output=True, text=True)
    answer = json.loads(as_json.stdout)
    assert answer["max_batch"] == 4096 and answer["at_least"] is True


def test_a_card_and_a_cap_together_decide_by_the_tighter():
    """estimate() and find_max_batch() given both a card and a cap: the fit is decided
    under the one that leaves the allocator less, and the estimate says which."""
    from vramkit.estimator import CUDA_CONTEXT_BYTES

    def build():
        net = _Plain().cuda()
        return net, torch.optim.SGD(net.parameters(), lr=0.1), \
            torch.randint(0, 100, (4, 16), device="cuda")

    card = 1 << 30
    common = dict(build=build, model_workspaces=False)
    under_card = vramkit.estimate(_plain_step, device_memory=card, memory_limit=card,
                                  **common)
    assert (under_cap := vramkit.estimate(_plain_step, device_memory=2 * card,
                                          memory_limit=card, **common)).bound == "cap"
    assert under_card.bound == "card" and not under_card.capped
    assert under_cap.capped and under_cap.device_memory == card
    assert any("tighter bound" in note for note in under_card.notes + under_cap.notes)
    tight = card - CUDA_CONTEXT_BYTES - 1
    alone = vramkit.estimate(_plain_step, memory_limit=tight, **common)
    assert alone.bound == "cap" and not any("tighter" in n for n in alone.notes)


_LARGE = """
import resource, sys, torch, transformers, vramkit
config = transformers.LlamaConfig(
    hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)
def step(net, opt, ids):
    net(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
if sys.argv[1] == "build":
    def build():
        net = transformers.LlamaForCausalLM(config).cuda()
        return net, torch.optim.AdamW(net.parameters()), torch.randint(0, 128256, (1, 16))
    e = vramkit.estimate(step, build=build, model_workspaces=False)
else:
    with torch.device("meta"):
        net = transformers.LlamaForCausalLM(config)
    e = vramkit.estimate(step, net, torch.optim.AdamW(net.parameters()),
                         torch.randint(0, 128256, (1, 16)), model_workspaces=False)
print(e.breakdown["parameters"], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10)
"""


@pytest.mark.parametrize("how", ["build", "meta"])
def test_a_model_larger_than_this_machine_is_never_built_in_its_memory(how):
    """Llama 3 8B in fp32 (32 GB of weights, as much again of gradients and twice that
    of AdamW's moments) is estimated from build() or from a model on the meta device by
    a process whose peak resident memory stays a small fraction of its weights."""
    pytest.importorskip("transformers")
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _LARGE, how], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    parameters, peak_rss = map(int, out.stdout.split()[-2:])
    assert parameters > 8_000_000_000 * 4
    assert peak_rss < parameters / 8


class _DropPathBlock(torch.nn.Module):
    """A residual block with layer scale and a drop path that asks whether its per-sample
    mask kept every sample, as some drop-path implementations do."""

    def __init__(self, rate: float):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)
        self.gamma = torch.nn.Parameter(torch.full((32,), 1e-6))
        self.rate = rate

    def forward(self, x):
        y = self.gamma * self.lin(x)
        if self.training and self.rate > 0:
            keep = torch.rand(x.shape[0], 1, device=x.device) >= self.rate
            if not keep.all():
                y = y * keep / (1 - self.rate)
        return x + y


class _ConvNeXtLike(torch.nn.Module):
    """The model-building pattern of timm's ConvNeXt (and Swin, PoolFormer...): drop-path
    rates read with .tolist() from torch.linspace in __init__; and a forward that picks
    every second sample with nonzero() on a mask made from the batch size alone."""

    def __init__(self, depths=(2, 3)):
        super().__init__()
        rates = [r.tolist() for r in torch.linspace(0, 0.2, sum(depths)).split(depths)]
        self.blocks = torch.nn.Sequential(*(_DropPathBlock(r) for s in rates for r in s))
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        even = torch.nonzero(torch.arange(x.shape[0], device=x.device) % 2 == 0)
        return self.head(self.blocks(x)[even.squeeze(1)])


def _convnext_like_build():
    net = _ConvNeXtLike().cuda()
    return net, torch.optim.SGD(net.parameters(), lr=0.1), torch.randn(8, 32, device="cuda")


def _sgd_step(net, opt, x):
    net(x).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_values_computed_from_known_values_alone_are_read():
    """Values that depend on no weight and no input (drop-path rates from linspace, a
    random keep mask, indices from arange) are computed, so the model builds and the
    step runs: every parameter is counted and the selected half of the batch reaches
    the head."""
    e = vramkit.estimate(_sgd_step, build=_convnext_like_build, model_workspaces=False)
    params = 5 * (_rounded(32 * 32 * 4) + 2 * _rounded(32 * 4)) \
        + _rounded(4 * 32 * 4) + _rounded(4 * 4)
    assert e.breakdown["parameters"] == e.breakdown["gradients"] == params
    assert e.breakdown["inputs"] == _rounded(8 * 32 * 4)


def test_values_of_weights_or_the_batch_are_still_refused():
    """However small the model, a value computed from its weights (a loss read with
    .item()) or from the batch (a count per label, whose length is the largest label) is
    not guessed: the estimate is refused, naming the operation and the user's line."""
    import inspect

    def reads_the_loss(net, opt, x):
        loss = net(x).sum()
        if loss.item() > 0:
            loss.backward()

    def counts_the_labels(net, opt, x):
        per_label = torch.bincount(x[:, 0].long().abs())
        (net(x).sum() * per_label.sum()).backward()

    for step, op in ((reads_the_loss, "_local_scalar_dense"), (counts_the_labels, "bincount")):
        with pytest.raises(vramkit.estimator.UntraceableStep) as info:
            vramkit.estimate(step, build=_convnext_like_build, model_workspaces=False)
        text = str(info.value)
        line = inspect.getsourcelines(step)[1] + (2 if op != "bincount" else 1)
        assert op in text and f"{__file__}:{line} in {step.__name__}" in text, text


def test_timm_convnext_tiny():
    """The model the issue reported (its drop-path rates read with .tolist() in
    __init__), on small images."""
    timm = pytest.importorskip("timm")

    def build():
        net = timm.create_model("convnext_tiny", drop_path_rate=0.1).cuda()
        return net, torch.optim.AdamW(net.parameters()), \
            torch.randn(2, 3, 64, 64, device="cuda")

    def step(net, opt, x):
        net(x).float().logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    e = vramkit.estimate(step, build=build)
    assert e.breakdown["parameters"] > 4 * 28_000_000


@pytest.mark.parametrize("name", ["resnet18", "deeplabv3_mobilenet_v3_large"])
def test_torchvision_models_moved_inside_build(name):
    """torchvision's models, built without weights and moved with .cuda() in build(): a
    classifier, and a segmentation model (its loss over every pixel). Parameters and
    AdamW's two moments are counted exactly, 4 bytes an element each."""
    torchvision = pytest.importorskip("torchvision")
    models = torchvision.models
    make = (lambda: models.resnet18(num_classes=10)) if name == "resnet18" else \
        (lambda: models.segmentation.deeplabv3_mobilenet_v3_large(
            weights=None, weights_backbone=None, num_classes=4))
    elements = sum(p.numel() for p in make().parameters())

    def build():
        net = make().cuda()
        return net, torch.optim.AdamW(net.parameters()), torch.randn(2, 3, 64, 64, device="cuda")

    def step(net, opt, x):
        out = net(x)
        out = out["out"] if isinstance(out, dict) else out
        out.float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    e = vramkit.estimate(step, build=build, model_workspaces=False)
    assert e.breakdown["parameters"] >= 4 * elements
    assert e.breakdown["parameters"] < 4 * elements * 1.05  # rounding to 512 bytes a tensor
    assert 2 * 4 * elements <= e.breakdown["optimizer state"] < 2 * 4 * elements * 1.05
    assert e.peak_allocated > e.breakdown["parameters"] + e.breakdown["optimizer state"]


def _tiny(family: str):
    """A two-layer model of each transformers family, small enough for a CPU."""
    global transformers
    transformers = pytest.importorskip("transformers")
    t = transformers
    if family == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=1000))
    if family == "t5":
        return t.T5ForConditionalGeneration(t.T5Config(
            d_model=64, d_ff=128, num_layers=2, num_heads=2, d_kv=32, vocab_size=1000,
            decoder_start_token_id=0))
    if family == "bert":
        return t.BertForMaskedLM(t.BertConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=2, vocab_size=1000))
    return t.GPT2LMHeadModel(_gpt2_config())


@pytest.mark.parametrize("family", ["llama", "t5", "bert"])
def test_transformers_families_moved_inside_build(family):
    """A decoder (Llama-style), an encoder-decoder (T5) and an encoder (BERT), each made
    and moved with .to("cuda") in build(): parameters, gradients and AdamW's two moments
    are each counted whole."""
    def build():
        net = _tiny(family).to("cuda")
        return net, torch.optim.AdamW(net.parameters()), \
            torch.randint(0, 1000, (2, 16), device="cuda")

    e = vramkit.estimate(_lm_step, build=build, model_workspaces=False)
    net = _tiny(family)
    weights = _gpt2_parameter_bytes(net)
    buffers = sum(_rounded(b.numel() * b.element_size()) for b in net.buffers())
    assert e.breakdown["parameters"] == weights + buffers  # buffers count with them
    ids = torch.randint(0, 1000, (2, 16))
    net(input_ids=ids, labels=ids).loss.backward()  # a real step names what gets a grad
    grads = sum(_rounded(p.grad.numel() * 4) for p in net.parameters()
                if p.grad is not None)
    # T5's relative-position biases get theirs through the attention's mask.
    assert e.breakdown["gradients"] == grads
    assert e.breakdown["optimizer state"] >= 2 * weights


def _generation_build():
    net = _tiny("gpt2").cuda().eval()
    return net, None, torch.randint(0, 1000, (8, 8), device="cuda")


def _generating(new_tokens: int):
    def step(net, _opt, ids):
        with torch.no_grad():
            net.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return step


def _hand_loop(new_tokens: int):
    def step(net, _opt, ids):
        with torch.no_grad():
            out = net(input_ids=ids, use_cache=True)
            for _ in range(new_tokens):
                token = out.logits[:, -1:].argmax(-1)
                out = net(input_ids=token, past_key_values=out.past_key_values,
                          use_cache=True)
    return step


def test_kv_cache_generation_with_generate_and_by_hand():
    """model.generate() (whose end-of-sequence checks read the generated tokens) and a
    hand loop over past_key_values: both are estimated, hold no gradient and no optimizer
    state, and the key-value cache of a longer generation takes more at the peak; the
    note says generate() was taken to produce every new token."""
    short, long = (vramkit.estimate(_generating(n), build=_generation_build,
                                    model_workspaces=False) for n in (2, 48))
    by_hand = vramkit.estimate(_hand_loop(48), build=_generation_build,
                               model_workspaces=False)
    for e in (short, long, by_hand):
        assert e.breakdown["gradients"] == e.breakdown["optimizer state"] == 0
        assert e.breakdown["parameters"] == _gpt2_parameter_bytes(_tiny("gpt2"))
    assert long.fake_ops > 10 * short.fake_ops  # every token was generated
    assert long.peak_allocated > short.peak_allocated
    assert by_hand.peak_allocated > short.peak_allocated
    assert any("every new token" in note for note in long.notes)
    assert not any("every new token" in note for note in by_hand.notes)


def test_what_if_records_each_change_once_and_counts_its_compute(monkeypatch):
    """advise() makes one recording per row, which gives both the memory and the FLOPs
    (PyTorch's formulas, as its FlopCounterMode counts them on the step as written); the
    recomputation of checkpointed blocks shows as added compute."""
    from torch.utils.flop_counter import FlopCounterMode

    from vramkit.estimator import _step, variants
    recordings = []
    record = _step.record_step
    monkeypatch.setattr(_step, "record_step",
                        lambda *a, **k: recordings.append(1) or record(*a, **k))
    chosen = [variants.Variant("as written"),
              variants.Variant("checkpointing all", checkpoint_every=1)]
    advice = vramkit.advise(_lm_step, build=_moved_gpt2_build(2), variants=chosen,
                            model_workspaces=False, processes=1)
    assert len(recordings) == len(chosen)
    assert advice.rows[1].extra_compute > 0.1

    net = _tiny("gpt2")
    ids = torch.randint(0, 1000, (2, 32))
    with FlopCounterMode(display=False) as counter:
        net(input_ids=ids, labels=ids).loss.backward()
    e = vramkit.estimate(_lm_step, build=_moved_gpt2_build(2), model_workspaces=False)
    # The CPU's attention here is unfused (two products forward, four backward); the
    # GPU's fused kernels, which the estimate counts, recompute the scores in backward:
    # one product of 2 * batch * heads * rows * rows * head size more for each layer.
    recompute = 2 * 2 * 2 * 32 * 32 * 32
    assert e.flops == counter.get_total_flops() + 2 * recompute


def test_an_optimizer_that_reads_the_weights_values():
    """Adafactor reads each weight's norm with .item() to scale its step: a value that
    changes the update, not what it allocates. The step is estimated, with Adafactor's
    factored second moments (a row and a column per matrix) as its state, and a note
    says what was read; the step's own reads of values stay refused."""
    def build():
        net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 8)).cuda()
        return net, torch.optim.Adafactor(net.parameters(), lr=1e-2), \
            torch.randn(4, 64, device="cuda")

    e = vramkit.estimate(_sgd_step, build=build, model_workspaces=False)
    assert e.breakdown["parameters"] == e.breakdown["gradients"] == sum(
        _rounded(n * 4) for n in (64 * 32, 32, 32 * 8, 8))
    assert 0 < e.breakdown["optimizer state"] < e.breakdown["parameters"]
    assert any("Adafactor's step size" in note for note in e.notes)


def test_a_saving_that_rounds_to_nothing_prints_as_zero():
    """A variant a few bytes worse than the step as written saves 0.00 GiB, not -0.00."""
    from vramkit.plan.estimator import variants
    row = variants.AdviceRow("8-bit optimizer states", 1 << 30, 1 << 30, 1 << 30,
                             None, -4096, 0.0)
    line = str(variants.Advice(rows=[row])).splitlines()[2]
    assert "-0.00" not in line and " 0.00" in line

"""Tests of vramkit.estimate on steps that read tensors' values, which fake tensors do not
have: a read that decides what the step does is refused with its reason and line; checks
that can only raise, finiteness checks and a logged loss are answered as a healthy step
passes them; the step's own errors are named as its own. On the CPU stand-in for CUDA.
"""

from __future__ import annotations

import inspect
import json
import math

import pytest

torch = pytest.importorskip("torch")
import vramkit  # noqa: E402
from vramkit.estimator import UntraceableStep  # noqa: E402

from estimate_mlp import PARAM_BYTES, WIDTH, _mlp_build, _step  # noqa: E402


def test_a_step_that_reads_values_is_refused_with_the_reason():
    def step(net, opt, x):
        loss = net(x).sum()
        if loss.item() > 0:  # data-dependent: fake tensors have no values
            loss.backward()

    with pytest.raises(UntraceableStep) as info:
        vramkit.estimate(step, build=_mlp_build())
    text = str(info.value)
    assert "fake tensors" in text and "No estimate is given" in text
    assert "item" in text.lower() or "data-dependent" in text.lower()


def test_checks_that_only_raise_are_taken_as_passed():
    """Code that checks its inputs' values and raises on a bad one (transformers' CTC
    models: a label past the vocabulary) is estimated as a valid step passes it: the same
    figures as the step without the check, and a note naming the first check's line. A
    test that decides anything else, or a line of two tests that pass on different
    answers, is still refused."""
    vocab = WIDTH

    def plain(net, opt, x):
        labels = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        torch.nn.functional.cross_entropy(net(x), labels).backward()
        opt.step()

    def checked(net, opt, x):
        labels = torch.zeros(x.shape[0], dtype=torch.long, device=x.device) + x.argmax()
        if labels is not None and labels.max() >= vocab:
            raise ValueError(f"labels must be below {vocab}")
        assert (labels >= 0).all(), "negative label"
        if not (labels < vocab).all():
            raise ValueError("label out of range")
        if (labels < 0).any():  # torchvision's way: find the first for the message, fail
            first = torch.where(labels < 0)[0][0]
            torch._assert(False, f"negative label at {first}")
        torch.nn.functional.cross_entropy(net(x), labels).backward()
        opt.step()

    base = vramkit.estimate(plain, build=_mlp_build())
    e = vramkit.estimate(checked, build=_mlp_build())
    assert (e.peak_allocated, e.peak_reserved) == (base.peak_allocated, base.peak_reserved)
    line = inspect.getsourcelines(checked)[1] + 2
    note = [n for n in e.notes if "checks that raise" in n]
    assert note and note[0].startswith("8 checks") and f"test_estimate_value_reads.py:{line}" in note[0]

    def decides(net, opt, x):
        if x.argmax() > 0:
            x = x * 2
        net(x).sum().backward()

    def either_way(net, opt, x):  # two tests on one line that pass on different answers
        if x.argmax() < 0 or not x.argmax() >= 0:
            raise ValueError("out of range")
        net(x).sum().backward()

    def may_return(net, opt, x):  # a block that can leave without raising decides
        for _ in range(1):
            if x.argmax() > 0:
                if x.numel() > 1:
                    break
                raise ValueError("never")
        net(x).sum().backward()

    def ends_a_loop(net, opt, x):  # StopIteration ends a loop: not a failure
        if x.argmax() > 0:
            raise StopIteration
        net(x).sum().backward()

    for step in (decides, either_way, may_return, ends_a_loop):
        with pytest.raises(UntraceableStep, match="_local_scalar_dense"):
            vramkit.estimate(step, build=_mlp_build())


def test_the_step_s_own_errors_are_not_called_limits_of_the_estimate():
    """A step that would fail on a GPU too (labels of another batch size) and a build that
    imports a missing package are refused for what they are, not as an operation that
    needs a real device."""
    def mismatched(net, opt, x):
        logits = net(x)
        torch.nn.functional.cross_entropy(logits, torch.zeros(logits.shape[0] * 2,
                                                              dtype=torch.long)).backward()

    with pytest.raises(UntraceableStep) as info:
        vramkit.estimate(mismatched, build=_mlp_build())
    text = str(info.value)
    assert "Expected input batch_size" in text and "the step's own error" in text, text
    assert "If it runs as written on a GPU" in text

    def build():
        import vramkit_no_such_package  # noqa: F401
        return _mlp_build()()

    with pytest.raises(UntraceableStep) as info:
        vramkit.estimate(lambda net, opt, x: None, build=build)
    text = str(info.value)
    assert info.value.in_build and "cannot import" in text, text
    assert "vramkit_no_such_package" in text and "real device" not in text

    # A message that opens with a blank line (transformers' requires_backends) keeps its
    # words; a message of the step's own that happens to say "item()" gets no advice
    # about reading values.
    def needs_scipy(net, opt, x):
        raise ImportError("\nHungarianMatcher requires the scipy library: pip install scipy")

    def says_item(net, opt, x):
        raise ValueError("bad batch: call item() on it first")

    for step, words, absent in ((needs_scipy, "requires the scipy library", "real device"),
                                (says_item, "bad batch", "pass the value in")):
        with pytest.raises(UntraceableStep) as info:
            vramkit.estimate(step, build=_mlp_build())
        assert words in str(info.value) and absent not in str(info.value), str(info.value)

    # Fake tensors' own refusal still gets its advice: a custom op with no fake kernel.
    @torch.library.custom_op("vramkit_tests::doubled", mutates_args=())
    def doubled(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def custom(net, opt, x):
        doubled(net(x)).sum().backward()

    with pytest.raises(UntraceableStep) as info:
        vramkit.estimate(custom, build=_mlp_build())
    assert "register_fake" in str(info.value) and "fake (meta) kernel" in str(info.value)


def test_a_logged_loss_and_finiteness_checks_are_estimated():
    """A step as people write it logs its loss with .item() and checks it is finite: the
    estimate runs, with the figures of the same step without those lines, and its notes
    say what was answered. What was logged prints as 0.0."""
    logged = []

    def step(net, opt, x):
        loss = net(x).pow(2).mean()
        if torch.isnan(loss) or not torch.isfinite(loss):
            raise FloatingPointError("the loss is not finite")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0, error_if_nonfinite=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        logged.append(f"{loss.item() * 2:.3f} {loss.item() + 1:.1f} {loss:.2f}")

    e = vramkit.estimate(step, build=_mlp_build())
    plain = vramkit.estimate(_step, build=_mlp_build())
    assert e.breakdown["parameters"] == plain.breakdown["parameters"] == PARAM_BYTES
    assert abs(e.peak_allocated - plain.peak_allocated) <= 4096  # the checks' bool scalars
    assert logged == ["0.000 0.0 0.00"] * 2  # what arithmetic makes of them is unknown too
    notes = " ".join(e.notes)
    assert "are finite" in notes and "read 6 values" in notes


def test_a_loss_logged_in_typed_code_is_the_users_too():
    """A step typed at the prompt, run by exec() or in an IPython cell (whose code has no
    file) logs its loss as one in a file does."""
    source = ("def step(net, opt, x):\n"
              "    loss = net(x).pow(2).mean()\n"
              "    loss.backward()\n"
              "    opt.step()\n"
              "    logged.append(loss.item())\n")
    for name in ("<string>", "<ipython-input-3-1f2e3d4c5b6a>"):
        logged = []
        scope = {"logged": logged}
        exec(compile(source, name, "exec"), scope)
        e = vramkit.estimate(scope["step"], build=_mlp_build())
        assert [f"{v}" for v in logged] == ["0.0", "0.0"]
        assert any(f"{name}:5" in n for n in e.notes), e.notes


def test_correct_predictions_counted_with_item_are_estimated():
    """A step that counts its correct predictions with an integer .item(), as accuracy is
    logged, is estimated as the same step that does not read the count; it prints as nan
    (a float that is no number: an int, or 0.0, could size something unnoticed)."""
    counted = []

    def step(net, opt, x):
        out = net(x)
        correct = 0
        correct += (out.argmax(1) == 0).sum().item()
        counted.append(f"{correct / x.shape[0]:.2f}")
        out.pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def unread(net, opt, x):
        out = net(x)
        (out.argmax(1) == 0).sum()
        out.pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    e = vramkit.estimate(step, build=_mlp_build())
    base = vramkit.estimate(unread, build=_mlp_build())
    assert e.peak_allocated == base.peak_allocated
    assert counted == ["nan"] * 2
    assert any("read 2 values" in n for n in e.notes), e.notes


def test_a_decision_on_a_logged_value_is_refused_at_its_line():
    """A value read with .item() may be printed or summed, never decided on: a comparison
    after arithmetic, an int made of it, a test of the tensor itself, float(t) or a
    slice by a count each refuse the estimate, naming the line that decided; a range over
    a count, the line that read it."""

    def compares(net, opt, x):
        scaled = net(x).sum().item() * 2
        if scaled > 1:
            pass

    def sizes(net, opt, x):
        n = net(x).sum().item()
        torch.zeros(int(n))

    def tests_the_tensor(net, opt, x):
        if net(x).sum():
            pass

    def floats_it(net, opt, x):
        if float(net(x).sum()) > 1:
            pass

    def slices_by_a_count(net, opt, x):
        n = (net(x) > 0).sum().item()
        x[:n]

    def ranges_over_a_count(net, opt, x):
        n = (net(x) > 0).sum().item()
        torch.arange(n * 2, device=x.device)

    for step in (compares, sizes, tests_the_tensor, floats_it, slices_by_a_count):
        with pytest.raises(UntraceableStep) as info:
            vramkit.estimate(step, build=_mlp_build())
        text = str(info.value)
        line = inspect.getsourcelines(step)[1] + (1 if step in (tests_the_tensor, floats_it)
                                                  else 2)
        assert "_local_scalar_dense" in text and f":{line} in {step.__name__}" in text, text

    # torch.arange takes a float, and would make nothing of 0.0: the count is nan, and
    # the refusal names where it was read.
    with pytest.raises(UntraceableStep) as info:
        vramkit.estimate(ranges_over_a_count, build=_mlp_build())
    read = inspect.getsourcelines(ranges_over_a_count)[1] + 1
    assert f":{read}" in str(info.value) and "stands in as nan" in str(info.value)


def test_an_unknown_value_is_a_float_until_decided_on():
    from vramkit.plan.estimator._values import UnknownValue, ValueDecided
    value = UnknownValue("train.py:12")
    derived = (value + 1) * 2 / 3 - value ** 2
    assert isinstance(derived, UnknownValue) and derived.site == "train.py:12"
    assert f"{value:.2f}" == "0.00" and json.dumps([value]) == "[0.0]"
    assert isinstance(round(value, 4), UnknownValue)  # a log's rounding, still a float
    assert {value: 1}[value] == 1  # hashable: a dict key (found by identity)
    count = UnknownValue("train.py:9", math.nan)  # an integer read
    assert all(math.isnan(v) for v in (count * 2 + value, value + count, round(count, 2)))
    for decide in (bool, int, round, lambda v: v > 0, lambda v: v == 0.0, math.floor):
        with pytest.raises(ValueDecided, match="train.py:12"):
            decide(derived)


def test_torch_distributions_validate_their_arguments_as_a_healthy_step_passes():
    """torch.distributions check by default that a scale is positive and a sample in the
    support (``if not torch._is_all_true(valid): raise ValueError``): a policy or a VAE
    head with a learned scale, or a categorical policy's log-probability of the actions
    taken, is estimated as its checks pass, with the same figures as with validation off."""

    def gaussian_build():
        mu = torch.nn.Linear(16, 4).to("cuda")
        log_std = torch.zeros(4, device="cuda", requires_grad=True)
        return mu, log_std, torch.randn(2, 16, device="cuda"), torch.randn(2, 4, device="cuda")

    def gaussian(validate):
        def step(mu, log_std, obs, act):
            dist = torch.distributions.Normal(mu(obs), log_std.exp(), validate_args=validate)
            (-dist.log_prob(act).sum()).backward()
        return step

    def categorical_build():
        pi = torch.nn.Linear(16, 6).to("cuda")
        return pi, torch.randn(8, 16, device="cuda"), torch.randint(0, 6, (8,), device="cuda")

    def categorical(validate):
        def step(pi, obs, act):
            dist = torch.distributions.Categorical(logits=pi(obs), validate_args=validate)
            (-dist.log_prob(act).mean() - 0.01 * dist.entropy().mean()).backward()
        return step

    for make, build in ((gaussian, gaussian_build), (categorical, categorical_build)):
        checked = vramkit.estimate(make(True), build=build)
        unchecked = vramkit.estimate(make(False), build=build)
        assert checked.peak_allocated == unchecked.peak_allocated
        note = [n for n in checked.notes if "checks that raise" in n]
        assert note and "distribution.py:" in note[0], checked.notes


def test_refusals_name_what_to_do():
    """An RNN over a PackedSequence is refused as every cuDNN recurrent layer is, with what
    to do instead, not as "the step's own error". A missing package's message that announces its install command on
    the next line (transformers') keeps the command. A tensor handed to NumPy
    (``.numpy()``) is named as that, not as the step's own error either."""
    from torch.nn.utils.rnn import pack_sequence

    def build():
        rnn = torch.nn.LSTM(8, 16, batch_first=True).to("cuda")
        return rnn, [torch.randn(n, 8, device="cuda") for n in (5, 3, 2)]

    def packed(rnn, seqs):
        out, (h, c) = rnn(pack_sequence(seqs))
        h.sum().backward()

    with pytest.raises(UntraceableStep) as info:
        vramkit.estimate(packed, build=build)
    text = str(info.value)
    assert "run through cuDNN" in text and "the step's own error" not in text, text

    def needs_scipy(net, opt, x):
        raise ImportError("\nLoss requires the scipy library but it was not found in your "
                          "environment. You can install it with pip:\n`pip install scipy`. "
                          "Please note that you may need to restart your runtime.")

    with pytest.raises(UntraceableStep) as info:
        vramkit.estimate(needs_scipy, build=_mlp_build())
    assert "You can install it with pip: `pip install scipy`" in str(info.value)

    def to_numpy(net, opt, x):
        net(x).detach().cpu().numpy()

    with pytest.raises(UntraceableStep) as info:
        vramkit.estimate(to_numpy, build=_mlp_build())
    text = str(info.value)
    assert "hands a tensor's values to NumPy" in text and "the step's own error" not in text


def test_lbfgs_is_refused_with_why():
    """LBFGS decides from the loss and the gradients how often it evaluates the closure
    and how many history pairs (copies of the parameters) it keeps: answering its reads
    with zeros, as other optimizers' are, gave a third of the real state. It is refused
    with the reason and what to do instead."""

    def build():
        net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(),
                                  torch.nn.Linear(128, 10)).to("cuda")
        return (net, torch.optim.LBFGS(net.parameters(), line_search_fn="strong_wolfe"),
                torch.randn(8, 64, device="cuda"), torch.randint(0, 10, (8,), device="cuda"))

    def step(net, opt, x, y):
        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            return loss
        opt.step(closure)

    with pytest.raises(UntraceableStep) as info:
        vramkit.estimate(step, build=build)
    assert "LBFGS" in str(info.value) and "history pair" in str(info.value)


def test_a_detr_matching_is_answered_by_its_size(monkeypatch):
    """transformers' DETR matches its queries to the boxes with SciPy's
    linear_sum_assignment on the cost matrix moved to the host, values the estimate does
    not have (refused before: ".numpy() is not supported for tensor subclasses"). It is
    answered by size, the first queries to the first boxes: the estimate equals that of
    the same step whose matcher returns such a matching itself, and a note names it."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("scipy.optimize")
    from transformers.loss import loss_for_object_detection as detr_loss
    boxes_per_image = (3, 1)

    def build():
        backbone = transformers.ResNetConfig(depths=[1, 1, 1, 1], embedding_size=16,
                                             hidden_sizes=[16, 32, 64, 128],
                                             out_features=["stage4"])
        config = transformers.DetrConfig(
            use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=backbone,
            d_model=32, encoder_layers=1, decoder_layers=1, num_queries=10,
            encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=2,
            decoder_attention_heads=2)
        model = transformers.DetrForObjectDetection(config).to("cuda")
        return model, torch.optim.AdamW(model.parameters()), \
            torch.randn(len(boxes_per_image), 3, 64, 64, device="cuda")

    def step(model, opt, pixels):
        labels = [{"class_labels": torch.ones(n, dtype=torch.long, device="cuda"),
                   "boxes": torch.full((n, 4), 0.25, device="cuda")} for n in boxes_per_image]
        model(pixel_values=pixels, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()

    answered = vramkit.estimate(step, build=build, model_workspaces=False)
    assert any("linear_sum_assignment" in n and "loss_for_object_detection.py" in n
               for n in answered.notes), answered.notes

    def first_to_first(self, outputs, targets):
        return [(torch.arange(len(t["boxes"])), torch.arange(len(t["boxes"])))
                for t in targets]

    monkeypatch.setattr(detr_loss.HungarianMatcher, "forward", first_to_first)
    fixed = vramkit.estimate(step, build=build, model_workspaces=False)
    assert answered.peak_allocated == fixed.peak_allocated
    assert not any("linear_sum_assignment" in n for n in fixed.notes)


def test_max_of_a_number_and_an_unknown_count_is_the_count():
    """A loss divided by max(1, its count of matched boxes), as detectors write it, with
    the count a tensor or read with .item(): max() and min() of numbers and one value the
    estimate cannot know give that value, which stays unknown (a later decision on it is
    still refused); of numbers alone, or of two unknown values, they are Python's own."""
    seen = {}

    def step(net, opt, x):
        out = net(x)
        count = (out > 0).sum()
        seen["tensor"] = max(1, count) is count and min(count, 5.0) is count
        seen["read"] = math.isnan(max(1, (out > 1).sum().item()))
        seen["numbers"] = (max(2, 3), min(2, 3), max([4, 1]))
        (out.sum() / max(1, count)).backward()
        opt.step()

    def decides(net, opt, x):
        out = net(x)
        if max(1, (out > 0).sum()) > 3:
            pass

    def two_unknowns(net, opt, x):
        out = net(x)
        max((out > 0).sum(), (out > 1).sum())

    e = vramkit.estimate(step, build=_mlp_build())
    assert seen == {"tensor": True, "read": True, "numbers": (3, 2, 4)}
    line = inspect.getsourcelines(step)[1] + 3
    assert any("max() or min()" in n and f"test_estimate_value_reads.py:{line}" in n
               for n in e.notes), e.notes
    for refused in (decides, two_unknowns):
        with pytest.raises(UntraceableStep):
            vramkit.estimate(refused, build=_mlp_build())


def test_torchvision_s_one_stage_detectors_are_estimated():
    """RetinaNet divides its loss by max(1, matched anchors), FCOS counts them with
    .item() in torchvision's code first: both were refused; both are estimated now."""
    detection = pytest.importorskip("torchvision.models.detection")

    for make in (detection.retinanet_resnet50_fpn, detection.fcos_resnet50_fpn):
        def build(make=make):
            model = make(weights=None, weights_backbone=None, num_classes=3, min_size=128,
                         max_size=128).to("cuda")
            # The batch's boxes, values the estimate does not know (a step's own
            # constants would be known, and so would the matching).
            targets = [{"boxes": torch.tensor([[8.0, 16.0, 64.0, 96.0]], device="cuda"),
                        "labels": torch.tensor([1], device="cuda")} for _ in range(2)]
            return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), \
                [torch.rand(3, 128, 128, device="cuda") for _ in range(2)], targets

        def step(model, opt, images, targets):
            sum(model(images, targets).values()).backward()
            opt.step()
            opt.zero_grad()

        e = vramkit.estimate(step, build=build, model_workspaces=False)
        assert e.breakdown["parameters"] > 0 and e.peak_allocated > e.breakdown["parameters"]
        assert any("max() or min()" in n for n in e.notes), e.notes

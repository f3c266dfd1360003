"""Tests of vramkit.estimate on the objects a step is given or builds besides the model:
a deep copy made in build() (an EMA or teacher model), LR schedulers and gradient scalers
passed in (twinned, never changed), and a torch.compile'd model (run eagerly, and said
so). On the CPU stand-in for CUDA.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import vramkit  # noqa: E402


def test_an_ema_copy_made_with_deepcopy_in_build_is_counted():
    """timm's ModelEmaV3 and teacher models are ``copy.deepcopy(model)`` in build(): with
    a BatchNorm (its step counter, made from a Python number, holds its value) the copy
    failed under fake tensors. It is now made, and holds what the model holds once more."""
    import copy

    def model():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
                                   torch.nn.Flatten(), torch.nn.Linear(8 * 14 * 14, 10))

    def build(ema: bool):
        def made():
            net = model().to("cuda")
            args = (net, torch.randn(4, 3, 16, 16, device="cuda"))
            if not ema:
                return args
            shadow = copy.deepcopy(net).requires_grad_(False)
            return (*args, shadow)
        return made

    def step(net, x, shadow=None):
        net(x).sum().backward()

    alone = vramkit.estimate(step, build=build(False))
    with_ema = vramkit.estimate(step, build=build(True))
    assert with_ema.breakdown["parameters"] == 2 * alone.breakdown["parameters"]


def test_schedulers_and_scalers_given_in_are_twinned_too(monkeypatch):
    """Objects passed to estimate() directly are never changed: an LR scheduler stepped in
    the step changes its twin's optimizer, not the user's learning rate, and a GradScaler
    keeps no fake scale (on a GPU its next real step would have trained on fake
    gradients); no scheduler warning about the optimizer's step is printed."""
    import warnings

    import torch.nn.functional as F

    # As on a machine with a GPU: the scaler is made enabled.
    monkeypatch.setattr(torch.cuda.amp.common, "amp_definitely_not_available", lambda: False)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cuda")
    monkeypatch.undo()
    x, y = torch.randn(4, 64), torch.randint(0, 10, (4,))

    def step(net, opt, sched, scaler, x, y):
        scaler.scale(F.cross_entropy(net(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        sched.step()

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        e = vramkit.estimate(step, net, opt, sched, scaler, x, y)
    assert e.peak_allocated > 0
    assert opt.param_groups[0]["lr"] == 1e-3 and sched.last_epoch == 0
    assert getattr(scaler, "_scale", None) is None and not opt.state


def test_a_compiled_model_is_estimated_as_eager_and_says_so():
    """Dynamo compiles nothing on the estimate's fake tensors: a torch.compile'd model
    gives the eager model's figures, and a note says so (none for an eager model)."""

    def build(compiled: bool):
        def made():
            net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                      torch.nn.Linear(128, 10)).to("cuda")
            return (torch.compile(net) if compiled else net), torch.randn(8, 64, device="cuda")
        return made

    def step(net, x):
        net(x).sum().backward()

    compiled = vramkit.estimate(step, build=build(True))
    eager = vramkit.estimate(step, build=build(False))
    assert compiled.peak_allocated == eager.peak_allocated
    assert any("ran as eager PyTorch" in n for n in compiled.notes), compiled.notes
    assert not any("torch.compile" in n for n in eager.notes)

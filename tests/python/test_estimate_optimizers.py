"""Tests that the estimator runs a step's optimizer down the path the GPU takes: with
``foreach`` left unset, torch.optim's Adam, AdamW and SGD take the multi-tensor path for
CUDA tensors (temporaries the size of all the parameters at once) and Adafactor takes
its per-tensor loop (one parameter's temporaries at a time), so an estimate with the
default equals the estimate with that path named. And an optimizer resumed from a
checkpoint in build(): its loaded step counts have no value the estimate can read.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import vramkit.plan.estimator as estimator  # noqa: E402

WIDTH = 1024


def _step(model, opt, x):
    model(x).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _peak(make_optimizer) -> int:
    """Peak allocated of a step whose peak is in its optimizer: four square layers, a
    batch of two rows."""
    def build():
        model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False)
                                      for _ in range(4))).cuda()
        return model, make_optimizer(model.parameters()), torch.randn(2, WIDTH,
                                                                      device="cuda")
    return estimator.estimate(_step, build=build).peak_allocated


def test_adafactor_left_unset_runs_its_per_tensor_loop():
    unset = _peak(lambda p: torch.optim.Adafactor(p))
    loop = _peak(lambda p: torch.optim.Adafactor(p, foreach=False))
    multi = _peak(lambda p: torch.optim.Adafactor(p, foreach=True))
    assert unset == loop
    # The multi-tensor path holds every layer's update at once, the loop one layer's; the
    # loop's own peak may be outside the optimizer (in backward, where a GPU's cuBLAS
    # workspaces add to it), so the two can differ by less than the other layers'
    # updates, and by less than one on a GPU: half of one is the bound.
    assert multi > loop + WIDTH * WIDTH * 2


@pytest.mark.parametrize("make", [
    lambda p, **kw: torch.optim.AdamW(p, **kw),
    lambda p, **kw: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01, **kw),
], ids=["adamw", "sgd-weight-decay"])
def test_optimizers_that_default_to_foreach_on_cuda_take_it(make):
    unset = _peak(lambda p: make(p))
    multi = _peak(lambda p: make(p, foreach=True))
    loop = _peak(lambda p: make(p, foreach=False))
    assert unset == multi
    assert multi > loop


def test_a_subclass_that_overrides_step_keeps_its_base_path():
    class Logged(torch.optim.Adafactor):
        def step(self, closure=None):
            return super().step(closure)

    class LoggedAdamW(torch.optim.AdamW):
        def step(self, closure=None):
            return super().step(closure)

    assert _peak(lambda p: Logged(p)) == _peak(lambda p: torch.optim.Adafactor(p))
    assert _peak(lambda p: LoggedAdamW(p)) == _peak(lambda p: torch.optim.AdamW(p))


@pytest.mark.parametrize("map_location", [None, "cpu", "cuda"])
@pytest.mark.parametrize("optimizer", [torch.optim.AdamW, torch.optim.Adafactor])
def test_an_optimizer_resumed_from_a_checkpoint_is_estimated(tmp_path, optimizer,
                                                             map_location):
    """build() loads the optimizer's state with torch.load: under fake tensors its step
    counts have no values, were read as 0, and the update divided by zero (AdamW's bias
    correction 1 - beta ** step, Adafactor's step ** decay). Loaded to "cuda" without a
    GPU, the step counts were CUDA tensors beside the CPU stand-in's parameters."""
    real = torch.nn.Linear(64, 64)
    real_opt = optimizer(real.parameters())
    _step(real, real_opt, torch.randn(2, 64))
    path = tmp_path / "checkpoint.pt"
    torch.save({"model": real.state_dict(), "optimizer": real_opt.state_dict()}, path)

    def build(resume: bool):
        def made():
            model = torch.nn.Linear(64, 64).cuda()
            opt = optimizer(model.parameters())
            if resume:
                saved = torch.load(path, map_location=map_location)
                model.load_state_dict(saved["model"])
                opt.load_state_dict(saved["optimizer"])
            return model, opt, torch.randn(2, 64, device="cuda")
        return made

    fresh = estimator.estimate(_step, build=build(False))
    resumed = estimator.estimate(_step, build=build(True))
    assert resumed.breakdown["parameters"] == fresh.breakdown["parameters"]
    assert resumed.breakdown["optimizer state"] >= fresh.breakdown["optimizer state"] > 0
    assert any("2 step counts" in note for note in resumed.notes), resumed.notes
    assert not any("step counts" in note for note in fresh.notes)

"""Tests that the estimator runs a step's optimizer down the path the GPU takes: with
``foreach`` left unset, torch.optim's Adam, AdamW and SGD take the multi-tensor path for
CUDA tensors (temporaries the size of all the parameters at once) and Adafactor takes
its per-tensor loop (one parameter's temporaries at a time), so an estimate with the
default equals the estimate with that path named.
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
    # The multi-tensor path holds every layer's update at once, the loop one layer's.
    assert multi > loop + WIDTH * WIDTH * 4


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

"""Tests that the estimator does no work twice: advise() and plan_checkpointing() build
the model once per estimate (not once more to find its blocks), the recording runs one
vramkit dispatch mode per op (the known values inside the recorder), and `vramkit
estimate` ends its process without the interpreter's teardown, its exit handlers run.
Behaviour only: nothing here is timed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import vramkit.plan.estimator as estimator  # noqa: E402
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack  # noqa: E402

from test_estimate import WIDTH, _Block  # noqa: E402  (a residual block of two layers)


def _counted_build(calls: list):
    def build():
        calls.append(1)
        net = torch.nn.Sequential(*(_Block() for _ in range(4)))
        return net, torch.optim.AdamW(net.parameters()), torch.randn(8, WIDTH)
    return build


def _step(net, opt, x):
    net(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_advise_builds_the_model_once_per_row():
    calls: list = []
    advice = estimator.advise(_step, build=_counted_build(calls), processes=1)
    names = [r.variant for r in advice.rows]
    assert names[0] == "as written"
    # The blocks were found, from the model the first estimate built: the checkpointing
    # rows are there.
    assert "checkpointing all 4 blocks" in names
    assert "checkpointing every 2nd block" in names
    assert len(calls) == len(advice.rows)


def test_advise_refuses_an_empty_list_of_variants():
    with pytest.raises(ValueError, match="variants is empty"):
        estimator.advise(_step, build=_counted_build([]), variants=[])


def test_plan_checkpointing_builds_the_model_once_per_estimate(monkeypatch):
    calls: list = []
    estimates: list = []
    real = estimator.estimate

    def counted(*args, **kwargs):
        estimates.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(estimator, "estimate", counted)
    whole = real(_step, build=_counted_build([]))
    # A cap between the step with every block checkpointed and the step as written.
    cap = whole.peak_reserved - 1
    plan = estimator.plan_checkpointing(_step, build=_counted_build(calls), memory_limit=cap)
    assert plan.blocks == 4
    assert len(calls) == len(estimates) >= 2


def test_the_recording_runs_the_known_values_inside_the_recorder():
    """One vramkit mode on the dispatch stack while the step runs, and the values the
    known-values mode computes still read as before (a linspace's item)."""
    seen = {}

    def step(net, opt, x):
        seen["modes"] = [type(m).__name__ for m in _get_current_dispatch_mode_stack()]
        rate = torch.linspace(0, 0.5, 3)[2].item()
        seen["rate"] = rate
        (net(x) * rate).pow(2).mean().backward()
        opt.step()

    estimator.estimate(step, build=_counted_build([]), steps=1)
    assert seen["rate"] == 0.5
    assert seen["modes"] == ["FakeTensorMode", "StorageRecorder"]


def test_an_optimizer_s_in_place_updates_of_unknown_values_skip_the_fake_kernels(
        monkeypatch):
    """AdamW's multi-tensor update writes every parameter and state in place: nothing is
    allocated and nothing known is written, so those ops never reach the fake kernels
    (which would hash every tensor of the lists). Its step counters, whose values are
    known, are still counted up by them; the estimate is the same either way."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    reached = []
    dispatch = FakeTensorMode.dispatch

    def counting(self, func, types, args=(), kwargs=None):
        if str(func).startswith("aten._foreach_") and str(func).split(".")[1].endswith("_"):
            reached.append(args[0][0].dim())  # a step counter is a 0-dim tensor
        return dispatch(self, func, types, args, kwargs)

    monkeypatch.setattr(FakeTensorMode, "dispatch", counting)

    def build():
        net = torch.nn.Sequential(*(_Block() for _ in range(4))).cuda()
        return net, torch.optim.AdamW(net.parameters(), foreach=True), torch.randn(
            8, WIDTH, device="cuda")

    def step(net, opt, x):
        net(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    with_skip = estimator.estimate(step, build=build, steps=2)
    assert reached and not any(reached), reached  # the step counters' alone
    monkeypatch.setattr(estimator._record, "_IN_PLACE_FOREACH", frozenset())
    reached.clear()
    without = estimator.estimate(step, build=build, steps=2)
    assert any(reached)  # the parameters' and states' too
    assert (with_skip.peak_allocated, with_skip.peak_reserved) == \
        (without.peak_allocated, without.peak_reserved)
    assert with_skip.torch_peak_reserved == without.torch_peak_reserved


def test_a_fake_tensor_s_device_is_answered_without_the_fake_mode():
    """``t.device`` is asked of fake tensors more often than every op together (autograd
    and the model's code ask it): the recorder answers it with the device the tensor
    stands for, and only a question its fake mode must answer (inside a fake kernel, where
    the answer is "meta") goes through. The device the step's code sees is unchanged."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    reached, seen, inside = [], set(), []
    dispatch = FakeTensorMode.dispatch
    recorder = estimator._record.StorageRecorder.__torch_dispatch__

    def counting(self, func, types, args=(), kwargs=None):
        if func is torch.ops.prim.device.default and inside:
            reached.append(func)
        return dispatch(self, func, types, args, kwargs)

    def recording(self, func, types, args=(), kwargs=None):
        if func is not torch.ops.prim.device.default:
            return recorder(self, func, types, args, kwargs)
        inside.append(func)  # a question put to the recorder, passed on or answered
        try:
            return recorder(self, func, types, args, kwargs)
        finally:
            inside.pop()

    def build():
        net = torch.nn.Sequential(*(_Block() for _ in range(2))).cuda()
        return net, torch.optim.AdamW(net.parameters()), torch.randn(8, WIDTH, device="cuda")

    def step(net, opt, x):
        seen.add(str(x.device))
        y = net(x)
        seen.add(str(y.device))
        y.pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FakeTensorMode, "dispatch", counting)
        patch.setattr(estimator._record.StorageRecorder, "__torch_dispatch__", recording)
        e = estimator.estimate(step, build=build, steps=2)
    assert e.peak_allocated > 0
    # One device throughout: the GPU's, or the CPU the stand-in computes on without one.
    assert len(seen) == 1 and seen <= {"cuda:0", "cpu"}, seen
    assert not reached, len(reached)


_PROBE = textwrap.dedent("""\
    # Loaded by site at start: says whether the interpreter tore its modules down
    # (this object's finalizer runs then) and whether the exit handlers ran.
    import atexit
    import os

    class _Probe:
        def __del__(self, write=os.write):
            write(2, b"torn down\\n")

    probe = _Probe()
    atexit.register(lambda write=os.write: write(2, b"exit handlers ran\\n"))
""")


def test_the_command_ends_without_teardown_but_runs_the_exit_handlers(tmp_path):
    """`vramkit estimate` skips the interpreter's teardown, never its exit handlers;
    the command line called in-process by a program returns to it, which ends as usual."""
    (tmp_path / "sitecustomize.py").write_text(_PROBE)
    args = ["estimate", "--model", "gpt2", "--batch", "1", "--seq", "16", "--json"]
    done = subprocess.run([sys.executable, "-m", "vramkit", *args], capture_output=True,
                          text=True, env=_env_with_path(tmp_path))
    assert done.returncode == 0, done.stderr
    assert '"peak_allocated"' in done.stdout
    assert "exit handlers ran" in done.stderr
    assert "torn down" not in done.stderr

    code = f"from vramkit.cli import main\nprint('returned', main({args!r}))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env_with_path(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "returned 0" in done.stdout
    assert "torn down" in done.stderr


def _env_with_path(folder) -> dict:
    import os
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH"))
                                        if p)
    return env

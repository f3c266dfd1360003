"""Tests of the what-if table computed in forked processes (estimator/_forked.py): the
table is the one computed in a single process, whether the children answer, fail, die
or cannot run autograd. A process forks only before its first backward pass, so each
case runs in a new interpreter; the script counts the forks it makes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import vramkit  # noqa: E402
from vramkit.plan.estimator import _forked  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))

# The script's preamble: the MLP the estimate tests measure, a make_batch for the batch
# rows, fork() counted, and the table printed as JSON rows.
_PREAMBLE = """
import json, os, sys
sys.path.insert(0, {here!r})
import torch
import vramkit
from estimate_mlp import _mlp_build, _step

forks = []
real_fork = os.fork
def counted_fork():
    pid = real_fork()
    if pid:
        forks.append(pid)
    return pid
os.fork = counted_fork
PARENT = os.getpid()

def table(processes, step=_step):
    advice = vramkit.advise(step, build=_mlp_build(), make_batch=lambda n: _mlp_build(n)(),
                            batch=64, model_workspaces=False, processes=processes)
    return [vars(r) for r in advice.rows]
"""


def _run(body: str) -> dict:
    script = _PREAMBLE.format(here=_HERE) + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_table_from_forked_processes_is_the_table_of_one_process():
    out = _run("""
        forked = table(3)
        made = len(forks)
        alone = table(1)
        print(json.dumps({"forked": forked, "alone": alone, "forks": made,
                          "after": len(forks)}))
    """)
    assert out["forks"] == 2  # three processes: this one and two children
    assert out["after"] == 2  # the second table, asked for alone, forked nothing
    assert out["forked"] == out["alone"]
    names = [r["variant"] for r in out["alone"]]
    assert names[0] == "as written"
    assert "bf16 autocast" in names and "batch 32 instead of 64" in names
    assert all(r["peak_reserved"] for r in out["alone"])


def test_a_process_that_ran_a_backward_pass_computes_the_rows_its_children_cannot():
    """Autograd refuses a child forked after its parent's backward pass: the children
    say so at once and the parent computes their rows; it forks no more after that. (On a
    GPU host the backward pass initializes the CUDA driver, autograd asking it for its
    devices, and the table forks nothing at all.)"""
    out = _run("""
        from vramkit.plan.estimator import _forked
        w = torch.ones(4, requires_grad=True)
        w.sum().backward()
        driver = _forked._cuda_initialized()
        after_backward = table(2)
        made = len(forks)
        again = table(2)
        print(json.dumps({"first": after_backward, "again": again, "forks": made,
                          "after": len(forks), "driver": driver}))
    """)
    assert out["forks"] == out["after"] == (0 if out["driver"] else 1)
    assert out["first"] == out["again"]
    assert len(out["first"]) >= 6


def test_a_child_that_dies_has_its_rows_computed_by_the_parent():
    """A child killed mid-table (here by the step itself, in the children only) leaves
    no hole: its rows are computed in the parent, and the table is the one computed
    alone."""
    out = _run("""
        import signal
        def dying_step(net, opt, x):
            if os.getpid() != PARENT:
                os.kill(os.getpid(), signal.SIGKILL)
            _step(net, opt, x)
        forked = table(2, dying_step)
        made = len(forks)
        alone = table(1)
        print(json.dumps({"forked": forked, "alone": alone, "forks": made}))
    """)
    assert out["forks"] == 1
    assert out["forked"] == out["alone"]


def test_a_child_whose_step_differs_is_not_believed():
    """A child whose step as written comes out otherwise than the parent's (here the step
    allocates more in the children) has its rows computed again in the parent."""
    out = _run("""
        held = []
        def other_step(net, opt, x):
            if os.getpid() != PARENT:
                held.append(torch.empty(1 << 20, device=x.device))
            _step(net, opt, x)
        forked = table(2, other_step)
        alone = table(1)
        print(json.dumps({"forked": forked, "alone": alone, "forks": len(forks)}))
    """)
    assert out["forks"] == 1
    assert out["forked"] == out["alone"]


def test_a_program_that_ignores_its_children_still_gets_the_table():
    """With SIGCHLD ignored the system reaps the children itself and waitpid() finds none;
    with fork() failing (no process to be had) the parent computes every row."""
    out = _run("""
        import signal
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        reaped = table(2)
        made = len(forks)
        from vramkit.plan.estimator import _forked
        _forked._forks_done.clear()
        def no_fork():
            raise BlockingIOError("Resource temporarily unavailable")
        os.fork = no_fork
        refused = table(2)
        alone = table(1)
        print(json.dumps({"reaped": reaped, "refused": refused, "alone": alone,
                          "forks": made}))
    """)
    assert out["forks"] == 1
    assert out["reaped"] == out["refused"] == out["alone"]


@pytest.mark.parametrize("processes", [0, -1, True, 1.5, "2"])
def test_processes_must_be_a_positive_int(processes):
    with pytest.raises(ValueError, match="processes must be a positive int"):
        vramkit.advise(lambda: None, processes=processes)


def test_no_process_forks_once_cuda_is_initialized(monkeypatch):
    monkeypatch.setattr(_forked, "_forks_done", [])
    assert _forked.processes_for(4, 9) == 4
    monkeypatch.setattr(_forked, "_cuda_initialized", lambda: True)
    assert _forked.processes_for(4, 9) == 1
    assert _forked.processes_for(None, 9) == 1


def test_the_processes_are_at_most_one_per_row_and_the_bound(monkeypatch):
    monkeypatch.setattr(_forked, "_forks_done", [])
    assert _forked.processes_for(16, 3) == 3
    assert _forked.processes_for(64, 64) == _forked.MOST_PROCESSES
    assert _forked.processes_for(1, 9) == 1


class _Driver:
    """libcuda as ctypes opens it, answering cuDeviceGetCount with ``answer``."""

    def __init__(self, answer: int):
        self.answer = answer

    def cuDeviceGetCount(self, _count):
        return self.answer


@pytest.mark.parametrize("answer, initialized", [(0, True), (3, False), (34, False)])
def test_a_driver_initialized_by_anyone_stops_the_forks(monkeypatch, answer, initialized):
    """``torch.cuda.is_available()`` calls cuInit without initializing PyTorch's CUDA; a
    child forked after that could not use the GPU. The driver is asked: it counts its
    devices (0, CUDA_SUCCESS) only once initialized; before, it answers
    CUDA_ERROR_NOT_INITIALIZED (3), and a stub library CUDA_ERROR_STUB_LIBRARY (34)."""
    monkeypatch.setattr(_forked, "_forks_done", [])
    monkeypatch.setattr(_forked.ctypes, "CDLL", lambda name: _Driver(answer))
    assert _forked._cuda_initialized() is initialized
    assert _forked.processes_for(4, 9) == (1 if initialized else 4)

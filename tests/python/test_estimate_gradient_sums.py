"""Tests that the estimator sums gradients as autograd does on a real device: two
gradients reaching one tensor (a residual connection's branches) are summed in place,
into the first, when autograd's buffer holds its last reference, and into a new tensor
when anything else still holds it. Fake tensors always take the second path; the
recording must show the first.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from vramkit.plan.estimator import _step  # noqa: E402

WIDTH = 256


def _build():
    return torch.nn.Linear(WIDTH, WIDTH).cuda(), torch.randn(64, WIDTH, device="cuda")


def _record(step):
    recording, _ = _step.record_step(step, (), {}, target=_step.choose_target("cuda", None),
                                     steps=2, build=_build)
    return recording


def _sums_made_in_backward(recording) -> int:
    return sum(1 for b in recording.blocks.values()
               if b.op == "add.Tensor" and b.phase == "backward")


def _balanced(recording) -> bool:
    """Every block is allocated once and freed at most once, after its allocation."""
    made, freed = set(), set()
    for op in recording.ops:
        if op[0] == "a":
            if op[1] in made:
                return False
            made.add(op[1])
        elif op[1] not in made or op[1] in freed:
            return False
        else:
            freed.add(op[1])
    return made == set(recording.blocks)


def test_two_branches_gradients_are_summed_in_place():
    def step(lin, x):
        h = lin(x)
        (torch.relu(h) * 2 + torch.sigmoid(h) * 3).sum().backward()

    recording = _record(step)
    assert _sums_made_in_backward(recording) == 0
    assert _balanced(recording)


def test_a_gradient_held_elsewhere_is_summed_into_a_new_tensor():
    kept = []

    def step(lin, x):
        h = lin(x)
        a, b = torch.relu(h), torch.sigmoid(h)
        for branch in (a, b):  # both branches' gradients kept until the step ends
            branch.grad_fn.register_hook(lambda grads_in, _out: kept.append(grads_in))
        (a * 2 + b * 3).sum().backward()
        kept.clear()

    held = _record(step)
    assert _sums_made_in_backward(held) == 2  # one per step
    assert _balanced(held)


def test_a_first_gradient_that_is_a_view_is_summed_into_a_new_tensor():
    """Autograd runs the branch made last first: here the transposed one, whose
    gradient reaches ``h`` as a view of a transposed tensor. A view keeps its base, so
    the storage has two holders, and the real step sums into a new tensor."""
    def step(lin, x):
        h = lin(x)
        s = torch.sigmoid(h)
        t = torch.relu(h.t().contiguous()).t()
        (s * 3 + t * 2).sum().backward()

    recording = _record(step)
    assert _sums_made_in_backward(recording) == 2  # one per step
    assert _balanced(recording)


def test_sparse_gradients_summed_are_recorded_as_made():
    """An embedding with sparse gradients used twice: its two sparse gradients are summed
    by autograd's sparse rules, which the in-place rule leaves alone."""
    def build():
        emb = torch.nn.Embedding(1000, 64, sparse=True).cuda()
        return emb, torch.randint(0, 1000, (8, 16), device="cuda")

    def step(emb, idx):
        (emb(idx).sum() + emb(idx[:, :4]).sum()).backward()

    recording, _ = _step.record_step(step, (), {}, target=_step.choose_target("cuda", None),
                                     steps=2, build=build)
    assert recording.peak_allocated > 0
    assert _balanced(recording)

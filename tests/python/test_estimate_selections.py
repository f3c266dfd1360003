"""Tests of the selections whose size depends on values the estimate cannot know (a
boolean mask over the batch or the loss, nonzero(), masked_select(), unique(), CTC's
alphas, non-maximum suppression): each is taken at its largest, the most the step can
take, and said so in the notes; those with no bound stay refused. They run on the CPU
stand-in for CUDA."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")
import vramkit  # noqa: E402
import vramkit.estimator  # noqa: E402,F401 - vramkit.estimator.UntraceableStep
from vramkit.plan.estimator import _selections  # noqa: E402

F = torch.nn.functional
_ROWS, _FEATURES, _CLASSES = 64, 32, 10


def _build():
    net = torch.nn.Linear(_FEATURES, _CLASSES).cuda()
    return (net, torch.optim.SGD(net.parameters(), lr=0.1),
            torch.randn(_ROWS, _FEATURES, device="cuda"),
            torch.randint(0, _CLASSES, (_ROWS,), device="cuda"))


def _note(e) -> str:
    return next((n for n in e.notes if "taken at their largest" in n), "")


def test_each_selection_has_its_largest_shape():
    """What each selection by the labels makes, seen by the step itself: every row kept,
    every label distinct; the backward pass through a masked activation and a
    masked_select runs."""
    seen = {}

    def step(net, opt, x, y):
        keep = y != 3
        seen["x[keep]"] = tuple(x[keep].shape)
        seen["x[:, mask]"] = tuple(x[:, x[0] > 0].shape)
        seen["x[keep, 0]"] = tuple(x[keep, 0].shape)
        seen["nonzero"] = tuple(keep.nonzero().shape)
        seen["where"] = tuple(tuple(t.shape) for t in torch.where(keep.view(8, 8)))
        seen["masked_select"] = tuple(torch.masked_select(x, keep[:, None]).shape)
        values, inverse, counts = torch.unique(y, return_inverse=True, return_counts=True)
        seen["unique"] = (tuple(values.shape), tuple(inverse.shape), tuple(counts.shape))
        seen["unique bool"] = tuple(torch.unique(keep).shape)
        out = net(x)
        loss = F.cross_entropy(out[keep], y[keep]) + torch.masked_select(out, keep[:, None]).sum()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    e = vramkit.estimate(step, build=_build, model_workspaces=False)
    assert seen == {
        "x[keep]": (_ROWS, _FEATURES), "x[:, mask]": (_ROWS, _FEATURES),
        "x[keep, 0]": (_ROWS,), "nonzero": (_ROWS, 1), "where": ((_ROWS,), (_ROWS,)),
        "masked_select": (_ROWS * _FEATURES,), "unique": ((_ROWS,), (_ROWS,), (_ROWS,)),
        "unique bool": (2,)}
    line = inspect.getsourcelines(step)[1] + 2  # x[keep], the first selection
    assert f"test_estimate_selections.py:{line}" in _note(e), e.notes


def test_a_masked_batch_takes_what_every_row_kept_takes():
    """A step that selects rows of its batch by their labels holds what the same step
    holds when it copies every row: the mask, the selected rows and labels, the
    activations made from them."""
    def masked(net, opt, x, y):
        keep = y != 3
        F.cross_entropy(net(x[keep]), y[keep]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def every_row(net, opt, x, y):
        keep = y != 3  # noqa: F841 - held as the masked step holds its mask
        F.cross_entropy(net(x.clone()), y.clone()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    got = vramkit.estimate(masked, build=_build, model_workspaces=False)
    want = vramkit.estimate(every_row, build=_build, model_workspaces=False)
    assert got.peak_allocated == want.peak_allocated
    assert got.peak_reserved == want.peak_reserved
    assert got.breakdown == want.breakdown
    assert _note(got) and not _note(want)


def test_a_mask_of_known_values_is_not_taken_at_its_largest():
    """A mask computed from known values alone (every second row, from arange) selects
    what it selects from the batch, whose values are unknown; no note."""
    seen = {}

    def step(net, opt, x, y):
        even = torch.arange(x.shape[0], device=x.device) % 2 == 0
        seen["rows"] = x[even].shape[0]
        seen["masked_select"] = torch.masked_select(x, even[:, None]).shape[0]
        net(x[even]).sum().backward()

    e = vramkit.estimate(step, build=_build, model_workspaces=False)
    assert seen == {"rows": _ROWS // 2, "masked_select": _ROWS // 2 * _FEATURES}
    assert not _note(e)


def test_ctc_alphas_take_the_longest_target():
    """CTC over targets that a mask selected from padded labels (as transformers' CTC
    heads do): the alphas CTC keeps for backward are batch x time x (2 x the longest
    target + 1), the longest target at most every label selected."""
    batch, time_steps, symbols, longest = 4, 50, 20, 12
    alphas = batch * time_steps * (2 * batch * longest + 1) * 4

    def build():
        net = torch.nn.Linear(16, symbols).cuda()
        labels = torch.randint(1, symbols, (batch, longest), device="cuda")
        return net, torch.randn(time_steps, batch, 16, device="cuda"), labels

    def step(net, x, labels):
        real = labels > 1
        log_probs = net(x).log_softmax(-1)
        F.ctc_loss(log_probs, labels.masked_select(real),
                   torch.full((batch,), time_steps, device="cuda"),
                   real.sum(-1)).backward()

    e = vramkit.estimate(step, build=build, model_workspaces=False)
    assert _note(e)
    assert e.breakdown["activations"] >= alphas


def test_nms_keeps_every_box():
    """Non-maximum suppression of boxes made from the batch keeps, at most, every box."""
    torchvision = pytest.importorskip("torchvision")
    seen = {}

    def step(net, opt, x, y):
        corners = net(x)[:, :2].abs()
        boxes = torch.cat([corners, corners + 1], dim=1)
        seen["kept"] = tuple(torchvision.ops.nms(boxes, x[:, 0], 0.5).shape)

    e = vramkit.estimate(step, build=_build, model_workspaces=False)
    assert seen["kept"] == (_ROWS,)
    assert _note(e)


def test_selections_with_no_bound_are_refused():
    """A count per label (bincount's length is the largest label) and the distinct
    values of more elements than are taken as all distinct are refused, naming the
    operation and the line."""
    many = _selections.UNIQUE_AT_MOST + 1

    def counts(net, opt, x, y):
        net(x).sum().backward(torch.bincount(y).sum().to(x.dtype))

    def distinct_of_many(net, opt, x, y):
        torch.unique(net(x.repeat(many // _ROWS + 1, 1)))

    for step, op in ((counts, "aten.bincount"), (distinct_of_many, "aten._unique2")):
        with pytest.raises(vramkit.estimator.UntraceableStep) as info:
            vramkit.estimate(step, build=_build, model_workspaces=False)
        line = inspect.getsourcelines(step)[1] + 1
        assert op in str(info.value) and f":{line} in {step.__name__}" in str(info.value)
        assert "no bound" in str(info.value)


def _scorer_build(boxes: int):
    """A build() of a box scorer and ``boxes`` boxes of four coordinates."""
    def build():
        net = torch.nn.Linear(4, 1).cuda()
        return net, torch.randn(boxes, 4, device="cuda")
    return build


def test_a_sampler_selects_at_most_what_it_marked():
    """A detector's sampler: two masks made from zeros, 128 positives and 384 negatives
    marked at positions drawn from a selection, and the union selected: at most 512 of
    the 2,000 proposals; through a copy to bool and an intersection too. A mask then
    written by an op the bounds do not follow (through a view) is unbounded again."""
    proposals, positives, negatives = 2000, 128, 384
    seen = {}

    def step(net, boxes):
        scores = net(boxes).squeeze(1)
        matched = torch.where(scores > 0)[0]
        pos = torch.zeros_like(scores, dtype=torch.uint8)
        neg = torch.zeros_like(scores, dtype=torch.uint8)
        pos[matched[torch.randperm(matched.numel(), device="cuda")[:positives]]] = 1
        neg[matched[torch.randperm(matched.numel(), device="cuda")[:negatives]]] = 1
        seen["union"] = torch.where(pos | neg)[0].shape[0]
        seen["bool copy"] = boxes[pos.bool()].shape[0]
        seen["intersection"] = torch.where((pos | neg) & (scores > 1))[0].shape[0]
        pos[:10].fill_(1)
        seen["after a write through a view"] = torch.where(pos)[0].shape[0]
        scores[torch.where(neg)[0]].sum().backward()

    e = vramkit.estimate(step, build=_scorer_build(proposals), model_workspaces=False)
    assert seen == {"union": positives + negatives, "bool copy": positives,
                    "intersection": positives + negatives,
                    "after a write through a view": proposals}
    assert _note(e)


def test_unique_finds_at_most_the_values_a_tensor_was_drawn_from():
    """A detector's levels: filled with one level per feature map, joined, then picked by
    the scores' top-k; unique() of them finds at most the four levels, and a loop over
    them (batched non-maximum suppression's) runs four times, not once per box. So do
    levels too large to have their values computed, and a choice between two of them. A
    tensor written since by values the estimate cannot know holds any of its elements."""
    boxes, kept, large = 64, 40, 70_000
    seen = {}

    def step(net, x):
        scores = net(x).squeeze(1)
        top = scores.topk(kept).indices
        levels = torch.cat([torch.full((boxes // 4,), i, device="cuda") for i in range(4)])
        picked = levels[top]
        passes = 0
        for level in torch.unique(picked):
            passes += 1
            scores[torch.where(picked == level)[0]].sum()
        seen["passes"] = passes
        many = torch.cat([torch.full((large,), i, device="cuda") for i in range(3)])
        seen["large"] = torch.unique(many[top].flip(0)).shape[0]
        chosen = torch.where(scores[top] > 0, picked, many[top])
        seen["chosen"] = torch.unique(chosen).shape[0]
        written = picked.clone()
        written[0] = scores.argmax()
        seen["written"] = torch.unique(written).shape[0]
        scores.sum().backward()

    e = vramkit.estimate(step, build=_scorer_build(boxes), model_workspaces=False)
    assert seen == {"passes": 4, "large": 3, "chosen": 4 + 3, "written": kept}
    assert _note(e)

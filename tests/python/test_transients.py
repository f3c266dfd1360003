"""Tests of an op's transient blocks as the estimator's models give them
(vramkit.estimator._transients): the sequence read from an allocator's history, the
checks on one read from a cache file, its peak, and the recorder placing each block where
the op made it. The history itself is read on a GPU (tests/gpu/test_torch_backend.py).
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from vramkit.estimator import _step  # noqa: E402
from vramkit.estimator import _transients as tr  # noqa: E402
from vramkit.estimator import scratch as sc  # noqa: E402
from vramkit.estimator import workspaces as ws  # noqa: E402
from helpers import AllocatorFigures, MiB  # noqa: E402
from test_op_scratch import _ln_build, _ln_train  # noqa: E402


def _alloc(addr, size):
    return {"action": "alloc", "addr": addr, "size": size}


def _free(addr):
    return [{"action": "free_requested", "addr": addr, "size": 0},
            {"action": "free_completed", "addr": addr, "size": 0}]


def test_the_sequence_keeps_the_blocks_made_and_freed_inside_the_call_in_their_order():
    entries = [
        _alloc(0x1000, 4096),            # the output: still live at the end
        *_free(0x9000),                  # a block made before the call
        _alloc(0x2000, 138412032),       # the staging buffer
        _alloc(0x3000, 12),              # the semaphore
        *_free(0x3000),
        *_free(0x2000),
        _alloc(0x2000, 700),             # the staging buffer's address, used again
        {"action": "snapshot", "addr": 0, "size": 0},
        *_free(0x2000),
    ]
    assert tr.sequence_of(entries) == (tr.OUTPUT, 138412032, 12, -2, -1, 700, -3)
    assert tr.sequence_of([_alloc(0x1000, 5)]) == ()  # outputs alone: nothing transient
    assert tr.is_transient(tr.sequence_of(entries))


def test_a_transient_read_from_a_file_is_checked_before_it_is_used():
    for good in (0, 5, (4096, 512, -2, -1), [7, -1, 9, -2], (), [5, 0, -1, 0]):
        assert tr.is_transient(good), good
    for bad in (-1, True, 1.5, "5", [5], [5, -1, -1], [-1, 5], [5, 0, -2], [5, -2],
                [5, True, -1], [1, -1] * (tr.MAX_STEPS // 2 + 1), {"a": 1}, None):
        assert not tr.is_transient(bad), bad


def test_the_peak_of_a_sequence_counts_the_allocator_s_512_byte_blocks():
    assert tr.transient_bytes(5000) == 5000
    assert tr.transient_bytes((1000, 12, -2, -1)) == 1024 + 512
    assert tr.transient_bytes((3 * MiB, -1, MiB, 100, -2, -3)) == 3 * MiB
    assert tr.transient_bytes(()) == 0
    assert tr.transient_bytes((0, 1000, 0, -1, 0)) == 1024
    assert tr.outputs_marked((0, 1000, 0, -1, 0)) == 3 and tr.outputs_marked(5000) == 0


def test_a_cache_with_sequences_reads_back_and_a_damaged_one_is_set_aside(tmp_path):
    path = tmp_path / "scratch.json"
    entries = {"sum.dim_IntList x": [4816896, 512, -2, -1], "mean.default y": 2048}
    path.write_text(json.dumps({"format": sc.CACHE_FORMAT, "entries": entries}))
    assert sc._read_cache(str(path)) == {"sum.dim_IntList x": (4816896, 512, -2, -1),
                                          "mean.default y": 2048}
    path.write_text(json.dumps({"format": sc.CACHE_FORMAT,
                                "entries": {"sum.dim_IntList x": [4816896, -2]}}))
    with pytest.warns(RuntimeWarning, match="ignored and will be rewritten"):
        assert sc._read_cache(str(path)) == {}


# A layer norm backward as the card makes it: two partial-gradient blocks, then for each
# of two column sums a staging buffer and its semaphore, freed in another order.
BACKWARD = (1024, 1024, 2408448, 2408448, 4816896, 512, -6, -5, 4816896, 512, -8, -7,
            -2, -4, -3, -1)


def test_the_recorder_makes_and_frees_each_measured_block_in_its_place(tmp_path, monkeypatch):
    monkeypatch.setenv("VRAMKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ws, "_MEASURED", {})

    def measure(call, device, reader=None, out_bytes=0, blocks=False):
        assert blocks  # the model asks for the blocks wherever they can be seen
        return BACKWARD if call.op == "native_layer_norm_backward.default" else 0

    monkeypatch.setattr(sc, "measure_op", measure)
    model = sc.OpScratchModel(torch.device("cpu"), reader=AllocatorFigures())
    recording, _ = _step.record_step(_ln_train, (), {}, target=_step.choose_target(),
                                     build=_ln_build(), steps=1,
                                     after_outputs_hook=model.hook)
    ops, blocks = recording.ops, recording.blocks
    first = next(i for i, op in enumerate(ops)
                 if op[0] == "a" and blocks[op[1]].site == sc.LABEL)
    made, replayed = [], []
    for op in ops[first:first + len(BACKWARD)]:
        if op[0] == "a":
            made.append(op[1])
            replayed.append(blocks[op[1]].requested)
            assert blocks[op[1]].op == "native_layer_norm_backward.default"
        else:
            replayed.append(-(made.index(op[1]) + 1))
    assert tuple(replayed) == BACKWARD
    assert all(blocks[b].freed and blocks[b].role == "workspaces" for b in made)
    # Kept on disk as measured, and read back as the same sequence.
    model.finish()
    (cache,) = (tmp_path / "cache").rglob("*.json")
    kept = sc._read_cache(str(cache))
    assert BACKWARD in kept.values()


def _peak_of(recording) -> int:
    """The peak allocated of a recording's ops, walked from nothing: what the recorder
    must have counted."""
    sizes, total, peak = {}, 0, 0
    for op in recording.ops:
        if op[0] == "a":
            sizes[op[1]] = op[2]
            total += op[2]
            peak = max(peak, total)
        else:
            total -= sizes[op[1]]
    return peak


# A layer norm forward as the card makes it on a strided input: a contiguous copy of the
# input, then its three outputs (normalized, mean, reciprocal deviation), then the copy
# freed.
FORWARD = (6 * MiB, tr.OUTPUT, tr.OUTPUT, tr.OUTPUT, -1)


def _recorded_with(tmp_path, monkeypatch, forward):
    monkeypatch.setenv("VRAMKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ws, "_MEASURED", {})
    monkeypatch.setattr(sc, "measure_op", lambda call, *a, **k: (
        forward if call.op == "native_layer_norm.default" else 0))
    model = sc.OpScratchModel(torch.device("cpu"), reader=AllocatorFigures())
    recording, _ = _step.record_step(_ln_train, (), {}, target=_step.choose_target(),
                                     build=_ln_build(), steps=1,
                                     after_outputs_hook=model.hook)
    return recording


def test_a_block_made_before_the_outputs_is_recorded_before_them(tmp_path, monkeypatch):
    recording = _recorded_with(tmp_path, monkeypatch, FORWARD)
    ops, blocks = recording.ops, recording.blocks
    at = next(i for i, op in enumerate(ops) if op[0] == "a" and blocks[op[1]].site == sc.LABEL)
    copy = ops[at][1]
    after = ops[at + 1:at + 5]
    assert [op[0] for op in after] == ["a", "a", "a", "f"]
    assert all(blocks[op[1]].op == "native_layer_norm.default" for op in after[:3])
    assert after[3] == ("f", copy)
    assert recording.peak_allocated == _peak_of(recording)


def test_the_peak_counts_the_block_where_it_was_made(tmp_path, monkeypatch):
    """The copy held with every output (after them, as before outputs were marked) and
    held only before them, as the layer norm does: the second peak is lower by the
    outputs' bytes wherever the copy made the step's peak."""
    after_outputs = _recorded_with(tmp_path / "a", monkeypatch, (6 * MiB, -1))
    before_outputs = _recorded_with(tmp_path / "b", monkeypatch,
                                    (6 * MiB, -1, tr.OUTPUT, tr.OUTPUT, tr.OUTPUT))
    assert after_outputs.peak_allocated == _peak_of(after_outputs)
    assert before_outputs.peak_allocated == _peak_of(before_outputs)
    outputs = sum(op[2] for op in before_outputs.ops if op[0] == "a"
                  and before_outputs.blocks[op[1]].op == "native_layer_norm.default"
                  and before_outputs.blocks[op[1]].site != sc.LABEL)
    assert after_outputs.peak_allocated - before_outputs.peak_allocated == outputs

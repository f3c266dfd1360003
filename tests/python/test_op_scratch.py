"""Tests of the other ops' scratch buffers in vramkit.estimate (vramkit.estimator.scratch):
the signature of an op call, the inputs built for it, the model that places a scratch
block right after an op's outputs, its measurement and cache, and the switch, on a machine
without a GPU: a stand-in measures (OP_SIZES), or real CPU calls with allocator figures
kept by the test (test_workspaces.py holds cuDNN's convolutions).
"""

from __future__ import annotations

import json
import pathlib
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

import vramkit  # noqa: E402
from vramkit.estimator import (CUBLAS_WORKSPACE_BYTES, CUBLASLT_WORKSPACE_BYTES,  # noqa: E402
                               _step)
from vramkit.estimator import scratch as sc  # noqa: E402
from vramkit.plan.estimator import _cuda_reduce as cr  # noqa: E402
from vramkit.estimator import workspaces as ws  # noqa: E402
from helpers import AllocatorFigures, MiB, rounded_block as _rounded  # noqa: E402

aten = torch.ops.aten


def test_the_signature_of_an_op_call_names_what_chooses_its_kernel():
    x = torch.randn(4, 6, 32)
    w, b = torch.randn(32), torch.randn(32)
    out, mean, rstd = aten.native_layer_norm.default(x, [32], w, b, 1e-5)
    call = sc.call_of(aten.native_layer_norm_backward.default,
                      (out, x, [32], mean, rstd, w, b, [True, False, True]), {})
    assert call.op == "native_layer_norm_backward.default"
    assert call.key == ("native_layer_norm_backward.default grad_out=float32[4,6,32] "
                        "input=float32[4,6,32] normalized_shape=[32] mean=float32[4,6,1] "
                        "rstd=float32[4,6,1] weight=float32[32] bias=float32[32] "
                        "output_mask=[True,False,True]")
    # The mask is part of it; eps, a value the kernel only computes with, is not.
    other_mask = sc.call_of(aten.native_layer_norm_backward.default,
                            (out, x, [32], mean, rstd, w, b, [True, True, True]), {})
    assert other_mask.key != call.key
    assert sc.call_of(aten.native_layer_norm.default, (x, [32], w, b, 1e-5), {}).key == \
        sc.call_of(aten.native_layer_norm.default, (x, [32], w, b, 0.1), {}).key
    # Strides where the view is not contiguous, its start modulo 256 bytes (alignment),
    # and the dims, keepdim and dtype of a reduction.
    view = torch.randn(3, 100)[:, 1:].t()
    (red,) = [sc.call_of(aten.sum.dim_IntList, (view, [0], True), {"dtype": torch.float64})]
    assert red.key == ("sum.dim_IntList self=float32[99,3]@1,100+1 dim=[0] keepdim=True "
                       "dtype=float64")
    far = torch.randn(3, 200)[:, 65:].t()  # 65 floats in: 260 bytes, 4 past an alignment
    assert "+1 " in sc.call_of(aten.sum.dim_IntList, (far, [0], True), {}).key
    # An op off the list has no signature, nor one whose tensors are all off the device
    # the estimate counts; nor the fused attention kernels, whose backwards take random
    # number state that zeros do not rebuild safely.
    assert sc.call_of(aten.mm.default, (torch.ones(2, 2), torch.ones(2, 2)), {}) is None
    assert sc.call_of(aten.sum.dim_IntList, (view, [0]), {}, device_type="cuda") is None
    q = torch.randn(1, 2, 8, 16)
    assert sc.call_of(aten._scaled_dot_product_flash_attention.default,
                      (q, q, q, 0.1, True), {"scale": 0.25}) is None


def test_the_builder_gives_zeros_in_the_same_layout_for_every_dtype():
    templates = [torch.randint(1, 9, (5, 7)).t(),                       # int64, strided
                 torch.randint(1, 9, (40,), dtype=torch.int32)[3:19],   # with an offset
                 torch.ones(3, 4, dtype=torch.bool),
                 torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
                 torch.randn(6).expand(4, 6),                           # a stride of 0
                 torch.randn(0, 3)]
    for template in templates:
        spec = sc.TensorSpec.of(template)
        built = sc.build_tensor(spec, torch.device("cpu"))
        assert built.dtype == template.dtype and built.shape == template.shape
        assert built.stride() == template.stride()
        assert (built.storage_offset() * built.element_size()) % 256 == \
            (template.storage_offset() * template.element_size()) % 256
        assert not built.any(), f"{template.dtype} not built as zeros"
    # A loss's targets (random class indices in the step) are built as zeros: in range.
    logits, target = torch.randn(4, 10), torch.randint(1, 10, (4,))
    call = sc.call_of(aten.nll_loss_forward.default, (logits, target, None, 1, -100), {})
    args, _ = call.build(torch.device("cpu"))
    assert args[1].dtype == torch.int64 and args[1].tolist() == [0, 0, 0, 0]
    assert args[2] is None and args[3:] == (1, -100)
    assert call.input_bytes() == (40 * 4 + 4 * 8)
    loss, total = call.runner(torch.device("cpu"))()
    assert total.item() == 4.0  # it runs: every target in range and counted
    # Tensors on the kind of device measured on go to that device; a CPU scalar beside
    # them (here meta stands for CUDA) stays on the CPU, and the signature marks it.
    logits, target = torch.empty(4, 10, device="meta"), torch.empty(4, dtype=torch.long,
                                                                    device="meta")
    call = sc.call_of(aten.nll_loss_backward.default,
                      (torch.tensor(1.0), logits, target, None, 1, -100, torch.tensor(4.0)), {})
    assert call.key.startswith("nll_loss_backward.default grad_output=float32[]/cpu "
                               "self=float32[4,10] target=int64[4] ")
    args, _ = call.build(torch.device("meta"))
    assert [a.device.type for a in args if isinstance(a, torch.Tensor)] == \
        ["cpu", "meta", "meta", "cpu"]
    assert call.input_bytes() == 40 * 4 + 4 * 8  # what goes on the device measured on


def _ln_build(batch=64, width=256, bias=True):
    def build():
        net = torch.nn.Sequential(torch.nn.Linear(width, width),
                                  torch.nn.LayerNorm(width, bias=bias))
        return net, torch.optim.SGD(net.parameters(), lr=0.1), torch.randn(batch, width)
    return build


def _ln_train(net, opt, x):
    net(x).sum(dim=1).pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


OP_SIZES = {"native_layer_norm.default": 3 * MiB + 100,
            "native_layer_norm_backward.default": 5 * MiB,
            "sum.dim_IntList": 7 * 1024, "mean.default": 2 * 1024}


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """Measurement by a stand-in: each op's size from OP_SIZES (0 for the rest), with the
    calls it was asked for; the cache in the test's own folder."""
    monkeypatch.setenv("VRAMKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ws, "_MEASURED", {})
    asked = []

    def measure(call, device, reader=None, out_bytes=0, blocks=False):
        asked.append(call.key)
        return OP_SIZES.get(call.op, 0)

    monkeypatch.setattr(sc, "measure_op", measure)
    return asked


def test_scratch_blocks_sit_right_after_the_op_outputs_and_are_freed_at_once(stand_in):
    model = sc.OpScratchModel(torch.device("cpu"), reader=AllocatorFigures())
    recording, _ = _step.record_step(_ln_train, (), {}, target=_step.choose_target(),
                                     build=_ln_build(), steps=2,
                                     after_outputs_hook=model.hook)
    ops, blocks = recording.ops, recording.blocks
    found = [i for i, op in enumerate(ops) if op[0] == "a" and blocks[op[1]].site == sc.LABEL]
    seen = Counter()
    for i in found:
        bid = ops[i][1]
        block = blocks[bid]
        assert ops[i + 1] == ("f", bid)  # freed before anything else happens
        assert block.role == "workspaces" and block.freed
        assert block.requested == OP_SIZES[block.op]
        assert block.size == _rounded(OP_SIZES[block.op])
        # Right after the op's outputs: the allocation before it is the op's own.
        assert ops[i - 1][0] == "a" and blocks[ops[i - 1][1]].op == block.op
        seen[block.op] += 1
    # In each of the two steps: layer norm forward and backward, the step's own sum over
    # dim 1 and mean, and the linear layer's bias gradient (a sum over dim 0).
    assert seen == {"native_layer_norm.default": 2, "native_layer_norm_backward.default": 2,
                    "sum.dim_IntList": 4, "mean.default": 2}
    # Measured once per signature (the two sums are two), not once per call.
    assert len(stand_in) == len(set(stand_in)) == 5
    assert model.counts() == {"measured": 5}
    assert model.by_op() == {"native_layer_norm.default": 1, "sum.dim_IntList": 2,
                             "native_layer_norm_backward.default": 1, "mean.default": 1}
    # The backward's output gradient comes expanded from the sum's backward (a stride of
    # 0): the signature says so, as the real kernel copies it contiguous first.
    (backward,) = [k for k in stand_in if k.startswith("native_layer_norm_backward")]
    assert "grad_out=float32[64,256]@1,0 " in backward


def _wide_norm(batch=2048, width=1024, then_bigger=False):
    """No grad: one layer norm whose outputs meet the step's peak (its input and output
    live together), or, with then_bigger, followed by a larger tensor."""
    def build():
        return (torch.nn.LayerNorm(width), torch.randn(batch, width))

    def step(norm, x):
        with torch.no_grad():
            y = norm(x)
            if then_bigger:
                return y.repeat(4, 1)
            return y
    return build, step


def test_a_scratch_block_on_the_peak_raises_it_by_its_size(stand_in):
    build, step = _wide_norm()
    peaks = {}
    for hooked in (False, True):
        model = sc.OpScratchModel(torch.device("cpu"), reader=AllocatorFigures())
        recording, _ = _step.record_step(step, (), {}, target=_step.choose_target(),
                                         build=build, steps=1,
                                         after_outputs_hook=model.hook if hooked else None)
        peaks[hooked] = recording.peak_allocated
    assert peaks[True] - peaks[False] == _rounded(OP_SIZES["native_layer_norm.default"])
    # Away from the peak it changes no peak.
    build, step = _wide_norm(then_bigger=True)
    model = sc.OpScratchModel(torch.device("cpu"), reader=AllocatorFigures())
    with_it, _ = _step.record_step(step, (), {}, target=_step.choose_target(), build=build,
                                   steps=1, after_outputs_hook=model.hook)
    without, _ = _step.record_step(step, (), {}, target=_step.choose_target(), build=build,
                                   steps=1)
    assert with_it.peak_allocated == without.peak_allocated


class _OpReader(AllocatorFigures):
    """Allocator figures for real CPU calls: each call's outputs count, and the call
    'uses' a scratch buffer of a quarter of them; ``room`` is what the device could give."""

    def __init__(self, room=1 << 40):
        super().__init__()
        self.room = room

    def available(self, device):
        return self.room

    def observe(self, out):
        outs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        size = sum(_rounded(t.untyped_storage().nbytes()) for t in outs)
        self.calls.append(size)
        self.top = max(self.top, self.level + size + size // 4)
        self.level += size
        self.held = max(self.held, self.top)


def test_measuring_runs_each_op_for_real_and_keeps_what_it_found(tmp_path, monkeypatch):
    monkeypatch.setenv("VRAMKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ws, "_MEASURED", {})
    reader = _OpReader()
    model = sc.OpScratchModel(torch.device("cpu"), reader=reader)
    recording, _ = _step.record_step(_ln_train, (), {}, target=_step.choose_target(),
                                     build=_ln_build(), steps=2,
                                     after_outputs_hook=model.hook)
    model.finish()
    signatures = len(model._how)
    assert signatures >= 4 and model.counts() == {"measured": signatures}
    # Each signature ran on its own once measured (the warm-up call is not observed), and
    # its size is what the reader saw that call 'use'.
    assert len(reader.calls) == signatures
    sizes = sorted(b.requested for b in recording.blocks.values() if b.site == sc.LABEL)
    assert sizes and all(s > 0 for s in sizes)
    assert set(sizes) == {c // 4 for c in reader.calls if c // 4}
    assert reader.emptied == 1
    (note,) = [n for n in model.notes() if "measured on this GPU" in n]
    assert f"(cpu) for {signatures} of the step's {signatures} op signatures" in note
    cache = ws.cache_path(ws.device_identity(torch.device("cpu")), sc.CACHE_FOLDER)
    assert cache.startswith(str(tmp_path / "cache")) and "op-scratch" in cache
    kept = json.loads(pathlib.Path(cache).read_text())
    assert kept["format"] == sc.CACHE_FORMAT and set(kept["entries"]) == set(model._how)
    # A new process reads the file and measures nothing.
    monkeypatch.setattr(ws, "_MEASURED", {})
    fresh_reader = _OpReader()
    fresh = sc.OpScratchModel(torch.device("cpu"), reader=fresh_reader)
    _step.record_step(_ln_train, (), {}, target=_step.choose_target(), build=_ln_build(),
                      steps=1, after_outputs_hook=fresh.hook)
    assert fresh.counts() == {"cached": signatures} and fresh_reader.calls == []


def test_without_the_memory_or_when_the_op_fails_it_counts_zero(tmp_path, monkeypatch):
    monkeypatch.setenv("VRAMKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ws, "_MEASURED", {})
    # The device could give 64 bytes: no op's inputs of the step fit in half of that.
    model = sc.OpScratchModel(torch.device("cpu"), reader=_OpReader(room=64))
    recording, _ = _step.record_step(_ln_train, (), {}, target=_step.choose_target(),
                                     build=_ln_build(bias=False), steps=1,
                                     after_outputs_hook=model.hook)
    # The layer norm's backward (a weight's gradient without a bias's: a sequence the rules
    # do not follow) counts 0; the layer norm's forward, the sums and the mean take their
    # derived blocks (none here).
    assert len(model._how) == 5 and model.counts() == {"no_memory": 1, "derived": 4}
    assert not any(b.site == sc.LABEL for b in recording.blocks.values())
    assert "lacked the memory to measure the scratch buffers of 1 op signatures" in \
        " ".join(model.notes())

    def refused(*args, **kwargs):
        raise RuntimeError("CUDA error: an unsupported configuration\nmore")

    monkeypatch.setattr(ws, "measure_transient", refused)
    model = sc.OpScratchModel(torch.device("cpu"), reader=_OpReader())
    _step.record_step(_ln_train, (), {}, target=_step.choose_target(), build=_ln_build(bias=False),
                      steps=1, after_outputs_hook=model.hook)
    assert model.counts() == {"failed": 1, "derived": 4}
    assert "could not be measured on this GPU (the first: native_layer_norm_backward.default: " \
           "RuntimeError: CUDA error: an unsupported configuration)" in " ".join(model.notes())


def test_without_a_device_one_note_says_how_many_signatures_were_left_out():
    e = vramkit.estimate(_ln_train, build=_ln_build(bias=False))
    model = sc.OpScratchModel(None)
    _step.record_step(_ln_train, (), {}, target=_step.choose_target(), build=_ln_build(bias=False),
                      steps=2, after_outputs_hook=model.hook)
    count = len(model._how)
    # The sums, the mean and the layer norm's forward derived (no block at these sizes),
    # its backward (a weight's gradient without a bias's) left to a GPU.
    assert count == 5 and model.counts() == {"derived": 4, "none": 1}
    derived, left = [n for n in e.notes if "scratch buffers" in n]
    assert derived == ("the scratch buffers of 4 op signatures (mean, native_layer_norm, "
                       "sum) follow from ATen's CUDA kernels and were derived from their "
                       "shapes")
    assert left.startswith("scratch buffers that ops allocate and free inside themselves "
                           "were not modelled for 1 of the step's 5 op signatures "
                           "(native_layer_norm_backward 1): ")
    assert "none here" in left
    # cuBLAS's and cuBLASLt's (the linear layer's bias), nothing added without a device.
    # cuBLAS's workspaces of forward's thread and of backward's, and cuBLASLt's
    assert e.breakdown["workspaces"] == 2 * CUBLAS_WORKSPACE_BYTES + CUBLASLT_WORKSPACE_BYTES


def _softmax_step_estimates():
    """A softmax's step estimated with op scratch and without, and the product block its
    backward makes: (with, without, the block's bytes), on the peak of the step."""
    shape = (16, 256, 300)

    def build():
        return torch.zeros(shape, requires_grad=True)

    def step(x):
        x.softmax(-1).backward(torch.ones(shape))

    with_scratch = vramkit.estimate(step, build=build, model_workspaces="scratch")
    without = vramkit.estimate(step, build=build, model_workspaces=False)
    return with_scratch, without, _rounded(16 * 256 * 300 * 4)


def test_without_a_device_softmax_backward_takes_the_product_it_makes():
    """Softmax's CUDA backward multiplies the gradient by the output into a new tensor
    before its kernel runs: a machine without a GPU derives that block from the shapes, in
    the product's dtype, and puts it after the gradient it returns, on the peak here."""
    with_scratch, without, product = _softmax_step_estimates()
    assert with_scratch.peak_allocated == without.peak_allocated + product
    assert (sc.LABEL, product, 1) in with_scratch.top_sites
    derived = [n for n in with_scratch.notes if "derived" in n]
    assert derived == ["the scratch buffers of 1 op signatures (_softmax_backward_data) "
                       "follow from ATen's CUDA kernels and were derived from their shapes"]
    (left,) = [n for n in with_scratch.notes if "not modelled" in n]
    assert "_softmax_backward_data" not in left and "_softmax 1" in left
    # The product's dtype: a 16-bit softmax's own, and fp32 where the softmax of a 16-bit
    # input was taken in fp32 (the gradient and output fp32, the input's dtype fp16).
    backward = torch.ops.aten._softmax_backward_data.default
    for dtype, input_dtype, itemsize in ((torch.bfloat16, torch.bfloat16, 2),
                                         (torch.float32, torch.float16, 4)):
        grad = torch.zeros(16, 256, 300, dtype=dtype)
        call = sc.call_of(backward, (grad, grad.clone(), -1, input_dtype), {})
        assert sc.derived_size(call) == (0, 16 * 256 * 300 * itemsize, -1)
    assert sc.derived_size(sc.call_of(backward, (torch.zeros(0, 5),) * 2 + (-1, torch.float32),
                                      {})) == 0


def test_without_a_device_the_composite_attention_softmax_takes_its_masks():
    """The composite attention's softmax makes its output, then a bool a score (which are
    -inf), a bool a row (which are so whole) and a zero of the output's dtype, and frees
    them: on a machine without a GPU, derived from the shapes; the estimate has them."""
    safe = torch.ops.aten._safe_softmax.default
    scores = torch.zeros(4, 8, 128, 300, dtype=torch.bfloat16)
    call = sc.call_of(safe, (scores, -1), {})
    assert sc.derived_size(call) == (0, 4 * 8 * 128 * 300, 4 * 8 * 128, 2, -3, -2, -1)
    in_fp32 = sc.call_of(safe, (scores, -1, torch.float32), {})
    assert sc.derived_size(in_fp32)[3] == 4
    assert sc.derived_size(sc.call_of(safe, (torch.zeros(0, 7), -1), {})) == 0

    def build():
        return torch.zeros(4, 8, 128, 300)

    def step(x):
        return safe(x, -1)

    with_scratch = vramkit.estimate(step, build=build, model_workspaces="scratch")
    without = vramkit.estimate(step, build=build, model_workspaces=False)
    masks = _rounded(4 * 8 * 128 * 300) + _rounded(4 * 8 * 128) + _rounded(4)
    assert with_scratch.peak_allocated == without.peak_allocated + masks


# Staging buffers and semaphores of sums and means measured on an H100 80GB HBM3 with
# PyTorch 2.11 (bench/op_scratch_grid.py, 2026-12-07): (shape, dims, dtype) -> blocks.
MEASURED_REDUCTIONS = [
    ((4096, 64), [0], torch.float32, (0, 524288, 4, -2, -1)),
    ((16384, 768), [0], torch.bfloat16, (0, 100663296, 24, -2, -1)),
    ((65536, 768), [0], torch.float32, (0, 138412032, 24, -2, -1)),     # at the cap
    ((16384, 4096), [0], torch.float16, (0, 138412032, 128, -2, -1)),
    ((65536, 1000), [0], torch.float32, (0, 135168000, 32, -2, -1)),
    ((4096, 1000), None, torch.float32, (0, 2000, 4, -2, -1)),           # a whole sum
    ((65536, 4096), None, torch.bfloat16, (0, 8192, 4, -2, -1)),
    ((262144, 64), [1], torch.float32, 0),                                # rows: none
]


@pytest.mark.parametrize("shape, dims, dtype, blocks", MEASURED_REDUCTIONS)
def test_a_reductions_staging_is_derived_as_the_card_made_it(shape, dims, dtype, blocks):
    """Where several blocks of a sum's launch share an output they meet in a staging
    buffer with a semaphore per column of blocks: a machine without a GPU follows the
    launch configuration (_cuda_reduce.py) to the blocks the card made."""
    x = torch.zeros(shape, dtype=dtype)
    op, args = ((torch.ops.aten.sum.default, (x,)) if dims is None
                else (torch.ops.aten.sum.dim_IntList, (x, dims)))
    assert sc.derived_size(sc.call_of(op, args, {})) == blocks
    if dims is not None:  # a mean launches the same configuration
        mean = sc.call_of(torch.ops.aten.mean.dim, (x, dims, True), {})
        assert sc.derived_size(mean) == blocks


# linalg_vector_norm's blocks on the same card (bench/op_scratch_grid.py, 2026-12-07 12:14
# UTC): every order runs the reduction launch a sum does.
MEASURED_NORMS = [
    ((4096, 64), [0], torch.float16, (0, 524288, 4, -2, -1)),
    ((4096, 1000), [0], torch.bfloat16, (0, 32768000, 32, -2, -1)),
    ((65536, 768), [0], torch.float32, (0, 138412032, 24, -2, -1)),
    ((4096, 768), None, torch.float16, (0, 1536, 4, -2, -1)),             # a whole norm
    ((65536, 4096), None, torch.bfloat16, (0, 8192, 4, -2, -1)),
    ((65536, 4096), [1], torch.float32, 0),                               # rows: none
]


@pytest.mark.parametrize("shape, dims, dtype, blocks", MEASURED_NORMS)
def test_a_vector_norms_staging_is_derived_as_the_card_made_it(shape, dims, dtype, blocks):
    """Adafactor's norms: the staging buffer and semaphores of the launch configuration,
    as for a sum; an H100 made these (171 calls of the grid, every one as derived)."""
    x = torch.empty(shape, dtype=dtype, device="meta")
    args = (x,) if dims is None else (x, 2, dims)
    call = sc.call_of(torch.ops.aten.linalg_vector_norm.default, args, {})
    assert sc.derived_size(call) == blocks


def test_group_norms_coefficients_are_derived_as_the_card_made_them():
    """Group norm keeps per-sample, per-channel (and in backward per-group) coefficients
    after its outputs; on an H100 (bench/op_scratch_grid.py, 2026-12-07) every dtype and
    spatial size gave these sequences."""
    aten = torch.ops.aten
    x = torch.zeros(32, 512, 8, 8, dtype=torch.bfloat16)
    w, b = torch.ones(512, dtype=torch.bfloat16), torch.zeros(512, dtype=torch.bfloat16)
    y, mean, rstd = aten.native_group_norm(x, w, b, 32, 512, 64, 32, 1e-5)
    forward = sc.call_of(aten.native_group_norm.default, (x, w, b, 32, 512, 64, 32, 1e-5), {})
    assert sc.derived_size(forward) == (0, 0, 0, 65536, 65536, -2, -1)
    backward = aten.native_group_norm_backward.default
    both = (y, x, mean, rstd, w, 32, 512, 64, 32)
    assert sc.derived_size(sc.call_of(backward, both + ([True, True, True],), {})) == (
        0, 0, 0, 65536, 65536, 4096, 4096, 65536, -4, -3, -5, -2, -1)
    # Without the weight's gradient the kernel's sequence is another: not derived.
    assert sc.derived_size(sc.call_of(backward, both + ([True, False, False],), {})) is None


def _layer_norm_backward_call(rows, columns, dtype, mask=(True, True, True)):
    """A layer norm backward's call on meta tensors (no memory: the rows are many)."""
    meta = dict(device="meta")
    x = torch.empty(rows, columns, dtype=dtype, **meta)
    stats = torch.empty(rows, 1, **meta)
    weight = torch.empty(columns, dtype=dtype, **meta)
    return sc.call_of(torch.ops.aten.native_layer_norm_backward.default,
                      (torch.empty_like(x), x, [columns], stats, stats, weight, weight,
                       list(mask)), {})


def test_layer_norms_two_pass_weight_gradients_are_derived_as_the_card_made_them():
    """Past 64 Ki rows of few columns, layer norm's backward sums its weight's and bias's
    gradients in partial buffers and then a column sum of each, whose results replace the
    gradients made first; the sequences an H100 made (bench/op_scratch_grid.py,
    2026-12-07). Fewer rows, or columns enough to fill the card, make no block."""
    assert sc.derived_size(_layer_norm_backward_call(131072, 64, torch.float32)) == (
        0, 256, 256, 1048576, 1048576, 0, 524288, 4, -6, -5, -1,
        0, 524288, 4, -8, -7, -2, -4, -3)
    assert sc.derived_size(_layer_norm_backward_call(131072, 768, torch.bfloat16)) == (
        0, 1536, 1536, 2096640, 2096640, 0, 8650752, 24, -6, -5, -1,
        0, 8650752, 24, -8, -7, -2, -4, -3)
    for rows, columns in ((65536, 768), (131072, 4096), (25216, 768)):
        assert sc.derived_size(_layer_norm_backward_call(rows, columns, torch.float16)) == 0
    # No weight (an elementwise_affine=False norm): nothing to sum, nothing made.
    no_affine = _layer_norm_backward_call(131072, 64, torch.float32, (True, False, False))
    assert sc.derived_size(no_affine) == 0


def test_layer_norms_forward_makes_no_block_of_its_own():
    """Layer norm's forward writes its outputs and allocates nothing else: on an H100 no
    block for 7 row counts x 2 widths x 3 dtypes (bench/op_scratch_grid.py, 2026-12-07)."""
    forward = torch.ops.aten.native_layer_norm.default
    x = torch.empty(131072, 768, dtype=torch.bfloat16, device="meta")
    w = torch.empty(768, dtype=torch.bfloat16, device="meta")
    assert sc.derived_size(sc.call_of(forward, (x, [768], w, w, 1e-5), {})) == 0
    assert sc.derived_size(sc.call_of(forward, (x, [768], None, None, 1e-5), {})) == 0


def _channels_last_view(batch=128, channels=96, side=56, dtype=torch.float32):
    """What timm's LayerNorm2d gives layer norm: an NCHW activation permuted to NHWC, a
    view whose channels are not innermost in memory."""
    return torch.empty(batch, channels, side, side, dtype=dtype,
                       device="meta").permute(0, 2, 3, 1)


def test_layer_norm_copies_a_strided_input_before_its_outputs():
    """ATen's CUDA layer norm takes its input with expect_contiguous(): a permuted view is
    copied before the output and the two statistics are made, and freed on return. The
    real ConvNeXt step's stem (timm, bf16 autocast, batch 128, on an H100) shows that
    fp32 copy of 128 x 56 x 56 x 96 between the autocast cast and the output."""
    forward = torch.ops.aten.native_layer_norm.default
    view = _channels_last_view()
    w = torch.empty(96, device="meta")
    copy = 128 * 56 * 56 * 96 * 4
    assert sc.derived_size(sc.call_of(forward, (view, [96], w, w, 1e-6), {})) == (
        copy, 0, 0, 0, -1)
    # A view contiguous as ATen counts it (a dimension of one element with any stride, a
    # storage offset) is not copied.
    rows = torch.empty(4097, 768, device="meta").as_strided((4096, 1, 768), (768, 5, 1), 768)
    assert sc.derived_size(sc.call_of(forward, (rows, [768], None, None, 1e-5), {})) == 0
    # A strided weight would be copied too, at a place not followed: not derived.
    strided_w = torch.empty(2, 96, device="meta")[0, :].as_strided((96,), (2,))
    assert sc.derived_size(sc.call_of(forward, (view, [96], strided_w, w, 1e-6), {})) is None


def test_layer_norm_backward_copies_strided_inputs_where_aten_does():
    """The backward copies a strided input first (expect_contiguous) and a strided output
    gradient after its own gradients are made (dY.contiguous(), for the kernels), freeing
    the gradient's copy when the kernels are done and the input's on return. The input's
    copy and its place are the real ConvNeXt stem's: a 154 MB block before the input's
    gradient, freed after the partial sums."""
    backward = torch.ops.aten.native_layer_norm_backward.default
    view = _channels_last_view()
    rows, copy = 128 * 56 * 56, 128 * 56 * 56 * 96 * 4
    stats = torch.empty(rows, 1, device="meta")
    w = torch.empty(96, device="meta")
    dense_grad = torch.empty(128, 56, 56, 96, device="meta")
    contiguous = sc.derived_size(sc.call_of(
        backward, (dense_grad, dense_grad, [96], stats, stats, w, w, [True] * 3), {}))
    strided_input = sc.derived_size(sc.call_of(
        backward, (dense_grad, view, [96], stats, stats, w, w, [True] * 3), {}))
    # The same sequence, the copy first and freed last, every other block one on.
    shifted = tuple(step - 1 if step < 0 else step for step in contiguous)
    assert strided_input == (copy,) + shifted + (-1,)
    both = sc.derived_size(sc.call_of(
        backward, (view, view, [96], stats, stats, w, w, [True] * 3), {}))
    # ... and the gradient's copy after the two gradients made first, before the partials.
    assert both[:5] == (copy, 0, 96 * 4, 96 * 4, copy)
    assert both[-2:] == (-4, -1) and both.count(copy) == 2
    # Few rows: no partial sums, the copies alone around the three gradients.
    small = torch.empty(64, 256, device="meta")
    expanded = torch.empty(64, 1, device="meta").expand(64, 256)
    small_stats, small_w = torch.empty(64, 1, device="meta"), torch.empty(256, device="meta")
    assert sc.derived_size(sc.call_of(
        backward, (expanded, small, [256], small_stats, small_stats, small_w, small_w,
                   [True] * 3), {})) == (0, 0, 0, 64 * 256 * 4, -1)


def test_a_reduction_past_32_bit_indexing_stages_each_of_its_launches():
    """A view past 32-bit offsets is reduced in launches of halves, each with its own
    staging buffer and semaphores, made and freed in turn: the column sum of DistilBERT's
    logits' gradient (32,768 rows of a 30,522-word vocabulary, fp32: the vocabulary
    projection's bias gradient), which the card made as two 62,509,056-byte buffers and
    two semaphore blocks (H100, 2026-12-07, bench/record_step.py vramkit "distilbert
    fp32"; the semaphores' 1,908 bytes in a 2,048-byte block)."""
    logits = torch.empty(32768, 30522, device="meta")
    call = sc.call_of(torch.ops.aten.sum.dim_IntList, (logits, [0], True), {})
    assert sc.derived_size(call) == (0, 62509056, 1908, -2, -1, 62509056, 1908, -4, -3)
    # Halves of halves, first half first, until each launch fits.
    assert [shape for shape, _ in cr.launches((1 << 22, 1024), (1024, 1), 0, 2)] == \
        [(1 << 20, 1024)] * 4
    assert cr.launches((4, 8), (8, 1), 3, 4) == [((4, 8), 3)]


def test_a_broadcast_or_integer_reduction_is_not_derived():
    """A broadcast input (which the iterator orders by rules the model does not follow)
    and an integer sum are left to the GPU: None, where a sum whose launch needs no
    staging is derived as 0 (MEASURED_REDUCTIONS)."""
    ones = torch.ones(()).expand(65536, 768)   # a gradient of .sum(): one value, broadcast
    assert sc.derived_size(sc.call_of(torch.ops.aten.sum.dim_IntList, (ones, [0]), {})) is None
    counts = torch.zeros(65536, 768, dtype=torch.int64)
    sums = sc.call_of(torch.ops.aten.sum.dim_IntList, (counts, [0]), {})
    assert sc.derived_size(sums) is None


def test_the_notes_name_each_op_once_whatever_its_overloads():
    """sum.dim_IntList and sum.default are one op to a reader: "sum 2", not "sum 1, sum 1";
    integer sums are left to a GPU, float sums derived."""
    def build():
        return torch.zeros(64, 32), torch.zeros(64, 32, dtype=torch.int64)

    def step(x, counts):
        return x.sum(0) + x.sum(), counts.sum(0) + counts.sum()

    notes = vramkit.estimate(step, build=build, model_workspaces="scratch").notes
    assert ("the scratch buffers of 2 op signatures (sum) follow from ATen's CUDA kernels "
            "and were derived from their shapes") in notes
    (left,) = [n for n in notes if "not modelled" in n]
    assert "op signatures (sum 2): " in left


def test_a_call_the_device_could_not_measure_is_derived(stand_in, monkeypatch):
    """On a GPU, a call whose measurement fails (or finds no memory to spare, or comes
    after the time budget) takes what ATen's host code says rather than 0."""
    class OnTheCpu(sc.OpScratchModel):
        """The model as on a GPU: the CPU stands for the device."""

        def __init__(self, device=None, **kwargs):
            super().__init__(torch.device("cpu"), reader=AllocatorFigures())

    def refused(call, device, reader=None, out_bytes=0, blocks=False):
        if call.op == "_softmax_backward_data.default":
            raise RuntimeError("no kernel for this layout")
        return None if call.op == "sum.dim_IntList" else 0

    monkeypatch.setattr(sc, "OpScratchModel", OnTheCpu)
    monkeypatch.setattr(sc, "measure_op", refused)
    with_scratch, without, product = _softmax_step_estimates()
    assert with_scratch.peak_allocated == without.peak_allocated + product
    assert any("(_softmax_backward_data)" in n and "derived" in n for n in with_scratch.notes)
    assert not any("could not be measured" in n for n in with_scratch.notes)


def test_the_switch_turns_op_scratch_on_and_off(stand_in, monkeypatch):
    class OnTheCpu(sc.OpScratchModel):
        """The model as on a GPU: the CPU stands for the device, the stand-in measures."""

        def __init__(self, device=None, **kwargs):
            super().__init__(torch.device("cpu"), reader=AllocatorFigures())

    monkeypatch.setattr(sc, "OpScratchModel", OnTheCpu)
    build, step = _wide_norm()
    size = _rounded(OP_SIZES["native_layer_norm.default"])
    none = vramkit.estimate(step, build=build, model_workspaces=False)
    only = vramkit.estimate(step, build=build, model_workspaces="scratch")
    assert only.peak_allocated == none.peak_allocated + size
    assert only.breakdown["workspaces"] == size
    assert (sc.LABEL, size, 1) in only.top_sites
    # True models it too (and cuBLAS's, which a step without a matrix product has none of).
    assert vramkit.estimate(step, build=build).peak_allocated == none.peak_allocated + size
    others = vramkit.estimate(step, build=build, model_workspaces=("cublas", "cudnn"))
    assert others.peak_allocated == none.peak_allocated
    assert not any("scratch" in n for n in others.notes + none.notes)
    assert any("op scratch buffers" in n for n in only.notes)
    with pytest.raises(ValueError):
        vramkit.estimate(step, build=build, model_workspaces=("scratch", "ops"))


def test_no_op_that_takes_random_state_is_measured():
    """Ops whose inputs carry random-number state (fused attention's backwards take the
    forward's philox seed and offset; dropout's masks) are never rebuilt from zeros and run
    on the device: one such measurement crashed the process on an H200."""
    from vramkit.estimator import scratch as sc
    names = [op for op in sc.SCRATCH_OPS]
    assert names, "the allow-list is empty"
    assert not [op for op in names if "attention" in op or "dropout" in op]

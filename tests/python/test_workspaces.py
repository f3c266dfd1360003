"""Tests of the cuDNN workspace model of vramkit.estimate (vramkit.estimator.workspaces)
and of bench/cudnn_workspace_probe.py's record path (the other ops' scratch buffers are
test_op_scratch.py's), on a machine without a GPU: tables written
here (or made by the probe's --dry-run), and stand-ins for the allocator, or for the
measurement, where the estimator measures on a device. Sizes are checked against the
tables' and the stand-ins' own numbers.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import vramkit  # noqa: E402
from vramkit.estimator import CUBLAS_WORKSPACE_BYTES, _step  # noqa: E402
from vramkit.estimator import workspaces as ws  # noqa: E402
from vramkit.estimator.workspace_table import rule_errors  # noqa: E402
from helpers import AllocatorFigures, rounded_block as _rounded  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROBE = ROOT / "bench" / "cudnn_workspace_probe.py"
MiB = 1 << 20


def _probe_module():
    spec = importlib.util.spec_from_file_location("cudnn_workspace_probe", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def table_file(tmp_path, monkeypatch):
    """Point the estimator at a table of the test's own: write(entries, rule) fills it."""
    path = tmp_path / "table.json"
    monkeypatch.setattr(ws, "TABLE_PATH", str(path))

    def write(entries, rule=None, measured_on=None):
        ws.Table(entries, rule or {}, measured_on or {"device": "Test GPU"}).save(str(path))
        return path

    write({})
    return write


def _conv_net():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2, padding=1),
                               torch.nn.ReLU(),
                               torch.nn.Conv2d(16, 32, 3, padding=1, bias=False))


def _conv_build(batch=4, size=32):
    def build():
        net = _conv_net()
        return net, torch.optim.SGD(net.parameters(), lr=0.1), torch.randn(batch, 3, size, size)
    return build


def _train(net, opt, x):
    net(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _signatures(build, step=_train):
    """The convolution signatures one recording of the step meets, by key."""
    model = ws.ConvWorkspaceModel(table_path=str(ROOT / "python/vramkit/plan/estimator/data/"
                                                 "cudnn_workspaces.json"))
    _step.record_step(step, (), {}, target=_step.choose_target(), build=build, steps=1,
                      after_outputs_hook=model.hook)
    return {key: ws.ConvSignature.from_key(key) for key in model._how}


# ---------------------------------------------------------------------------------------
# Signatures and the table.
# ---------------------------------------------------------------------------------------

def test_the_signature_of_a_convolution_and_its_backward():
    x = torch.randn(4, 16, 20, 20)
    w = torch.randn(32, 16, 3, 3)
    aten = torch.ops.aten
    (fwd,) = ws.signatures_of_call(aten.convolution.default,
                                   (x, w, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1), {})
    assert fwd.key() == ("forward n=4 in=16x20x20 w=32x16x3x3 stride=2x2 pad=1x1 dil=1x1 "
                         "groups=1 transposed=0 out_pad=0x0 dtype=float32 layout=contiguous "
                         "benchmark=0 deterministic=0 tf32=1 cudnn=1")
    assert fwd.output() == (32, 10, 10)
    assert fwd.activation_bytes() == 4 * (16 * 20 * 20 + 32 * 10 * 10) * 4
    assert ws.ConvSignature.from_key(fwd.key()) == fwd
    grad = torch.randn(4, 32, 10, 10)
    parts = ws.signatures_of_call(
        aten.convolution_backward.default,
        (grad, x, w, [32], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [False, True, True]), {})
    assert parts == [dataclasses.replace(fwd, part=p) for p in ("backward_weight",
                                                                  "backward_bias")]
    # Channels-last and half precision are part of the key; TF32 means nothing in fp16.
    half = x.half().to(memory_format=torch.channels_last)
    grouped = torch.randn(32, 8, 3, 3, dtype=torch.half)
    with torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False,
                                    allow_tf32=False):
        (cl,) = ws.signatures_of_call(aten.convolution.default,
                                      (half, grouped, None, [1], [0], [1], False, [0], 2), {})
    assert "dtype=float16 layout=channels_last benchmark=1 deterministic=0 tf32=1" in cl.key()
    assert cl.stride == (1, 1) and cl.groups == 2
    assert ws.signatures_of_call(aten.mm.default, (torch.ones(2, 2), torch.ones(2, 2)), {}) == []


@pytest.mark.parametrize("key", [
    "", "sideways n=4 in=3x8x8 w=4x3x3x3 stride=1x1 pad=0x0 dil=1x1 groups=1 transposed=0 "
        "out_pad=0x0 dtype=float32 layout=contiguous benchmark=0 deterministic=0 tf32=1 cudnn=1",
    "forward n=0 in=3x8x8 w=4x3x3x3 stride=1x1 pad=0x0 dil=1x1 groups=1 transposed=0 "
        "out_pad=0x0 dtype=float32 layout=contiguous benchmark=0 deterministic=0 tf32=1 cudnn=1",
    "forward n=4 in=3x8x8 w=4x3x3 stride=1x1 pad=0x0 dil=1x1 groups=1 transposed=0 "
        "out_pad=0x0 dtype=float32 layout=contiguous benchmark=0 deterministic=0 tf32=1 cudnn=1",
    "forward n=4 in=3x8x8 w=4x3x3x3 stride=1x1 pad=0x0 dil=1x1 groups=1 transposed=0 "
        "out_pad=0x0 dtype=float16 layout=contiguous benchmark=0 deterministic=0 tf32=0 cudnn=1",
    "forward n=4 in=3x8x8 w=4x3x3x3 stride=1x1 pad=0x0 dil=1x1 colour=red",
])
def test_a_key_that_is_not_a_canonical_signature_is_refused(key):
    with pytest.raises(ValueError):
        ws.ConvSignature.from_key(key)


def _layer(part="forward", batch=32, dtype="float32", channels=64):
    return ws.ConvSignature.from_fields(dict(
        part=part, batch=batch, input=[channels, 56, 56], weight=[channels, channels, 3, 3],
        stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1, dtype=dtype,
        layout="contiguous"))


def test_the_nearest_layers_are_of_the_same_kind_and_closest_in_channels_and_pixels():
    narrow, small = _layer(channels=32, batch=8), _layer(channels=64, batch=8)
    wide, widest = _layer(channels=512, batch=8), _layer(channels=1024, batch=8)
    depthwise = ws.ConvSignature.from_fields(dict(_layer(channels=256, batch=8).fields(),
                                                  weight=[256, 1, 3, 3], groups=256))
    last = ws.ConvSignature.from_fields(dict(_layer(channels=256, batch=8).fields(),
                                             layout="channels_last"))
    # cuDNN picked an algorithm with a huge workspace for the widest layer alone.
    table = ws.Table({narrow.key(): MiB // 4, small.key(): 1 * MiB, wide.key(): 64 * MiB,
                      widest.key(): 10 * 1024 * MiB, depthwise.key(): 0, last.key(): 0})
    assert depthwise.kind() != _layer(channels=256).kind() != last.kind()

    def scaled(query, layer, size):
        return size * query.activation_bytes() / layer.activation_bytes()

    # 384 channels: the three nearest on a log scale are 512, 1024 and 64; the median of
    # their workspaces scaled to this layer's bytes is 512's, and the outlier sets nothing.
    # A depthwise layer or a channels-last one of 256 channels is never taken for a
    # contiguous dense 3x3, although nearer.
    query = _layer(channels=384, batch=8)
    assert scaled(query, small, MiB) < scaled(query, wide, 64 * MiB) < scaled(
        query, widest, 10 * 1024 * MiB)
    assert table.lookup(query) == (round(scaled(query, wide, 64 * MiB)), "nearest")
    # 768 channels: nearest of all is 1024, whose outlier one neighbour alone would give.
    query = _layer(channels=768, batch=8)
    assert table.lookup(query) == (round(scaled(query, wide, 64 * MiB)), "nearest")
    # 96 channels: 64, 32 and 512 are the nearest three; 64's is their median.
    query = _layer(channels=96, batch=8)
    assert scaled(query, narrow, MiB // 4) < scaled(query, small, MiB) < scaled(
        query, wide, 64 * MiB)
    assert table.lookup(query) == (round(scaled(query, small, MiB)), "nearest")
    # With fewer layers of its kind than that, the median of those there are.
    two = ws.Table({small.key(): 1 * MiB, wide.key(): 64 * MiB})
    assert two.lookup(query) == (round((scaled(query, small, MiB)
                                        + scaled(query, wide, 64 * MiB)) / 2), "nearest")
    one = ws.Table({small.key(): 1 * MiB, depthwise.key(): 0})
    # Larger pixels count as distance too: 64 channels at 224x224 takes the 64-channel
    # layer at 56x56, its workspace scaled by 16x the bytes.
    far = ws.ConvSignature.from_fields(dict(_layer(channels=64, batch=8).fields(),
                                            input=[64, 224, 224]))
    assert one.lookup(far) == (16 * MiB, "nearest")


def test_lookup_exact_then_scaled_by_batch_then_by_the_size_rule():
    at32, at128 = _layer(batch=32), _layer(batch=128)
    other = _layer(channels=128, batch=16)
    rule = {"batch_exponent": {"forward": 0.5},
            "workspace_per_activation_byte": {at32.size_group(): 0.25}}
    table = ws.Table({at32.key(): 1 * MiB, at128.key(): 4 * MiB}, rule)
    assert table.lookup(at32) == (1 * MiB, "exact")
    # Between two measured batches: the power law through them (here linear).
    assert table.lookup(_layer(batch=64)) == (2 * MiB, "batch")
    # Beyond them: the nearest measured batch, times (batch ratio) ** fitted exponent.
    assert table.lookup(_layer(batch=512)) == (round(4 * MiB * 4 ** 0.5), "batch")
    assert table.lookup(_layer(batch=8)) == (round(1 * MiB * 0.25 ** 0.5), "batch")
    # An unmeasured layer of a measured kind (a 3x3 of other channels): the nearest
    # layer's workspace at its batch nearest this one's (32, not 128), times the ratio
    # of their bytes of input and output.
    assert other.activation_bytes() == 16 * 2 * 128 * 56 * 56 * 4
    assert table.lookup(other) == (round(1 * MiB * other.activation_bytes()
                                         / at32.activation_bytes()), "nearest")
    # Of a kind the table never measured (a 1x1): workspace per byte of input and
    # output, times its bytes.
    pointwise = ws.ConvSignature.from_fields(dict(other.fields(), weight=[128, 128, 1, 1],
                                                  padding=[0, 0]))
    assert pointwise.size_group() == at32.size_group()
    assert table.lookup(pointwise) == (round(0.25 * pointwise.activation_bytes()), "size")
    # Another dtype has no ratio in the rule: nothing to say.
    assert table.lookup(_layer(channels=128, dtype="float16")) == (None, None)
    # A zero at one end: linear between them, never a power law through zero.
    zero = ws.Table({at32.key(): 0, at128.key(): 3 * MiB})
    assert zero.lookup(_layer(batch=64)) == (1 * MiB, "batch")
    # Without a fitted exponent a single batch scales in proportion.
    single = ws.Table({at32.key(): 1 * MiB})
    assert single.lookup(_layer(batch=96)) == (3 * MiB, "batch")


def test_the_size_rule_fits_depthwise_layers_apart():
    """cuDNN runs depthwise convolutions (one group per input channel) with kernels of
    their own, which the table measured taking no workspace forward where dense ones take
    about a byte per byte of input and output: the size rule fits them apart, so that a
    depthwise layer of a kind never measured (a 5x5) is not given a dense layer's ratio."""
    def depthwise(kernel, batch=32, channels=64):
        return ws.ConvSignature.from_fields(dict(
            _layer(channels=channels, batch=batch).fields(),
            weight=[channels, 1, kernel, kernel], groups=channels,
            padding=[kernel // 2, kernel // 2]))

    dense = _layer(batch=32)
    assert depthwise(3).size_group() != dense.size_group()
    assert depthwise(3).size_group() == depthwise(5, batch=8, channels=96).size_group()
    entries = {dense.key(): 1 * MiB, _layer(batch=32, channels=128).key(): 2 * MiB,
               depthwise(3).key(): 0, depthwise(3, channels=128).key(): 0}
    table = ws.Table(entries, ws.fit_rule(entries))
    unmeasured = depthwise(5, channels=96)
    assert table.lookup(unmeasured) == (0, "size")
    pointwise = ws.ConvSignature.from_fields(dict(dense.fields(), weight=[64, 64, 1, 1],
                                                  padding=[0, 0]))
    assert table.lookup(pointwise)[1] == "size" and table.lookup(pointwise)[0] > 0


def test_the_rule_is_fitted_from_the_entries():
    entries = {_layer(batch=32).key(): 1 * MiB, _layer(batch=128).key(): 4 * MiB,
               _layer(batch=32, channels=128).key(): 2 * MiB,
               _layer(batch=64, channels=128).key(): 2 * MiB,   # flat: exponent 0
               _layer(batch=256, channels=128).key(): 8 * MiB,  # then 4x over 4x: 1
               _layer("backward_weight", batch=32).key(): 0}
    rule = ws.fit_rule(entries)
    assert rule["batch_exponent"] == {"forward": 1.0}  # median of 1, 0, 1
    group = _layer(batch=32).size_group()
    # Per activation byte the five forward entries are 1/49, 1/49, 1/49, 1/98, 1/98 of a
    # byte (1 MiB over 32 x 2 x 64 x 56 x 56 fp32 values, and so on): the median is 1/49.
    ratios = sorted(v / ws.ConvSignature.from_key(k).activation_bytes()
                    for k, v in entries.items() if k.startswith("forward"))
    assert ratios == pytest.approx([1 / 98, 1 / 98, 1 / 49, 1 / 49, 1 / 49])
    assert rule["workspace_per_activation_byte"][group] == pytest.approx(1 / 49, rel=1e-5)
    assert rule["workspace_per_activation_byte"][
        _layer("backward_weight").size_group()] == 0
    # Each entry predicted from its layer's other batches: the 128-channel layer at 32
    # from 2 MiB at 64 (in proportion: 1 MiB, half too little), at 64 from the power law
    # through 2 MiB at 32 and 8 MiB at 256 (2 MiB x 2 ** (2/3)); the rest come out exact.
    errors = rule_errors(ws.Table(entries, rule))["batch"]
    assert errors["count"] == 5 and errors["median"] == 0
    assert errors["p90"] == pytest.approx(2 ** (2 / 3) - 1)
    # Each forward entry from the other forward layer (never its own), at that layer's
    # batch nearest its own (the smaller of a tie), times the ratio of their bytes: the
    # 64-channel layer at 32 and 128 from the 128-channel one at 32 and 64 (2 MiB x 1/2,
    # exact; 2 MiB x 1 against 4: half); the 128-channel layer at 32, 64 and 256 from the
    # 64-channel one at 32, 32 and 128 (1 MiB x 2, exact; 1 MiB x 4 against 2 and 4 MiB
    # x 4 against 8: twice). The backward entry's only kind-mate is itself: none.
    nearest = rule_errors(ws.Table(entries, rule))["nearest"]
    assert nearest["count"] == 5 and nearest["median"] == pytest.approx(0.5)
    assert nearest["p90"] == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------
# The recorded step.
# ---------------------------------------------------------------------------------------

PART_SIZES = {"forward": 1 * MiB + 100, "backward_input": 2 * MiB, "backward_weight": 3 * MiB,
              "backward_bias": 5 * 1024}


def test_transient_blocks_sit_inside_each_convolution_after_its_outputs(table_file):
    signatures = _signatures(_conv_build())
    # conv1's input needs no gradient: backward computes its weight's and bias's only.
    assert sorted(s.part for s in signatures.values()) == sorted(
        ["forward", "forward", "backward_input", "backward_weight", "backward_weight",
         "backward_bias"])
    table_file({k: PART_SIZES[s.part] for k, s in signatures.items()})
    model = ws.ConvWorkspaceModel()
    recording, _ = _step.record_step(_train, (), {}, target=_step.choose_target(),
                                     build=_conv_build(), steps=2,
                                     after_outputs_hook=model.hook)
    ops, blocks = recording.ops, recording.blocks
    found = [i for i, op in enumerate(ops) if op[0] == "a" and blocks[op[1]].site == ws.LABEL]
    assert len(found) == 2 * 6  # each part with a workspace, in each of the two steps
    parts_seen = []
    for i in found:
        bid = ops[i][1]
        block = blocks[bid]
        assert ops[i + 1] == ("f", bid)  # freed before anything else happens
        assert block.role == "workspaces" and block.freed
        # Right after the op's outputs (or its other parts' workspaces): the allocation
        # before it is the same op's.
        j = i - 1
        while blocks[ops[j][1]].site == ws.LABEL:
            j -= 2
        assert ops[j][0] == "a" and blocks[ops[j][1]].op == block.op
        assert block.op in ("convolution.default", "convolution_backward.default")
        parts_seen.append((block.op, block.requested))
    forward = [s for op, s in parts_seen if op == "convolution.default"]
    assert forward == [PART_SIZES["forward"]] * 4
    assert all(blocks[ops[i][1]].size == _rounded(blocks[ops[i][1]].requested) for i in found)
    # Backward's parts come in the order they are computed: input, weight, bias.
    backward = [s for op, s in parts_seen if op == "convolution_backward.default"][:4]
    assert backward == [PART_SIZES[p] for p in ("backward_input", "backward_weight",
                                                "backward_weight", "backward_bias")]
    assert model.counts() == {"exact": 6}


def _wide(net, x):
    with torch.no_grad():
        return net(x)


def _wide_build(then_bigger=False):
    """One convolution whose output is the largest tensor of the step (no grad), or, with
    then_bigger, followed by an op making a tensor larger than output and workspace."""
    def build():
        net = torch.nn.Conv2d(16, 64, 3, padding=1, bias=False)
        return net, torch.randn(8, 16, 64, 64)

    def step(net, x):
        y = _wide(net, x)
        if then_bigger:
            return y.repeat(8, 1, 1, 1)
        return y
    return build, step


def test_a_workspace_on_the_peak_raises_it_by_its_size_and_the_breakdown_names_it(table_file):
    build, step = _wide_build()
    (key,) = _signatures(build, step)
    workspace = 40 * MiB + 1000
    table_file({key: workspace})
    without = vramkit.estimate(step, build=build, model_workspaces="cublas")
    with_it = vramkit.estimate(step, build=build)
    assert with_it.peak_allocated - without.peak_allocated == _rounded(workspace)
    # A convolution takes no cuBLAS handle: cuDNN's workspace is the step's only one.
    assert with_it.breakdown["workspaces"] == _rounded(workspace)
    assert without.breakdown["workspaces"] == 0
    assert (ws.LABEL, _rounded(workspace), 1) in with_it.top_sites
    # Nothing cached holds 40 MiB: PyTorch's allocator takes a segment for it.
    assert with_it.torch_peak_reserved >= without.torch_peak_reserved + _rounded(workspace)
    assert any("1 of the step's 1 convolution signatures measured as they are" in n
               for n in with_it.notes)
    # A workspace away from the peak changes no peak.
    build, step = _wide_build(then_bigger=True)
    table_file({key: 4 * MiB})
    assert vramkit.estimate(step, build=build).peak_allocated == vramkit.estimate(
        step, build=build, model_workspaces="cublas").peak_allocated


def test_cublas_workspaces_come_where_pytorch_makes_them():
    """Real steps' allocator history: no workspace at a convolution (cuDNN's, no cuBLAS
    handle); at the first linear layer, its output, then cuBLAS's 32 MiB, then cuBLASLt's
    1 MiB (the bias is added in the product's epilogue), each made once and kept."""
    from vramkit.estimator import CUBLASLT_WORKSPACE_BYTES, _workspace_model

    def build():
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(),
                                  torch.nn.Linear(8 * 6 * 6, 16), torch.nn.Linear(16, 4))
        return net, torch.optim.SGD(net.parameters(), lr=0.1), torch.randn(2, 3, 8, 8)

    recording, _ = _step.record_step(_train, (), {}, target=_step.choose_target(),
                                     build=build, steps=2,
                                     workspace_hook=_workspace_model(True))
    made = [recording.blocks[op[1]] for op in recording.ops if op[0] == "a"]
    names = [b.op for b in made]
    first_conv = next(i for i, n in enumerate(names) if "convolution" in n)
    first_product = next(i for i, n in enumerate(names) if n.startswith("addmm"))
    assert first_conv < first_product
    assert names[first_product + 1:first_product + 3] == ["cuBLAS workspace",
                                                          "cuBLASLt workspace"]
    assert [b.requested for b in made[first_product + 1:first_product + 3]] == [
        CUBLAS_WORKSPACE_BYTES, CUBLASLT_WORKSPACE_BYTES]
    assert names.count("cuBLASLt workspace") == 1
    assert not any(b.freed for b in made if b.role == "workspaces")
    # Backward runs on autograd's thread for the device, its products on a handle of
    # their own: a second cuBLAS workspace at its first product, on the CPU stand-in too
    # (where backward runs on the caller's thread, and there was none).
    cublas = [i for i, b in enumerate(made) if b.op == "cuBLAS workspace"]
    first_backward = next(i for i, b in enumerate(made) if b.phase == "backward")
    assert len(cublas) == 2 and cublas[0] < first_backward < cublas[1]


def test_the_switch_chooses_the_libraries(table_file):
    build, step = _wide_build()
    (key,) = _signatures(build, step)
    table_file({key: 8 * MiB})
    only_cudnn = vramkit.estimate(step, build=build, model_workspaces="cudnn")
    assert only_cudnn.breakdown["workspaces"] == 8 * MiB
    none = vramkit.estimate(step, build=build, model_workspaces=False)
    assert none.breakdown["workspaces"] == 0
    assert not any("workspace" in n for n in none.notes)
    both = vramkit.estimate(step, build=build, model_workspaces=("cublas", "cudnn"))
    assert both.peak_allocated == none.peak_allocated + 8 * MiB  # no product: no cuBLAS
    for bad in ("cufft", ("cublas", "nccl"), 1):
        with pytest.raises(ValueError):
            vramkit.estimate(step, build=build, model_workspaces=bad)


def test_unmeasured_convolutions_are_said_to_be_left_out(table_file):
    e = vramkit.estimate(_train, build=_conv_build())
    assert e.breakdown["workspaces"] == 0
    (note,) = [n for n in e.notes if "workspaces were not modelled" in n]
    assert note.startswith("convolution workspaces were not modelled for 6 of the step's "
                           "6 convolution signatures")
    assert "import PROBE.json" in note


@pytest.mark.parametrize("text, problem", [
    ("{not json", "not JSON"),
    ('{"format": "something else", "entries": {}}', "format 'something else'"),
    ('{"format": "vramkit-cudnn-workspaces/1", "entries": {"forward n=1": 5}}', "entry"),
    ('{"format": "vramkit-cudnn-workspaces/1", "entries": {}, '
     '"rule": {"batch_exponent": {"forward": -1}}}', "batch_exponent"),
])
def test_a_corrupt_table_is_a_clear_error(table_file, text, problem):
    path = table_file({})
    path.write_text(text)
    with pytest.raises(ws.WorkspaceTableError) as info:
        vramkit.estimate(_train, build=_conv_build())
    message = str(info.value)
    assert message.startswith(f"{path}: not a usable cuDNN workspace table")
    assert problem in message and "model_workspaces" in message
    assert not isinstance(info.value, vramkit.estimator.UntraceableStep)
    # A step without convolutions never reads it; the switch leaves it unread too.
    mlp = lambda: (torch.nn.Linear(8, 8), torch.randn(4, 8))  # noqa: E731
    vramkit.estimate(lambda m, x: m(x).sum().backward(), build=mlp)
    vramkit.estimate(_train, build=_conv_build(), model_workspaces="cublas")


def test_the_shipped_table_is_valid():
    table = ws.Table.load(ws.TABLE_PATH)
    assert table.path == ws.TABLE_PATH
    installed = pathlib.Path(vramkit.__file__).parent / "plan" / "estimator" / "data" / \
        "cudnn_workspaces.json"
    assert installed.is_file()


# ---------------------------------------------------------------------------------------
# Measuring on a device (a CPU stands in, with a stand-in for the allocator's figures).
# ---------------------------------------------------------------------------------------

class _Reader(AllocatorFigures):
    """Allocator figures for real CPU tensors: each call's outputs count, and a part
    'uses' a workspace of 64 KiB times (1 + its number in PARTS)."""

    def observe(self, out):
        outs = [t for t in (out if isinstance(out, tuple) else (out,)) if t is not None]
        # The part asked for is the last output there (the CPU's kernel computes the
        # weight's gradient along with the bias's).
        kind = "forward" if not isinstance(out, tuple) else \
            [p for p, t in zip(ws.PARTS[1:], out) if t is not None][-1]
        self.calls.append(kind)
        size = sum(_rounded(t.untyped_storage().nbytes()) for t in outs)
        workspace = 64 * 1024 * (1 + ws.PARTS.index(kind))
        self.top = max(self.top, self.level + size + workspace)
        self.level += size
        self.held = max(self.held, self.top)


def test_measuring_runs_each_part_for_real_outside_the_fake_step(tmp_path, monkeypatch,
                                                                table_file):
    monkeypatch.setenv("VRAMKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ws, "_MEASURED", {})
    measured = []
    real = ws.measure_on_device

    def counting(signature, device, reader=None, blocks=False):
        measured.append(signature.key())
        return real(signature, device, reader, blocks)

    monkeypatch.setattr(ws, "measure_on_device", counting)
    reader = _Reader()
    model = ws.ConvWorkspaceModel(torch.device("cpu"), reader=reader)
    recording, _ = _step.record_step(_train, (), {}, target=_step.choose_target(),
                                     build=_conv_build(), steps=2,
                                     after_outputs_hook=model.hook)
    model.finish()
    assert len(measured) == 6 == len(set(measured))  # once per signature, not per call
    # Each part ran alone, with the right mask (the reader sees the measured call, not
    # the warm-up before it).
    assert sorted(reader.calls) == sorted(s.part for s in map(ws.ConvSignature.from_key,
                                                              measured))
    sizes = sorted(b.requested for b in recording.blocks.values() if b.site == ws.LABEL)
    expected = sorted(2 * [64 * 1024 * (1 + ws.PARTS.index(s.part))
                           for s in map(ws.ConvSignature.from_key, measured)])
    assert sizes == expected
    assert reader.emptied == 1  # what measuring left cached was given back
    (note,) = [n for n in model.notes() if "measured on this GPU" in n]
    assert "(cpu) for 6 of the step's 6 convolution signatures" in note
    cache = ws.cache_path(ws.device_identity(torch.device("cpu")))
    assert cache.startswith(str(tmp_path / "cache"))
    assert set(ws.Table.load(cache).entries) == set(measured)
    # A later estimate in this process measures nothing; a new process reads the file.
    again = ws.ConvWorkspaceModel(torch.device("cpu"), reader=_Reader())
    _step.record_step(_train, (), {}, target=_step.choose_target(), build=_conv_build(),
                      steps=1, after_outputs_hook=again.hook)
    monkeypatch.setattr(ws, "_MEASURED", {})
    fresh = ws.ConvWorkspaceModel(torch.device("cpu"), reader=_Reader())
    _step.record_step(_train, (), {}, target=_step.choose_target(), build=_conv_build(),
                      steps=1, after_outputs_hook=fresh.hook)
    assert len(measured) == 6
    assert again.counts() == {"cached": 6} == fresh.counts()


def test_without_the_memory_to_measure_the_table_answers(tmp_path, monkeypatch, table_file):
    monkeypatch.setenv("VRAMKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ws, "_MEASURED", {})
    monkeypatch.setattr(ws, "measure_on_device", lambda *a, **k: None)
    signatures = _signatures(_conv_build())
    forward = [k for k, s in signatures.items() if s.part == "forward"]
    table_file({k: 2 * MiB for k in forward})
    model = ws.ConvWorkspaceModel(torch.device("cpu"), reader=_Reader())
    _step.record_step(_train, (), {}, target=_step.choose_target(), build=_conv_build(),
                      steps=1, after_outputs_hook=model.hook)
    assert model.counts() == {"exact": 2, "none": 4}
    notes = " ".join(model.notes())
    assert "lacked the memory to measure the cuDNN workspaces of 6" in notes
    assert "not modelled for 4 of the step's 6" in notes
    # A kernel that refuses to run in isolation is no reason to give no estimate either.

    def refused(*args, **kwargs):
        raise RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED\nmore")

    monkeypatch.setattr(ws, "measure_on_device", refused)
    model = ws.ConvWorkspaceModel(torch.device("cpu"), reader=_Reader())
    _step.record_step(_train, (), {}, target=_step.choose_target(), build=_conv_build(),
                      steps=1, after_outputs_hook=model.hook)
    assert model.counts() == {"exact": 2, "none": 4}
    assert "could not be measured on this GPU (the first: RuntimeError: cuDNN error: " \
           "CUDNN_STATUS_NOT_SUPPORTED)" in " ".join(model.notes())


# ---------------------------------------------------------------------------------------
# The probe and the import.
# ---------------------------------------------------------------------------------------

def test_the_probe_windows_split_the_memory_history():
    probe = _probe_module()
    start, end = probe.MARK_START, probe.MARK_END
    history = [
        {"action": "alloc", "addr": 1, "size": 100},           # before any op: not counted
        {"action": "alloc", "addr": 7, "size": start},
        {"action": "free_requested", "addr": 7, "size": start},
        {"action": "free_completed", "addr": 7, "size": start},
        {"action": "alloc", "addr": 7, "size": 4096},           # the output, at the marker's
        {"action": "segment_alloc", "addr": 9, "size": 20 * MiB},
        {"action": "alloc", "addr": 9, "size": 3 * MiB},        # the workspace
        {"action": "free_requested", "addr": 9, "size": 3 * MiB},
        {"action": "free_completed", "addr": 9, "size": 3 * MiB},
        {"action": "free_requested", "addr": 1, "size": 100},   # an input freed inside
        {"action": "free_completed", "addr": 1, "size": 100},
        {"action": "alloc", "addr": 11, "size": end},
        {"action": "free_requested", "addr": 11, "size": end},
        {"action": "free_completed", "addr": 11, "size": end},
        {"action": "alloc", "addr": 12, "size": 8},             # after: not counted
    ]
    (window,) = probe.split_windows(history)
    assert window["transient"] == [3 * MiB]
    assert window["kept"] == [4096]
    assert window["freed_from_before"] == [100]
    assert window["events"] == [["a", 0, 4096], ["segment_alloc", None, 20 * MiB],
                                ["a", 2, 3 * MiB], ["f", 2, 3 * MiB], ["f", None, 100]]
    args = probe.parse_args(["--out", "x.json", "--max-memory", "12G", "--quick"])
    assert args.max_memory == 12 << 30 and args.quick and args.budget_s == 170.0
    assert args.only == "resnet50,vit_b16,sweep" and not args.dry_run


def _run(*args, **kw):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          timeout=300, **kw)


def test_the_probe_measures_the_listed_signatures_and_the_wider_sweep(tmp_path):
    """--signatures measures each listed key's part once (a layer's parts together);
    "layers" in --only runs the wider sweep, in every dtype and layout."""
    wanted = [_layer(part=part, batch=2, channels=8).key()
              for part in ("forward", "backward_weight")]
    listed = tmp_path / "keys.json"
    listed.write_text(json.dumps(wanted))
    out = tmp_path / "probe.json"
    ran = _run(PROBE, "--dry-run", "--only", "layers", "--signatures", listed, "--out", out)
    assert ran.returncode == 0, ran.stderr
    records = json.loads(out.read_text())["isolated"]
    keys = [ws.ConvSignature.from_fields(r["signature"]).key() for r in records
            if r["source"] == "listed"]
    assert keys == wanted
    wide = [ws.ConvSignature.from_fields(r["signature"]) for r in records
            if r["source"] == "layers"]
    assert {(s.dtype, s.layout) for s in wide} == set(_probe_module().WIDE_KINDS)
    assert all("workspace" in r for r in records if r["source"] in ("listed", "layers"))


def test_the_signatures_of_models_leave_out_the_table_s_layers(tmp_path):
    """bench/conv_signatures.py: every part of each convolution of the models named, at the
    batch and dtypes asked, but those of layers the table holds at any batch; the list is
    what the probe's --signatures reads. A model it cannot build is named and left out."""
    pytest.importorskip("torchvision")
    listed, table = tmp_path / "keys.json", tmp_path / "table.json"
    # resnet18's first convolution (3 -> 64, 7x7, stride 2, no bias), measured at batch 8.
    first = ws.ConvSignature.from_fields(dict(
        part="forward", batch=8, input=[3, 224, 224], weight=[64, 3, 7, 7], stride=[2, 2],
        padding=[3, 3], dilation=[1, 1], groups=1, dtype="float32", layout="contiguous"))
    ws.Table({first.key(): 0}, {}, {"device": "Test GPU"}).save(str(table))
    script = ROOT / "bench" / "conv_signatures.py"
    ran = _run(script, listed, "--models", "tv:resnet18,tv:no_such_model,nonsense",
               "--batch", "16", "--dtypes", "float32", "--table", table)
    assert ran.returncode == 0, ran.stderr
    assert "tv:no_such_model: left out" in ran.stderr and "nonsense: left out" in ran.stderr
    keys = [ws.ConvSignature.from_key(key) for key in json.loads(listed.read_text())]
    # resnet18 has eleven distinct convolutions, none with a bias: three parts each, less
    # the one part the table holds (at another batch: the batch rule serves it).
    assert len(set(keys)) == len(keys) == 32 and first.layer() not in {k.layer() for k in keys}
    assert {k.part for k in keys} == {"forward", "backward_input", "backward_weight"}
    assert replace_part(first, "backward_weight").layer() in {k.layer() for k in keys}
    assert {(k.batch, k.dtype, k.layout) for k in keys} == {(16, "float32", "contiguous")}
    probe = tmp_path / "probe.json"
    ran = _run(PROBE, "--dry-run", "--only", "none", "--signatures", listed, "--out", probe)
    assert ran.returncode == 0, ran.stderr
    records = json.loads(probe.read_text())["isolated"]
    assert len([r for r in records if r["source"] == "listed"]) == 32


def replace_part(signature, part):
    return dataclasses.replace(signature, part=part)


def test_the_probe_dry_run_fills_a_table_the_estimator_matches_exactly(tmp_path,
                                                                       monkeypatch):
    out = tmp_path / "probe.json"
    ran = _run(PROBE, "--dry-run", "--out", out)
    assert ran.returncode == 0, ran.stderr
    assert "isolated parts:" in ran.stdout and f"wrote {out}" in ran.stdout
    data = json.loads(out.read_text())
    assert data["format"] == ws.PROBE_FORMAT and data["dry_run"]
    convs = [r for r in data["in_step"] if r["workload"] == "tiny fp32 b4"]
    assert len(convs) == 8  # 2 convolutions, forward and backward, 2 steps
    for record in convs:
        assert record["excess"] == sum(record["trace"]["transient"]) > 0
        assert record["peak"] - record["after"] == record["excess"]
    # The step's scratch ops, each signature measured on its own afterwards by the
    # estimator's code (scratch.measure_op), beside what it took inside the step: the dry
    # run's made-up figures follow one rule both ways, so every signature agrees.
    assert "scratch ops, in the steady step vs on their own" in ran.stdout
    scratch = data["scratch"]
    measured = {r["key"] for r in scratch["isolated"] if "isolated" in r}
    assert {r["key"] for r in scratch["in_step"]} == measured
    assert {"native_batch_norm.default", "native_batch_norm_backward.default",
            "nll_loss_forward.default"} <= {r["op"] for r in scratch["isolated"]}
    for record in scratch["in_step"]:
        assert record["excess"] == sum(record["trace"]["transient"]) > 0
    rows = _probe_module().scratch_comparison(data)
    assert len(rows) == len(scratch["isolated"]) > 0 and all(r["match"] for r in rows)
    # Made-up sizes are refused unless asked for.
    table = tmp_path / "table.json"
    cli = ("-m", "vramkit.estimator.workspace_table")
    refused = _run(*cli, "import", out, "--table", table)
    assert refused.returncode == 2 and "dry-run" in refused.stderr
    done = _run(*cli, "import", out, "--table", table, "--allow-dry-run")
    assert done.returncode == 0, done.stderr
    assert "imported 30 signatures" in done.stdout
    imported = ws.Table.load(str(table))
    sweep = [r for r in data["isolated"] if r["source"] == "sweep"]
    key = ws.ConvSignature.from_fields(sweep[0]["signature"]).key()
    assert imported.entries[key] == max(r["workspace"] for r in sweep
                                        if ws.ConvSignature.from_fields(r["signature"]).key()
                                        == key)
    assert set(imported.rule) == {"batch_exponent", "workspace_per_activation_byte"}
    # The estimate of the probe's own model finds every signature it measured.
    probe = _probe_module()
    monkeypatch.setattr(ws, "TABLE_PATH", str(table))

    def build():
        net = probe._tiny_net()
        x, y = probe.tiny_batch(4)
        return net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9), x, y

    def step(net, opt, x, y):
        F.cross_entropy(net(x).float(), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    e = vramkit.estimate(step, build=build, trace_path=str(tmp_path / "t.trace.gz"))
    assert any("6 of the step's 6 convolution signatures measured as they are" in n
               for n in e.notes), e.notes
    # Another device's probe does not mix into this table; --replace starts it again.
    data["environment"]["device"] = "Another GPU"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    mixed = _run(*cli, "import", other, "--table", table, "--allow-dry-run")
    assert mixed.returncode == 2 and "--replace" in mixed.stderr
    assert _run(*cli, "import", other, "--table", table, "--allow-dry-run",
                "--replace").returncode == 0
    assert ws.Table.load(str(table)).measured_on["device"] == "Another GPU"
    # A device of the same architecture fills what the table lacks (never replacing an
    # entry), only the sources asked for, and the table names both devices.
    before = ws.Table.load(str(table))
    data["environment"]["device"] = "A Third GPU"
    for record in data["isolated"]:
        if "workspace" in record:
            record["workspace"] += 4096
    wider = [r for r in data["isolated"] if r["source"] == "sweep"]
    wider[0]["signature"]["batch"] = 3  # a signature the table lacks
    fresh = ws.ConvSignature.from_fields(wider[0]["signature"]).key()
    of_a_step = [r for r in data["isolated"] if r["source"] == "tiny fp32 b4"]
    of_a_step[0]["signature"]["batch"] = 5  # lacking too, but not of the sources asked
    left_out = ws.ConvSignature.from_fields(of_a_step[0]["signature"]).key()
    other.write_text(json.dumps(data))
    added = _run(*cli, "import", other, "--table", table, "--allow-dry-run",
                 "--other-device", "--sources", "sweep,listed")
    assert added.returncode == 0, added.stderr
    assert "imported 1 signatures" in added.stdout
    after = ws.Table.load(str(table))
    assert after.entries == dict(before.entries, **{fresh: wider[0]["workspace"]})
    assert left_out not in after.entries
    assert after.describe_source().startswith("Another GPU (PyTorch ")
    assert " and A Third GPU (PyTorch " in after.describe_source()
    assert (table.stat().st_mode & 0o777) == 0o600  # a new file: the owner's
    table.chmod(0o644)
    _run(*cli, "import", other, "--table", table, "--allow-dry-run", "--other-device")
    assert (table.stat().st_mode & 0o777) == 0o644  # written over: as it was
    # A second probe of that device: named once, with both probes' signatures counted.
    data["isolated"][1]["signature"]["batch"] = 7
    other.write_text(json.dumps(data))
    _run(*cli, "import", other, "--table", table, "--allow-dry-run", "--other-device")
    again = ws.Table.load(str(table))
    assert again.describe_source().count("A Third GPU") == 1, again.describe_source()
    third = [a for a in again.measured_on["also"] if a["device"] == "A Third GPU"]
    assert len(third) == 1 and third[0]["signatures"] == len(again.entries) - len(
        before.entries)
    data["isolated"][0]["signature"]["layout"] = "diagonal"
    other.write_text(json.dumps(data))
    bad = _run(*cli, "import", other, "--table", table, "--allow-dry-run")
    assert bad.returncode == 2 and "isolated record 0" in bad.stderr
    assert _run(*cli, "show", "--table", table).returncode == 0
    assert _run(*cli, "frobnicate").returncode == 3

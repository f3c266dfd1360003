"""Tests of vramkit.estimate and find_max_batch on a machine without a GPU (the CPU
stand-in for CUDA; the GPU path is checked on the H200 by bench/estimate_check.py). Sizes
are checked against hand counts of what the step must hold. The command line's tests are
in test_estimate_cli.py.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import vramkit  # noqa: E402
from vramkit.estimator import UntraceableStep, _largest, models  # noqa: E402

from estimate_mlp import BATCH, PARAM_BYTES, WIDTH, _mlp_build, _rounded, _step  # noqa: E402,F401


def test_parameters_gradients_and_adam_state_are_counted_exactly():
    """At the peak of the second step the weights, their gradients and AdamW's two moments
    are all live: each category holds exactly what the parameters' sizes say."""
    e = vramkit.estimate(_step, build=_mlp_build())
    assert e.breakdown["parameters"] == PARAM_BYTES
    # The two moments per parameter; AdamW's step counters are host tensors on a GPU,
    # and on the CPU stand-in too.
    assert e.breakdown["optimizer state"] == 2 * PARAM_BYTES
    # cuBLAS's workspaces (forward's thread and backward's) and cuBLASLt's: the linear layers
    # add their bias in the epilogue.
    assert e.breakdown["workspaces"] == (2 * vramkit.estimator.CUBLAS_WORKSPACE_BYTES
                                         + vramkit.estimator.CUBLASLT_WORKSPACE_BYTES)
    assert e.peak_allocated == sum(e.breakdown.values())
    # The multi-tensor AdamW the GPU runs holds one parameter-sized temporary at its peak.
    assert e.peak_allocated >= 4 * PARAM_BYTES
    assert e.emulated and e.notes


def test_activations_are_what_forward_keeps_for_backward():
    """A deep, narrow network on a large batch with SGD (no state): the peak is where
    backward starts, and what forward kept for it dominates: at least each ReLU's output
    (the next Linear saves it as its input), the input itself counted apart."""
    layers, batch = 6, 8192

    def build():
        blocks = []
        for _ in range(layers):
            blocks += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
        net = torch.nn.Sequential(*blocks)
        return net, torch.optim.SGD(net.parameters(), lr=0.1), torch.randn(batch, WIDTH)

    e = vramkit.estimate(_step, build=build)
    assert e.breakdown["optimizer state"] == 0
    assert e.breakdown["inputs"] == _rounded(batch * WIDTH * 4)
    relu_outputs = (layers - 1) * _rounded(batch * WIDTH * 4)
    assert e.breakdown["activations"] >= relu_outputs
    assert e.breakdown["activations"] > e.breakdown["parameters"]


def test_the_trace_replays_to_the_estimated_peak(tmp_path):
    """The saved trace is an ordinary vramkit trace: `vramkit replay` on it finds the
    estimate's peak allocated as its peak live bytes, and the estimate's reserved."""
    path = tmp_path / "step.trace.gz"
    e = vramkit.estimate(_step, build=_mlp_build(), trace_path=str(path))
    assert e.trace == str(path)
    with gzip.open(path, "rt") as f:
        assert f.readline().startswith("# vramkit-trace v1")
    out = subprocess.run([sys.executable, "-m", "vramkit", "replay", "--json",
                          "--source", "sim", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout.splitlines()[-1])
    assert row["peak_live_bytes"] == e.peak_allocated
    assert row["peak_reserved_bytes"] == e.peak_reserved
    assert e.peak_reserved >= e.peak_allocated
    assert e.torch_peak_reserved >= e.peak_allocated
    assert e.torch_expandable_peak_reserved >= e.peak_allocated
    assert e.min_device_memory >= e.peak_allocated + vramkit.estimator.CUDA_CONTEXT_BYTES


def test_traces_not_asked_for_are_gone_when_the_process_exits(tmp_path):
    """A search makes many estimates: the traces nobody asked to keep go with the process."""
    code = ("import torch, vramkit, os\n"
            "step = lambda m, x: m(x).sum().backward()\n"
            "e = vramkit.estimate(step, torch.nn.Linear(64, 64), torch.randn(8, 64))\n"
            "assert os.path.exists(e.trace)\n"
            "print(os.path.dirname(e.trace))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    folder = out.stdout.strip().splitlines()[-1]
    assert folder and not __import__("os").path.exists(folder)


def test_fit_under_a_limit_is_decided_by_a_capped_replay():
    e = vramkit.estimate(_step, build=_mlp_build())
    roomy = vramkit.estimate(_step, build=_mlp_build(), memory_limit=4 * e.peak_reserved)
    assert roomy.fits and roomy.torch_fits and roomy.torch_expandable_fits
    tight = vramkit.estimate(_step, build=_mlp_build(), memory_limit=e.peak_allocated // 2)
    assert tight.fits is False and tight.torch_fits is False
    card = vramkit.estimate(_step, build=_mlp_build(), device_memory="200G")
    assert card.fits and card.device_memory == 200 << 30
    assert "fits" in str(card) and "peak allocated" in str(card)


def test_a_card_the_cuda_context_fills_fits_nothing():
    """A card no larger than the CUDA context leaves the allocator nothing: no step fits
    it under any allocator (it was answered as no cap at all, "fits")."""
    from vramkit.estimator import CUDA_CONTEXT_BYTES
    for card in ("100M", CUDA_CONTEXT_BYTES):
        e = vramkit.estimate(_step, build=_mlp_build(), device_memory=card)
        assert (e.fits, e.torch_fits, e.torch_expandable_fits) == (False, False, False)
        assert "does not fit" in str(e)


def test_real_objects_are_left_untouched():
    """The step runs on fake twins: the user's model keeps its weights, the optimizer no
    state, and no gradient appears."""
    net, opt, x = _mlp_build()()
    before = [p.detach().clone() for p in net.parameters()]
    e = vramkit.estimate(_step, net, opt, x)
    assert e.breakdown["parameters"] == PARAM_BYTES
    assert not opt.state
    for p, old in zip(net.parameters(), before):
        assert p.grad is None and p.device.type == "cpu" and torch.equal(p.detach(), old)


@pytest.mark.parametrize("kwargs, error", [
    (dict(steps=0), ValueError), (dict(device_memory="lots"), ValueError),
    (dict(device_memory=-5), ValueError), (dict(device_memory=1.5), TypeError),
    (dict(source="nope"), ValueError), (dict(device_memory="8G", memory_limit="-4G"), ValueError),
    (dict(device="cpu"), ValueError), (dict(device="bogus"), ValueError),
    (dict(emulate="yes"), TypeError),
    # Past the largest device modelled: an int past 64 bits wrapped to a small cap ("does
    # not fit"), and "300T" failed after the step ran, in the host model's words.
    (dict(memory_limit=2**64 + 1000), ValueError), (dict(device_memory="300T"), ValueError),
    (dict(variant="bf16"), TypeError),  # an AttributeError from inside the recorder before
])
def test_bad_arguments_are_refused_before_anything_runs(kwargs, error):
    def build():
        raise AssertionError("build() ran")

    with pytest.raises(error):
        vramkit.estimate(_step, build=build, **kwargs)
    with pytest.raises(TypeError):
        vramkit.estimate("not callable")


@pytest.mark.parametrize("call, error, words", [
    # A build that is not a function failed inside the recorder, as "the step raised".
    (lambda f: vramkit.estimate(_step, build=5), TypeError, "build must be a function"),
    (lambda f: vramkit.estimator.advise(_step, build=f, make_batch=f, batch=-4),
     ValueError, "batch must be a positive int, not -4"),
    (lambda f: vramkit.estimator.advise(_step, build=f, make_batch="n", batch=8),
     TypeError, "make_batch must be a function"),
    (lambda f: vramkit.estimator.find_max_batch(_step, f, "24G", most=0),
     ValueError, "most must be a positive int, not 0"),
    (lambda f: vramkit.estimator.find_max_batch(_step, f, "24G", start=9, most=8),
     ValueError, r"start \(9\) is above most \(8\)"),
    (lambda f: vramkit.estimator.find_max_batch(_step, None, "24G"),
     TypeError, "make_batch must be a function"),
])
def test_bad_arguments_of_the_planners_are_refused_before_any_estimate(call, error, words):
    def never(*args):
        raise AssertionError("the step was built")

    with pytest.raises(error, match=words):
        call(never)


def test_the_tokens_a_learned_position_table_holds(tmp_path):
    """The families whose positions are a table of learned embeddings, and how many tokens
    it holds (RoBERTa numbers them from its padding index + 1); rotary ones have none."""
    import transformers as t
    from vramkit.estimator import models

    assert models.position_limit(t.GPT2Config(n_positions=64)) == (64, "n_positions")
    assert models.position_limit(t.BertConfig())[0] == 512
    assert models.position_limit(t.RobertaConfig(max_position_embeddings=514))[0] == 512
    assert models.position_limit(t.RobertaConfig(max_position_embeddings=514,
                                                 pad_token_id=0))[0] == 513
    assert models.position_limit(t.OPTConfig(max_position_embeddings=2048))[0] == 2048
    assert models.position_limit(t.LlamaConfig()) is None
    t.GPT2Config(n_positions=64).save_pretrained(tmp_path)
    with pytest.raises(models.PastPositions, match="seq 65 is past the 64 positions"):
        models.workload(str(tmp_path), 1, seq=65)
    assert models.workload(str(tmp_path), 1, seq=64).name.endswith(" batch 1x64 fp32")


def test_a_step_whose_call_runs_nothing_is_refused():
    """A generator or async function's call runs none of its body: it was estimated as a
    step holding only its model and batch."""
    async def asynchronous(net, opt, x):
        _step(net, opt, x)

    for step in (lambda net, opt, x: (yield _step(net, opt, x)), asynchronous):
        with pytest.raises(TypeError, match="generator or async function"):
            vramkit.estimate(step, build=_mlp_build())


def test_estimate_follows_the_placement_settings(monkeypatch):
    """The replay keeps the user's VRAMKIT_LARGE_BLOCKS and VRAMKIT_VIRTUAL_THRESHOLD: under
    432 MiB the MLP at batch 4096 (401 MiB at its peak, the staging of a bias gradient's
    column sum included) fits with large blocks in virtual memory (the default), not on
    fixed segments alone."""
    limit = 432 << 20
    monkeypatch.delenv("VRAMKIT_VIRTUAL_THRESHOLD", raising=False)
    monkeypatch.delenv("VRAMKIT_LARGE_BLOCKS", raising=False)
    default = vramkit.estimate(_step, build=_mlp_build(batch=4096), memory_limit=limit)
    monkeypatch.setenv("VRAMKIT_LARGE_BLOCKS", "fixed")
    monkeypatch.setenv("VRAMKIT_VIRTUAL_THRESHOLD", "1")
    fixed = vramkit.estimate(_step, build=_mlp_build(batch=4096), memory_limit=limit)
    assert default.peak_allocated == fixed.peak_allocated < limit
    assert default.fits and not fixed.fits


def test_find_max_batch_predicts_the_edge():
    """The predicted batch fits and the next one does not, by the same estimate."""
    limit = 300 << 20  # between the MLP's peak live at batch 2048 (248 MiB) and 4096 (352)

    def make(n):
        return _mlp_build(batch=n)()

    best = vramkit.find_max_batch(_step, make, memory_limit=limit, most=4096)
    assert best > 1
    fits = lambda n: vramkit.estimate(_step, build=_mlp_build(batch=n),  # noqa: E731
                                      memory_limit=limit).fits
    assert fits(best) and not fits(best + 1)
    assert vramkit.find_max_batch(_step, make, memory_limit=1 << 20) == 0
    with pytest.raises(ValueError):
        vramkit.find_max_batch(_step, make)
    with pytest.raises(ValueError):
        vramkit.find_max_batch(_step, make, memory_limit=limit, mode="guess")


def test_the_search_finds_the_largest_from_any_guess():
    for answer in (0, 1, 7, 63, 64):
        for guess in (None, 1, 5, 40, 64):
            tried = []
            got = _largest(lambda n: tried.append(n) or n <= answer, 1, 64, guess)
            assert got == min(answer, 64)
            assert all(1 <= n <= 64 for n in tried)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(WIDTH, 2 * WIDTH)
        self.down = torch.nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class _Net(torch.nn.Module):
    def __init__(self, depth=8):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(depth))
        self.head = torch.nn.Linear(WIDTH, 8)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _net_build(batch=2048):
    def build():
        net = _Net()
        return net, torch.optim.SGD(net.parameters(), lr=0.1), torch.randn(batch, WIDTH)
    return build


def test_repeated_blocks_are_the_model_trunk():
    from vramkit.estimator.variants import repeated_blocks
    assert repeated_blocks(_Net()) == [f"blocks.{i}" for i in range(8)]
    pytest.importorskip("transformers")
    w = models.workload("gpt2", 1, seq=32)
    assert repeated_blocks(w.build()[0]) == [f"transformer.h.{i}" for i in range(12)]


def test_checkpointing_keeps_results_and_gradients():
    """apply_checkpointing changes what is kept, not what is computed (real tensors)."""
    from vramkit.estimator.variants import apply_checkpointing
    torch.manual_seed(0)
    plain, x = _Net(depth=3), torch.randn(16, WIDTH)
    checked = _Net(depth=3)
    checked.load_state_dict(plain.state_dict())
    assert apply_checkpointing(checked, ["blocks.0", "blocks.2"]) == ["blocks.0", "blocks.2"]
    plain(x).sum().backward()
    checked(x).sum().backward()
    for a, b in zip(plain.parameters(), checked.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-5)
    with pytest.raises(KeyError):
        apply_checkpointing(checked, ["blocks.9"])


def test_advise_ranks_the_changes():
    advice = vramkit.advise(_step, build=_net_build(), memory_limit="64G")
    rows = {r.variant: r for r in advice.rows}
    assert advice.rows[0].variant == "as written" and advice.rows[0].saves == 0
    full = rows["checkpointing all 8 blocks"]
    assert full.peak_allocated < rows["as written"].peak_allocated
    assert full.extra_compute > 0.1        # the blocks' forward runs twice
    assert rows["bf16 autocast"].extra_compute == 0
    half = rows["bf16 weights and optimizer state"]
    assert half.peak_allocated < rows["as written"].peak_allocated
    savings = [r.saves for r in advice.rows[1:]]
    assert savings == sorted(savings, reverse=True)
    assert "checkpointing all 8 blocks" in str(advice)


def test_plan_checkpointing_finds_the_fewest_blocks():
    from vramkit.estimator import variants
    plain = vramkit.estimate(_step, build=_net_build())
    full = vramkit.estimate(_step, build=_net_build(),
                            variant=variants.Variant("all", checkpoint_every=1))
    limit = (plain.peak_reserved + full.peak_reserved) // 2
    plan = vramkit.plan_checkpointing(_step, build=_net_build(), memory_limit=limit)
    assert plan.fits and plan.estimate.fits and 0 < len(plan.names) < 8
    assert set(plan.names) <= {f"blocks.{i}" for i in range(8)}
    fewer = variants._spread([f"blocks.{i}" for i in range(8)], len(plan.names) - 1)
    one_less = vramkit.estimate(_step, build=_net_build(), memory_limit=limit,
                                variant=variants.Variant("fewer", checkpoint_names=fewer))
    assert not one_less.fits
    assert vramkit.plan_checkpointing(_step, build=_net_build(), memory_limit="64G").names == []
    tiny = vramkit.plan_checkpointing(_step, build=_net_build(), memory_limit=1 << 20)
    assert not tiny.fits


def test_the_doctor_ranks_fixes_by_the_estimates_of_this_step():
    """An OOM whose cause is live memory: the doctor, given the estimator's callback for
    the step, ranks its fixes by the savings the estimates predict."""
    fn = vramkit.doctor_estimates(_step, build=_net_build(),
                                  make_batch=lambda n: _net_build(batch=n)(), batch=2048)
    base = fn("baseline")
    assert fn("half_batch") < base and fn("checkpointing") < base
    assert fn("baseline") == base  # asked once, estimated once
    # The engine's figures of such an OOM (vramkit.last_oom_info()'s dict): 7.5 GiB live
    # and 2 GiB asked on an 8 GiB device.
    GiB = 1 << 30
    info = {"cause": "live", "device": 0, "source": "sim", "requested": 2 * GiB,
            "capacity": 8 * GiB, "device_free": GiB // 2, "limit": 0,
            "reserved": 15 * GiB // 2, "allocated": 15 * GiB // 2, "cached_free": 0,
            "largest_free_block": 0, "shortfall": 3 * GiB // 2, "neighbours": []}
    d = vramkit.diagnose(info, estimate_fn=fn)
    assert d.cause == "live"
    effects = [f.effect for f in d.fixes if f.effect is not None]
    assert effects and effects == sorted(effects, reverse=True)
    with pytest.raises(KeyError):
        vramkit.doctor_estimates(_step, build=_net_build())("half_batch")


def test_peak_allocated_as_each_allocator_counts_it():
    """A 19.5 MiB tensor live at the peak: PyTorch's large pool gives it a 20 MiB segment
    of its own and keeps the 0.5 MiB remainder inside its block (a remainder of 1 MiB or
    less is not split off), so torch.cuda.max_memory_allocated() counts 20 MiB where
    vramkit and expandable segments count the request rounded to 512 bytes."""
    MiB = 1 << 20
    n = (39 * MiB // 2) // 4  # 19.5 MiB of float32

    def build():
        net = torch.nn.Linear(16, 16)
        return net, torch.optim.SGD(net.parameters(), lr=0.1), torch.randn(4, 16)

    def step(net, opt, x):
        big = torch.ones(n, device=x.device)
        (net(x).sum() + big.sum()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    e = vramkit.estimate(step, build=build, model_workspaces=False)
    assert e.torch_peak_allocated - e.peak_allocated == MiB // 2
    assert e.torch_expandable_peak_allocated == e.peak_allocated


def test_a_step_larger_than_any_device_does_not_fit(tmp_path):
    """A usable configuration whose step holds more than the largest device the engine
    models fits no card: exit 1 (does not fit), and the advice names the model's size,
    not only the batch's."""
    pytest.importorskip("transformers")
    vast = tmp_path / "vast_vocabulary.json"
    vast.write_text('{"model_type": "gpt2", "n_layer": 1, "n_embd": 64, "n_head": 2, '
                    '"n_positions": 8, "vocab_size": 100000000000, "bos_token_id": null, '
                    '"eos_token_id": null}')
    done = subprocess.run([sys.executable, "-m", "vramkit", "estimate", "--model", str(vast),
                           "--batch", "1", "--seq", "8"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stderr
    assert "it fits no card; a smaller model, batch or sequence might" in done.stderr
    assert "Traceback" not in done.stderr


def test_autocast_frees_its_cached_weights_in_the_order_they_were_made(tmp_path):
    """Leaving autocast drops its cache of cast weights, a hash table keyed by address, in
    an order that changes from run to run; the trace lists those frees in the order the
    copies were made, so that one step always gives one trace and one estimate."""
    layers = 24

    def build():
        net = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(layers)))
        return net, torch.randn(8, 256)

    def step(net, x):
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            net(x)

    path = tmp_path / "autocast.trace.gz"
    vramkit.estimate(step, build=build, steps=1, trace_path=str(path))
    with gzip.open(path, "rt") as f:
        records = [line.split() for line in f if not line.startswith("#")]
    weight_copy = 256 * 256 * 2  # each Linear's weight cast to bf16
    copies = [int(r[1]) for r in records if r[0] == "a" and int(r[2]) == weight_copy]
    assert len(copies) == layers
    frees = [int(r[1]) for r in records if r[0] == "f" and int(r[1]) in set(copies)]
    assert frees == copies


def test_grouped_matrix_products_in_fp32_are_estimated_as_cuda_runs_them():
    """PyTorch's fake kernel of `_grouped_mm` (mixture-of-experts layers) takes bfloat16
    only, while CUDA runs other dtypes through a fallback: the estimate makes the output
    CUDA's fallback makes, rows padded to 16 bytes, instead of failing."""
    tokens, width, experts, out_width = 1000, 64, 4, 6  # 6 floats: rows padded to 8
    offs = torch.tensor([250, 500, 750, 1000], dtype=torch.int32)

    def build():
        return (torch.randn(tokens, width, device="cuda"),
                torch.randn(experts, width, out_width, device="cuda"), offs.to("cuda"))

    def step(x, w, o):
        with torch.no_grad():
            y = torch._grouped_mm(x, w, offs=o)
            y.mul(2)

    e = vramkit.estimate(step, build=build, steps=1, model_workspaces=False)
    before = _rounded(tokens * width * 4) + _rounded(experts * width * out_width * 4) \
        + _rounded(experts * 4)
    padded = _rounded(((tokens - 1) * 8 + out_width) * 4)  # the last row is not padded
    assert e.peak_allocated == before + padded + _rounded(tokens * out_width * 4)


def _linear_sgd_build(batch_device: str):
    def build():
        net = torch.nn.Linear(WIDTH, WIDTH).to("cuda")
        return net, torch.optim.SGD(net.parameters(), lr=0.1), \
            torch.randn(BATCH, WIDTH, device=batch_device)
    return build


def _same_estimate(step, build) -> None:
    """The step written one way (step(True)) is estimated as written the other."""
    one = vramkit.estimate(step(True), build=build, model_workspaces=False)
    other = vramkit.estimate(step(False), build=build, model_workspaces=False)
    assert one.peak_allocated == other.peak_allocated > 0
    assert one.peak_reserved == other.peak_reserved


def test_a_batch_pinned_in_the_step_is_estimated_as_the_same_step_unpinned():
    """`batch.pin_memory().to("cuda", non_blocking=True)` has no fake kernel in PyTorch:
    the estimate stands the batch in for its pinned copy (host memory, not counted), so the
    step is estimated as it is without pinning, instead of refused."""
    build = _linear_sgd_build("cpu")

    def step(pin):
        def one(net, opt, batch):
            batch = batch.pin_memory() if pin else batch
            net(batch.to("cuda", non_blocking=True)).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return one

    _same_estimate(step, build)


def test_a_batch_copied_on_a_side_stream_with_record_stream_is_estimated():
    """A prefetch on a side stream, the copy's use recorded on the main stream: on the CPU
    stand-in `record_stream` takes the stand-in's streams, and the step is estimated as the
    same step on one stream."""
    build = _linear_sgd_build("cpu")

    def step(side):
        def one(net, opt, batch):
            if side:
                stream = torch.cuda.Stream()
                with torch.cuda.stream(stream):
                    batch = batch.to("cuda", non_blocking=True)
                torch.cuda.current_stream().wait_stream(stream)
                batch.record_stream(torch.cuda.current_stream())
            else:
                batch = batch.to("cuda")
            net(batch).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return one

    _same_estimate(step, build)


def test_a_step_that_saves_and_restores_the_cuda_generator_is_estimated():
    """`torch.cuda.get_rng_state()` / `set_rng_state()` around a step's dropout (custom
    recomputation saves them so): answered on the CPU stand-in, with a host tensor that
    adds nothing to the step's device memory."""
    build = _linear_sgd_build("cuda")

    def step(save):
        def one(net, opt, batch):
            state = torch.cuda.get_rng_state() if save else None
            out = torch.nn.functional.dropout(net(batch), 0.1)
            if save:
                assert state.dtype == torch.uint8 and state.device.type == "cpu"
                torch.cuda.set_rng_state(state)
            out.square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return one

    _same_estimate(step, build)


def test_noise_drawn_from_a_cuda_generator_is_estimated():
    """`torch.Generator(device="cuda")` (seeded noise, as diffusion steps draw it) cannot
    be made without CUDA: on the CPU stand-in it is the CPU's, and the step is estimated as
    the same step drawing from the default generator."""
    build = _linear_sgd_build("cuda")

    def step(seeded):
        def one(net, opt, batch):
            generator = torch.Generator(device="cuda").manual_seed(0) if seeded else None
            noise = torch.randn(batch.shape, generator=generator, device="cuda")
            assert isinstance(generator or torch.default_generator, torch.Generator)
            net(batch + noise).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return one

    _same_estimate(step, build)
    assert torch.Generator is torch._C.Generator  # given back after the estimate


def test_a_capturable_adam_is_estimated_with_its_step_counters_on_the_device():
    """`Adam(capturable=True)` (for CUDA graphs) keeps its step counters on the device;
    its check of the parameters' device type took the CPU stand-in's for a wrong one."""
    def build():
        net = torch.nn.Linear(WIDTH, WIDTH).to("cuda")
        return net, torch.optim.Adam(net.parameters(), capturable=True), \
            torch.randn(BATCH, WIDTH, device="cuda")

    def step(net, opt, batch):
        net(batch).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    e = vramkit.estimate(step, build=build, model_workspaces=False)
    moments = 2 * (_rounded(WIDTH * WIDTH * 4) + _rounded(WIDTH * 4))
    assert e.breakdown["optimizer state"] == moments + 2 * _rounded(4)  # a counter each


def test_a_mixture_of_experts_model_with_fp32_weights_under_autocast():
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=1000)

    def build():
        net = transformers.MixtralForCausalLM(config).to("cuda")
        return net, torch.optim.AdamW(net.parameters()), torch.randint(0, 1000, (2, 32))

    def step(net, opt, ids):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = net(input_ids=ids.to("cuda"), labels=ids.to("cuda")).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    e = vramkit.estimate(step, build=build)
    # fp32 weights, their gradients and AdamW's two moments are all live in step two.
    assert e.breakdown["parameters"] >= 4 * sum(p.numel() for p in
                                                transformers.MixtralForCausalLM(config)
                                                .parameters())
    assert e.peak_allocated > 4 * e.breakdown["parameters"]


def test_a_step_larger_than_the_default_simulated_device_is_replayed_whole():
    """With no cap the engine's replay runs on a simulated device large enough for the
    step (the default one is 80 GiB): reserved is never less than allocated, and a step
    larger than any device the engine models is refused, not answered with the part of
    it that fit."""
    def make(gib):
        def build():
            return torch.empty(gib << 28, device="cuda"),  # fp32: gib GiB
        return build

    def step(x):
        (x * 2).sum()

    e = vramkit.estimate(step, build=make(60), steps=1, model_workspaces=False)
    assert e.peak_allocated >= 120 << 30
    assert e.peak_allocated <= e.peak_reserved < 1.01 * e.peak_allocated
    assert e.peak_allocated <= e.min_device_memory
    with pytest.raises(UntraceableStep, match="more than the largest device vramkit models"):
        vramkit.estimate(step, build=make(100_000), steps=1, model_workspaces=False)


def _wide_build():
    # Weights dominate a batch this small: the peak is the optimizer's step, where a 16-bit
    # copy of each weight would still be live had autocast's cache outlived the forward.
    net = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                              torch.nn.Linear(2048, 2048))
    return net, torch.optim.AdamW(net.parameters()), torch.randn(4, 2048)


def _wide_step(net, opt, x):
    loss = net(x.to("cuda")).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _wide_step_under(dtype):
    def step(net, opt, x):
        with torch.autocast("cuda", dtype=dtype):
            loss = net(x.to("cuda")).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def _as_estimated(step):
    e = vramkit.estimate(step, build=_wide_build, model_workspaces=False)
    return e.peak_allocated, e.peak_reserved, e.torch_peak_reserved


def test_what_if_autocast_rows_are_the_step_written_with_that_autocast():
    """A what-if row that adds autocast to a step predicts what the step written that way
    holds: autocast around the forward pass and the loss, its cache of cast weights gone
    before backward, not kept through the optimizer's step. A step under autocast gets no
    autocast row: the other dtype holds what its own does."""
    def row(advice, name):
        r = {r.variant: r for r in advice.rows}[name]
        return r.peak_allocated, r.peak_reserved, r.torch_peak_reserved

    bf16, fp16 = _wide_step_under(torch.bfloat16), _wide_step_under(torch.float16)
    plain = vramkit.advise(_wide_step, build=_wide_build, model_workspaces=False)
    assert row(plain, "bf16 autocast") == _as_estimated(bf16)
    assert row(plain, "fp16 autocast") == _as_estimated(fp16)
    under_bf16 = vramkit.advise(bf16, build=_wide_build, model_workspaces=False)
    assert not [r.variant for r in under_bf16.rows if "autocast" in r.variant]
    assert _as_estimated(fp16)[0] == _as_estimated(bf16)[0]


def test_eight_bit_states_are_what_bitsandbytes_keeps():
    """The 8-bit what-if row's optimizer state, counted by hand from bitsandbytes'
    layout: a one-byte moment and an fp32 scale per 256 elements for each of two moments,
    fp32 moments for a parameter under 4096 elements, and two shared 256-entry maps."""
    from vramkit.estimator import variants

    def states(n):
        if n < 4096:
            return 2 * _rounded(4 * n)
        return 2 * (_rounded(n) + _rounded(4 * -(-n // 256)))

    sizes = (4 * WIDTH * WIDTH, 4 * WIDTH, WIDTH * 4 * WIDTH, WIDTH)  # the last under 4096
    e = vramkit.estimate(_step, build=_mlp_build(),
                         variant=variants.Variant("8-bit", eight_bit_states=True))
    assert e.breakdown["optimizer state"] == sum(map(states, sizes)) + 2 * _rounded(256 * 4)


def test_a_step_that_times_itself_and_logs_memory_on_a_machine_without_a_gpu():
    """A step's own torch.cuda calls (events around a timer, synchronize, the device's
    name and bf16 support, peak statistics reset, a side stream, a device context) are
    answered on the CPU stand-in as one device would answer them, and leave the estimate
    what the same step without them gives; outside the estimate they are PyTorch's again."""
    plain = _wide_step_under(torch.bfloat16)

    def instrumented(net, opt, x):
        torch.cuda.set_device(0)
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.device(0), torch.cuda.stream(side):
            pass
        torch.cuda.current_stream().wait_stream(side)
        assert torch.cuda.is_bf16_supported() and torch.cuda.get_device_capability() >= (8, 0)
        plain(net, opt, x)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end), torch.cuda.get_device_name(), torch.cuda.mem_get_info()

    expected = vramkit.estimate(plain, build=_mlp_build(), model_workspaces=False)
    got = vramkit.estimate(instrumented, build=_mlp_build(), model_workspaces=False)
    assert got.emulated
    assert (got.peak_allocated, got.peak_reserved) == (expected.peak_allocated,
                                                       expected.peak_reserved)
    # The notes say what was answered, counted over the two steps; the plain step made none.
    answered = [n for n in got.notes if "torch.cuda calls were answered" in n]
    assert len(answered) == 1 and "synchronize (2)" in answered[0]
    assert "Event (4)" in answered[0] and "Stream (2)" in answered[0]
    assert not any("torch.cuda calls" in n for n in expected.notes)
    if not torch.cuda.is_available():
        with pytest.raises((RuntimeError, AssertionError)):
            torch.cuda.synchronize()


def test_a_gradient_scaler_made_in_build_runs_as_on_the_gpu_without_one():
    """GradScaler("cuda") made where CUDA is not available disables itself with a warning;
    on the CPU stand-in it runs as on the GPU: no warning, and its check for infinities is
    read as none found, which the notes say."""
    import warnings

    def build():
        net, opt, x = _wide_build()
        return net.cuda(), opt, torch.amp.GradScaler("cuda"), x

    def step(net, opt, scaler, x):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = net(x.to("cuda")).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        e = vramkit.estimate(step, build=build, model_workspaces=False)
    assert not [w for w in caught if "GradScaler" in str(w.message)]
    assert any("gradient scaler" in note for note in e.notes)



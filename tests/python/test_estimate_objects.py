"""Tests of vramkit.estimate on the objects a step is given or builds besides the model:
a deep copy made in build() (an EMA or teacher model), memory held in a plain object
(copies of the weights counted as parameters, a resumed optimizer's state as its state),
LR schedulers and gradient scalers passed in (twinned, never changed), an optimizer
wrapper as accelerate makes, DistributedDataParallel (refused, saying what to do), a step
that asks whether CUDA is available (told of it), a torch.compile'd model (run eagerly,
and said so), and a dataset build() keeps on the host. On the CPU stand-in for CUDA.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import vramkit  # noqa: E402
from vramkit.estimator import UntraceableStep  # noqa: E402


def test_an_ema_copy_made_with_deepcopy_in_build_is_counted():
    """timm's ModelEmaV3 and teacher models are ``copy.deepcopy(model)`` in build(): with
    a BatchNorm (its step counter, made from a Python number, holds its value) the copy
    failed under fake tensors. It is now made, and holds what the model holds once more."""
    import copy

    def model():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
                                   torch.nn.Flatten(), torch.nn.Linear(8 * 14 * 14, 10))

    def build(ema: bool):
        def made():
            net = model().to("cuda")
            args = (net, torch.randn(4, 3, 16, 16, device="cuda"))
            if not ema:
                return args
            shadow = copy.deepcopy(net).requires_grad_(False)
            return (*args, shadow)
        return made

    def step(net, x, shadow=None):
        net(x).sum().backward()

    alone = vramkit.estimate(step, build=build(False))
    with_ema = vramkit.estimate(step, build=build(True))
    assert with_ema.breakdown["parameters"] == 2 * alone.breakdown["parameters"]


def test_schedulers_and_scalers_given_in_are_twinned_too(monkeypatch):
    """Objects passed to estimate() directly are never changed: an LR scheduler stepped in
    the step changes its twin's optimizer, not the user's learning rate, and a GradScaler
    keeps no fake scale (on a GPU its next real step would have trained on fake
    gradients); no scheduler warning about the optimizer's step is printed."""
    import warnings

    import torch.nn.functional as F

    # As on a machine with a GPU: the scaler is made enabled.
    monkeypatch.setattr(torch.cuda.amp.common, "amp_definitely_not_available", lambda: False)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cuda")
    monkeypatch.undo()
    x, y = torch.randn(4, 64), torch.randint(0, 10, (4,))

    def step(net, opt, sched, scaler, x, y):
        scaler.scale(F.cross_entropy(net(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        sched.step()

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        e = vramkit.estimate(step, net, opt, sched, scaler, x, y)
    assert e.peak_allocated > 0
    assert opt.param_groups[0]["lr"] == 1e-3 and sched.last_epoch == 0
    assert getattr(scaler, "_scale", None) is None and not opt.state


def test_a_compiled_model_is_estimated_as_eager_and_says_so():
    """Dynamo compiles nothing on the estimate's fake tensors: a torch.compile'd model
    gives the eager model's figures, and a note says so (none for an eager model)."""

    def build(compiled: bool):
        def made():
            net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                      torch.nn.Linear(128, 10)).to("cuda")
            return (torch.compile(net) if compiled else net), torch.randn(8, 64, device="cuda")
        return made

    def step(net, x):
        net(x).sum().backward()

    compiled = vramkit.estimate(step, build=build(True))
    eager = vramkit.estimate(step, build=build(False))
    assert compiled.peak_allocated == eager.peak_allocated
    assert any("ran as eager PyTorch" in n for n in compiled.notes), compiled.notes
    assert not any("torch.compile" in n for n in eager.notes)


def _linear_build(holder=None):
    """A linear layer, its optimizer and a batch; ``holder(net)`` adds an object holding
    more of the program's memory (an EMA copy kept in it, say)."""
    def build():
        net = torch.nn.Linear(256, 256).to("cuda")
        opt = torch.optim.AdamW(net.parameters())
        made = (net, opt, torch.randn(8, 256, device="cuda"))
        return made if holder is None else (*made, holder(net))
    return build


def _train(net, opt, x, *_held):
    net(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_memory_held_in_a_plain_object_from_build_is_counted():
    """An EMA copy of the weights (updated every few steps, not in the one estimated) or a
    teacher kept in a SimpleNamespace or a class of the user's was left out: only lists,
    tuples and dicts were looked into. It is the program's memory as in a dict."""
    from types import SimpleNamespace

    def shadow(net):
        return [p.detach().clone() for p in net.parameters()]

    alone = vramkit.estimate(_train, build=_linear_build())
    in_dict = vramkit.estimate(_train, build=_linear_build(lambda n: {"ema": shadow(n)}))
    in_object = vramkit.estimate(
        _train, build=_linear_build(lambda n: SimpleNamespace(ema=SimpleNamespace(
            weights=shadow(n)))))
    copy_bytes = in_dict.peak_allocated - alone.peak_allocated
    assert copy_bytes == alone.breakdown["parameters"] > 0
    assert in_object.peak_allocated == in_dict.peak_allocated


def test_weights_copied_in_build_are_parameters_and_a_resumed_state_is_optimizer_state():
    """Tensors held outside any module were all put down as the batch ("inputs"): an EMA
    copy of the weights kept in a list, and the state of an optimizer that stepped in
    build() (as one resumed from a checkpoint has it). The copy is the model's weights
    again, made from them; the state is the optimizer's."""
    from types import SimpleNamespace

    alone = vramkit.estimate(_train, build=_linear_build())
    copies = {
        "detached clones in a dict": lambda n: {"ema": [p.detach().clone()
                                                        for p in n.parameters()]},
        ".data clones in an object": lambda n: SimpleNamespace(
            weights=[p.data.clone() for p in n.parameters()]),
        "copied into new tensors": lambda n: [torch.empty_like(p).copy_(p)
                                              for p in n.parameters()],
    }
    for how, holder in copies.items():
        parts = vramkit.estimate(_train, build=_linear_build(holder)).breakdown
        assert parts["parameters"] == 2 * alone.breakdown["parameters"], how
        assert parts["inputs"] == alone.breakdown["inputs"] > 0, how
    # Computed from the weights, not a copy of them: a teacher's outputs kept as targets.
    targets = vramkit.estimate(_train, build=_linear_build(
        lambda n: {"targets": n(torch.randn(8, 256, device="cuda")).detach()})).breakdown
    assert targets["parameters"] == alone.breakdown["parameters"]
    assert targets["inputs"] == 2 * alone.breakdown["inputs"]

    def resumed():  # the state as load_state_dict() leaves it
        net, opt, x = _linear_build()()
        for p in net.parameters():
            opt.state[p] = {"step": torch.tensor(1.0, device="cpu"),
                            "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
        return net, opt, x

    parts = vramkit.estimate(_train, build=resumed).breakdown
    assert parts["inputs"] == alone.breakdown["inputs"]
    assert parts["optimizer state"] == alone.breakdown["optimizer state"] > 0


class _WrappingOptimizer(torch.optim.Optimizer):
    """An optimizer wrapper as accelerate's AcceleratedOptimizer is written: a subclass of
    torch.optim.Optimizer that never runs its constructor and forwards to the optimizer
    it wraps (so it has no step hooks of its own)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def step(self, closure=None):
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)


def test_a_wrapped_optimizer_is_watched_through_the_one_it_wraps():
    """accelerate's `prepare()` returns such a wrapper: the estimate failed with an
    AttributeError (a traceback, not an UntraceableStep) registering its step hooks."""
    def build(wrapped):
        def made():
            net, opt, x = _linear_build()()
            return net, (_WrappingOptimizer(opt) if wrapped else opt), x
        return made

    plain = vramkit.estimate(_train, build=build(False))
    wrapped = vramkit.estimate(_train, build=build(True))
    assert wrapped.breakdown == plain.breakdown
    assert wrapped.peak_reserved == plain.peak_reserved


def test_distributed_data_parallel_is_refused_with_what_to_do(tmp_path):
    """DDP reads the parameters' memory when it wraps them; the refusal said to give an
    RNN padded batches. It now says what to estimate instead."""
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("this PyTorch has no torch.distributed")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'group'}", rank=0,
                            world_size=1)
    try:
        def build():
            net, opt, x = _linear_build()()
            return torch.nn.parallel.DistributedDataParallel(net), opt, x

        with pytest.raises(UntraceableStep) as refused:
            vramkit.estimate(_train, build=build)
    finally:
        dist.destroy_process_group()
    message = str(refused.value)
    assert "DistributedDataParallel" in message and "without its DDP wrapper" in message
    assert "PackedSequence" not in message


def test_a_step_that_asks_whether_cuda_is_available_is_told_of_it():
    """On the CPU stand-in `torch.cuda.is_available()` stays False, and code that chooses
    its path by it (accelerate turns fp16 mixed precision off without CUDA) is estimated
    on the path it takes here: a note says so. PyTorch's own questions raise no note."""
    def build(asks):
        def made():
            if asks:
                torch.cuda.is_available()  # as a library choosing its path would
            return _linear_build()()
        return made

    worded = "asked torch.cuda.is_available()"
    asked = vramkit.estimate(_train, build=build(True))
    plain = vramkit.estimate(_train, build=build(False))
    if not asked.emulated:
        pytest.skip("a GPU is present: the question has its real answer")
    assert any(worded in note for note in asked.notes), asked.notes
    assert not any(worded in note for note in plain.notes), plain.notes


def test_more_than_the_objects_looked_into_is_said(monkeypatch):
    """Plain objects are looked into up to a bound (a dataset of a million samples held
    beside the model is not walked): past it the estimate says what it left out. Lists,
    tuples and dicts are walked whole, as before."""
    from types import SimpleNamespace

    from vramkit.plan.estimator import _step

    monkeypatch.setattr(_step, "_MOST_OBJECTS_LOOKED_INTO", 40)
    many = 60
    worded = "hold more than the estimate looks into"

    def held(in_object):
        def hold(net):
            blocks = [torch.zeros(1, device="cuda") for _ in range(many)]
            return SimpleNamespace(blocks=blocks) if in_object else blocks
        return hold

    alone = vramkit.estimate(_train, build=_linear_build())
    in_list = vramkit.estimate(_train, build=_linear_build(held(False)))
    in_object = vramkit.estimate(_train, build=_linear_build(held(True)))
    assert in_list.breakdown["inputs"] - alone.breakdown["inputs"] == many * 512
    assert not any(worded in note for note in in_list.notes)
    assert in_object.breakdown["inputs"] - alone.breakdown["inputs"] < many * 512
    assert any(worded in note for note in in_object.notes), in_object.notes


def _host_data_step(net, opt, data):
    net(data[:64].to("cuda")).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _device_batch_step(net, opt, _data):
    net(torch.randn(64, 1024).cuda()).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_a_dataset_build_keeps_on_the_host_is_not_counted():
    """A tensor build() makes with ``device="cpu"`` (a dataset held in host memory, 80 MB
    here) is the host's on a GPU machine, and on the CPU stand-in too; the batch the step
    moves to CUDA from it is a device copy, as on the GPU: the step holds what it holds
    when it makes the same batch on the device itself."""
    def build(host_data: bool):
        def made():
            net = torch.nn.Linear(1024, 1024).to("cuda")
            data = (torch.randn(20_000, 1024, device=torch.device("cpu")) if host_data
                    else None)
            return net, torch.optim.SGD(net.parameters(), lr=0.1), data
        return made

    from_host = vramkit.estimate(_host_data_step, build=build(True), model_workspaces=False)
    on_device = vramkit.estimate(_device_batch_step, build=build(False),
                                 model_workspaces=False)
    assert from_host.breakdown["inputs"] == 0
    assert from_host.peak_allocated == on_device.peak_allocated
    assert from_host.peak_reserved == on_device.peak_reserved


def test_a_tensor_the_step_makes_on_a_tensors_device_is_counted():
    """In the step, ``device=x.device`` names the stand-in's CPU for a tensor that is on
    the GPU: what it makes is the device's (only build()'s ``device="cpu"`` is the host's)."""
    def build():
        net = torch.nn.Linear(256, 256).to("cuda")
        return net, torch.randn(8, 256, device="cuda")

    def step(net, x, extra: int):
        mask = torch.ones(extra, device=x.device)
        (net(x).sum() + mask.sum()).backward()

    small = vramkit.estimate(step, 1, build=build, model_workspaces=False)
    large = vramkit.estimate(step, 1 << 20, build=build, model_workspaces=False)
    assert large.peak_allocated - small.peak_allocated >= (1 << 20) * 4 - 512


def test_a_sparse_tensor_build_keeps_on_the_host_is_estimated():
    """A sparse tensor has no storage to mark as the host's: build() may still make one
    on the CPU, and the step move it to CUDA."""
    def build():
        net = torch.nn.Linear(64, 8).to("cuda")
        where = torch.tensor([[0, 1], [2, 3]])
        return net, torch.sparse_coo_tensor(where, torch.ones(2), (4, 64), device="cpu")

    def step(net, batch):
        net(batch.to("cuda").to_dense()).sum().backward()

    e = vramkit.estimate(step, build=build, model_workspaces=False)
    assert e.breakdown["parameters"] == 64 * 8 * 4 + 512  # weight, and the bias's block


def test_a_batch_loaded_with_torch_load_onto_cuda_is_the_device_s(tmp_path):
    """torch.load(map_location="cuda") restores storages with their own .cuda(), out of
    the fake mode's reach: the loaded batch must be a fake device tensor, as one made on
    the device is (on a GPU host it was a real one, put on the card by the estimate)."""
    path = tmp_path / "batch.pt"
    torch.save(torch.randn(8, 256), path)

    def loaded():
        net, opt, _ = _linear_build()()
        return net, opt, torch.load(path, map_location="cuda")

    made = vramkit.estimate(_train, build=_linear_build())
    from_file = vramkit.estimate(_train, build=loaded)
    assert from_file.peak_allocated == made.peak_allocated
    assert from_file.breakdown["inputs"] == made.breakdown["inputs"] > 0


def test_a_checkpoint_saved_from_cuda_loads_back_onto_the_device(tmp_path, monkeypatch):
    """torch.load with no map_location puts each tensor back where it was saved from:
    a batch saved from CUDA (tagged so here, where there is no GPU) is the device's, as
    one made there is; one saved from the CPU stays on the host, uncounted."""
    path = tmp_path / "batches.pt"
    with monkeypatch.context() as saving:
        tags = iter(["cuda:0", "cpu"])
        saving.setattr(torch.serialization, "location_tag", lambda storage: next(tags))
        torch.save({"device": torch.randn(8, 256), "host": torch.randn(8, 256)}, path)

    def loaded():
        net, opt, _ = _linear_build()()
        saved = torch.load(path)
        assert saved["host"].device.type == "cpu"
        return net, opt, saved["device"]

    made = vramkit.estimate(_train, build=_linear_build())
    from_file = vramkit.estimate(_train, build=loaded)
    assert from_file.peak_allocated == made.peak_allocated
    assert from_file.breakdown["inputs"] == made.breakdown["inputs"] > 0

"""The CPU stand-in keeps what CUDA's kernels keep (issue 38): attention over a mask (the
fused kernels, and the composite one CUDA runs for a mask whose last dimension is not
contiguous), grouped-query attention's FLOPs, cross entropy and log_softmax under
autocast. Sizes are checked against hand counts, or against PyTorch's own composite run
where the stand-in stands in for it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import vramkit  # noqa: E402
from vramkit.estimator import UntraceableStep  # noqa: E402

F = torch.nn.functional


def _plain_step(net, opt, x):
    net(x).float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_grouped_query_attention_is_counted_per_query_head():
    """A fused attention op whose keys have fewer heads than its queries (Llama's
    grouped-query attention, as on a GPU): PyTorch's FLOP formula refuses the shapes, and
    the recorder counts it per query head instead of failing the estimate."""
    from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, \
        sdpa_flop_count
    from vramkit.plan.estimator._record import grouped_attention_flops
    aten = torch.ops.aten
    q = torch.empty(2, 8, 16, 32)
    kv = torch.empty(2, 2, 16, 32)
    wide = (2, 8, 16, 32)
    forward = aten._scaled_dot_product_efficient_attention.default
    with pytest.raises(AssertionError):
        flop_registry[forward._overloadpacket](q, kv, kv, out_val=None)
    assert grouped_attention_flops(forward, (q, kv, kv)) == sdpa_flop_count(wide, wide, wide)
    backward = aten._scaled_dot_product_flash_attention_backward.default
    assert grouped_attention_flops(backward, (torch.empty(wide), q, kv, kv)) == \
        sdpa_backward_flop_count(wide, wide, wide, wide)
    assert grouped_attention_flops(aten.mm.default, (q, kv)) == 0


class _LearnedBiasAttention(torch.nn.Module):
    """Attention over a learned bias added to the scores; `learned=False` passes the bias
    detached (a mask that needs no gradient); `permuted=True` keeps the bias as keys x
    heads last, as an embedding lookup makes T5's relative positions, and permutes it into
    place, so that its last dimension is not contiguous; `mask_batch` gives a contiguous
    bias a batch of its own. (bench/attention_mask_probe.py runs it on a GPU too.)"""

    def __init__(self, heads: int, rows: int, width: int, learned: bool,
                 permuted: bool = False, dropout_p: float = 0.1, mask_batch: int = 1):
        super().__init__()
        self.dropout_p = dropout_p
        self.proj = torch.nn.Linear(width, width)
        shape = (rows, rows, heads) if permuted else (mask_batch, heads, rows, rows)
        self.bias = torch.nn.Parameter(torch.zeros(shape))
        self.learned, self.permuted = learned, permuted

    def forward(self, x):
        q = self.proj(x)
        mask = self.bias if self.learned else self.bias.detach()
        if self.permuted:
            mask = mask.permute(2, 0, 1).unsqueeze(0)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask,
                                                                dropout_p=self.dropout_p)


_BATCH, _HEADS, _ROWS, _WIDTH = 4, 4, 256, 32
_SCORES = _BATCH * _HEADS * _ROWS * _ROWS


def _attention_build(learned: bool, permuted: bool = False, module=None):
    def make():
        net = (module or _LearnedBiasAttention)(_HEADS, _ROWS, _WIDTH, learned,
                                                permuted).to("cuda")
        return net, torch.optim.SGD(net.parameters(), lr=0.1), \
            torch.randn(_BATCH, _HEADS, _ROWS, _WIDTH, device="cuda")
    return make


def test_attention_with_a_learned_mask_takes_the_fused_kernel():
    """A mask that requires grad, its last dimension contiguous, goes to CUDA's
    memory-efficient kernel, which makes the mask's gradient at the scores' full shape
    (fp32 here): that is all the step holds beyond the same step with the mask detached.
    (PyTorch 2.11 on an H200 chose that kernel, and the real steps differed by the same
    bytes.)"""
    learned = vramkit.estimate(_plain_step, build=_attention_build(True),
                               model_workspaces=False)
    detached = vramkit.estimate(_plain_step, build=_attention_build(False),
                                model_workspaces=False)
    assert learned.peak_allocated - detached.peak_allocated == _SCORES * 4


class _MaskMadeInTheStep(_LearnedBiasAttention):
    """The additive mask made in the forward pass, as transformers combines a position
    bias with a padding or causal mask (T5 under transformers 5.25): nothing but the
    attention kernel holds it afterwards."""

    def forward(self, x):
        q = self.proj(x)
        mask = self.bias.detach() * 2
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)


def test_the_fused_kernel_keeps_its_additive_mask_for_backward():
    """CUDA's memory-efficient kernel keeps the additive mask it was given until its
    backward, which reads it again: a mask made in the step lives until then, one batch x
    heads x rows x keys of fp32 more at the peak than a mask that is a parameter's storage.
    (The card's per-op log of T5 under transformers 5.25 keeps one such mask per layer;
    the stand-in dropped them, 1.2% short.)"""
    made = vramkit.estimate(_plain_step, build=_attention_build(False, module=_MaskMadeInTheStep),
                            model_workspaces=False)
    stored = vramkit.estimate(_plain_step, build=_attention_build(False), model_workspaces=False)
    assert made.peak_allocated - stored.peak_allocated == _HEADS * _ROWS * _ROWS * 4


class _BooleanMaskMadeInTheStep(_LearnedBiasAttention):
    """A boolean mask made in the forward pass (a padding mask, batch x 1 x rows x keys)."""

    def forward(self, x):
        q = self.proj(x)
        mask = (x[:, :1, :, :1] > -100).expand(-1, -1, -1, x.size(-2)).contiguous()
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)


def test_a_boolean_mask_is_kept_as_the_additive_one_pytorch_makes_of_it():
    """PyTorch turns a boolean mask into an additive one in the query's dtype (its
    where(mask, 0, -inf)) before any kernel runs, and the fused kernel keeps that one for
    backward: a step with a boolean padding mask made in it holds batch x rows x keys of
    fp32 more at the peak than one whose mask is a parameter's storage (one head of it:
    the mask's own shape, broadcast over the heads)."""
    boolean = vramkit.estimate(
        _plain_step, build=_attention_build(False, module=_BooleanMaskMadeInTheStep),
        model_workspaces=False)
    stored = vramkit.estimate(_plain_step, build=_attention_build(False), model_workspaces=False)
    assert boolean.peak_allocated - stored.peak_allocated == _BATCH * _ROWS * _ROWS * 4


def test_attention_with_a_mask_not_contiguous_keeps_what_cuda_keeps():
    """PyTorch's fused attention kernels refuse a mask whose last dimension is not
    contiguous, so CUDA runs its composite attention, which keeps the fp32 softmax of the
    scores, dropout's one-byte mask and the dropped weights for backward; the CPU stand-in
    keeps them too, where a contiguous mask leaves the fused kernel's output and row
    statistics alone."""
    permuted = vramkit.estimate(_plain_step, build=_attention_build(False, permuted=True),
                                model_workspaces=False)
    contiguous = vramkit.estimate(_plain_step, build=_attention_build(False),
                                  model_workspaces=False)
    # Kept for backward, a score each: the softmax (fp32), dropout's mask (one byte) and
    # the dropped weights the product with the values needs (fp32).
    assert permuted.peak_allocated - contiguous.peak_allocated >= _SCORES * (4 + 1 + 4)


def _cross_entropy_step(w, x, labels):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(x @ w, labels)
    loss.backward()


def test_cross_entropy_under_autocast_keeps_what_cuda_keeps():
    """CUDA autocast does not cast cross entropy to fp32 as a whole, as CPU autocast does:
    its log-softmax keeps the logits' bf16 and its nll_loss an fp32 copy of that. At the
    backward of the loss a step of N x C logits then holds the bf16 log-softmax (2 bytes
    a logit), the fp32 copy (4) and nll_loss's fp32 gradient (4): 10 bytes a logit, where
    one fp32 cast of the logits would hold 12."""
    rows, classes, width = 1024, 4096, 16

    def build():
        return (torch.randn(width, classes, device="cuda", requires_grad=True),
                torch.randn(rows, width, device="cuda", requires_grad=True),
                torch.randint(0, classes, (rows,), device="cuda"))

    e = vramkit.estimate(_cross_entropy_step, build=build, steps=1, model_workspaces=False)
    logits = rows * classes
    assert 10 * logits <= e.peak_allocated < 10.5 * logits, e.peak_allocated / logits


def test_a_dtype_given_to_log_softmax_under_autocast_stands():
    """log_softmax(x, dim, dtype) with the dtype by position: CUDA autocast keeps it, and
    the CPU stand-in did not run such a call at all."""
    from vramkit.plan.estimator import _emulate
    x = torch.randn(8, 32).bfloat16()
    with _emulate.emulated_cuda(), torch.autocast("cuda", dtype=torch.bfloat16):
        assert torch.log_softmax(x, 1, torch.bfloat16).dtype == torch.bfloat16
        assert torch.log_softmax(x, 1).dtype == torch.float32
        assert torch.softmax(x, -1, dtype=torch.float16).dtype == torch.float16


def test_cuda_autocast_s_fp32_ops_are_fp32_on_the_stand_in_too():
    """CUDA autocast runs upsampling (and layer norm's native op, pow of a scalar base, the
    matrix norms) in fp32, where CPU autocast leaves them in the lower precision; and gives
    linalg_vector_norm an fp32 output. A UNet's upsampled features are fp32 on the card,
    and so the skip connection concatenated to them."""
    from vramkit.plan.estimator import _emulate
    x = torch.randn(2, 4, 8, 8).half()
    with _emulate.emulated_cuda(), torch.autocast("cuda", dtype=torch.float16):
        up = F.interpolate(x, scale_factor=2.0, mode="nearest")
        assert up.dtype == torch.float32
        assert torch.cat([up, F.interpolate(x, scale_factor=2.0)], 1).dtype == torch.float32
        assert F.interpolate(x, scale_factor=2.0, mode="bilinear").dtype == torch.float32
        assert torch.pow(2.0, x).dtype == torch.float32
        assert torch.linalg.vector_norm(x).dtype == torch.float32
        assert torch.ops.aten.native_layer_norm(x, [8], None, None, 1e-5)[0].dtype == \
            torch.float32
        assert (x @ x).dtype == torch.float16  # a lower-precision op stays so


def test_autocast_promotes_what_cuda_s_lists_promote():
    """The promote lists differ: CPU autocast casts a concatenation's narrower inputs to
    the widest dtype first (a copy each), which CUDA autocast leaves to the kernel (the
    real fp16 UNet step on an H100 makes no such copy for its skip connections); CUDA
    autocast casts addcmul's, index_put's, scatter_add's ... inputs to the widest, which
    CPU autocast leaves to the kernel."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from vramkit.plan.estimator import _emulate

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.called.append(func.__name__)
            return func(*args, **(kwargs or {}))

    wide, narrow = torch.zeros(2, 8, 4, 4), torch.zeros(2, 8, 4, 4).half()
    double = wide.double()
    calls = {"cat": lambda: torch.cat([wide, narrow], 1),
             "stack": lambda: torch.stack([wide, narrow]),
             "addcmul": lambda: torch.addcmul(wide, narrow, narrow),
             "scatter_add": lambda: wide.flatten().scatter_add(
                 0, torch.zeros(4, dtype=torch.long), narrow.flatten()[:4]),
             # fp64 is no autocast dtype: not promoted to, nor cast (the kernel promotes).
             "addcmul fp64": lambda: torch.addcmul(double, narrow, narrow)}
    copies = {}
    with _emulate.emulated_cuda():
        for name, call in calls.items():
            with torch.autocast("cuda", dtype=torch.float16), Ops() as ops:
                ops.called = []
                assert call().dtype == (torch.float64 if "fp64" in name else torch.float32)
            copies[name] = ops.called.count("_to_copy.default")
    assert copies == {"cat": 0, "stack": 0, "addcmul": 2, "scatter_add": 1, "addcmul fp64": 0}


def test_attention_over_heads_permuted_out_of_channels_runs_the_composite():
    """Every fused attention kernel needs the inputs' last dimension contiguous; a UNet's
    attention permutes its heads out of a convolution's channels, whose last dimension
    has the pixels' stride, and CUDA runs the composite attention for it (on an H100 the
    estimate saw its softmax, batched products and scaling). The stand-in took the fused
    kernel: no scores at all."""
    batch, heads, pixels, width = 2, 4, 256, 32

    def build():
        return (torch.randn(batch, 3 * heads * width, pixels, device="cuda",
                            requires_grad=True),)

    def step(qkv):
        q, k, v = qkv.reshape(batch, 3, heads, width, pixels).permute(1, 0, 2, 4, 3)
        assert q.stride(-1) != 1
        F.scaled_dot_product_attention(q, k, v).float().sum().backward()

    def contiguous_step(qkv):
        q, k, v = qkv.reshape(batch, 3, heads, width, pixels).permute(1, 0, 2, 4, 3)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        F.scaled_dot_product_attention(q, k, v).float().sum().backward()

    strided = vramkit.estimate(step, build=build, steps=1, model_workspaces=False)
    fused = vramkit.estimate(contiguous_step, build=build, steps=1, model_workspaces=False)
    scores = batch * heads * pixels * pixels * 4
    assert strided.peak_allocated >= fused.peak_allocated + scores


def test_attention_with_a_mask_not_contiguous_under_autocast_computes_in_fp32():
    """The composite attention CUDA runs for a mask whose last dimension is not contiguous
    converts 16-bit query, keys and values to fp32 and computes there, outside autocast:
    under bf16 autocast it keeps an fp32 softmax and fp32 dropped weights for backward,
    as in fp32, not bf16 ones."""
    def step(net, opt, x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = net(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    permuted = vramkit.estimate(step, build=_attention_build(False, permuted=True),
                                model_workspaces=False)
    # At the backward of the product with the values, a score each: the softmax and the
    # dropped weights it keeps (fp32), dropout's mask (one byte) and the gradient of the
    # dropped weights (fp32), all at once. Computed in bf16, each but the mask were 2 bytes,
    # and the step's peak below this.
    assert permuted.peak_allocated >= _SCORES * (4 + 4 + 1 + 4)


class _MathAttention(torch.nn.Module):
    """The same attention as _LearnedBiasAttention(permuted=True) without dropout, written
    as CUDA runs it for that mask: the attention's autocast casts query, keys, values and
    mask to the autocast dtype, then PyTorch's composite runs with autocast off. Called on
    the CPU stand-in, the composite's C++ makes and frees what it does on CUDA."""

    def __init__(self):
        super().__init__()
        self.inner = _LearnedBiasAttention(_HEADS, _ROWS, _WIDTH, False, permuted=True)

    def forward(self, x):
        q = self.inner.proj(x)
        mask = self.inner.bias.detach().permute(2, 0, 1).unsqueeze(0)
        if torch.is_autocast_enabled("cuda"):
            dtype = torch.get_autocast_dtype("cuda")
            q, mask = q.to(dtype), mask.to(dtype)
        with torch.autocast("cuda", enabled=False):
            return torch.ops.aten._scaled_dot_product_attention_math(q, q, q, mask)[0]


@pytest.mark.parametrize("autocast", [False, True])
def test_the_composite_attention_holds_what_pytorch_s_composite_holds(autocast):
    """The stand-in's composite attention makes and gives up its intermediates where
    PyTorch's does (the scores before the mask and before the softmax freed as the next is
    made, the mask added out of place, the weights copied to the inputs' dtype beside the
    output): the step's peaks equal those of the step calling PyTorch's composite itself."""
    def step(net, opt, x):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = net(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def build(module):
        def make():
            net = module().to("cuda")
            return net, torch.optim.SGD(net.parameters(), lr=0.1), \
                torch.randn(_BATCH, _HEADS, _ROWS, _WIDTH, device="cuda")
        return make

    class _NoDropout(_LearnedBiasAttention):
        def __init__(self):
            super().__init__(_HEADS, _ROWS, _WIDTH, False, permuted=True, dropout_p=0.0)

    stand_in = vramkit.estimate(step, build=build(_NoDropout), model_workspaces=False)
    composite = vramkit.estimate(step, build=build(_MathAttention), model_workspaces=False)
    assert stand_in.peak_allocated == composite.peak_allocated
    assert stand_in.peak_reserved == composite.peak_reserved


class _CausalAttention(torch.nn.Module):
    """Causal attention of 4 query heads over 256 positions, grouped over 2 key and value
    heads, by FlexAttention with a block mask ("flex"), by scaled_dot_product_attention
    ("sdpa"), by PyTorch's composite attention called itself ("math"), or by
    scaled_dot_product_attention over keys and values repeated for every query head
    ("repeated"; "repeated, math" by the composite called itself; "repeated, math only"
    and "repeated, flash only" under ``sdpa_kernel`` leaving that one kernel enabled)."""

    def __init__(self, kind: str):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64 + 2 * 32)
        self.kind = kind

    def forward(self, x):
        batch, rows, _ = x.shape
        q, kv = self.proj(x).split([64, 64], dim=-1)
        q = q.view(batch, rows, 4, 16).transpose(1, 2)
        k, v = kv.view(batch, rows, 2, 2, 16).permute(2, 0, 3, 1, 4)
        if self.kind in ("sdpa", "sdpa of fp32"):
            if self.kind == "sdpa of fp32":  # as rotary embeddings computed in fp32 leave them
                q, k, v = q.float(), k.float(), v.float()
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        if self.kind == "math":
            return torch.ops.aten._scaled_dot_product_attention_math(
                q, k, v, is_causal=True, enable_gqa=True)[0]
        if self.kind.startswith("repeated"):
            k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
            if self.kind == "repeated":
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            if self.kind == "repeated, math":
                return torch.ops.aten._scaled_dot_product_attention_math(
                    q, k, v, is_causal=True)[0]
            from torch.nn.attention import SDPBackend, sdpa_kernel
            backend = {"repeated, math only": SDPBackend.MATH,
                       "repeated, flash only": SDPBackend.FLASH_ATTENTION}[self.kind]
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, rows, rows,
                                 device=x.device)
        return flex_attention(q, k, v, block_mask=mask, enable_gqa=True)


def _causal_estimate(kind: str, batch: int = 2, rows: int = 256, autocast: bool = False):
    def build():
        net = _CausalAttention(kind).to("cuda")
        return net, torch.optim.SGD(net.parameters(), lr=0.1), \
            torch.randn(batch, rows, 64, device="cuda")

    def step(net, opt, x):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            _plain_step(net, opt, x)
    return vramkit.estimate(step, build=build, model_workspaces=False)


def test_grouped_queries_in_fp32_run_the_composite_attention():
    """fp32's fused kernel (the memory-efficient one) takes no grouped queries, so CUDA
    runs its composite attention for them, as for transformers' decoders in fp32 with no
    padding mask: the scaled_dot_product_attention step holds what the step calling
    PyTorch's composite itself holds (the causal mask, the keys and values repeated, the
    scores and their softmax). The stand-in took the fused kernel: far less."""
    sdpa, composite = _causal_estimate("sdpa"), _causal_estimate("math")
    assert sdpa.peak_allocated == composite.peak_allocated
    assert sdpa.peak_reserved == composite.peak_reserved
    # Under bf16 autocast the inputs are cast before the kernel is chosen: fp32 inputs
    # take the fused kernel as bf16 ones do, nowhere near the composite's scores.
    cast, fused = _causal_estimate("sdpa of fp32", autocast=True), \
        _causal_estimate("sdpa", autocast=True)
    scores = 2 * 4 * 256 * 256 * 4
    assert abs(cast.peak_allocated - fused.peak_allocated) < scores // 4
    assert cast.peak_allocated + scores < _causal_estimate("math", autocast=True).peak_allocated


def test_flex_attention_is_estimated_as_its_fused_kernel():
    """FlexAttention is a higher-order operator, which the recorder takes whole: the step
    (with grouped-query attention, as transformers' Llama calls it) is estimated (it was
    refused, on the stand-in by FlexAttention's own CPU check and everywhere by the
    recorder), holding what a fused kernel keeps, like scaled_dot_product_attention's
    fused kernel over the keys and values repeated for each query head, and nowhere near
    the dense scores, which a note names."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    batch, heads, rows = 2, 4, 256
    flex, fused = _causal_estimate("flex"), _causal_estimate("repeated")
    scores = batch * heads * rows * rows * 4
    # The difference is the repeated keys and values (and their gradients), row
    # statistics and the block mask's small index tensors, where the dense scores would
    # be 2 MiB.
    assert abs(flex.peak_allocated - fused.peak_allocated) < scores // 4
    assert flex.flops == fused.flops  # dense attention's, per query head (PyTorch has none)
    note = next(n for n in flex.notes if n.startswith("FlexAttention"))
    assert f"up to {scores / (1 << 20):,.1f} MiB" in note
    assert not any(n.startswith("FlexAttention") for n in fused.notes)


def test_attention_kernels_the_program_turned_off_are_not_taken():
    """``sdpa_kernel`` (and ``torch.backends.cuda.enable_*_sdp``) choose which kernels
    CUDA may take. With the composite alone enabled the step holds what the step calling
    the composite itself holds, the scores among it; with flash attention alone, fp32
    inputs have no kernel on CUDA and PyTorch raises, as the estimate then does. The
    stand-in took its fused kernel whatever the program asked."""
    math_only = _causal_estimate("repeated, math only")
    assert math_only.peak_allocated == _causal_estimate("repeated, math").peak_allocated
    scores = 2 * 4 * 256 * 256 * 4
    assert math_only.peak_allocated > _causal_estimate("repeated").peak_allocated + scores
    with pytest.raises(UntraceableStep, match="No available kernel"):
        _causal_estimate("repeated, flash only")


def _allocated_sizes(path) -> list[int]:
    """The sizes of a trace's allocations, in order."""
    from vramkit.estimator.torch_caching import read_trace
    return [event[2] for event in read_trace(str(path)) if event[0] == "a"]


def test_dropout_makes_its_mask_before_its_values(tmp_path):
    """CUDA's dropout kernel makes the one-byte mask first, then the dropped values (as the
    card's recording of DistilBERT's step shows): the trace has them in that order."""
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.1))

    def step(net, x):
        net(x).sum().backward()  # the sum's 4 bytes come after dropout's two blocks

    path = tmp_path / "dropout.trace.gz"
    vramkit.estimate(step, net, torch.randn(32, 64), trace_path=str(path), steps=1)
    sizes = _allocated_sizes(path)
    mask, values = 32 * 64, 32 * 64 * 4
    made = sizes.index(mask)
    # The mask, then the dropped values, then the sum (its 4 bytes in a 512-byte block).
    assert sizes[made:made + 3] == [mask, values, 512], sizes


def _multi_head_trace(tmp_path, need_weights: bool, dropout: float = 0.1) -> list[int]:
    """The sizes the stand-in allocates over a step of nn.MultiheadAttention (batch 2,
    8 heads, 192 positions of width 64): its attention and dropout are called inside
    F.multi_head_attention_forward, a Python function of torch's that function modes see
    only from outside."""
    attention = torch.nn.MultiheadAttention(64, 8, dropout=dropout, batch_first=True)

    def step(attention, x):
        out, _ = attention(x, x, x, need_weights=need_weights)
        out.sum().backward()

    path = tmp_path / f"mha-{need_weights}-{dropout}.trace.gz"
    vramkit.estimate(step, attention, torch.randn(2, 192, 64), trace_path=str(path), steps=1)
    return _allocated_sizes(path)


_MHA_SCORES = 2 * 8 * 192 * 192  # batch x heads x positions x positions


def test_multi_head_attention_takes_the_fused_kernel(tmp_path):
    """nn.MultiheadAttention without weights (how nn.TransformerEncoderLayer calls it) runs
    CUDA's fused attention: no fp32 block of the scores' size. The stand-in ran the CPU's
    composite there, which keeps the scores, their softmax and dropout's noise per layer
    (a six-layer encoder's step at 2.7 times the real one)."""
    assert _MHA_SCORES * 4 not in _multi_head_trace(tmp_path, need_weights=False)


def test_dropout_inside_multi_head_attention_keeps_a_one_byte_mask(tmp_path):
    """With weights, the attention's dropout is called inside multi_head_attention_forward:
    it keeps CUDA's one-byte mask, never the CPU's noise of the weights' dtype."""
    dropped = _multi_head_trace(tmp_path, need_weights=True)
    kept = _multi_head_trace(tmp_path, need_weights=True, dropout=0.0)
    assert dropped.count(_MHA_SCORES) == 1 and _MHA_SCORES not in kept
    # The dropped weights and, in backward, their gradient: nothing else of fp32.
    assert dropped.count(_MHA_SCORES * 4) == kept.count(_MHA_SCORES * 4) + 2


@pytest.mark.parametrize("layer", [torch.nn.LSTM, torch.nn.GRU])
def test_a_recurrent_layer_is_refused_with_what_to_do(layer):
    """nn.LSTM and nn.GRU run through cuDNN on CUDA, whose reserve for the backward the
    estimate does not model: no figures (the stand-in gave an LSTM step less than half of
    the real one), and the message says why and what to do instead."""
    net = layer(32, 64, batch_first=True)

    def step(net, x):
        net(x)[0].sum().backward()

    with pytest.raises(UntraceableStep, match="cuDNN.*estimate the step without them"):
        vramkit.estimate(step, net, torch.randn(4, 16, 32))


def test_a_recurrent_layer_s_shape_mistake_is_the_step_s_own_error():
    """An input of the wrong width fails in nn.LSTM's own checks, before any kernel: the
    refusal quotes that error, not cuDNN's reserve."""
    net = torch.nn.LSTM(8, 16)

    def step(net, x):
        net(x[..., :4])[0].sum().backward()

    with pytest.raises(UntraceableStep, match="must be equal to input_size") as refused:
        vramkit.estimate(step, net, torch.randn(5, 2, 8))
    assert "cuDNN" not in str(refused.value)

"""Scratch that ATen's CUDA kernels allocate inside themselves, derived from the call alone.

A machine without the GPU cannot measure an op's scratch (scratch.py measures it where
there is one). For the ops here the blocks follow from ATen's own host code: what it
allocates, in which dtype and order, from the shapes, strides and dtypes of the call.
Each rule gives a transient as _transients.py writes it (OUTPUT where the op makes an
output; 0 where the kernel makes no block for the call), or None where the call is
outside what the rule follows (a layout that needs a copy first, an output mask it does
not know): such calls count as not modelled. Each rule was checked against the blocks
the card made (bench/op_scratch_grid.py and tests/gpu/test_estimate_on_device.py).
"""

from __future__ import annotations

import math

from . import _cuda_reduce
from ._transients import OUTPUT
from .scratch import OpCall, TensorSpec


def _copy_bytes(t: TensorSpec) -> int:
    """What ``t.contiguous()`` (or ``expect_contiguous()``) allocates: nothing for a
    contiguous tensor, else a contiguous copy of its elements in its dtype."""
    return 0 if t.is_contiguous() else math.prod(t.shape) * t.dtype.itemsize


class _Steps:
    """A transient written block by block (_transients.py's sequence): each allocation
    gets a handle that its free names, so a rule needs no counting of positions."""

    def __init__(self):
        self.steps: list = []
        self._made = 0

    def allocate(self, nbytes: int):
        """A block of ``nbytes`` (0: none, and its handle frees nothing)."""
        if not nbytes:
            return None
        self._made += 1
        self.steps.append(nbytes)
        return self._made

    def output(self) -> None:
        self.steps.append(OUTPUT)

    def free(self, *handles) -> None:
        self.steps.extend(-h for h in handles if h is not None)


def _softmax_backward_product(call: OpCall, multiprocessors: int):
    """Softmax's CUDA backward (ATen/native/cuda/SoftMax.cu) multiplies the output's
    gradient by the output into a new tensor before its kernel runs, and frees it on
    return: one block of the gradient's elements in the product's dtype, made after the
    op's output. (Log-softmax's backward has no such product.)"""
    import torch
    grad, output = call.bound.get("grad_output"), call.bound.get("output")
    if not isinstance(grad, TensorSpec) or not isinstance(output, TensorSpec):
        return None
    elements = math.prod(grad.shape)
    if not elements:
        return 0
    itemsize = torch.promote_types(grad.dtype, output.dtype).itemsize
    return (OUTPUT, elements * itemsize, -1)


def _safe_softmax_masks(call: OpCall, multiprocessors: int):
    """The composite attention's softmax (ATen/native/SoftMax.cpp) makes its output, then
    which scores are -inf (one bool a score), which rows are so whole (one bool a row) and
    a zero of the output's dtype to fill them with, and frees those three on return."""
    import torch
    scores, dim, dtype = (call.bound.get(name) for name in ("self", "dim", "dtype"))
    if not isinstance(scores, TensorSpec) or not isinstance(dim, int) or \
            not -len(scores.shape) <= dim < len(scores.shape):
        return None
    elements = math.prod(scores.shape)
    if not elements:
        return 0
    rows = elements // scores.shape[dim]
    zero = (dtype if isinstance(dtype, torch.dtype) else scores.dtype).itemsize
    return (OUTPUT, elements, rows, zero, -3, -2, -1)


def _reduction_staging(call: OpCall, multiprocessors: int):
    """A sum's or a mean's staging buffer and semaphores, where several blocks of its
    launch share each output (_cuda_reduce.py), made after its output and freed on
    return; of floating point inputs summed in fp32 or fp64. Half-precision sums load
    one input at a time (ReduceSumProdKernel.cu), the others four."""
    return _staging_of_reduction(call, multiprocessors, input_vector_of_half=1)


def _vector_norm_staging(call: OpCall, multiprocessors: int):
    """linalg_vector_norm's staging buffer and semaphores: every order's kernel
    (ReduceNormKernel.cu) is a gpu_reduce_kernel of the default vector width, four
    inputs a load whatever the dtype, accumulating in fp32 (fp64 for fp64)."""
    return _staging_of_reduction(call, multiprocessors, input_vector_of_half=4)


def _staging_of_reduction(call: OpCall, multiprocessors: int, input_vector_of_half: int):
    import torch
    tensor, dims, dtype = (call.bound.get(name) for name in ("self", "dim", "dtype"))
    if not isinstance(tensor, TensorSpec):
        return None
    accumulator = {torch.float16: 4, torch.bfloat16: 4, torch.float32: 4,
                   torch.float64: 8}.get(tensor.dtype)
    if accumulator is None or dtype not in (None, tensor.dtype, torch.float32):
        return None
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        dims = range(len(tensor.shape))
    elif isinstance(dims, int):
        dims = [dims]
    if not all(isinstance(d, int) and -len(tensor.shape) <= d < len(tensor.shape)
               for d in dims):
        return None
    itemsize = tensor.dtype.itemsize
    steps = _Steps()
    steps.output()
    # A view past 32-bit offsets is reduced in several launches, each staging its own.
    for shape, offset in _cuda_reduce.launches(tensor.shape, tensor.stride, tensor.offset,
                                               itemsize):
        blocks = _cuda_reduce.staging_blocks(shape, tensor.stride, offset, dims, itemsize,
                                             accumulator,
                                             input_vector_of_half if itemsize == 2 else 4,
                                             multiprocessors)
        if blocks is None:
            return None
        staging, semaphores = blocks
        if staging:
            made = steps.allocate(staging), steps.allocate(semaphores)
            steps.free(*reversed(made))
    return tuple(steps.steps) if len(steps.steps) > 1 else 0


def _group_norm_coefficients(call: OpCall, multiprocessors: int):
    """Group norm's CUDA kernels (ATen/native/cuda/group_norm_kernel.cu) keep per-sample,
    per-channel coefficients in the accumulation type, after the op's three outputs:
    forward two of batch x channels; backward two of those, two of batch x groups and one
    more of batch x channels, freed on return (in the order bench/op_scratch_grid.py
    measured). A backward that leaves out an output has another sequence: not derived."""
    import torch
    x = call.bound.get("input")
    backward = "backward" in call.op
    numbers = [call.bound.get(name) for name in ("N", "C", "HxW", "group")]
    if not isinstance(x, TensorSpec) or not all(isinstance(n, int) for n in numbers):
        return None
    batch, channels, _, groups = numbers
    accumulator = 8 if x.dtype == torch.float64 else 4
    per_channel, per_group = batch * channels * accumulator, batch * groups * accumulator
    if not per_channel:
        return 0
    if not backward:
        return (OUTPUT, OUTPUT, OUTPUT, per_channel, per_channel, -2, -1)
    mask = call.bound.get("output_mask")
    if list(mask or ()) != [True, True, True]:
        return None
    return (OUTPUT, OUTPUT, OUTPUT, per_channel, per_channel, per_group, per_group,
            per_channel, -4, -3, -5, -2, -1)


def _layer_norm_forward(call: OpCall, multiprocessors: int):
    """Layer norm's CUDA forward (ATen/native/cuda/layer_norm_kernel.cu) takes its input
    with ``expect_contiguous()``, so a strided input (a channels-last view that a
    ConvNeXt block permutes, say) is copied before the three outputs are made and freed
    on return; past that copy the kernel allocates nothing."""
    tensors = [call.bound.get(name) for name in ("input", "weight", "bias")]
    if not isinstance(tensors[0], TensorSpec):
        return None
    if any(isinstance(t, TensorSpec) and not t.is_contiguous() for t in tensors[1:]):
        return None  # a strided weight: copied too, in an order not followed here
    copy = _copy_bytes(tensors[0])
    if not copy:
        return 0
    steps = _Steps()
    made = steps.allocate(copy)
    for _ in range(3):
        steps.output()
    steps.free(made)
    return tuple(steps.steps)


def _layer_norm_partials(call: OpCall, multiprocessors: int):
    """Layer norm's CUDA backward (ATen/native/cuda/layer_norm_kernel.cu). A strided
    input is copied first (``expect_contiguous()``) and freed on return; the gradients
    are made; a strided output gradient is copied (``dY.contiguous()``) for the kernels
    and freed when they are done. For many rows of few columns (more than 64 Ki rows, and
    fewer column blocks of 32 than half the multiprocessors) the weight's and the bias's
    gradients are summed in two passes: partial sums of blocks of rows into two buffers
    of the input's dtype, then a column sum of each (with its own staging,
    _cuda_reduce.py), whose result replaces the gradient made before. Derived where the
    weight and bias both want gradients, or neither."""
    import torch
    grad, x = call.bound.get("grad_out"), call.bound.get("input")
    normalized = call.bound.get("normalized_shape")
    mask = list(call.bound.get("output_mask") or ())
    if not isinstance(grad, TensorSpec) or not isinstance(x, TensorSpec) or \
            not isinstance(normalized, (list, tuple)) or len(mask) != 3:
        return None
    if mask[1] != mask[2] or not 0 < len(normalized) <= len(x.shape):
        return None
    split = len(x.shape) - len(normalized)
    rows, columns = math.prod(x.shape[:split]), math.prod(x.shape[split:])
    two_pass = mask[1] and rows > 64 * 1024 and columns // 32 < multiprocessors // 2
    steps = _Steps()
    x_copy = steps.allocate(_copy_bytes(x))
    if mask[0]:
        steps.output()
    itemsize = x.dtype.itemsize
    if not two_pass:
        for wanted in mask[1:]:
            if wanted:
                steps.output()
        grad_copy = steps.allocate(_copy_bytes(grad))
        if x_copy is None and grad_copy is None:
            return 0  # the outputs alone: no block of its own
        steps.free(grad_copy, x_copy)
        return tuple(steps.steps)
    accumulator = 8 if x.dtype == torch.float64 else 4
    blocks_x = _cuda_reduce.div_up(columns, 32)
    blocks_y = min(32 * 1024 // blocks_x, _cuda_reduce.div_up(rows, 32))
    staging = _cuda_reduce.staging_blocks((blocks_y, columns), (columns, 1), 0, [0],
                                          itemsize, accumulator, 1, multiprocessors)
    if staging is None:
        return None
    made = [steps.allocate(columns * itemsize) for _ in range(2)]
    grad_copy = steps.allocate(_copy_bytes(grad))
    partials = [steps.allocate(blocks_y * columns * itemsize) for _ in range(2)]
    for replaced in made:
        steps.output()  # the column sum's result, the gradient returned
        sums = [steps.allocate(b) for b in staging if b]
        steps.free(*reversed(sums))
        steps.free(replaced)
    steps.free(*reversed(partials))
    steps.free(grad_copy, x_copy)
    return tuple(steps.steps)


# The ops whose scratch on a CUDA device is derived from the call alone, by what derives it.
DERIVED_OPS = {"_softmax_backward_data.default": _softmax_backward_product,
               "_safe_softmax.default": _safe_softmax_masks,
               "sum.dim_IntList": _reduction_staging, "sum.default": _reduction_staging,
               "mean.dim": _reduction_staging, "mean.default": _reduction_staging,
               "linalg_vector_norm.default": _vector_norm_staging,
               "native_layer_norm.default": _layer_norm_forward,
               "native_layer_norm_backward.default": _layer_norm_partials,
               "native_group_norm.default": _group_norm_coefficients,
               "native_group_norm_backward.default": _group_norm_coefficients}


def derived_size(call: OpCall, multiprocessors: int | None = None):
    """The call's transient on a CUDA device of ``multiprocessors`` (default: the H100's
    and H200's) where DERIVED_OPS knows it (0: the kernel makes no block for it), else
    None: not derived, left to a measurement."""
    derive = DERIVED_OPS.get(call.op)
    if derive is None:
        return None
    return derive(call, multiprocessors or _cuda_reduce.MULTIPROCESSORS)

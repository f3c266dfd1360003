"""The blocks a CUDA reduction (sum, mean, vector norm) allocates inside itself, from its
launch.

ATen's reductions (ATen/native/cuda/Reduce.cuh) choose a launch configuration from the
shapes and strides alone: which dimension the threads of a block run along, how many
blocks share one output. When several blocks share an output they meet in global memory:
a staging buffer of partial results and one semaphore per column of blocks, allocated
through the caching allocator after the op's output and freed when it returns. A column
sum of a large activation (a bias's gradient) stages one partial result per block and
output, far more than the output it makes. A machine without the GPU cannot measure it;
this module follows the configuration step by step, as the kernel's host code does, so
that _derived_scratch.py can derive the blocks.

What it follows: the iterator's order of dimensions (reduced ones first, each group
fastest first) and their coalescing, the choice between reducing along the fastest
dimension and vectorizing along the outputs, the block's width and height, the split of
the input across warps and across blocks, and the sizes of the staging buffer and the
semaphores. The number of multiprocessors is the H100's and H200's (the cards the
estimator's tables come from). A view too large for 32-bit offsets is reduced in several
launches, each with its own blocks, as TensorIterator's with_32bit_indexing() splits it
(:func:`launches`). The caller takes only sums, means and vector norms of floating point.
"""

from __future__ import annotations

import math

# The cards modelled: H100 and H200 SXM, 132 multiprocessors of 2048 threads.
MULTIPROCESSORS = 132
THREADS_PER_MULTIPROCESSOR = 2048

_MAX_THREADS = 512          # ReduceConfig's threads per block
_WARP = 32
_MIN_VALUES_PER_THREAD = 16
_MAX_VALUES_PER_THREAD = 256
_SEMAPHORE_BYTES = 4        # one int per column of blocks


def div_up(a: int, b: int) -> int:
    return -(-a // b)


def _last_pow2(n: int) -> int:
    """The largest power of two not above n (1 for n < 1)."""
    return 1 << (n.bit_length() - 1) if n >= 1 else 1


def _iterator_dims(shape, strides, reduced):
    """The iterator's dimensions as (size, input stride, reduced) tuples, innermost first:
    size-1 dimensions dropped, reduced ones moved to the front, each group ordered by the
    stride that decides it (the input's for reduced dimensions, the new contiguous
    output's for kept ones), then neighbours that step through memory as one merged."""
    output_stride, step = {}, 1
    for d in reversed(range(len(shape))):
        if d not in reduced:
            output_stride[d] = step
            step *= shape[d]
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    dims.sort(key=lambda d: (d not in reduced,
                             strides[d] if d in reduced else output_stride[d], -d))
    merged = []
    for d in dims:
        size, stride, is_reduced = shape[d], strides[d], d in reduced
        if merged:
            last_size, last_stride, last_reduced, last_out = merged[-1]
            out = 0 if is_reduced else output_stride[d]
            if last_reduced == is_reduced and stride == last_stride * last_size and \
                    out == last_out * last_size:
                merged[-1] = (last_size * size, last_stride, is_reduced, last_out)
                continue
        merged.append((size, stride, is_reduced, 0 if is_reduced else output_stride[d]))
    return [(size, stride, is_reduced) for size, stride, is_reduced, _ in merged]


def _output_vector_size(dims, num_reduce_dims: int, offset: int) -> int:
    """How many outputs a thread loads at once when it runs along the outputs: 4, halved
    until the view's start, the first kept dimension's size and every other dimension's
    stride divide by it."""
    vector = 4
    values = [offset, dims[num_reduce_dims][0]]
    values += [stride for i, (_, stride, _) in enumerate(dims) if i != num_reduce_dims]
    for value in values:
        while value % vector:
            vector //= 2
    return vector


_INT32_MAX = (1 << 31) - 1


def _fits_32bit(shape, strides, itemsize: int) -> bool:
    """TensorIterator's can_use_32bit_indexing() for the input: its elements, and the
    farthest byte it reaches from its start, within a signed 32-bit integer."""
    reach = 1 + sum((size - 1) * abs(stride) * itemsize for size, stride in zip(shape, strides))
    return math.prod(shape) <= _INT32_MAX and reach <= _INT32_MAX


def launches(shape, strides, offset: int, itemsize: int) -> list:
    """The views (shape, offset) a reduction launches one kernel each for, in order: the
    whole view where 32-bit offsets address it; else, as with_32bit_indexing() does, the
    dimension that spans the most bytes halved (the first half, then the rest, each
    halved again until it fits). The input's span decides the dimension: it spans more
    bytes than the output of the reductions modelled. Dimensions are the view's own,
    not the iterator's coalesced ones: an even split of an outer dimension cuts where a
    split of the merged one does."""
    shape = list(shape)
    if _fits_32bit(shape, strides, itemsize):
        return [(tuple(shape), offset)]
    # A view that does not fit has a dimension of more than one element to halve.
    dim = max((d for d in range(len(shape)) if shape[d] > 1),
              key=lambda d: (shape[d] - 1) * abs(strides[d]))
    first = shape[dim] // 2
    head = shape[:dim] + [first] + shape[dim + 1:]
    tail = shape[:dim] + [shape[dim] - first] + shape[dim + 1:]
    return (launches(head, strides, offset, itemsize)
            + launches(tail, strides, offset + first * strides[dim], itemsize))


def staging_blocks(shape, strides, offset: int, reduced_dims, itemsize: int,
                   accumulator_bytes: int, input_vector: int,
                   multiprocessors: int = MULTIPROCESSORS):
    """(staging bytes, semaphore bytes) of one reduction of a tensor of ``shape`` and
    ``strides`` (in elements; ``offset``: where the view starts, in elements, modulo the
    alignment) over ``reduced_dims``; ``accumulator_bytes``: the size of the type it sums
    in; ``input_vector``: how many inputs a thread loads at once along a reduced
    contiguous dimension, 1 where the kernel does not (16-bit sums and means load one at
    a time there: their vector is wider than their unrolling); ``multiprocessors``: the
    card's (the grid is sized to fill it). (0, 0) when the blocks of one output never
    meet in global memory; None where the model does not apply (a view past 32-bit
    offsets, which launches() divides; a broadcast dimension)."""
    elements = math.prod(shape)
    reduced = {d % len(shape) for d in reduced_dims} if shape else set()
    if elements == 0:
        return 0, 0
    if any(size > 1 and stride <= 0 for size, stride in zip(shape, strides)):
        return None  # a broadcast (or reversed) input: the iterator orders it otherwise
    if not _fits_32bit(shape, strides, itemsize):
        return None  # several launches: launches() divides the view first
    dims = _iterator_dims(shape, strides, reduced)
    num_reduce_dims = sum(1 for _, _, r in dims if r)
    outputs = math.prod(size for size, _, r in dims if not r)
    inputs_per_output = elements // outputs
    if inputs_per_output <= 1 or not dims:
        return 0, 0
    along_fastest = num_reduce_dims == len(dims) or dims[0][1] < dims[num_reduce_dims][1]
    if along_fastest:
        dim0, dim1, fastest_stride = inputs_per_output, outputs, dims[0][1]
    else:
        dim0, dim1, fastest_stride = outputs, inputs_per_output, dims[num_reduce_dims][1]
    output_vector = 1
    if fastest_stride == 1:
        if along_fastest and dim0 > 128 and num_reduce_dims == 1 and input_vector > 1:
            dim0 //= input_vector
        elif not along_fastest:
            output_vector = _output_vector_size(dims, num_reduce_dims, offset)
            dim0 //= output_vector

    most = _MAX_THREADS // output_vector
    dim0_pow2 = _last_pow2(dim0) if dim0 < most else most
    dim1_pow2 = _last_pow2(dim1) if dim1 < most else most
    width = min(dim0_pow2, _WARP)
    height = min(dim1_pow2, most // width)
    width = min(dim0_pow2, most // height)
    threads = width * height

    step_input, step_output = 1, 1
    if along_fastest:
        step_input *= width         # threads of a warp share an output
    else:
        step_output *= width        # each thread of a warp has its outputs
    split_across_warps = div_up(inputs_per_output, step_input) >= min(
        height * 16, _MAX_VALUES_PER_THREAD)
    if split_across_warps:
        step_input *= height
    else:
        step_output *= height
    values_per_thread = div_up(inputs_per_output, step_input)
    target_grid = multiprocessors * (THREADS_PER_MULTIPROCESSOR // threads)
    grid = div_up(outputs // output_vector, step_output)
    if not (split_across_warps and values_per_thread >= _MAX_VALUES_PER_THREAD
            and grid <= target_grid):
        return 0, 0
    blocks_per_output = max(min(div_up(target_grid, grid),
                                div_up(values_per_thread, _MIN_VALUES_PER_THREAD)),
                            div_up(values_per_thread, _MAX_VALUES_PER_THREAD))
    if blocks_per_output <= 1:
        return 0, 0
    staging = accumulator_bytes * outputs * blocks_per_output
    if not along_fastest:
        staging *= width * output_vector
    return staging, _SEMAPHORE_BYTES * grid

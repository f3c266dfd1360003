"""bench/op_scratch_grid.py - the scratch blocks of normalization and reduction ops over a
grid of shapes, measured on the card (one JSON line per op and shape).

Each op runs on real tensors of the shape through vramkit.estimator.scratch's own
measuring path (the blocks it allocates and frees inside itself, read from PyTorch's
memory history), so the rows are what the estimator would measure on this card. Each row
also carries what a machine without a GPU derives for the call (scratch.derived_size, 0
where no rule applies), so that the rules are checked against the card in one run.

    python3 bench/op_scratch_grid.py OUT.jsonl [PART,...]   (on the GPU machine; parts:
                                                            layer_norms, group_norms,
                                                            reductions, embeddings;
                                                            default all)
"""

import itertools
import json
import sys

import torch
from vramkit.estimator import scratch as sc

ATEN = torch.ops.aten
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _listed(blocks):
    """A transient as JSON: bytes, a list of blocks, or None (the card had not the memory
    to measure it; the rule does not derive it)."""
    return blocks if blocks is None or isinstance(blocks, int) else list(blocks)


def measure(out, device, tag, op, args) -> None:
    try:
        call = sc.call_of(op, args, {})
        measured = sc.measure_op(call, device, blocks=True)
        derived = sc.derived_size(call)
        row = {"tag": tag, "key": call.key,
               "blocks": _listed(measured), "derived": _listed(derived)}
    except Exception as error:  # noqa: BLE001 - a row that says why, and the grid goes on
        row = {"tag": tag, "error": f"{type(error).__name__}: {str(error)[:200]}"}
    out.write(json.dumps(row) + "\n")
    out.flush()


def layer_norms(out, device) -> None:
    for rows, width, dtype in itertools.product((100, 128, 1000, 4096, 25216, 65536, 131072),
                                                (64, 256, 768, 1000, 1024, 4096), DTYPES):
        x = torch.randn(rows, width, device=device, dtype=dtype)
        w = torch.ones(width, device=device, dtype=dtype)
        b = torch.zeros(width, device=device, dtype=dtype)
        y, mean, rstd = ATEN.native_layer_norm(x, [width], w, b, 1e-5)
        if width in (768, 1000):
            measure(out, device, ("ln_fwd", rows, width, str(dtype)),
                    ATEN.native_layer_norm.default, (x, [width], w, b, 1e-5))
        measure(out, device, ("ln_bwd", rows, width, str(dtype)),
                ATEN.native_layer_norm_backward.default,
                (y, x, [width], mean, rstd, w, b, [True, True, True]))


def group_norms(out, device) -> None:
    for batch, channels, side, dtype in itertools.product((1, 8, 32), (64, 128, 256, 512),
                                                          (8, 32, 64), DTYPES):
        x = torch.randn(batch, channels, side, side, device=device, dtype=dtype)
        w = torch.ones(channels, device=device, dtype=dtype)
        b = torch.zeros(channels, device=device, dtype=dtype)
        hw = side * side
        y, mean, rstd = ATEN.native_group_norm(x, w, b, batch, channels, hw, 32, 1e-5)
        measure(out, device, ("gn_fwd", batch, channels, side, str(dtype)),
                ATEN.native_group_norm.default, (x, w, b, batch, channels, hw, 32, 1e-5))
        measure(out, device, ("gn_bwd", batch, channels, side, str(dtype)),
                ATEN.native_group_norm_backward.default,
                (y, x, mean, rstd, w, batch, channels, hw, 32, [True, True, True]))


def reductions(out, device) -> None:
    for rows, width, dtype in itertools.product((128, 4096, 16384, 65536, 262144),
                                                (64, 768, 1000, 4096), DTYPES):
        x = torch.randn(rows, width, device=device, dtype=dtype)
        measure(out, device, ("sum0", rows, width, str(dtype)), ATEN.sum.dim_IntList, (x, [0]))
        measure(out, device, ("sum1", rows, width, str(dtype)), ATEN.sum.dim_IntList, (x, [1]))
        measure(out, device, ("sumall", rows, width, str(dtype)), ATEN.sum.default, (x,))
        measure(out, device, ("mean0", rows, width, str(dtype)), ATEN.mean.dim, (x, [0]))
        norm = ATEN.linalg_vector_norm.default
        measure(out, device, ("norm0", rows, width, str(dtype)), norm, (x, 2, [0]))
        measure(out, device, ("norm1", rows, width, str(dtype)), norm, (x, 2, [1]))
        measure(out, device, ("normall", rows, width, str(dtype)), norm, (x,))
    # Bias gradients of a sequence model, and a convolution's per-channel sums and means.
    for shape, dims, dtype in itertools.product(
            ((16, 1024, 768), (8, 2048, 4096), (4, 197, 768)), ([0, 1],), DTYPES):
        x = torch.randn(shape, device=device, dtype=dtype)
        measure(out, device, ("sum_seq", *shape, str(dtype)), ATEN.sum.dim_IntList, (x, dims))
    for shape, dtype in itertools.product(((8, 64, 56, 56), (64, 256, 14, 14), (2, 128, 7, 7)),
                                          DTYPES):
        x = torch.randn(shape, device=device, dtype=dtype)
        measure(out, device, ("sum_nchw", *shape, str(dtype)), ATEN.sum.dim_IntList,
                (x, [0, 2, 3]))
        measure(out, device, ("mean_nchw", *shape, str(dtype)), ATEN.mean.dim,
                (x, [0, 2, 3], True))
        last = x.to(memory_format=torch.channels_last)
        measure(out, device, ("sum_nhwc", *shape, str(dtype)), ATEN.sum.dim_IntList,
                (last, [0, 2, 3]))


def embeddings(out, device) -> None:
    """Embedding backward past the 3,072 indices of its direct kernel: the indices sorted,
    the segments' offsets and partial sums (EmbeddingBackwardKernel.cu); and an
    EmbeddingBag's, which shares that kernel."""
    for count, rows, width, dtype, index in itertools.product(
            (3073, 8192, 16384, 81920, 131072), (1000, 50257, 1_000_000), (64, 128, 768),
            DTYPES, (torch.int64, torch.int32)):
        if index == torch.int32 and (dtype != torch.float32 or width != 128):
            continue
        grad = torch.randn(count, width, device=device, dtype=dtype)
        indices = torch.zeros(count, device=device, dtype=index)
        measure(out, device, ("emb_bwd", count, rows, width, str(dtype), str(index)),
                ATEN.embedding_dense_backward.default, (grad, indices, rows, -1, False))
    for bags, per_bag, rows, width in itertools.product((512, 4096), (1, 20), (50257, 1_000_000),
                                                        (64, 128)):
        weight = torch.randn(rows, width, device=device)
        indices = torch.zeros(bags * per_bag, device=device, dtype=torch.int64)
        offsets = torch.arange(0, bags * per_bag, per_bag, device=device)
        output, offset2bag, bag_size, maximum = ATEN._embedding_bag(weight, indices, offsets)
        measure(out, device, ("bag_bwd", bags, per_bag, rows, width),
                ATEN._embedding_bag_dense_backward.default,
                (torch.randn_like(output), indices, offset2bag, bag_size, maximum, rows,
                 False, 0, None, -1))


PARTS = {"layer_norms": layer_norms, "group_norms": group_norms, "reductions": reductions,
         "embeddings": embeddings}


def main() -> int:
    device = torch.device("cuda")
    wanted = sys.argv[2].split(",") if len(sys.argv) > 2 else list(PARTS)
    with open(sys.argv[1], "w") as out:
        for name in wanted:
            PARTS[name](out, device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Which attention kernel CUDA takes for a mask added to the scores, and what the step
holds, against vramkit's estimate: a learned (or detached) bias of 1 or 4 x 4 heads x
256 x 256, in fp32 and under bf16 autocast; and a bias of one batch kept as keys x heads
last and permuted into place (its last dimension not contiguous, as T5's relative
positions arrive in some versions of transformers), for which CUDA runs its composite
attention.

    python3 bench/attention_mask_probe.py     # on a GPU: the kernel, real and estimated
                                              # without one: the CPU stand-in's estimates

The estimates leave out the CUDA context and cuBLAS's workspaces (model_workspaces=False)
and the real peaks include them: compare a learned mask with a detached one, not a real
peak with an estimate.
"""

from __future__ import annotations

import os
import sys

import torch

import vramkit

# The module the estimator's tests hold to the same figures on the CPU stand-in.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "python"))
from test_estimate_cuda_kernels import (  # noqa: E402
    _BATCH as BATCH, _HEADS as HEADS, _LearnedBiasAttention, _ROWS as ROWS, _WIDTH as WIDTH)


def main() -> None:
    gpu = torch.cuda.is_available()
    for mask_batch, permuted in ((1, False), (BATCH, False), (1, True)):
        for learned in (True, False):
            for amp in (False, True):
                def build():
                    net = _LearnedBiasAttention(HEADS, ROWS, WIDTH, learned, permuted,
                                                mask_batch=mask_batch).to("cuda")
                    return net, torch.optim.SGD(net.parameters(), lr=0.1), \
                        torch.randn(BATCH, HEADS, ROWS, WIDTH, device="cuda")

                def step(net, opt, x, amp=amp):
                    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                        loss = net(x).float().pow(2).mean()
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)

                name = (f"mask batch {mask_batch}{' permuted' if permuted else ''} "
                        f"{'learned' if learned else 'detached'} "
                        f"{'bf16-amp' if amp else 'fp32'}")
                estimate = vramkit.estimate(step, build=build, model_workspaces=False)
                if not gpu:
                    print(f"{name}: stand-in estimate {estimate.peak_allocated:,}")
                    continue
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                net, opt, x = build()
                q = net.proj(x)
                mask = net.bias if learned else net.bias.detach()
                if permuted:
                    mask = mask.permute(2, 0, 1).unsqueeze(0)
                if amp:
                    q, mask = q.bfloat16(), mask.bfloat16()
                kernel = torch._fused_sdp_choice(q, q, q, mask, 0.1)
                del q, mask
                for _ in range(2):
                    step(net, opt, x)
                torch.cuda.synchronize()
                print(f"{name}: kernel {kernel}, real {torch.cuda.max_memory_allocated():,}, "
                      f"estimate {estimate.peak_allocated:,}")
                del net, opt, x


if __name__ == "__main__":
    main()

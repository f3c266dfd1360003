"""Makes vramkit PyTorch's CUDA allocator in every interpreter of bench/torch_suite.sh's
vramkit run (PYTHONPATH names this folder), before anything initializes CUDA, and fails
loudly rather than let a test run under PyTorch's own allocator by mistake."""

import os
import sys

if os.environ.get("VK_SUITE_ALLOC") == "vramkit":
    try:
        import vramkit.torch

        vramkit.torch.install(backend="backend")
    except Exception as exc:  # noqa: BLE001 - any failure must stop the run, visibly
        sys.stderr.write(f"torch_suite: vramkit.torch.install() failed: {exc}\n")
        raise SystemExit(3)

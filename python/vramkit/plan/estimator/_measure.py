"""Find the largest batch by running the real step on the GPU, from a predicted start.

Each try builds the arguments, runs the step twice (the second step is where the
optimizer's state is live), and on an out-of-memory error drops everything it made,
collects garbage and empties the cache before the next try, as accelerate's and
Lightning's finders do. Starting from the estimate's prediction, it usually takes two
tries: the prediction, which fits, and the next size, which does not.
"""

from __future__ import annotations

import gc


def _is_oom(error: BaseException) -> bool:
    import vramkit
    if isinstance(error, vramkit.OutOfMemoryError):
        return True
    try:
        import torch
    except ImportError:
        return False
    return isinstance(error, torch.OutOfMemoryError)


def _under_vramkit() -> bool:
    import sys
    hooks = sys.modules.get("vramkit.plug.torch")
    return bool(hooks and hooks.installed())


def _empty_caches() -> None:
    import torch
    gc.collect()
    if _under_vramkit():
        import vramkit
        vramkit.empty_cache(0)
    else:
        torch.cuda.empty_cache()


def _set_fraction(fraction: float) -> None:
    import torch
    if _under_vramkit():
        import vramkit
        vramkit.set_per_process_memory_fraction(fraction, 0)
    else:
        torch.cuda.set_per_process_memory_fraction(fraction)


def largest_batch(step_fn, make_batch, guess: int, cap, most: int) -> int:
    import torch
    from . import _largest, _size

    limit = _size(cap, "memory limit")
    if limit is not None:
        total = torch.cuda.get_device_properties(0).total_memory
        _set_fraction(min(1.0, limit / total))

    def runs(n: int) -> bool:
        args = None
        try:
            with torch.device("cuda"):
                args = make_batch(n)
            for _ in range(2):
                step_fn(*args)
            torch.cuda.synchronize()
            return True
        except Exception as error:  # noqa: BLE001 - only an OOM is an answer
            if not _is_oom(error):
                raise
            return False
        finally:
            args = None
            _empty_caches()

    try:
        return _largest(runs, 1, most, guess=guess)
    finally:
        if limit is not None:
            _set_fraction(1.0)

"""Ready-made memory logging for training frameworks, each a MemoryLogger underneath:

    from vramkit.integrations.hf import MemoryCallback            # transformers.Trainer
    trainer = Trainer(..., callbacks=[MemoryCallback("memory.jsonl", every=10)])

    from vramkit.integrations.lightning import MemoryCallback     # lightning.pytorch.Trainer
    trainer = L.Trainer(..., callbacks=[MemoryCallback("memory.jsonl")])

Each module imports its framework when it is imported itself, never before: ``import vramkit``
and ``import vramkit.integrations`` import neither. For a tqdm bar, vramkit.tqdm_postfix().
"""

from __future__ import annotations


def log_path(path: str, rank: int, world_size: int) -> str:
    """The log of one rank: the path itself for a single process, else the rank before the
    suffix (memory.jsonl -> memory.rank1.jsonl), so that ranks never write one file."""
    if world_size <= 1:
        return path
    stem, dot, suffix = path.rpartition(".")
    return f"{stem}.rank{rank}.{suffix}" if dot and "/" not in suffix else f"{path}.rank{rank}"

"""A Lightning ``Callback`` that logs memory after each training batch through
vramkit.MemoryLogger and prints the summary when training ends.

    from vramkit.integrations.lightning import MemoryCallback
    trainer = lightning.pytorch.Trainer(callbacks=[MemoryCallback("memory.jsonl")])

Works with the ``lightning`` package (lightning.pytorch) or the older ``pytorch_lightning``,
whichever is installed (lightning first). The step of a record is trainer.global_step (the
optimizer steps so far); epoch and batch_idx are added. Each rank logs its own device to its
own file. Importing this module imports Lightning.
"""

from __future__ import annotations

import os

try:
    from lightning.pytorch import Callback
except ImportError:
    try:
        from pytorch_lightning import Callback
    except ImportError:
        raise ImportError("vramkit.integrations.lightning needs Lightning: pip install "
                          "lightning (or pytorch_lightning)") from None

from ...observe.logger import MemoryLogger
from . import log_path

__all__ = ["MemoryCallback"]


class MemoryCallback(Callback):
    """path_or_callback, every and the keywords are MemoryLogger's; the device is the
    module's (pl_module.device) unless device= is given."""

    def __init__(self, path_or_callback="vramkit_memory.jsonl", every: int = 1, device=None,
                 **logger_options):
        super().__init__()
        self.target = path_or_callback
        self.every = every
        self.device = device
        self.options = logger_options
        self.logger: MemoryLogger | None = None

    def on_train_start(self, trainer, pl_module):
        device = self.device
        if device is None:
            device = pl_module.device if pl_module.device.type == "cuda" else 0
        target = self.target
        if isinstance(target, (str, os.PathLike)):  # a path, not an open file: one per rank
            target = log_path(os.fspath(target), trainer.global_rank, trainer.world_size)
        self.logger = MemoryLogger(target, every=self.every, device=device, **self.options)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.logger is not None:
            self.logger.step(trainer.global_step, epoch=trainer.current_epoch,
                             batch_idx=batch_idx)

    def on_train_end(self, trainer, pl_module):
        if self.logger is not None:
            self.logger.close()
            self.logger = None

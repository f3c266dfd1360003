"""Pictures of memory over time: ``vramkit plot FILE -o out.html|out.png``, and
:func:`plot` for the same from Python.

FILE is a vramkit trace (the format ``vramkit replay`` reads), a snapshot pickle in the
format of ``torch.cuda.memory._snapshot()`` (which ``vramkit.dump_snapshot`` also writes) or
a training-loop log of ``vramkit.MemoryLogger`` (JSON lines or CSV, read by _log); the kind
is told from the content. The HTML page is one self-contained file: the timeline
(each allocation a band, reserved above, out-of-memory points), the segments view and what
could not be drawn. Reserved memory of a trace comes from replaying it on a fresh sim pool
in this process (see _replay). The modules: _read (files), _history (the common model),
_replay, _layout (geometry and merging), _html and _png (the two outputs). The subcommand's
arguments are vramkit.cli.plot's.
"""

from __future__ import annotations

import os
import tempfile

from . import _read
from ._read import PlotInputError

__all__ = ["PlotInputError", "plot"]


def load(path: str, device: int | None = None, max_ops: int = _read.DEFAULT_MAX_OPS):
    """The History of a file, for a trace without reserved memory yet (see plot)."""
    from . import _history

    kind = _read.kind_of(path, _read.read_head(path))
    if kind == "trace":
        ops, unmatched = _read.parse_trace(path, max_ops)
        if device not in (None, 0):
            raise PlotInputError(f"{path}: a trace holds one device; --device {device} "
                                 f"does not apply")
        return _history.from_trace(path, ops, unmatched).finish()
    raw = _read.read_bytes(path)
    if kind == "log":
        from . import _log

        return _log.from_log(path, *_log.parse_log(path, raw))
    return _history.from_snapshot(path, _read.load_snapshot_object(path, raw, kind), device)


def plot(path: str, output: str, device: int | None = None, replay: bool = True,
         max_ops: int = _read.DEFAULT_MAX_OPS) -> list[str]:
    """Draw FILE into OUTPUT (.html, or .png with matplotlib) and return the notes on what
    was skipped or is uncertain (the page shows them too). Raises PlotInputError on input
    that cannot be drawn, a trace of more than max_ops ops included (0: no limit);
    replay=False leaves a trace's reserved memory unknown instead of replaying it."""
    from . import _html, _layout, _png, _replay

    if not output.lower().endswith((".html", ".htm", ".png")):
        raise ValueError(f"{output}: the output must end in .html or .png")
    from .._shown import shown

    history = load(path, device, max_ops)
    history.path = shown(history.path)  # the page and the PNG are UTF-8: no raw bytes
    pending = None
    if history.kind == "trace":
        if replay and history.events:
            pending = _replay.Replay(history)
        elif not history.events:
            history.reserved_note = "the trace holds no allocations"
        else:
            history.reserved_note = "reserved is unknown: the replay was turned off"
    lay = _layout.layout(history)
    if pending is not None:
        history.reserved, history.reserved_note = pending.result()
        lay.reserved = _layout.reserved_per_bucket(history, lay.width)
    render = _png.render if output.lower().endswith(".png") else _html.render
    _write_replacing(output, lambda path: render(history, lay, path))
    return list(history.notes) + ([history.reserved_note] if history.reserved_note else [])


def _write_replacing(output: str, write) -> None:
    """write(path) into a new file beside output, then put it in output's place: a write
    that fails (a full disk) leaves no half page that reads as a whole one, and the file
    that was there stays as it was."""
    folder, name = os.path.split(os.path.abspath(output))
    stem, suffix = os.path.splitext(name)
    descriptor, partial = tempfile.mkstemp(suffix=suffix, prefix=f".{stem}.", dir=folder)
    os.close(descriptor)
    try:
        write(partial)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(partial, 0o666 & ~mask)  # as open() would have made it, not mkstemp's 0600
        os.replace(partial, output)
    except BaseException:
        try:
            os.unlink(partial)
        except OSError:
            pass
        raise

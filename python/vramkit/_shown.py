"""Foreign text (file names, process names, messages that carry them) as vramkit shows it.

Every part of the package prints names it did not choose, and the command line is only one
of those parts; this is the one place that makes such a name safe to print, so that the
library modules need nothing from the command line's package (vramkit.cli).
"""

from __future__ import annotations

import os

from . import _core


class ShownText(str):
    """Text that is shown already: shown() gives it back unchanged, so that a message is
    never escaped twice (\\x1b shown again reads \\x5cx1b, which names another file)."""


def shown(text) -> str:
    """A file name (str, bytes or path) or a message carrying one, as the engine's reports
    show foreign text (vram_escape_text): controls, a backslash, bytes the file system's
    encoding cannot decode and the characters that steer what a reader sees as \\xNN, so
    that no name garbles a terminal or a log, forges a line, or fails to print."""
    if isinstance(text, ShownText):
        return str(text)
    if not isinstance(text, str):
        return _core.escape_text(os.fsencode(text))
    try:  # the bytes os.fsdecode took in, back as they were
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # another lone surrogate: shown as the invalid bytes it is
        raw = text.encode("utf-8", "surrogatepass")
    return _core.escape_text(raw)


def trace_message(path, message: str) -> ShownText:
    """A message of the engine's trace reader, as shown text. It starts with the path as
    given, raw; the rest is the engine's own words and what it quotes of lines it checked to
    be printable ASCII, a refused byte quoted as an escape already: only the path is
    escaped here."""
    path = os.fsdecode(path)
    if message.startswith(path):
        return ShownText(shown(path) + message[len(path):])
    return ShownText(shown(message))

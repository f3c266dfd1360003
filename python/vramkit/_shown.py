"""Foreign text (file names, process names, messages that carry them) as vramkit shows it.

Every part of the package prints names it did not choose, and the command line is only one
of those parts; this is the one place that makes such a name safe to print, so that the
library modules need nothing from the command line's package (vramkit.cli).
"""

from __future__ import annotations

import os


def shown(text) -> str:
    """A file name (str, bytes or path) or a message carrying one, as messages show it:
    bytes the file system's encoding cannot decode as \\xNN, control characters escaped as
    repr() escapes them, so that no name garbles a terminal or a log, or fails to print."""
    text = os.fsdecode(text) if not isinstance(text, str) else text
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else
                   f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else
                   repr(c)[1:-1] for c in text)

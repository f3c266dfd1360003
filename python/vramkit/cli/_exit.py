"""What every subcommand of the ``vramkit`` command shares, apart from the dispatcher that
starts it (cli.py): the one table of exit statuses, the messages for a bad command line and
an unreadable file, and foreign text (file names, process names) shown escaped. The
subcommands import this module, never cli.py, so that the dispatcher imports them and is
imported by none.
"""

from __future__ import annotations

import os
import signal
import sys

EXIT_OK = 0
EXIT_DOES_NOT_FIT = 1        # out of memory, or an estimate that does not fit the card
EXIT_BAD_INPUT = 2           # a trace, snapshot, log, report or model configuration
EXIT_USAGE = 3               # the command line
EXIT_FAILURE = 4             # the tool itself: allocator error, unwritable output, no C command
EXIT_MISSING_DEPENDENCY = 5  # an optional package: matplotlib, PyTorch, transformers
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell shows for a command SIGPIPE ended


def usage_error(command: str, message: str) -> int:
    """What every Python subcommand does with a bad command line, as the C command does:
    the message (names in it escaped) and where the help is on stderr, exit status 3."""
    print(f"vramkit {command}: {shown(message)} (see vramkit {command} --help)", file=sys.stderr)
    return EXIT_USAGE


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


def input_error(command: str, error) -> int:
    """A file the subcommand cannot read: the message (which names it) on stderr, exit 2."""
    print(f"vramkit {command}: {shown(str(error))}", file=sys.stderr)
    return EXIT_BAD_INPUT

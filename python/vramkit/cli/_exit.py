"""What every subcommand of the ``vramkit`` command shares: the one table of exit statuses
(the C command's, tools/cli.h, which ``vramkit --help`` prints), and the messages for a bad
command line and an unreadable file. Foreign text in them is escaped by vramkit._shown,
which the library modules use too.
"""

from __future__ import annotations

import signal
import sys

from .._shown import shown

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


def input_error(command: str, error) -> int:
    """A file the subcommand cannot read: the message (which names it; an exception or its
    text) on stderr, exit 2. A message that is shown text already (ShownText, the
    engine's) is not escaped again."""
    if isinstance(error, str):
        message = error
    else:
        message = error.args[0] if len(error.args) == 1 else str(error)
    print(f"vramkit {command}: {shown(message if isinstance(message, str) else str(error))}",
          file=sys.stderr)
    return EXIT_BAD_INPUT

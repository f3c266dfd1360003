"""`vramkit top`'s command line: which view (live, one screen, JSON), how often, and where
the records are; the view itself is vramkit.observe.top."""

from __future__ import annotations

import json
import os
import sys

from ._exit import EXIT_FAILURE, EXIT_OK, usage_error
from ._parser import CommandParser, checked

USAGE = """usage: vramkit top [--once] [--json] [--interval SECONDS] [--dir FOLDER]

Show GPU memory per GPU and per process: NVML's total, used and free memory, utilisation
and per-process used memory, and for processes using vramkit what their pools hold
(allocated, reserved, cached free, largest free block, fragmentation, peak, OOMs).
Refreshed every second; q quits.

  --once              print one screen as plain text and exit
  --json              print one JSON document and exit (with or without --once)
  --interval SECONDS  the refresh period (default 1)
  --dir FOLDER        where vramkit processes publish (default $VRAMKIT_PUBLISH_DIR,
                      else /dev/shm/vramkit-<uid>)

exit status: 0 shown, 3 bad arguments, 4 the terminal cannot be used"""


def _interval(text: str) -> float:
    seconds = float(text)
    if not 0.05 <= seconds <= 3600:  # NaN fails too
        raise ValueError(text)
    return seconds


def parser() -> CommandParser:
    command = CommandParser("top", USAGE)
    # --json is one document, so --once beside it (as scripts write it) changes nothing.
    command.add_argument("--once", action="store_true")
    command.add_argument("--json", action="store_true")
    command.add_argument("--interval", type=checked(_interval, "seconds from 0.05 to 3600"),
                         default=1.0)
    command.add_argument("--dir", default=None)
    return command


def run(options) -> int:
    from ..observe.top import live, render, snapshot

    # The default folder may not exist yet (no process has published): nothing to show. A
    # folder named on the command line that is not there is a typo, not an empty machine.
    if options.dir is not None and not os.path.isdir(options.dir):
        what = "not a folder" if os.path.exists(options.dir) else "no such folder"
        return usage_error("top", f"--dir {options.dir}: {what}")

    if options.json:
        print(json.dumps(snapshot(options.dir), indent=2))
        return EXIT_OK
    if options.once or not (sys.stdout.isatty() and sys.stdin.isatty()):
        # Not a terminal (a pipe, a log): one screen, as --once, rather than escape codes.
        print("\n".join(render(snapshot(options.dir))))
        return EXIT_OK
    import curses

    try:
        live(options.dir, options.interval)
    except curses.error as error:
        print(f"vramkit top: this terminal cannot be drawn on ({error}); use --once or --json",
              file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK

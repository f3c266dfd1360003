"""`vramkit plot`'s command line: its arguments, messages and exit statuses (the table of
vramkit --help: 0 drawn, 2 input that cannot be drawn, 3 bad command line, 4 the output
cannot be written, 5 matplotlib missing for a PNG); the drawing is vramkit.plot. Notes on what was skipped go to stderr as warnings, so a
picture with gaps never passes silently."""

from __future__ import annotations

import sys

from ._exit import (EXIT_FAILURE, EXIT_MISSING_DEPENDENCY, EXIT_OK, input_error, shown,
                    usage_error)
from ._parser import CommandParser, checked

USAGE = """usage: vramkit plot FILE -o OUT.html|OUT.png [--device N] [--no-replay] [--max-ops N]

Draw the memory history in FILE: a vramkit trace (as vramkit replay reads), a snapshot
pickle (torch.cuda.memory._dump_snapshot() or vramkit.dump_snapshot()) or a training-loop log
(vramkit.MemoryLogger's .jsonl or .csv), told apart by content.
OUT.html is one self-contained page that opens offline: the timeline (each allocation a band,
hover for size, call site and lifetime; reserved memory above; out-of-memory points in red)
and the segments view. OUT.png draws the timeline with matplotlib (pip install 'vramkit[plot]').

  -o, --output OUT   the file to write; its suffix picks the kind
  --device N         the device of a snapshot to draw (default: the one with most history)
  --no-replay        for a trace: do not replay it on sim to find reserved memory
  --max-ops N        refuse a trace of more than N ops (default 5,000,000; 0: no limit):
                     each op drawn takes a few hundred bytes of memory

exit status (the table of vramkit --help): 0 drawn, 2 input that cannot be drawn, 3 bad
arguments, 4 the output cannot be written, 5 matplotlib missing"""


def _device(text: str) -> int:
    from ..plot._log import MOST_DEVICE

    # ASCII digits only: int() takes other scripts' digits, which no one types for a device
    if not (text.isascii() and text.isdigit()) or int(text) > MOST_DEVICE:
        raise ValueError(text)
    return int(text)


def _max_ops(text: str) -> int:
    from ..plot._read import MOST_MAX_OPS

    if not (text.isascii() and text.isdigit()) or int(text) > MOST_MAX_OPS:
        raise ValueError(text)
    return int(text)


def parser() -> CommandParser:
    from ..plot._read import DEFAULT_MAX_OPS

    command = CommandParser("plot", USAGE)
    command.add_argument("files", nargs="*")
    command.add_argument("-o", "--output")
    command.add_argument("--device", type=checked(_device, "a device number"))
    command.add_argument("--no-replay", dest="replay", action="store_false")
    command.add_argument("--max-ops", type=checked(_max_ops, "a number of ops"),
                         default=DEFAULT_MAX_OPS)
    return command


def run(options) -> int:
    from ..plot import PlotInputError, plot
    from ..plot._png import MissingMatplotlib

    files, output = options.files, options.output
    if len(files) != 1:
        return usage_error("plot", "expected one FILE" if not files
                           else f"expected one FILE, got {len(files)}")
    if output is None:
        return usage_error("plot", "no output: give -o OUT.html or -o OUT.png")
    if not output.lower().endswith((".html", ".htm", ".png")):
        return usage_error("plot", f"-o {output}: the output must end in .html or .png")
    try:
        notes = plot(files[0], output, device=options.device, replay=options.replay,
                     max_ops=options.max_ops)
    except PlotInputError as error:
        return input_error("plot", error)
    except MissingMatplotlib as error:
        print(f"vramkit plot: {error}", file=sys.stderr)
        return EXIT_MISSING_DEPENDENCY
    except OSError as error:
        print(f"vramkit plot: {shown(output)}: cannot write: {error.strerror}",
              file=sys.stderr)
        return EXIT_FAILURE
    for note in notes:
        print(f"vramkit plot: warning: {shown(files[0])}: {shown(note)}", file=sys.stderr)
    print(f"wrote {shown(output)}")
    return EXIT_OK


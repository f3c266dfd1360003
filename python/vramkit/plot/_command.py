"""`vramkit plot`: its arguments, messages and exit statuses (the table of vramkit --help: 0
drawn, 2 input that cannot be drawn, 3 bad command line, 4 the output cannot be written, 5
matplotlib missing for a PNG). Notes on what was skipped go to stderr as warnings, so a
picture with gaps never passes silently."""

from __future__ import annotations

import sys

from ..cli._exit import (EXIT_FAILURE, EXIT_MISSING_DEPENDENCY, EXIT_OK, input_error, shown,
                           usage_error)
from ._read import DEFAULT_MAX_OPS

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


def main(args: list[str]) -> int:
    from . import PlotInputError, plot
    from ._png import MissingMatplotlib

    files = []
    output = None
    device = None
    replay = True
    max_ops = DEFAULT_MAX_OPS
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-h", "--help"):
            print(USAGE)
            return EXIT_OK
        if arg in ("-o", "--output", "--device", "--max-ops"):
            if i + 1 >= len(args):
                return _usage(f"{arg} needs a value")
            value = args[i + 1]
            i += 2
            if arg == "--device":
                if not value.isdigit():
                    return _usage(f"--device: expected a device number, got '{value}'")
                device = int(value)
            elif arg == "--max-ops":
                if not (value.isascii() and value.isdigit()):
                    return _usage(f"--max-ops: expected a number of ops, got '{value}'")
                max_ops = int(value)
            else:
                output = value
            continue
        if arg.startswith("--output="):
            output = arg.split("=", 1)[1]
        elif arg == "--no-replay":
            replay = False
        elif arg.startswith("-") and arg != "-":
            return _usage(f"unknown option '{arg}'")
        else:
            files.append(arg)
        i += 1
    if len(files) != 1:
        return _usage("expected one FILE" if not files else f"expected one FILE, got "
                      f"{len(files)}")
    if output is None:
        return _usage("no output: give -o OUT.html or -o OUT.png")
    if not output.lower().endswith((".html", ".htm", ".png")):
        return _usage(f"-o {output}: the output must end in .html or .png")
    try:
        notes = plot(files[0], output, device=device, replay=replay, max_ops=max_ops)
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


def _usage(message: str) -> int:
    return usage_error("plot", message)

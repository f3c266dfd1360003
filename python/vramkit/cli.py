"""The ``vramkit`` command of the Python package: one name for subcommands in C and in Python.

``pip install vramkit`` puts a ``vramkit`` script on the PATH that runs :func:`main`, and
``python -m vramkit`` does the same. The wheel carries the C command (replay, bench) inside
the package, at ``vramkit/_bin/vramkit``; every subcommand that is not written in Python is
handed to it with the same arguments, by ``exec``, so that its help, output and exit status
are exactly those of a ``build/vramkit`` built from source. Subcommands written in Python
register in :data:`COMMANDS` with :func:`command`; ``vramkit --help`` lists both kinds.

Exit statuses are the C command's: 0 success, 1 out of memory, 2 bad trace file, 3 bad
command line, 4 allocator failure (here also: the C command is missing from the install).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

EXIT_OK = 0
EXIT_USAGE = 3
EXIT_FAILURE = 4


class Command(NamedTuple):
    """A subcommand written in Python: a one-line summary for the help, and the function
    that runs it with the arguments after its name and returns the exit status."""

    summary: str
    run: Callable[[list[str]], int]


COMMANDS: dict[str, Command] = {}


def usage_error(command: str, message: str) -> int:
    """What every Python subcommand does with a bad command line, as the C command does:
    the message and where the help is on stderr, exit status 3."""
    print(f"vramkit {command}: {message} (see vramkit {command} --help)", file=sys.stderr)
    return EXIT_USAGE


def command(name: str, summary: str) -> Callable[[Callable[[list[str]], int]], Callable[[list[str]], int]]:
    """Register the decorated function as the subcommand ``vramkit NAME``."""

    def register(function: Callable[[list[str]], int]) -> Callable[[list[str]], int]:
        COMMANDS[name] = Command(summary, function)
        return function

    return register


def binary_path() -> Path:
    """Where the wheel installs the C command."""
    return Path(__file__).resolve().with_name("_bin") / "vramkit"


def _missing_binary(subcommand: str) -> int:
    print(f"vramkit: '{subcommand}' is a subcommand of the C command, which this installation "
          f"lacks (expected at {binary_path()}); reinstall the package with pip, which builds "
          f"it, or run build/vramkit from a source build", file=sys.stderr)
    return EXIT_FAILURE


def _exec_binary(args: Sequence[str]) -> int:
    """Replace this process with the C command, so that its exit status is ours."""
    binary = binary_path()
    if not os.access(binary, os.X_OK):
        return _missing_binary(args[0] if args else "help")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(binary, ["vramkit", *args])
    except OSError as error:
        print(f"vramkit: cannot run {binary}: {error.strerror}", file=sys.stderr)
    return EXIT_FAILURE


def _with_python_commands(usage: str) -> str:
    """The C command's usage text with the Python subcommands added at the end of its
    "commands:" list, aligned with the C ones; other text is returned as it is."""
    lines = usage.split("\n")
    if "commands:" not in lines:
        return usage
    start = end = lines.index("commands:") + 1
    while end < len(lines) and lines[end].startswith("  "):
        end += 1
    listed = {line.split()[0] for line in lines[start:end] if line.strip()}
    first = re.match(r"  \S+\s+", lines[start]) if start < end else None
    width = len(first.group(0)) - 2 if first else max(map(len, COMMANDS), default=0) + 2
    extra = [f"  {name:<{width}}{entry.summary}" for name, entry in COMMANDS.items()
             if name not in listed]
    return "\n".join(lines[:end] + extra + lines[end:])


def _help(args: list[str]) -> int:
    """The C command's own answer to these arguments (its usage), with both kinds listed."""
    binary = binary_path()
    if not os.access(binary, os.X_OK):
        return _missing_binary("help")
    done = subprocess.run([str(binary), *args], capture_output=True, text=True)
    sys.stdout.write(_with_python_commands(done.stdout))
    sys.stderr.write(_with_python_commands(done.stderr))
    return done.returncode


@command("version", "the version, and where the package and its C command are installed")
def _version(args: list[str]) -> int:
    if args and args[0] in ("-h", "--help"):
        print("usage: vramkit version\n\nPrint the version (as vramkit --version does), then the "
              "folder of the Python package\nand the path of the C command it runs.")
        return EXIT_OK
    if args:
        print(f"vramkit version: unexpected argument '{args[0]}' (see vramkit version --help)",
              file=sys.stderr)
        return EXIT_USAGE
    from . import __version__

    binary = binary_path()
    print(f"vramkit {__version__}")
    print(f"package: {Path(__file__).resolve().parent}")
    print(f"command: {binary}{'' if os.access(binary, os.X_OK) else ' (missing)'}")
    return EXIT_OK


@command("plot", "draw a trace or a memory snapshot: an offline HTML page or a PNG")
def _plot(args: list[str]) -> int:
    from .plot._command import main as plot_main

    return plot_main(args)


@command("export", "serve Prometheus metrics of every GPU and vramkit process here")
def _export(args: list[str]) -> int:
    from .export import main as export_main

    return export_main(args)


@command("top", "GPU memory per GPU and per process, live: NVML's view and vramkit's pools")
def _top(args: list[str]) -> int:
    from .top import main as top_main

    return top_main(args)


@command("estimate", "a model's training step before it runs: peak memory, fit, largest batch")
def _estimate(args: list[str]) -> int:
    from .estimator.command import main as estimate_main

    return estimate_main(args)


@command("doctor", "why an allocation ran out of memory, from a snapshot or a trace, and the fixes")
def _doctor(args: list[str]) -> int:
    from .doctor import main as doctor_main

    return doctor_main(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``vramkit ARGS`` (the process's arguments when argv is None); returns the exit
    status, unless a C subcommand replaces the process."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in COMMANDS:
        return COMMANDS[args[0]].run(args[1:])
    if len(args) == 2 and args[0] == "help" and args[1] in COMMANDS:
        return COMMANDS[args[1]].run(["--help"])
    if not args or (len(args) == 1 and args[0] in ("-h", "--help", "help")):
        return _help(args)
    return _exec_binary(args)

"""The ``vramkit`` command of the Python package: one name for subcommands in C and in Python.

``pip install vramkit`` puts a ``vramkit`` script on the PATH that runs :func:`main`, and
``python -m vramkit`` does the same. The wheel carries the C command (replay, bench) inside
the package, at ``vramkit/_bin/vramkit``; every subcommand that is not written in Python is
handed to it with the same arguments, by ``exec``, so that its help, output and exit status
are exactly those of a ``build/vramkit`` built from source. Subcommands written in Python
register in :data:`COMMANDS` with :func:`command`, each a module of this package (top.py,
plot.py, ...) with its parser (one argparse style, _parser.py) and its run(); they call into
the library (observe/, plan/, plot/), which never imports this package. ``vramkit --help``
lists both kinds.

Exit statuses are one table for every subcommand, C or Python: the C command's
(tools/cli.h, CLI_EXIT_*, printed by ``vramkit --help``) with the Python subcommands'
meanings added to each row, and 5 for a missing optional package. A closed standard output
(``vramkit top --once | head -1``) ends a Python subcommand quietly with 141, the status a
shell shows for a C command that SIGPIPE ended.
"""

from __future__ import annotations

import errno
import functools
import importlib
import os
import signal
import sys
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

from ._exit import (EXIT_BAD_INPUT, EXIT_BROKEN_PIPE, EXIT_DOES_NOT_FIT, EXIT_FAILURE,
                    EXIT_MISSING_DEPENDENCY, EXIT_OK, EXIT_USAGE, input_error, shown,
                    usage_error)
from ._parser import parse

# The exit-status table and the message helpers are the command's surface too: named here
# for those who script against vramkit.cli, defined in _exit for the subcommands.
__all__ = ["COMMANDS", "Command", "EXIT_BAD_INPUT", "EXIT_BROKEN_PIPE", "EXIT_DOES_NOT_FIT",
           "EXIT_FAILURE", "EXIT_MISSING_DEPENDENCY", "EXIT_OK", "EXIT_USAGE", "binary_path",
           "command", "input_error", "main", "shown", "usage_error"]

class Command(NamedTuple):
    """A subcommand written in Python: a one-line summary for the help, and the function
    that runs it with the arguments after its name and returns the exit status."""

    summary: str
    run: Callable[[list[str]], int]


COMMANDS: dict[str, Command] = {}


def command(name: str, summary: str, module: str | None = None) -> None:
    """Register ``vramkit NAME``, whose parser() and run(options) live in the module
    vramkit.cli.MODULE (NAME's by default), imported only when the command runs."""
    COMMANDS[name] = Command(summary, functools.partial(_run, module or name))


def _run(module_name: str, args: list[str]) -> int:
    """Parse the command line with the command's parser (one style: cli/_parser.py), then
    run it; a command line that does not parse never reaches run()."""
    module = importlib.import_module(f"{__name__}.{module_name}")
    options = parse(module.parser(), args)
    return options if isinstance(options, int) else module.run(options)


def binary_path() -> Path:
    """Where the wheel installs the C command."""
    return Path(__file__).resolve().parent.parent / "_bin" / "vramkit"


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
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None: started with it closed
            stream.flush()
    # Python ignores SIGPIPE and exec keeps ignored signals: give the C command the default
    # a shell gives it, so that a closed pipe ends it as it ends any C tool.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        os.execv(binary, ["vramkit", *args])
    except OSError as error:
        print(f"vramkit: cannot run {binary}: {error.strerror}", file=sys.stderr)
    return EXIT_FAILURE


def _help(args: list[str]) -> int:
    """The C command's usage, with the Python subcommands named to it: it prints the one
    usage (and exits as it does), so that no text of it is read back here."""
    listing = "\n".join(f"{name}\t{entry.summary}" for name, entry in COMMANDS.items())
    return _exec_binary(["--also-commands", listing, *args])


command("version", "the version, and where the package and its C command are installed")
command("plot", "draw a trace or a memory snapshot: an offline HTML page or a PNG")
command("export", "serve Prometheus metrics of every GPU and vramkit process here")
command("top", "GPU memory per GPU and per process, live: NVML's view and vramkit's pools")
command("estimate", "a model's training step before it runs: peak memory, fit, largest batch")
command("doctor", "why an allocation ran out of memory, from a snapshot or a trace, and the fixes")


class _OutputError(Exception):
    """Standard output refused a write for another reason than a closed pipe (a full disk,
    an I/O error): told apart from the OSErrors a subcommand raises for its own files."""

    def __init__(self, error: OSError):
        super().__init__(error.strerror or str(error))


class _GuardedOutput:
    """sys.stdout while a subcommand runs: what fails to be written is an _OutputError,
    so that main() reports it as one line and status 4 instead of a traceback. stream is
    None when the command started with standard output closed (``>&-``)."""

    def __init__(self, stream):
        self._stream = stream

    def _guarded(self, call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as error:
            raise _OutputError(error) from None

    def write(self, text):
        if self._stream is None:
            raise _OutputError(OSError(errno.EBADF, "it is closed"))
        return self._guarded(self._stream.write, text)

    def flush(self):
        return None if self._stream is None else self._guarded(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _silence_stdout() -> None:
    """Point stdout at /dev/null: nothing more can reach the reader, and the flush at
    interpreter exit must not fail again with a message on stderr."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # AttributeError: it was closed (None)
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``vramkit ARGS`` (the process's arguments when argv is None); returns the exit
    status, unless a C subcommand replaces the process. A reader that closes standard output
    early (``| head -1``) ends the command quietly with EXIT_BROKEN_PIPE; an output that
    cannot be written (a full disk) is EXIT_FAILURE with one line saying so, never a
    success whose output was lost."""
    stdout = sys.stdout
    sys.stdout = _GuardedOutput(stdout)
    try:
        status = _dispatch(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # here, so that a closed pipe is seen now and not at exit
        return status
    except BrokenPipeError:
        sys.stdout = stdout
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except _OutputError as error:
        sys.stdout = stdout
        _silence_stdout()
        print(f"vramkit: cannot write standard output: {error}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        sys.stdout = stdout


def _warn_unknown_variables() -> None:
    """As the C command does at its first pool: a VRAMKIT_* name vramkit does not read is
    most likely a typo its user believes took effect (VRAMKIT_PUBLISH_DRI for the folder
    `vramkit top` reads), so one warning each, naming the nearest variable: the engine's
    warning, by its rule for the nearest name."""
    from .. import _core

    sys.stderr.flush()
    _core.warn_unknown_variables()


def _refused_environment(command: str, args: list[str]) -> int | None:
    """EXIT_USAGE, with the engine's message, where a VRAMKIT_* variable holds a value the
    engine refuses, as the C command refuses it: every tool reads these variables, whether
    or not this run makes a pool, so a bad one is never ignored. Asking for help, or the
    version, reads none."""
    if command == "version" or any(a in ("-h", "--help") for a in args):
        return None
    from .. import _core

    problem = _core.environment_problem()
    if problem is None:
        return None
    print(f"vramkit {command}: {problem}", file=sys.stderr)
    return EXIT_USAGE


def _dispatch(args: list[str]) -> int:
    if args and args[0] in COMMANDS:
        _warn_unknown_variables()  # the C subcommands warn for themselves
        refused = _refused_environment(args[0], args[1:])
        if refused is not None:
            return refused
        return COMMANDS[args[0]].run(args[1:])
    if len(args) == 2 and args[0] == "help" and args[1] in COMMANDS:
        return COMMANDS[args[1]].run(["--help"])
    if not args or args in (["-h"], ["--help"]) or args[0] == "help" and (
            len(args) == 1 or args[1] in ("-h", "--help", "help")):
        return _help(args[:1])
    return _exec_binary(args)

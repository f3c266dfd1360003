"""One argument style for every Python subcommand: an argparse parser that speaks as the C
command does. Its prog is ``vramkit NAME``; a bad command line is one line on stderr that
names the command and where its help is, with exit status 3 (EXIT_USAGE) and no traceback,
instead of argparse's usage block and status 2 (which the table gives to bad input files);
``--help`` prints the command's help and exits 0. The dispatcher (vramkit.cli) parses with
it, so that a subcommand's run() only ever sees arguments that parsed.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Callable

from ._exit import EXIT_OK, usage_error

# argparse's messages, reworded as the C command words them (tools/cli.c).
_MISSING_VALUE = re.compile(r"^argument (\S+): expected (?:one|at least one) argument$")
_BAD_VALUE = re.compile(r"^argument (\S+): (.*)$", re.S)
_UNRECOGNIZED = re.compile(r"^unrecognized arguments: (.*)$", re.S)


class UsageError(Exception):
    """A command line the parser refused; the message is the one line shown for it."""


class _Finished(Exception):
    """argparse's exit after --help, as an exception rather than SystemExit."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


def _flag(names: str) -> str:
    """The long name of an option argparse names as '-o/--output'."""
    return names.split("/")[-1]


def _reworded(message: str) -> str:
    if match := _MISSING_VALUE.match(message):
        return f"{_flag(match[1])} needs a value"
    if match := _UNRECOGNIZED.match(message):
        first = match[1].split(" ")[0]
        kind = "unknown option" if first.startswith("-") and first != "-" else \
            "unexpected argument"
        return f"{kind} '{first}'"
    if match := _BAD_VALUE.match(message):
        return f"{_flag(match[1])}: {match[2]}"
    return message


class CommandParser(argparse.ArgumentParser):
    """The parser of ``vramkit NAME``. help_text, when given, is the command's whole help,
    printed as written for --help; without it argparse formats one from the arguments."""

    def __init__(self, name: str, help_text: str | None = None, **settings):
        settings.setdefault("allow_abbrev", False)  # a prefix is an unknown option, as in C
        super().__init__(prog=f"vramkit {name}", **settings)
        # argparse takes '-1G' or '-1e3' for an option (only '-1' and '-1.5' read as
        # numbers), and then says '--capacity needs a value', which is not so: anything
        # that starts as a negative number is a value, refused by the option's own check
        # with what it expects, as the C command does. No option here is named '-<digit>'.
        self._negative_number_matcher = re.compile(r"^-\.?\d")
        self.command = name
        self.help_text = help_text

    def format_help(self) -> str:
        return self.help_text + "\n" if self.help_text is not None else super().format_help()

    def print_help(self, file=None):
        # argparse's own printing ignores a failed write: here a closed pipe reaches the
        # dispatcher, which ends quietly with 141 as for any other output.
        (file or sys.stdout).write(self.format_help())

    def error(self, message: str):
        raise UsageError(_reworded(message))

    def exit(self, status: int = 0, message: str | None = None):
        raise _Finished(status)


def checked(read: Callable[[str], object], expected: str) -> Callable[[str], object]:
    """An argparse type from read(text), which returns the value or raises ValueError: a
    value it refuses is 'expected EXPECTED, got TEXT' in the one-line usage message."""

    def convert(text: str):
        try:
            return read(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got '{text}'") from None

    convert.__name__ = expected  # what argparse would name the type in its own messages
    return convert


def whole_number(text: str) -> int:
    """A whole number as the C command reads one: ASCII digits alone. int() also takes other
    scripts' digits ('\u0661\u0662' is 12), '_', blanks and a sign, which no one means for a
    count or a port; those raise ValueError, for checked() to word."""
    if not (text.isascii() and text.isdigit()):
        raise ValueError(text)
    return int(text)


def parse(parser: CommandParser, args: list[str]) -> argparse.Namespace | int:
    """The parsed arguments, or the exit status of a command line that is done: 0 after
    --help, 3 after the usage message. Options and operands may come in any order; after
    ``--`` everything is an operand (a file named '-x.trace'), as for the C command
    (Python 3.11's intermixed parsing takes what follows ``--`` for options)."""
    split = args.index("--") if "--" in args else len(args)
    head, operands = args[:split], args[split + 1:]
    try:
        parsed = parser.parse_intermixed_args(head)
        if operands:
            listed = [a.dest for a in parser._actions if not a.option_strings and a.nargs == "*"]
            if not listed:
                raise UsageError(f"unexpected argument '{operands[0]}'")
            getattr(parsed, listed[0]).extend(operands)
        return parsed
    except UsageError as error:
        return usage_error(parser.command, str(error))
    except _Finished as finished:
        return finished.status if finished.status else EXIT_OK

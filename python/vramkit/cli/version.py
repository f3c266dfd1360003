"""`vramkit version`: the version, then where the Python package and its C command are, so
that a report of a problem says which installation ran."""

from __future__ import annotations

import os
from pathlib import Path

from ._exit import EXIT_OK
from ._parser import CommandParser

HELP = """usage: vramkit version

Print the version (as vramkit --version does), then the folder of the Python package
and the path of the C command it runs."""


def parser() -> CommandParser:
    return CommandParser("version", HELP)


def run(options) -> int:
    from .. import __version__
    from . import binary_path

    binary = binary_path()
    print(f"vramkit {__version__}")
    print(f"package: {Path(__file__).resolve().parent.parent}")
    print(f"command: {binary}{'' if os.access(binary, os.X_OK) else ' (missing)'}")
    return EXIT_OK

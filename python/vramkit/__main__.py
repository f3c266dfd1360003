"""``python -m vramkit``: the same command as the ``vramkit`` script (see vramkit.cli)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())

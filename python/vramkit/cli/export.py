"""`vramkit export`'s command line: where to listen, how long a client may take, how many
connections to hold, or the metrics once on stdout; the exporter is vramkit.observe.export."""

from __future__ import annotations

import sys

from ._exit import EXIT_FAILURE, EXIT_OK
from ._parser import CommandParser, checked, whole_number

USAGE = """usage: vramkit export [--port PORT] [--address ADDRESS] [--timeout SECONDS]
                      [--max-connections N] [--once]

Serve Prometheus metrics at http://ADDRESS:PORT/metrics for every GPU (from NVML) and every
vramkit process of this user on the machine (from the records they publish): vramkit_*_bytes
gauges, vramkit_ooms_total and vramkit_alloc_retries_total counters, with dcgm-exporter's
labels gpu, UUID, modelName and hostname, and pid and process for processes. Command lines
are never served.

  --port PORT        the port to listen on (default 9400; 0 picks a free one)
  --address ADDRESS  the address to listen on (default 127.0.0.1, this machine only;
                     0.0.0.0 for every interface)
  --timeout SECONDS  the time a client has to send its request, and again to take the
                     reply, before its connection is closed (default 5)
  --max-connections N
                     connections held at once (default 4096, lowered to what the
                     descriptor limit allows); one more is answered 503 with Retry-After
  --once             print the metrics once on stdout and exit (for tests and cron)

exit status (the table of vramkit --help): 0 done, 3 bad arguments, 4 cannot listen (port
in use, bad address)"""


def _port(text: str) -> int:
    if whole_number(text) > 65535:
        raise ValueError(text)
    return int(text)


def _address(text: str) -> str:
    if not text.strip():
        raise ValueError(text)
    return text.strip().strip("[]")


def _timeout(text: str) -> float:
    seconds = float(text)
    if not 0 < seconds <= 3600:  # NaN fails too
        raise ValueError(text)
    return seconds


def _connections(text: str) -> int:
    if whole_number(text) < 1:
        raise ValueError(text)
    return int(text)


def parser() -> CommandParser:
    from ..observe.export import (DEFAULT_ADDRESS, DEFAULT_MAX_CONNECTIONS, DEFAULT_PORT,
                                  DEFAULT_TIMEOUT_S)

    command = CommandParser("export", USAGE)
    command.add_argument("--port", type=checked(_port, "a port number from 0 to 65535"),
                         default=DEFAULT_PORT)
    command.add_argument("--address", type=checked(_address, "an address such as 127.0.0.1"),
                         default=DEFAULT_ADDRESS)
    command.add_argument("--timeout", type=checked(_timeout, "seconds above 0, up to 3600"),
                         default=DEFAULT_TIMEOUT_S)
    command.add_argument("--max-connections", type=checked(_connections, "a whole number from 1"),
                         default=DEFAULT_MAX_CONNECTIONS)
    command.add_argument("--once", action="store_true")
    return command


def run(options) -> int:
    from ..observe.export import CannotListen, render, serve

    if options.once:
        sys.stdout.write(render())
        sys.stdout.flush()
        return EXIT_OK
    try:
        serve(options.address, options.port, options.timeout, options.max_connections)
    except CannotListen as error:
        print(f"vramkit export: {error}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK

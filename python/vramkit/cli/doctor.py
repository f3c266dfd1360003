"""`vramkit doctor`'s command line: the file to diagnose, the capacity to diagnose it under,
text or JSON; the diagnosis itself is vramkit.plan.doctor."""

from __future__ import annotations

import json

from ._exit import EXIT_OK, input_error, usage_error
from ._parser import CommandParser, checked

HELP = """usage: vramkit doctor SNAPSHOT_OR_TRACE [--capacity SIZE] [--json]

Say why an allocation ran out of memory, in one screen: live memory over the cap,
fragmentation, other processes holding the GPU, or a limit set too low; with the numbers,
and the fixes ranked by predicted effect.

SNAPSHOT_OR_TRACE is a memory snapshot pickle (vramkit.dump_snapshot or PyTorch's
torch.cuda.memory._dump_snapshot, recorded with the OOM in its trace) or a vramkit trace
(format v1, as vramkit replay reads). A trace's fixes are the settings on which it fits.

  --capacity SIZE  a trace: replay it under this cap (on the default settings, on fixed
                   segments alone, on sim:vmm, and with VRAMKIT_VIRTUAL_THRESHOLD=0 and
                   VRAMKIT_TIGHT_THRESHOLD=0) to find the cause and what each fix gains;
                   a snapshot: the device's capacity, which a snapshot does not record
  --json           one JSON document instead of the text

SIZE takes K/M/G/T suffixes.
exit status (the table of vramkit --help): 0 diagnosed, 2 the file cannot be read or is
not a snapshot, trace or report, 3 bad arguments, 4 the C command is missing"""



def _capacity(text: str) -> int:
    from .. import _core

    size = _core.parse_size(text, False)[0]  # InvalidArgumentError, a ValueError
    if size <= 0:
        raise ValueError(text)
    return size


def parser() -> CommandParser:
    command = CommandParser("doctor", HELP)
    command.add_argument("paths", nargs="*")
    command.add_argument("--capacity", type=checked(_capacity, "a size above 0 such as '16G'"))
    command.add_argument("--json", action="store_true")
    return command


def run(options) -> int:
    from ..plan.doctor import DoctorInputError, diagnose

    if len(options.paths) != 1:
        return usage_error("doctor", "give one snapshot or trace" if not options.paths
                           else f"one file at a time, not {len(options.paths)}")
    try:
        result = diagnose(options.paths[0], capacity=options.capacity)
    except DoctorInputError as error:
        return input_error("doctor", error)
    except ValueError as error:  # --capacity that the snapshot shows cannot be the device's
        return usage_error("doctor", f"--capacity: {error}")
    print(json.dumps(result.to_dict(), indent=2) if options.json else result)
    return EXIT_OK

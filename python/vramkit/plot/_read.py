"""Reading the files `vramkit plot` accepts: a vramkit trace or a snapshot pickle.

The kind is told from the content (a trace's header line, a pickle's protocol byte, a JSON
object), never from the name, and gzip is undone first whatever the file is called. A
snapshot is read with an unpickler that refuses every global, so that only dicts, lists,
tuples, strings, bytes, numbers, booleans and None can come out of it: a snapshot from
elsewhere must not be able to run code here. Every problem is a PlotInputError whose text
names the file and what is wrong with it; nothing below raises anything else on bad input.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import struct
import zlib

TRACE_MAGIC = b"# vramkit-trace v1"


class PlotInputError(Exception):
    """The input cannot be drawn; the message names the file and the reason."""


class _DataOnlyUnpickler(pickle.Unpickler):
    # Plain containers and scalars never go through find_class; anything that does would
    # construct an object of the file's choosing, which is how a pickle runs code.
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it asks for the Python object {module}.{name}, and "
                                     f"a snapshot holds only plain data")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("it holds a persistent reference, which a snapshot "
                                     "never does")


def read_bytes(path: str) -> bytes:
    """The file's content, decompressed when it is gzip."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as error:
        raise PlotInputError(f"{path}: cannot read: {error.strerror}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as error:
            raise PlotInputError(f"{path}: cannot decompress (corrupt or truncated gzip): "
                                 f"{error}") from None
    return raw


def kind_of(path: str, raw: bytes) -> str:
    """"trace", "pickle" or "json", from the first bytes."""
    if raw.startswith(TRACE_MAGIC):
        return "trace"
    if raw[:1] == b"\x80":
        return "pickle"
    if raw.lstrip()[:1] == b"{":
        return "json"
    if raw.startswith(b"# vramkit-trace"):
        first = raw.split(b"\n", 1)[0][:60].decode("ascii", "replace")
        raise PlotInputError(f"{path}: a vramkit trace of another format version "
                             f"('{first}'); this vramkit reads v1")
    if not raw:
        raise PlotInputError(f"{path}: the file is empty")
    raise PlotInputError(f"{path}: neither a vramkit trace (first line "
                         f"'{TRACE_MAGIC.decode()}') nor a memory snapshot (a pickle or JSON)")


def load_snapshot_object(path: str, raw: bytes, kind: str):
    """The Python object stored in a snapshot file (not yet checked to be a snapshot)."""
    if kind == "json":
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as error:
            raise PlotInputError(f"{path}: corrupt JSON snapshot: {error}") from None
    try:
        return _DataOnlyUnpickler(io.BytesIO(raw)).load()
    except pickle.UnpicklingError as error:
        raise PlotInputError(f"{path}: not a readable snapshot pickle: {error}") from None
    except EOFError:
        raise PlotInputError(f"{path}: truncated pickle (it ends before the snapshot does)") \
            from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError,
            RecursionError, MemoryError, UnicodeDecodeError, struct.error) as error:
        raise PlotInputError(f"{path}: corrupt pickle: {type(error).__name__}: {error}") \
            from None


def parse_trace(path: str, raw: bytes):
    """The ops of a v1 trace as (is_alloc, id, size, stream, t_us) tuples, checked as
    tools/trace_io.c checks them; frees of ids that are not live are counted, not kept,
    as the replay does (blocks allocated before recording began)."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as error:
        raise PlotInputError(f"{path}: not a text trace: byte {error.start} is not ASCII") \
            from None
    ops = []
    append = ops.append
    live = set()
    unmatched = 0
    hint = "expected 'a ID SIZE STREAM T_US' or 'f ID STREAM T_US'"
    for number, line in enumerate(text.split("\n"), 1):
        fields = line.split()
        if not fields or fields[0][0] == "#":
            continue
        tag = fields[0]
        try:
            if tag == "a" and len(fields) == 5:
                ident, size, stream, t = map(_u64, fields[1:])
                if ident in live:
                    raise PlotInputError(f"{path}:{number}: block ID {ident} allocated again "
                                         f"while still live")
                live.add(ident)
                append((True, ident, size, stream, t))
            elif tag == "f" and len(fields) == 4:
                ident, stream, t = map(_u64, fields[1:])
                if ident not in live:
                    unmatched += 1
                    continue
                live.discard(ident)
                append((False, ident, 0, stream, t))
            elif tag in ("a", "f"):
                raise PlotInputError(f"{path}:{number}: '{tag}' event with {len(fields) - 1} "
                                     f"fields: {hint}")
            else:
                raise PlotInputError(f"{path}:{number}: unknown event '{tag[:20]}': {hint}")
        except ValueError:
            raise PlotInputError(f"{path}:{number}: a field is not an unsigned 64-bit decimal "
                                 f"number: {line[:80]!r}") from None
    return ops, unmatched


def _u64(field: str) -> int:
    if not field.isdigit() or not field.isascii():
        raise ValueError(field)
    value = int(field)
    if value >= 1 << 64:
        raise ValueError(field)
    return value

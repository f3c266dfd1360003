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
import re
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
    """"trace", "pickle", "json" or "log" (a MemoryLogger log), from the first bytes."""
    from ._log import is_log

    if raw.startswith(TRACE_MAGIC):
        return "trace"
    if is_log(raw):
        return "log"
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


_GAP = r"[ \t]+"
_NUMBER = r"(\d+)"
# A whole line of a valid trace, as trace_io.c splits it: blanks around fields, a comment, or
# nothing. findall runs it over the text in C; the line-by-line loop runs only to word the
# error when some line does not match.
_LINE = re.compile(rf"^[ \t]*(?:(a){_GAP}{_NUMBER}{_GAP}{_NUMBER}{_GAP}{_NUMBER}{_GAP}{_NUMBER}"
                   rf"|f{_GAP}{_NUMBER}{_GAP}{_NUMBER}{_GAP}{_NUMBER}|#.*|)[ \t\r]*$", re.M)


def parse_trace(path: str, raw: bytes):
    """The ops of a v1 trace as (is_alloc, id, size, stream, t_us) tuples, checked as
    tools/trace_io.c checks them; frees of ids that are not live are counted, not kept,
    as the replay does (blocks allocated before recording began)."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as error:
        raise PlotInputError(f"{path}: not a text trace: byte {error.start} is not ASCII") \
            from None
    rows = _LINE.findall(text)
    if len(rows) == text.count("\n") + 1:
        fast = _rows_to_ops(rows)
        if fast is not None:
            return fast
    ops = []
    append = ops.append
    live = set()
    unmatched = 0
    hint = "expected 'a ID SIZE STREAM T_US' or 'f ID STREAM T_US'"
    limit = 1 << 64
    for number, line in enumerate(text.split("\n"), 1):
        fields = line.split()
        if not fields or fields[0][0] == "#":
            continue
        tag = fields[0]
        count = len(fields)
        if (tag == "a" and count == 5) or (tag == "f" and count == 4):
            # One check for all the numbers of the line: the text is ASCII, so isdigit
            # means 0-9 only (no sign, no '_', which int() would take).
            if not "".join(fields[1:]).isdigit() or "" in fields:
                raise PlotInputError(f"{path}:{number}: a field is not an unsigned decimal "
                                     f"number: {line[:80]!r}")
            values = list(map(int, fields[1:]))
            if max(values) >= limit:
                raise PlotInputError(f"{path}:{number}: a number does not fit in 64 bits")
            ident = values[0]
            if count == 5:
                if ident in live:
                    raise PlotInputError(f"{path}:{number}: block ID {ident} allocated again "
                                         f"while still live")
                live.add(ident)
                append((True, ident, values[1], values[2], values[3]))
            elif ident in live:
                live.discard(ident)
                append((False, ident, 0, values[1], values[2]))
            else:
                unmatched += 1
        elif tag in ("a", "f"):
            raise PlotInputError(f"{path}:{number}: '{tag}' event with {count - 1} fields: "
                                 f"{hint}")
        else:
            raise PlotInputError(f"{path}:{number}: unknown event '{tag[:20]}': {hint}")
    return ops, unmatched


def _rows_to_ops(rows):
    """The ops of rows that all matched _LINE, or None when a number needs the careful
    path (past 64 bits, or an ID allocated twice) so that it words the error."""
    ops = []
    append = ops.append
    live = set()
    unmatched = 0
    limit = 1 << 64
    for is_alloc, ident, size, stream, t, f_ident, f_stream, f_t in rows:
        if is_alloc:
            ident = int(ident)
            if ident in live:
                return None
            live.add(ident)
            append((True, ident, int(size), int(stream), int(t)))
        elif f_ident:
            ident = int(f_ident)
            if ident in live:
                live.discard(ident)
                append((False, ident, 0, int(f_stream), int(f_t)))
            else:
                unmatched += 1
    if ops and max(max(op[1], op[2], op[3], op[4]) for op in ops) >= limit:
        return None
    return ops, unmatched


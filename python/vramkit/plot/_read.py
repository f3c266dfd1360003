"""Reading the files `vramkit plot` accepts: a vramkit trace or a snapshot pickle.

The kind is told from the content (a trace's header line, a pickle's protocol byte, a JSON
object), never from the name, and gzip is undone first whatever the file is called; only
the head of a file is read for that. A trace is then read by the library's one trace
reader (through vramkit._core), never by a parser of its own here. A
snapshot is read with an unpickler that refuses every global, so that only dicts, lists,
tuples, strings, bytes, numbers, booleans and None can come out of it: a snapshot from
elsewhere must not be able to run code here. Every problem is a PlotInputError whose text
names the file and what is wrong with it; nothing below raises anything else on bad input.
"""

from __future__ import annotations

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


# How much larger than its gzip file a snapshot or log may be once decompressed, and the
# least it may always be. Reading is bounded by the size of the file: without this a small
# gzip of repeated bytes would take gigabytes (a plain file is read as it is, whatever its
# size, so one decompressed ahead is always readable).
GZIP_MAX_RATIO = 64
GZIP_MIN_LIMIT = 64 << 20


def gunzip(f, limit: int) -> bytes:
    """The gzip data of the binary file ``f`` decompressed, as zlib's gzread (the trace
    reader's) reads it: members one after another; bytes after the last member that do not
    begin another are ignored, as gzread and ``gzip -d`` ignore them. At most ``limit + 1``
    bytes come out: more than ``limit`` says there is more. A corrupt stream raises
    zlib.error, one cut short EOFError."""
    out = bytearray()
    member = zlib.decompressobj(31)
    data = b""
    while len(out) <= limit:
        if not data:
            data = f.read(1 << 16)
            if not data:
                raise EOFError("the gzip data ends before its end (truncated)")
        out += member.decompress(data, limit + 1 - len(out))
        data = member.unconsumed_tail
        if member.eof:
            rest = member.unused_data
            while len(rest) < 2:
                more = f.read(1 << 16)
                if not more:
                    break
                rest += more
            if rest[:2] != b"\x1f\x8b":
                break
            member, data = zlib.decompressobj(31), rest
    return bytes(out)


def read_bytes(path: str) -> bytes:
    """The file's content, decompressed when it is gzip (up to the bound above)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as error:
        raise PlotInputError(f"{path}: cannot read: {error.strerror}") from None
    if raw[:2] == b"\x1f\x8b":
        limit = max(GZIP_MIN_LIMIT, GZIP_MAX_RATIO * len(raw))
        try:
            raw = gunzip(io.BytesIO(raw), limit)
        except (EOFError, zlib.error) as error:
            raise PlotInputError(f"{path}: cannot decompress (corrupt or truncated gzip): "
                                 f"{error}") from None
        if len(raw) > limit:
            raise PlotInputError(f"{path}: decompresses to more than {limit:,} bytes "
                                 f"({GZIP_MAX_RATIO} times its size), more than a snapshot "
                                 f"or log compresses: refused (gunzip it first to read it)")
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
    raise PlotInputError(f"{path}: not a vramkit trace (first line "
                         f"'{TRACE_MAGIC.decode()}'), a memory snapshot (JSON, or a pickle of "
                         f"protocol 2 or later, as PyTorch writes them) or a memory log")


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


# The most ops `vramkit plot` draws unless --max-ops says otherwise. Every op becomes
# several Python objects (the op, its block, its event), a few hundred bytes in all, so the
# limit is far below the replay's (vramkit.h, VRAM_TRACE_DEFAULT_MAX_OPS): past it a small
# gzip file of repeated lines would take more memory than the machine has.
DEFAULT_MAX_OPS = 5_000_000
# How much of a file kind_of needs: a trace's header line, a pickle's first byte, a log's
# first line. Only a snapshot is read whole; a trace is read line by line.
HEAD_BYTES = 1 << 16


def read_head(path: str) -> bytes:
    """The first HEAD_BYTES of the file's content, decompressed when it is gzip, for
    kind_of; a large or hostile gzip file is never decompressed whole here."""
    try:
        with open(path, "rb") as f:
            raw = f.read(HEAD_BYTES)
    except OSError as error:
        raise PlotInputError(f"{path}: cannot read: {error.strerror}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            with open(path, "rb") as f:
                raw = gunzip(f, HEAD_BYTES)[:HEAD_BYTES]
        except OSError as error:
            raise PlotInputError(f"{path}: cannot read: {error.strerror}") from None
        except (EOFError, zlib.error) as error:
            raise PlotInputError(f"{path}: cannot decompress (corrupt or truncated gzip): "
                                 f"{error}") from None
    return raw


# The largest --max-ops, as `vramkit replay` takes it (a signed 64-bit count).
MOST_MAX_OPS = (1 << 63) - 1


def parse_trace(path: str, max_ops: int = DEFAULT_MAX_OPS):
    """The ops of a v1 trace as (is_alloc, id, size, stream, t_us) tuples, read by the
    library's trace reader (vram_trace_reader_*, the one `vramkit replay` uses), so that
    both accept and refuse the same files with the same messages; frees of ids that are
    not live are counted, not kept, as the replay does (blocks allocated before recording
    began). More than max_ops ops (0: no limit) is a PlotInputError naming the limit."""
    from .. import _core
    from .._shown import trace_message

    if isinstance(max_ops, bool) or not isinstance(max_ops, int) or \
            not 0 <= max_ops <= MOST_MAX_OPS:
        raise ValueError(f"max_ops must be an int from 0 (no limit) to {MOST_MAX_OPS}, "
                         f"not {max_ops!r}")
    try:
        return _core.trace_read(path, max_ops)
    except _core.VramError as error:
        message = str(error)
        if getattr(error, "status", None) == _core.VRAM_ELIMIT:
            message += " (--max-ops N raises the limit)"
        raise PlotInputError(trace_message(path, message)) from None

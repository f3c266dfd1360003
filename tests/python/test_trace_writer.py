"""The Python package writes traces through the library's one writer (_core.trace_write,
vram_trace_writer_*): what save_trace and write_trace write, the library's reader and the
in-process replay read back op for op; an op the reader would refuse is refused with the
package's own error, and no file is left behind."""

import errno
import gzip
import json
import os
import random

import pytest

import vramkit
from vramkit import _core
from vramkit.observe.history import write_trace

LAST_ID = 2**64 - 1  # the one ID the reader cannot hold


def random_ops(rng, count):
    """Random ("a", id, size, stream, t_us) / ("f", id, stream, t_us) ops, with frees of
    IDs never allocated (kept by the writer, counted by the reader) and numbers up to the
    64-bit limits."""
    live, ops = [], []
    for _ in range(count):
        choice = rng.random()
        if live and choice < 0.4:
            ident = live.pop(rng.randrange(len(live)))
            ops.append(("f", ident, rng.getrandbits(64), rng.getrandbits(rng.randrange(65))))
        elif choice < 0.45:
            ops.append(("f", rng.getrandbits(63) * 2 + 1, 0, 0))  # odd: never allocated
        else:
            ident = rng.getrandbits(63) * 2
            if ident in live:
                continue
            live.append(ident)
            ops.append(("a", ident, rng.getrandbits(rng.randrange(65)), rng.randrange(9),
                        rng.getrandbits(64)))
    return ops


def read_back(path):
    """The ops of the file as the writer took them, unmatched frees left out."""
    ops, unmatched = _core.trace_read(str(path), 0)
    return [("a", i, size, stream, t) if is_alloc else ("f", i, stream, t)
            for is_alloc, i, size, stream, t in ops], unmatched


@pytest.mark.parametrize("seed", range(5))
def test_random_ops_always_read_back(tmp_path, seed):
    ops = random_ops(random.Random(seed), 3000)
    path = tmp_path / "random.trace.gz"
    assert _core.trace_write(str(path), iter(ops), f"random seed={seed}") == len(ops)
    got, unmatched = read_back(path)
    matched = [op for op in ops if op[0] == "a" or op[1] % 2 == 0]
    assert got == matched
    assert unmatched == len(ops) - len(matched)
    with gzip.open(path, "rt") as f:  # gzip, the header first
        assert f.readline() == f"# vramkit-trace v1 random seed={seed}\n"


def test_save_trace_reads_back_and_replays_in_process(run, tmp_path):
    path = tmp_path / "history.trace.gz"
    out = run(f"""
        import json, vramkit
        from vramkit import _core
        vramkit.record_memory_history()
        blocks = [vramkit.empty(size) for size in (4096, 1 << 20, 3 << 20, 70000)]
        blocks.pop(1).free()
        blocks.append(vramkit.empty(9 << 20))
        peak = vramkit.max_memory_allocated()
        written = vramkit.save_trace({str(path)!r})
        ops, unmatched = _core.trace_read({str(path)!r}, 0)
        result = vramkit.replay({str(path)!r})
        print(json.dumps([written, len(ops), unmatched, peak, result["ops"],
                          result["peak_live_bytes"], result["skipped_frees"]]))
    """)
    written, read, unmatched, peak, replayed, peak_live, skipped = json.loads(out.stdout)
    assert written == read == replayed == 6
    assert unmatched == skipped == 0
    assert peak_live == peak


@pytest.mark.parametrize("ops, error, message", [
    ([("a", 1, 4096, 0, 0), ("a", 1, 4096, 0, 1)], _core.InvalidArgumentError,
     "allocated again while still live"),
    ([("a", LAST_ID, 1, 0, 0)], _core.InvalidArgumentError, "out of range"),
    ([("a", 1, -1, 0, 0)], _core.InvalidArgumentError, "size -1 is outside"),
    ([("f", 1, 2**64, 0)], _core.InvalidArgumentError, "stream 18446744073709551616"),
    ([("m", 1, 4096, 0, 0)], _core.InvalidArgumentError, "expected"),
    ([("a", 1, 4096, 0)], _core.InvalidArgumentError, "expected"),
    ([("a", 1, 4096, 0, 0), ["f", 1, 0, 1], "f 1 0 1"], TypeError, "op 5003 must be a tuple"),
    ([("a", 1, 4096.0, 0, 0)], TypeError, "size must be an int, not float"),
    ([("a", True, 4096, 0, 0)], TypeError, "id must be an int, not bool"),
])
def test_bad_ops_are_refused_and_leave_no_file(tmp_path, ops, error, message):
    path = tmp_path / "bad.trace.gz"
    good = [("a", 100 + i, 4096, 0, i) for i in range(5000)]  # more than one batch
    with pytest.raises(error, match=message):
        write_trace(path, good + ops, "bad")
    assert issubclass(error, (ValueError, TypeError))
    assert not path.exists()


@pytest.mark.parametrize("header", ["two\nlines", "tab\tand\rreturn", "caf\u00e9", "x" * 5000,
                                    "nul\0"])
def test_bad_headers_are_refused(tmp_path, header):
    path = tmp_path / "header.trace.gz"
    with pytest.raises(_core.InvalidArgumentError, match="trace header"):
        write_trace(path, [], header)
    assert not path.exists()


def test_an_error_while_iterating_removes_the_file(tmp_path):
    path = tmp_path / "abandoned.trace.gz"

    def ops():
        yield ("a", 1, 4096, 0, 0)
        raise KeyError("from the caller")

    with pytest.raises(KeyError, match="from the caller"):
        write_trace(path, ops(), "abandoned")
    assert not path.exists()


def test_unwritable_paths_are_the_os_errors_open_raises(tmp_path):
    """The subclass and errno Python's own open() gives for the path, with the engine's
    message alone as the text (no "[Errno N]" before it)."""
    missing = tmp_path / "no" / "such" / "dir.trace.gz"
    with pytest.raises(FileNotFoundError) as raised:
        write_trace(missing, [], "x")
    assert raised.value.errno == errno.ENOENT
    assert str(raised.value) == f"{missing}: cannot open for writing: No such file or directory"
    with pytest.raises(IsADirectoryError) as raised:
        write_trace(tmp_path, [], "x")
    assert raised.value.errno == errno.EISDIR
    (tmp_path / "f").write_text("")
    with pytest.raises(NotADirectoryError):
        write_trace(tmp_path / "f" / "t.trace.gz", [], "x")
    if os.path.exists("/dev/full"):
        many = (("a", i, 4096 + i, 0, i * 7919) for i in range(300000))
        with pytest.raises(OSError, match="/dev/full: cannot write") as raised:
            write_trace("/dev/full", many, "full")
        assert raised.value.errno == errno.ENOSPC


"""The Python package reads traces through the library's one reader: the corpus of bad
traces (tests/data/bad_traces, which `vramkit replay` must refuse too, tools/check_cli.cmake)
is refused with the same file, line and reason; `vramkit plot` takes --max-ops; and a trace
of thousands of streams reads whole."""

import gzip
import os
import re
import subprocess
import sys

import pytest

from vramkit.estimator.torch_caching import read_trace
from vramkit.plot import PlotInputError, load
from vramkit.plot import _read

CORPUS = os.path.join(os.path.dirname(__file__), "..", "data", "bad_traces")


def corpus_cases():
    with open(os.path.join(CORPUS, "expected.tsv")) as f:
        rows = [line.rstrip("\n").split("\t") for line in f if not line.startswith("#")]
    return [pytest.param(name, int(line), pattern, id=name) for name, line, pattern in rows]


def write_trace(path, lines):
    with gzip.open(path, "wt") as f:
        f.write("# vramkit-trace v1 workload=test\n" + "\n".join(lines) + "\n")
    return str(path)


def run_plot(*args):
    return subprocess.run([sys.executable, "-m", "vramkit", "plot", *map(str, args)],
                          capture_output=True, text=True)


@pytest.mark.parametrize("name, line, pattern", corpus_cases())
def test_bad_trace_refused_as_replay_refuses_it(name, line, pattern):
    path = os.path.join(CORPUS, name)
    with pytest.raises(PlotInputError) as caught:
        _read.parse_trace(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert re.search(pattern, message), message
    # Control bytes of the file are escaped, never echoed.
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", message)


@pytest.mark.parametrize("name", ["nul_hidden_op.trace", "vertical_tab.trace",
                                  "form_feed.trace", "long_comment.trace"])
def test_plot_command_refuses_corpus_file(tmp_path, name):
    done = run_plot(os.path.join(CORPUS, name), "-o", tmp_path / "out.html", "--no-replay")
    assert done.returncode == 2, done.stderr
    assert f"{name}:2: " in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out.html").exists()


def test_max_ops(tmp_path):
    path = write_trace(tmp_path / "four.trace.gz", ["a 0 512 0 1", "f 0 0 2", "a 1 512 0 3",
                                                    "f 1 0 4"])
    with pytest.raises(PlotInputError, match=r"four\.trace\.gz:5: the trace has more than 3 "
                                             r"ops.*--max-ops N raises the limit"):
        load(path, max_ops=3)
    assert len(load(path, max_ops=4).events) == 4
    assert len(load(path, max_ops=0).events) == 4
    done = run_plot(path, "-o", tmp_path / "out.html", "--no-replay", "--max-ops", "3")
    assert done.returncode == 2 and "more than 3 ops" in done.stderr, done.stderr
    done = run_plot(path, "-o", tmp_path / "out.html", "--no-replay", "--max-ops", "many")
    assert done.returncode == 3 and "--max-ops" in done.stderr, done.stderr
    done = run_plot(path, "-o", tmp_path / "out.html", "--no-replay", "--max-ops", "4")
    assert done.returncode == 0, done.stderr


def test_many_streams_read_whole(tmp_path):
    streams = 6000
    lines = [f"a {s} 4096 {s} {s}" for s in range(streams)]
    lines += [f"f {s} {s} {streams + s}" for s in range(streams)]
    path = write_trace(tmp_path / "streams.trace.gz", lines)
    ops, unmatched = _read.parse_trace(path)
    assert unmatched == 0
    assert len(ops) == 2 * streams
    assert len({op[3] for op in ops}) == streams
    assert ops[0] == (True, 0, 4096, 0, 0)
    assert ops[streams] == (False, 0, 4096, 0, streams)  # a free carries the block's size


def test_estimator_reads_through_the_same_reader(tmp_path):
    path = write_trace(tmp_path / "t.trace.gz", ["f 99 0 1", "a 0 4096 0 2", "f 0 0 3"])
    assert read_trace(path) == [("a", 0, 4096, 0), ("f", 0, 0)]
    with pytest.raises(PlotInputError, match="a NUL byte"):
        read_trace(os.path.join(CORPUS, "nul_in_line.trace"))

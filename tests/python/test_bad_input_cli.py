"""Bad input to every `vramkit` subcommand but `estimate`: one clear line on stderr, the
exit status the help's table gives it, no traceback, and nothing printed that is not true.

Each test here is a case that once went wrong: output lost to a full disk reported as a
success, names escaped twice, an option's negative value taken for a missing one, raw
control characters in the exporter's labels, a small gzip file read into gigabytes.
The commands run as installed (the script beside this interpreter), as a user runs them.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli import installed_script

EXIT_BAD_INPUT, EXIT_USAGE, EXIT_FAILURE = 2, 3, 4
TRACE = "# vramkit-trace v1\na 1 1024 0 0\na 2 4096 0 1\nf 1 0 2\nf 2 0 3\n"


def run(*args, stdout=subprocess.PIPE, env_extra=None, preexec_fn=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMKIT_")}
    env["VRAMKIT_SOURCE"] = "sim"
    env.update(env_extra or {})
    return subprocess.run([str(installed_script()), *map(str, args)], env=env,
                          stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300,
                          preexec_fn=preexec_fn)


def assert_one_clear_line(done, status, *phrases):
    assert done.returncode == status, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    for phrase in phrases:
        assert phrase in done.stderr, done.stderr


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "small.trace"
    path.write_text(TRACE)
    return path


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("args", [["version"], ["doctor", "{trace}", "--capacity", "1K"],
                                  ["top", "--once"], ["export", "--once"],
                                  ["--version"], ["replay", "{trace}"], ["--help"]])
def test_output_lost_to_a_full_disk_is_a_failure(args, trace):
    """Python subcommands and the C command alike: status 4 and why, not 0 or a traceback."""
    with open("/dev/full", "w") as full:
        done = run(*[str(trace) if a == "{trace}" else a for a in args], stdout=full)
    assert_one_clear_line(done, EXIT_FAILURE, "vramkit: cannot write standard output")
    assert len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize("args", [["version"], ["top", "--once"], ["--version"],
                                  ["replay", "{trace}"]])
def test_a_closed_standard_output_is_a_failure(args, trace):
    """Started with standard output closed (>&-): Python has no sys.stdout at all."""
    done = run(*[str(trace) if a == "{trace}" else a for a in args], stdout=None,
               preexec_fn=lambda: os.close(1))
    assert_one_clear_line(done, EXIT_FAILURE, "vramkit: cannot write standard output")


def test_help_for_an_unknown_command_is_a_usage_error():
    done = run("help", "no-such-command")
    assert_one_clear_line(done, EXIT_USAGE, "unknown command 'no-such-command'")
    assert done.stdout == ""


def test_help_takes_one_command_and_knows_itself():
    """'help plot extra' said "unknown command 'plot'" and 'help replay extra' dropped the
    extra word; 'help help' said "unknown command 'help'"."""
    for command in ("plot", "replay"):
        done = run("help", command, "extra")
        assert_one_clear_line(done, EXIT_USAGE, "vramkit help: one command at a time, "
                                                "not 2 words")
        assert done.stdout == ""
    for words in (["help"], ["help", "help"], ["help", "--help"]):
        done = run(*words)
        assert done.returncode == 0 and done.stdout.startswith("usage: vramkit COMMAND")
        assert "estimate" in done.stdout  # the Python subcommands are listed too


@pytest.mark.parametrize("command", ["plot", "doctor"])
def test_a_trace_error_names_the_file_escaped_once(command, tmp_path):
    """The engine's message quotes the refused byte as an escape already; the file's name is
    escaped here, and nothing twice (\\x5cx1b would be a byte the file does not hold)."""
    path = tmp_path / "c\x1bd.trace"
    path.write_bytes(b"# vramkit-trace v1\na 1 \x1b[31m 0 0\n")
    done = run(command, path, "-o", tmp_path / "out.html") if command == "plot" \
        else run(command, path)
    assert_one_clear_line(done, EXIT_BAD_INPUT,
                          "c\\x1bd.trace:2: a control byte ('\\x1b') at column 5")
    assert "\x1b" not in done.stderr and "\\x5c" not in done.stderr


def test_the_doctors_report_shows_a_file_name_escaped(tmp_path):
    path = tmp_path / "e\x1b[2Jf.trace"
    path.write_text(TRACE)
    done = run("doctor", path, "--capacity", "1K")
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout
    assert done.stdout.startswith("vramkit doctor: trace e\\x1b[2Jf (4 ops)\n"), done.stdout


@pytest.mark.parametrize("command", ["plot", "doctor"])
def test_a_small_gzip_that_decompresses_to_much_more_is_refused(command, tmp_path):
    """A snapshot is read whole: a gzip file of repeated bytes would be gigabytes in
    memory. Past 64 times its size (and 64 MiB) it is refused, and says how to read it."""
    import gzip

    path = tmp_path / "bomb.pickle.gz"
    with gzip.open(path, "wb") as f:
        f.write(b"\x80\x04")
        for _ in range(96):
            f.write(bytes(1 << 20))
    assert path.stat().st_size * 64 < (96 << 20)
    done = run(command, path, "-o", tmp_path / "out.html") if command == "plot" \
        else run(command, path)
    assert_one_clear_line(done, EXIT_BAD_INPUT, "bomb.pickle.gz: decompresses to more than ",
                          "gunzip it first")
    assert not (tmp_path / "out.html").exists()


@pytest.mark.parametrize("args, expected", [
    (["doctor", "{trace}", "--capacity", "-1G"], "--capacity: expected a size above 0"),
    (["top", "--interval", "-1e3"], "--interval: expected seconds"),
    (["plot", "{trace}", "-o", "x.html", "--max-ops", "-5K"], "--max-ops: expected a number"),
    (["plot", "{trace}", "-o", "x.html", "--device", "-1"], "--device: expected a device"),
])
def test_a_negative_value_is_refused_as_a_value_not_missing(args, expected, trace):
    """'-1G' is a value given, not an option: 'needs a value' would not be true."""
    done = run(*[str(trace) if a == "{trace}" else a for a in args])
    assert_one_clear_line(done, EXIT_USAGE, expected, f"got '{args[-1]}'")
    assert "needs a value" not in done.stderr


@pytest.mark.parametrize("option, value, expected", [
    ("--cap", "0", "--cap must be a size above 0 like '24G', not '0'"),
    ("--device-memory", "0", "--device-memory must be a size above 0"),
    ("--cap", "1X", "--cap: '1X' is not a size: unknown unit"),
    ("--device-memory", "100000T", "--device-memory of 109,951,162,777,600,000 bytes is more "
                                   "than the largest device vramkit models"),
])
def test_estimate_names_the_size_option_it_refuses(option, value, expected):
    """Named by the option the user typed, not by estimate()'s keyword, before any model
    is built."""
    done = run("estimate", "--model", "gpt2", option, value)
    assert_one_clear_line(done, EXIT_USAGE, expected)
    assert "estimate()" not in done.stderr and "memory_limit" not in done.stderr


@pytest.mark.parametrize("args, expected", [
    (["bo\x1b[2Jgus"], "unknown command 'bo\\x1b[2Jgus'"),
    (["help", "x\u202ey"], "unknown command 'x\\xe2\\x80\\xaey'"),
    (["replay", "--b\x1bx"], "unknown option '--b\\x1bx'"),
    (["replay", "--capacity", "1\x1bG"], "'1\\x1bG' is not a size"),
    (["replay", "--source", "\x1b"], "unknown source '\\x1b'"),
    (["bench", "\x07"], "unknown benchmark '\\x07'"),
    (["bench", "pair", "--b\x1bx"], "unknown argument '--b\\x1bx'"),
])
def test_the_c_command_shows_its_arguments_escaped(args, expected):
    done = run(*args)
    assert_one_clear_line(done, EXIT_USAGE, expected)
    assert not any(c in done.stderr for c in "\x1b\x07\u202e")


def test_replay_shows_trace_names_escaped(tmp_path):
    bad = tmp_path / "c\x1bd.trace"
    bad.write_bytes(b"# vramkit-trace v1\na 1 \x1b[31m 0 0\n")
    done = run("replay", bad)
    assert_one_clear_line(done, EXIT_BAD_INPUT,
                          "c\\x1bd.trace:2: a control byte ('\\x1b') at column 5")
    assert "\x1b" not in done.stderr
    good = tmp_path / "e\x1b[2Jf.trace"
    good.write_text(TRACE)
    done = run("replay", "--repeat", "1", good)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout
    assert done.stdout.splitlines()[1].startswith("e\\x1b[2Jf "), done.stdout


def test_export_shows_an_address_and_an_nvml_path_escaped(tmp_path):
    done = run("export", "--address", "no\x1b[2Jwhere", "--port", "0")
    assert_one_clear_line(done, EXIT_FAILURE, "cannot listen on no\\x1b[2Jwhere: ")
    assert "\x1b" not in done.stderr
    done = run("export", "--once", env_extra={
        "VRAMKIT_NVML_LIBRARY": str(tmp_path / "lib\x1b[2J.so"),
        "VRAMKIT_PUBLISH_DIR": str(tmp_path / "records")})
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout
    assert "# vramkit: no GPU figures: the NVML library " in done.stdout
    assert "lib\\x1b[2J.so" in done.stdout


@pytest.mark.parametrize("records, expected", [
    (['{"time": -1e308, "step": 0, "allocated": 5, "reserved": 10}',
      '{"time": 1e308, "step": 1, "allocated": 5, "reserved": 10}'],
     "log.jsonl:1: 'time' is not a time in seconds: -1e+308"),
    (['{"time": 0, "step": 0, "allocated": 5, "reserved": 10, "device": [1]}'],
     "log.jsonl:1: 'device' is not a device number: [1]"),
    (['{"time": 0, "step": 0, "allocated": 5, "reserved": 10, "device": %d}' % 2**70],
     f"log.jsonl:1: 'device' is not a device number: {2**70}"),
    (['{"time": 0, "step": 0, "allocated": 5, "reserved": 10, "x": %s%s}'
      % ("[" * 100_000, "]" * 100_000)],
     "log.jsonl:1: not a JSON record: nested deeper than a record ever is"),
    (["time,step,allocated,reserved", "0,0,5\x00,10"],
     "log.jsonl:2: 'allocated' is not a number: '5\\x00'"),
    (["time,step,allocated,reserved", "0,0,%s,10" % ("9" * 5000)],
     "log.jsonl:2: 'allocated' is not a number: '%s'" % ("9" * 40)),
])
def test_a_log_with_values_it_cannot_draw_is_refused(records, expected, tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(records) + "\n")
    done = run("plot", path, "-o", tmp_path / "out.html")
    assert_one_clear_line(done, EXIT_BAD_INPUT, expected)
    assert not (tmp_path / "out.html").exists()


def test_gzip_with_bytes_after_its_end_reads_alike_everywhere(tmp_path):
    """zlib's gzread, the trace reader's, reads gzip members one after another and
    ignores bytes after the last that begin no member, as `gzip -d` does; plot and doctor
    read a file's head with Python's gzip, which refused them: a trace replay took was
    refused by plot as corrupt, its message escaping Python's repr a second time."""
    import gzip

    path = tmp_path / "tail.trace.gz"
    path.write_bytes(gzip.compress(TRACE[:30].encode()) + gzip.compress(TRACE[30:].encode())
                     + b";\x1e and then some")
    for args in (["replay", "--repeat", "1", path], ["plot", path, "-o", tmp_path / "o.html"],
                 ["doctor", path]):
        done = run(*args)
        assert done.returncode == 0, (args, done.stderr)
    assert "4 " in run("replay", "--repeat", "1", path).stdout.splitlines()[1]
    cut = tmp_path / "cut.trace.gz"
    cut.write_bytes(path.read_bytes()[:25])
    assert_one_clear_line(run("plot", cut, "-o", tmp_path / "o.html"), EXIT_BAD_INPUT,
                          "cut.trace.gz: cannot decompress (corrupt or truncated gzip)")


def test_a_count_of_ops_past_what_replay_takes_is_a_usage_error(trace, tmp_path):
    done = run("plot", trace, "-o", tmp_path / "o.html", "--max-ops", str(1 << 63))
    assert_one_clear_line(done, EXIT_USAGE, "--max-ops: expected a number of ops")
    from vramkit.plot import _read
    with pytest.raises(ValueError, match="max_ops must be an int"):
        _read.parse_trace(str(trace), 1 << 63)


def test_a_capacity_past_the_largest_device_modelled_is_a_usage_error(trace):
    """It was refused as a bad input file (2), in the host model's words."""
    done = run("doctor", trace, "--capacity", "300T")
    assert_one_clear_line(done, EXIT_USAGE, "--capacity: 329,853,488,332,800 bytes is more "
                          "than the largest device vramkit models (256 TiB)")
    assert run("doctor", trace, "--capacity", "256T").returncode == 0


def test_after_a_double_dash_every_argument_is_a_file(tmp_path):
    """As for the C command, and as POSIX utilities read it: a file named like an option
    is given after '--' (it was 'unknown option'), and an option's name there is a file."""
    dashed = tmp_path / "-x.trace"
    dashed.write_text(TRACE)
    done = subprocess.run([str(installed_script()), "doctor", "--", dashed.name],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "trace -x (4 ops)" in done.stdout, done.stderr
    done = subprocess.run([str(installed_script()), "plot", "-o", "o.html", "--", dashed.name],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and (tmp_path / "o.html").exists(), done.stderr
    assert_one_clear_line(run("doctor", "--", "--json"), EXIT_BAD_INPUT,
                          "--json: cannot read: No such file or directory")
    assert_one_clear_line(run("top", "--", "x"), EXIT_USAGE, "unexpected argument 'x'")


@pytest.mark.parametrize("device", ["\u0661", str(1 << 31)])
def test_a_device_number_is_ascii_digits_of_a_c_int(device, trace, tmp_path):
    """An Arabic-Indic one was taken as device 1; 2**31 or more was taken, then not found."""
    done = run("plot", trace, "-o", tmp_path / "x.html", "--device", device)
    assert_one_clear_line(done, EXIT_USAGE, "--device: expected a device number")


def test_a_block_in_a_state_pytorch_never_writes_is_refused_by_the_doctor(tmp_path):
    """It counted neither as allocated nor as free: a diagnosis of figures that do not add
    up, given without a word."""
    snapshot = {"segments": [{"device": 0, "address": 0, "total_size": 2 << 20,
                              "allocated_size": 0, "active_size": 0, "stream": 0,
                              "segment_type": "large",
                              "blocks": [{"size": 2 << 20, "state": "x\x1b"}]}],
                "device_traces": [[]]}
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(snapshot))
    done = run("doctor", path)
    assert_one_clear_line(done, EXIT_BAD_INPUT, "odd.json: segments[0].blocks[0] is in state "
                          "'x\\x1b', none PyTorch writes")


def test_a_file_of_no_kind_it_reads_is_told_what_it_reads(tmp_path):
    """A pickle of protocol 0 was told it was not "a pickle or JSON"."""
    import pickle

    path = tmp_path / "old.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": []}, protocol=0))
    done = run("doctor", path)
    assert_one_clear_line(done, EXIT_BAD_INPUT, "old.pickle: not a vramkit trace",
                          "a pickle of protocol 2 or later")


def test_top_with_a_folder_that_is_not_there_says_so(tmp_path):
    """'no vramkit process to show' would not be true of a folder mistyped: it is unread."""
    for folder, why in ((tmp_path / "typo", "no such folder"), (Path(__file__), "not a folder")):
        done = run("top", "--once", "--dir", folder)
        assert_one_clear_line(done, EXIT_USAGE, f"--dir {folder}: {why}")
        assert done.stdout == ""


def test_malformed_snapshot_entries_are_counted_not_blamed_on_the_recorder(tmp_path):
    """Entries that are not records are skipped and counted; they do not make the plot say
    the history lacks times (as PyTorch before 2.2 writes it) when every record has one."""
    import pickle

    entry = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 10,
             "frames": []}
    snapshot = {"segments": [], "device_traces": [[entry, "junk", 5, None]]}
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    done = run("plot", path, "-o", tmp_path / "out.html")
    assert done.returncode == 0, done.stderr
    assert "skipped 3 malformed trace entries" in done.stderr
    assert "time_us" not in done.stderr, done.stderr


def test_a_bad_variable_value_is_shown_escaped_by_the_c_command():
    done = run("replay", "--repeat", "1", "x.trace", env_extra={"VRAMKIT_SOURCE": "\x1b[2J"})
    assert_one_clear_line(done, EXIT_USAGE, "VRAMKIT_SOURCE: '\\x1b[2J' is not a source")
    assert "\x1b" not in done.stderr


def test_replay_of_a_directory_says_it_cannot_open_it(tmp_path):
    """Not 'cannot decompress': nothing was decompressed."""
    done = run("replay", tmp_path)
    assert_one_clear_line(done, EXIT_BAD_INPUT, f"{tmp_path}: cannot open: Is a directory")


def test_doctor_refuses_a_capacity_the_snapshot_shows_is_not_the_devices(tmp_path):
    """Reserved and free on device are the snapshot's; a capacity below their sum would put
    figures side by side that cannot both be true."""
    import pickle

    block = {"address": 0, "size": 2 << 20, "requested_size": 2 << 20,
             "state": "active_allocated", "frames": []}
    segment = {"device": 0, "address": 0, "total_size": 2 << 20, "allocated_size": 2 << 20,
               "active_size": 2 << 20, "stream": 0, "segment_type": "large", "blocks": [block]}
    oom = {"action": "oom", "addr": 0, "size": 1 << 30, "stream": 0, "time_us": 1,
           "device_free": 1 << 30, "frames": []}
    path = tmp_path / "oom.pickle"
    path.write_bytes(pickle.dumps({"segments": [segment], "device_traces": [[oom]]}))
    assert run("doctor", path, "--capacity", "2G").returncode == 0
    done = run("doctor", path, "--capacity", "1G")
    assert_one_clear_line(done, EXIT_USAGE, "capacity 1.0 GiB is less than the snapshot's "
                          "reserved 2.0 MiB and free on device 1.0 GiB together")
    assert done.stdout == ""


def _small_file_limit():
    """In the child: files may not grow past 4 KiB, and passing it is an error (EFBIG), not
    the signal that would end the process: a disk that fills up mid-write."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def test_a_plot_that_cannot_be_written_whole_leaves_the_old_file(trace, tmp_path):
    out = tmp_path / "out.html"
    out.write_text("the page drawn before")
    done = run("plot", trace, "-o", out, preexec_fn=_small_file_limit)
    assert_one_clear_line(done, EXIT_FAILURE, "cannot write: File too large")
    assert out.read_text() == "the page drawn before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.html", "small.trace"]


def test_replay_json_escapes_every_character_past_ascii(tmp_path):
    """A bidi override or a C1 control in a trace's name reaches a terminal that shows the
    JSON only as a \\u escape; a JSON reader gets the name back (U+FFFD for a bad byte)."""
    name = b"\xe2\x80\xaeab\xf0\x9f\x98\x80\x7f\xc2\x85caf\xc3\xa9\xff.trace"
    path = tmp_path / os.fsdecode(name)
    path.write_text(TRACE)
    done = run("replay", "--json", "--repeat", "1", path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.isascii(), done.stdout
    assert json.loads(done.stdout)["trace"] == "\u202eab\U0001F600\x7f\x85caf\u00e9\ufffd"


def test_a_python_subcommand_warns_of_a_mistyped_variable(tmp_path):
    """VRAMKIT_PUBLISH_DRI would leave `vramkit top` on the default folder without a word."""
    done = run("top", "--once", env_extra={"VRAMKIT_PUBLISH_DRI": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stderr == ("vramkit: warning: VRAMKIT_PUBLISH_DRI is not a vramkit variable "
                           "and is ignored; did you mean VRAMKIT_PUBLISH_DIR?\n")


@pytest.mark.parametrize("sizes", ["64K,", ",64K", "64K,,2M"])
def test_bench_pair_refuses_a_size_left_out_of_its_list(sizes):
    done = run("bench", "pair", "--sizes", sizes)
    assert_one_clear_line(done, EXIT_USAGE, f"--sizes: bad list '{sizes}'")
    assert done.stdout == ""


def test_a_bad_variable_from_the_environment_is_quoted_escaped_in_the_exception():
    # The value is foreign text: a terminal escape in it must not reach the user's terminal.
    done = subprocess.run(
        [sys.executable, "-c", "import vramkit\ntry:\n    vramkit.empty(10)\n"
         "except vramkit.ConfigError as e:\n    print(e)"],
        env=dict(os.environ, VRAMKIT_LIMIT="\x1b[31mred", VRAMKIT_SOURCE="sim"),
        capture_output=True, text=True, timeout=60)
    assert "VRAMKIT_LIMIT: '\\x1b[31mred' is not a limit" in done.stdout, done.stdout
    assert "\x1b" not in done.stdout + done.stderr


def test_a_mistyped_variable_with_a_control_character_is_named_escaped():
    done = run("top", "--once", env_extra={"VRAMKIT_LI\x1bMIT": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stderr == ("vramkit: warning: VRAMKIT_LI\\x1bMIT is not a vramkit variable "
                           "and is ignored; did you mean VRAMKIT_LIMIT?\n")

"""The installed ``vramkit`` script: the same command as the C tool, plus Python subcommands.

These tests install nothing: they run the script that installing the package put next to
this interpreter (or on the PATH), as a pip user would, and hold it to the C tool's
contract: replay's JSON keys, the help, and the exit status of each kind of error as the
help itself states it. The C command the script hands over to is run directly beside it,
to show that both give the same answers.
"""

import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import vramkit.cli

MiB = 1 << 20
TRACES = sorted((Path(__file__).resolve().parents[2] / "data" / "traces").glob("*.trace.gz"))

# The keys every replay --json object has (the replay contract), and skipped_frees.
REPLAY_KEYS = {"trace", "source", "ops", "peak_live_bytes", "peak_reserved_bytes",
               "reserved_over_live", "ns_per_op", "ooms", "skipped_frees"}


def installed_script() -> Path:
    beside = Path(sys.executable).with_name("vramkit")
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("vramkit")
    if found is None:
        pytest.fail("no installed `vramkit` script beside this interpreter or on the PATH: "
                    "install the package first (make pytest does)", pytrace=False)
    return Path(found)


def run(program, *args, cwd=None):
    # The sim source at its default size: conftest's smaller sim device would not hold the
    # shipped traces, and a GPU, where there is one, is not what these tests are about.
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMKIT_")}
    env["VRAMKIT_SOURCE"] = "sim"
    return subprocess.run([str(program), *map(str, args)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def exit_statuses(help_text: str) -> dict[str, int]:
    """The "Exit status:" part of a help text, as {first words of the meaning: status}."""
    part = help_text.split("Exit status:", 1)[1]
    return {meaning.strip(): int(code)
            for code, meaning in re.findall(r"^  (\d)  ([a-z ]+)", part, re.MULTILINE)}


@pytest.fixture(scope="module")
def script():
    return installed_script()


@pytest.fixture(scope="module")
def binary():
    path = vramkit.cli.binary_path()
    assert os.access(path, os.X_OK), f"the package has no C command at {path}"
    return path


def test_replay_json_on_the_shipped_traces(script):
    assert len(TRACES) >= 3, "data/traces should hold the example traces"
    done = run(script, "replay", "--json", "--repeat", "1", *TRACES)
    assert done.returncode == 0, done.stderr
    objects = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert [o["trace"] for o in objects] == [t.name.removesuffix(".trace.gz") for t in TRACES]
    for result in objects:
        assert REPLAY_KEYS <= result.keys(), REPLAY_KEYS - result.keys()
        assert result["source"] == "sim"
        assert result["ops"] > 0 and result["ooms"] == 0 and result["skipped_frees"] >= 0
        assert result["peak_reserved_bytes"] >= result["peak_live_bytes"] > 0
        assert result["reserved_over_live"] == pytest.approx(
            result["peak_reserved_bytes"] / result["peak_live_bytes"], abs=1e-3)


def test_a_replay_that_ran_out_of_memory_has_no_reserved_over_live(script):
    # Under a cap the trace's peak live was never held (ops were refused): its ratio to
    # what was reserved read 0.842 for BERT at 600M, beside PyTorch's 1.929 by --compare,
    # as if vramkit held less than what was live. The text shows "-", the JSON null, and
    # vramkit.replay() None, as for a pool never made.
    bert = [t for t in TRACES if t.name.startswith("bert")][0]
    done = run(script, "replay", "--json", "--repeat", "1", "--capacity", "600M", str(bert))
    assert done.returncode == 1, done.stderr  # out of memory
    result = json.loads(done.stdout)
    assert result["ooms"] > 0 and result["peak_reserved_bytes"] < result["peak_live_bytes"]
    assert result["reserved_over_live"] is None
    text = run(script, "replay", "--repeat", "1", "--capacity", "600M", "--compare",
               str(bert)).stdout
    rows = [line.split() for line in text.splitlines() if line.startswith("bert")]
    assert rows and all("-" in row and "0.842" not in row for row in rows), text
    in_process = vramkit.replay(str(bert), capacity="600M")
    assert in_process["ooms"] > 0 and in_process["reserved_over_live"] is None
    # Without the cap the ratio is there as ever.
    free = vramkit.replay(str(bert))
    assert free["ooms"] == 0 and free["reserved_over_live"] > 1


def test_help_lists_c_and_python_subcommands(script, binary):
    done = run(script, "--help")
    assert done.returncode == 0, done.stderr
    commands = done.stdout.split("commands:\n", 1)[1].split("\n\n", 1)[0]
    names = [line.split()[0] for line in commands.splitlines()]
    for name in ("replay", "bench", *vramkit.cli.COMMANDS):
        assert name in names, f"{name} missing from:\n{commands}"
    # The rest of the text is the C command's own, the exit statuses included.
    c_help = run(binary, "--help").stdout
    assert exit_statuses(done.stdout) == exit_statuses(c_help)
    for line in c_help.splitlines():
        assert line in done.stdout.splitlines()


def test_subcommand_help_is_the_c_commands(script, binary):
    for args in (["replay", "--help"], ["bench", "pair", "--help"], ["help", "replay"]):
        mine, theirs = run(script, *args), run(binary, *args)
        assert mine.returncode == theirs.returncode == 0, mine.stderr
        assert mine.stdout == theirs.stdout
        assert "usage: vramkit" in mine.stdout


def test_error_exit_statuses_follow_the_help(script, binary, tmp_path):
    statuses = exit_statuses(run(script, "--help").stdout)
    empty = tmp_path / "empty.trace"
    empty.write_text("")
    cases = [
        (statuses["bad input file"], ["replay", empty], "empty.trace: empty file"),
        (statuses["bad command line"], ["replay", "--capacity"], "--capacity needs a value"),
        (statuses["bad command line"], ["no-such-command"], "unknown command"),
    ]
    for status, args, message in cases:
        mine, theirs = run(script, *args), run(binary, *args)
        assert mine.returncode == theirs.returncode == status, (args, mine.stderr)
        assert message in mine.stderr and mine.stderr == theirs.stderr


def test_every_subcommand_refuses_a_bad_variable_as_the_c_command_does(script, tmp_path):
    """A VRAMKIT_* value the engine refuses is a bad command line (3) in every subcommand,
    named with its value, as the C command has it, whether or not the run makes a pool;
    asking for help or the version reads no variable."""
    trace = TRACES[0]
    commands = (["doctor", trace], ["plot", trace, "-o", tmp_path / "p.html"],
                ["top", "--once"], ["export", "--once"],
                ["estimate", "--model", "gpt2", "--batch", "1", "--seq", "8"],
                ["replay", "--repeat", "1", trace])
    for variable, value in (("VRAMKIT_LIMIT", "1X"), ("VRAMKIT_LEAK_REPORT", "maybe")):
        env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMKIT_")}
        env[variable] = value
        for args in commands:
            done = subprocess.run([str(script), *map(str, args)], env=env,
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 3, (args, done.stderr)
            assert f"{variable}: '{value}' is not a" in done.stderr, (args, done.stderr)
            assert "Traceback" not in done.stderr
        for args in (["version"], ["doctor", "--help"], ["estimate", "-h"]):
            done = subprocess.run([str(script), *args], env=env, capture_output=True,
                                  text=True, timeout=300)
            assert done.returncode == 0, (args, done.stderr)


def test_python_m_vramkit_is_the_same_command(script):
    as_module = run(sys.executable, "-m", "vramkit", "replay", "--capacity")
    as_script = run(script, "replay", "--capacity")
    assert as_module.returncode == as_script.returncode == 3
    assert as_module.stderr == as_script.stderr


def test_version_subcommand_agrees_with_the_c_command(script, binary):
    done = run(script, "version")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == run(binary, "--version").stdout.strip() == f"vramkit {vramkit.__version__}"
    assert lines[2] == f"command: {binary}"
    wrong = run(script, "version", "extra")
    assert wrong.returncode == 3 and "unexpected argument 'extra'" in wrong.stderr


def test_one_exit_status_table_for_c_and_python(script):
    """The help's table is the one the Python subcommands use, row by row."""
    statuses = exit_statuses(run(script, "--help").stdout)
    cli = vramkit.cli
    assert statuses == {"success": cli.EXIT_OK, "out of memory": cli.EXIT_DOES_NOT_FIT,
                        "bad input file": cli.EXIT_BAD_INPUT,
                        "bad command line": cli.EXIT_USAGE, "failure": cli.EXIT_FAILURE,
                        "missing optional package": cli.EXIT_MISSING_DEPENDENCY}
    assert cli.EXIT_BROKEN_PIPE == 141 and "quietly with 141" in run(script, "--help").stdout
    for name in cli.COMMANDS:
        text = run(script, name, "--help").stdout
        assert "vramkit --help" in text or name in ("version", "top", "export"), name


def test_every_python_subcommand_parses_in_one_style(script):
    """One parser style: an unknown option, an option without its value or a bad value is
    one line on stderr naming the command and its help, exit 3, nothing on stdout; --help
    is the command's help on stdout, exit 0."""
    for name in vramkit.cli.COMMANDS:
        for args, says in ((["--frobnicate"], "unknown option '--frobnicate'"),
                           (["--frob=1"], "unknown option '--frob=1'")):
            done = run(script, name, *args)
            assert done.returncode == vramkit.cli.EXIT_USAGE, (name, args, done.stderr)
            assert done.stdout == "" and done.stderr.count("\n") == 1, (name, done.stderr)
            assert done.stderr.startswith(f"vramkit {name}: {says}"), (name, done.stderr)
            assert done.stderr.endswith(f"(see vramkit {name} --help)\n"), done.stderr
        helped = run(script, name, "--help")
        assert helped.returncode == 0 and helped.stderr == "", (name, helped.stderr)
        assert helped.stdout.startswith(f"usage: vramkit {name}"), (name, helped.stdout)
    for name, args, says in (("top", ["--interval"], "--interval needs a value"),
                             ("plot", ["t.trace", "-o"], "--output needs a value"),
                             ("plot", ["--device", "x"], "--device: expected a device number, "
                                                         "got 'x'"),
                             ("doctor", ["--capacity", "0"], "--capacity: expected a size"),
                             ("estimate", ["--batch", "x"], "--batch: expected a whole number"),
                             ("version", ["extra"], "unexpected argument 'extra'")):
        done = run(script, name, *args)
        assert done.returncode == 3 and done.stderr.count("\n") == 1, (name, done.stderr)
        assert done.stderr.startswith(f"vramkit {name}: {says}"), (name, done.stderr)


def test_a_closed_stdout_ends_quietly(script, tmp_path):
    """`vramkit ... | head -1` where head has gone: no traceback, the SIGPIPE status."""
    snap = tmp_path / "s.pickle"
    snap.write_bytes(pickle.dumps({"segments": [], "device_traces": []}))
    read, write = os.pipe()
    os.close(read)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMKIT_")}
    try:
        for args in (["top", "--once"], ["version"], ["doctor", snap],
                     *([name, "--help"] for name in vramkit.cli.COMMANDS)):
            done = subprocess.run([str(script), *map(str, args)], stdout=write,
                                  stderr=subprocess.PIPE, text=True, env=env, timeout=120)
            assert (done.returncode, done.stderr) == (141, ""), args
        # The usage is the C command's own, which SIGPIPE ends as it ends any C tool: a shell
        # reports 128 + SIGPIPE, the 141 of the table, for both.
        done = subprocess.run([str(script), "--help"], stdout=write, stderr=subprocess.PIPE,
                              text=True, env=env, timeout=120)
        assert (done.returncode, done.stderr) == (-signal.SIGPIPE, "")
    finally:
        os.close(write)


def test_replay_json_escapes_a_name_that_is_not_utf8(script, tmp_path):
    name = os.fsencode(tmp_path) + b"/caf\xe9 \xff\xfe\x01.trace"
    with open(name, "wb") as f:
        f.write(b"# vramkit-trace v1\na 0 4096 0 1\nf 0 0 2\n")
    done = subprocess.run([str(script), "replay", "--json", "--repeat", "1", name],
                          capture_output=True, env={**os.environ, "VRAMKIT_SOURCE": "sim"})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.decode("utf-8"))  # strict: the JSON is UTF-8
    assert result["trace"] == "caf\ufffd \ufffd\ufffd\u0001"


def test_a_replay_whose_pool_was_never_made_shows_no_time_or_ratio(script, tmp_path):
    """A preallocation past the capacity: the pool never exists and no op runs, so the row
    has no time per op and no reserved-over-live (null, "-"), not a measured-looking 0."""
    path = tmp_path / "t.trace"
    path.write_text("# vramkit-trace v1\na 1 8388608 0 1\nf 1 0 2\n")
    env = {**os.environ, "VRAMKIT_SOURCE": "sim", "VRAMKIT_PREALLOCATE": "128M"}
    args = [str(script), "replay", "--capacity", "64M", "--warm", "--baseline"]
    done = subprocess.run([*args, "--json", str(path)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 1, done.stderr
    row = json.loads(done.stdout)
    assert (row["ooms"], row["peak_reserved_bytes"]) == (1, 0)
    for key in ("reserved_over_live", "ns_per_op", "ns_per_op_warm", "ns_over_baseline",
                "warm_over_baseline"):
        assert row[key] is None, key
    table = subprocess.run([*args, str(path)], capture_output=True, text=True, env=env,
                           timeout=120)
    # trace source ops peak-live MiB peak-reserved MiB res/live ns/op ooms warm-ns/op
    # baseline-ns x-baseline (the baseline's own time is measured: it needs no pool)
    cells = table.stdout.splitlines()[1].split()
    assert cells[7:10] + cells[10:11] + cells[12:] == ["-", "-", "1", "-", "-"], cells
    timed = subprocess.run([*args, "--json", str(path)], capture_output=True, text=True,
                           env={**env, "VRAMKIT_PREALLOCATE": "16M"}, timeout=120)
    row = json.loads(timed.stdout)
    assert row["ooms"] == 0 and row["ns_per_op"] > 0 and row["reserved_over_live"] == 2.0


def test_bench_scale_json_holds_the_figures_its_text_prints(script):
    # The text printed each case's live bytes and peak reserved, which --json left out; and
    # both said "passes of 101 ops" of passes that timed 100 (whole free+alloc steps).
    args = ["bench", "scale", "--small", "10", "--large", "100", "--ops", "101"]
    text = run(script, *args)
    done = run(script, *args, "--json")
    assert text.returncode == 0 and done.returncode == 0, text.stderr + done.stderr
    row = json.loads(done.stdout)
    assert "passes of 100 ops" in text.stdout and row["ops"] == 100, text.stdout
    cases = re.findall(r"(\d+) live blocks \( *([\d.]+) MiB live, *([\d.]+) MiB peak reserved\)",
                       text.stdout)
    assert [(int(n), float(live), float(res)) for n, live, res in cases] == [
        (row[f"live_{case}"], round(row[f"live_bytes_{case}"] / MiB, 1),
         round(row[f"peak_reserved_bytes_{case}"] / MiB, 1)) for case in ("small", "large")]


def test_names_in_messages_are_shown_escaped():
    assert vramkit.cli.shown(b"/tmp/caf\xe9\n\x1b[2J.trace") == "/tmp/caf\\xe9\\x0a\\x1b[2J.trace"
    assert vramkit.cli.shown("plain/é name") == "plain/é name"

"""Bad input to every `vramkit` subcommand but `estimate`: one clear line on stderr, the
exit status the help's table gives it, no traceback, and nothing printed that is not true.

Each test here is a case that once went wrong: output lost to a full disk reported as a
success, names escaped twice, an option's negative value taken for a missing one, raw
control characters in the exporter's labels, a small gzip file read into gigabytes.
The commands run as installed (the script beside this interpreter), as a user runs them.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli import installed_script

EXIT_BAD_INPUT, EXIT_USAGE, EXIT_FAILURE = 2, 3, 4
TRACE = "# vramkit-trace v1\na 1 1024 0 0\na 2 4096 0 1\nf 1 0 2\nf 2 0 3\n"


def run(*args, stdout=subprocess.PIPE, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMKIT_")}
    env["VRAMKIT_SOURCE"] = "sim"
    env.update(env_extra or {})
    return subprocess.run([str(installed_script()), *map(str, args)], env=env,
                          stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300)


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


def test_help_for_an_unknown_command_is_a_usage_error():
    done = run("help", "no-such-command")
    assert_one_clear_line(done, EXIT_USAGE, "unknown command 'no-such-command'")
    assert done.stdout == ""

"""bench/neighbours_check.py --cpu-check: issue 39's two trainers on a sim device both
processes share. A peaks at 60% of the device and goes on at 10%; B then asks for 60%.
With give-back on, A hands its idle cache to B and both finish, A's counters saying what
it gave and B's what it received; over its soft limit, A gives all its idle memory at the
first request; with A opted out (VRAMKIT_GIVE_BACK=0), B runs out of
memory at its first step and nothing changes hands."""

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).resolve().parents[2] / "bench" / "neighbours_check.py"


@functools.lru_cache(maxsize=None)
def cpu_check() -> dict:
    done = subprocess.run([sys.executable, str(CHECK), "--cpu-check", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    return {arm["arm"]: arm["roles"] for arm in report["arms"]}


def test_give_back_on_both_finish():
    roles = cpu_check()["give-back on"]
    a, b = roles["A"], roles["B"]
    assert a["outcome"] == "finished" and b["outcome"] == "finished", roles
    # The gap was real: what both reserved at their peaks is more than the device.
    assert a["peak_reserved"] + b["peak_reserved"] > a["device_total"]
    assert a["giveback_given_count"] >= 1 and a["giveback_given_bytes"] > 0
    assert a["giveback_requests"] == 0
    assert b["giveback_requests"] >= 1
    # A was B's only neighbour: every byte it gave, B received.
    assert b["giveback_received_bytes"] == a["giveback_given_bytes"]
    assert b["giveback_given_count"] == 0
    assert b["steps"] == 5 and b["asking_steps"] >= 1
    # The asker counted time spent waiting for the answers; the one asked waited for none.
    assert b["giveback_wait_us"] > 0 and a["giveback_wait_us"] == 0


def test_over_its_soft_limit_the_neighbour_gives_all_its_idle_memory_at_once():
    arms = cpu_check()
    roles, asked_each_time = arms["give-back on, A's soft limit 10%"], arms["give-back on"]
    a, b = roles["A"], roles["B"]
    assert a["outcome"] == "finished" and b["outcome"] == "finished", roles
    assert b["giveback_requests"] == 1 and a["giveback_given_count"] == 1
    assert b["giveback_received_bytes"] == a["giveback_given_bytes"]
    # More than B's first request asked for: everything A held idle.
    assert a["giveback_given_bytes"] > asked_each_time["A"]["giveback_given_bytes"]
    assert asked_each_time["B"]["giveback_requests"] > 1


def test_give_back_off_the_neighbour_runs_out():
    roles = cpu_check()["give-back off"]
    a, b = roles["A"], roles["B"]
    assert a["outcome"] == "finished", roles
    assert b["outcome"] == "oom" and b["oom_step"] == 0, roles
    assert b["message"].startswith("vramkit: out of memory")
    assert a["giveback_given_count"] == 0 and a["giveback_given_bytes"] == 0
    assert b["giveback_received_bytes"] == 0
    # With its only neighbour opted out, B had nobody to ask, nor waited.
    assert b["giveback_requests"] == 0 and b["giveback_wait_us"] == 0
    # A kept its peak's cache: B could not reserve what it needed beside it.
    assert b["peak_reserved"] < b["bytes_large"]


@pytest.mark.parametrize("bad, says", [
    (["--fraction-a", "1.5"], "fractions must lie between 0 and 1"),
    (["--steps", "0"], "--steps, --peak-steps and --seq must be at least 1"),
    (["--give-back-timeout-ms", "20000"], "--give-back-timeout-ms must lie between"),
    (["--sim-capacity", "banana"], "--sim-capacity: 'banana' is not a size"),
])
def test_bad_input_is_refused_without_a_traceback(bad, says):
    done = subprocess.run([sys.executable, str(CHECK), "--cpu-check", *bad],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert says in done.stderr
    assert "Traceback" not in done.stderr


def test_unknown_arm_is_refused_without_a_traceback():
    done = subprocess.run([sys.executable, str(CHECK), "--arms", "torch+nothing"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "no arm torch+nothing" in done.stderr and "Traceback" not in done.stderr

"""Neighbours that give cached memory back (issue 39), seen from Python: two processes on a
sim device they share (VRAMKIT_SIM_SHARED); the one about to run out gets the other's idle
cache, memory_stats says so on both sides, and `vramkit top` shows who gave it."""
import json
import os
import subprocess
import sys
import textwrap

from helpers import MiB
from test_top import publish, top  # noqa: F401  (publish is a fixture)

HOLDER = """
    import json, sys, vramkit
    kept = [vramkit.empty(8 << 20) for _ in range(6)]
    del kept[1:5]  # 32 MiB cached, 16 MiB live
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(vramkit.memory_stats_raw()), flush=True)
    sys.stdin.readline()
"""

ASKER = """
    import json, vramkit
    block = vramkit.empty(36 << 20)  # the device has 16 MiB free
    print(json.dumps(vramkit.memory_stats_raw()), flush=True)
"""


def sim_env(publish_dir, **more) -> dict:
    env = dict(os.environ, VRAMKIT_SOURCE="sim", VRAMKIT_SIM_CAPACITY="64M",
               VRAMKIT_SIM_SHARED="pytest-giveback", VRAMKIT_PUBLISH_DIR=str(publish_dir))
    env.update(more)
    return env


def test_a_neighbour_gives_back_and_top_shows_it(publish):  # noqa: F811
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLDER)],
                              env=sim_env(publish), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        asked = subprocess.run([sys.executable, "-c", textwrap.dedent(ASKER)],
                               env=sim_env(publish), capture_output=True, text=True, timeout=60)
        assert asked.returncode == 0, asked.stderr
        asker_stats = json.loads(asked.stdout)
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder_stats = json.loads(holder.stdout.readline())
        assert asker_stats["giveback_requests"] == 1
        given = holder_stats["giveback_given_bytes"]
        assert given >= 20 * MiB and asker_stats["giveback_received_bytes"] == given
        assert holder_stats["giveback_given_count"] == 1
        shown = top(publish, "--once").stdout
        row = next(line for line in shown.splitlines()
                   if line.split()[:1] == [str(holder.pid)])
        assert row.split()[-1] == f"{given / MiB:.1f}M"  # GAVE
    finally:
        holder.kill()
        holder.wait()

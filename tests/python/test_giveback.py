"""Neighbours that give cached memory back (issue 39), seen from Python: two processes on a
sim device they share (VRAMKIT_SIM_SHARED); the one about to run out gets the other's idle
cache, memory_stats says so on both sides, and `vramkit top` shows who gave it. The
give-back settings as options of a private vramkit.Pool: opted out, a soft limit, a group
limit, and bad values refused by name."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import vramkit
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


# The same shapes with private pools whose give-back settings are Pool options (argv[1], as
# JSON); the environment names the shared device, and opts out the default pools only.
PRIVATE_HOLDER = """
    import json, sys, vramkit
    pool = vramkit.Pool(source="sim", capacity="64M", **json.loads(sys.argv[1]))
    kept = [pool.allocate(8 << 20) for _ in range(6)]
    del kept[1:5]  # 32 MiB cached, 16 MiB live
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(pool.stats()), flush=True)
"""

PRIVATE_ASKER = """
    import json, sys, vramkit
    pool = vramkit.Pool(source="sim", capacity="64M", **json.loads(sys.argv[1]))
    try:
        block = pool.allocate(int(sys.argv[2]))
        cause = None
    except vramkit.OutOfMemoryError as e:
        cause = e.oom_info["cause"]
    print(json.dumps(dict(pool.stats(), cause=cause)), flush=True)
"""


def private_pair(publish_dir, holder_options: dict, asker_options: dict, ask: int):
    """The holder's and the asker's statistics (the asker's with its OOM cause or None)."""
    env = sim_env(publish_dir, VRAMKIT_GIVE_BACK="0")  # no private pool reads it
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(PRIVATE_HOLDER),
                               json.dumps(holder_options)], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        asked = subprocess.run([sys.executable, "-c", textwrap.dedent(PRIVATE_ASKER),
                                json.dumps(asker_options), str(ask)],
                               env=env, capture_output=True, text=True, timeout=60)
        assert asked.returncode == 0, asked.stderr
        holder_stats, _ = holder.communicate("\n", timeout=60)
        return json.loads(holder_stats), json.loads(asked.stdout)
    finally:
        holder.kill()
        holder.wait()


def test_a_private_pool_opted_out_is_never_asked_and_never_gives(publish):  # noqa: F811
    holder, asker = private_pair(publish, {"give_back": False}, {}, 36 * MiB)
    assert asker["cause"] is not None  # out of memory beside the holder's idle cache
    assert asker["giveback_requests"] == 0 and asker["giveback_wait_us"] == 0
    assert holder["giveback_given_bytes"] == holder["giveback_given_count"] == 0


@pytest.mark.parametrize("soft_limit", [None, "16M"])
def test_over_its_soft_limit_a_private_pool_gives_all_its_idle_memory(publish,  # noqa: F811
                                                                       soft_limit):
    holder, asker = private_pair(publish, {"soft_limit": soft_limit}, {}, 36 * MiB)
    assert asker["cause"] is None and asker["giveback_requests"] == 1
    given = holder["giveback_given_bytes"]
    assert holder["giveback_given_count"] == 1 and asker["giveback_received_bytes"] == given
    if soft_limit is None:
        assert 20 * MiB <= given < 32 * MiB  # what was asked
    else:
        assert given == 32 * MiB  # all it held idle, at the first request


def test_a_private_pools_group_limit_as_a_share_of_the_device(publish):  # noqa: F811
    # 87.5% of 64 MiB: together at most 56 MiB; the holder's 48 and 12 more would pass it,
    # though the device has 16 MiB free.
    holder, asker = private_pair(publish, {"give_back": False}, {"group_limit": 0.875},
                                 12 * MiB)
    assert asker["cause"] == "group_limit"
    assert holder["giveback_given_bytes"] == 0


def test_bad_give_back_options_are_refused_and_the_pool_made_before_works():
    pool = vramkit.Pool(source="sim", capacity="64M", give_back=True, soft_limit="2G",
                        group_limit="80%", give_back_timeout=0)
    for bad in ({"give_back": "maybe"}, {"give_back": 1.5}, {"give_back_timeout": 20000},
                {"give_back_timeout": "1.5"}, {"group_limit": 0}, {"group_limit": "150%"},
                {"soft_limit": "-8G"}):
        with pytest.raises(vramkit.ConfigError, match=f"^{next(iter(bad))}: "):
            vramkit.Pool(source="sim", capacity="64M", **bad)
    with pytest.raises(vramkit.ConfigError, match="did you mean 'soft_limit'"):
        vramkit.Pool(source="sim", capacity="64M", soft_limt="2G")
    pool.allocate(MiB).free()
    assert pool.memory_allocated() == 0 and not pool.closed
    pool.close()


def test_a_bool_is_a_switch_value_only():
    with pytest.raises(TypeError, match="give_back_timeout must be a str, int or float"):
        vramkit.Pool(source="sim", capacity="64M", give_back_timeout=True)


def test_configure_sets_the_default_pools_give_back_options(publish):  # noqa: F811
    # The holder opts out through configure(), not the environment: the asker runs out of
    # memory beside its idle cache, and nothing changes hands.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import vramkit; vramkit.configure(0, give_back=False)\n" +
         textwrap.dedent(HOLDER)], env=sim_env(publish), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        asked = subprocess.run(
            [sys.executable, "-c", textwrap.dedent("""
                import json, vramkit
                try:
                    vramkit.empty(36 << 20)
                    print(json.dumps({"oom": False}))
                except vramkit.OutOfMemoryError:
                    print(json.dumps({"oom": True, **vramkit.memory_stats_raw()}))
            """)], env=sim_env(publish), capture_output=True, text=True, timeout=60)
        assert asked.returncode == 0, asked.stderr
        asker = json.loads(asked.stdout)
        holder.stdin.write("\n")
        holder.stdin.flush()
        given = json.loads(holder.stdout.readline())
    finally:
        holder.kill()
        holder.wait()
    assert asker["oom"] and asker["giveback_requests"] == 0
    assert given["giveback_given_bytes"] == 0


def test_configure_refuses_bad_give_back_options_by_name():
    for bad, error in (({"give_back": "no"}, TypeError), ({"give_back_timeout": 1.5}, TypeError),
                       ({"give_back_timeout": 20000}, vramkit.InvalidArgumentError),
                       ({"soft_limit": "-1G"}, ValueError), ({"group_limit": "150%"}, ValueError)):
        with pytest.raises(error, match=next(iter(bad))):
            vramkit.configure(7, source="sim", **bad)

"""Leak finding (vramkit/observe/leaks.py) on the sim source: leaks(since=mark) and leak_check name
the lines that allocated what is still live; LeakDetector stays quiet through 1,000
steady steps and names the line of a planted leak.

Each test runs in a fresh interpreter from a script file, so that the call sites are
real file:line pairs and no other test's recording is in the way.
"""

import json
import textwrap

import pytest


def run_script(tmp_path, code, run_python=None):
    import subprocess
    import sys
    import os

    from helpers import SIM_ENV

    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(code).lstrip("\n"))
    env = dict(os.environ, **SIM_ENV)
    proc = subprocess.run([sys.executable, "-W", "error::UserWarning", str(path)],
                          env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"script failed:\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    lines = path.read_text().splitlines()
    marks = {line.split("# MARK ")[1].strip(): i + 1 for i, line in enumerate(lines)
             if "# MARK " in line}
    return path, marks, proc.stdout


def test_leaks_since_a_mark_by_call_site(tmp_path):
    path, marks, out = run_script(tmp_path, """
        import json, vramkit
        before = vramkit.empty(1 << 20)          # before the mark: never a leak
        mark = vramkit.history_mark()
        def make_big():
            return vramkit.empty(3 << 20)         # MARK big
        kept = [make_big() for _ in range(2)]
        small = [vramkit.empty(1000) for _ in range(5)]  # MARK small
        for _ in range(10):
            vramkit.empty(4096).free()            # freed: not a leak
        report = vramkit.leaks(since=mark)
        print(json.dumps(report.as_dicts()))
        print(str(report))
    """)
    rows = json.loads(out.splitlines()[0])
    assert [(r["line"], r["count"]) for r in rows] == [(marks["big"], 2), (marks["small"], 5)]
    assert rows[0]["filename"] == str(path) and rows[0]["name"] == "make_big"
    assert rows[0]["bytes"] >= 6 << 20 and rows[0]["requested_bytes"] == 6 << 20
    assert rows[1]["requested_bytes"] == 5000
    assert rows[0]["bytes"] >= rows[1]["bytes"]  # largest first
    text = out.split("\n", 1)[1]
    assert f"script.py:{marks['big']}:make_big" in text and "7 block(s)" in text



def test_a_leak_just_under_a_unit_is_shown_in_the_next(tmp_path):
    # 512 bytes short of 1 GiB rounds to "1.0 GiB" at one decimal, never "1024.0 MiB".
    _, _, out = run_script(tmp_path, """
        import vramkit
        mark = vramkit.history_mark()
        kept = vramkit.empty((1 << 30) - 512)
        report = vramkit.leaks(since=mark)
        print(report.bytes)
        print(report)
    """)
    nbytes, text = out.split("\n", 1)
    assert int(nbytes) == (1 << 30) - 512
    assert "1.0 GiB still live" in text and "1024.0" not in text

def test_leak_check_block(tmp_path):
    _, marks, out = run_script(tmp_path, """
        import vramkit
        with vramkit.leak_check() as clean:
            for _ in range(100):
                b = vramkit.empty(8192)
                del b
        print(bool(clean), len(clean), clean.bytes)
        leaked = []
        with vramkit.leak_check() as report:
            for i in range(3):
                leaked.append(vramkit.empty(1 << 16))  # MARK leak
        print(bool(report), report.sites[0].line, report.sites[0].count, report.count)
        print(report)
    """)
    first, second, *text = out.splitlines()
    assert first == "False 0 0"
    assert second == f"True {marks['leak']} 3 3"
    assert f":{marks['leak']}:<module>" in "\n".join(text)


STEADY = """
    import warnings, vramkit
    weights = [vramkit.empty(1 << 20) for _ in range(4)]   # the model: constant
    cache = {}
    detector = vramkit.LeakDetector(every=10, window=5)
    for step in range(1000):
        acts = [vramkit.empty(256 << 10) for _ in range(3)]  # activations, freed each step
        grad = vramkit.empty((step % 7 + 1) << 12)           # sizes vary, lifetime does not
        cache[step % 4] = vramkit.empty(1 << 15)             # bounded: fills, then replaces
        del acts, grad
        detector.step()
    print("findings", detector.findings)
"""


def test_detector_quiet_on_a_steady_loop(tmp_path):
    # -W error: a MemoryLeakWarning would fail the script.
    _, _, out = run_script(tmp_path, STEADY)
    assert out.strip() == "findings []"


def test_detector_names_a_planted_leak(tmp_path):
    path, marks, out = run_script(tmp_path, """
        import warnings, vramkit
        weights = [vramkit.empty(1 << 20) for _ in range(4)]
        leak = []
        seen = []
        detector = vramkit.LeakDetector(every=10, window=5, callback=seen.append, warn=False)
        for step in range(200):
            acts = [vramkit.empty(256 << 10) for _ in range(3)]
            leak.append(vramkit.empty(4096))                 # MARK leak
            del acts
            detector.step()
        print([g.site for g in detector.findings])
        print(len(seen), detector.findings[0])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            d2 = vramkit.LeakDetector(every=1, window=2)
            for _ in range(3):
                leak.append(vramkit.empty(4096))             # MARK second
                d2.step()
        print([str(w.message) for w in caught], [w.category.__name__ for w in caught])
    """)
    sites, summary, warned = out.splitlines()
    assert eval(sites) == [f"{path}:{marks['leak']}:<module>"]
    assert summary.startswith(f"1 {path}:{marks['leak']}:<module>: live bytes grew")
    assert f":{marks['second']}:<module>" in warned and "MemoryLeakWarning" in warned


def test_bad_arguments(tmp_path):
    run_script(tmp_path, """
        import vramkit
        for kwargs, kind, word in (({"every": 0}, ValueError, "every"),
                                   ({"every": "10"}, TypeError, "every"),
                                   ({"window": 1}, ValueError, "window"),
                                   ({"window": 2.5}, TypeError, "window"),
                                   ({"callback": 3}, TypeError, "callback")):
            try:
                vramkit.LeakDetector(**kwargs)
            except kind as exc:
                assert word in str(exc), exc
            else:
                raise AssertionError(kwargs)
        try:
            vramkit.leaks(since=None)
        except TypeError as exc:
            assert "history_mark" in str(exc)
        m = vramkit.history_mark()
        vramkit.record_memory_history()      # a restart clears the ring, and the mark
        try:
            vramkit.leaks(since=m)
        except ValueError as exc:
            assert "since" in str(exc)
        else:
            raise AssertionError("a mark from a cleared history was accepted")
        b = vramkit.empty(1024); b.free()    # the pool is fine
    """)

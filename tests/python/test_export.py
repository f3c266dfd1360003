"""`vramkit export` and vramkit.prometheus: the text is valid for Prometheus (parsed with
prometheus_client's own parser), its values are those of the fake NVML and of the records
vramkit processes publish, the labels are dcgm-exporter's, command lines never appear, the
server listens where it says (127.0.0.1 unless --address), a port in use is a clear exit 1,
idle, slow, oversized or too many connections (and too few descriptors) never stop a scrape
(issue 35), and the Grafana dashboard queries only metrics the exporter serves.

The records come from two places: hand-made files in the published layout (test_records'
writer), so every field has a known value, and a real vramkit child on sim, whose record
must agree with its own memory_stats(). Every test points VRAMKIT_PUBLISH_DIR at its tmp_path.
"""

import json
import os
import pathlib
import re
import selectors
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from helpers import SIM_ENV
from test_records import record_bytes

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAKE_NVML_SOURCE = ROOT / "tests" / "python" / "fake_nvml.c"
DASHBOARD = ROOT / "docs" / "grafana" / "vramkit.json"
FAKE_GPU0 = {"uuid": "GPU-11111111-2222-3333-4444-555555555555", "name": "Fake H200"}
SECRET = "hf_SECRET_TOKEN_do_not_serve"

records = pytest.importorskip("vramkit.records")


# ---- helpers ---------------------------------------------------------------------------

@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory):
    """The fake NVML built as a shared library (the one the NVML wrapper's tests use)."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None or not FAKE_NVML_SOURCE.exists():
        pytest.skip("no C compiler or no tests/python/fake_nvml.c to build the fake NVML")
    out = tmp_path_factory.mktemp("nvml") / "libfake_nvml.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(out), str(FAKE_NVML_SOURCE)],
                   check=True, capture_output=True)
    return str(out)


def _env(publish_dir, nvml_library=None, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VRAMKIT_", "FAKE_NVML"))}
    env.update(SIM_ENV)
    env["VRAMKIT_PUBLISH_DIR"] = str(publish_dir)
    # No fake given: a library that does not exist, so a GPU of the test machine never leaks
    # into the figures.
    env["VRAMKIT_NVML_LIBRARY"] = nvml_library or str(publish_dir / "no-such-libnvidia-ml.so")
    env.update(extra)
    return env


def export(env, *args, check=True):
    proc = subprocess.run([sys.executable, "-m", "vramkit", "export", *args], env=env,
                          capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        pytest.fail(f"vramkit export exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}",
                    pytrace=False)
    return proc


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text):
    """[(name, labels, value)] of the sample lines, by a small parser of our own (the
    validity test uses prometheus_client's, which may be absent)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        labels = dict(_LABEL.findall(m.group(2) or ""))
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def one(text, name, **labels):
    found = [v for n, lab, v in samples(text) if n == name
             and all(lab.get(k) == str(v) for k, v in labels.items())]
    assert len(found) == 1, f"{name} {labels}: {len(found)} samples in\n{text}"
    return found[0]


def write_record(folder, pid, name, devices, cmdline=""):
    """A record file as an engine writes it, for a live pid; devices: dicts of fields."""
    slots = [dict(dev, source=dev["source"].encode(), uuid=dev.get("uuid", "").encode(),
                  seq=0) for dev in devices]
    path = pathlib.Path(folder) / f"{pid}.rec"
    path.write_bytes(bytes(record_bytes(pid, name=name.encode(), cmdline=cmdline.encode(),
                                        devices=slots)))
    path.chmod(0o600)
    return path


@pytest.fixture
def sleeper():
    """A live process whose pid a hand-made record can carry."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


GPU_DEVICE = {"device": 0, "source": "cuda", "uuid": FAKE_GPU0["uuid"],
              "allocated_bytes": 3 << 30, "reserved_bytes": 4 << 30, "active_bytes": 3 << 30,
              "cached_free_bytes": 1 << 30, "largest_free_block": 768 << 20,
              "peak_allocated_bytes": 5 << 30, "peak_reserved_bytes": 6 << 30, "num_ooms": 2,
              "num_alloc_retries": 7, "limit_bytes": 0, "capacity_bytes": 140 << 30,
              "updated_ns": 1}
SIM_DEVICE = {"device": 1, "source": "sim", "allocated_bytes": 1 << 20,
              "reserved_bytes": 2 << 20, "cached_free_bytes": 1 << 20,
              "largest_free_block": 1 << 20, "capacity_bytes": 4 << 30}


# ---- --once: values, labels, secrets ---------------------------------------------------

def test_once_serves_the_records_and_nvml_with_dcgm_labels(tmp_path, fake_nvml, sleeper):
    write_record(tmp_path, sleeper, "trainer", [GPU_DEVICE, SIM_DEVICE],
                 cmdline=f"python train.py --token {SECRET}")
    env = _env(tmp_path, fake_nvml, FAKE_NVML_PROCESSES=f"0:{sleeper}:{5 << 30}")
    text = export(env, "--once").stdout
    host = socket.gethostname()
    gpu0 = {"gpu": 0, "UUID": FAKE_GPU0["uuid"], "modelName": FAKE_GPU0["name"],
            "hostname": host}
    pool = dict(gpu0, pid=sleeper, process="trainer", source="cuda")
    # The pool's figures, each from its record field.
    for metric, field in (("vramkit_allocated_bytes", "allocated_bytes"),
                          ("vramkit_reserved_bytes", "reserved_bytes"),
                          ("vramkit_active_bytes", "active_bytes"),
                          ("vramkit_cached_free_bytes", "cached_free_bytes"),
                          ("vramkit_largest_free_block_bytes", "largest_free_block"),
                          ("vramkit_peak_allocated_bytes", "peak_allocated_bytes"),
                          ("vramkit_peak_reserved_bytes", "peak_reserved_bytes"),
                          ("vramkit_capacity_bytes", "capacity_bytes"),
                          ("vramkit_ooms_total", "num_ooms"),
                          ("vramkit_alloc_retries_total", "num_alloc_retries")):
        assert one(text, metric, **pool) == GPU_DEVICE[field], metric
    assert one(text, "vramkit_fragmentation_ratio", **pool) == pytest.approx(0.25)
    # A sim pool has no GPU to join: its own ordinal, no UUID.
    sim = one(text, "vramkit_reserved_bytes", gpu=1, pid=sleeper, source="sim", UUID="")
    assert sim == SIM_DEVICE["reserved_bytes"]
    # NVML's view, equal to what the NVML wrapper reads from the same fake.
    from vramkit.observe._nvml import Nvml

    os.environ["FAKE_NVML_PROCESSES"] = env["FAKE_NVML_PROCESSES"]
    try:
        gpus = Nvml(fake_nvml).devices()
    finally:
        del os.environ["FAKE_NVML_PROCESSES"]
    for gpu in gpus:
        labels = {"gpu": gpu.index, "UUID": gpu.uuid, "modelName": gpu.name}
        assert one(text, "vramkit_gpu_memory_total_bytes", **labels) == gpu.total
        assert one(text, "vramkit_gpu_memory_used_bytes", **labels) == gpu.used
        assert one(text, "vramkit_gpu_memory_free_bytes", **labels) == gpu.free
        for proc in gpu.processes:
            if proc.used_bytes is not None:
                assert one(text, "vramkit_process_gpu_used_bytes", pid=proc.pid,
                           **labels) == proc.used_bytes
    assert one(text, "vramkit_process_gpu_used_bytes", pid=sleeper, **gpu0) == 5 << 30
    assert one(text, "vramkit_gpu_utilization_ratio", gpu=0) == pytest.approx(0.37)
    # A process whose usage the driver does not give has no sample, not a 0.
    assert not [s for s in samples(text) if s[1].get("pid") == "4343"]
    assert one(text, "vramkit_nvml_up") == 1
    assert one(text, "vramkit_processes") == 1
    # The command line is in the record, never in the output.
    assert SECRET not in text and "train.py" not in text


def test_once_is_valid_prometheus_text(tmp_path, fake_nvml, sleeper):
    parser = pytest.importorskip("prometheus_client.parser")
    write_record(tmp_path, sleeper, 'we"ird\\name', [GPU_DEVICE])
    text = export(_env(tmp_path, fake_nvml), "--once").stdout
    families = {f.name: f for f in parser.text_string_to_metric_families(text)}
    # Counters are named without _total by the parser, their samples with it.
    assert families["vramkit_ooms"].type == "counter"
    assert [s.name for s in families["vramkit_ooms"].samples] == ["vramkit_ooms_total"]
    assert families["vramkit_allocated_bytes"].type == "gauge"
    assert families["vramkit_allocated_bytes"].documentation
    sample = families["vramkit_allocated_bytes"].samples[0]
    assert sample.labels["process"] == 'we"ird\\name'      # escaped, and read back whole
    assert set(sample.labels) == {"gpu", "UUID", "modelName", "hostname", "pid", "process",
                                  "source"}
    assert sample.value == GPU_DEVICE["allocated_bytes"]
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            name = line.split()[2]
            assert name.startswith("vramkit_")
            assert name.endswith(("_bytes", "_total", "_ratio", "_seconds", "_up",
                                  "_processes")), name


def test_values_equal_a_live_vramkit_child(tmp_path, fake_nvml):
    child = subprocess.Popen(
        [sys.executable, "-c", """if True:
            import json, sys, vramkit
            keep = [vramkit.empty(n << 20) for n in (3, 5, 8)]
            gone = vramkit.empty(64 << 20); gone.free()
            print(json.dumps(vramkit.memory_stats()), flush=True)
            sys.stdin.read()
        """, SECRET], env=_env(tmp_path, fake_nvml, VRAMKIT_PUBLISH="cmdline"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        stats = json.loads(child.stdout.readline())
        deadline = time.monotonic() + 10
        while not list(tmp_path.glob("*.rec")) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not list(tmp_path.glob("*.rec")):
            pytest.skip("this engine build publishes no records (VRAMKIT_PUBLISH_DIR stays "
                        "empty)")
        text = export(_env(tmp_path, fake_nvml), "--once").stdout
        labels = {"pid": child.pid, "gpu": 0, "source": "sim"}
        assert one(text, "vramkit_allocated_bytes", **labels) == \
            stats["allocated_bytes.all.current"]
        assert one(text, "vramkit_reserved_bytes", **labels) == \
            stats["reserved_bytes.all.current"]
        assert one(text, "vramkit_peak_allocated_bytes", **labels) == \
            stats["allocated_bytes.all.peak"]
        assert one(text, "vramkit_ooms_total", **labels) == stats["num_ooms"]
        (record,) = records.read_records(tmp_path)
        assert SECRET in record.cmdline           # published, as the child opted in ...
        assert SECRET not in text                 # ... and still not served
        assert one(text, "vramkit_allocated_bytes", **labels) == \
            record.devices[0].allocated_bytes
    finally:
        child.communicate("", timeout=30)


def test_nvml_missing_and_bad_records_are_notes_not_failures(tmp_path, sleeper):
    (tmp_path / "999999.rec").write_bytes(b"not a record at all" * 10)
    (tmp_path / "12.rec").write_bytes(b"")
    write_record(tmp_path, sleeper, "trainer", [GPU_DEVICE])
    proc = export(_env(tmp_path), "--once")          # NVML: a library that does not exist
    text = proc.stdout
    assert one(text, "vramkit_nvml_up") == 0
    assert re.search(r"^# vramkit: no GPU figures: .*cannot be opened", text, re.M), text
    assert "record skipped" in text
    # The good record is served without a GPU to join: its own ordinal and UUID.
    assert one(text, "vramkit_allocated_bytes", pid=sleeper, gpu=0,
               UUID=GPU_DEVICE["uuid"]) == GPU_DEVICE["allocated_bytes"]
    assert not [s for s in samples(text) if s[0].startswith("vramkit_gpu_")]


def test_another_users_record_is_not_served(tmp_path, sleeper):
    path = write_record(tmp_path, sleeper, "theirs", [GPU_DEVICE], cmdline=SECRET)
    try:
        os.chown(path, 54321, -1)
    except PermissionError:
        pytest.skip("only root can give a file to another user here")
    text = export(_env(tmp_path), "--once").stdout
    assert re.search(r"^# vramkit: record skipped: .*owned by uid 54321", text, re.M), text
    assert not [s for s in samples(text) if s[1].get("pid") == str(sleeper)]
    assert one(text, "vramkit_processes") == 0 and SECRET not in text


def test_nvml_init_failure(tmp_path, fake_nvml):
    text = export(_env(tmp_path, fake_nvml, FAKE_NVML_INIT_FAIL="1"), "--once").stdout
    assert one(text, "vramkit_nvml_up") == 0
    assert "Driver Not Loaded" in text


# ---- the server --------------------------------------------------------------------------

def _start(env, *args):
    proc = subprocess.Popen([sys.executable, "-m", "vramkit", "export", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    m = re.search(r"http://(\S+):(\d+)/metrics", line)
    if m is None:
        proc.kill()
        pytest.fail(f"no start line: {line!r} {proc.communicate()}", pytrace=False)
    return proc, line, m.group(1), int(m.group(2))


def test_server_answers_get_metrics_on_127_0_0_1_by_default(tmp_path, fake_nvml, sleeper):
    write_record(tmp_path, sleeper, "trainer", [GPU_DEVICE], cmdline=SECRET)
    proc, line, host, port = _start(_env(tmp_path, fake_nvml), "--port", "0")
    try:
        assert host == "127.0.0.1"
        assert "listening on 127.0.0.1" in line and "this machine only" in line
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            assert reply.status == 200
            assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = reply.read().decode()
        assert one(text, "vramkit_allocated_bytes", pid=sleeper) == \
            GPU_DEVICE["allocated_bytes"]
        assert SECRET not in text
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/secrets", timeout=10)
        assert missing.value.code == 404
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_address_is_honoured(tmp_path):
    # Any 127/8 address is this machine's loopback on Linux: one that is not 127.0.0.1
    # shows the server bound where asked, and not on the default.
    proc, line, host, port = _start(_env(tmp_path), "--address", "127.0.0.2", "--port", "0")
    try:
        assert host == "127.0.0.2" and "listening on 127.0.0.2" in line
        with urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=10) as reply:
            assert b"vramkit_nvml_up" in reply.read()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


# ---- the server under idle, slow and too many connections (issue 35) ---------------------

def _raise_descriptor_limit(wanted):
    """As many descriptors as wanted for this process (and the exporters it starts), within
    the hard limit; how many it may open."""
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return wanted if soft == resource.RLIM_INFINITY else soft


def _idle(port, count, partial=False):
    """count connections that send nothing (or half a request), opened without waiting for
    the server to take them: a server that never accepts cannot stall the test here."""
    held = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        held.append(sock)
    if partial:
        for sock in held:
            try:
                sock.send(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            except OSError:
                pass  # not connected yet: it stays a connection that sent nothing
    return held


def _scrape(port, timeout=10):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as reply:
        assert reply.status == 200
        return reply.read().decode()


def _stop(proc):
    proc.terminate()
    _, err = proc.communicate(timeout=10)
    assert "Traceback" not in err, err
    return err


def test_a_scrape_is_answered_among_many_idle_connections(tmp_path, sleeper):
    parser = pytest.importorskip("prometheus_client.parser")
    # 1,000 where the limit allows, leaving room for the test's own files.
    count = min(1000, _raise_descriptor_limit(1100) - 100)
    write_record(tmp_path, sleeper, "trainer", [GPU_DEVICE])
    proc, _, _, port = _start(_env(tmp_path), "--port", "0")
    held = []
    try:
        held = _idle(port, count // 2) + _idle(port, count - count // 2, partial=True)
        time.sleep(1)  # the server has taken them
        text = _scrape(port)
        families = {f.name: f for f in parser.text_string_to_metric_families(text)}
        assert families["vramkit_allocated_bytes"].samples[0].value == \
            GPU_DEVICE["allocated_bytes"]
        assert families["vramkit_processes"].samples[0].value == 1
        assert proc.poll() is None
    finally:
        for sock in held:
            sock.close()
        _stop(proc)


def test_a_client_that_sends_nothing_is_disconnected_after_the_timeout(tmp_path):
    proc, _, _, port = _start(_env(tmp_path), "--port", "0", "--timeout", "1")
    try:
        silent = socket.create_connection(("127.0.0.1", port), timeout=10)
        partial = socket.create_connection(("127.0.0.1", port), timeout=10)
        partial.sendall(b"GET /metrics HTTP/1.1\r\n")
        for sock in (silent, partial):
            with sock:
                try:
                    assert sock.recv(100) == b""       # closed by the server, within 10 s
                except ConnectionResetError:
                    pass
        # A client that resets mid-request is no traceback, and the next scrape works.
        rude = socket.create_connection(("127.0.0.1", port), timeout=10)
        rude.sendall(b"GET /met")
        rude.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        rude.close()
        assert "vramkit_nvml_up" in _scrape(port)
    finally:
        _stop(proc)


def test_past_the_cap_a_client_gets_503_and_the_server_recovers(tmp_path):
    proc, _, _, port = _start(_env(tmp_path), "--port", "0", "--max-connections", "3")
    try:
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        # The server takes connections in the order they came: these three are held.
        with pytest.raises(urllib.error.HTTPError) as full:
            _scrape(port)
        assert full.value.code == 503 and full.value.headers["Retry-After"]
        for sock in held:
            sock.close()
        deadline = time.monotonic() + 10
        while True:
            try:
                assert "vramkit_nvml_up" in _scrape(port)
                break
            except urllib.error.HTTPError as error:  # the closes not yet seen
                if error.code != 503 or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        _stop(proc)


def test_out_of_descriptors_answers_503_and_does_not_stop_scrapes(tmp_path):
    # A server whose descriptor limit is far below the connections it gets: it holds what
    # it can, answers the rest 503, drops the idle ones at the timeout, and scrapes again.
    # (http.server spun on accept() here and never answered again.)
    resource = pytest.importorskip("resource")
    _raise_descriptor_limit(400)

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (160, 160))

    proc = subprocess.Popen([sys.executable, "-m", "vramkit", "export", "--port", "0"],
                            env=_env(tmp_path), preexec_fn=low_limit,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    port = int(re.search(r":(\d+)/metrics", proc.stderr.readline()).group(1))
    # Read here, through the same buffered file: communicate() reads the pipe beneath it
    # and would miss a line readline() had already buffered.
    lowered = proc.stderr.readline()
    held = _idle(port, 300)
    try:
        answers = []
        with selectors.DefaultSelector() as waiting:
            for sock in held:
                waiting.register(sock, selectors.EVENT_READ)
            deadline = time.monotonic() + 30
            while waiting.get_map() and time.monotonic() < deadline:
                for key, _ in waiting.select(0.5):
                    try:
                        answers.append(key.fileobj.recv(100))
                    except OSError:
                        answers.append(b"")
                    waiting.unregister(key.fileobj)
            assert not waiting.get_map(), \
                f"{len(waiting.get_map())} connections neither answered nor closed"
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        assert len(refused) >= 300 - 160, len(refused)
        assert "vramkit_nvml_up" in _scrape(port)
    finally:
        for sock in held:
            sock.close()
        _stop(proc)
    assert "at most" in lowered and "descriptor limit" in lowered, lowered


def test_an_oversized_request_is_refused(tmp_path):
    proc, _, _, port = _start(_env(tmp_path), "--port", "0")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            try:
                sock.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: " + b"x" * 100000)
            except OSError:
                pass  # closed by the server before it all went
            assert re.match(rb"HTTP/1\.[01] 431 ", sock.recv(100))
    finally:
        _stop(proc)


def test_port_in_use_is_exit_4_with_a_message(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = export(_env(tmp_path), "--port", str(port), check=False)
    assert proc.returncode == 4  # the failure row of the exit-status table
    assert f"port {port} on 127.0.0.1 is already in use" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, words", [
    (["--port", "http"], "--port: expected a port number"),
    (["--port"], "--port needs a value"),
    (["--port", "70000"], "--port: expected a port number"),
    (["--verbose"], "unknown option '--verbose'"),
    (["--timeout", "0"], "--timeout: expected seconds above 0"),
    (["--timeout=soon"], "--timeout: expected seconds above 0"),
    (["--max-connections", "0"], "--max-connections: expected a whole number"),
    # Digits of other scripts, which int() takes: port 80 and 1 connection were served.
    (["--port", "\u0668\u0660"], "--port: expected a port number"),
    (["--max-connections", "\u0661"], "--max-connections: expected a whole number"),
])
def test_bad_arguments_exit_3(tmp_path, args, words):
    proc = export(_env(tmp_path), *args, check=False)
    assert proc.returncode == 3 and words in proc.stderr


def test_help_and_listing():
    from vramkit import cli

    assert "export" in cli.COMMANDS
    proc = subprocess.run([sys.executable, "-m", "vramkit", "export", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--address" in proc.stdout and "127.0.0.1" in proc.stdout
    assert "--timeout SECONDS" in proc.stdout and "--max-connections N" in proc.stdout


# ---- in process, and the dashboard -------------------------------------------------------

def test_in_process_server_exposes_this_process(tmp_path, run):
    pytest.importorskip("prometheus_client")
    out = run("""
        import json, urllib.request, vramkit, vramkit.prometheus
        from prometheus_client.parser import text_string_to_metric_families
        keep = vramkit.empty(24 << 20)
        server, thread = vramkit.prometheus.start_http_server(0)
        host, port = server.server_address[:2]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        got = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.startswith("vramkit_"):
                    got[sample.name] = (sample.value, sample.labels)
        print(json.dumps({"host": host, "got": got, "stats": vramkit.memory_stats(),
                          "total": vramkit.mem_get_info()[1]}))
    """, env={"VRAMKIT_PUBLISH_DIR": str(tmp_path)}).stdout
    result = json.loads(out)
    assert result["host"] == "127.0.0.1"
    got, stats = result["got"], result["stats"]
    # The capacity, which `vramkit export` serves from the record, is served here too.
    assert got["vramkit_capacity_bytes"][0] == result["total"] > 0
    assert got["vramkit_allocated_bytes"][0] == stats["allocated_bytes.all.current"]
    assert got["vramkit_reserved_bytes"][0] == stats["reserved_bytes.all.current"]
    assert got["vramkit_ooms_total"][0] == stats["num_ooms"]
    assert got["vramkit_allocated_bytes"][1]["gpu"] == "0"
    assert got["vramkit_allocated_bytes"][1]["source"] == "sim"


def test_in_process_cached_free_leaves_out_blocks_waiting_on_a_stream(tmp_path, run):
    # A block freed while another stream still uses it is active, not cached: neither
    # empty_cache nor a new allocation can have it. The in-process collector must say what
    # the engine and `vramkit export` (the record) say.
    pytest.importorskip("prometheus_client")
    out = run("""
        import json, vramkit, vramkit.prometheus
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.parser import text_string_to_metric_families
        from vramkit.records import read_records
        keep = vramkit.empty(2 << 20)
        busy = vramkit.empty(4 << 20, stream=1)
        busy.record_stream(2)
        busy.free()                          # pending until stream 2's event completes
        registry = CollectorRegistry()
        vramkit.prometheus.register(registry)
        text = generate_latest(registry).decode()
        got = {s.name: s.value for f in text_string_to_metric_families(text)
               for s in f.samples}
        (record,) = read_records()
        print(json.dumps({"got": got, "stats": vramkit.memory_stats(),
                          "record": record.devices[0].cached_free_bytes}))
    """, env={"VRAMKIT_PUBLISH_DIR": str(tmp_path)}).stdout
    result = json.loads(out)
    stats = result["stats"]
    cached = stats["reserved_bytes.all.current"] - stats["active_bytes.all.current"]
    assert stats["active_bytes.all.current"] > stats["allocated_bytes.all.current"]
    assert result["got"]["vramkit_cached_free_bytes"] == cached == result["record"]


def test_alloc_retries_help_says_a_failed_retry_counts_too(run):
    # The engine counts the retry of an allocation that then fails with out of memory: one
    # OOM and nothing else is one retry. A help text of successes alone misreads that.
    out = run("""
        import json, vramkit
        from vramkit.observe import export, prometheus
        vramkit.set_memory_limit(0, "64M")
        try:
            vramkit.empty(128 << 20)
        except vramkit.OutOfMemoryError:
            pass
        stats = vramkit.memory_stats()
        helps = [text for name, _, text, _ in export.FAMILIES + prometheus._METRICS
                 if name.startswith("vramkit_alloc_retries")]
        print(json.dumps({"ooms": stats["num_ooms"], "retries": stats["num_alloc_retries"],
                          "helps": helps}))
    """).stdout
    result = json.loads(out)
    assert result["ooms"] == result["retries"] == 1
    assert len(result["helps"]) == 2
    for text in result["helps"]:
        assert "succeeded only" not in text and "vramkit_ooms_total" in text, text
    panel = next(p for p in json.loads(DASHBOARD.read_text())["panels"]
                 if "retries" in json.dumps(p.get("targets", [])))
    assert "succeeded only" not in panel["description"]


def test_grafana_dashboard_queries_only_served_metrics(tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(dashboard)
    assert len(exprs) >= 8
    queried = {name for expr in exprs for name in re.findall(r"\bvramkit_[a-z_]+", expr)}
    text = export(_env(tmp_path), "--once").stdout
    served = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    assert queried and queried <= served, queried - served
    # The pool families the dashboard is for are all there.
    assert {"vramkit_allocated_bytes", "vramkit_reserved_bytes", "vramkit_ooms_total",
            "vramkit_gpu_memory_used_bytes", "vramkit_fragmentation_ratio"} <= queried


def test_control_and_bidi_characters_in_a_record_are_escaped(tmp_path, sleeper):
    """A process names itself: its name reaches a scraper's terminal and dashboards only
    as escapes, never as raw controls or text-direction overrides; a backslash stays one."""
    name = "ev\x1b[2Jil\u202egnp\x07\\x"
    write_record(tmp_path, sleeper, name, [SIM_DEVICE])
    text = export(_env(tmp_path), "--once").stdout
    assert not any(c in text for c in "\x1b\u202e\x07\r")
    (process,) = {s[1]["process"] for s in samples(text) if "process" in s[1]}
    # As served: the text format doubles each backslash, the escapes' and the name's own.
    assert process == "ev\\\\x1b[2Jil\\\\xe2\\\\x80\\\\xaegnp\\\\x07\\\\x"

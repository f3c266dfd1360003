"""vramkit.dask on a distributed LocalCluster of two worker processes, on the sim source.

Each worker process gets its own sim pool from PoolPlugin: the test reads back, from the
workers, the source, the preallocation and the limit the plugin set; makes a task allocate
past the limit and checks that vramkit's OutOfMemoryError reaches the client as that type
while the worker lives on and still allocates; and checks the plugin on workers that were
running when it was registered and on one that joined later. Bad options fail on the
client, before anything reaches the scheduler. One cluster serves the module: starting
worker processes is most of the time these tests take. bench/dask_bench.py's CPU check
runs its paths (the workloads, the pool figures, the test past a limit) on sim.
"""

import importlib.util
import json
import pathlib
import subprocess
import sys
import time

import pytest

from helpers import GiB, MiB, run_python

pytest.importorskip("distributed")

import distributed  # noqa: E402  (after the skip: without distributed there is nothing to test)

import vramkit  # noqa: E402
import vramkit.dask  # noqa: E402

POOL = {"source": "sim", "pool_size": "256M", "maximum_pool_size": "1G", "sim_capacity": "4G"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                       dashboard_address=None, scheduler_port=0,
                                       local_directory=tmp_path_factory.mktemp("dask"))
    with cluster, distributed.Client(cluster) as c:
        # Registered after the workers started: it must reach both of them.
        vramkit.dask.install(c, **POOL)
        yield c


def _allocate(nbytes: int) -> int:
    """Hold nbytes of vramkit memory for the task's length; the pool's reserved bytes."""
    buf = vramkit.empty(nbytes)
    reserved = vramkit.memory_reserved()
    del buf
    return reserved


def test_running_workers_get_the_pool(client):
    infos = client.run(vramkit.dask.worker_pool_info)
    assert len(infos) == 2
    assert len({info["pid"] for info in infos.values()}) == 2  # one pool per process
    for address, info in infos.items():
        assert info["worker"] == address
        assert info["source"] == "sim"
        assert info["reserved"] >= 256 * MiB  # preallocated by setup, before any task
        assert info["limit_bytes"] == GiB
        assert info["options"] == {"source": "sim", "preallocate": "256M", "limit": "1G",
                                   "sim_capacity": "4G"}


def test_out_of_memory_reaches_the_client_and_the_worker_lives_on(client):
    worker = sorted(client.scheduler_info()["workers"])[0]
    pid_before = client.run(vramkit.dask.worker_pool_info, workers=[worker])[worker]["pid"]
    with pytest.raises(vramkit.OutOfMemoryError) as caught:
        client.submit(_allocate, 2 * GiB, workers=[worker], pure=False).result()
    assert "limit" in caught.value.report
    # The same process, still serving from its pool.
    reserved = client.submit(_allocate, 512 * MiB, workers=[worker], pure=False).result()
    assert 512 * MiB <= reserved <= GiB
    info = client.run(vramkit.dask.worker_pool_info, workers=[worker])[worker]
    assert info["pid"] == pid_before


def test_a_worker_that_joins_later_gets_the_pool(client):
    cluster = client.cluster
    cluster.scale(3)
    client.wait_for_workers(3, timeout=60)
    try:
        infos = client.run(vramkit.dask.worker_pool_info)
        assert len(infos) == 3
        assert all(info is not None and info["reserved"] >= 256 * MiB and
                   info["limit_bytes"] == GiB for info in infos.values())
    finally:
        # Back to two, once the scheduler has let the third go: a later registration would
        # otherwise be sent to a worker that is closing.
        cluster.scale(2)
        deadline = time.monotonic() + 60
        while client.run_on_scheduler(_worker_count) > 2 and time.monotonic() < deadline:
            time.sleep(0.05)


def _worker_count(dask_scheduler) -> int:
    return len(dask_scheduler.workers)


def test_other_pool_options_on_a_configured_worker_raise_on_the_client(client):
    # The pool of a worker process is made once; a plugin that wants another says so.
    plugin = vramkit.dask.PoolPlugin(source="sim", maximum_pool_size="2G")
    with pytest.raises(RuntimeError, match="client.restart"):
        client.register_plugin(plugin, name="vramkit-other-options")
    client.unregister_worker_plugin("vramkit-other-options")
    assert all(info["limit_bytes"] == GiB
               for info in client.run(vramkit.dask.worker_pool_info).values())


def test_the_same_options_again_are_accepted(client):
    pids = {info["pid"] for info in client.run(vramkit.dask.worker_pool_info).values()}
    vramkit.dask.install(client, **POOL)  # replaces the registered plugin: teardown, setup
    infos = client.run(vramkit.dask.worker_pool_info).values()
    assert {info["pid"] for info in infos} == pids
    assert all(info["limit_bytes"] == GiB for info in infos)


def test_a_pool_that_does_not_fit_fails_its_setup_and_one_that_fits_follows():
    run_python("""
        import vramkit, vramkit.dask
        too_big = vramkit.dask.PoolPlugin(source="sim", pool_size="8G", sim_capacity="4G")
        try:
            too_big.setup(None)
            raise SystemExit("an 8 GiB pool was made on a 4 GiB device")
        except vramkit.OutOfMemoryError as exc:
            assert "could not preallocate 8.00 GiB" in str(exc), exc
        assert vramkit.dask.worker_pool_info() is None
        fits = vramkit.dask.PoolPlugin(source="sim", pool_size="1G", sim_capacity="4G")
        fits.setup(None)
        assert vramkit.dask.worker_pool_info()["reserved"] == 1 << 30
    """)


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_asking_for_a_missing_framework_names_it(client):
    plugin = vramkit.dask.PoolPlugin(cupy=True, **POOL)
    with pytest.raises(ImportError, match="cupy=True.*CuPy"):
        client.register_plugin(plugin, name="vramkit-cupy-check")
    client.unregister_worker_plugin("vramkit-cupy-check")
    # Not asked for, a missing framework is left out and said so.
    info = next(iter(client.run(vramkit.dask.worker_pool_info).values()))
    assert info["cupy"].startswith("not installed")


@pytest.mark.parametrize("options, error, text", [
    ({"pool_size": "lots"}, vramkit.InvalidArgumentError, "pool_size"),
    ({"maximum_pool_size": "-1G"}, vramkit.InvalidArgumentError, "maximum_pool_size"),
    ({"release_threshold": "50%"}, vramkit.InvalidArgumentError, "release_threshold"),
    ({"pool_size": "2G", "maximum_pool_size": "1G"}, vramkit.InvalidArgumentError,
     "more than maximum_pool_size"),
    ({"pool_size": 0.9, "maximum_pool_size": "50%"}, vramkit.InvalidArgumentError,
     "more than maximum_pool_size"),
    ({"managed": True, "source": "sim"}, vramkit.InvalidArgumentError, "managed"),
    ({"source": "gpu"}, vramkit.InvalidArgumentError, "source must be one of"),
    ({"rmm_pool_size": "1G"}, TypeError, "rmm_pool_size"),
    ({"cupy": "yes"}, TypeError, "cupy"),
    ({"device": -1}, vramkit.InvalidDeviceError, "device -1"),
])
def test_bad_options_fail_on_the_client(client, options, error, text):
    with pytest.raises(error, match=text):
        vramkit.dask.install(client, **options)
    # Nothing reached the scheduler: the plugin registered there is still the good one.
    assert client.run_on_scheduler(_registered_pool_options) == \
        vramkit.dask.PoolPlugin(**POOL).pool_options


def _registered_pool_options(dask_scheduler):
    from distributed.protocol import pickle
    return pickle.loads(dask_scheduler.worker_plugins[vramkit.dask.PLUGIN_NAME]).pool_options


def test_without_distributed_the_import_says_what_to_install():
    proc = run_python("""
        import sys
        sys.modules["distributed"] = None   # as if it were not installed
        import vramkit.dask
    """, check=False)
    assert proc.returncode != 0
    assert "ImportError: vramkit.dask needs Dask's distributed scheduler: pip install dask " \
           "distributed" in proc.stderr


BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "dask_bench.py"


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_the_benchmark_says_it_needs_a_gpu():
    proc = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "dask_bench: needs a GPU and CuPy" in proc.stderr


def test_the_benchmark_runs_its_paths_on_the_cpu(tmp_path):
    out = tmp_path / "bench.json"
    subprocess.run([sys.executable, str(BENCH), "--cpu-check", "--json", str(out)],
                   check=True, capture_output=True, timeout=120)
    rows = json.loads(out.read_text())["rows"]
    assert [row["workload"] for row in rows] == ["make", "sum", "matmul", "rechunk", "oom"]
    assert all(row["peak_reserved_bytes"] >= 64 * MiB for row in rows[:4])
    assert rows[4]["past_limit"].startswith("vramkit.OutOfMemoryError: ")
    assert rows[4]["after"] == "same worker allocates"


def test_pool_info_takes_a_device_s_name_and_refuses_what_is_none(client):
    infos = client.run(vramkit.dask.worker_pool_info, "cuda:0")
    assert [info["device"] for info in infos.values()] == [0, 0]
    # Not "no plugin ran" (None) for a name that is no device.
    with pytest.raises(vramkit.InvalidDeviceError, match="unknown device 'x'"):
        vramkit.dask.worker_pool_info("x")
    assert vramkit.dask.worker_pool_info("cuda:0") is None  # this process ran none

"""vramkit.Pool (python/vramkit/pool.py, _core_pool.c): private pools beside the default
ones, on the sim source: independent statistics, limits and OOMs, the lifetime a buffer
gives its pool, close() and the context manager, options refused by the engine's own
option table, no_split (a segment a buffer), snapshots and history in the default pool's
format, default_pool() agreeing with the module functions, and many threads on one pool.
"""

import gc
import pickle
import threading
import weakref

import pytest

import vramkit
from helpers import GiB, MiB
from test_history import check_format


def sim_pool(**options) -> vramkit.Pool:
    return vramkit.Pool(source="sim", capacity="8G", **options)


def test_two_private_pools_keep_their_own_stats_and_limits():
    a, b = sim_pool(limit="4G"), sim_pool(limit="1G")
    kept = [a.allocate(3 * MiB) for _ in range(3)]
    one = b.allocate(MiB)
    assert a.stats()["allocation"][0] == 3 and b.stats()["allocation"][0] == 1
    assert a.memory_allocated() == 9 * MiB and b.memory_allocated() == MiB
    assert (a.stats()["limit_bytes"], b.stats()["limit_bytes"]) == (4 * GiB, GiB)
    b.set_limit("512M")
    assert (a.stats()["limit_bytes"], b.stats()["limit_bytes"]) == (4 * GiB, 512 * MiB)
    a.set_limit(0.25)  # a fraction of the device, as in the options
    assert a.stats()["limit_bytes"] == sim_pool(limit=0.25).stats()["limit_bytes"] == 2 * GiB
    assert a.source == b.source == "sim" and a.device == b.device == 0
    assert not a.is_default and not a.closed
    del kept, one


def test_a_fraction_outside_0_to_1_is_named_and_changes_nothing():
    """It was refused as "device 0: invalid argument", naming nothing."""
    pool = sim_pool(limit="1G")
    held = pool.allocate(MiB)
    for fraction in (-1.0, 2.0, float("nan"), float("inf")):
        with pytest.raises(vramkit.InvalidArgumentError, match="the fraction must be from 0 to 1"):
            pool.set_limit(0, fraction)
    assert pool.stats()["limit_bytes"] == GiB and held.nbytes == MiB
    pool.allocate(MiB).free()
    with pytest.raises(OverflowError, match="stream handle 18446744073709551616 is not a "
                                            "pointer"):
        pool.allocate(MiB, stream=1 << 64)  # it said a C unsigned long overflowed
    assert pool.stats()["allocation"][0] == 1


@pytest.mark.parametrize("options, says", [
    (dict(capacity="8G\x00junk"), "capacity holds a NUL character: '8G\\x00junk'"),
    (dict(capacity="8G", limit="1G\x00x"), "limit holds a NUL character"),
    (dict(sim_capacity="4G", capacity="8G"), "are one option (VRAMKIT_SIM_CAPACITY)"),
    (dict(capacity="8G", limit=2.0), "limit as a float is a fraction of the device"),
    (dict(capacity="8G", preallocate=2.0), "preallocate as a float is a fraction"),
    # The value is the caller's text: a terminal control in it is shown escaped, once.
    (dict(capacity="8G", limit="1\x1b[31mG"), "limit: '1\\x1b[31mG' is not a limit"),
])
def test_options_the_engine_would_misread_are_refused(options, says):
    """The engine reads C strings (the text after a NUL was dropped unseen), two names of
    one option kept one silently, and a float above 1 became that many bytes."""
    with pytest.raises(vramkit.ConfigError) as refused:
        vramkit.Pool(source="sim", **options)
    assert says in str(refused.value)


def test_oom_in_one_pool_leaves_the_other_untouched():
    small, big = sim_pool(limit="64M"), sim_pool()
    held = big.allocate(100 * MiB)
    before = big.stats()
    with pytest.raises(vramkit.OutOfMemoryError) as caught:
        small.allocate(100 * MiB)
    info = caught.value.oom_info
    assert info["cause"] == "limit" and info["requested"] >= 100 * MiB
    assert info["limit"] == 64 * MiB
    assert small.oom_info() == info and "out of memory" in small.oom_report()
    assert small.stats()["num_ooms"] == 1
    assert big.oom_info() is None and big.oom_report() == ""
    after = big.stats()
    assert after["num_ooms"] == 0 and after["allocated_bytes"] == before["allocated_bytes"]
    small.allocate(MiB).free()  # the pool that ran out still works
    del held


def test_a_buffer_keeps_its_pool_alive():
    pool = sim_pool()
    alive = weakref.ref(pool)
    buf = pool.allocate(MiB)
    del pool
    gc.collect()
    assert alive() is not None and buf.pool is alive()
    assert buf.pool.stats()["allocation"][0] == 1
    del buf
    gc.collect()
    assert alive() is None


def test_close_with_live_buffers_refuses_and_the_pool_stays_open():
    pool = sim_pool()
    buf = pool.allocate(2 * MiB)
    with pytest.raises(vramkit.BusyError, match="1 block"):
        pool.close()
    assert not pool.closed
    pool.allocate(MiB).free()  # still usable
    buf.free()
    pool.close()
    pool.close()  # a second close is a no-op
    assert pool.closed and "closed" in repr(pool)
    with pytest.raises(vramkit.InvalidArgumentError, match="closed"):
        pool.allocate(MiB)
    with pytest.raises(ValueError, match="closed"):
        pool.stats()


def test_context_manager_closes_and_keeps_the_error_in_flight():
    with sim_pool() as pool:
        pool.allocate(MiB).free()
    assert pool.closed
    with pytest.raises(KeyError):
        with sim_pool() as pool:
            held = pool.allocate(MiB)
            raise KeyError("the program's own error")
    assert not pool.closed  # held keeps it: it goes with its last buffer
    del held


def test_default_pool_agrees_with_the_module_functions():
    keep = vramkit.empty(3 * MiB)
    pool = vramkit.default_pool()
    assert pool is vramkit.default_pool(0) is vramkit.default_pool("cuda:0")
    assert pool.is_default and pool.source == vramkit.source()
    assert pool.stats() == vramkit.memory_stats_raw()
    assert pool.memory_stats() == vramkit.memory_stats()
    assert pool.memory_allocated() == vramkit.memory_allocated()
    assert pool.oom_info() == vramkit.last_oom_info(0)
    buf = pool.allocate(MiB)
    assert vramkit.memory_stats_raw()["allocation"][0] == pool.stats()["allocation"][0]
    pool.close()  # the process owns it: nothing happens
    assert not pool.closed and buf.pool is pool
    del keep, buf


@pytest.mark.parametrize("options, named", [
    ({"limt": "1G"}, "limt"),
    ({"limit": "-1G"}, "limit"),
    ({"capacity": "0"}, "capacity"),
    ({"source": "gpu"}, "source"),
    ({"tight_threshold": 2.0}, "tight_threshold"),
    ({"large_blocks": "huge"}, "large_blocks"),
])
def test_bad_options_raise_config_error_naming_the_option(options, named):
    with pytest.raises(vramkit.ConfigError, match=f"^(Pool\\(\\): unknown option '{named}'"
                                                  f"|{named}: )") as caught:
        vramkit.Pool(**options)
    assert isinstance(caught.value, vramkit.VramError)
    assert caught.value.status == vramkit._core.VRAM_EENV


def test_an_unknown_option_suggests_the_nearest():
    with pytest.raises(vramkit.ConfigError, match="did you mean 'limit'"):
        vramkit.Pool(limt="1G")
    with pytest.raises(TypeError, match="limit"):
        vramkit.Pool(limit=[1])


def test_no_split_gives_each_buffer_a_segment_of_its_own():
    """PyTorch's MemPool(no_split=True) as a pool option: buffers never share a segment,
    each holds its whole segment, and what the option cannot serve is refused by name."""
    pool = sim_pool(no_split=True)
    first, second = pool.allocate(1000), pool.allocate(1000)
    assert pool.stats()["segment"][0] == 2
    assert pool.memory_allocated() == pool.memory_reserved() == 4 * MiB
    del first, second
    pool.empty_cache()
    assert pool.memory_reserved() == 0
    with pytest.raises(vramkit.UnsupportedError,
                       match="no_split .* cannot go with a virtual-memory source"):
        vramkit.Pool(source="sim:vmm", no_split=True)
    with pytest.raises(vramkit.InvalidArgumentError,
                       match="no_split .* cannot go with a preallocation"):
        sim_pool(no_split=True, preallocate="64M")
    with pytest.raises(vramkit.ConfigError, match="no_split: 'maybe' is not a switch"):
        sim_pool(no_split="maybe")


def test_a_bad_device_is_no_config_error_and_a_pool_is_made_once():
    with pytest.raises(vramkit.InvalidDeviceError, match="device 9"):
        vramkit.Pool(source="sim", device=9)
    pool = sim_pool(device="cuda:1")
    assert pool.device == 1
    with pytest.raises(vramkit.InvalidArgumentError, match="made already"):
        vramkit._core.Pool.__init__(pool, 0, {})
    assert pool.stats()["allocation"][0] == 0


def test_each_private_sim_pool_models_a_device_of_its_own():
    a, b = sim_pool(), sim_pool()
    held = a.allocate(6 * GiB), b.allocate(6 * GiB)  # 12 GiB: more than one device holds
    assert a.mem_get_info() == b.mem_get_info() == (2 * GiB, 8 * GiB)
    vmm = vramkit.Pool(source="sim:vmm", capacity="1G")
    vmm.record_memory_history()
    big = vmm.allocate(5 * MiB)
    vmm.annotate("after the big one")
    snap = vmm.snapshot()
    assert vmm.source == "sim:vmm" and snap["allocator_settings"]["expandable_segments"]
    notes = [e["user_metadata"] for e in snap["device_traces"][0] if e["action"] == "annotate"]
    assert notes == ["after the big one"]
    del held, big


def _shape(snap: dict) -> dict:
    """What two pools given the same requests agree on: no addresses, times or frames."""
    segments = sorted((s["total_size"], s["allocated_size"], s["segment_type"],
                       tuple((b["size"], b["state"]) for b in s["blocks"]))
                      for s in snap["segments"])
    actions = [[(e["action"], e["size"]) for e in t] for t in snap["device_traces"]]
    settings = dict(snap["allocator_settings"])
    settings.pop("PYTORCH_CUDA_ALLOC_CONF")
    return {"segments": segments, "traces": actions, "settings": settings}


def test_snapshot_and_history_have_the_default_pools_format(run):
    # A fresh interpreter: the default pool there sees only these requests.
    proc = run("""
        import json, vramkit
        def work(allocate):
            kept = [allocate(1000), allocate(3 << 20)]
            allocate(4096).free()
            return kept
        pool = vramkit.Pool(source="sim", capacity="4G")
        pool.record_memory_history()
        vramkit.record_memory_history()
        kept = work(pool.allocate), work(vramkit.empty)
        print(json.dumps([pool.snapshot(), vramkit.snapshot(0),
                          pool.memory_history(), vramkit.memory_history(0)]))
    """)
    import json

    private, default, private_history, default_history = json.loads(proc.stdout)
    for snap in (private, default):
        snap["segments"] = [dict(s, segment_pool_id=tuple(s["segment_pool_id"]))
                            for s in snap["segments"]]
        check_format(snap)
    assert _shape(private) == _shape(default)
    assert [e["action"] for e in private_history] == [e["action"] for e in default_history]
    assert any(b["frames"] for s in private["segments"] for b in s["blocks"]
               if b["state"] == "active_allocated")


def test_snapshot_of_a_private_pool_reads_in_the_plot_reader(tmp_path):
    from vramkit.plot import _history

    pool = sim_pool(device=2)
    pool.record_memory_history()
    held = [pool.allocate(MiB), pool.allocate(5 * MiB)]
    pool.dump_snapshot(tmp_path / "pool.pickle")
    with open(tmp_path / "pool.pickle", "rb") as f:
        snap = pickle.load(f)
    history = _history.from_snapshot("private pool", snap)
    assert history.device == 2 and [len(t) for t in snap["device_traces"]][:2] == [0, 0]
    pool.record_memory_history(enabled=None)
    del held


def test_many_threads_on_one_pool():
    pool = sim_pool()
    threads, rounds, kept_each = 8, 200, 5
    kept, errors = [], []

    def worker(seed):
        try:
            mine = []
            for i in range(rounds):
                buf = pool.allocate((seed * 7919 + i * 104729) % (3 * MiB) + 1)
                if i % (rounds // kept_each) == 0:
                    mine.append(buf)
                else:
                    del buf
            kept.extend(mine)
        except Exception as exc:  # reported below, with the thread's failure
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    stats = pool.stats()
    assert stats["allocation"][0] == len(kept) == threads * kept_each
    assert stats["num_mallocs"] == threads * rounds
    assert stats["num_frees"] == threads * rounds - len(kept)
    sizes = block_sizes(pool)
    assert stats["allocated_bytes"][0] == sum(sizes[b.ptr] for b in kept)
    kept.clear()
    pool.close()


def block_sizes(pool: vramkit.Pool) -> dict[int, int]:
    """Address -> size of each live block, from the pool's snapshot records."""
    from vramkit import history

    segs, blocks = pool.snapshot_records()
    return {b[0]: b[1] for b in history.raw_records(segs, blocks, None)[1]
            if b[4] == vramkit._core.VRAM_SNAPSHOT_ACTIVE_ALLOCATED}


def test_a_private_pool_saves_its_history_as_a_trace_the_replay_reads(tmp_path):
    pool = vramkit.Pool(source="sim", capacity="4G")
    before = pool.allocate(32 * MiB)  # live when recording starts: the trace's first op
    pool.record_memory_history()
    held = [pool.allocate(n * MiB) for n in (8, 16, 24)]
    del held[1]
    peak = pool.stats()["allocated_bytes"][1]
    path = tmp_path / "pool.trace.gz"
    assert pool.save_trace(path) == 1 + 3 + 1  # the baseline block, three allocs, one free
    replayed = vramkit.replay(path, source="sim")
    assert replayed["peak_live_bytes"] == peak
    assert replayed["ops"] == 5 and replayed["skipped_frees"] == 0
    del before, held

    silent = vramkit.Pool(source="sim")
    with pytest.raises(vramkit.InvalidArgumentError, match="records no events"):
        silent.save_trace(tmp_path / "none.trace.gz")
    assert not (tmp_path / "none.trace.gz").exists()

"""Exact figures from fresh pools (each test runs in its own interpreter, on sim).

The engine's rules these numbers follow (include/vramkit.h, src/pool): blocks are rounded
up to 512 bytes; requests up to 1 MiB are carved from 2 MiB small segments; larger ones get
segments rounded to the sim's 2 MiB granule.
"""

from helpers import GiB, MiB


def test_known_allocation_sequence(run):
    run("""
        import vramkit as v
        MiB = 1 << 20
        assert v.memory_reserved() == 0 and v.memory_allocated() == 0

        a = v.empty(1000)                     # one 512-byte-rounded block: 1024
        s = v.memory_stats()
        assert s["allocated_bytes.all.current"] == 1024, s
        assert s["requested_bytes.all.current"] == 1000
        assert s["active_bytes.all.current"] == 1024
        assert s["reserved_bytes.all.current"] == 2 * MiB    # one small segment
        assert s["segment.all.current"] == 1 and s["allocation.all.current"] == 1
        assert s["num_device_alloc"] == 1 and s["num_mallocs"] == 1

        b = v.empty(1)                        # 512, from the same segment
        assert v.memory_allocated() == 1536 and v.memory_reserved() == 2 * MiB
        assert v.memory_stats()["requested_bytes.all.current"] == 1001

        c = v.empty(3 * MiB)                  # a large block: two granules of a virtual range
        assert v.memory_allocated() == 1536 + 3 * MiB
        assert v.memory_reserved() == 6 * MiB
        assert v.memory_stats()["segment.all.current"] == 2

        del a
        s = v.memory_stats()
        assert s["allocated_bytes.all.current"] == 512 + 3 * MiB
        assert s["allocated_bytes.all.peak"] == 1536 + 3 * MiB
        assert s["allocated_bytes.all.allocated"] == 1536 + 3 * MiB
        assert s["allocated_bytes.all.freed"] == 1024
        assert s["num_frees"] == 1

        v.reset_peak_memory_stats()
        assert v.max_memory_allocated() == 512 + 3 * MiB
        assert v.get_memory_info("GPU:0") == {"current": 512 + 3 * MiB, "peak": 512 + 3 * MiB}

        again = v.empty(3 * MiB)              # c is live: right after it, one more granule
        assert v.memory_reserved() == 8 * MiB
        assert v.memory_stats()["segment.all.current"] == 2
        del again, b, c
        assert v.memory_allocated() == 0
        assert v.memory_stats()["allocation.all.current"] == 0
        v.empty_cache()
        assert v.memory_reserved() == 0
        assert v.memory_stats()["segment.all.current"] == 0
    """)


def test_cached_block_is_reused_without_driver_calls(run):
    run("""
        import vramkit as v
        a = v.empty(3 << 20); ptr = a.ptr; del a
        calls = v.memory_stats()["num_device_alloc"]
        b = v.empty(3 << 20)
        assert b.ptr == ptr
        assert v.memory_stats()["num_device_alloc"] == calls
    """)


def test_oom_under_a_limit_carries_a_report_and_recovers(run):
    run("""
        import vramkit as v
        MiB = 1 << 20
        v.configure(0, limit="8M")
        assert v.memory_stats()["limit_bytes"] == 8 * MiB
        first = v.empty(6 * MiB)
        try:
            v.empty(6 * MiB)
        except v.OutOfMemoryError as exc:
            err = exc
        else:
            raise AssertionError("no OOM")
        assert isinstance(err, MemoryError) and isinstance(err, v.VramError)
        assert err.status == -1 and err.errname == "VRAM_ENOMEM"
        assert isinstance(err.report, str) and len(err.report) > 40
        assert str(err) == err.report
        assert v.last_oom_report() == err.report
        assert v.last_oom_report(0) == err.report
        s = v.memory_stats()
        assert s["num_ooms"] == 1
        assert s["allocated_bytes.all.current"] == 6 * MiB   # nothing lost
        # Recovery: free and retry; then a smaller request beside the first also fits.
        del first
        second = v.empty(6 * MiB)
        small = v.empty(1 * MiB)
        assert v.memory_allocated() == 7 * MiB
        assert v.memory_reserved() <= 8 * MiB
    """)


def test_set_memory_limit_and_lifting_it(run):
    run("""
        import vramkit as v
        MiB = 1 << 20
        v.set_memory_limit("GPU:1", 4 * MiB)
        try:
            v.empty(16 * MiB, device=1)
            raise AssertionError("no OOM")
        except v.OutOfMemoryError as exc:
            assert "16" in exc.report or str(16 * MiB) in exc.report, exc.report
        v.set_memory_limit("GPU:1", 0)
        x = v.empty(16 * MiB, device=1)
        assert v.memory_allocated(1) == 16 * MiB
    """)


def test_growth_versus_preallocation(run):
    run("""
        import vramkit as v
        MiB = 1 << 20
        # Growth: nothing reserved until the first allocation.
        v.set_memory_growth("GPU:0", True)
        assert v.memory_reserved(0) == 0
        a = v.empty(1000, device=0)
        assert v.memory_reserved(0) == 2 * MiB

        # Preallocation of a size: reserved at creation, allocations come out of it.
        v.configure(1, preallocate="64M")
        assert v.memory_reserved(1) == 64 * MiB
        assert v.memory_allocated(1) == 0
        calls = v.memory_stats(1)["num_device_alloc"]
        bufs = [v.empty(8 * MiB, device=1) for _ in range(4)]
        assert v.memory_reserved(1) == 64 * MiB
        assert v.memory_allocated(1) == 32 * MiB
        assert v.memory_stats(1)["num_device_alloc"] == calls   # no driver call

        # TensorFlow's set_memory_growth(False): preallocate the limit when one is set.
        import os
        os.environ["VRAMKIT_LIMIT"] = "32M"
        v.set_memory_growth(2, False)
        assert v.memory_reserved(2) == 32 * MiB
        del os.environ["VRAMKIT_LIMIT"]

        # ... and 90% of the device when none is.
        v.set_memory_growth(3, False)
        free, total = v.mem_get_info(3)
        assert total == 1 << 30
        assert 0.89 * total <= v.memory_reserved(3) <= 0.91 * total, v.memory_reserved(3)

        # Once in use, a different mode is refused, as TensorFlow does.
        try:
            v.set_memory_growth(0, False)
            raise AssertionError("accepted")
        except RuntimeError as exc:
            assert "initialized" in str(exc)
    """, env={"VRAMKIT_SIM_CAPACITY": "1G"})


def test_configure_options_stay_with_their_device(run):
    run("""
        import os, vramkit as v
        MiB = 1 << 20
        v.configure(0, sim_capacity="256M", limit=0.5)
        assert v.mem_get_info(0)[1] == 256 * MiB
        assert v.memory_stats(0)["limit_bytes"] == 128 * MiB
        # Device 1 comes from the environment, untouched by device 0's options.
        assert v.mem_get_info(1)[1] == 1 << 30
        assert v.memory_stats(1)["limit_bytes"] == 0
        assert "VRAMKIT_LIMIT" not in os.environ
        assert os.environ["VRAMKIT_SIM_CAPACITY"] == "1G"
    """, env={"VRAMKIT_SIM_CAPACITY": "1G"})


def test_tight_threshold_gives_large_requests_their_own_segments(run):
    run("""
        import vramkit as v
        MiB = 1 << 20
        # Tight placement places fixed large segments (large blocks fixed).
        v.configure(0, tight_threshold=0, large_blocks="fixed")      # always
        v.configure(1, tight_threshold="100%", large_blocks="fixed")  # never, as by default
        for device, own_segment in ((0, True), (1, False)):
            a = v.empty(20 * MiB, device=device); del a
            calls = v.memory_stats(device)["num_device_alloc"]
            b = v.empty(4 * MiB, device=device)
            grew = v.memory_stats(device)["num_device_alloc"] > calls
            assert grew == own_segment, (device, grew)
            # Tight: the 20 MiB segment went back rather than raise the peak.
            assert v.memory_reserved(device) == (4 if own_segment else 20) * MiB
            del b
    """)


def test_environment_configures_default_pools(run):
    run("""
        import vramkit as v
        assert v.memory_stats()["limit_bytes"] == 3 << 20
        assert v.mem_get_info()[1] == 512 << 20
        try:
            v.empty(4 << 20)
            raise AssertionError("no OOM")
        except v.OutOfMemoryError:
            pass
    """, env={"VRAMKIT_SIM_CAPACITY": "512M", "VRAMKIT_LIMIT": "3M"})


def test_bad_environment_names_the_variable(run):
    proc = run("""
        import vramkit as v
        try:
            v.empty(16)
        except v.ConfigError as exc:
            assert isinstance(exc, ValueError)
            print(exc)
        else:
            raise AssertionError("accepted")
    """, env={"VRAMKIT_LIMIT": "a lot"})
    assert "VRAMKIT_LIMIT" in proc.stdout, proc.stdout


def test_fraction_limit_and_oom_counter(run):
    run("""
        import vramkit as v
        v.set_per_process_memory_fraction(0.5)
        assert v.memory_stats()["limit_bytes"] == 512 << 20
        for _ in range(3):
            try:
                v.empty(600 << 20)
            except MemoryError:
                pass
        assert v.memory_stats()["num_ooms"] == 3
        x = v.empty(400 << 20)
    """, env={"VRAMKIT_SIM_CAPACITY": "1G"})


def test_mem_get_info_is_unsigned(run):
    # The largest sim device reports its exact size; one of 2^63 bytes, past what the sim
    # models, is refused with the value and the limit named, never reported as negative
    # numbers.
    run("""
        import vramkit as v
        assert v.mem_get_info() == (1 << 48, 1 << 48), v.mem_get_info()
        try:
            v.configure(1, sim_capacity=str(1 << 63))
            raise AssertionError("a 2^63-byte sim was accepted")
        except v.ConfigError as exc:
            assert exc.errname == "VRAM_ESIMCAPACITY", exc
            assert "9223372036854775808 bytes" in str(exc) and "256 TiB" in str(exc), exc
    """, env={"VRAMKIT_SIM_CAPACITY": "256T"})
    run("""
        import vramkit as v
        try:
            v.mem_get_info()
            raise AssertionError("a 2^63-byte sim was accepted")
        except v.ConfigError as exc:
            assert "device 0: sim capacity of 9223372036854775808 bytes" in str(exc), exc
    """, env={"VRAMKIT_SIM_CAPACITY": "8388608T"})

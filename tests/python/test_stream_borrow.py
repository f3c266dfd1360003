"""Streams borrow from each other through the Python API, on sim: a private pool that holds
its whole capacity from the start (dask-cuda's rmm_pool_size equal to the card) serves a
request on another stream from that memory, the buffer says it belongs to that stream,
and the statistics count the borrow; freeing it does not let the default stream take the
memory back before the borrowing stream's work is done."""

import vramkit

OTHER_STREAM = 0x7A01


def _full_preallocation():
    return vramkit.Pool(source="sim", capacity="64M", preallocate="64M")


def test_another_stream_is_served_from_the_preallocation():
    with _full_preallocation() as pool:
        before = pool.memory_stats()
        mine = pool.allocate(8 << 20)
        theirs = pool.allocate(40 << 20, stream=OTHER_STREAM)
        assert theirs.stream == OTHER_STREAM and mine.stream is None
        after = pool.memory_stats()
        assert after["num_stream_borrows"] == before["num_stream_borrows"] + 1
        assert after["reserved_bytes.all.current"] == before["reserved_bytes.all.current"]
        assert after["num_device_alloc"] == before["num_device_alloc"]
        assert after["num_ooms"] == 0
        del mine, theirs


def test_a_borrowed_block_waits_for_its_stream_before_the_owner_reuses_it():
    with _full_preallocation() as pool:
        theirs = pool.allocate(40 << 20, stream=OTHER_STREAM)
        address = theirs.ptr
        del theirs
        stats = pool.memory_stats()
        # Freed, still active: it waits on an event recorded on the borrowing stream.
        assert stats["active_bytes.all.current"] - stats["allocated_bytes.all.current"] >= 40 << 20
        mine = pool.allocate(16 << 20)
        assert mine.ptr != address
        del mine

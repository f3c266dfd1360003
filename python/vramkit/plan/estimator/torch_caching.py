"""A model of PyTorch's CUDA caching allocator, to predict the memory it would reserve.

Its one job: given the allocations and frees of a training or inference step, say how many
bytes PyTorch's own allocator (c10/cuda/CUDACachingAllocator.cpp, PyTorch 2.11) would hold
reserved at its peak, whether it would run out of memory under a given cap, and the smallest
cap under which it would not. It handles no memory: blocks are numbers (an address and a
size), and the model follows the allocator's decisions about them.

What it models, in both modes (the default, where each segment comes from one cudaMalloc,
and ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, where a segment is a virtual
range that grows page by page):

- the rounding of requests (512 B units; roundup_power2_divisions when asked for);
- the two pools (requests up to 1 MiB in the small pool, the rest in the large one), the
  size of a new segment, and best fit by (stream, size, address) within a pool and stream;
- splitting (small pool and expandable segments: a remainder of 512 B or more; large pool:
  more than 1 MiB, and only below max_split_size), the oversize rules of max_split_size
  and max_non_split_rounding, and coalescing with free neighbours on free;
- running out: a cap (the allocator's memory fraction, here ``capacity`` in bytes) checked
  before each new segment, then the release of oversize cached blocks (only with
  max_split_size), then of every unsplit cached segment (expandable: every free page),
  then a retry, then out of memory; garbage_collection_threshold when asked for;
- expandable segments: one virtual segment per stream and pool, mapped in pages of 2 MiB
  (small pool) and 20 MiB (large pool), filled at the lowest address that fits, unmapped
  page by page when the cache is released.

What it leaves out: CUDA graphs and private pools, record_stream and the events it
implies (a free here is final at once), IPC, peer access, and the driver below the
allocator. A real cudaMalloc can also fail for lack of physical memory (the model knows
only the cap, which, as in PyTorch, expandable segments may overshoot by part of a page),
and the driver chooses where a segment goes: the model assumes each new one lies below
the earlier ones (see _take_addresses). That choice decides which of two equal free
blocks best fit takes, and through it, on some traces, the peak by a few per cent.
"""

from __future__ import annotations

import os
from bisect import bisect_left, bisect_right, insort
from collections import deque

MiB = 1 << 20

# The allocator's constants, under their names in CUDACachingAllocator.cpp.
MIN_BLOCK_SIZE = 512               # kMinBlockSize: every request is rounded up to this unit
SMALL_SIZE = 1 * MiB               # kSmallSize: the largest request of the small pool
SMALL_BUFFER = 2 * MiB             # kSmallBuffer: a small-pool segment; its expandable page
LARGE_BUFFER = 20 * MiB            # kLargeBuffer: a segment for requests under 10 MiB;
                                   # also the expandable large-pool page (large_segment_size)
MIN_LARGE_ALLOC = 10 * MiB         # kMinLargeAlloc: from here a request gets its own segment
ROUND_LARGE = 2 * MiB              # kRoundLarge: such a segment is rounded up to this

# cudaGetDeviceProperties' totalGlobalMem on an H200: an expandable segment reserves 9/8 of
# the device's memory in address space (ExpandableSegment's constructor), which no replay
# under a smaller capacity can fill.
H200_MEMORY = 143771 * MiB


def round_request(size: int, roundup_power2_divisions: int = 0) -> int:
    """The block size PyTorch gives a request of SIZE bytes (round_size)."""
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    divisions = roundup_power2_divisions
    if divisions > 1 and size > MIN_BLOCK_SIZE * divisions:
        # roundup_power2_next_division: the next of DIVISIONS equal steps between the
        # powers of two around SIZE.
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor >> (divisions.bit_length() - 1)
        if step == 0:
            return floor << 1
        rounded_down = size & ~(step - 1)
        return size if rounded_down == size else rounded_down + step
    return -(-size // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def segment_size_for(rounded: int) -> int:
    """The bytes a new segment for a request of ROUNDED bytes asks for (get_allocation_size)."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-rounded // ROUND_LARGE) * ROUND_LARGE


class _Block:
    """A contiguous range of one segment: allocated, free, or (expandable) not backed."""

    __slots__ = ("address", "size", "stream", "pool", "segment", "allocated", "mapped",
                 "prev", "next", "gc_base")

    def __init__(self, address, size, stream, pool, segment=None, mapped=True):
        self.address = address
        self.size = size
        self.stream = stream
        self.pool = pool
        self.segment = segment      # the _VirtualSegment of an expandable block, else None
        self.allocated = False
        self.mapped = mapped
        self.prev = None            # neighbours in the same segment, by address
        self.next = None
        self.gc_base = 0            # the pool's lookup count when the block was cached


class _VirtualSegment:
    """An expandable segment: a reserved address range of whole pages."""

    __slots__ = ("base", "page", "size")

    def __init__(self, base, page, size):
        self.base = base
        self.page = page
        self.size = size


class _Pool:
    """The cached blocks of one pool (small or large), kept per stream.

    PyTorch orders a pool's free blocks by (stream, size, address) and never lends a block
    to another stream than its own, so one sorted list of (size, address) per stream gives
    the same best fit. The unmapped ranges of expandable segments are kept by address.
    """

    __slots__ = ("small", "free", "unmapped", "lookups")

    def __init__(self, small):
        self.small = small
        self.free = {}          # stream -> sorted [(size, address)] of free mapped blocks
        self.unmapped = {}      # stream -> sorted [address] of unmapped blocks
        self.lookups = 0        # get_free_blocks_call_count, counted only for the GC


class CachingAllocatorModel:
    """PyTorch's caching allocator on one device, as bookkeeping.

    malloc and free take the place of raw_alloc_with_stream and raw_delete. ``capacity`` is
    the cap that torch.cuda.set_per_process_memory_fraction sets, in bytes (None: no cap).
    The keyword options are those of PYTORCH_CUDA_ALLOC_CONF, in bytes: max_split_size
    (max_split_size_mb, None = unlimited, the default), max_non_split_rounding
    (max_non_split_rounding_mb, default 20 MiB), roundup_power2_divisions (one value for
    every size, 0 = off, the default) and garbage_collection_threshold (0 = off; it acts
    only under a capacity, as in PyTorch).

    ``segment_addresses`` (default mode only): the addresses the driver gave each new
    segment, in order, as a PyTorch memory history's ``segment_alloc`` entries list them.
    The model then places each segment where the card did instead of guessing
    (_take_addresses), and so takes the free block PyTorch took wherever two of one size
    tie; once they run out, later segments go below the lowest of them.
    """

    def __init__(self, *, expandable_segments: bool = False, capacity: int | None = None,
                 max_split_size: int | None = None, max_non_split_rounding: int = LARGE_BUFFER,
                 roundup_power2_divisions: int = 0, garbage_collection_threshold: float = 0.0,
                 segment_addresses=None):
        if capacity is not None:
            _check_bytes("capacity", capacity, allow_zero=True)
        if max_split_size is not None:
            _check_bytes("max_split_size", max_split_size)
            # max_split_size_mb is refused below kLargeBuffer.
            if max_split_size < LARGE_BUFFER:
                raise ValueError(f"max_split_size must be at least {LARGE_BUFFER} bytes "
                                 f"(20 MiB, as PyTorch requires); got {max_split_size}")
        _check_bytes("max_non_split_rounding", max_non_split_rounding)
        if not isinstance(roundup_power2_divisions, int) or roundup_power2_divisions < 0 \
                or roundup_power2_divisions & (roundup_power2_divisions - 1):
            raise ValueError(f"roundup_power2_divisions must be 0 or a power of two; got "
                             f"{roundup_power2_divisions!r}")
        if not 0.0 <= garbage_collection_threshold < 1.0:
            raise ValueError(f"garbage_collection_threshold must be in [0, 1); got "
                             f"{garbage_collection_threshold!r}")
        self.expandable_segments = bool(expandable_segments)
        self.capacity = capacity
        self.max_split_size = max_split_size
        self.max_non_split_rounding = max_non_split_rounding
        self.roundup_power2_divisions = roundup_power2_divisions
        self.garbage_collection_threshold = garbage_collection_threshold
        self._collect_garbage = capacity is not None and garbage_collection_threshold > 0.0
        self._given_addresses = None
        if segment_addresses is not None:
            if expandable_segments:
                raise ValueError("segment_addresses places the default mode's segments; "
                                 "expandable segments are virtual ranges it does not take")
            try:
                self._given_addresses = deque(segment_addresses)
            except TypeError:
                raise TypeError(f"segment_addresses must be an iterable of ints; got "
                                f"{type(segment_addresses).__name__}") from None
            for address in self._given_addresses:
                if isinstance(address, bool) or not isinstance(address, int) or address < 0:
                    raise ValueError(f"a segment address must be an int of 0 or more; got "
                                     f"{address!r}")
        self._spans = []            # sorted (start, end) of segments at given addresses

        self._small = _Pool(small=True)
        self._large = _Pool(small=False)
        self._blocks = {}           # address -> every block there is (any state)
        self._live = {}             # caller's id -> allocated block
        self._next_address = 1 << 60     # addresses go down from here (_take_addresses)
        device_memory = max(H200_MEMORY, capacity or 0)
        self._address_space = device_memory + device_memory // 8

        self._allocated = 0
        self._reserved = 0
        self._peak_allocated = 0
        self._peak_reserved = 0
        self._num_ooms = 0
        self._num_segment_allocs = 0

    # The statistics of torch.cuda.memory_stats that an estimate needs.

    @property
    def allocated(self) -> int:
        """Bytes in allocated blocks, rounded sizes (memory_allocated)."""
        return self._allocated

    @property
    def reserved(self) -> int:
        """Bytes the allocator holds from the device (memory_reserved)."""
        return self._reserved

    @property
    def peak_allocated(self) -> int:
        """The most allocated has been (max_memory_allocated)."""
        return self._peak_allocated

    @property
    def peak_reserved(self) -> int:
        """The most reserved has been (max_memory_reserved)."""
        return self._peak_reserved

    @property
    def num_ooms(self) -> int:
        """Requests that failed for lack of memory."""
        return self._num_ooms

    @property
    def num_segment_allocs(self) -> int:
        """cudaMalloc calls, or page mappings with expandable segments (num_device_alloc)."""
        return self._num_segment_allocs

    def reset_peak_stats(self) -> None:
        """Start the peaks again from the current values (reset_peak_memory_stats)."""
        self._peak_allocated = self._allocated
        self._peak_reserved = self._reserved

    def empty_cache(self) -> None:
        """Give back every cached segment that holds no allocated block (emptyCache)."""
        self._release_cached_blocks()

    # Allocation and free.

    def malloc(self, block_id, size: int, stream: int = 0) -> bool:
        """Allocate SIZE bytes on STREAM under BLOCK_ID. False means out of memory: no block
        is allocated and the live ones are untouched, though, as in PyTorch, the attempt
        has already given cached segments back to the device."""
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"size must be an int number of bytes; got {size!r}")
        if size <= 0:
            raise ValueError(f"size must be a positive number of bytes; got {size} "
                             f"(PyTorch hands out no block for 0 bytes)")
        if isinstance(stream, bool) or not isinstance(stream, int):
            raise TypeError(f"stream must be an int; got {stream!r}")
        if block_id in self._live:
            raise ValueError(f"block id {block_id!r} is already allocated")

        rounded = round_request(size, self.roundup_power2_divisions)
        pool = self._small if rounded <= SMALL_SIZE else self._large
        segment_bytes = segment_size_for(rounded)

        block = self._take_cached_block(pool, stream, rounded)
        if block is None:
            if self._collect_garbage:
                self._garbage_collect()
            # alloc_block, then release_available_cached_blocks and again, then
            # release_cached_blocks and again: the order malloc tries them in.
            block = self._new_memory(pool, stream, rounded, segment_bytes)
            if block is None and self._release_oversize_blocks(pool, stream, rounded):
                block = self._new_memory(pool, stream, rounded, segment_bytes)
            if block is None:
                self._release_cached_blocks()
                block = self._new_memory(pool, stream, rounded, segment_bytes)
            if block is None:
                self._num_ooms += 1
                return False

        if self._should_split(block, rounded):
            block = self._split_front(block, rounded)
        block.allocated = True
        self._live[block_id] = block
        self._allocated += block.size
        if self._allocated > self._peak_allocated:
            self._peak_allocated = self._allocated
        return True

    def free(self, block_id) -> None:
        """Free BLOCK_ID: its block goes back to the cache of the stream it was allocated
        on, merged with free neighbours (free_block). KeyError for an id not allocated."""
        try:
            block = self._live.pop(block_id)
        except KeyError:
            raise KeyError(f"block id {block_id!r} is not allocated") from None
        except TypeError:
            raise KeyError(f"block id {block_id!r} is not allocated (not hashable)") from None
        block.allocated = False
        self._allocated -= block.size
        self._merge(block, block.prev)
        self._merge(block, block.next)
        self._cache(block)

    # Finding a cached block.

    def _take_cached_block(self, pool, stream, rounded):
        """get_free_block: the smallest fitting free block of this stream, under the
        oversize rules; it leaves the cache."""
        if self._collect_garbage:
            pool.lookups += 1
        entries = pool.free.get(stream)
        if not entries:
            return None
        index = bisect_left(entries, (rounded, 0))
        if index == len(entries):
            return None
        block = self._blocks[entries[index][1]]
        if block.segment is not None:
            # A free block with unmapped space after it can grow; best fit compares what a
            # block could grow to, so move on while the next candidate would grow to less.
            while index + 1 < len(entries):
                following = self._blocks[entries[index + 1][1]]
                if _growable_size(following) >= _growable_size(block):
                    break
                index += 1
                block = following
        split_limit = self.max_split_size
        if split_limit is not None:
            # An oversize block (>= max_split_size) serves no smaller request, and an
            # oversize request only a block less than max_non_split_rounding bigger.
            if rounded < split_limit and block.size >= split_limit:
                return None
            if rounded >= split_limit and block.size >= rounded + self.max_non_split_rounding:
                return None
        del entries[index]
        return block

    def _should_split(self, block, rounded):
        remaining = block.size - rounded
        if block.pool.small or self.expandable_segments:
            return remaining >= MIN_BLOCK_SIZE
        # The large pool keeps a remainder of 1 MiB or less with the block (kSmallSize),
        # and never splits a request at or over max_split_size.
        below_limit = self.max_split_size is None or rounded < self.max_split_size
        return below_limit and remaining > SMALL_SIZE

    def _split_front(self, block, rounded):
        """alloc_found_block's split: the front ROUNDED bytes become the allocated block,
        the rest stays cached in place."""
        front = _Block(block.address, rounded, block.stream, block.pool, block.segment)
        front.prev = block.prev
        if front.prev is not None:
            front.prev.next = front
        front.next = block
        block.prev = front
        block.address += rounded
        block.size -= rounded
        self._blocks[front.address] = front
        self._blocks[block.address] = block
        self._cache(block)
        return front

    # Getting memory from the device.

    def _new_memory(self, pool, stream, rounded, segment_bytes):
        """alloc_block: a new segment, or more mapped pages, or None when the cap forbids."""
        # The cap is checked against the request's segment size even when expandable
        # segments end up mapping less (or, a page being 20 MiB, more).
        if self.capacity is not None and self._reserved + segment_bytes > self.capacity:
            return None
        if self.expandable_segments:
            return self._grow_expandable(pool, stream, rounded)
        address = self._take_addresses(segment_bytes)
        block = _Block(address, segment_bytes, stream, pool)
        self._blocks[address] = block
        self._add_reserved(segment_bytes)
        return block

    def _take_addresses(self, size):
        # Where the driver puts a segment decides which of two equal free blocks best fit
        # takes (the lower address). Unless told where the card put them, the model places
        # each new segment below the ones before it, as Linux hands out mappings top-down,
        # and never reuses a released range. No rule fits every card: the driver packs
        # segments of different sizes into regions of its own, and two cards of one driver
        # version place one step's segments differently (Note [Where the driver puts a
        # segment], docs/performance.md). Placing them bottom-up instead changes no figure
        # of gpt2_train or bert_infer_varlen but moves stream_prefetch (default mode) from
        # 1.781 to 1.689 times its peak live, where PyTorch measured 1.754.
        if self._given_addresses:
            return self._take_given_address(size)
        self._next_address -= -(-size // ROUND_LARGE) * ROUND_LARGE
        return self._next_address

    def _take_given_address(self, size):
        address = self._given_addresses.popleft()
        end = address + size
        index = bisect_right(self._spans, (address, end))
        if (index > 0 and self._spans[index - 1][1] > address) or \
                (index < len(self._spans) and self._spans[index][0] < end):
            raise ValueError(f"segment address {address:#x} ({size} bytes) overlaps a "
                             f"segment the model holds: the addresses do not belong to "
                             f"these events")
        self._spans.insert(index, (address, end))
        # Once the given addresses run out, later segments go below all of them.
        self._next_address = min(self._next_address, address)
        return address

    def _add_reserved(self, size):
        self._reserved += size
        self._num_segment_allocs += 1
        if self._reserved > self._peak_reserved:
            self._peak_reserved = self._reserved

    # Expandable segments.

    def _grow_expandable(self, pool, stream, rounded):
        """try_allocate_expandable_block: map pages at the lowest address where ROUNDED
        bytes fit, joining a free block just before them, and return the grown block."""
        candidate = self._find_expandable_start(pool, stream, rounded)
        if not candidate.mapped:
            self._map(candidate, min(candidate.size, rounded))
        while candidate.size < rounded:
            # The candidate is free and followed by unmapped space: map what is missing,
            # which merges the candidate into the newly mapped block.
            grown = candidate.next
            self._map(grown, min(rounded - candidate.size, grown.size))
            candidate = grown
        self._uncache(candidate)
        return candidate

    def _find_expandable_start(self, pool, stream, rounded):
        """find_expandable_block: the first unmapped range of this stream's segments (by
        address) that, with a free block just before it and free or unmapped space after,
        holds ROUNDED bytes; else a new segment."""
        for address in pool.unmapped.get(stream, ()):
            start = self._blocks[address]
            if start.prev is not None and not start.prev.allocated:
                start = start.prev
            room, block = 0, start
            while room < rounded and block is not None and not block.allocated:
                room += block.size
                block = block.next
            if room >= rounded:
                return start
        page = SMALL_BUFFER if pool.small else LARGE_BUFFER
        # A segment spans the device's memory, as PyTorch reserves it; a request larger
        # than that (a step estimated for a card larger than the model's H200, with no
        # cap) gets a segment that holds it, as a card that large would give.
        size = -(-max(self._address_space, rounded) // page) * page
        segment = _VirtualSegment(self._take_addresses(size), page, size)
        block = _Block(segment.base, size, stream, pool, segment, mapped=False)
        self._blocks[segment.base] = block
        self._park_unmapped(block)
        return block

    def _map(self, block, size):
        """map_block: back the first SIZE bytes of unmapped BLOCK (whole pages), leave the
        rest unmapped, and merge the mapped part with free neighbours."""
        page = block.segment.page
        mapped = -(-size // page) * page
        self._unpark_unmapped(block)
        block.mapped = True
        if mapped < block.size:
            rest = _Block(block.address + mapped, block.size - mapped, block.stream,
                          block.pool, block.segment, mapped=False)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = mapped
            self._blocks[rest.address] = rest
            self._park_unmapped(rest)
        self._merge(block, block.prev)
        self._merge(block, block.next)
        self._cache(block)
        self._add_reserved(mapped)

    def _unmap(self, block):
        """unmap_block: give back the whole pages inside free BLOCK; the partial pages at
        its ends stay mapped as free blocks."""
        segment = block.segment
        page = segment.page
        offset = block.address - segment.base
        first_page = -(-offset // page)
        end_page = (offset + block.size) // page
        if first_page >= end_page:
            return
        self._uncache(block)
        old_address = block.address
        start = segment.base + first_page * page
        length = (end_page - first_page) * page
        before = start - old_address
        after = block.size - before - length
        block.address, block.size, block.mapped = start, length, False
        self._blocks[start] = block
        if before > 0:
            head = _Block(old_address, before, block.stream, block.pool, segment)
            head.prev, head.next = block.prev, block
            if block.prev is not None:
                block.prev.next = head
            block.prev = head
            self._blocks[old_address] = head
            self._cache(head)
        if after > 0:
            tail = _Block(start + length, after, block.stream, block.pool, segment)
            tail.prev, tail.next = block, block.next
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            self._blocks[tail.address] = tail
            self._cache(tail)
        self._merge(block, block.prev)
        self._merge(block, block.next)
        self._park_unmapped(block)
        self._reserved -= length

    # Giving memory back.

    def _release_cached_blocks(self):
        """release_cached_blocks: the large pool, then the small one."""
        for pool in (self._large, self._small):
            cached = [self._blocks[address] for stream in sorted(pool.free)
                      for _, address in pool.free[stream]]
            for block in cached:
                if block.segment is None:
                    if block.prev is None and block.next is None:
                        self._release_segment(block)
            for block in cached:
                if block.segment is not None:
                    self._unmap(block)
                    # The block may have grown into the whole segment, unmapped: then the
                    # segment itself goes (release_expandable_segment).
                    if block.prev is None and block.next is None and not block.mapped:
                        self._unpark_unmapped(block)
                        del self._blocks[block.address]

    def _release_segment(self, block):
        """release_block: cudaFree a whole cached segment."""
        self._uncache(block)
        del self._blocks[block.address]
        self._reserved -= block.size
        if self._spans:
            index = bisect_left(self._spans, (block.address, block.address + block.size))
            if index < len(self._spans) and self._spans[index][0] == block.address:
                del self._spans[index]

    def _release_oversize_blocks(self, pool, stream, rounded):
        """release_available_cached_blocks: with max_split_size set, free the smallest
        oversize cached block that covers the request, or else the largest ones until they
        add up to it. True when enough was freed."""
        split_limit = self.max_split_size
        if split_limit is None:
            return False
        entries = pool.free.get(stream, [])
        wanted = max(rounded, split_limit)
        index = bisect_left(entries, (wanted, 0))
        if index < len(entries) and self._blocks[entries[index][1]].segment is None:
            self._release_segment(self._blocks[entries[index][1]])
            return True
        released = 0
        candidates = [self._blocks[address] for size, address in reversed(entries[:index])]
        for block in candidates:
            if released >= wanted or block.size < split_limit:
                break
            if block.segment is None:
                released += block.size
                self._release_segment(block)
        return released >= wanted

    def _garbage_collect(self):
        """garbage_collect_cached_blocks: above the threshold's share of the capacity, free
        the unsplit large cached segments that have waited longest, in rounds, until the
        excess is reclaimed."""
        limit = int(self.garbage_collection_threshold * self.capacity)
        if self._reserved <= limit:
            return
        target = self._reserved - limit
        pool = self._large

        def unsplit():
            return [self._blocks[address] for stream in sorted(pool.free)
                    for _, address in pool.free[stream]
                    if self._blocks[address].prev is None
                    and self._blocks[address].next is None]

        candidates = unsplit()
        if not candidates:
            return
        total_age = sum(pool.lookups - block.gc_base for block in candidates)
        count = len(candidates)
        reclaimed = 0
        freed_one = True
        while reclaimed < target and freed_one and count > 0:
            threshold = total_age / count
            freed_one = False
            for block in unsplit():
                age = pool.lookups - block.gc_base
                if block.segment is None and age >= threshold:
                    freed_one = True
                    reclaimed += block.size
                    total_age -= age
                    count -= 1
                    self._release_segment(block)

    # The cache's containers.

    def _merge(self, block, neighbour):
        """try_merge_blocks: BLOCK absorbs NEIGHBOUR when it is free and mapped alike.
        BLOCK itself is in no container while this runs."""
        if neighbour is None or neighbour.allocated or neighbour.mapped != block.mapped:
            return
        if neighbour.mapped:
            self._uncache(neighbour)
        else:
            self._unpark_unmapped(neighbour)
        if neighbour is block.prev:
            del self._blocks[block.address]
            block.address = neighbour.address
            self._blocks[block.address] = block
            block.prev = neighbour.prev
            if block.prev is not None:
                block.prev.next = block
        else:
            del self._blocks[neighbour.address]
            block.next = neighbour.next
            if block.next is not None:
                block.next.prev = block
        block.size += neighbour.size

    def _cache(self, block):
        pool = block.pool
        entries = pool.free.get(block.stream)
        if entries is None:
            entries = pool.free[block.stream] = []
        insort(entries, (block.size, block.address))
        block.gc_base = pool.lookups

    def _uncache(self, block):
        entries = block.pool.free[block.stream]
        del entries[bisect_left(entries, (block.size, block.address))]

    def _park_unmapped(self, block):
        entries = block.pool.unmapped.get(block.stream)
        if entries is None:
            entries = block.pool.unmapped[block.stream] = []
        insort(entries, block.address)

    def _unpark_unmapped(self, block):
        entries = block.pool.unmapped[block.stream]
        del entries[bisect_left(entries, block.address)]


def _growable_size(block):
    """What a free expandable block could grow to: itself and the unmapped space after it."""
    following = block.next
    if following is not None and not following.mapped:
        return block.size + following.size
    return block.size


def _check_bytes(name, value, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int number of bytes; got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be a positive number of bytes; got {value}")


def replay(events, *, expandable_segments=False, capacity=None, **options) -> dict:
    """Run EVENTS through a fresh model, as the reference replay runs a trace through
    PyTorch: ("a", id, size, stream) allocates with raw_alloc_with_stream (size 0 gets
    no block, as there), ("f", id, stream) frees with raw_delete (on the block's own
    stream; a free of an id that is not allocated is skipped). An allocation that runs
    out of memory is counted and the replay goes on, its id never allocated. OPTIONS are
    CachingAllocatorModel's keyword options. Returns peak_allocated, peak_reserved, ooms
    and segment_allocs."""
    model = CachingAllocatorModel(expandable_segments=expandable_segments,
                                  capacity=capacity, **options)
    malloc, free, live = model.malloc, model.free, model._live
    for event in events:
        tag = event[0]
        if tag == "a":
            size = event[2]
            if size == 0:
                continue
            malloc(event[1], size, event[3])
        elif tag == "f":
            if event[1] in live:
                free(event[1])
        else:
            raise ValueError(f"unknown event {event!r}: expected ('a', id, size, stream) "
                             f"or ('f', id, stream)")
    return {"peak_allocated": model.peak_allocated, "peak_reserved": model.peak_reserved,
            "ooms": model.num_ooms, "segment_allocs": model.num_segment_allocs}


def min_capacity(events, *, expandable_segments=False, granularity=2 << 20, **options) -> int:
    """The smallest capacity (within GRANULARITY bytes) under which EVENTS replay without
    running out of memory: bisection between the peak allocated of a replay without a cap,
    which no smaller capacity can hold, and four times it (doubled further if even that
    fails)."""
    _check_bytes("granularity", granularity)
    events = list(events)

    def fits(capacity):
        return replay(events, expandable_segments=expandable_segments, capacity=capacity,
                      **options)["ooms"] == 0

    low = replay(events, expandable_segments=expandable_segments, **options)["peak_allocated"]
    if low == 0 or fits(low):
        return low
    high = 4 * low
    while not fits(high):
        if high > 64 * low:
            raise ValueError("the events run out of memory even under 64 times their "
                             "peak allocation")
        low, high = high, 2 * high
    while high - low > granularity:
        middle = low + (high - low) // 2
        if fits(middle):
            high = middle
        else:
            low = middle
    return high


def read_trace(path) -> list:
    """The events of a vramkit trace file (``# vramkit-trace v1``, gzip or not) as replay
    takes them, read and checked by the library's trace reader (``_core.trace_read``, the
    one ``vramkit replay`` uses), under its default limit on ops; frees of ids that are not
    allocated (blocks from before the recording began) are left out. A file it refuses is
    a PlotInputError naming the file and the reason, as for ``vramkit plot``."""
    from ... import _core
    from ...plot._read import PlotInputError

    try:
        ops, _unmatched = _core.trace_read(os.fspath(path), -1)
    except _core.VramError as error:
        raise PlotInputError(str(error)) from None
    return [("a", ident, size, stream) if is_alloc else ("f", ident, stream)
            for is_alloc, ident, size, stream, _time in ops]

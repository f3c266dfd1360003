"""Many processes: every rank's vramkit statistics gathered to one rank, and files per rank.

A data-parallel job runs one process per GPU (``torchrun``, ``torch.multiprocessing``,
Slurm); each has its own vramkit pools, so each knows only its own memory. This module puts
them side by side:

    torch.distributed.init_process_group("nccl")     # or "gloo" on CPU / the sim source
    torch.cuda.set_device(local_rank)                # NCCL's object collectives need it
    ...
    text = vramkit.distributed.memory_summary()      # str on rank 0, None elsewhere
    if text:
        print(text)

:func:`gather_stats` gathers each rank's :func:`local_stats` (allocated, reserved, peaks,
largest free block, fragmentation, OOMs, ... plus rank, world size, hostname, pid, device
ordinal, GPU UUID and source) to one rank with ``torch.distributed.gather_object``, which
works on every backend: on gloo the objects travel through CPU tensors; on NCCL through CUDA
tensors on ``torch.cuda.current_device()``, so each rank must have called
``torch.cuda.set_device()`` on its own GPU first (as torchrun scripts do; otherwise every
rank uses GPU 0, and the gather hangs or fails). :func:`memory_summary` formats the gathered
list: one table per physical device (ranks grouped by hostname and GPU UUID, or device
ordinal where there is no UUID, as on the sim source) and one across all ranks with min, max,
mean and imbalance (max / mean), naming the rank that holds the max; :func:`summarize` gives
those numbers as a dict.

Both are collectives: every rank of the group must call them, in the same order as the
group's other collectives. Without an initialised process group they raise RuntimeError
(naming ``init_process_group``) rather than quietly answering for one process: a script that
forgot to initialise should not print a one-rank table as if it were the job's. A single
process reads :func:`local_stats` (or ``vramkit.memory_stats()``) directly.

Files per rank: :func:`rank_path` turns ``"mem.jsonl"`` into ``"mem.rank3.jsonl"``, the rank
from torch.distributed when initialised, else from ``RANK`` / ``LOCAL_RANK`` (set by
torchrun before the script starts, so it works before ``init_process_group``). Pass its
result to ``vramkit.MemoryLogger``, ``vramkit.dump_snapshot`` or ``vramkit.save_trace``, or
use this module's :class:`MemoryLogger` (the same logger, its file named per rank and a
``"rank"`` field in every record) and :func:`dump_snapshot`.

``import vramkit.distributed`` imports no framework: torch is imported by the collectives
only, and :func:`rank_path` looks at torch.distributed only if the program imported it.
"""

from __future__ import annotations

import os
import pathlib
import socket
import sys

from .. import _core
from . import logger as _logger

__all__ = ["MemoryLogger", "dump_snapshot", "gather_stats", "local_stats", "memory_summary",
           "rank_path", "summarize"]

# The figures memory_summary compares across ranks: (record key, row name, kind).
METRICS = (("allocated", "allocated", "bytes"), ("reserved", "reserved", "bytes"),
           ("peak_allocated", "peak allocated", "bytes"),
           ("peak_reserved", "peak reserved", "bytes"),
           ("fragmentation", "fragmentation", "share"))

# The engine's stats copied into a record as (current, peak) pairs, and its counters.
_STATS = (("allocated", "allocated_bytes"), ("reserved", "reserved_bytes"),
          ("active", "active_bytes"), ("requested", "requested_bytes"))
_COUNTERS = ("num_ooms", "num_alloc_retries", "num_mallocs", "num_frees",
             "num_device_alloc", "num_device_free")

_uuids: dict[int, str | None] = {}  # device ordinal -> GPU UUID (None: none known)


# ---------------------------------------------------------------------------------------
# Ranks.
# ---------------------------------------------------------------------------------------

def _initialised_dist():
    """torch.distributed if the program imported it and initialised a process group."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def _env_rank() -> int | None:
    for name in ("RANK", "LOCAL_RANK"):
        text = os.environ.get(name, "").strip()
        if text:
            try:
                value = int(text)
            except ValueError:
                value = -1
            if value < 0:
                raise ValueError(f"{name}={os.environ[name]!r} is not a rank (an int >= 0)")
            return value
    return None


def _current_rank() -> int | None:
    """This process's rank: torch.distributed's (global) when initialised, else RANK, else
    LOCAL_RANK, else None."""
    dist = _initialised_dist()
    if dist is not None:
        return dist.get_rank()
    return _env_rank()


def _check_rank(rank, what: str = "rank") -> int:
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise TypeError(f"{what} must be an int, not {type(rank).__name__}")
    if rank < 0:
        raise ValueError(f"{what} must be >= 0, got {rank}")
    return rank


def rank_path(path, rank: int | None = None):
    """path with ``.rank<R>`` put before the file name's first suffix: ``"mem.jsonl"`` ->
    ``"mem.rank3.jsonl"``, ``"out/trace.gz"`` -> ``"out/trace.rank3.gz"``, ``"log"`` ->
    ``"log.rank3"`` (leading dots belong to the name: ``".mem.jsonl"`` ->
    ``".mem.rank3.jsonl"``; directories are left alone). rank None: torch.distributed's rank
    when a process group is initialised, else the ``RANK`` variable, else ``LOCAL_RANK``;
    with none of them the path comes back unchanged (a single process keeps its file name).
    A name that has the rank already is returned as it is, so applying it twice is harmless.
    A str gives a str, a pathlib path a path of its type, another os.PathLike a str."""
    if isinstance(path, (bytes, bytearray)):
        raise TypeError("rank_path() takes a str or os.PathLike path, not bytes")
    text = os.fspath(path)  # TypeError for anything that is not a path
    if isinstance(text, bytes):
        raise TypeError("rank_path() takes a str or os.PathLike path, not a bytes path")
    rank = _current_rank() if rank is None else _check_rank(rank)
    head, name = os.path.split(text)
    if not name or name in (".", ".."):
        raise ValueError(f"rank_path(): {text!r} names a directory, not a file")
    if rank is None:
        return path
    lead = len(name) - len(name.lstrip("."))
    dot = name.find(".", lead)
    stem, rest = (name, "") if dot < 0 else (name[:dot], name[dot:])
    tag = f".rank{rank}"
    if rest == tag or rest.startswith(tag + "."):
        new = text
    else:
        new = os.path.join(head, stem + tag + rest) if head else stem + tag + rest
    return type(path)(new) if isinstance(path, pathlib.PurePath) else new


# ---------------------------------------------------------------------------------------
# One rank's figures.
# ---------------------------------------------------------------------------------------

def _default_device() -> int:
    """The device a rank means by None: torch's current CUDA device when this process has
    initialised CUDA (what torch.cuda.set_device(local_rank) chose), else device 0."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is not None:
        try:
            if cuda.is_initialized():
                return int(cuda.current_device())
        except Exception:  # a broken CUDA set-up: vramkit's own default
            pass
    return 0


def _resolve_device(device) -> int:
    from .. import _device

    return _default_device() if device is None else _device(device)


def _uuid(device: int, source: str | None) -> str | None:
    """The GPU's UUID (NVML's, through CUDA_VISIBLE_DEVICES), or None: the sim sources have
    no GPU, and without NVML no UUID is known."""
    if source is None or source.startswith("sim"):
        return None
    if device not in _uuids:
        try:
            from ._nvml import visible_uuids

            visible = visible_uuids()
            _uuids[device] = visible[device] if visible and device < len(visible) else None
        except Exception:  # no NVML, an old driver: group by ordinal instead
            _uuids[device] = None
    return _uuids[device]


def local_stats(device=None) -> dict:
    """This process's record for the device, as gather_stats() gathers it; no communication.

    Keys: rank, world_size, group_rank (torch.distributed's when initialised, else RANK /
    WORLD_SIZE from the environment, else None), local_rank (LOCAL_RANK or None), hostname,
    pid, device (the ordinal in this process), uuid (the GPU's, None on sim or without
    NVML), source, in_use (whether the device's pool exists); allocated, reserved, active,
    requested and peak_<each> in bytes, largest_free_block, fragmentation (0 to 1),
    limit_bytes, num_ooms, num_alloc_retries, num_mallocs, num_frees, num_device_alloc,
    num_device_free; and memory_stats, the whole vramkit.memory_stats() dict. A device
    whose pool is not in use reports zeros and is not created (configure() stays possible).
    device None: torch's current CUDA device if this process initialised CUDA, else 0."""
    from .. import _pool_in_use, memory_stats

    d = _resolve_device(device)
    dist = _initialised_dist()
    if dist is not None:
        rank, world, group_rank = dist.get_rank(), dist.get_world_size(), dist.get_rank()
    else:
        rank = _env_rank()
        world_text = os.environ.get("WORLD_SIZE", "").strip()
        world = int(world_text) if world_text.isdigit() else None
        group_rank = rank
    local_text = os.environ.get("LOCAL_RANK", "").strip()
    in_use = _pool_in_use(d)
    source = _core.source(d) if in_use else None  # source() would create the pool
    record = {"rank": rank, "world_size": world, "group_rank": group_rank,
              "local_rank": int(local_text) if local_text.isdigit() else None,
              "hostname": socket.gethostname(), "pid": os.getpid(), "device": d,
              "uuid": _uuid(d, source), "source": source, "in_use": in_use}
    raw = _core.stats(d) if in_use else None
    for key, stat in _STATS:
        current, peak = (raw[stat][0], raw[stat][1]) if raw else (0, 0)
        record[key] = current
        record[f"peak_{key}"] = peak
    record["largest_free_block"] = raw["largest_free_block"] if raw else 0
    record["fragmentation"] = raw["fragmentation"] if raw else 0.0
    record["limit_bytes"] = raw["limit_bytes"] if raw else 0
    for key in _COUNTERS:
        record[key] = raw[key] if raw else 0
    record["memory_stats"] = memory_stats(d) if raw else {}
    return record


# ---------------------------------------------------------------------------------------
# The collectives.
# ---------------------------------------------------------------------------------------

def _dist(caller: str):
    try:
        import torch.distributed as dist
    except ImportError as error:
        raise RuntimeError(f"vramkit.distributed.{caller}() needs PyTorch's torch.distributed "
                           f"({error})") from None
    if not dist.is_available():
        raise RuntimeError(f"vramkit.distributed.{caller}(): this PyTorch was built without "
                           f"torch.distributed")
    if not dist.is_initialized():
        raise RuntimeError(
            f"vramkit.distributed.{caller}(): torch.distributed is not initialised: call "
            f"torch.distributed.init_process_group() on every rank first (backend 'gloo' on "
            f"CPU, 'nccl' on GPUs); in a single process, read "
            f"vramkit.distributed.local_stats() or vramkit.memory_stats()")
    return dist


def _group_ranks(dist, group) -> list[int] | None:
    """The global ranks of the group in group-rank order; None if this process is not in it."""
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    if dist.get_rank(group) < 0:
        return None
    return list(dist.get_process_group_ranks(group))


def _check_dst(dst, ranks: list[int], caller: str) -> int:
    if isinstance(dst, bool) or not isinstance(dst, int):
        raise TypeError(f"vramkit.distributed.{caller}(): dst must be an int (a global rank), "
                        f"not {type(dst).__name__}")
    if dst not in ranks:
        shown = f"0 to {len(ranks) - 1}" if ranks == list(range(len(ranks))) else \
            ", ".join(map(str, ranks))
        raise ValueError(f"vramkit.distributed.{caller}(): dst={dst} is not a rank of the "
                         f"group (its global ranks: {shown})")
    return dst


def _gather(group, device, dst, caller):
    dist = _dist(caller)
    ranks = _group_ranks(dist, group)
    if ranks is None:
        return None, None  # not in the group: nothing to send, as torch's collectives do
    dst = ranks[0] if dst is None else _check_dst(dst, ranks, caller)
    record = local_stats(device)
    record["rank"] = dist.get_rank()
    record["world_size"] = dist.get_world_size()
    record["group_rank"] = ranks.index(record["rank"])
    out = [None] * len(ranks) if record["rank"] == dst else None
    dist.gather_object(record, out, dst=dst, group=group)
    if out is None:
        return None, dst
    return sorted(out, key=lambda r: r["rank"]), dst


def gather_stats(group=None, device=None, dst: int = 0) -> list[dict] | None:
    """Every rank's :func:`local_stats` for its device, gathered to rank dst (a global rank,
    as torch.distributed's dst is; it must belong to the group) with
    torch.distributed.gather_object. Rank dst gets the list ordered by rank; the other ranks
    (and processes outside the group) get None.

    A collective: every rank of the group calls it. group: a process group (None: the
    default one). device: this rank's vramkit device (None: torch's current CUDA device if
    CUDA is initialised, else 0); each rank may pass its own. On NCCL, call
    torch.cuda.set_device(local_rank) first: the gather moves the pickled records through
    tensors on torch.cuda.current_device(). Raises RuntimeError if torch.distributed is not
    initialised, TypeError / ValueError for a dst that is not an int / not in the group
    (checked on every rank before any communication, so no rank is left waiting)."""
    stats, _ = _gather(group, device, dst, "gather_stats")
    return stats


def _spread(values: list[tuple[int, float]]) -> dict:
    """min / max (with the first rank holding each), mean and imbalance of (rank, value)."""
    lo = min(values, key=lambda rv: rv[1])
    hi = max(values, key=lambda rv: rv[1])  # max() keeps the first of equal values
    mean = sum(v for _, v in values) / len(values)
    return {"min": lo[1], "min_rank": lo[0], "max": hi[1], "max_rank": hi[0], "mean": mean,
            "imbalance": hi[1] / mean if mean else 1.0}


def _device_key(r: dict) -> tuple:
    """A physical device: (hostname, GPU UUID), or (hostname, ordinal) without a UUID."""
    if r["uuid"]:
        return (r["hostname"], r["uuid"], -1)
    return (r["hostname"], "", r["device"])


def summarize(stats: list[dict]) -> dict:
    """The numbers memory_summary() prints, from gather_stats()'s list (no communication):
    {"ranks": n, "hosts": n, "metrics": {key: {min, min_rank, max, max_rank, mean,
    imbalance}} for each key of METRICS, "num_ooms": total, "devices": [{hostname, device,
    uuid, ranks, "sum": {key: total bytes}, "metrics": {...as above, over its ranks}}]}.
    imbalance is max / mean (1.0 when the mean is 0); min_rank and max_rank are the lowest
    rank holding that value. Devices are told apart by (hostname, GPU UUID), or (hostname,
    ordinal) where no UUID is known (sim; no NVML)."""
    if not stats:
        raise ValueError("summarize(): no ranks' statistics given")
    stats = sorted(stats, key=lambda r: r["rank"])
    metrics = {key: _spread([(r["rank"], r[key]) for r in stats]) for key, _, _ in METRICS}
    groups: dict[tuple, list[dict]] = {}
    for r in stats:
        groups.setdefault(_device_key(r), []).append(r)
    devices = []
    for key in sorted(groups):
        members = groups[key]
        first = members[0]
        devices.append({
            "hostname": first["hostname"], "device": first["device"], "uuid": first["uuid"],
            "source": first["source"], "ranks": [r["rank"] for r in members],
            "sum": {k: sum(r[k] for r in members) for k, _, kind in METRICS if kind == "bytes"},
            "metrics": {k: _spread([(r["rank"], r[k]) for r in members])
                        for k, _, _ in METRICS},
        })
    return {"ranks": len(stats), "hosts": len({r["hostname"] for r in stats}),
            "metrics": metrics, "num_ooms": sum(r["num_ooms"] for r in stats),
            "devices": devices}


def _cell(value, kind: str) -> str:
    if kind == "share":
        return f"{value * 100:.1f}%"
    return _logger._size(value)


def _table(title: str, head: list[str], rows: list[list[str]]) -> list[str]:
    """A box in the style of vramkit.memory_summary(): the first column left-aligned."""
    widths = [max(len(row[i]) for row in [head] + rows) for i in range(len(head))]

    def line(cells):
        parts = [cells[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "| " + " | ".join(parts) + " |"

    inner = len(line(head)) - 2
    if len(title) + 2 > inner:  # a long title widens the first column
        widths[0] += len(title) + 2 - inner
        inner = len(title) + 2
    return ["|" + "=" * inner + "|", "|" + title.center(inner) + "|", "|" + "-" * inner + "|",
            line(head), "|" + "-" * inner + "|"] + [line(r) for r in rows] + \
        ["|" + "=" * inner + "|"]


def _format(stats: list[dict]) -> str:
    s = summarize(stats)
    world = stats[0]["world_size"]
    out = [f"vramkit memory across {s['ranks']} ranks (world size {world}), "
           f"{s['hosts']} host{'s' if s['hosts'] != 1 else ''}, {len(s['devices'])} "
           f"device{'s' if len(s['devices']) != 1 else ''}; {s['num_ooms']} OOMs"]
    by_rank = {r["rank"]: r for r in stats}
    head = ["rank", "pid"] + [name for _, name, _ in METRICS] + ["largest free", "OOMs"]
    for dev in s["devices"]:
        name = f"GPU {dev['uuid']}" if dev["uuid"] else f"device {dev['device']}"
        source = f" ({dev['source']})" if dev["source"] else ""
        title = f"{dev['hostname']}, {name}{source}: rank{'s' if len(dev['ranks']) > 1 else ''}" \
                f" {', '.join(map(str, dev['ranks']))}"
        rows = []
        for rank in dev["ranks"]:
            r = by_rank[rank]
            rows.append([str(rank), str(r["pid"])] + [_cell(r[k], kind) for k, _, kind in METRICS]
                        + [_size_or_unused(r), str(r["num_ooms"])])
        if len(dev["ranks"]) > 1:
            m = dev["metrics"]
            rows.append(["sum", ""] + [_cell(dev["sum"][k], kind) if kind == "bytes" else ""
                                       for k, _, kind in METRICS] + ["", ""])
            rows.append(["max", ""] + [f"{_cell(m[k]['max'], kind)} (r{m[k]['max_rank']})"
                                       for k, _, kind in METRICS] + ["", ""])
            rows.append(["max/mean", ""] + [f"{m[k]['imbalance']:.2f}" for k, _, _ in METRICS]
                        + ["", ""])
        out.append("")
        out.extend(_table(title, head, rows))
    rows = []
    for key, name, kind in METRICS:
        m = s["metrics"][key]
        rows.append([name, _cell(m["min"], kind), str(m["min_rank"]), _cell(m["max"], kind),
                     str(m["max_rank"]), _cell(m["mean"], kind), f"{m['imbalance']:.2f}"])
    out.append("")
    out.extend(_table(f"all {s['ranks']} ranks", ["metric", "min", "rank", "max", "rank",
                                                  "mean", "max/mean"], rows))
    return "\n".join(out) + "\n"


def _size_or_unused(r: dict) -> str:
    return _logger._size(r["largest_free_block"]) if r["in_use"] else "pool unused"


def memory_summary(group=None, device=None, *, dst: int | None = None) -> str | None:
    """A text summary of every rank's memory, on one rank: one table per physical device
    (its ranks, their sum, the max and max/mean where several share it) and one across all
    ranks with min, max, mean and imbalance (max / mean) of allocated, reserved, peak
    allocated, peak reserved and fragmentation, naming the rank of the min and of the max.
    The rank dst (None: the group's first rank, rank 0 for the default group) gets the
    str, the others None. A collective, as gather_stats() (same arguments, same errors)."""
    stats, _ = _gather(group, device, dst, "memory_summary")
    return None if stats is None else _format(stats)


# ---------------------------------------------------------------------------------------
# Files per rank.
# ---------------------------------------------------------------------------------------

class MemoryLogger(_logger.MemoryLogger):
    """vramkit.MemoryLogger, one file per rank: a path goes through rank_path() ("mem.jsonl"
    -> "mem.rank3.jsonl") and every record gets a "rank" field (the first of the extras: a
    CSV column after the standard ones). rank None: rank_path()'s rank (torch.distributed,
    RANK, LOCAL_RANK); with none known the file name is unchanged and "rank" is None. A
    callable instead of a path receives the records, rank included. Other arguments are
    vramkit.MemoryLogger's."""

    def __init__(self, path_or_callback, every: int = 1, device=None, *, rank: int | None = None,
                 **kwargs):
        self.rank = _current_rank() if rank is None else _check_rank(rank)
        if isinstance(path_or_callback, (str, os.PathLike)):
            path_or_callback = rank_path(path_or_callback, self.rank) \
                if self.rank is not None else path_or_callback
        super().__init__(path_or_callback, every, device, **kwargs)

    def step(self, step_number: int | None = None, step_time: float | None = None,
             **extra) -> dict | None:
        if "rank" in extra:
            raise ValueError("MemoryLogger.step(): 'rank' is this logger's own field "
                             "(give rank= to the constructor)")
        return super().step(step_number, step_time, rank=self.rank, **extra)

    def summary(self) -> str:
        text = super().summary()
        if self.rank is None:
            return text
        return text.replace("vramkit memory log (", f"vramkit memory log (rank {self.rank}, ", 1)


def dump_snapshot(path="dump_snapshot.pickle", device=None, *, rank: int | None = None):
    """vramkit.dump_snapshot() to rank_path(path, rank) ("snap.pickle" -> "snap.rank3.pickle");
    returns the path written."""
    from .history import dump_snapshot as dump

    target = rank_path(path, rank)
    dump(target, device)
    return target

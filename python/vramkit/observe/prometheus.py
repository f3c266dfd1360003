"""This process's vramkit pools as Prometheus metrics, through prometheus_client (the optional
extra ``vramkit[prometheus]``):

    import vramkit.prometheus
    vramkit.prometheus.start_http_server(8000)      # http://127.0.0.1:8000/metrics

The metrics are those of ``vramkit export`` for pools (vramkit_allocated_bytes, ...,
vramkit_capacity_bytes, vramkit_ooms_total; not the age of the pool's last slow event, which
only its published record keeps), read from the engine at each scrape, so one dashboard
serves both; labels
are gpu (the process's device ordinal), pid, process, hostname and source. Unlike
prometheus_client's own start_http_server, this one listens on 127.0.0.1 unless addr says
otherwise. Importing this module needs no prometheus_client; using it does.
"""

from __future__ import annotations

import os
import socket

from .. import _core
from .export import visible_label

__all__ = ["VramkitCollector", "register", "start_http_server"]

_LABELS = ("gpu", "pid", "process", "hostname", "source")

# (name, kind, help, the value from the engine's raw statistics)
_METRICS = (
    ("vramkit_allocated_bytes", "gauge", "Bytes in live blocks of the process's vramkit pool",
     lambda s: s["allocated_bytes"][0]),
    ("vramkit_reserved_bytes", "gauge", "Bytes the process's vramkit pool holds from the "
     "driver, in use or cached", lambda s: s["reserved_bytes"][0]),
    ("vramkit_active_bytes", "gauge", "Bytes in active blocks",
     lambda s: s["active_bytes"][0]),
    # Less active, not allocated: a block freed while a stream still uses it is neither
    # reusable nor given back yet (the engine's cached free bytes, as the record has them).
    ("vramkit_cached_free_bytes", "gauge", "Bytes reserved but free",
     lambda s: s["reserved_bytes"][0] - s["active_bytes"][0]),
    ("vramkit_largest_free_block_bytes", "gauge", "The largest allocation the pool can serve "
     "without asking the driver", lambda s: s["largest_free_block"]),
    ("vramkit_peak_allocated_bytes", "gauge", "Peak of allocated bytes since start or the "
     "last reset of peaks", lambda s: s["allocated_bytes"][1]),
    ("vramkit_peak_reserved_bytes", "gauge", "Peak of reserved bytes since start or the last "
     "reset of peaks", lambda s: s["reserved_bytes"][1]),
    ("vramkit_limit_bytes", "gauge", "The pool's memory limit (0: none)",
     lambda s: s["limit_bytes"]),
    ("vramkit_capacity_bytes", "gauge", "Memory of the device as the pool's source sees it",
     lambda s: s["capacity_bytes"]),
    ("vramkit_fragmentation_ratio", "gauge", "Share of cached free memory outside the largest "
     "free block, 0 to 1", lambda s: s["fragmentation"]),
    ("vramkit_ooms", "counter", "Allocations that failed with out of memory",
     lambda s: s["num_ooms"]),
    ("vramkit_alloc_retries", "counter", "Allocations that emptied the cache and retried, "
     "whether the retry succeeded or failed (a failed one is in vramkit_ooms_total too)",
     lambda s: s["num_alloc_retries"]),
)


def _client():
    try:
        import prometheus_client
        from prometheus_client import core
    except ImportError:
        raise ImportError("vramkit.prometheus needs prometheus_client: pip install "
                          "'vramkit[prometheus]' (or use `vramkit export`, which needs "
                          "nothing)") from None
    return prometheus_client, core


def _process_name() -> str:
    try:
        with open("/proc/self/comm", encoding="utf-8", errors="replace") as comm:
            return comm.read().strip()
    except OSError:
        return ""


class VramkitCollector:
    """A prometheus_client collector of the pools this process uses (only those: reading a
    device that has no pool would create one)."""

    def __init__(self):
        self._pid = str(os.getpid())
        self._name = visible_label(_process_name())  # any text: a process names itself
        self._host = socket.gethostname()

    def collect(self):
        from .. import _TRACKED_DEVICES, _pool_in_use

        _, core = _client()
        families = []
        for name, kind, text, _ in _METRICS:
            cls = core.CounterMetricFamily if kind == "counter" else core.GaugeMetricFamily
            families.append(cls(name, text, labels=_LABELS))
        for device in range(_TRACKED_DEVICES):
            if not _pool_in_use(device):
                continue
            # The capacity is the device's total as the pool's source reports it, as in
            # the record `vramkit export` reads.
            stats = dict(_core.stats(device), capacity_bytes=_core.mem_get_info(device)[1])
            labels = [str(device), self._pid, self._name, self._host, _core.source(device)]
            for family, (_, _, _, value) in zip(families, _METRICS):
                family.add_metric(labels, value(stats))
        yield from families

    def describe(self):
        # Names without reading the engine: registering must not create pools.
        _, core = _client()
        for name, kind, text, _ in _METRICS:
            cls = core.CounterMetricFamily if kind == "counter" else core.GaugeMetricFamily
            yield cls(name, text, labels=_LABELS)


_registered: dict[int, VramkitCollector] = {}


def register(registry=None) -> VramkitCollector:
    """Add the collector to a registry (prometheus_client's default one when None), once."""
    prometheus_client, _ = _client()
    registry = prometheus_client.REGISTRY if registry is None else registry
    collector = _registered.get(id(registry))
    if collector is None:
        collector = VramkitCollector()
        registry.register(collector)
        _registered[id(registry)] = collector
    return collector


def start_http_server(port: int, addr: str = "127.0.0.1", registry=None):
    """Serve this process's pools (and whatever else is in the registry) at
    http://addr:port/metrics from a daemon thread; returns prometheus_client's (server,
    thread). addr defaults to 127.0.0.1: the figures are the process's to share, not the
    network's, until asked."""
    prometheus_client, _ = _client()
    registry = prometheus_client.REGISTRY if registry is None else registry
    register(registry)
    return prometheus_client.start_http_server(port, addr=addr, registry=registry)

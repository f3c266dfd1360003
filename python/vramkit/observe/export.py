"""`vramkit export`: a Prometheus node exporter for every GPU and every vramkit process on the
machine, in the standard library alone, so that it runs where nothing else can be installed.

What it serves, at /metrics, on each scrape:
  - per GPU, from NVML: total, used and free memory, utilisation;
  - per process on a GPU, from NVML: its used memory (vramkit's or not);
  - per vramkit process and device, from the shared-memory records each vramkit process
    publishes (records.py): allocated, reserved, active, cached free, largest free block,
    peaks, limit, capacity, fragmentation, and the OOM and retry counters.
Labels follow dcgm-exporter's (gpu, UUID, modelName, hostname), so that a dashboard can join
vramkit's series with DCGM's; processes add pid and process (the short name). A record may
hold a command line (when its process opted in), and command lines can hold secrets: no
metric or label is ever made from one.

It listens on 127.0.0.1 unless --address says otherwise, and says which at start: the
figures name processes, and the network should not learn them by default. NVML missing or
failing, or a record that cannot be read, leaves those series out (and says why on stderr
and in a comment), never the exporter.

This module gathers and serves the metrics; its command line is vramkit.cli.export. The
server (_serve.py) is one thread around a selector rather than http.server's thread per
connection, so that idle or half-open connections cost a descriptor each and no thread or
CPU: each has --timeout to send its request and again to take its reply, at most
--max-connections are held (the descriptor limit may lower it), one more is answered 503
at once, and running out of descriptors backs off instead of spinning (issue 35).
"""

from __future__ import annotations

import errno
import math
import resource
import socket
import sys
import time

from .._shown import shown
from ._serve import Server, reply_bytes

DEFAULT_PORT = 9400
DEFAULT_ADDRESS = "127.0.0.1"
# Long enough for any client on a loaded machine to send a few hundred bytes, short enough
# that half-open connections do not pile up.
DEFAULT_TIMEOUT_S = 5.0
# Idle connections cost a descriptor each and no thread (_serve.py), so the cap can sit
# well above what Prometheus and a few people with curl ever open.
DEFAULT_MAX_CONNECTIONS = 4096
# Descriptors kept free of connections: the listener, the selector, stdio, the reserve, a
# record file being read and NVML's device files, so that a scrape can still be made when
# the connections are at their cap.
SPARE_DESCRIPTORS = 100
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

GPU_LABELS = ("gpu", "UUID", "modelName", "hostname")
PROCESS_LABELS = GPU_LABELS + ("pid", "process")
POOL_LABELS = PROCESS_LABELS + ("source",)

# (name, type, help, labels): every family the exporter serves, in the order it serves them.
# Each is written with its HELP and TYPE even when no series has a sample, so that a
# dashboard's queries always name known metrics.
FAMILIES = (
    ("vramkit_gpu_memory_total_bytes", "gauge", "Total memory of the GPU (NVML)", GPU_LABELS),
    ("vramkit_gpu_memory_used_bytes", "gauge", "Memory of the GPU in use by all processes "
     "(NVML)", GPU_LABELS),
    ("vramkit_gpu_memory_free_bytes", "gauge", "Free memory of the GPU (NVML)", GPU_LABELS),
    ("vramkit_gpu_utilization_ratio", "gauge", "Share of the last sample period in which a "
     "kernel ran on the GPU, 0 to 1 (NVML)", GPU_LABELS),
    ("vramkit_process_gpu_used_bytes", "gauge", "GPU memory a process holds, as the driver "
     "sees it, context included (NVML); any process, vramkit or not", PROCESS_LABELS),
    ("vramkit_allocated_bytes", "gauge", "Bytes in live blocks of the process's vramkit pool",
     POOL_LABELS),
    ("vramkit_reserved_bytes", "gauge", "Bytes the process's vramkit pool holds from the "
     "driver, in use or cached", POOL_LABELS),
    ("vramkit_active_bytes", "gauge", "Bytes in active blocks (allocated, or freed while a "
     "stream still uses them)", POOL_LABELS),
    ("vramkit_cached_free_bytes", "gauge", "Bytes reserved but free: what empty_cache could "
     "give back or new allocations reuse", POOL_LABELS),
    ("vramkit_largest_free_block_bytes", "gauge", "The largest allocation the pool could serve "
     "without asking the driver, at its last segment change, OOM or empty_cache",
     POOL_LABELS),
    ("vramkit_peak_allocated_bytes", "gauge", "Peak of allocated bytes since start or the "
     "process's last reset of peaks", POOL_LABELS),
    ("vramkit_peak_reserved_bytes", "gauge", "Peak of reserved bytes since start or the "
     "process's last reset of peaks", POOL_LABELS),
    ("vramkit_limit_bytes", "gauge", "The pool's memory limit (0: none)", POOL_LABELS),
    ("vramkit_capacity_bytes", "gauge", "Memory of the device as the pool's source sees it",
     POOL_LABELS),
    ("vramkit_fragmentation_ratio", "gauge", "Share of cached free memory outside the largest "
     "free block, 0 to 1, at the pool's last segment change, OOM or empty_cache",
     POOL_LABELS),
    ("vramkit_ooms_total", "counter", "Allocations that failed with out of memory",
     POOL_LABELS),
    # The engine counts a retry before it knows the outcome: an allocation that then fails
    # is in both counters, so the help must not read as successes alone.
    ("vramkit_alloc_retries_total", "counter", "Allocations that emptied the cache and "
     "retried, whether the retry succeeded or failed (a failed one is in "
     "vramkit_ooms_total too)", POOL_LABELS),
    ("vramkit_pool_event_age_seconds", "gauge", "Seconds since the pool's last slow-path "
     "event (a segment reserved or released, an OOM, empty_cache)", POOL_LABELS),
    ("vramkit_nvml_up", "gauge", "1 when NVML answered this scrape, else 0", ("hostname",)),
    ("vramkit_processes", "gauge", "vramkit processes whose records were read",
     ("hostname",)),
)
_FAMILY = {name: (kind, text, labels) for name, kind, text, labels in FAMILIES}

# DeviceRecord fields behind the per-pool families.
_POOL_FIELDS = (
    ("vramkit_allocated_bytes", "allocated_bytes"),
    ("vramkit_reserved_bytes", "reserved_bytes"),
    ("vramkit_active_bytes", "active_bytes"),
    ("vramkit_cached_free_bytes", "cached_free_bytes"),
    ("vramkit_largest_free_block_bytes", "largest_free_block"),
    ("vramkit_peak_allocated_bytes", "peak_allocated_bytes"),
    ("vramkit_peak_reserved_bytes", "peak_reserved_bytes"),
    ("vramkit_limit_bytes", "limit_bytes"),
    ("vramkit_capacity_bytes", "capacity_bytes"),
    ("vramkit_fragmentation_ratio", "fragmentation"),
    ("vramkit_ooms_total", "num_ooms"),
    ("vramkit_alloc_retries_total", "num_alloc_retries"),
)


def visible_label(value) -> str:
    """A label's text with what would steer a terminal or a reader escaped as vramkit shows
    foreign text (controls, bidi and other format characters, bytes that are not UTF-8, as
    \\xNN), but a backslash kept: the text format escapes that one itself, and a scraper
    reads it back whole. Records and /proc names are other processes' text."""
    text = "" if value is None else str(value)
    # In shown()'s output every backslash opens an escape, so each \x5c is one backslash.
    return shown(text).replace("\\x5c", "\\")


def _label_value(value) -> str:
    # The text format's escapes: a name from /proc may hold any character.
    text = visible_label(value)
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


class Metrics:
    """Samples gathered for one scrape, then written in the text format."""

    def __init__(self):
        self.samples: dict[str, list[tuple[dict, object]]] = {name: [] for name in _FAMILY}
        self.notes: list[str] = []

    def add(self, name: str, labels: dict, value) -> None:
        if value is None:
            return  # unknown is absent, never a made-up 0
        wanted = _FAMILY[name][2]
        self.samples[name].append(({k: labels.get(k, "") for k in wanted}, value))

    def text(self) -> str:
        out = []
        for note in self.notes:
            # A comment line: Prometheus ignores it, a person reading /metrics sees why
            # series are missing. One line, whatever the note holds; foreign text in a note
            # is shown escaped where the note is made.
            out.append("# vramkit: " + " ".join(str(note).split()))
        for name, kind, help_text, _ in FAMILIES:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            for labels, value in self.samples[name]:
                pairs = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels.items())
                out.append(f"{name}{{{pairs}}} {_number(value)}")
        return "\n".join(out) + "\n"


def collect(problems_out: list | None = None) -> Metrics:
    """Read NVML and the records once and return the metrics of this moment."""
    metrics = Metrics()
    host = socket.gethostname()
    gpus = []
    try:
        from ._nvml import NvmlError, nvml
    except ImportError as error:  # a broken install; the records still count
        metrics.notes.append(f"NVML support is missing from this install: {shown(str(error))}")
        gpus = None
    else:
        try:
            gpus = nvml().devices()
        except NvmlError as error:
            metrics.notes.append(f"no GPU figures: {shown(str(error))}")
            gpus = None
        except OSError as error:
            metrics.notes.append(f"no GPU figures: NVML failed: {shown(str(error))}")
            gpus = None
    metrics.add("vramkit_nvml_up", {"hostname": host}, 0 if gpus is None else 1)
    by_uuid = {}
    for gpu in gpus or ():
        labels = {"gpu": gpu.index, "UUID": gpu.uuid, "modelName": gpu.name, "hostname": host}
        by_uuid[gpu.uuid] = labels
        metrics.add("vramkit_gpu_memory_total_bytes", labels, gpu.total)
        metrics.add("vramkit_gpu_memory_used_bytes", labels, gpu.used)
        metrics.add("vramkit_gpu_memory_free_bytes", labels, gpu.free)
        if gpu.utilization_gpu is not None:
            metrics.add("vramkit_gpu_utilization_ratio", labels, gpu.utilization_gpu / 100)
        for proc in gpu.processes:
            metrics.add("vramkit_process_gpu_used_bytes",
                        dict(labels, pid=proc.pid, process=proc.name), proc.used_bytes)
    problems: list = []
    try:
        from .records import read_records

        records = read_records(problems=problems)
    except ImportError as error:
        metrics.notes.append(f"no vramkit process figures: {shown(str(error))}")
        records = []
    except OSError as error:
        metrics.notes.append(f"no vramkit process figures: the records cannot be read: "
                             f"{shown(str(error))}")
        records = []
    for problem in problems:
        metrics.notes.append(f"record skipped: {problem}")
    if problems_out is not None:
        problems_out.extend(problems)
    metrics.add("vramkit_processes", {"hostname": host}, len(records))
    now_ns = time.monotonic_ns()  # the records' clock (CLOCK_MONOTONIC, shared by processes)
    for record in records:
        # The name only; record.cmdline is never read here (see the module's notes).
        base = {"pid": record.pid, "process": record.name, "hostname": host}
        for dev in record.devices:
            gpu = by_uuid.get(dev.uuid) if dev.uuid else None
            if gpu is not None:
                labels = dict(gpu, **base)
            else:
                # sim, or a GPU NVML does not show: the process's own ordinal.
                labels = dict(base, gpu=dev.device, UUID=dev.uuid or "", modelName="")
            labels["source"] = dev.source
            if dev.busy:
                # Being written on every try (a stopped or killed writer): its figures are
                # zeros, not values; the series are absent for this scrape.
                metrics.notes.append(f"process {record.pid} device {dev.device}: its record "
                                     f"is being written; left out of this scrape")
                continue
            for name, attr in _POOL_FIELDS:
                metrics.add(name, labels, getattr(dev, attr))
            if dev.updated_ns:
                metrics.add("vramkit_pool_event_age_seconds", labels,
                            max(0.0, (now_ns - dev.updated_ns) / 1e9))
    return metrics


def render(problems_out: list | None = None) -> str:
    """The /metrics text of this moment."""
    return collect(problems_out).text()


_HOME = (b"<html><body><h1>vramkit export</h1>"
         b"<p><a href=\"/metrics\">/metrics</a></p></body></html>\n")


class Exporter:
    """What the server answers: /metrics collected afresh, / a link to it, else 404."""

    def __init__(self):
        self._seen: set = set()

    def respond(self, method: str, path: str) -> bytes:
        head = method == "HEAD"
        if path == "/metrics":
            if head:
                return reply_bytes(200, b"", CONTENT_TYPE, head=True)
            problems: list = []
            try:
                body = render(problems).encode("utf-8")
            except Exception as error:  # a scrape fails; the exporter stays up
                why = shown(str(error))
                print(f"vramkit export: collecting failed: {type(error).__name__}: {why}",
                      file=sys.stderr, flush=True)
                return reply_bytes(500, f"vramkit export: collecting failed: {why}\n"
                                   .encode())
            self.report(problems)
            return reply_bytes(200, body, CONTENT_TYPE)
        if path == "/":
            return reply_bytes(200, _HOME, "text/html; charset=utf-8", head=head)
        return reply_bytes(404, b"not found: try /metrics\n", head=head)

    def report(self, problems) -> None:
        """Each unreadable record once on stderr, not at every scrape."""
        for problem in problems:
            if str(problem) not in self._seen:
                self._seen.add(str(problem))
                print(f"vramkit export: record skipped: {problem}", file=sys.stderr,
                      flush=True)


def connection_room(wanted: int) -> tuple[int, int | None]:
    """(how many connections can be held, the descriptor limit when it is what bounds
    them): the soft limit is raised toward the hard one first, as far as wanted needs."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + SPARE_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < need:
        raised = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted, None
    # Under a small limit, a quarter is kept back: connections still get most of it.
    return max(1, soft - min(SPARE_DESCRIPTORS, soft // 4)), soft


class CannotListen(OSError):
    """The exporter could not listen where it was asked to; the message says why and what
    to do."""


def _listen_problem(error: OSError, address: str, port: int) -> str:
    address = shown(address)  # as typed: any text
    if error.errno == errno.EADDRINUSE:
        return (f"port {port} on {address} is already in use (another exporter? "
                f"dcgm-exporter also serves 9400); choose another with --port")
    if error.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) or \
            isinstance(error, socket.gaierror):
        return (f"cannot listen on {address}: it is not an address of this machine "
                f"({error.strerror or error})")
    if error.errno == errno.EACCES:
        return (f"not allowed to listen on port {port} (ports below 1024 need privileges); "
                f"choose another with --port")
    return f"cannot listen on {address}:{port}: {error.strerror or error}"


def serve(address: str, port: int, timeout: float = DEFAULT_TIMEOUT_S,
          max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
    """Serve /metrics until Ctrl-C, saying on stderr where. Raises CannotListen."""
    held, limit = connection_room(max_connections)
    exporter = Exporter()
    try:
        server = Server(address, port, exporter.respond, timeout=timeout,
                        max_connections=held)
    except OSError as error:
        raise CannotListen(_listen_problem(error, address, port)) from None
    host, bound = server.server_address[:2]
    shown = f"[{host}]" if ":" in host else host
    if address in ("127.0.0.1", "::1", "localhost"):
        reach = "this machine only; --address 0.0.0.0 serves other machines too"
    else:
        reach = f"every host that can reach {address}" if address not in ("0.0.0.0", "::") \
            else "every interface: other machines can read it"
    print(f"vramkit export: serving http://{shown}:{bound}/metrics, listening on {host} "
          f"({reach}); Ctrl-C stops", file=sys.stderr, flush=True)
    if limit is not None:
        print(f"vramkit export: at most {held} connections at once, not {max_connections}: "
              f"the descriptor limit (ulimit -n) is {limit}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()

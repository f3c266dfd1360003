"""vramkit.dask: give every Dask worker a vramkit pool, as dask-cuda's rmm_* options give it RMM.

A Dask GPU worker is a process of its own; its CuPy arrays and Numba kernels allocate from
whatever allocator that process was given. :class:`PoolPlugin` is a
``distributed.WorkerPlugin`` that, on each worker it reaches, creates the vramkit pool of
the worker's device with the options it carries (``vramkit.configure``) and makes vramkit
CuPy's allocator and Numba's memory manager:

    from dask_cuda import LocalCUDACluster        # or distributed.LocalCluster, or any
    from distributed import Client                # cluster whose workers import vramkit
    import vramkit.dask

    client = Client(LocalCUDACluster())
    vramkit.dask.install(client, pool_size="40G", maximum_pool_size="120G")

The options carry dask-cuda's names, so that a cluster set up with ``rmm_pool_size`` moves
over by dropping the prefix:

    pool_size           -> preallocate     (rmm_pool_size: held from the start)
    maximum_pool_size   -> limit           (rmm_maximum_pool_size: the pool never holds more)
    managed=True        -> source "managed" (rmm_managed_memory)
    release_threshold   -> release_threshold (rmm_release_threshold: cached free memory kept)

Sizes are vramkit's (one grammar, ``_core.parse_size``): bytes, "8G", "1.5GiB", a
percentage "90%" or a fraction 0.9 of device memory; units are 1024-based, so "8GB" is
8 GiB where dask-cuda reads 8 * 10**9. Every option is checked when the plugin is built,
on the client, so a typo fails there with vramkit's own exception rather than on each
worker. ``source=None`` and every option left at None take the worker's ``VRAMKIT_*``
environment, as a plain ``import vramkit`` would.

The device is ordinal 0 of the worker's view by default: dask-cuda gives each worker one
GPU through ``CUDA_VISIBLE_DEVICES``. The pool is process-wide, so one worker process holds
one configuration: a plugin with other pool options on a worker whose pool exists raises
RuntimeError there (restart the workers, ``client.restart()``, to change it; the plugin is
applied again to the fresh processes). :func:`worker_pool_info`, run on a worker
(``client.run(vramkit.dask.worker_pool_info)`` or inside a task), says what the plugin did
there and the pool's figures now.
"""

from __future__ import annotations

import importlib
import os
import threading

try:
    from distributed import WorkerPlugin
except ImportError as _exc:  # say what to install rather than "No module named distributed"
    raise ImportError("vramkit.dask needs Dask's distributed scheduler: pip install dask "
                      "distributed (and dask-cuda for LocalCUDACluster)") from _exc

import vramkit
from vramkit import _core

# One name for every PoolPlugin: registering another replaces the one before, as
# registering dask-cuda's RMM options twice would.
PLUGIN_NAME = "vramkit-pool"

# vramkit.configure options passed through as they are (the rest have dask-cuda's names).
_PASSED_THROUGH = ("large_blocks", "tight_threshold", "virtual_threshold", "sim_capacity")

# What was applied in this worker process, per device: the pool's options and what each
# framework got. Kept across a plugin's teardown, since the pool outlives the plugin.
_applied: dict[int, dict] = {}
_applied_lock = threading.Lock()


def _pool_options(source, pool_size, maximum_pool_size, managed, release_threshold,
                  passed_through: dict) -> dict:
    """The vramkit.configure keywords of the plugin's options, each checked as configure
    checks it (its own helpers, so a bad value reads the same here as there)."""
    unknown = sorted(set(passed_through) - set(_PASSED_THROUGH))
    if unknown:
        raise TypeError(f"PoolPlugin() got unexpected option(s) {', '.join(unknown)}; it takes "
                        f"source, pool_size, maximum_pool_size, managed, release_threshold, "
                        f"cupy, numba, device and {', '.join(_PASSED_THROUGH)}")
    if not isinstance(managed, bool):
        raise TypeError(f"managed must be a bool, not {type(managed).__name__}")
    if managed:
        if source not in (None, "managed"):
            raise vramkit._invalid(f"managed=True is the source 'managed'; it cannot be "
                                   f"combined with source={source!r}")
        source = "managed"
    options: dict = {}
    if source is not None:
        if not isinstance(source, str):
            raise TypeError(f"source must be a str, not {type(source).__name__}")
        if source not in vramkit._SOURCES:
            raise vramkit._invalid(f"source must be one of {', '.join(vramkit._SOURCES)}, "
                                   f"got {source!r}")
        options["source"] = source
    for name, keyword, value, allow_percent in (
            ("pool_size", "preallocate", pool_size, True),
            ("maximum_pool_size", "limit", maximum_pool_size, True),
            ("release_threshold", "release_threshold", release_threshold, False),
            ("sim_capacity", "sim_capacity", passed_through.get("sim_capacity"), False)):
        if value is not None:
            options[keyword] = vramkit._size_text(name, value, allow_percent)
    for name in ("tight_threshold", "virtual_threshold"):
        if passed_through.get(name) is not None:
            options[name] = vramkit._share_text(name, passed_through[name])
    large_blocks = passed_through.get("large_blocks")
    if large_blocks is not None:
        if large_blocks not in ("fixed", "virtual"):
            raise vramkit._invalid(f"large_blocks must be 'fixed' or 'virtual', got "
                                   f"{large_blocks!r}")
        options["large_blocks"] = large_blocks
    _check_pool_within_maximum(options)
    return options


def _check_pool_within_maximum(options: dict) -> None:
    """rmm_pool_size over rmm_maximum_pool_size is an error in dask-cuda; here too, where
    both are written the same way (both in bytes, or both shares of the device)."""
    if "preallocate" not in options or "limit" not in options:
        return
    pool_bytes, pool_share = _core.parse_size(options["preallocate"], True)
    limit_bytes, limit_share = _core.parse_size(options["limit"], True)
    if (pool_bytes and limit_bytes and pool_bytes > limit_bytes) or \
            (pool_share and limit_share and pool_share > limit_share):
        raise vramkit._invalid(f"pool_size ({options['preallocate']}) is more than "
                               f"maximum_pool_size ({options['limit']})")


def _framework_wish(name: str, value) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name} must be True, False or None (install where importable), not "
                        f"{type(value).__name__}")
    return value


class PoolPlugin(WorkerPlugin):
    """Creates each worker's vramkit pool and hands it to CuPy and Numba.

    source: "auto", "cuda", "vmm", "managed", "sim", ... (None: VRAMKIT_SOURCE on the
    worker). pool_size: held from the start (vramkit's preallocate). maximum_pool_size: the
    pool's hard limit. managed: the "managed" source. release_threshold: cached free memory
    kept. cupy, numba: True installs vramkit there and fails if the worker cannot import
    the framework, None installs it where the framework imports, False leaves it alone.
    device: the worker's device (default 0, the first GPU the worker sees). Also
    large_blocks, tight_threshold, virtual_threshold and sim_capacity, as vramkit.configure
    takes them.
    """

    name = PLUGIN_NAME

    def __init__(self, source: str | None = None, pool_size=None, maximum_pool_size=None,
                 managed: bool = False, release_threshold=None, cupy: bool | None = None,
                 numba: bool | None = None, device=0, **configure_options):
        self.pool_options = _pool_options(source, pool_size, maximum_pool_size, managed,
                                          release_threshold, configure_options)
        self.device = vramkit._device(device)
        self.frameworks = {"cupy": _framework_wish("cupy", cupy),
                           "numba": _framework_wish("numba", numba)}
        self._installed: list[str] = []

    def setup(self, worker=None) -> None:
        with _applied_lock:
            record = _applied.get(self.device)
            if record is None:
                record = self._create_pool()
                _applied[self.device] = record
            elif record["options"] != self.pool_options:
                raise RuntimeError(
                    f"vramkit.dask: this worker's pool of device {self.device} was created "
                    f"with {record['options']}; its options are fixed then, so "
                    f"{self.pool_options} cannot apply. Restart the workers "
                    f"(client.restart()) to apply them")
            record["worker"] = getattr(worker, "address", None)
            for framework, wish in self.frameworks.items():
                if wish is not False:
                    record[framework] = self._install(framework, wish)

    def _create_pool(self) -> dict:
        try:
            vramkit.configure(self.device, **self.pool_options)
        except RuntimeError as exc:
            # The pool exists: a task or another library allocated before the plugin came.
            raise RuntimeError(f"vramkit.dask: {exc}. Register the plugin before the workers "
                               f"allocate, or restart them (client.restart())") from None
        return {"device": self.device, "options": dict(self.pool_options), "pid": os.getpid(),
                "cupy": "not asked", "numba": "not asked"}

    def _install(self, framework: str, wish: bool | None) -> str:
        """Install vramkit in the framework; say what happened ("installed", or why not)."""
        try:
            module = importlib.import_module(f"vramkit.{framework}")
        except ImportError as exc:
            if wish:
                raise ImportError(f"vramkit.dask: {framework}=True, but this worker cannot "
                                  f"use it: {exc}") from exc
            return f"not installed: {exc}"
        if framework == "cupy":
            module.install()
        else:
            from numba import cuda
            cuda.set_memory_manager(module.VramkitMemoryManager)
        self._installed.append(framework)
        return "installed"

    def teardown(self, worker=None) -> None:
        # CuPy's allocator goes back to CuPy's own pool; Numba keeps its manager, since a
        # context made with it cannot change manager. The pool itself stays.
        with _applied_lock:
            record = _applied.get(self.device, {})
            if "cupy" in self._installed:
                importlib.import_module("vramkit.cupy").uninstall()
                record["cupy"] = "uninstalled"
            self._installed = []


def install(client, **options) -> PoolPlugin:
    """Register a PoolPlugin with these options on the client's cluster: it applies to the
    workers running now and to every worker that joins later. Bad options raise here,
    before anything is registered. Returns the plugin."""
    plugin = PoolPlugin(**options)
    register = getattr(client, "register_plugin", None)
    if register is None:  # distributed before 2023.9 named it for worker plugins only
        client.register_worker_plugin(plugin, name=PLUGIN_NAME)
    else:
        register(plugin, name=PLUGIN_NAME)
    return plugin


def worker_pool_info(device: int | None = None) -> dict | None:
    """What PoolPlugin did in this worker process and the pool's figures now: device,
    options, pid, worker (its address), cupy and numba ("installed", or why not), source,
    reserved, peak_reserved, allocated, limit_bytes. None where no PoolPlugin ran. device:
    the plugin's device (default: the first one it configured), named as anywhere in
    vramkit (0, "cuda:0"); a name that is no device is refused, not taken for "no plugin"."""
    if device is not None:
        device = vramkit._device(device)
    with _applied_lock:
        if device is None:
            device = min(_applied, default=None)
        record = _applied.get(device) if device is not None else None
        if record is None:
            return None
        info = dict(record, options=dict(record["options"]))
    stats = _core.stats(device)
    info.update(source=vramkit.source(device), reserved=stats["reserved_bytes"][0],
                peak_reserved=stats["reserved_bytes"][1], allocated=stats["allocated_bytes"][0],
                limit_bytes=stats["limit_bytes"])
    return info

"""A what-if table's rows computed side by side, in forked processes.

Each row of the table is an estimate: a recording of the step under fake tensors, which
keeps one core busy in PyTorch's dispatch for its whole length, and which needs nothing
of the other rows once the step as written is known. Where cores are free, each of a few
forked processes estimates the step as written (for the facts the rows depend on: the
autocast the step runs, its model's blocks and weights; and to warm its caches), then its
share of the rows, and hands the figures back through a pipe. Forked, not spawned: the
step and its build are functions of the user's program, often defined in a notebook,
that a new interpreter could not import.

What the table says never depends on whether it forked. A child's rows are taken only if
its estimate of the step as written equals this process's (the same target, the same
peaks, the same rows to compute); otherwise, or if the child fails, dies or stalls, this
process computes that share itself, so an error surfaces here as it would without
children. Nothing forks where a child could not do what this process does: without
fork(), on one core, or once this process has initialized CUDA (PyTorch refuses CUDA in
a process forked after that). Autograd refuses a process forked after one that ran a
backward pass (its threads were not forked): a child checks that first with a backward
pass of one element. Once this process has computed a table (its own estimates ran
backward passes) or a child has failed, for that or any reason, it computes its tables
alone.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import select
import signal
import sys
import time
import warnings

_CUDA_SUCCESS = 0

# A table's processes each hold a CUDA context on a GPU host (about half a GiB of the
# card each): no more than this many, whatever the cores.
MOST_PROCESSES = 8

# How long the children may take beyond what this process took for its own share
# (a child stalled on a lock inherited in a held state, say) before their shares are
# computed here: a multiple of this process's own time, and never less than a floor.
_PATIENCE_FACTOR = 3.0
_PATIENCE_FLOOR_S = 60.0

# Set once this process has run a table or a child has failed: it no longer forks.
_forks_done: list[bool] = []


def processes_for(asked: int | None, rows_at_most: int) -> int:
    """How many processes compute a table of at most ``rows_at_most`` rows beyond the
    step as written: ``asked`` if given, else one per free core; 1 where forking could not
    give the answer this process would."""
    if asked is not None:
        if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
            raise ValueError(f"advise(): processes must be a positive int, not {asked!r}")
    if not hasattr(os, "fork") or _forks_done or _cuda_initialized():
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    wanted = asked if asked is not None else cores
    return max(1, min(wanted, rows_at_most, MOST_PROCESSES))


def _cuda_initialized() -> bool:
    """Whether CUDA was initialized in this process: by PyTorch, or by anything that
    called the driver's cuInit (``torch.cuda.is_available()`` does, unless PyTorch was
    told to ask NVML instead), which a forked child could not then use."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return True
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False  # no driver: nothing a child could fail to initialize
    count = ctypes.c_int(0)
    # Before cuInit the driver answers CUDA_ERROR_NOT_INITIALIZED (a stub library, another
    # error): only an initialized driver counts its devices.
    return driver.cuDeviceGetCount(ctypes.byref(count)) == _CUDA_SUCCESS


def computed(work, processes: int):
    """``work(share, of)`` returns ``(agreement, results, redo)``: a picklable value that
    must be equal in every process for its results to be taken, a dict of row index to
    result for the rows ``i`` with ``i % of == share``, and ``redo(share, of)``, which
    computes another share's results in this process. Returns ``(agreement, results)``
    for every row, the children's merged into this process's."""
    if processes <= 1:
        agreement, results, _redo = work(0, 1)
        _forks_done[:] = [True]
        return agreement, results
    _flush_standard_streams()
    children: list[_Child | None] = []
    try:
        for share in range(1, processes):
            try:
                children.append(_Child(work, share, processes))
            except OSError:  # no process to be had (EAGAIN, ENOMEM): the share is ours
                children.append(None)
        started = time.monotonic()
        agreement, results, redo = work(0, processes)
        _forks_done[:] = [True]  # this process's autograd threads have started
        patience = max(_PATIENCE_FLOOR_S, _PATIENCE_FACTOR * (time.monotonic() - started))
        deadline = time.monotonic() + patience
        for share, child in enumerate(children, start=1):
            answer = child.answer(deadline) if child is not None else None
            if answer is not None and answer[0] == agreement:
                results.update(answer[1])
            else:
                _forks_done[:] = [True]
                results.update(redo(share, processes))
        return agreement, results
    finally:
        for child in children:
            if child is not None:
                child.end()


def _flush_standard_streams() -> None:
    # What this process has buffered would otherwise be written again by each child.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass


class _Child:
    """One forked process computing one share of the rows, and its end of the pipe."""

    def __init__(self, work, share: int, processes: int):
        reader, writer = os.pipe()
        with warnings.catch_warnings():
            # Python 3.12 warns of fork() in a process with threads (a progress spinner,
            # PyTorch's pool): the child only computes and writes to its pipe.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            os.close(reader)
            _child_main(work, share, processes, writer)  # never returns
        os.close(writer)
        self.pid, self.reader, self.reaped = pid, reader, False

    def answer(self, deadline: float):
        """The child's unpickled answer, or None if it failed, died or missed the
        deadline."""
        chunks = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.reader], [], [], left)[0]:
                return None
            chunk = os.read(self.reader, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        try:
            _, status = os.waitpid(self.pid, 0)
            exited_well = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        except ChildProcessError:  # reaped already (SIGCHLD ignored): the answer says
            exited_well = True
        self.reaped = True
        if not exited_well:
            return None
        try:
            return pickle.loads(b"".join(chunks))
        except Exception:  # noqa: BLE001 - a torn answer is no answer
            return None

    def end(self) -> None:
        os.close(self.reader)
        if not self.reaped:  # once reaped, its pid may be another process's
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass  # reaped by the system (SIGCHLD ignored)
            self.reaped = True


def _child_main(work, share: int, processes: int, writer: int) -> None:
    status = 1
    try:
        _quiet_child()
        _autograd_works()
        agreement, results, _redo = work(share, processes)
        _write_all(writer, pickle.dumps((agreement, results)))
        status = 0
    except BaseException:  # noqa: BLE001 - any failure is the parent's to redo
        pass
    finally:
        os._exit(status)  # no exit handlers: they are the parent's (its scratch folder)


def _quiet_child() -> None:
    """The child's output goes nowhere: the step's prints and warnings were shown once, by
    the parent's estimate of the step as written; new stream objects, because one the
    parent shares may have been forked with its lock held by another thread."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    warnings.simplefilter("ignore")


def _autograd_works() -> None:
    """Raises in a child forked from a process whose autograd threads had started."""
    import torch
    one = torch.ones(1, requires_grad=True)
    one.sum().backward()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.close(fd)

"""`vramkit estimate`'s command line: a model's training step, estimated from its
configuration alone, by vramkit.plan.estimator.

    vramkit estimate --model gpt2 --batch 8 --seq 1024 --precision bf16-amp \\
                     --optimizer adamw [--checkpointing] [--device-memory 24G] [--json]

The model is built from its Hugging Face configuration (plan/estimator/models.py: no
weights are downloaded) under fake tensors; the estimate (vramkit.estimate) says the peak
allocated, the peak reserved under vramkit and under PyTorch's allocator, whether it fits
the card, the breakdown at the peak and the call sites. --max-batch asks for the largest batch that
fits the card instead, --what-if for the table of changes (vramkit.advise), and
--plan-checkpointing for the fewest blocks to checkpoint (vramkit.plan_checkpointing).
Exit statuses are the table of vramkit --help (EXIT_STATUS below).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from .._shown import shown
from ._exit import (EXIT_DOES_NOT_FIT, EXIT_FAILURE, EXIT_MISSING_DEPENDENCY, EXIT_OK,
                    input_error, usage_error)
from ._parser import CommandParser, checked, whole_number

EXIT_STATUS = ("exit status (the table of vramkit --help): 0 estimated (and it fits), 1 the "
               "step does not fit the card (or not even batch 1 does), 2 a config.json that "
               "cannot be read or built, 3 bad arguments or an unknown model, 4 the step could "
               "not be estimated, 5 PyTorch or transformers missing")


def parser() -> CommandParser:
    from ..plan.estimator import models
    p = CommandParser("estimate", description=(
        "Estimate the GPU memory of one model's training step from its configuration "
        "alone (no weights downloaded, no GPU needed): peak allocated, peak reserved "
        "under vramkit and under PyTorch's allocator, and whether it fits the card."),
        epilog=EXIT_STATUS)
    # --model is checked after parsing, so that an unknown option is named first.
    p.add_argument("--model",
                   help="a family (gpt2, llama, bert, vit, resnet...), a named size "
                        "(gpt2-medium, llama-1b, vit-b16, resnet50), a config.json path, "
                        "or a model id in the local Hugging Face cache")
    number = checked(whole_number, "a whole number")
    p.add_argument("--batch", type=number, default=8, help="batch size (default 8)")
    p.add_argument("--seq", type=number, default=1024,
                   help="tokens per sample for language models (default 1024)")
    p.add_argument("--precision", choices=models.PRECISIONS, default="fp32")
    p.add_argument("--optimizer", choices=models.OPTIMIZERS, default="adamw")
    p.add_argument("--checkpointing", action="store_true",
                   help="activation checkpointing of every block")
    p.add_argument("--device-memory", default=None, metavar="SIZE",
                   help="the card to check the fit on, e.g. 24G or 80G (the allocator "
                        "gets it less the CUDA context)")
    p.add_argument("--cap", default=None, metavar="SIZE",
                   help="an allocator cap to check the fit under (VRAMKIT_LIMIT, "
                        "set_per_process_memory_fraction), which the CUDA context is not "
                        "counted against; with --device-memory, the tighter of the two")
    p.add_argument("--source", default=None, choices=("cuda", "vmm"),
                   help="the vramkit source to model (default cuda)")
    p.add_argument("--max-batch", action="store_true",
                   help="find the largest batch that fits --device-memory or --cap (given "
                        "both, the tighter; the answer says which) instead")
    p.add_argument("--what-if", action="store_true",
                   help="the same step under autocast, bf16 weights, 8-bit optimizer "
                        "states, checkpointing and smaller batches: a table")
    p.add_argument("--plan-checkpointing", action="store_true",
                   help="the fewest blocks to checkpoint for the step to fit "
                        "--device-memory")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="keep the recorded step there (a vramkit trace, for vramkit "
                        "replay and vramkit plot); without it the trace is not kept")
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    return p


class _Progress:
    """A spinner on stderr once the estimate has taken more than a second (a terminal
    only), so a long estimate does not look hung."""

    def __init__(self, what: str):
        self.what = what
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        if self.done.wait(1.0) or not sys.stderr.isatty():
            return
        start = time.monotonic()
        frames = "|/-\\"
        i = 0
        while not self.done.wait(0.2):
            sys.stderr.write(f"\r{frames[i % 4]} {self.what} "
                             f"{time.monotonic() - start + 1.0:.0f} s")
            sys.stderr.flush()
            i += 1
        sys.stderr.write("\r" + " " * (len(self.what) + 12) + "\r")

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def _as_json(e) -> dict:
    from ..plan.estimator import trace_is_kept
    return {"peak_allocated": e.peak_allocated, "peak_reserved": e.peak_reserved,
            "torch_peak_reserved": e.torch_peak_reserved,
            "torch_expandable_peak_reserved": e.torch_expandable_peak_reserved,
            "torch_peak_allocated": e.torch_peak_allocated,
            "torch_expandable_peak_allocated": e.torch_expandable_peak_allocated,
            "device_memory": e.device_memory, "capped": e.capped, "bound": e.bound,
            "fits": e.fits, "torch_fits": e.torch_fits,
            "torch_expandable_fits": e.torch_expandable_fits,
            "min_device_memory": e.min_device_memory, "breakdown": e.breakdown,
            "top_sites": [{"site": s, "bytes": b, "blocks": c} for s, b, c in e.top_sites],
            "source": e.source, "emulated": e.emulated,
            "trace": e.trace if trace_is_kept(e) else None,
            "notes": e.notes}


def _refused(error: Exception, model: str) -> int:
    """The message and exit status of an estimate that could not be made."""
    from ..plan.estimator import models

    if isinstance(error, ImportError):  # models.MissingPackage: transformers
        print(f"vramkit estimate: {error}", file=sys.stderr)
        return EXIT_MISSING_DEPENDENCY
    if isinstance(error, models.BadConfig):
        return input_error("estimate", error)
    if isinstance(error, models.PastPositions):
        return usage_error("estimate", str(error))
    from_file = os.path.isfile(model) or os.path.isdir(model)
    if from_file and isinstance(error, ValueError) and not isinstance(error, models.UnknownModel):
        # transformers refused a value of the user's configuration when building it.
        return input_error("estimate", models.unusable_config(model, str(error)))
    if isinstance(error, ValueError):
        # The message as raised: one that is shown text already is not escaped again.
        return usage_error("estimate", error.args[0] if len(error.args) == 1 else str(error))
    if from_file and getattr(error, "in_build", False) and error.__cause__ is not None:
        # The model of the user's configuration could not be made (a head count that does
        # not divide the width): the file's fault too, not a step fake tensors cannot follow.
        cause = error.__cause__
        why = " ".join(f"{type(cause).__name__}: {cause}".split())[:300]
        return input_error("estimate", models.unusable_config(model, why))
    # An UntraceableStep, or an OSError: the --trace file or the scratch folder unwritable.
    print(f"vramkit estimate: {shown(str(error))}", file=sys.stderr)
    from ..plan.estimator._step import LargerThanAnyDevice
    return EXIT_DOES_NOT_FIT if isinstance(error, LargerThanAnyDevice) else EXIT_FAILURE


def _question(args) -> tuple[str, str]:
    """Which fit was answered, as ("card" or "cap", words): a card, which the CUDA
    context shares, or a cap; given both, the tighter, and what it was tighter than."""
    from ..plan.estimator import tighter_bound
    bound, _, _ = tighter_bound(args.device_memory, args.cap)
    card = f"a {args.device_memory} card (less the CUDA context)"
    cap = f"an allocator cap of {args.cap} (the CUDA context not counted)"
    words = card if bound == "card" else cap
    if args.device_memory and args.cap:
        other = cap if bound == "card" else card
        words += f", tighter than {other},"
    return bound, words


def _allocator_bytes(args) -> int:
    """What the answered bound leaves the allocator."""
    from ..plan.estimator import CUDA_CONTEXT_BYTES, tighter_bound
    _, card, cap = tighter_bound(args.device_memory, args.cap)
    return cap if cap is not None else max(card - CUDA_CONTEXT_BYTES, 0)


# The largest --batch and --seq: a dimension of a tensor PyTorch indexes with a C int.
_MOST_TOKENS = (1 << 31) - 1
# --max-batch searches batches up to this; one that fits there is reported as "at least".
_MAX_BATCH_SEARCHED = 4096


def _refused_command_line(args) -> str | None:
    """Why the options, which parsed, do not make one question; None when they do."""
    if args.model is None:
        return "--model is needed: which model's step to estimate"
    if not (1 <= args.batch <= _MOST_TOKENS and 1 <= args.seq <= _MOST_TOKENS):
        return f"--batch and --seq must be from 1 to {_MOST_TOKENS}"
    from ..plan.estimator import checked_size
    for option, value in (("--device-memory", args.device_memory), ("--cap", args.cap)):
        try:
            checked_size(value, option)
        except ValueError as error:
            return str(error)
    if (args.max_batch or args.plan_checkpointing) and not (args.device_memory or args.cap):
        return "--max-batch and --plan-checkpointing need --device-memory or --cap"
    if args.max_batch + args.what_if + args.plan_checkpointing > 1:
        return "--max-batch, --what-if and --plan-checkpointing are separate questions: ask one"
    if args.trace and (args.max_batch or args.what_if or args.plan_checkpointing):
        # Those questions record many steps (a batch, a change, a plan each), not one.
        return ("--trace keeps the one step a plain estimate records: leave it out with "
                "--max-batch, --what-if and --plan-checkpointing")
    if args.plan_checkpointing and args.checkpointing:
        # The plan is of which blocks to checkpoint in the step as written; one that
        # checkpoints every block already would always "fit without checkpointing".
        return "--plan-checkpointing plans the step's checkpointing: leave out --checkpointing"
    return None


def _answer(args, first, work):
    """The answer to the one question asked, computed with a spinner: the largest batch,
    the what-if table, the checkpointing plan, or the estimate."""
    from ..plan.estimator import advise, estimate, find_max_batch, plan_checkpointing

    fit = dict(device_memory=args.device_memory, memory_limit=args.cap, source=args.source)
    with _Progress("estimating"):
        if args.max_batch:
            return find_max_batch(first.step, lambda n: work(n).build(),
                                  most=_MAX_BATCH_SEARCHED, **fit)
        if args.what_if:
            return advise(first.step, build=first.build, **fit,
                          make_batch=lambda n: work(n).build(), batch=args.batch)
        if args.plan_checkpointing:
            return plan_checkpointing(first.step, build=first.build, **fit)
        return estimate(first.step, build=first.build, **fit, trace_path=args.trace)


def _report_what_if(args, first, advice) -> int:
    if args.json:
        print(json.dumps({"model": args.model, "workload": first.name,
                          "rows": [vars(r) for r in advice.rows],
                          "min_device_memory": advice.min_device_memory}))
    else:
        print(shown(first.name))
        print(advice)
    return EXIT_OK


def _report_plan(args, first, plan) -> int:
    if args.json:
        print(json.dumps({"model": args.model, "workload": first.name,
                          "checkpoint": plan.names, "blocks": plan.blocks,
                          "fits": plan.fits,
                          "peak_reserved": plan.estimate.peak_reserved}))
    else:
        print(shown(first.name))
        print(plan)
    return EXIT_OK if plan.fits else EXIT_DOES_NOT_FIT


def _report_max_batch(args, first, best) -> int:
    bound, words = _question(args)
    # The search stops at _MAX_BATCH_SEARCHED: a batch that fits there is a lower bound,
    # not the largest.
    searched_to_end = best >= _MAX_BATCH_SEARCHED
    if args.json:
        print(json.dumps({"model": args.model, "max_batch": best,
                          "at_least": searched_to_end, "largest_searched": _MAX_BATCH_SEARCHED,
                          "device_memory": args.device_memory, "cap": args.cap,
                          "bound": bound, "answered_for": words,
                          "allocator_bytes": _allocator_bytes(args)}))
    elif searched_to_end:
        print(f"batch {best} of {shown(first.name.split(' batch ')[0])} fits {words} under "
              f"vramkit; larger batches were not tried: the largest is at least {best}")
    else:
        print(f"largest batch of {shown(first.name.split(' batch ')[0])} that fits "
              f"{words} under vramkit: {best}")
    return EXIT_OK if best else EXIT_DOES_NOT_FIT


def _report_estimate(args, first, result) -> int:
    if args.json:
        print(json.dumps({"model": args.model, "workload": first.name, **_as_json(result)}))
    else:
        print(shown(first.name))
        print(result)
    return EXIT_DOES_NOT_FIT if result.fits is False else EXIT_OK


def run(args) -> int:
    problem = _refused_command_line(args)
    if problem:
        return usage_error("estimate", problem)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("vramkit estimate: needs PyTorch (pip install 'vramkit[torch]' transformers)",
              file=sys.stderr)
        return EXIT_MISSING_DEPENDENCY
    from ..plan.estimator import models
    from ..plan.estimator._step import UntraceableStep

    def work(batch: int):
        return models.workload(args.model, batch, seq=args.seq, precision=args.precision,
                               optimizer=args.optimizer, checkpointing=args.checkpointing)

    try:
        first = work(args.batch)
        answer = _answer(args, first, work)
    except (ImportError, ValueError, UntraceableStep, OSError) as error:
        return _refused(error, args.model)
    report = (_report_max_batch if args.max_batch else _report_what_if if args.what_if
              else _report_plan if args.plan_checkpointing else _report_estimate)
    status = report(args, first, answer)
    _end_process_now(status)
    return status


def _is_the_command() -> bool:
    """Whether this process is the `vramkit` command itself (the script, or python -m
    vramkit), not a program or a test that called the command line's main()."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return (spec is not None and spec.name == "vramkit.__main__") or \
        os.path.basename(sys.argv[0] or "") == "vramkit"


def _end_process_now(status: int) -> None:
    """End the `vramkit estimate` process once its answer is out, without the interpreter's
    teardown: an estimate leaves PyTorch, transformers and the fake tensors' caches in
    memory, and taking them apart one object at a time makes the user wait for nothing.
    The exit handlers still run (the scratch traces are removed). Returns, doing nothing,
    where the process is not the command, or where a profiler or a tracer (cProfile,
    coverage) watches it and writes its report at exit."""
    if not _is_the_command() or sys.getprofile() is not None or sys.gettrace() is not None:
        return
    sys.stdout.flush()  # a closed pipe raises here, for main() to end quietly
    sys.stderr.flush()
    import atexit
    atexit._run_exitfuncs()
    os._exit(status)

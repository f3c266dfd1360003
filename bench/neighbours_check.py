"""neighbours_check.py - issue 39's two-trainer check: two processes on one device whose
peaks fit it together only if the first gives back the cache its peak left behind.

Trainer A trains at a large size for its first steps (peak P_A), signals, and goes on at a
small size; trainer B starts once A has passed its peak and trains at a large size (peak
P_B). The sizes are fractions of the device's total memory (--fraction-a, --fraction-b,
--fraction-a-small), chosen so that P_A + P_B is more than the device while
max(P_A, P_B) + A's small working set is less: a caching allocator that keeps A's peak
cache leaves B out of memory; one that gives it back lets both finish.

On a GPU (the default) both are GPT-2 124M trainers (transformers' GPT-2 built from its
config, random weights and tokens, fixed seeds, bf16 autocast, AdamW, 1024 tokens), each
batch found from the device's memory by measuring the step's peak at batches 1 and 2.
Arms, each a pair of fresh processes:
  torch+torch      both under PyTorch's caching allocator
  vramkit+vramkit  both under vramkit.torch.install()
  vramkit+torch    A under vramkit, B under PyTorch's allocator
  torch+vramkit    A under PyTorch's allocator, B under vramkit

--cpu-check needs no GPU: the same phases with vramkit.empty buffers on a sim device both
processes share (VRAMKIT_SOURCE=sim, VRAMKIT_SIM_SHARED), arms "give-back on",
"give-back on" with A's VRAMKIT_SOFT_LIMIT at 10% of the device, and "give-back off"
(VRAMKIT_GIVE_BACK=0 in A).

For each arm and role: finished or out of memory (and at which step), steps per second,
peak reserved, and vramkit's give-back counters (requests made, bytes received, the time
spent waiting for the answers, bytes and times given); beside them, the wall time of the
steps during which a process asked and the median of its other steps.

    python3 bench/neighbours_check.py                 # on the GPU, the four arms
    python3 bench/neighbours_check.py --cpu-check     # on the shared sim, no GPU
    python3 bench/neighbours_check.py --json          # one JSON object instead of a table

Each role writes its result as JSON in the run's folder; a role that dies without one is
reported with its exit status and the end of its stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GPU_ARMS = {
    "torch+torch": ("torch", "torch"),
    "vramkit+vramkit": ("vramkit", "vramkit"),
    "vramkit+torch": ("vramkit", "torch"),
    "torch+vramkit": ("torch", "vramkit"),
}
# The sim arms: extra settings of A, on top of the shared sim's.
# Under its soft limit A gives what each request asks; over it, all its idle memory at once.
SIM_ARMS = {"give-back on": {},
            "give-back on, A's soft limit 10%": {"VRAMKIT_SOFT_LIMIT": "10%"},
            "give-back off": {"VRAMKIT_GIVE_BACK": "0"}}
COUNTERS = ("giveback_requests", "giveback_received_bytes", "giveback_wait_us",
            "giveback_given_bytes", "giveback_given_count")
PEAKED, B_DONE = "A.peaked", "B.done"


# ---------------------------------------------------------------------------------------
# The trainers: one step at the large size or at the small one.
# ---------------------------------------------------------------------------------------

class SimTrainer:
    """vramkit.empty buffers standing for a trainer's memory: weights live for the whole
    run, a step's activations taken in chunks and freed at its end (so they stay cached)."""

    def __init__(self, a):
        import vramkit
        self.vramkit = vramkit
        self.total = vramkit.mem_get_info(0)[1]
        self.chunk = max(1 << 20, self.total // 64)
        self.step_pause = a.sim_step_ms / 1e3
        self.weights = vramkit.empty(self.chunk)
        self.sizes = {"large": int(a.fraction * self.total) - self.chunk,
                      "small": int(a.fraction_small * self.total) - self.chunk}

    def step(self, size: str) -> None:
        left, activations = self.sizes[size], []
        while left > 0:
            activations.append(self.vramkit.empty(min(self.chunk, left)))
            left -= self.chunk
        time.sleep(self.step_pause)  # the step's compute: the neighbour's watcher runs now

    def stats(self) -> dict:
        s = self.vramkit.memory_stats(0)
        return dict({k: s[k] for k in COUNTERS},
                    peak_reserved=self.vramkit.max_memory_reserved(0))

    def size_figures(self) -> dict:
        return {f"bytes_{k}": max(v, 0) + self.chunk for k, v in self.sizes.items()}


class TorchTrainer:
    """GPT-2 124M training steps under the allocator the role names; the batch of each
    size found from the device's total memory and the step's peak at batches 1 and 2."""

    def __init__(self, a):
        if a.allocator == "vramkit":
            import vramkit.torch
            vramkit.torch.install()
        import torch
        from vramkit.estimator import models
        self.torch = torch
        self.vramkit_allocator = a.allocator == "vramkit"
        self.total = torch.cuda.mem_get_info()[1]
        torch.manual_seed(1 if a.role == "A" else 2)
        self.work = models.workload("gpt2", 1, seq=a.seq, precision="bf16-amp")
        with torch.device("cuda"):
            self.model, self.opt, _ = self.work.build()
        self.seq, self.vocab = a.seq, self.model.config.vocab_size
        base, per_sample = self._calibrate()
        self.batches = {"large": self._batch_for(a.fraction, base, per_sample),
                        "small": self._batch_for(a.fraction_small, base, per_sample)}

    def _tokens(self, batch: int):
        ids = self.torch.randint(0, self.vocab, (batch, self.seq), device="cuda")
        return ids, ids

    def _calibrate(self) -> tuple[int, int]:
        torch = self.torch
        self.work.step(self.model, self.opt, self._tokens(1))  # the optimizer's states
        peaks = []
        for batch in (1, 2):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.work.step(self.model, self.opt, self._tokens(batch))
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated())
        per_sample = max(peaks[1] - peaks[0], 1)
        return peaks[0] - per_sample, per_sample

    def _batch_for(self, fraction: float, base: int, per_sample: int) -> int:
        return max(1, int((fraction * self.total - base) // per_sample))

    def step(self, size: str) -> None:
        self.work.step(self.model, self.opt, self._tokens(self.batches[size]))
        self.torch.cuda.synchronize()

    def stats(self) -> dict:
        # PyTorch's memory_stats() has no place for the give-back counters: vramkit's own
        # stats of the same pool carry them. Under PyTorch's allocator they are None.
        out = dict.fromkeys(COUNTERS)
        if self.vramkit_allocator:
            import vramkit
            s = vramkit.memory_stats(0)
            out.update({k: s[k] for k in COUNTERS})
        out["peak_reserved"] = self.torch.cuda.max_memory_reserved()
        return out

    def size_figures(self) -> dict:
        return {f"batch_{k}": v for k, v in self.batches.items()}


# ---------------------------------------------------------------------------------------
# A role: its phases, what it measured, and its result file.
# ---------------------------------------------------------------------------------------

def wait_for(path: Path, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


class Phases:
    """Runs a trainer's steps, timing each by its size and noting those during which it
    asked its neighbours to give memory back."""

    def __init__(self, trainer):
        self.trainer, self.steps = trainer, 0
        self.times = {"large": [], "small": []}  # (seconds, asked) of each step

    def run(self, size: str, count: int | None = None, until: Path | None = None,
            deadline: float = 0.0) -> None:
        done = 0
        while (count is None or done < count) and not (until and until.exists()):
            if deadline and time.monotonic() > deadline:
                raise TimeoutError("the neighbour did not finish in time")
            asked = self.trainer.stats()["giveback_requests"] or 0
            t0 = time.perf_counter()
            self.trainer.step(size)
            took = time.perf_counter() - t0
            self.steps += 1
            done += 1
            now = self.trainer.stats()["giveback_requests"] or 0
            self.times[size].append((took, now > asked))

    def figures(self) -> dict:
        out = {"steps": self.steps}
        for size, steps in self.times.items():
            total = sum(t for t, _ in steps)
            out[f"steps_per_s_{size}"] = len(steps) / total if total > 0 else None
        asking = [t for steps in self.times.values() for t, asked in steps if asked]
        # The asking steps' own size is the fair yardstick: their other steps' median.
        sizes = [size for size, steps in self.times.items() if any(a for _, a in steps)]
        others = sorted(t for size in (sizes or self.times) for t, asked in self.times[size]
                        if not asked)
        out.update(asking_steps=len(asking), asking_steps_s=sum(asking),
                   other_step_median_s=others[len(others) // 2] if others else None)
        return out


def report_line(message: str, starts: str) -> str | None:
    """The line of an OOM report that begins with `starts`: what the give-back group did
    ("Give-back:"), which processes hold the rest ("Other processes on this GPU:")."""
    return next((line.strip() for line in message.splitlines()
                 if line.strip().startswith(starts)), None)


def role_phases(a, phases: Phases, run_dir: Path) -> None:
    deadline = time.monotonic() + a.timeout
    if a.role == "A":
        phases.run("large", a.peak_steps)
        (run_dir / PEAKED).touch()
        phases.run("small", until=run_dir / B_DONE, deadline=deadline)
        phases.run("small", a.steps)  # and a few more once B is done with the device
    else:
        if not wait_for(run_dir / PEAKED, a.timeout):
            raise TimeoutError("A never passed its peak")
        phases.run("large", a.steps)


def is_out_of_memory(exc: BaseException) -> bool:
    # torch.OutOfMemoryError and vramkit.OutOfMemoryError, whichever allocator raised it,
    # also in a trainer's set-up (its calibration steps), before the trainer exists.
    return type(exc).__name__ == "OutOfMemoryError"


def role_main(a) -> int:
    run_dir = Path(a.run_dir)
    result = {"role": a.role, "allocator": a.allocator, "outcome": "finished",
              "oom_step": None, "message": None, "give_back_line": None,
              "neighbours_line": None}
    trainer = phases = None
    try:
        trainer = SimTrainer(a) if a.allocator == "sim" else TorchTrainer(a)
        phases = Phases(trainer)
        role_phases(a, phases, run_dir)
    except TimeoutError as exc:
        result.update(outcome="timeout", message=str(exc))
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        message = str(getattr(exc, "report", "") or exc)
        result.update(outcome="oom" if phases else "oom in set-up",
                      oom_step=phases.steps if phases else None,
                      message=message.splitlines()[0] if message else "",
                      give_back_line=report_line(message, "Give-back:"),
                      neighbours_line=report_line(message, "Other processes on this GPU:"))
    finally:
        (run_dir / (PEAKED if a.role == "A" else B_DONE)).touch()  # never leave one waiting
    if trainer:
        result.update(trainer.stats(), **trainer.size_figures(), **phases.figures(),
                      device_total=trainer.total)
    (run_dir / f"{a.role}.json").write_text(json.dumps(result))
    return 0


# ---------------------------------------------------------------------------------------
# The arms: a pair of fresh processes each.
# ---------------------------------------------------------------------------------------

def role_command(a, role: str, allocator: str, run_dir: Path) -> list[str]:
    fraction = a.fraction_a if role == "A" else a.fraction_b
    return [sys.executable, os.path.abspath(__file__), "--role", role, "--allocator", allocator,
            "--run-dir", str(run_dir), "--fraction", str(fraction),
            "--fraction-small", str(a.fraction_a_small), "--peak-steps", str(a.peak_steps),
            "--steps", str(a.steps), "--seq", str(a.seq), "--timeout", str(a.timeout),
            "--sim-step-ms", str(a.sim_step_ms)]


def sim_env(a, name: str, extra: dict, run_dir: Path) -> dict:
    # The caller's vramkit settings (a test suite's small sim device) are not this check's.
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMKIT_")}
    env.update(VRAMKIT_SOURCE="sim", VRAMKIT_SIM_SHARED=name,
               VRAMKIT_SIM_CAPACITY=a.sim_capacity, VRAMKIT_PUBLISH_DIR=str(run_dir / "shm"),
               VRAMKIT_GIVE_BACK_TIMEOUT=str(a.give_back_timeout_ms))
    env.update(extra)
    return env


def collect(proc: subprocess.Popen, role: str, run_dir: Path, timeout: float) -> dict:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        return {"role": role, "outcome": "timeout", "message": "killed: ran past the timeout"}
    path = run_dir / f"{role}.json"
    if path.exists():
        return json.loads(path.read_text())
    return {"role": role, "outcome": "crashed", "returncode": proc.returncode,
            "message": (err or "")[-2000:]}


def run_arm(a, arm: str, allocators: tuple[str, str], envs: tuple[dict, dict],
            run_dir: Path) -> dict:
    run_dir.mkdir(parents=True)
    procs = {}
    for role, allocator, env in zip("AB", allocators, envs):
        procs[role] = subprocess.Popen(role_command(a, role, allocator, run_dir), env=env,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       text=True)
    roles = {role: collect(p, role, run_dir, a.timeout + 60) for role, p in procs.items()}
    for role, allocator in zip("AB", allocators):
        roles[role].setdefault("allocator", allocator)
    return {"arm": arm, "roles": roles}


class CheckError(Exception):
    """What keeps the check from running, said in one line."""


def cuda_available() -> bool:
    # In a child: this process holds no CUDA context while the arms run.
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True,
                          timeout=300).returncode == 0


def run_all(a) -> dict:
    top = Path(tempfile.mkdtemp(prefix="vramkit-neighbours-"))
    try:
        arms = []
        if a.cpu_check:
            for i, (arm, extra_a) in enumerate(SIM_ARMS.items()):
                run_dir = top / f"arm{i}"
                name = f"neighbours{os.getpid()}_{i}"
                envs = (sim_env(a, name, extra_a, run_dir), sim_env(a, name, {}, run_dir))
                arms.append(run_arm(a, arm, ("sim", "sim"), envs, run_dir))
        else:
            wanted = a.arms.split(",") if a.arms else list(GPU_ARMS)
            unknown = [arm for arm in wanted if arm not in GPU_ARMS]
            if unknown:
                raise CheckError(f"no arm {', '.join(unknown)}: the arms are "
                                 f"{', '.join(GPU_ARMS)}")
            if not cuda_available():
                raise CheckError("no CUDA device here: --cpu-check runs on the shared sim")
            for i, arm in enumerate(wanted):
                envs = (dict(os.environ), dict(os.environ))
                arms.append(run_arm(a, arm, GPU_ARMS[arm], envs, top / f"arm{i}"))
    finally:
        shutil.rmtree(top, ignore_errors=True)
    return {"mode": "cpu-check" if a.cpu_check else "gpu",
            "sim_capacity": a.sim_capacity if a.cpu_check else None,
            "fractions": {"A_large": a.fraction_a, "A_small": a.fraction_a_small,
                          "B_large": a.fraction_b},
            "arms": arms}


# ---------------------------------------------------------------------------------------
# The table.
# ---------------------------------------------------------------------------------------

def _gib(n) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def _number(n, fmt: str = "{}") -> str:
    return "-" if n is None else fmt.format(n)


def last_line(text: str | None) -> str:
    # A crashed role's message is the end of its stderr: its last line says what failed.
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else "-"


def table(report: dict) -> str:
    lines = ["| arm | role | allocator | outcome | steps | steps/s large / small | "
             "peak reserved GiB | "
             "asked | received GiB | waited ms | gave GiB (times) | asking steps s / other step s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm in report["arms"]:
        for role, r in sorted(arm["roles"].items()):
            outcome = r.get("outcome", "?")
            if outcome == "oom":
                outcome = f"OOM at step {r.get('oom_step')}"
            gave = (f"{_gib(r.get('giveback_given_bytes'))} "
                    f"({_number(r.get('giveback_given_count'))})"
                    if r.get("giveback_given_count") is not None else "-")
            wait_us = r.get("giveback_wait_us")
            waited = _number(wait_us / 1000 if wait_us is not None else None, "{:.1f}")
            cost = (f"{_number(r.get('asking_steps_s'), '{:.3f}')} / "
                    f"{_number(r.get('other_step_median_s'), '{:.3f}')}")
            lines.append(
                f"| {arm['arm']} | {role} | {r.get('allocator')} | {outcome} | "
                f"{_number(r.get('steps'))} | "
                f"{_number(r.get('steps_per_s_large'), '{:.2f}')} / "
                f"{_number(r.get('steps_per_s_small'), '{:.2f}')} | "
                f"{_gib(r.get('peak_reserved'))} | {_number(r.get('giveback_requests'))} | "
                f"{_gib(r.get('giveback_received_bytes'))} | {waited} | {gave} | {cost} |")
    notes = [f"{arm['arm']} {role}: {last_line(text)}"
             for arm in report["arms"] for role, r in sorted(arm["roles"].items())
             if r.get("outcome") != "finished"
             for text in (r.get("message"), r.get("give_back_line"), r.get("neighbours_line"))
             if text]
    return "\n".join(lines + [""] + notes)


def parse(argv: list[str]):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-check", action="store_true", help="the shared sim, no GPU")
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    p.add_argument("--arms", help=f"a comma list of {', '.join(GPU_ARMS)} (GPU only)")
    p.add_argument("--fraction-a", type=float, default=0.6, help="A's peak, of the device")
    p.add_argument("--fraction-a-small", type=float, default=0.1,
                   help="A's working set after its peak, of the device")
    p.add_argument("--fraction-b", type=float, default=0.6, help="B's peak, of the device")
    p.add_argument("--peak-steps", type=int, default=3, help="A's steps at its peak")
    p.add_argument("--steps", type=int, default=5, help="B's steps; A's after B is done")
    p.add_argument("--seq", type=int, default=1024, help="tokens per sample (GPU)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per role")
    p.add_argument("--sim-capacity", default="8G", help="the shared sim device's capacity")
    p.add_argument("--sim-step-ms", type=float, default=5.0, help="a sim step's pause")
    p.add_argument("--give-back-timeout-ms", type=int, default=5000,
                   help="VRAMKIT_GIVE_BACK_TIMEOUT on the sim: a loaded CPU answers late")
    # A role's own arguments, set by the arms.
    p.add_argument("--role", choices=("A", "B"), help=argparse.SUPPRESS)
    p.add_argument("--allocator", choices=("torch", "vramkit", "sim"), help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    p.add_argument("--fraction", type=float, help=argparse.SUPPRESS)
    p.add_argument("--fraction-small", type=float, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    fractions = (a.fraction_a, a.fraction_a_small, a.fraction_b)
    if not all(0 < f < 1 for f in fractions) or a.fraction_a_small >= a.fraction_a:
        p.error("fractions must lie between 0 and 1, A's small one below its peak")
    if min(a.steps, a.peak_steps, a.seq) < 1 or a.timeout <= 0 or a.sim_step_ms < 0:
        p.error("--steps, --peak-steps and --seq must be at least 1, --timeout above 0, "
                "--sim-step-ms not below 0")
    if not 0 <= a.give_back_timeout_ms <= 10000:
        p.error("--give-back-timeout-ms must lie between 0 and 10000")
    if a.cpu_check and not a.role:
        import vramkit
        from vramkit import _core
        try:
            _core.parse_size(a.sim_capacity)
        except vramkit.VramError as exc:
            p.error(f"--sim-capacity: {exc}")
    return a


def main(argv: list[str]) -> int:
    a = parse(argv)
    if a.role:
        return role_main(a)
    try:
        report = run_all(a)
    except CheckError as exc:
        print(f"neighbours_check: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report) if a.json else table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

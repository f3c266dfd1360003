"""Tests of `vramkit estimate`, the command line over vramkit.estimate (test_estimate.py
holds the function's own): its figures, its exit statuses, and what it shows of the
user's code, configuration files and names, on a machine without a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import vramkit  # noqa: E402
from vramkit.estimator import models  # noqa: E402


def test_a_model_by_family_name_from_its_configuration(tmp_path):
    """GPT-2 from transformers' default configuration (GPT-2 124M), nothing downloaded:
    the parameters are its 124M weights (wte tied to the head) in fp32."""
    pytest.importorskip("transformers")
    w = models.workload("gpt2", 1, seq=64, precision="fp32")
    e = vramkit.estimate(w.step, build=w.build)
    params = 124_439_808  # GPT-2 small, with the position embeddings
    assert abs(e.breakdown["parameters"] - 4 * params) < 4 * params * 0.01
    with pytest.raises(models.UnknownModel):
        models.workload("no-such-model-anywhere", 1)
    with pytest.raises(ValueError):
        models.workload("gpt2", 0)


def test_the_command_line(tmp_path):
    pytest.importorskip("transformers")
    trace = tmp_path / "gpt2.trace.gz"
    run = lambda *a: subprocess.run([sys.executable, "-m", "vramkit", "estimate", *a],  # noqa: E731
                                    capture_output=True, text=True)
    out = run("--model", "gpt2", "--batch", "1", "--seq", "32", "--device-memory", "80G",
              "--json", "--trace", str(trace))
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)
    assert row["fits"] is True and row["peak_allocated"] > 4 * 124_000_000
    assert trace.exists() and row["trace"] == str(trace)
    small = run("--model", "gpt2", "--batch", "1", "--seq", "32", "--device-memory", "1G")
    assert small.returncode == 1 and "does not fit" in small.stdout
    plan = run("--model", "gpt2", "--batch", "4", "--seq", "512", "--plan-checkpointing",
               "--device-memory", "5G", "--json")
    assert plan.returncode in (0, 1), plan.stderr
    row = json.loads(plan.stdout)
    assert row["blocks"] == 12 and set(row["checkpoint"]) <= {f"transformer.h.{i}"
                                                              for i in range(12)}
    assert (plan.returncode == 0) == row["fits"]
    for bad in (["--model", "nope"], ["--model", "gpt2", "--batch", "0"],
                ["--model", "gpt2", "--precision", "fp8"], ["--batch", "2"],
                ["--model", "gpt2", "--max-batch"], ["--model", "gpt2", "--plan-checkpointing"],
                ["--model", "gpt2", "--what-if", "--max-batch", "--device-memory", "8G"]):
        r = run(*bad)
        assert r.returncode == 3 and "vramkit estimate:" in r.stderr, (bad, r.stderr)


@pytest.mark.parametrize("value", ["\u0661\u0662", "1_0", " 8", "+8"])
@pytest.mark.parametrize("option", ["--batch", "--seq"])
def test_batch_and_seq_are_ascii_digits_as_every_number_of_the_command(option, value):
    # int() takes other scripts' digits, '_', blanks and a sign; the C command and the other
    # subcommands refuse them, so estimate must not read '\u0661\u0662' as 12.
    r = subprocess.run([sys.executable, "-m", "vramkit", "estimate", "--model", "gpt2",
                        option, value], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and f"{option}: expected a whole number" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_the_command_line_names_the_user_s_code_and_prints_no_library_warnings():
    # `make run` shows this output to a new user: the call sites must be code a user can read
    # and change (not vramkit's own step file, not a site-packages path), and a library's
    # warning about how vramkit built the model is vramkit's to avoid, not the user's to read.
    pytest.importorskip("transformers")
    out = subprocess.run([sys.executable, "-m", "vramkit", "estimate", "--model", "gpt2",
                          "--batch", "1", "--seq", "32", "--precision", "bf16-amp",
                          "--device-memory", "80G"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "[transformers]" not in out.stderr + out.stdout
    sites = out.stdout.split("largest call sites at the peak:\n", 1)[1].split("  note:")[0]
    assert "the training step: loss.backward()" in sites
    assert "site-packages" not in sites and "estimator/models.py" not in sites
    # Checkpointing is turned on by the name transformers keeps (the older one warns that
    # it is deprecated) with the key-value cache off (else transformers says it turned it
    # off): nothing on stderr.
    out = subprocess.run([sys.executable, "-m", "vramkit", "estimate", "--model", "gpt2",
                          "--batch", "1", "--seq", "32", "--checkpointing"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stderr == "", out.stderr


def test_foreign_names_are_shown_escaped_once(tmp_path, monkeypatch):
    """A configuration's path and VRAMKIT_SOURCE are the user's text: printed with their
    control characters escaped, once (not Python's escapes escaped again), and a bad
    VRAMKIT_SOURCE is the command line's fault (3), named, not the model file's."""
    pytest.importorskip("transformers")
    ansi = "\x1b[31m"
    folder = tmp_path / f"m{ansi}"
    folder.mkdir()
    broken = tmp_path / f"c{ansi}.json"
    broken.write_text("{bad")
    good = tmp_path / f"g{ansi}.json"
    good.write_text('{"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, '
                    '"vocab_size": 64, "n_positions": 8}')

    def estimate(model, *more, env=None):
        return subprocess.run([sys.executable, "-m", "vramkit", "estimate", "--model",
                               str(model), "--batch", "1", "--seq", "8", *more],
                              capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, **(env or {})))

    done = estimate(folder)
    assert done.returncode == 2 and "m\\x1b[31m: a folder without" in done.stderr
    done = estimate(broken)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("c\\x1b[31m.json") == 2 and "x5c" not in done.stderr
    done = estimate(good, env={"VRAMKIT_SOURCE": ansi})
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith("vramkit estimate: environment variable VRAMKIT_SOURCE: "
                                  "'\\x1b[31m' is not a source")
    assert "x5c" not in done.stderr
    done = estimate(good, "--trace", str(tmp_path / f"t{ansi}.trace"))
    assert done.returncode == 0, done.stderr
    assert ansi not in done.stdout and "\x1b" not in done.stdout
    assert "g\\x1b[31m.json batch 1x8" in done.stdout and "t\\x1b[31m.trace" in done.stdout
    # From Python, the estimate's own check names the variable the same way.
    from vramkit.plan.estimator import checked_source
    monkeypatch.setenv("VRAMKIT_SOURCE", ansi)
    with pytest.raises(ValueError, match=r"VRAMKIT_SOURCE must be one of .*not '\\x1b"):
        checked_source(None)


def test_a_model_configuration_that_cannot_be_read_exits_2(tmp_path):
    pytest.importorskip("transformers")
    invalid = tmp_path / "invalid.json"
    invalid.write_text("{bad")
    wrong_kind = tmp_path / "config.json"
    wrong_kind.write_text('{"model_type": "gpt2", "n_layer": "abc", "n_head": 5}')
    empty_folder = tmp_path / "model"
    empty_folder.mkdir()
    unbuildable = tmp_path / "heads.json"  # read, but no model has 5 heads over 768 wide
    unbuildable.write_text('{"model_type": "gpt2", "n_head": 5}')
    readme = Path(__file__).resolve().parents[2] / "README.md"
    # Counts no model has: the build made blocks for hours, or failed in transformers
    # (exit 4) or in PyTorch's C++ (its source path in the message).
    endless = tmp_path / "endless.json"
    endless.write_text('{"model_type": "gpt2", "n_layer": 99999999999}')
    negative = tmp_path / "negative.json"
    negative.write_text('{"model_type": "gpt2", "n_layer": -1}')
    vast = tmp_path / "vast.json"
    vast.write_text('{"model_type": "gpt2", "n_embd": %d}' % 10**23)
    nowhere = tmp_path / "nowhere.json"
    nowhere.write_text('{"model_type": "gpt2", "n_positions": -5}')
    no_words = tmp_path / "no_words.json"  # built, then failed in PyTorch with a warning
    no_words.write_text('{"model_type": "gpt2", "vocab_size": 0, "bos_token_id": null, '
                        '"eos_token_id": null}')
    no_patch = tmp_path / "no_patch.json"  # built, then failed in the step (exit 4)
    no_patch.write_text('{"model_type": "vit", "image_size": 7, "patch_size": 16}')
    for model, says in ((readme, "README.md: not a usable model configuration"),
                        (endless, "endless.json: not a usable model configuration: n_layer "
                                  "is 99999999999: a count of blocks from 0 to 10,000"),
                        (negative, "negative.json: not a usable model configuration: "
                                   "n_layer is -1"),
                        (nowhere, "nowhere.json: not a usable model configuration: "
                                  "n_positions is -5: a number of positions, 1 or more"),
                        (vast, f"vast.json: not a usable model configuration: n_embd is "
                               f"{10**23}, past a 64-bit integer"),
                        (no_words, "no_words.json: not a usable model configuration: "
                                   "vocab_size is 0: the size of a table of tokens"),
                        (no_patch, "no_patch.json: not a usable model configuration: "
                                   "image_size is 7, smaller than patch_size 16"),
                        (tmp_path / "typo.json", "typo.json: no such file"),
                        (unbuildable, "heads.json: not a usable model configuration: "
                                      "ValueError: `embed_dim` must be divisible"),
                        (invalid, "invalid.json: not a usable model configuration"),
                        (wrong_kind, "config.json: not a usable model configuration"),
                        (empty_folder, "model: a folder without a config.json")):
        done = subprocess.run([sys.executable, "-m", "vramkit", "estimate", "--model",
                               str(model), "--batch", "1", "--seq", "8"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, (model, done.stderr)
        assert done.stderr.startswith("vramkit estimate: ") and says in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "Warning" not in done.stderr
    # A plan for a step that checkpoints every block already always "fit without
    # checkpointing", whatever the cap.
    done = subprocess.run([sys.executable, "-m", "vramkit", "estimate", "--model", "gpt2",
                           "--plan-checkpointing", "--cap", "10G", "--checkpointing"],
                          capture_output=True, text=True)
    assert done.returncode == 3 and "leave out --checkpointing" in done.stderr, done.stderr
    # --trace keeps a plain estimate's one step; the other questions record many, and kept
    # none, silently.
    for question in ("--what-if", "--max-batch", "--plan-checkpointing"):
        done = subprocess.run([sys.executable, "-m", "vramkit", "estimate", "--model", "gpt2",
                               question, "--cap", "10G", "--trace",
                               str(tmp_path / "kept.trace")], capture_output=True, text=True)
        assert done.returncode == 3 and "--trace keeps the one step" in done.stderr, question
    # Past a learned position table the real step fails; fake tensors check no index.
    done = subprocess.run([sys.executable, "-m", "vramkit", "estimate", "--model", "gpt2",
                           "--seq", "1025"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr
    assert done.stderr == ("vramkit estimate: seq 1025 is past the 1024 positions of gpt2's "
                           "learned position table (n_positions): the real step fails "
                           "indexing it (see vramkit estimate --help)\n"), done.stderr
    for option in ("--batch", "--seq"):
        done = subprocess.run([sys.executable, "-m", "vramkit", "estimate", "--model", "gpt2",
                               option, str(10**20)], capture_output=True, text=True)
        assert done.returncode == 3, done.stderr
        assert "--batch and --seq must be from 1 to 2147483647" in done.stderr


def test_the_command_line_s_failures_are_one_escaped_line_with_their_status(tmp_path):
    pytest.importorskip("transformers")

    def run(*args):
        return subprocess.run([sys.executable, "-m", "vramkit", "estimate", *args],
                              capture_output=True, text=True, timeout=300)

    # A trace that cannot be written is the tool's failure (4), said once, not a traceback
    # with the status of a step that does not fit (1).
    lost = run("--model", "gpt2", "--batch", "1", "--seq", "8",
               "--trace", str(tmp_path / "no-such-folder" / "t.trace.gz"))
    assert lost.returncode == 4, lost.stderr
    assert lost.stderr.splitlines() == [
        f"vramkit estimate: {tmp_path}/no-such-folder/t.trace.gz: cannot open for writing: "
        "No such file or directory"]
    # A batch no storage can hold: fake tensors log the meta kernel's exception with its
    # traceback; the estimate explains it in one line instead.
    huge = run("--model", "llama-1b", "--batch", str(2**31 - 1), "--seq", str(2**31 - 1))
    assert huge.returncode == 4, huge.stderr
    assert len(huge.stderr.splitlines()) == 1 and "overflowed" in huge.stderr, huge.stderr
    # A name with a terminal control in it is shown escaped, once.
    odd = run("--model", "\x1b[31mred")
    assert odd.returncode == 3
    assert odd.stderr.startswith("vramkit estimate: unknown model '\\x1b[31mred'"), odd.stderr

"""Tests that the call sites an estimate lists name the user's code (issue 38): the
frames of a user's build() and step outside PyTorch and vramkit, and, for the models
`vramkit estimate --model` builds itself, what each block is in words, never a file of
the vramkit package. They run on the CPU stand-in for CUDA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import vramkit  # noqa: E402

_PACKAGE = os.path.dirname(os.path.abspath(vramkit.__file__))


def _names_vramkit(site: str) -> bool:
    """Whether a call site names a file of the vramkit package, whole or as the
    package-relative path an installed package's file is shown by."""
    return _PACKAGE in site or site.startswith("vramkit" + os.sep)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(256, 512)
        self.second = torch.nn.Linear(512, 256)

    def forward(self, x):
        return self.second(self.first(x).relu())


def _build():
    net = _Net().to("cuda")
    return net, torch.optim.AdamW(net.parameters()), torch.randn(64, 256, device="cuda")


def _step(net, opt, x):
    net(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _all_sites(e) -> list[str]:
    printed = [line.split(" blocks  ", 1)[1] for line in str(e).splitlines()
               if " blocks  " in line]
    return printed + [site for site, _, _ in e.top_sites]


def test_a_user_s_build_and_step_are_named_by_their_own_lines():
    e = vramkit.estimate(_step, build=_build, model_workspaces=False)
    sites = _all_sites(e)
    assert not [s for s in sites if _names_vramkit(s)], sites
    here = os.path.abspath(__file__)
    in_this_file = [s for s in sites if s.startswith(here + ":")]
    # The parameters were made by the model's constructor or moved by build(), the
    # optimizer state by the step's opt.step(): lines of this file.
    assert any(s.endswith(":__init__") or s.endswith(":_build") for s in in_this_file), sites
    assert any(s.endswith(":_step") for s in in_this_file), sites


def test_a_model_passed_in_names_no_vramkit_file():
    net = _Net()
    e = vramkit.estimate(_step, net, torch.optim.AdamW(net.parameters()),
                         torch.randn(64, 256), model_workspaces=False)
    sites = _all_sites(e)
    assert not [s for s in sites if _names_vramkit(s)], sites
    assert "parameters (model construction)" in sites


def test_the_command_line_says_in_words_what_its_own_model_s_blocks_are(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = tmp_path / "config.json"
    transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000,
                            n_positions=64).to_json_file(str(config))
    common = [sys.executable, "-m", "vramkit", "estimate", "--model", str(config),
              "--batch", "2", "--seq", "32", "--precision", "bf16-amp"]
    text = subprocess.run(common, capture_output=True, text=True)
    as_json = subprocess.run(common + ["--json"], capture_output=True, text=True)
    assert text.returncode == 0 and as_json.returncode == 0, text.stderr + as_json.stderr
    printed = [line.split(" blocks  ", 1)[1] for line in text.stdout.splitlines()
               if " blocks  " in line]
    returned = [s["site"] for s in json.loads(as_json.stdout)["top_sites"]]
    assert not [s for s in printed + returned if _names_vramkit(s)], printed + returned
    assert "parameters (model construction)" in printed
    assert "the training step: loss.backward()" in printed

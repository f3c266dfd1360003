"""Training-loop logging and the exporter on a real GPU: a short Hugging Face fine-tuning and a
Lightning fit under vramkit.torch, each with its memory callback writing a log whose records
agree with vramkit's statistics at the same moment and carry NVML's figures; and `vramkit
export --once` while two vramkit training processes and one plain PyTorch process hold memory
on the GPU, serving for each vramkit process the allocated and reserved bytes it prints itself.

Nothing is downloaded: the models are built from small configurations with random weights.
"""

import json
import pathlib
import re
import subprocess
import sys

import pytest

NEEDS_TORCH = """
    try:
        import torch
    except ImportError:
        print("SKIP: PyTorch is not installed")
        raise SystemExit(0)
    if not torch.cuda.is_available():
        print("SKIP: PyTorch sees no CUDA device")
        raise SystemExit(0)
"""


def _records(path):
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]


def test_hf_callback_logs_a_short_fine_tuning(gpu_run, tmp_path):
    log = tmp_path / "hf.jsonl"
    out = gpu_run(NEEDS_TORCH, """
        try:
            import transformers
        except ImportError:
            print("SKIP: transformers is not installed")
            raise SystemExit(0)
        import vramkit, vramkit.torch
        vramkit.torch.install()
        from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                                  TrainingArguments)
        from vramkit.integrations.hf import MemoryCallback

        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=2048,
                                           n_positions=128))

        class Tokens(torch.utils.data.Dataset):
            def __len__(self):
                return 512
            def __getitem__(self, i):
                ids = torch.randint(0, 2048, (128,))
                return {"input_ids": ids, "labels": ids}

        memory = MemoryCallback(__LOG__, every=1)
        mismatches = []

        class Check(TrainerCallback):
            # Runs right after MemoryCallback: nothing is allocated in between.
            def on_step_end(self, args, state, control, **kwargs):
                record = memory.logger._last_stats
                now = vramkit.memory_allocated(0), vramkit.memory_reserved(0)
                if (record["allocated"], record["reserved"]) != now:
                    mismatches.append((state.global_step, record["allocated"], now))

        args = TrainingArguments(output_dir=__OUT__, max_steps=20, per_device_train_batch_size=8,
                                 learning_rate=1e-4, report_to="none", save_strategy="no",
                                 logging_steps=5, disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(),
                          callbacks=[memory, Check()])
        trainer.train()
        assert not mismatches, mismatches[:3]
        print("engine_peak", vramkit.max_memory_allocated(0))
    """.replace("__LOG__", repr(str(log))).replace("__OUT__", repr(str(tmp_path / "out"))),
        env={"VRAMKIT_PUBLISH_DIR": str(tmp_path)})
    records = _records(log)
    assert [r["step"] for r in records] == list(range(1, 21))
    assert all(r["allocated"] > 0 and r["reserved"] >= r["allocated"] for r in records)
    assert all(r["peak_allocated"] >= r["allocated"] for r in records)
    assert all(r["nvml_used"] is not None and r["nvml_used"] >= r["reserved"] for r in records)
    assert all(r["step_time"] is None or r["step_time"] > 0 for r in records)
    assert "epoch" in records[-1]
    # The logger's peaks never exceed the engine's, which the logger left alone.
    engine_peak = int(re.search(r"engine_peak (\d+)", out).group(1))
    assert 0 < max(r["peak_allocated"] for r in records) <= engine_peak
    drawn = subprocess.run([sys.executable, "-m", "vramkit", "plot", str(log), "-o",
                            str(tmp_path / "hf.html")], capture_output=True, text=True)
    assert drawn.returncode == 0, drawn.stderr
    print(f"HF log: {len(records)} records, last {records[-1]}")


def test_lightning_callback_logs_a_fit(gpu_run, tmp_path):
    log = tmp_path / "pl.jsonl"
    gpu_run(NEEDS_TORCH, """
        try:
            import lightning.pytorch as L
        except ImportError:
            try:
                import pytorch_lightning as L
            except ImportError:
                print("SKIP: Lightning is not installed")
                raise SystemExit(0)
        import vramkit, vramkit.torch
        vramkit.torch.install()
        from vramkit.integrations.lightning import MemoryCallback

        class Net(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.layers = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                                  torch.nn.Linear(4096, 1024))
            def training_step(self, batch, batch_idx):
                (x,) = batch
                return self.layers(x).square().mean()
            def configure_optimizers(self):
                return torch.optim.AdamW(self.parameters(), lr=1e-3)

        data = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(torch.randn(640, 1024)), batch_size=64)
        trainer = L.Trainer(max_steps=10, accelerator="gpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, callbacks=[MemoryCallback(__LOG__)])
        trainer.fit(Net(), data)
        # Lightning moves the module back to the CPU when fit ends, so what was allocated
        # during it is read from the log, not from the pool now.
    """.replace("__LOG__", repr(str(log))),
        env={"VRAMKIT_PUBLISH_DIR": str(tmp_path)})
    records = _records(log)
    assert [r["step"] for r in records] == list(range(1, 11))
    assert [r["batch_idx"] for r in records] == list(range(10))
    assert all(r["allocated"] > 0 and r["nvml_used"] for r in records)


TRAINER = """
import json, sys, torch, vramkit, vramkit.torch
vramkit.torch.install()
model = torch.nn.Linear(4096, 4096).cuda()
opt = torch.optim.AdamW(model.parameters())
for _ in range(3):
    model(torch.randn(SIZE, 4096, device="cuda")).square().mean().backward()
    opt.step(); opt.zero_grad()
torch.cuda.synchronize()
print(json.dumps(vramkit.memory_stats(0)), flush=True)
sys.stdin.read()
"""
PLAIN = """
import sys, torch
x = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("{}", flush=True)
sys.stdin.read()
"""


def test_export_serves_two_vramkit_processes_and_a_plain_one(gpu_run, tmp_path):
    out = gpu_run(NEEDS_TORCH, """
        import json, os, subprocess, sys
        children = []
        for code in (__TRAINER__.replace("SIZE", "1024"), __TRAINER__.replace("SIZE", "4096"),
                     __PLAIN__):
            children.append(subprocess.Popen([sys.executable, "-c", code], env=os.environ,
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             text=True))
        stats = [json.loads(child.stdout.readline()) for child in children]
        done = subprocess.run([sys.executable, "-m", "vramkit", "export", "--once"],
                              capture_output=True, text=True)
        top = subprocess.run([sys.executable, "-m", "vramkit", "top", "--once", "--json"],
                             capture_output=True, text=True)
        for child in children:
            child.communicate("")
        assert done.returncode == 0, done.stderr
        assert top.returncode == 0, top.stderr
        print(json.dumps({"pids": [c.pid for c in children], "stats": stats,
                          "text": done.stdout, "top": json.loads(top.stdout)}))
    """.replace("__TRAINER__", repr(TRAINER)).replace("__PLAIN__", repr(PLAIN)),
        env={"VRAMKIT_PUBLISH_DIR": str(tmp_path)}, timeout=600)
    result = json.loads(out.strip().splitlines()[-2])
    text = result["text"]
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        pytest.fail("prometheus_client is needed to check the exporter's text here")
    series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series.setdefault(sample.name, []).append((sample.labels, sample.value))
    for pid, stats in zip(result["pids"][:2], result["stats"][:2]):
        mine = {name: [v for labels, v in values if labels.get("pid") == str(pid)]
                for name, values in series.items()}
        assert mine["vramkit_allocated_bytes"] == [stats["allocated_bytes.all.current"]]
        assert mine["vramkit_reserved_bytes"] == [stats["reserved_bytes.all.current"]]
        labels = next(lab for lab, _ in series["vramkit_allocated_bytes"]
                      if lab["pid"] == str(pid))
        assert labels["UUID"].startswith("GPU-") and labels["modelName"], labels
        assert labels["process"] and labels["source"] == "cuda"
    plain = result["pids"][2]
    assert not [lab for lab, _ in series["vramkit_allocated_bytes"]
                if lab["pid"] == str(plain)]
    assert series["vramkit_gpu_memory_total_bytes"]
    nvml_pids = {lab["pid"] for lab, _ in series.get("vramkit_process_gpu_used_bytes", [])}
    # NVML names processes by the host's pids: inside a container they may not be ours.
    print("NVML processes:", sorted(nvml_pids), "children:", result["pids"])
    if set(map(str, result["pids"])) & nvml_pids:
        assert set(map(str, result["pids"])) <= nvml_pids
    print(text)

    # vramkit top sees the same three: the two vramkit processes with the figures they print
    # themselves, and the plain one through NVML alone.
    doc = result["top"]
    print(json.dumps(doc, indent=1))
    rows = {p["pid"]: p for g in doc["gpus"] for p in g["processes"]}
    rows.update({p["pid"]: p for p in doc.get("unmatched_processes", [])})
    for pid, stats in zip(result["pids"][:2], result["stats"][:2]):
        row = rows[pid]
        assert row["vramkit"]["allocated_bytes"] == stats["allocated_bytes.all.current"]
        assert row["vramkit"]["reserved_bytes"] == stats["reserved_bytes.all.current"]
    if str(plain) in nvml_pids:                 # NVML's pids are ours: all three are there
        assert rows[plain]["vramkit"] is None and rows[plain]["nvml_used_bytes"] >= 512 << 20
        for pid in result["pids"][:2]:
            assert rows[pid]["nvml_used_bytes"] > 0

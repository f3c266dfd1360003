"""Tests of vramkit.observe._nvml, the NVML wrapper, against a fake NVML built from fake_nvml.c.

The fake is a real shared library with NVML's signatures and struct layouts, opened through
VRAMKIT_NVML_LIBRARY, so a wrong ctypes field, version word or fallback shows as wrong
figures here. Each test opens NVML in a fresh interpreter (nvml() caches the library it
opened): the `nvml_python` fixture runs code there with the fake library chosen.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import GiB

FAKE_SOURCE = Path(__file__).with_name("fake_nvml.c")
H200 = "GPU-11111111-2222-3333-4444-555555555555"
A100 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


def build_fake_nvml(directory: Path, *defines: str) -> Path:
    """Compile the fake NVML (with -D defines for a variant) into directory; skips the test
    where there is no C compiler."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        pytest.skip("no C compiler to build the fake NVML")
    name = "libfake_nvml" + "".join("_" + d.lower() for d in defines) + ".so"
    library = directory / name
    if not library.exists():
        subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Werror",
                        *(f"-D{d}" for d in defines), "-o", str(library), str(FAKE_SOURCE)],
                       check=True, capture_output=True, text=True)
    return library


@pytest.fixture(scope="module")
def fake_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fake_nvml")


def run_with_nvml(library, code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter that opens NVML from library (None: a missing one)."""
    full_env = dict(os.environ)
    full_env.pop("FAKE_NVML_INIT_FAIL", None)
    full_env["VRAMKIT_NVML_LIBRARY"] = str(library) if library else "/nonexistent/libnvidia-ml.so.1"
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=60)


DEVICES_AS_JSON = """
    import dataclasses, json
    from vramkit.observe._nvml import nvml
    print(json.dumps([dataclasses.asdict(gpu) for gpu in nvml().devices()]))
"""


def devices_with(library, env=None):
    done = run_with_nvml(library, DEVICES_AS_JSON, env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_devices_memory_utilization_and_processes(fake_dir):
    gpus = devices_with(build_fake_nvml(fake_dir))
    assert [(g["index"], g["uuid"], g["name"]) for g in gpus] == [
        (0, H200, "Fake H200"), (1, A100, "Fake A100")]
    # The _v2 memory call: the driver's 1 GiB reserve is neither used nor free.
    assert (gpus[0]["total"], gpus[0]["used"], gpus[0]["free"]) == (140 * GiB, 10 * GiB, 129 * GiB)
    assert gpus[0]["utilization_gpu"] == 37
    assert gpus[1]["utilization_gpu"] is None  # not supported on that device: no figure
    # usedGpuMemory NOT_AVAILABLE is None, not 2**64-1.
    assert [(p["pid"], p["used_bytes"]) for p in gpus[0]["processes"]] == [
        (4242, 3 * GiB), (4343, None)]
    assert gpus[1]["processes"] == []


@pytest.mark.parametrize("defines", [("FAKE_NO_PROCESSES_V3",),
                                     ("FAKE_NO_PROCESSES_V3", "FAKE_NO_PROCESSES_V2")])
def test_older_process_calls_and_their_struct_layouts(fake_dir, defines):
    # Without _v3 (and _v2) the wrapper falls back; the unversioned call fills 16-byte
    # entries, so reading them with the 24-byte struct would garble the second pid.
    library = build_fake_nvml(fake_dir, *defines)
    gpus = devices_with(library, {"FAKE_NVML_PROCESSES": f"1:{os.getpid()}:{5 * GiB}"})
    assert [(p["pid"], p["used_bytes"]) for p in gpus[0]["processes"]] == [
        (4242, 3 * GiB), (4343, None)]
    # The name of a live pid comes from /proc/<pid>/comm.
    assert [(p["pid"], p["used_bytes"]) for p in gpus[1]["processes"]] == [(os.getpid(), 5 * GiB)]
    assert gpus[1]["processes"][0]["name"] == Path(f"/proc/{os.getpid()}/comm").read_text().strip()


def test_first_memory_call_without_v2(fake_dir):
    # Drivers before 515: nvmlDeviceGetMemoryInfo only, whose "used" includes the reserve.
    gpus = devices_with(build_fake_nvml(fake_dir, "FAKE_NO_MEMORY_V2"))
    assert (gpus[0]["total"], gpus[0]["used"], gpus[0]["free"]) == (140 * GiB, 11 * GiB, 129 * GiB)


def test_many_processes_grow_the_buffer(fake_dir):
    many = ",".join(f"1:{100000 + i}:{i * 1024}" for i in range(20))
    gpus = devices_with(build_fake_nvml(fake_dir), {"FAKE_NVML_PROCESSES": many})
    assert [p["pid"] for p in gpus[1]["processes"]] == [100000 + i for i in range(20)]
    assert gpus[1]["processes"][19]["used_bytes"] == 19 * 1024


def test_missing_library_is_a_clear_error():
    done = run_with_nvml(None, """
        from vramkit.observe._nvml import nvml, NvmlError, visible_uuids
        for _ in range(2):  # the cached failure is raised again, as clearly
            try:
                nvml()
            except NvmlError as error:
                print(error)
        print(visible_uuids())
    """)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and lines[0] == lines[1]
    assert "/nonexistent/libnvidia-ml.so.1 cannot be opened" in lines[0]
    assert "NVIDIA driver" in lines[0]
    assert lines[2] == "None"


def test_failed_init_says_nvml_s_reason(fake_dir):
    done = run_with_nvml(build_fake_nvml(fake_dir), """
        from vramkit.observe._nvml import nvml, NvmlError
        try:
            nvml()
        except NvmlError as error:
            print(error)
    """, {"FAKE_NVML_INIT_FAIL": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "NVML initialisation failed: Driver Not Loaded (nvmlReturn 9)"


def test_a_library_that_is_not_nvml(tmp_path):
    # Any shared library without nvmlInit: libc's, found through ctypes as Python finds it.
    import ctypes.util
    libc = ctypes.util.find_library("c")
    if not libc:
        pytest.skip("no libc to stand for a library that is not NVML")
    done = run_with_nvml(libc, """
        from vramkit.observe._nvml import nvml, NvmlError
        try:
            nvml()
        except NvmlError as error:
            print(error)
    """)
    assert "has no nvmlInit" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("environ, expected", [
    ({}, [H200, A100]),
    ({"CUDA_VISIBLE_DEVICES": "1"}, [A100]),
    ({"CUDA_VISIBLE_DEVICES": "1,0"}, [A100, H200]),
    ({"CUDA_VISIBLE_DEVICES": "GPU-aaaa"}, [A100]),           # a UUID prefix
    ({"CUDA_VISIBLE_DEVICES": "aaaaaaaa-bbbb,0"}, [A100, H200]),  # without "GPU-"
    ({"CUDA_VISIBLE_DEVICES": "0,7,1"}, [H200]),               # CUDA stops at the bad entry
    ({"CUDA_VISIBLE_DEVICES": "0,0"}, [H200]),                 # and at a repeated one
    ({"CUDA_VISIBLE_DEVICES": ""}, []),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, []),
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, [H200, A100]),
    ({"NVIDIA_VISIBLE_DEVICES": "none"}, []),
    ({"NVIDIA_VISIBLE_DEVICES": A100}, [A100]),
    # A container given host GPUs 4 and 6: NVML inside shows just those two, as 0 and 1.
    ({"NVIDIA_VISIBLE_DEVICES": "4,6", "CUDA_VISIBLE_DEVICES": "1"}, [A100]),
    ({"NVIDIA_VISIBLE_DEVICES": "1"}, [A100]),
])
def test_visible_uuids(fake_dir, environ, expected):
    done = run_with_nvml(build_fake_nvml(fake_dir), f"""
        import json, os
        from vramkit.observe._nvml import visible_uuids
        print(json.dumps([visible_uuids({environ!r}), visible_uuids()]))
    """, {"CUDA_VISIBLE_DEVICES": "1"})
    assert done.returncode == 0, done.stderr
    given, own = json.loads(done.stdout)
    assert given == expected
    assert own == [A100]  # without an argument: this process's own environment

"""bench/torch_suite_table.py on junit reports written here: outcomes side by side, a later
run's outcome replacing an earlier one's, a crashed test named as such, and a test that
fails only under vramkit counted either as a difference or, when documented, as an
exception with its reason."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "torch_suite_table.py"


def _report(path: Path, cases: dict) -> None:
    body = []
    for name, outcome in cases.items():
        cls, test = name.split(".")
        inner = {"passed": "", "failed": "<failure message='x'/>",
                 "error": "<error message='x'/>", "skipped": "<skipped/>"}[outcome]
        body.append(f"<testcase classname='test_cuda.{cls}' name='{test}'>{inner}</testcase>")
    path.write_text("<testsuites><testsuite>" + "".join(body) + "</testsuite></testsuites>")


def test_the_table_marks_differences_and_documented_exceptions(tmp_path):
    _report(tmp_path / "native.xml", {"TestCuda.test_a": "passed",
                                      "TestCuda.test_record_stream": "passed",
                                      "TestCuda.test_b": "passed",
                                      "TestCuda.test_c": "skipped"})
    _report(tmp_path / "vramkit.xml", {"TestCuda.test_a": "failed",
                                       "TestCuda.test_record_stream": "failed",
                                       "TestCuda.test_b": "error",
                                       "TestCuda.test_c": "skipped"})
    # A second run after a crash: test_b passed there, and test_d ended the interpreter.
    _report(tmp_path / "vramkit.1.xml", {"TestCuda.test_b": "passed"})
    (tmp_path / "vramkit.crashed").write_text("TestCuda::test_d\n")
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("Test")}
    assert rows["TestCuda.test_a"].split()[1:3] == ["passed", "failed"]
    assert "<-- differs" in rows["TestCuda.test_a"]
    assert "exception: layout" in rows["TestCuda.test_record_stream"]
    assert rows["TestCuda.test_b"].split()[1:3] == ["passed", "passed"]
    assert rows["TestCuda.test_d"].split()[1:3] == ["-", "crashed"]
    assert "vramkit passed 1 failed 2 error 0 skipped 1 crashed 1" in done.stdout
    assert "not under vramkit: 1, and 1 documented exceptions" in done.stdout

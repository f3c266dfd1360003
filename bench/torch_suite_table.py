"""Prints bench/torch_suite.sh's pass table: each test of PyTorch's selection with its
outcome under PyTorch's allocator and under vramkit, side by side, the rows where they
differ first, then the counts. A test that ended the interpreter is "crashed". A test that
passes under PyTorch's allocator and not under vramkit is marked "differs", or, if it is
one of the documented exceptions (it asserts PyTorch's own block layout, or a setting
vramkit has no equivalent for and warns about; docs/performance.md lists each with what
vramkit's own tests check instead), "exception" with the reason.

    python3 bench/torch_suite_table.py .gpu/torch_suite
"""

import pathlib
import sys
import xml.etree.ElementTree as ET


# Class.test -> why vramkit differs there by design.
EXCEPTIONS = {
    "TestCuda.test_graph_memory_stats_and_use_result_after_destroy_graph":
        "layout: reserved grows by PyTorch's 20 MiB large segment per graph",
    "TestCuda.test_record_stream":
        "layout: the next request gets the very address back",
    "TestCudaMallocAsync.test_max_split_expandable":
        "max_split_size_mb has no vramkit equivalent (warned)",
    "TestCudaMallocAsync.test_allocator_settings":
        "roundup_power2_divisions has no vramkit equivalent (warned)",
    "TestBlockStateAbsorption.test_allocate_in_thread_to_pool":
        "layout: 4 segments without expandable segments, 2 with (vramkit: 2)",
    "TestBlockStateAbsorption.test_allocated_in_middle_of_segment":
        "follows test_allocate_in_thread_to_pool, whose failure keeps its graph's 2 segments "
        "alive until this test's teardown; passes alone",
    "TestCudaMallocAsync.test_allocator_backend":
        "asks which allocator PyTorch's is: under vramkit, vramkit (the script sets "
        "backend:cudaMallocAsync after vramkit was installed)",
}


def outcomes(path: pathlib.Path) -> dict:
    """{class.test: passed | failed | error | skipped} of one junit file ({} if absent)."""
    if not path.exists():
        return {}
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
        tags = {child.tag for child in case}
        out[name] = ("failed" if "failure" in tags else "error" if "error" in tags
                     else "skipped" if "skipped" in tags else "passed")
    return out


def results(base: pathlib.Path, label: str) -> dict:
    """Every run of one allocator: its reports in order (a later run's outcome for a test
    replaces an earlier one's), and the tests that ended the interpreter as "crashed"."""
    out = outcomes(base / f"{label}.xml")
    runs = sorted(base.glob(f"{label}.*.xml"), key=lambda p: int(p.suffixes[-2][1:]))
    for path in runs:
        out.update(outcomes(path))
    crashed = base / f"{label}.crashed"
    if crashed.exists():
        for line in crashed.read_text().split():
            out[line.replace("::", ".")] = "crashed"
    return out


def main(folder: str) -> int:
    base = pathlib.Path(folder)
    native, vramkit = results(base, "native"), results(base, "vramkit")
    names = sorted(set(native) | set(vramkit),
                   key=lambda n: (native.get(n) == vramkit.get(n), n))
    width = max([len(n) for n in names] + [4])
    print(f"{'test':<{width}}  {'native':<8}  vramkit")
    differs = excepted = 0
    for name in names:
        a, b = native.get(name, "-"), vramkit.get(name, "-")
        note = ""
        if a == "passed" and b != "passed":
            if name in EXCEPTIONS:
                excepted += 1
                note = f"   exception: {EXCEPTIONS[name]}"
            else:
                differs += 1
                note = "   <-- differs"
        elif a != b:
            note = "   (differs)"
        print(f"{name:<{width}}  {a:<8}  {b}{note}")
    for label, result in (("native", native), ("vramkit", vramkit)):
        counts = {k: list(result.values()).count(k)
                  for k in ("passed", "failed", "error", "skipped", "crashed")}
        print(label, " ".join(f"{k} {v}" for k, v in counts.items()))
    print(f"passed under PyTorch's allocator, not under vramkit: {differs}, "
          f"and {excepted} documented exceptions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ".gpu/torch_suite"))

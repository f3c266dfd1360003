"""Prints bench/torch_suite.sh's pass table: each test of PyTorch's selection with its
outcome under PyTorch's allocator and under vramkit, side by side, the rows where they
differ first, then the counts. A test that ended the interpreter is "crashed".

    python3 bench/torch_suite_table.py .gpu/torch_suite
"""

import pathlib
import sys
import xml.etree.ElementTree as ET


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
    for name in names:
        a, b = native.get(name, "-"), vramkit.get(name, "-")
        print(f"{name:<{width}}  {a:<8}  {b}{'' if a == b else '   <-- differs'}")
    for label, result in (("native", native), ("vramkit", vramkit)):
        counts = {k: list(result.values()).count(k)
                  for k in ("passed", "failed", "error", "skipped", "crashed")}
        print(label, " ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ".gpu/torch_suite"))

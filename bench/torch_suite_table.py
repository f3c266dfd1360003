"""Prints bench/torch_suite.sh's pass table: each test of PyTorch's selection with its
outcome under PyTorch's allocator and under vramkit, side by side, the rows where they
differ first, then the counts.

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


def main(folder: str) -> int:
    base = pathlib.Path(folder)
    native, vramkit = outcomes(base / "native.xml"), outcomes(base / "vramkit.xml")
    names = sorted(set(native) | set(vramkit),
                   key=lambda n: (native.get(n) == vramkit.get(n), n))
    width = max([len(n) for n in names] + [4])
    print(f"{'test':<{width}}  {'native':<8}  vramkit")
    for name in names:
        a, b = native.get(name, "-"), vramkit.get(name, "-")
        print(f"{name:<{width}}  {a:<8}  {b}{'' if a == b else '   <-- differs'}")
    for label, result in (("native", native), ("vramkit", vramkit)):
        counts = {k: list(result.values()).count(k)
                  for k in ("passed", "failed", "error", "skipped")}
        print(label, " ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ".gpu/torch_suite"))

"""The table of cuDNN convolution workspaces (``data/cudnn_workspaces.json``): filled from
the output of ``bench/cudnn_workspace_probe.py`` and shown, as a command.

    python -m vramkit.estimator.workspace_table import PROBE.json [--table PATH] [--replace]
                                                [--sources LIST] [--other-device]
    python -m vramkit.estimator.workspace_table show [--table PATH]

The model that reads the table, and the table's format, are :mod:`.workspaces`'; this
module is the tooling that writes it, kept apart so that estimating never imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import Counter

from .workspaces import (PARTS, PROBE_FORMAT, TABLE_PATH, ConvSignature, Table,
                         WorkspaceTableError, empty_table, fit_rule)

def _read_json(path: str, what: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError) as error:
        raise WorkspaceTableError(f"{path}: cannot read the {what}: {error}") from None
    except json.JSONDecodeError as error:
        raise WorkspaceTableError(f"{path}: the {what} is not JSON: {error}") from None


def measurements_of_probe(data, path: str = "<probe>", sources=None) -> tuple:
    """({key: bytes}, measured_on) from a probe's output: its isolated measurements (one
    part on its own, as measure_on_device does it), the largest where one signature was
    measured more than once; ``sources``: only records whose source (the probe's "sweep",
    "layers", "listed" or a workload's name) is one of them."""
    if not isinstance(data, dict) or data.get("format") != PROBE_FORMAT:
        raise WorkspaceTableError(f"{path}: not the output of bench/cudnn_workspace_probe.py "
                                  f"(format {PROBE_FORMAT!r} expected)")
    records = data.get("isolated")
    if not isinstance(records, list):
        raise WorkspaceTableError(f"{path}: no list of isolated measurements")
    measured: dict = {}
    for index, record in enumerate(records):
        if not isinstance(record, dict) or "workspace" not in record:
            continue  # a part that could not be measured: the record says why
        if sources is not None and record.get("source") not in sources:
            continue
        size = record["workspace"]
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise WorkspaceTableError(f"{path}: isolated record {index}: workspace "
                                      f"{size!r} is not a size in bytes")
        try:
            key = ConvSignature.from_fields(record["signature"]).key()
        except (KeyError, TypeError, ValueError) as error:
            raise WorkspaceTableError(f"{path}: isolated record {index}: its signature: "
                                      f"{error}") from None
        measured[key] = max(measured.get(key, 0), size)
    environment = data.get("environment") or {}
    measured_on = {k: environment.get(k) for k in ("device", "torch", "cudnn", "cuda")}
    return measured, measured_on


def import_probe(probe_path: str, table_path: str = TABLE_PATH, *, replace: bool = False,
                 allow_dry_run: bool = False, sources=None,
                 other_device: bool = False) -> tuple:
    """Add a probe's measurements to the table at table_path (created if missing) and fit
    its rule again over all its entries. Returns (table, signatures imported).
    ``sources``: only the probe's records of these sources. ``other_device``: the probe
    ran on another device than the table's (of the same architecture, whose cuDNN picks
    the same algorithms: check that on signatures both measured first); its measurements
    fill signatures the table lacks, never replace one, and the table names both
    devices."""
    data = _read_json(probe_path, "probe output")
    if isinstance(data, dict) and data.get("dry_run") and not allow_dry_run:
        raise WorkspaceTableError(f"{probe_path}: the output of a --dry-run, whose sizes "
                                  f"are made up; not imported")
    measured, measured_on = measurements_of_probe(data, probe_path, sources)
    existing = Table.load(table_path) if os.path.exists(table_path) else empty_table()
    primary = existing.measured_on or {}
    other = not replace and bool(existing.entries) and \
        primary.get("device") != measured_on.get("device")
    if other and not other_device:
        raise WorkspaceTableError(
            f"{table_path} holds measurements on {existing.describe_source()}, and "
            f"{probe_path} ran on {measured_on.get('device')!r}: a table is one device's; "
            f"--replace starts it again from this probe, --other-device adds what it lacks")
    entries = {} if replace else dict(existing.entries)
    if other:
        added = {k: v for k, v in measured.items() if k not in entries}
        entries.update(added)
        also = [dict(a) for a in primary.get("also", [])]
        same = [a for a in also if _same_setup(a, measured_on)]
        if same:  # a device named already: its count grows, its name is not repeated
            same[0]["signatures"] = int(same[0].get("signatures") or 0) + len(added)
        else:
            also.append(dict(measured_on, signatures=len(added)))
        table = Table(entries, fit_rule(entries), dict(primary, also=also), table_path)
        table.save(table_path)
        return table, len(added)
    entries.update(measured)
    if not replace and primary.get("also"):
        measured_on = dict(measured_on, also=primary["also"])
    table = Table(entries, fit_rule(entries), measured_on, table_path)
    table.save(table_path)
    return table, len(measured)


def _same_setup(a: dict, b: dict) -> bool:
    """Two measurements' device, PyTorch, cuDNN and CUDA are the same."""
    return all(a.get(k) == b.get(k) for k in ("device", "torch", "cudnn", "cuda"))


def rule_errors(table: Table) -> dict:
    """How well the table's rules predict its own entries: each entry measured at another
    batch of its layer too, predicted by the batch rule from those other batches; each
    entry predicted from the nearest other layers of its kind; each entry predicted by the
    size rule. Per rule: the count and the median and 90th percentile of |predicted -
    measured| / measured (entries above 0 bytes)."""
    batch, nearest, size = [], [], []
    ratios = table.rule.get("workspace_per_activation_byte", {})
    for key, measured in table.entries.items():
        if measured <= 0:
            continue
        signature = ConvSignature.from_key(key)
        others = [p for p in table._layers[signature.layer()] if p[0] != signature.batch]
        if others:
            batch.append(abs(table._scaled(signature, others) - measured) / measured)
        predicted = table._nearest(signature, excluding=signature.layer())
        if predicted is not None:
            nearest.append(abs(predicted - measured) / measured)
        ratio = ratios.get(signature.size_group())
        if ratio is not None:
            size.append(abs(ratio * signature.activation_bytes() - measured) / measured)

    def summary(errors):
        if not errors:
            return {"count": 0}
        errors = sorted(errors)
        return {"count": len(errors), "median": statistics.median(errors),
                "p90": errors[min(len(errors) - 1, int(0.9 * len(errors)))]}

    return {"batch": summary(batch), "nearest": summary(nearest), "size": summary(size)}


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _show(table: Table) -> str:
    lines = [f"{table.path}: {len(table.entries)} signatures measured on "
             f"{table.describe_source()}"]
    by_part = Counter(ConvSignature.from_key(k).part for k in table.entries)
    for part in PARTS:
        if by_part[part]:
            sizes = [v for k, v in table.entries.items() if k.startswith(part + " ")]
            lines.append(f"  {part:<16} {by_part[part]:>5} signatures, largest "
                         f"{_bytes(max(sizes))}, median {_bytes(int(statistics.median(sizes)))}, "
                         f"{sum(1 for v in sizes if v == 0)} without a workspace")
    for name, values in sorted(table.rule.items()):
        for group, value in sorted(values.items()):
            lines.append(f"  rule {name} [{group}] = {value:g}")
    for rule, errors in rule_errors(table).items():
        if errors["count"]:
            lines.append(f"  {rule} rule on the table's own {errors['count']} entries: "
                         f"median error {100 * errors['median']:.0f}%, 90% of them within "
                         f"{100 * errors['p90']:.0f}%")
    return "\n".join(lines)


def main(argv=None) -> int:
    """``import PROBE.json [--table PATH] [--replace]``, ``refit [--table PATH]`` and
    ``show [--table PATH]``.
    Exit 0, 2 for a file that cannot be read as a probe's output or a table, 3 for a bad
    command line."""
    parser = argparse.ArgumentParser(
        prog="python -m vramkit.estimator.workspace_table",
        description="The table of cuDNN convolution workspaces vramkit.estimate uses "
                    "without a GPU.")
    commands = parser.add_subparsers(dest="command", required=True)
    add = commands.add_parser("import", help="add a bench/cudnn_workspace_probe.py "
                                             "output to the table and fit its rule")
    add.add_argument("probe", help="the probe's JSON output (its --out)")
    add.add_argument("--table", default=TABLE_PATH,
                     help=f"the table to write (default: this installation's, {TABLE_PATH})")
    add.add_argument("--replace", action="store_true",
                     help="start the table again from this probe, dropping its entries")
    add.add_argument("--allow-dry-run", action="store_true",
                     help="import a --dry-run's made-up sizes (for tests)")
    add.add_argument("--sources", default=None,
                     help="only the probe's records of these sources (comma-separated: "
                          "sweep, layers, listed, or a workload's name)")
    add.add_argument("--other-device", action="store_true",
                     help="the probe ran on another device of the same architecture: "
                          "add the signatures the table lacks, and name both devices")
    show = commands.add_parser("show", help="what a table holds")
    show.add_argument("--table", default=TABLE_PATH)
    refit = commands.add_parser("refit", help="fit the table's rule again over its entries "
                                              "(after a change to how the rule groups them)")
    refit.add_argument("--table", default=TABLE_PATH)
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:
        return 3 if done.code else 0
    try:
        if args.command == "import":
            table, count = import_probe(
                args.probe, args.table, replace=args.replace,
                allow_dry_run=args.allow_dry_run, other_device=args.other_device,
                sources=set(args.sources.split(",")) if args.sources else None)
            print(f"imported {count} signatures from {args.probe}")
        else:
            table = Table.load(args.table)
        if args.command == "refit":
            table = Table(table.entries, fit_rule(table.entries), table.measured_on,
                          args.table)
            table.save(args.table)
        print(_show(table))
    except WorkspaceTableError as error:
        print(f"vramkit.estimator.workspace_table: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

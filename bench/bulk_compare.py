"""The table of bulk loads before and after, on loopback and through a 1 Gbit/s link.

Reads two runs of measure (s) (``bench/bulk-results.json``, this version, and
``bench/bulk-results-8647704.json``, the package of 8647704 measured by the same bench in
the same session) and prints, per cell, ours with numpy and hiredis: fingerprints per
second, bytes on the wire per fingerprint, the ratio to RedisBloom's ``BF.MADD`` of the
same run; then the native backend's (this version) and its ratio.
``docs/explanation/bench-results.md`` shows this table as printed
(``tests/test_docs_truth.py`` checks it is)::

    python bench/bulk_compare.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OURS, MADD = "ours, defaults (bitmap, numpy)", "RedisBloom BF.MADD"
NATIVE = "ours, native: add_many"


def _cells(name: str) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    found = json.loads((HERE / name).read_text(encoding="utf-8"))["measures"]["s"]
    return {label: cell for label, cell in found.items() if label != "info"}


def table(after: str = "bulk-results.json", before: str = "bulk-results-8647704.json") -> str:
    """Return the markdown table comparing the two runs, cell by cell."""
    now, then = _cells(after), _cells(before)
    lines = [
        "| filter, fingerprints per call | 8647704: fp/s | bytes/fp | x BF.MADD"
        " | now: fp/s | bytes/fp | x BF.MADD | native backend: fp/s | x BF.MADD |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, cell in now.items():
        row = [label.replace("1000M", "1B")]
        for run in (then[label], cell):
            rates = run["fp_per_s"]
            ours, madd = rates[OURS]["median"], rates[MADD]["median"]
            wire = run["wire_bytes"][OURS]["median"]
            row += [f"{ours:,.0f}", f"{wire:,.0f}", f"{ours / madd:.2f}"]
        native = cell["fp_per_s"][NATIVE]["median"]
        row += [f"{native:,.0f}", f"{native / cell['fp_per_s'][MADD]['median']:.2f}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")

"""Targets, the results table, ``results.md`` and ``results.json``."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness import Samples


@dataclass(frozen=True)
class Target:
    """A goal: ``value`` must be at least (or at most) ``threshold``."""

    measure: str
    text: str
    value: float
    threshold: float
    at_least: bool
    unit: str = "x"

    @property
    def passed(self) -> bool:
        """True when the measured value meets the threshold."""
        if math.isnan(self.value):
            return False
        return self.value >= self.threshold if self.at_least else self.value <= self.threshold

    @property
    def verdict(self) -> str:
        """PASS, MISS, or N/A when a contender it needs was not measured."""
        if math.isnan(self.value):
            return "N/A"
        return "PASS" if self.passed else "MISS"

    def measured(self) -> str:
        """Return the measured value as text."""
        return _fmt(self.value, self.unit)

    def wanted(self) -> str:
        """Return the threshold as text, with its direction."""
        return f"{'≥' if self.at_least else '≤'} {_fmt(self.threshold, self.unit)}"


@dataclass(frozen=True)
class Row:
    """One line of the results table."""

    measure: str
    contender: str
    median: float
    unit: str
    sample: int
    rounds: int
    comparison: str
    note: str = ""


def _fmt(value: float, unit: str) -> str:
    if math.isnan(value):
        return "n/a"
    if unit == "x":
        return f"{value:.2f}x"
    if unit in ("calls/s", "fp/s"):
        return f"{value:,.0f} {unit}"
    if unit == "B/fp":
        return f"{value:.3f} {unit}"
    if unit == "s":
        return f"{value:.2f} s"
    if unit == "usec":
        return f"{value:.2f} usec"
    if unit in ("commands", "trips"):
        return f"{value:.3f} {unit}"
    if unit == "rate":
        return f"{value:.2e}"
    return f"{value:g} {unit}"


def ratio(numerator: float, denominator: float) -> float:
    """Return numerator / denominator; NaN when either is missing or the denominator is 0."""
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return float("nan")
    return numerator / denominator


def rows_for(
    measure: str, samples: dict[str, Samples], reference: str, per_reference: bool = False
) -> list[Row]:
    """Rows of one measure; every other contender is compared with ``reference``.

    The comparison is ``reference's median / this contender's median``: for a rate,
    how many times faster the reference is; for seconds or bytes, its share of them.
    With ``per_reference`` it is the other way round, ``this / reference``: how many
    times the reference's cost (Redis time per check against a SADD's).
    """
    rows = []
    ref = samples[reference].median if reference in samples else float("nan")
    for name, sample in samples.items():
        if name == reference:
            comparison = "reference"
        elif per_reference:
            comparison = f"this/{reference} = {ratio(sample.median, ref):.3g}"
        else:
            comparison = f"{reference}/this = {ratio(ref, sample.median):.3g}"
        rows.append(
            Row(
                measure=measure,
                contender=name,
                median=sample.median,
                unit=sample.unit,
                sample=sample.sample_size,
                rounds=len(sample.values),
                comparison=comparison,
                note=sample.note,
            )
        )
    return rows


_HEADERS = ("measure", "contender", "median", "sample", "rounds", "comparison", "note")


def _cells(row: Row) -> tuple[str, ...]:
    return (
        row.measure,
        row.contender,
        _fmt(row.median, row.unit),
        f"{row.sample:,}",
        str(row.rounds),
        row.comparison,
        row.note,
    )


def text_table(rows: Sequence[Row], targets: Sequence[Target]) -> str:
    """Render the results and the targets as fixed-width text for the terminal."""
    lines = [grid([_HEADERS, *(_cells(r) for r in rows)])]
    target_rows = [("target", "measured", "wanted", "result")] + [
        (f"({t.measure}) {t.text}", t.measured(), t.wanted(), t.verdict) for t in targets
    ]
    lines.append(grid(target_rows))
    return "\n\n".join(lines)


def grid(table: Sequence[Sequence[str]]) -> str:
    """Render rows as fixed-width text (the first row is the header)."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    out = []
    for index, row in enumerate(table):
        out.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if index == 0:
            out.append("  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in out)


def md_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """Render a Markdown table."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *(line(r) for r in body)])


def markdown(
    meta: dict[str, Any],
    rows: Sequence[Row],
    targets: Sequence[Target],
    crawl_outcomes: Sequence[dict[str, Any]],
    notes: Sequence[str],
    sections: Sequence[tuple[str, str]] = (),
) -> str:
    """Render ``results.md``; ``sections``: (heading, Markdown) placed after the targets."""
    machine = meta["machine"]
    redis = meta["redis"]
    packages = ", ".join(f"{k} {v}" for k, v in machine["packages"].items() if v)
    passed = sum(t.passed for t in targets)
    judged = sum(t.verdict != "N/A" for t in targets)
    parts = [
        "# scrapy-redis-bloom benchmark results",
        "",
        f"- date: {meta['date']} (total run {meta['elapsed']:.0f} s)",
        f"- command: `{meta['command']}`",
        f"- machine: {machine['nproc']} CPUs, {machine['cpu_model']}; {machine['platform']}",
        f"- Python {machine['python']}; {packages}",
        f"- Redis {redis['version']} ({redis['allocator']}), {redis['binary']}"
        f" (from {redis['binary_source']}), on 127.0.0.1",
        f"- git: {machine['git'] or 'unknown'}",
        "",
        "## Results",
        "",
        "Medians over rounds; contenders of a measure interleaved round by round in a"
        " rotated order. `comparison`: ours relative to that contender, measured in the"
        " same run.",
        "",
        md_table(_HEADERS, [_cells(r) for r in rows]),
        "",
        *_left_out(meta.get("skipped", [])),
        f"## Targets: {passed} of {judged} met",
        "",
        md_table(
            ("target", "measured", "wanted", "result"),
            [(f"({t.measure}) {t.text}", t.measured(), t.wanted(), t.verdict) for t in targets],
        ),
        "",
        *(line for heading, body in sections for line in (f"## {heading}", "", body, "")),
        *_crawl_section(crawl_outcomes),
        "## How it was measured",
        "",
        *(f"- {note}" for note in notes),
        "",
    ]
    return "\n".join(parts)


def _crawl_section(crawl_outcomes: Sequence[dict[str, Any]]) -> list[str]:
    """Return the lines of the table of crawls (e), none when no crawl ran."""
    if not crawl_outcomes:
        return []
    return [
        "## Crawls (e), one row per crawl, in the order run",
        "",
        md_table(
            (
                "contender",
                "span s",
                "to last page s",
                "wall s",
                "pages fetched",
                "duplicate fetches",
                "lost pages",
                "per worker",
                "requests offered",
                "filter usec/page",
                "Redis usec/page",
                "filter round trips/page",
                "error",
            ),
            [
                (
                    o["contender"],
                    f"{o['span']:.2f}",
                    f"{o['to_last_page']:.2f}",
                    f"{o['wall']:.2f}",
                    f"{o['pages_fetched']}/{o['pages_reachable']}",
                    str(o["duplicate_fetches"]),
                    str(o["lost_pages"]),
                    " + ".join(str(n) for n in o["per_worker"]),
                    f"{o['requests_offered']:,}",
                    _per_page(o, o.get("filter_usec")),
                    _per_page(o, o.get("redis_usec")),
                    _per_page(o, o.get("round_trips"), "not reported"),
                    o["error"] or "",
                )
                for o in crawl_outcomes
            ],
        ),
        "",
    ]


def _left_out(skipped: Sequence[str]) -> list[str]:
    if not skipped:
        return []
    return ["## Left out of this run", "", *(f"- {why}" for why in skipped), ""]


def _per_page(outcome: dict[str, Any], value: float | None, missing: str = "") -> str:
    fetches = outcome["pages_fetched"] + outcome["duplicate_fetches"]
    if value is None or not fetches:
        return missing
    return f"{value / fetches:.2f}"


def write_results(
    out_dir: Path,
    meta: dict[str, Any],
    rows: Sequence[Row],
    targets: Sequence[Target],
    measures: dict[str, Any],
    crawl_outcomes: Sequence[dict[str, Any]],
    notes: Sequence[str],
    sections: Sequence[tuple[str, str]] = (),
) -> tuple[Path, Path]:
    """Write ``results.md`` and ``results.json`` into ``out_dir``; return their paths.

    ``sections``: (heading, Markdown) of tables made for the README, in results.md only.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path, json_path = out_dir / "results.md", out_dir / "results.json"
    md_path.write_text(markdown(meta, rows, targets, crawl_outcomes, notes, sections))
    document = {
        **meta,
        "measures": measures,
        "rows": [asdict(r) for r in rows],
        "targets": [{**asdict(t), "passed": t.passed, "verdict": t.verdict} for t in targets],
        "crawls": list(crawl_outcomes),
        "notes": list(notes),
    }
    json_path.write_text(json.dumps(jsonable(document), indent=2, allow_nan=False) + "\n")
    return md_path, json_path


def jsonable(value: Any) -> Any:
    """Return ``value`` with NaN as None and tuples, paths and dataclasses as JSON types."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value

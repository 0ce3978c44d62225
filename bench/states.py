"""Measure (g): Redis time per check in every state a crawl reaches (issue 32).

(t) measures a check on a fresh filter. A crawl does not stay there: past
``BLOOMFILTER_CAPACITY`` the filter grows (``BLOOMFILTER_EXPANSION = 2``, the default),
and a re-crawl (``BLOOMFILTER_TTL``) always runs on windows; the native backend has the
same states. For one capacity N at the run's error rate, every state below is built
once on the benchmark's server, under its own key, and filled with the public bulk
path (ours' ``add_many``, ``BF.MADD``, pipelined ``SADD``):

- bitmap (defaults, ``BLOOMFILTER_BACKEND = 'bitmap'``): fresh, 0.9x full, just past
  capacity (1.05x), grown to 3x; ``BLOOMFILTER_EXPANSION = 0`` at 0.9x;
  ``BLOOMFILTER_TTL = 3600`` in a fresh window and filled to 0.9x within the window;
  and a re-crawl's steady state, the window after one filled to 0.9x, itself at 0.45x
  (its TTL chosen so that a window boundary falls between the two fills, see
  :func:`boundary_ttl`);
- native (``BLOOMFILTER_BACKEND = 'native'``, RedisBloom loaded): fresh, grown to 3x,
  ``BLOOMFILTER_TTL = 3600`` fresh and at 0.9x, and the window after one at 0.9x;
- the peers: scrapy-redis's ``SADD`` on a set of 0.9N fingerprints (clear of the
  power of two where Redis's hash table doubles: at 1N, the rounds' adds would cross
  2**20 at 1M and time an incremental rehash), and RedisBloom's
  ``BF.ADD`` on a scaling filter (``BF.RESERVE key p N``, its default EXPANSION 2)
  filled to 3N.

Then single checks go through the hot path the way a crawl calls it, one element per
call: ours' ``check_and_add`` on precomputed 40-hex fingerprints (so the client's
fingerprinting does not dominate), ``SADD key fp``, ``BF.ADD key fp``. Each state is
checked on NEW fingerprints (never added) and on SEEN ones (drawn uniformly from those
its fill added), while Redis times every top-level command
(:class:`cmdtime.CommandClock`). Per check: Redis command time, commands, and round
trips (ours' own count, the filter's ``round_trips``; a peer sends one command per
round trip). States and kinds are interleaved round by round (:func:`harness.interleave`),
each round on fingerprints no other round used.

The filters are built once, not per round: filling a grown filter at 10M takes minutes.
A check of a new fingerprint adds it, so a state moves by ``rounds * checks`` items over
the run (at 1M, 10,000 checks, 4 rounds: 0.04x); the fill the notes give is the one the
rounds start from. Only public names are used (``BloomConfig``, the filter the package
builds from settings, its ``add_many``, ``check_and_add`` and ``round_trips``), so the
measure runs on any version that has the settings it needs, earlier ones included.
"""

from __future__ import annotations

import bisect
import gc
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import redis
from cmdtime import CommandClock, per_call
from harness import BenchRedis, Samples, interleave
from micro import Peers, setting_recognised
from peers import bf_madd, bf_reserve
from report import Target, md_table, ratio
from size import capacity_text, rate_text

logger = logging.getLogger("bench.states")

#: BLOOMFILTER_TTL of the windowed states: an hour, as a daily re-crawl might use.
TTL = 3600
#: Fingerprints generated (and given to each filler) at a time.
CHUNK = 100_000
#: Fingerprints per pipelined SADD of the set's fill.
SADD_CHUNK = 1_000
KINDS = ("new", "seen")
#: A Bloom peer does not count a fill's false positives (at most the error rate of
#: them): its count may fall short of the fill by this share, ours' and the set's not.
FILL_TOLERANCE = 0.01

NAME_FRESH = "bitmap, fresh"
NAME_FULL = "bitmap, 0.9x"
NAME_PAST = "bitmap, just past capacity (1.05x)"
NAME_GROWN = "bitmap, grown to 3x"
NAME_FIXED = "bitmap, EXPANSION=0, 0.9x"
NAME_TTL_FRESH = f"bitmap, TTL={TTL}, fresh window"
NAME_TTL_FULL = f"bitmap, TTL={TTL}, 0.9x in the window"
NAME_NATIVE_FRESH = "native, fresh"
NAME_NATIVE_GROWN = "native, grown to 3x"
NAME_NATIVE_TTL_FRESH = f"native, TTL={TTL}, fresh window"
NAME_NATIVE_TTL_FULL = f"native, TTL={TTL}, 0.9x in the window"
#: A re-crawl past its first window: the window before filled to 0.9x, this one to 0.45x.
NAME_TTL_NEXT = "bitmap, TTL, next window (0.9x before, 0.45x now)"
NAME_NATIVE_TTL_NEXT = "native, TTL, next window (0.9x before, 0.45x now)"
#: The next-window states' fills: the window before's, then the current one's.
BEFORE, NOW = 0.9, 0.45
#: Their TTL is chosen between these (seconds): at least half an hour, so that the
#: windows outlive the run (a window expires two TTLs after it starts).
TTL_RANGE = (1800, 7200)
NAME_SADD = "scrapy-redis SADD, set of 0.9x"
NAME_BF_ADD = "RedisBloom BF.ADD, scaling, 3x"


@dataclass(frozen=True)
class State:
    """A state to measure: how its contender is built and how full it is."""

    name: str
    #: "bitmap" or "native" (ours, built from ``settings``), "sadd" or "bf.add" (peers).
    group: str
    #: Items its fill adds, as a multiple of the capacity (0: fresh).
    multiple: float
    #: Ours' settings (BLOOMFILTER_*); empty for the peers.
    settings: dict[str, Any] = field(default_factory=dict)
    #: Items filled in the window before the current one (a multiple of the capacity);
    #: non-zero only for the next-window states, whose TTL the build chooses.
    before: float = 0.0

    @property
    def ours(self) -> bool:
        """Tell whether this is the package's filter (not a peer)."""
        return self.group in ("bitmap", "native")

    @property
    def windowed(self) -> bool:
        """The filter has re-crawl windows (BLOOMFILTER_TTL)."""
        return bool(self.settings.get("BLOOMFILTER_TTL"))


def label_of(capacity: int, error_rate: float) -> str:
    """Name a size as the README does: '1M @ 1e-4'."""
    return f"{capacity_text(capacity)} @ {rate_text(error_rate)}"


def contender(state: str, kind: str) -> str:
    """Name one state checked on one kind of fingerprint: 'bitmap, fresh: new'."""
    return f"{state}: {kind}"


def states_for(peers: Peers, capacity: int, error_rate: float) -> tuple[list[State], list[str]]:
    """Return the states this run can build at one size, and what it leaves out, why.

    Native states need RedisBloom and a version that knows BLOOMFILTER_BACKEND; the
    windowed and fixed ones a version that knows BLOOMFILTER_TTL / _EXPANSION.
    """
    sized: dict[str, Any] = {"BLOOMFILTER_CAPACITY": capacity, "BLOOMFILTER_ERROR_RATE": error_rate}
    bitmap = {**peers.ours_settings(), **sized}
    native = {**sized, "BLOOMFILTER_BACKEND": "native"}
    ttl = {"BLOOMFILTER_TTL": TTL}
    has_ttl = setting_recognised("BLOOMFILTER_TTL", TTL)
    has_fixed = setting_recognised("BLOOMFILTER_EXPANSION", 0)
    states = [
        State(NAME_FRESH, "bitmap", 0.0, bitmap),
        State(NAME_FULL, "bitmap", 0.9, bitmap),
        State(NAME_PAST, "bitmap", 1.05, bitmap),
        State(NAME_GROWN, "bitmap", 3.0, bitmap),
    ]
    skipped = []
    if has_fixed:
        states.append(State(NAME_FIXED, "bitmap", 0.9, {**bitmap, "BLOOMFILTER_EXPANSION": 0}))
    else:
        skipped.append(f"(g) '{NAME_FIXED}': this version does not know BLOOMFILTER_EXPANSION.")
    if has_ttl:
        states += [
            State(NAME_TTL_FRESH, "bitmap", 0.0, {**bitmap, **ttl}),
            State(NAME_TTL_FULL, "bitmap", 0.9, {**bitmap, **ttl}),
            State(NAME_TTL_NEXT, "bitmap", NOW, {**bitmap, **ttl}, before=BEFORE),
        ]
    else:
        skipped.append("(g) the TTL states: this version does not know BLOOMFILTER_TTL.")
    if peers.native:
        states += [
            State(NAME_NATIVE_FRESH, "native", 0.0, native),
            State(NAME_NATIVE_GROWN, "native", 3.0, native),
        ]
        if has_ttl:
            states += [
                State(NAME_NATIVE_TTL_FRESH, "native", 0.0, {**native, **ttl}),
                State(NAME_NATIVE_TTL_FULL, "native", 0.9, {**native, **ttl}),
                State(NAME_NATIVE_TTL_NEXT, "native", NOW, {**native, **ttl}, before=BEFORE),
            ]
    else:
        skipped.append(
            "(g) the native states: BLOOMFILTER_BACKEND = 'native' needs RedisBloom on the"
            " server and a version that knows the setting."
        )
    states.append(State(NAME_SADD, "sadd", 0.9))
    if peers.bloom:
        states.append(State(NAME_BF_ADD, "bf.add", 3.0))
    else:
        skipped.append(f"(g) '{NAME_BF_ADD}': the server has no BF.* commands (RedisBloom).")
    return states, skipped


# --- Fingerprints ----------------------------------------------------------------------


def chunk_of(stream: str, index: int) -> list[str]:
    """Return the ``index``-th block of ``CHUNK`` 40-hex fingerprints of a named stream.

    Random bytes from a generator seeded by the stream and block: deterministic, so every
    state and every run gets the same fingerprints, and cheap (a SHA1 per fingerprint
    would cost more than filling some states). Streams never meet (160 random bits).
    """
    data = random.Random(f"bench/states {stream} {index}").randbytes(20 * CHUNK).hex()
    return [data[i : i + 40] for i in range(0, len(data), 40)]


def fingerprints(stream: str, start: int, stop: int) -> list[str]:
    """Return fingerprints ``start`` to ``stop - 1`` of a named stream."""
    out: list[str] = []
    for index in range(start // CHUNK, (stop - 1) // CHUNK + 1 if stop > start else 0):
        base = index * CHUNK
        out += chunk_of(stream, index)[max(start - base, 0) : min(stop - base, CHUNK)]
    return out


# --- Contenders ------------------------------------------------------------------------


class Checker(Protocol):
    """One state's contender: its bulk fill, its single check, its round trips."""

    def fill(self, elements: Sequence[str]) -> None:
        """Add elements in bulk (the contender's bulk path)."""

    def check(self, element: str) -> bool:
        """Check and add one element, as a crawl does; True when it was (maybe) there."""

    def round_trips(self) -> int | None:
        """Round trips to Redis so far (None when this version does not count them)."""

    def stored(self) -> int:
        """How many elements the contender says its fill gave it (its own count)."""

    def close(self) -> None:
        """Drop the contender's connections."""


class Ours:
    """Ours: the filter built from settings as the package builds it, opened."""

    def __init__(self, url: str, key: str, settings: dict[str, Any]) -> None:
        from scrapy_redis_bloom import BloomConfig

        self.client = redis.Redis.from_url(url)
        config = BloomConfig.from_settings(settings)
        self.bloom = _make_filter(self.client, key, config)
        self.bloom.open()
        self.check: Callable[[str], bool] = self.bloom.check_and_add

    def fill(self, elements: Sequence[str]) -> None:
        """``add_many``: the public bulk path (numpy where installed)."""
        self.bloom.add_many(elements)

    def round_trips(self) -> int | None:
        """Return the filter's own count of round trips (the stat bloomfilter/round_trips)."""
        value = getattr(self.bloom, "round_trips", None)
        return value if isinstance(value, int) else None

    def stored(self) -> int:
        """Elements offered so far by the filter's counters: added plus found (public totals)."""
        totals = self.bloom.totals()
        return int(totals.added) + int(totals.seen)

    def describe(self) -> str:
        """Describe the filter as its record says it is built."""
        describe = getattr(getattr(self.bloom, "record", None), "describe", None)
        return str(describe()) if callable(describe) else repr(self.bloom)

    def close(self) -> None:
        """Close the filter (its counts reach Redis) and its client."""
        self.bloom.close()
        self.client.close()


def _make_filter(client: redis.Redis, key: str, config: Any) -> Any:
    """Build ours from a config as the dupefilter does (``make_filter`` where there is one).

    Without the near-cache (``cache_size`` 0): each fingerprint is checked once anyway,
    and every check then reaches Redis.
    """
    try:
        from scrapy_redis_bloom.engine.backend import make_filter  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        from scrapy_redis_bloom import RedisBloomFilter

        return RedisBloomFilter.from_config(client, key, config)
    return make_filter(client, key, config)


class SetPeer:
    """scrapy-redis's dupefilter as it checks: ``SADD key fp``, seen when it replies 0."""

    def __init__(self, url: str, key: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.key = key
        self.trips = 0

    def fill(self, elements: Sequence[str]) -> None:
        """Pipelined SADD, ``SADD_CHUNK`` fingerprints per command."""
        pipe = self.client.pipeline(transaction=False)
        for i in range(0, len(elements), SADD_CHUNK):
            pipe.sadd(self.key, *elements[i : i + SADD_CHUNK])
        pipe.execute()

    def check(self, element: str) -> bool:
        """One SADD: a round trip."""
        self.trips += 1
        return bool(self.client.sadd(self.key, element) == 0)

    def round_trips(self) -> int | None:
        """One per check."""
        return self.trips

    def stored(self) -> int:
        """SCARD: the set's members."""
        return int(self.client.scard(self.key))

    def close(self) -> None:
        """Close the client."""
        self.client.close()


class BloomPeer(SetPeer):
    """RedisBloom as a user runs it: ``BF.RESERVE`` once, then ``BF.ADD key fp``."""

    def __init__(self, url: str, key: str, capacity: int, error_rate: float) -> None:
        super().__init__(url, key)
        bf_reserve(self.client, key, capacity, error_rate, 2)

    def fill(self, elements: Sequence[str]) -> None:
        """BF.MADD, pipelined (:func:`peers.bf_madd`)."""
        bf_madd(self.client, self.key, elements)

    def check(self, element: str) -> bool:
        """One BF.ADD: replies 0 when the fingerprint was (maybe) there."""
        self.trips += 1
        client: Any = self.client  # redis-py leaves execute_command untyped
        return bool(client.execute_command("BF.ADD", self.key, element) == 0)

    def stored(self) -> int:
        """BF.CARD: the items RedisBloom added (a false positive is not added)."""
        client: Any = self.client
        return int(client.execute_command("BF.CARD", self.key))


def build_checker(bench: BenchRedis, state: State, key: str, capacity: int, rate: float) -> Any:
    """Return the contender of a state, empty, under ``key``."""
    if state.group == "sadd":
        return SetPeer(bench.url, key)
    if state.group == "bf.add":
        return BloomPeer(bench.url, key, capacity, rate)
    ours = Ours(bench.url, key, state.settings)
    backend = getattr(ours.bloom, "backend", "bitmap")
    if backend != state.group:
        ours.close()
        raise RuntimeError(f"(g) {state.name}: the package built a {backend} filter")
    return ours


# --- Building the states ---------------------------------------------------------------


@dataclass
class Built:
    """A state built on the server: its contender, fill and the seen fingerprints kept."""

    state: State
    checker: Any
    key: str
    items: int
    #: Indices (into the fill stream) of the fingerprints kept as "seen", sorted, and
    #: where each goes in :attr:`seen` (a shuffled order, so each round's slice is uniform).
    picks: list[int]
    slots: dict[int, int]
    seen: list[str]
    fill_seconds: float = 0.0
    #: What the contender counted after its fill (:meth:`Checker.stored`).
    stored: int = 0
    #: The TTL window (Redis TIME // TTL) when the fill started, for windowed states.
    window: int | None = None
    description: str = ""

    def take(self, start: int, elements: Sequence[str]) -> None:
        """Keep the picked fingerprints among the fill's items ``start`` onwards."""
        lo = bisect.bisect_left(self.picks, start)
        hi = bisect.bisect_left(self.picks, start + len(elements))
        for pick in self.picks[lo:hi]:
            self.seen[self.slots[pick]] = elements[pick - start]


def server_time(bench: BenchRedis) -> float:
    """Return Redis's clock (TIME), in seconds: the package cuts windows by it."""
    seconds, micros = bench.redis().time()
    return int(seconds) + int(micros) / 1e6


def _window(bench: BenchRedis, ttl: int = TTL) -> int:
    """Return the re-crawl window Redis is in: floor(TIME / TTL), as the package cuts time."""
    return int(server_time(bench)) // ttl


def clear_of_boundary(bench: BenchRedis, capacity: int, checks: int) -> None:
    """Wait for the next :data:`TTL` boundary when the states' build and checks may reach it.

    A boundary between a windowed state's fill and its checks gives it a window before:
    measured, it is another state than the one named (a warning says so, late). The run
    is taken to last at most twice a generous estimate of it (fills at ~40,000 fp/s).
    """
    estimate = 90 + capacity / 25_000 + checks / 1_000  # 1M: 145 s, 10M: 470 s measured
    left = TTL - server_time(bench) % TTL
    if left < 2 * estimate:
        logger.info(
            "(g) a window boundary (TTL %d s) in %.0f s: waiting for it, so that no state"
            " built before it is measured after it",
            TTL,
            left,
        )
        time.sleep(left + 1)


def boundary_ttl(now: float, lead: float, span: float) -> int:
    """Return a TTL in :data:`TTL_RANGE` whose next window starts in ``lead`` to ``lead + span`` s.

    ``now``: Redis's clock. Windows are ``floor(TIME / TTL)``, so a TTL's next boundary
    is ``TTL - now mod TTL`` away: over a range of TTLs it falls anywhere, and some TTL
    puts it where the fill of the window before ends. Raises ``RuntimeError`` if none does.
    """
    for ttl in range(*TTL_RANGE):
        if lead <= ttl - now % ttl <= lead + span:
            return ttl
    raise RuntimeError(
        f"(g) no TTL in {TTL_RANGE} starts a window in {lead:.0f}-{lead + span:.0f} s"
    )


def _built(
    bench: BenchRedis,
    number: int,
    state: State,
    capacity: int,
    error_rate: float,
    seen_needed: int,
    rng: random.Random,
    suffix: str = "",
) -> Built:
    """Build one state's contender, empty, and choose the fingerprints it keeps as seen."""
    items = max(round((state.multiple + state.before) * capacity), seen_needed)
    picks = rng.sample(range(items), min(seen_needed, items))
    order = list(range(len(picks)))
    rng.shuffle(order)
    key = f"bench:states:{number}{suffix}"
    ttl = state.settings.get("BLOOMFILTER_TTL")
    return Built(
        state,
        build_checker(bench, state, key, capacity, error_rate),
        key,
        items,
        sorted(picks),
        dict(zip(picks, order, strict=True)),
        [""] * len(picks),
        window=_window(bench, ttl) if ttl else None,
    )  # fmt: skip


def _fill(built: Sequence[Built], start: int, stops: Sequence[int]) -> None:
    """Fill each state with the fill stream's items ``start`` to its stop, block by block.

    A block is generated once and given to every state that needs it; each contender's
    time in its bulk path is kept (its fill rate).
    """
    most = max(stops, default=0)
    started = time.monotonic()
    for index in range(start // CHUNK, math.ceil(most / CHUNK)):
        block, base = chunk_of("fill", index), index * CHUNK
        lo = max(start - base, 0)
        for b, stop in zip(built, stops, strict=True):
            part = block[lo : max(min(stop - base, CHUNK), lo)]
            if not part:
                continue
            began = time.perf_counter()
            b.checker.fill(part)
            b.fill_seconds += time.perf_counter() - began
            b.take(base + lo, part)
        if index % 20 == 19:
            logger.info(
                "  filled %s of %s fingerprints (%.0f s)",
                f"{(index + 1) * CHUNK:,}",
                f"{most:,}",
                time.monotonic() - started,
            )


def build_states(
    bench: BenchRedis,
    states: Sequence[State],
    capacity: int,
    error_rate: float,
    seen_needed: int,
) -> list[Built]:
    """Build every state on the (flushed) server and fill it.

    Each fill takes the first ``items`` fingerprints of one stream, ``items`` the state's
    multiple of the capacity, or ``seen_needed`` if more (a fresh state still needs
    fingerprints to check as seen). The next-window states come last
    (:func:`_build_next_windows`).
    """
    rng = random.Random(f"bench/states picks {capacity}")
    plain = [s for s in states if not s.before]
    built = [
        _built(bench, number, state, capacity, error_rate, seen_needed, rng)
        for number, state in enumerate(plain)
    ]
    _fill(built, 0, [b.items for b in built])
    nexts = [s for s in states if s.before]
    if nexts:
        rates = {
            b.state.group: b.items / b.fill_seconds
            for b in built
            if b.state.windowed and b.fill_seconds
        }
        built += _build_next_windows(
            bench, nexts, len(plain), capacity, error_rate, seen_needed, rng, rates
        )
    for b in built:
        b.stored = b.checker.stored()
        if isinstance(b.checker, Ours):
            b.description = b.checker.describe()
        logger.info(
            "  %-42s %12s items in %6.1f s (%s fp/s)",
            b.state.name,
            f"{b.items:,}",
            b.fill_seconds,
            f"{b.items / b.fill_seconds:,.0f}" if b.fill_seconds else "n/a",
        )
    return built


def _build_next_windows(
    bench: BenchRedis,
    states: Sequence[State],
    first_number: int,
    capacity: int,
    error_rate: float,
    seen_needed: int,
    rng: random.Random,
    rates: dict[str, float],
) -> list[Built]:
    """Build the next-window states: fill a window to 0.9x, then the next one to 0.45x.

    Their TTL is chosen (:func:`boundary_ttl`) so that a window boundary falls just after
    the window before's fill, estimated from this run's windowed fills (``rates``, fp/s
    by group); the build waits for it, then fills the current window. A fill that the
    boundary overtakes is built again under other keys with a longer lead.
    """
    befores = [round(s.before * capacity) for s in states]
    estimate = sum(n / rates.get(s.group, 50_000) for s, n in zip(states, befores, strict=True))
    for attempt in range(3):
        lead = estimate * (1.5 + attempt) + 5
        ttl = boundary_ttl(server_time(bench), lead, 10)
        chosen = [replace(s, settings={**s.settings, "BLOOMFILTER_TTL": ttl}) for s in states]
        built = [
            _built(bench, first_number + i, state, capacity, error_rate, seen_needed, rng,
                   f"a{attempt}")
            for i, state in enumerate(chosen)
        ]  # fmt: skip
        window = _window(bench, ttl)
        logger.info(
            "  next-window states: TTL %d s, the window before (%d) ends in %.0f s",
            ttl, window, (window + 1) * ttl - server_time(bench),
        )  # fmt: skip
        _fill(built, 0, befores)
        if _window(bench, ttl) != window:
            logger.warning("  the window ended during the fill of the one before: again")
            for b in built:
                b.checker.close()
            continue
        while (wait := (window + 1) * ttl + 1 - server_time(bench)) > 0:
            time.sleep(min(wait, 1.0))
        _fill(built, min(befores), [b.items for b in built])
        for b in built:
            b.window = window + 1
        return built
    raise RuntimeError("(g) the next-window states' fills overran their window three times")


# --- Measuring -------------------------------------------------------------------------


@dataclass
class StateResults:
    """What (g) found, per size label.

    ``cells[label]``: {metric: {contender: Samples}}, metric "usec", "commands" or
    "round_trips", contender ``'<state>: new'`` or ``'<state>: seen'``.
    """

    cells: dict[str, dict[str, dict[str, Samples]]] = field(default_factory=dict)
    #: Per size label: the states as built (name, group, fill, settings, fill rate).
    info: dict[str, Any] = field(default_factory=dict)
    #: Correctness checks that failed (a seen fingerprint answered new).
    failed: list[str] = field(default_factory=list)
    #: Warnings for the report (a TTL window changed during the run, ...).
    warnings: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def time_checks(clock: CommandClock, checker: Any, elements: Sequence[str]) -> dict[str, Any]:
    """Check ``elements`` one call each; return Redis's time, commands and round trips."""
    check = checker.check
    gc.collect()
    trips_before = checker.round_trips()
    clock.reset()
    seen = sum(map(check, elements))
    spent = clock.read()
    trips_after = checker.round_trips()
    checks = len(elements)
    trips = None
    if trips_before is not None and trips_after is not None:
        trips = (trips_after - trips_before) / checks
    return {
        "usec_per_check": per_call(spent.usec(spent.commands), checks),
        "commands_per_check": len(spent.commands) / checks,
        "round_trips_per_check": trips,
        "answered_seen": seen,
        "commands": spent.by_name(spent.commands),
        "usec_by_command": spent.usec_by_name(spent.commands),
        "overflowed": spent.overflowed,
    }


def measure_states(
    bench: BenchRedis,
    peers: Peers,
    capacities: Sequence[int],
    error_rate: float,
    checks: int,
    warmup: int,
    rounds: int,
    clear: bool = True,
) -> StateResults:
    """Measure (g) at each capacity: build the states, warm them up, interleave the checks.

    Per size: every state built and filled (:func:`build_states`), ``warmup`` other new
    fingerprints checked on each, outside the count (scripts loaded, shards and windows
    started, and the pages of a generation or layer the fill just began faulted in: a
    filter filled to exactly 3x has just grown, RedisBloom's too, and its new layer is
    calloc'd, so its first adds each pay page faults, a cost a crawl pays once per
    growth), then ``rounds`` rounds of ``checks`` new and ``checks`` seen fingerprints
    per state, states and kinds in a rotated order. ``clear``: first wait out a window
    boundary the run may reach (:func:`clear_of_boundary`).
    """
    import scrapy_redis_bloom

    results = StateResults()
    for capacity in capacities:
        label = label_of(capacity, error_rate)
        states, skipped = states_for(peers, capacity, error_rate)
        for why in skipped:
            if why not in results.skipped:
                results.skipped.append(why)
        logger.info("(g) %s: building %d states", label, len(states))
        if clear:
            clear_of_boundary(bench, capacity, rounds * checks)
        bench.flush()
        built = build_states(bench, states, capacity, error_rate, rounds * checks)
        results.failed += [
            f"(g) {label}, {b.state.name}: its fill of {b.items:,} left it counting {b.stored:,}"
            for b in built
            if not b.items * (1 - FILL_TOLERANCE) <= b.stored <= b.items
        ]
        try:
            _measure_size(bench, results, label, built, checks, warmup, rounds)
        finally:
            for b in built:
                b.checker.close()
            bench.flush()
        results.info[label] = {
            "capacity": capacity,
            "error_rate": error_rate,
            "checks": checks,
            "warmup": warmup,
            "rounds": rounds,
            "ttl": TTL,
            # Which checkout was measured (PYTHONPATH may point at another worktree).
            "package": str(Path(scrapy_redis_bloom.__file__).parent),
            "states": [
                {
                    "name": b.state.name,
                    "group": b.state.group,
                    "multiple": b.state.multiple,
                    "items": b.items,
                    "fill": b.items / capacity,
                    "settings": b.state.settings,
                    "stored": b.stored,
                    "fill_seconds": b.fill_seconds,
                    "fill_fp_per_s": b.items / b.fill_seconds if b.fill_seconds else None,
                    "filter": b.description,
                }
                for b in built
            ],
        }
    return results


def _measure_size(
    bench: BenchRedis,
    results: StateResults,
    label: str,
    built: Sequence[Built],
    checks: int,
    warmup: int,
    rounds: int,
) -> None:
    """Warm every state up, then interleave its new and seen checks over the rounds."""
    warm = fingerprints("warm", 0, warmup)
    for b in built:
        for element in warm:
            b.checker.check(element)
    by_name = {contender(b.state.name, kind): (b, kind) for b in built for kind in KINDS}
    cell: dict[str, dict[str, Samples]] = {"usec": {}, "commands": {}, "round_trips": {}}
    results.cells[label] = cell
    news = [fingerprints("new", r * checks, (r + 1) * checks) for r in range(rounds)]

    def run_one(name: str, round_index: int) -> None:
        b, kind = by_name[name]
        if kind == "new":
            elements = news[round_index]
        else:
            elements = b.seen[round_index * checks : (round_index + 1) * checks]
        got = time_checks(clock, b.checker, elements)
        trips = got["round_trips_per_check"]
        logger.info(
            "  %-52s %7.2f usec/check, %.3f commands/check%s",
            name,
            got["usec_per_check"],
            got["commands_per_check"],
            "" if trips is None else f", {trips:.3f} round trips/check",
        )
        _keep(cell, name, b, kind, got, len(elements))
        if kind == "seen" and got["answered_seen"] != len(elements):
            results.failed.append(
                f"(g) {label}, {b.state.name}: {len(elements) - got['answered_seen']} of"
                f" {len(elements)} fingerprints added earlier answered new"
            )
        if b.window is not None and _window(bench, b.state.settings["BLOOMFILTER_TTL"]) != b.window:
            why = (
                f"(g) {label}, {b.state.name}: the TTL window changed between its fill and"
                f" round {round_index + 1} (an hour boundary passed): from then on it is a"
                " filter with a previous window, not the state named"
            )
            if why not in results.warnings:
                logger.warning("%s", why)
                results.warnings.append(why)
            cell["usec"][name].extra.setdefault("window_changed", []).append(round_index)
        if got["overflowed"]:
            results.failed.append(
                f"(g) {label}, {name}: the slow log filled up, its Redis time is undercounted"
            )

    with CommandClock(bench.redis()) as clock:
        interleave(list(by_name), rounds, run_one, f"(g) {label} by state")
    for samples in cell["usec"].values():
        mix = samples.extra["commands"][-1]
        total = sum(mix.values()) or 1
        samples.note = ", ".join(f"{cmd} {n / total:.0%}" for cmd, n in sorted(mix.items()))


def _keep(
    cell: dict[str, dict[str, Samples]],
    name: str,
    b: Built,
    kind: str,
    got: dict[str, Any],
    checks: int,
) -> None:
    """Add one round's figures to the cell's samples."""
    usec = cell["usec"].setdefault(name, Samples(name, "usec", sample_size=checks))
    usec.values.append(got["usec_per_check"])
    usec.extra.update(state=b.state.name, kind=kind, group=b.state.group, fill=b.items)
    for key in ("answered_seen", "commands", "usec_by_command", "overflowed"):
        usec.extra.setdefault(key, []).append(got[key])
    commands = cell["commands"].setdefault(name, Samples(name, "commands", sample_size=checks))
    commands.values.append(got["commands_per_check"])
    if got["round_trips_per_check"] is not None:
        trips = cell["round_trips"].setdefault(name, Samples(name, "trips", sample_size=checks))
        trips.values.append(got["round_trips_per_check"])


# --- Ratios, targets, the report -------------------------------------------------------


def median_of(samples: dict[str, Samples], state: str, kind: str) -> float:
    """Return the median of one state and kind (NaN when it was not measured)."""
    found = samples.get(contender(state, kind))
    return found.median if found is not None else float("nan")


def ratios(cell: dict[str, dict[str, Samples]], state: str, kind: str) -> dict[str, float]:
    """One state's time per check over the fresh bitmap's, BF.ADD at 3x's and SADD's (same kind)."""
    usec = cell["usec"]
    value = median_of(usec, state, kind)
    return {
        "fresh": ratio(value, median_of(usec, NAME_FRESH, kind)),
        "bf_add": ratio(value, median_of(usec, NAME_BF_ADD, kind)),
        "sadd": ratio(value, median_of(usec, NAME_SADD, kind)),
        "native_fresh": ratio(value, median_of(usec, NAME_NATIVE_FRESH, kind)),
    }


def state_targets(label: str, cell: dict[str, dict[str, Samples]]) -> list[Target]:
    """Issue 32's targets at one size, from the figures of the same run.

    Bitmap just past capacity and at 3x: at most 2.5x the fresh bitmap check and 3x
    BF.ADD at 3x; bitmap TTL at most 2x the fresh bitmap; native TTL at most 2.5x native
    fresh (new and seen each); a seen fingerprint in 1 round trip in every state of ours,
    a new one in at most 2 (the most of any state, rounded to 2 decimals as (t) does:
    a counter sync now and then is not a round trip per check).
    """
    out = []
    for state in (NAME_PAST, NAME_GROWN):
        for kind in KINDS:
            r = ratios(cell, state, kind)
            out += [
                Target("g", f"{label}: {state}, {kind}: <= 2.5x fresh bitmap", r["fresh"],
                       2.5, False),
                Target("g", f"{label}: {state}, {kind}: <= 3x BF.ADD at 3x", r["bf_add"],
                       3.0, False),
            ]  # fmt: skip
    for state in (NAME_TTL_FRESH, NAME_TTL_FULL, NAME_TTL_NEXT):
        for kind in KINDS:
            value = ratios(cell, state, kind)["fresh"]
            out.append(Target("g", f"{label}: {state}, {kind}: <= 2x fresh bitmap", value, 2.0,
                              False))  # fmt: skip
    for state in (NAME_NATIVE_TTL_FRESH, NAME_NATIVE_TTL_FULL, NAME_NATIVE_TTL_NEXT):
        for kind in KINDS:
            value = ratios(cell, state, kind)["native_fresh"]
            out.append(Target("g", f"{label}: {state}, {kind}: <= 2.5x native fresh", value,
                              2.5, False))  # fmt: skip
    for kind, most in (("seen", 1.0), ("new", 2.0)):
        per_state = {
            str(usec.extra["state"]): round(samples.median, 2)
            for name, samples in cell["round_trips"].items()
            for usec in [cell["usec"][name]]
            if usec.extra.get("kind") == kind and usec.extra.get("group") in ("bitmap", "native")
        }
        worst = max(per_state, key=per_state.__getitem__) if per_state else ""
        text = f"{label}: ours, {kind}: at most {most:g} round trip(s) per check in every state"
        out.append(
            Target("g", text + (f" (most: {worst})" if worst else ""),
                   per_state.get(worst, float("nan")), most, False, unit="trips")
        )  # fmt: skip
    return out


def _fmt(value: float, digits: int = 2, suffix: str = "") -> str:
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}{suffix}"


def states_markdown(label: str, results: StateResults, targets: Sequence[Target]) -> str:
    """Render (g)'s table at one size: per state, new and seen, with ratios and targets."""
    cell, info = results.cells[label], results.info[label]
    body = []
    for state in info["states"]:
        name = state["name"]
        cells: list[str] = [name, f"{state['fill']:.2f}x"]
        for kind in KINDS:
            r = ratios(cell, name, kind)
            cells += [
                _fmt(median_of(cell["usec"], name, kind)),
                _fmt(r["fresh"], suffix="x"),
                _fmt(r["bf_add"], suffix="x"),
                _fmt(r["sadd"], suffix="x"),
            ]
        for kind in KINDS:
            cells.append(
                f"{_fmt(median_of(cell['commands'], name, kind), 2)}"
                f" / {_fmt(median_of(cell['round_trips'], name, kind), 2)}"
            )
        usec = cell["usec"].get(contender(name, "new"))
        cells.append(usec.note if usec is not None else "")
        body.append(cells)
    header = (
        "state",
        "fill",
        "new usec",
        "x fresh bitmap",
        "x BF.ADD 3x",
        "x SADD",
        "seen usec",
        "x fresh bitmap",
        "x BF.ADD 3x",
        "x SADD",
        "new: commands / round trips",
        "seen: commands / round trips",
        "commands of a new check",
    )
    verdicts = [
        (t.text.removeprefix(f"{label}: "), t.measured(), t.wanted(),
         {"PASS": "met", "MISS": "not met"}.get(t.verdict, t.verdict))
        for t in targets
    ]  # fmt: skip
    warnings = [w for w in results.warnings if f" {label}, " in w]
    return "\n".join(
        [
            f"Redis command time per check (usec, top-level commands, slow log at threshold 0)"
            f" of filters of {label} in each state, medians of {info['rounds']} round(s) of"
            f" {info['checks']:,} checks per state and kind, one call per check (ours:"
            " check_and_add on precomputed fingerprints). 'new': never added; 'seen': added"
            " by the fill. Ratios compare with the same kind in the same run. 'fill': items"
            " the fill added, over the capacity (the rounds' new checks add more).",
            "",
            md_table(header, body),
            "",
            "Issue 32's targets:",
            "",
            md_table(("target", "measured", "wanted", "result"), verdicts),
            *(["", *(f"Warning: {w}." for w in warnings)] if warnings else []),
        ]
    )


def states_note(results: StateResults) -> str:
    """How (g) was measured, for results.md's notes."""
    fills = "; ".join(
        f"{label}: "
        + ", ".join(
            f"{s['name']} {s['items']:,} in {s['fill_seconds']:.1f} s" for s in info["states"]
        )
        for label, info in results.info.items()
    )
    return (
        "(g) Redis time per check by state (issue 32). At each size every state is built"
        " once, under its own key on the one server, and filled with its bulk path: ours'"
        " add_many (the filter built from BLOOMFILTER_* settings as the dupefilter builds"
        " it, near-cache off so every check reaches Redis; bitmap states set"
        " BLOOMFILTER_BACKEND = 'bitmap'), RedisBloom BF.MADD after BF.RESERVE key p N"
        " (EXPANSION 2, its default), pipelined SADD for scrapy-redis's set. The fills"
        " take one stream of random 40-hex fingerprints; a fresh state gets the fingerprints"
        " its seen checks need. Then each state checks warm-up fingerprints (outside the"
        " count: scripts loaded, shards and windows started, and the pages of a layer or"
        " generation the fill just started faulted in: at exactly 3x both ours and"
        " RedisBloom's scaling filter have just grown, and a new layer's first adds pay"
        " page faults a crawl pays once per growth) and, per round, new"
        " fingerprints (never added: the same for every state) and seen ones (drawn"
        " uniformly from its fill, every generation alike; no fingerprint checked twice),"
        " one call per check: ours' check_and_add, SADD key fp, BF.ADD key fp. States and"
        " kinds are interleaved, the order rotated each round. Redis time: the slow log at"
        " threshold 0, top-level commands only (as (t)); commands per check likewise; round"
        " trips per check: ours' filter's round_trips (the stat bloomfilter/round_trips),"
        " a peer's one per command. Ratios are of medians, new to new and seen to seen."
        f" TTL states use BLOOMFILTER_TTL = {TTL}: windows are cut by Redis's clock, so an"
        " hour boundary during the run turns a state into one with a previous window (a"
        " warning says so). The next-window states are a re-crawl past its first window:"
        f" the window before filled to {BEFORE}x, then, after a window boundary, the"
        f" current one to {NOW}x (their TTL, between {TTL_RANGE[0]} and {TTL_RANGE[1]} s,"
        " chosen by the run so that the boundary falls just after the first fill; their"
        " seen fingerprints come from both windows alike). Fills (the bulk path's time, so"
        " also its rate): " + fills + "."
    )


__all__ = [
    "KINDS",
    "NAME_BF_ADD",
    "NAME_FIXED",
    "NAME_FRESH",
    "NAME_FULL",
    "NAME_GROWN",
    "NAME_NATIVE_FRESH",
    "NAME_NATIVE_GROWN",
    "NAME_NATIVE_TTL_FRESH",
    "NAME_NATIVE_TTL_FULL",
    "NAME_NATIVE_TTL_NEXT",
    "NAME_PAST",
    "NAME_SADD",
    "NAME_TTL_FRESH",
    "NAME_TTL_FULL",
    "NAME_TTL_NEXT",
    "TTL",
    "State",
    "StateResults",
    "contender",
    "label_of",
    "measure_states",
    "ratios",
    "state_targets",
    "states_markdown",
    "states_note",
]

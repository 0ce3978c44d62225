"""The least Redis time a grown or windowed check can take: ``python bench/checkfloor.py``.

Measure (g) times the hot path in every state a crawl reaches. Two of its targets sit
close to what any design on stock Redis commands pays, and this measures that floor for
a new element (the costly kind: it is read everywhere, then added):

- a bitmap shard of G generations (grown) must read the element's bits in each of them
  and add it to the newest, atomically (so that of workers racing on it, one is told
  "new"), and a seen element is answered in one round trip, so the newest is read too:
  at least G ``GETRANGE`` of the element's block, then one ``BITFIELD`` that reads the
  shard's id and sets the k bits; or only those the read found unset (the hot path's
  add): about half of them once the newest generation nears its capacity, whose bits
  are then half set ("dense"). A script could do it in one call, reading only the G - 1
  older generations;
- a native filter in its second re-crawl window must look in the window before and in
  the current one, then add to the current one (``BF.INSERT`` into the current window of
  an element found in the one before would renew it: it would never be forgotten while
  it is linked): two ``BF.EXISTS``, then a ``BF.INSERT``; or one script doing the three.

Beside them, in the same run and rotated round by round: ``BF.ADD`` on a RedisBloom
scaling filter filled to 3x (the peer of the grown state), ``BF.INSERT`` on a fresh native
window and the fresh bitmap check's one ``BITFIELD`` (the references the targets are
ratios of). Redis time per check is ``INFO commandstats``' (a script's ``EVALSHA`` with
what it runs), elements sent as the hot path sends them (one check at a
time, its reads pipelined). Results go to ``bench/checkfloor.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import logging
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from harness import BenchRedis, floor_start, machine, rotated  # noqa: E402

from scrapy_redis_bloom.core.generations import GENERATIONS_BIT  # noqa: E402
from scrapy_redis_bloom.core.hashing import offsets  # noqa: E402
from scrapy_redis_bloom.core.layout import HEADER_BITS  # noqa: E402
from scrapy_redis_bloom.core.settings import BloomConfig  # noqa: E402
from scrapy_redis_bloom.engine.bitmap.fastpath import ID_FIELD  # noqa: E402

logger = logging.getLogger("bench.checkfloor")

#: Fingerprints per BF.MADD command while filling.
MADD_CHUNK = 2_000

#: The least script a grown check takes: every older generation's block read (ARGV:
#: its first byte, then k and the element's bits in it), then the add on the newest
#: (ARGV: the rest, the hot path's add fields as they are). 1: seen.
GROWN_SCRIPT = """
local a = 1
for i = 1, #KEYS - 1 do
  local first, k = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local block = redis.call('GETRANGE', KEYS[i], first, first + 63)
  local all = true
  for j = a + 2, a + 1 + k do
    local b = tonumber(ARGV[j])
    local byte = string.byte(block, math.floor(b / 8) + 1) or 0
    if bit.band(byte, bit.rshift(128, b % 8)) == 0 then all = false break end
  end
  if all then return 1 end
  a = a + 2 + k
end
local old = redis.call('BITFIELD', KEYS[#KEYS], unpack(ARGV, a))
for j = 3, #old do if old[j] == 0 then return 0 end end
return 1
"""

#: The least script a check in a native filter's second window takes. 1: seen.
WINDOW_SCRIPT = """
if redis.call('BF.EXISTS', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('BF.EXISTS', KEYS[2], ARGV[1]) == 1 then return 1 end
return 1 - redis.call('BF.INSERT', KEYS[2], 'NOCREATE', 'ITEMS', ARGV[1])[1]
"""

BF_ADD = "BF.ADD, RedisBloom scaling filter at 3x"
BITMAP_FRESH = "bitmap, fresh: one BITFIELD"
NATIVE_FRESH = "native, fresh window: one BF.INSERT"
NATIVE_STOCK = "native, next window: 2 BF.EXISTS, then BF.INSERT"
NATIVE_SCRIPT = "native, next window: one script"


def _grown(g: int, dense: bool = False) -> str:
    if dense:
        return f"bitmap, {g} generations, the newest dense: {g} GETRANGE, then BITFIELD"
    return f"bitmap, {g} generations: {g} GETRANGE, then BITFIELD"


def _one_key(reads: str) -> str:
    return f"bitmap, 3 generations in one key: {reads}, then BITFIELD"


#: The ways of a shard keeping every generation in one key (the layout that would let
#: one command read them all): per generation a GETRANGE, or one BITFIELD_RO of every bit.
ONE_KEY_WAYS = ("3 GETRANGE", "one BITFIELD_RO of every generation's bits")


def _grown_script(g: int) -> str:
    return f"bitmap, {g} generations: one script"


def main() -> int:
    """Measure each way's Redis time per new element's check; print and write the table."""
    per_round = ("--checks", 5_000, "checks per way and round")
    started = floor_start(__doc__, 1_000_000, per_round, 5, HERE / "checkfloor.md")
    if started is None:
        return 2
    args, found, config = started
    growth, spec = config.growth, config.spec
    gens = growth.generations[:3]
    rng = random.Random(29)
    with BenchRedis(found) as bench:
        admin, client = bench.redis(), redis.Redis.from_url(bench.url)
        _fill(client, args, rng)
        keys = [[f"floor:{shard}:g{g}" for g in range(3)] for shard in range(spec.shards)]
        for shard_keys in keys:  # every page touched, as a used filter's
            for key, gen in zip(shard_keys, gens, strict=True):
                client.setrange(key, (HEADER_BITS + gen.bits) // 8, b"\0")
        # The one-key layout: the header, then each generation's bits after the last's.
        base = [sum(gen.bits for gen in gens[:g]) for g in range(3)]
        for shard in range(spec.shards):
            end = (HEADER_BITS + base[2] + gens[2].bits) // 8
            client.setrange(f"floor:{shard}:one", end, b"\0")
        grown_sha = client.script_load(GROWN_SCRIPT)
        window_sha = client.script_load(WINDOW_SCRIPT)

        def element() -> tuple[list[str], list[tuple[int, list[int]]]]:
            """Return a random element's keys and, per generation, its block's first byte, bits."""
            shard = rng.randrange(spec.shards)
            places = []
            for gen in gens:
                x, y = rng.getrandbits(64) % gen.bits, rng.getrandbits(64) % gen.seed_range
                bits = offsets(x, y, gen.hash_count, gen.bits, gen.block_bits, HEADER_BITS)
                first = HEADER_BITS + (bits[0] - HEADER_BITS) // 512 * 512
                places.append((first // 8, bits))
            return keys[shard], places

        def grown(g: int, dense: bool = False) -> None:
            names, places = element()
            if dense:  # the add sets the half of the bits its read found unset
                first, bits = places[g - 1]
                places[g - 1] = (first, bits[: len(bits) // 2])
            pipe = client.pipeline(transaction=False)
            for name, (first, _) in zip(names[:g], places[:g], strict=True):
                pipe.getrange(name, first, first + 63)
            pipe.execute()
            client.execute_command("BITFIELD", names[g - 1], *_add_fields(places[g - 1][1]))

        def one_key(reads: str) -> None:
            names, places = element()
            name = names[0].rsplit(":", 1)[0] + ":one"
            moved = [[b + base[g] for b in bits] for g, (_, bits) in enumerate(places)]
            if reads == ONE_KEY_WAYS[0]:
                pipe = client.pipeline(transaction=False)
                for bits in moved:
                    first = (HEADER_BITS + (bits[0] - HEADER_BITS) // 512 * 512) // 8
                    pipe.getrange(name, first, first + 63)
                pipe.execute()
            else:
                fields: list[Any] = []
                for bits in moved:
                    for b in bits:
                        fields += ["GET", "u1", b]
                client.execute_command("BITFIELD_RO", name, *fields)
            client.execute_command("BITFIELD", name, *_add_fields(moved[2]))

        def grown_script(g: int) -> None:
            names, places = element()
            argv: list[Any] = []
            for first, bits in places[: g - 1]:
                block = first * 8
                argv += [first, len(bits), *(b - block for b in bits)]
            argv += _add_fields(places[g - 1][1])
            client.evalsha(grown_sha, g, *names[:g], *argv)

        def fresh() -> None:
            names, places = element()
            client.execute_command("BITFIELD", names[0], *_add_fields(places[0][1]))

        def native_stock() -> None:
            item = rng.randbytes(20).hex()
            pipe = client.pipeline(transaction=False)
            pipe.execute_command("BF.EXISTS", "floor:w0", item)
            pipe.execute_command("BF.EXISTS", "floor:w1", item)
            pipe.execute()
            client.execute_command("BF.INSERT", "floor:w1", "NOCREATE", "ITEMS", item)

        ways: dict[str, Callable[[], object]] = {
            BF_ADD: lambda: client.execute_command("BF.ADD", "floor:bf", rng.randbytes(20).hex()),
            BITMAP_FRESH: fresh,
            NATIVE_FRESH: lambda: client.execute_command(
                "BF.INSERT", "floor:w1", "NOCREATE", "ITEMS", rng.randbytes(20).hex()
            ),
            NATIVE_STOCK: native_stock,
            NATIVE_SCRIPT: lambda: client.evalsha(
                window_sha, 2, "floor:w0", "floor:w1", rng.randbytes(20).hex()
            ),
        }
        for g in (2, 3):
            ways[_grown(g)] = functools.partial(grown, g)
            ways[_grown(g, dense=True)] = functools.partial(grown, g, True)
            ways[_grown_script(g)] = functools.partial(grown_script, g)
        for reads in ONE_KEY_WAYS:
            ways[_one_key(reads)] = functools.partial(one_key, reads)
        usec: dict[str, list[float]] = {name: [] for name in ways}
        commands: dict[str, float] = {}
        for round_index in range(args.rounds + 1):  # round 0 warms up
            for name in rotated(list(ways), round_index):
                admin.config_resetstat()
                for _ in range(args.checks):
                    ways[name]()
                spent, calls = _redis_time(admin)
                if round_index:
                    usec[name].append(spent / args.checks)
                    commands[name] = calls / args.checks
            logger.info("round %d of %d done", round_index, args.rounds)
        client.close()
        info = bench.describe()
    text = _report(args, config, usec, commands, info)
    sys.stdout.write(text)
    args.out.write_text(text, encoding="utf-8")
    logger.info("Wrote %s", args.out)
    return 0


def _fill(client: Any, args: argparse.Namespace, rng: random.Random) -> None:
    """Fill RedisBloom's filters: the scaling one to 3x, two windows to 0.9x and 0.45x."""
    capacity, rate = args.capacity, args.error_rate
    client.execute_command("BF.RESERVE", "floor:bf", repr(rate), capacity, "EXPANSION", 2)
    for key in ("floor:w0", "floor:w1"):  # a window is made for half the rate
        client.execute_command("BF.RESERVE", key, repr(rate / 2), capacity, "EXPANSION", 2)
    for key, items in (("floor:bf", 3 * capacity), ("floor:w0", 9 * capacity // 10)):
        _madd(client, key, items, rng)
    _madd(client, "floor:w1", 45 * capacity // 100, rng)


def _madd(client: Any, key: str, items: int, rng: random.Random) -> None:
    pipe = client.pipeline(transaction=False)
    for first in range(0, items, MADD_CHUNK):
        chunk = [rng.randbytes(20).hex() for _ in range(min(MADD_CHUNK, items - first))]
        pipe.execute_command("BF.MADD", key, *chunk)
        if len(pipe) >= 10:
            pipe.execute()
    pipe.execute()


def _redis_time(admin: Any) -> tuple[int, int]:
    """Return Redis's time (µs) and calls of the top-level commands since the last reset.

    From ``INFO commandstats``: a script's ``EVALSHA`` with what it ran (the commands it
    ran are counted apart there too, so a way that scripts is its ``EVALSHA`` alone).
    The slow log is off: logging every command a script runs would be timed inside it.
    """
    stats = {
        name.removeprefix("cmdstat_"): (int(v["usec"]), int(v["calls"]))
        for name, v in admin.info("commandstats").items()
    }
    if "evalsha" in stats:
        return stats["evalsha"]
    ours = [v for name, v in stats.items() if name not in _ADMIN]
    return sum(u for u, _ in ours), sum(c for _, c in ours)


_ADMIN = frozenset({"config|resetstat", "info"})


def _add_fields(bits: list[int]) -> list[Any]:
    """Return the hot path's add fields: the shard's id, its state, the k bits set."""
    fields: list[Any] = ["GET", "i64", ID_FIELD, "GET", "u16", GENERATIONS_BIT]
    for b in bits:
        fields += ["SET", "u1", b, 1]
    return fields


def _report(
    args: argparse.Namespace,
    config: BloomConfig,
    usec: dict[str, list[float]],
    commands: dict[str, float],
    info: dict[str, Any],
) -> str:
    """Return the results as Markdown: a way per row, its time and its ratios."""
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    median = {name: statistics.median(values) for name, values in usec.items()}
    gens = config.growth.generations[:3]
    lines = [
        "# The least a check of a grown or windowed filter costs Redis (bench/checkfloor.py)",
        "",
        f"Run of {date}: `python bench/checkfloor.py` (`--capacity {args.capacity:,}`,"
        f" `--checks {args.checks:,}`, `--rounds {args.rounds}`), redis-server"
        f" {info['version']} with {', '.join(info['modules']) or 'no modules'}, on"
        f" {machine()['cpu_model']}. A filter of {args.capacity:,} @ {args.error_rate:g}:"
        f" {config.spec.shards} blocked shards, generations of k = "
        f"{', '.join(str(g.hash_count) for g in gens)}. New elements only; Redis time per"
        " check from INFO commandstats (a script's EVALSHA with what it runs), median"
        " of the rounds after a warming one, ways rotated round by round.",
        "",
        "| way | Redis time per check, µs (rounds) | commands | x BF.ADD at 3x |"
        " x its fresh check |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, values in usec.items():
        fresh = NATIVE_FRESH if name.startswith("native") else BITMAP_FRESH
        if name == BF_ADD:
            fresh = BF_ADD
        rounds = ", ".join(f"{v:.2f}" for v in values)
        lines.append(
            f"| {name} | {median[name]:.2f} ({rounds}) | {commands[name]:.2f} |"
            f" {median[name] / median[BF_ADD]:.2f}x | {median[name] / median[fresh]:.2f}x |"
        )
    lines += [
        "",
        "Issue 32's targets: a grown bitmap check at most 3x `BF.ADD` at 3x and 2.5x the"
        " fresh bitmap check; a native check with windows at most 2.5x the fresh native"
        " check. The hot path (measure g) sends the stock-command ways, plus the headers"
        " of every generation one check in 16.",
        "",
        "The one-key rows keep a shard's three generations in one key, one after the other"
        " (what a new layout could buy): read by one GETRANGE each, they cost"
        f" {median[_one_key(ONE_KEY_WAYS[0])] / median[_grown(3)]:.2f}x the separate keys;"
        " read by one BITFIELD_RO of every bit,"
        f" {median[_one_key(ONE_KEY_WAYS[1])] / median[_grown(3)]:.2f}x.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

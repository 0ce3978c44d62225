"""What a bitmap bulk load costs Redis at 100M at the least: ``python bench/floor.py``.

Measure (s) finds bulk loads into a 100M-URL bitmap filter at 0.2-0.3x RedisBloom's
``BF.MADD`` with Redis busy most of the time. This asks how much of that is the
design and how much any design on stock Redis commands would pay. At that size every
element's block is a cache miss, and an element's bits must be read (to answer) and
written (to add): Redis works per element however the client batches.

On one redis-server with RedisBloom, for the same random elements, it measures the
main thread's CPU per element (``INFO cpu``) of:

- ``BF.MADD``: RedisBloom's filter of the same capacity and rate, 1,000 per command;
- the block scripts the bulk path sends without numpy (``engine/lua/read_blocks.lua``
  and ``write_blocks.lua``): one 64-byte block read and written back per element, the
  blocks of a call of 10,000 grouped per shard as the bulk path groups them;
- ``GETRANGE`` and ``SETRANGE`` of each block, pipelined, no script, as the bulk path
  sends them with numpy: the least any client reading and writing blocks by stock
  commands makes Redis do (its own reply, parsing and dispatch per command; the
  client's work is not counted here);
- ``BITFIELD SET u1`` of the k bits (the unblocked chunk path, one command per call).

Rounds are interleaved (the order rotated), each on fresh copies of the shards. The
ratio ``BF.MADD / way`` is the most of ``BF.MADD``'s rate a load made that way can
reach while Redis is the limit. Results go to ``bench/floor.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from bulkload import main_thread_cpu  # noqa: E402
from harness import BenchRedis, floor_start, machine, rotated  # noqa: E402

from scrapy_redis_bloom.core.hashing import BLOCK_BITS  # noqa: E402
from scrapy_redis_bloom.core.layout import HEADER_BYTES  # noqa: E402
from scrapy_redis_bloom.engine.scripts import READ_BLOCKS, WRITE_BLOCKS  # noqa: E402

logger = logging.getLogger("bench.floor")

BLOCK_BYTES = BLOCK_BITS // 8
#: Elements of one call of the bulk path (grouped per shard as it groups them).
CALL = 10_000
#: Fingerprints per BF.MADD command, as measure (s) sends them.
MADD_CHUNK = 1_000
MADD = "BF.MADD (RedisBloom)"
#: Commands per pipeline flush of the stock-command ways.
FLUSH = 2_000


def main() -> int:
    """Measure each way's Redis CPU per element, print and write the table."""
    per_round = ("--elements", 200_000, "elements per way, round")
    started = floor_start(__doc__, 100_000_000, per_round, 5, HERE / "floor.md")
    if started is None:
        return 2
    args, found, config = started
    spec = config.spec
    blocks = spec.shard_bits // BLOCK_BITS
    rng = random.Random(23)
    with BenchRedis(found) as bench:
        client = bench.redis()
        keys = [f"floor:{shard}" for shard in range(spec.shards)]
        for key in keys:  # every page touched, as a filled filter's
            client.setrange(key, HEADER_BYTES + spec.shard_bytes - 1, b"\0")
        client.execute_command(
            "BF.RESERVE", "floor:bf", repr(args.error_rate), args.capacity, "EXPANSION", 2
        )
        read_sha = client.script_load(READ_BLOCKS.source)
        write_sha = client.script_load(WRITE_BLOCKS.source)
        ways: dict[str, Callable[[list[tuple[int, int]], list[bytes]], None]] = {
            MADD: lambda _, fps: _madd(client, fps),
            "block scripts (the bulk path's, no numpy)": lambda els, _: _scripts(
                client, keys, els, read_sha, write_sha
            ),
            "GETRANGE + SETRANGE (the bulk path's)": lambda els, _: _ranges(client, keys, els),
            "BITFIELD SET u1 x k": lambda els, _: _bitfield(client, keys, els, spec.hash_count),
        }
        cpu: dict[str, list[float]] = {name: [] for name in ways}
        rate: list[float] = []  # BF.MADD's elements per second, client included
        for round_index in range(args.rounds + 1):  # round 0 warms the filters' pages
            for name in rotated(list(ways), round_index):
                elements = [
                    (rng.randrange(spec.shards), rng.randrange(blocks))
                    for _ in range(args.elements)
                ]
                fingerprints = [rng.randbytes(20).hex().encode() for _ in range(args.elements)]
                before = main_thread_cpu(client)
                started = time.perf_counter()
                ways[name](elements, fingerprints)
                took = time.perf_counter() - started
                spent = (main_thread_cpu(client) - before) * 1e6 / args.elements
                if round_index:
                    cpu[name].append(spent)
                    if name == MADD:
                        rate.append(args.elements / took)
                logger.info(
                    "round %d %-32s %.2f us of Redis CPU per element (%.1f s)",
                    round_index,
                    name,
                    spent,
                    took,
                )
        info = bench.describe()
    text = _report(args, spec.hash_count, spec.shards, cpu, statistics.median(rate), info)
    sys.stdout.write(text)
    args.out.write_text(text, encoding="utf-8")
    logger.info("Wrote %s", args.out)
    return 0


def _madd(client: Any, fingerprints: list[bytes]) -> None:
    """BF.MADD the fingerprints, MADD_CHUNK per command, 10 commands per flush."""
    pipe = client.pipeline(transaction=False)
    for i in range(0, len(fingerprints), MADD_CHUNK):
        pipe.execute_command("BF.MADD", "floor:bf", *fingerprints[i : i + MADD_CHUNK])
        if len(pipe) >= 10:
            pipe.execute()
    pipe.execute()


def _per_shard(elements: list[tuple[int, int]]) -> list[dict[int, list[int]]]:
    """Group each call's elements per shard, their blocks sorted and distinct."""
    calls = []
    for first in range(0, len(elements), CALL):
        grouped: dict[int, set[int]] = {}
        for shard, block in elements[first : first + CALL]:
            grouped.setdefault(shard, set()).add(block)
        calls.append({shard: sorted(found) for shard, found in grouped.items()})
    return calls


def _runs(blocks: list[int]) -> bytes:
    """Pack blocks as the scripts read them: one run of one block each (as at 100M)."""
    return b"".join(block.to_bytes(4, "big") + (1).to_bytes(4, "big") for block in blocks)


def _scripts(
    client: Any, keys: list[str], elements: list[tuple[int, int]], read: str, write: str
) -> None:
    """Read each shard's blocks by the read script, write them back by the write script."""
    for call in _per_shard(elements):
        pipe = client.pipeline(transaction=False)
        for shard, blocks in call.items():
            pipe.evalsha(read, 1, keys[shard], _runs(blocks))
        replies = pipe.execute()
        pipe = client.pipeline(transaction=False)
        for (shard, blocks), reply in zip(call.items(), replies, strict=True):
            data = bytes(x ^ 1 for x in b"".join(reply[2:]))  # each block changed
            pipe.evalsha(write, 1, keys[shard], _runs(blocks), data)
        pipe.execute()


def _ranges(client: Any, keys: list[str], elements: list[tuple[int, int]]) -> None:
    """GETRANGE then SETRANGE each element's block, pipelined FLUSH commands at a time."""
    pipe = client.pipeline(transaction=False)
    for shard, block in elements:
        start = HEADER_BYTES + block * BLOCK_BYTES
        pipe.getrange(keys[shard], start, start + BLOCK_BYTES - 1)
        pipe.setrange(keys[shard], start, b"\x01" * BLOCK_BYTES)
        if len(pipe) >= FLUSH:
            pipe.execute()
    pipe.execute()


def _bitfield(client: Any, keys: list[str], elements: list[tuple[int, int]], k: int) -> None:
    """Set each element's k bits (in its block) by BITFIELD: a command per shard and call."""
    for call in _per_shard(elements):
        pipe = client.pipeline(transaction=False)
        for shard, blocks in call.items():
            fields: list[Any] = []
            for block in blocks:
                base = HEADER_BYTES * 8 + block * BLOCK_BITS
                for i in range(k):
                    fields += ["SET", "u1", base + (i * 37) % BLOCK_BITS, 1]
            pipe.execute_command("BITFIELD", keys[shard], *fields)
        pipe.execute()


def _report(
    args: argparse.Namespace,
    k: int,
    shards: int,
    cpu: dict[str, list[float]],
    madd_rate: float,
    info: dict[str, Any],
) -> str:
    """Return the results as Markdown: a way per row, its CPU and the bound it sets."""
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# The floor of a bitmap bulk load at 100M (bench/floor.py)",
        "",
        f"Run of {date}: `python bench/floor.py` (`--elements {args.elements:,}`,"
        f" `--rounds {args.rounds}`), redis-server {info['version']} with"
        f" {', '.join(info['modules']) or 'no modules'}, on {machine()['cpu_model']}.",
        f"A filter of {args.capacity:,} @ {args.error_rate:g}: {shards} blocked shards,"
        f" k = {k}; RedisBloom's of the same capacity and rate. Redis main-thread CPU per"
        " element (INFO cpu), median of the rounds after a warming one. Redis takes at"
        " most one element per that many µs made that way, whatever the client: the last"
        f" column compares that with the rate BF.MADD loaded at here ({madd_rate:,.0f}"
        " fp/s, redis-py with hiredis, as measure (s) sends it).",
        "",
        "| way | Redis CPU per element, µs (rounds) | most elements/s Redis takes |"
        " x BF.MADD's rate |",
        "| --- | --- | --- | --- |",
    ]
    for name, values in cpu.items():
        median = statistics.median(values)
        rounds = ", ".join(f"{v:.2f}" for v in values)
        most = 1e6 / median
        lines.append(
            f"| {name} | {median:.2f} ({rounds}) | {most:,.0f} | {most / madd_rate:.2f}x |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

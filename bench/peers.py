"""The peers as a user would run them: a RedisBloom dupefilter, bulk BF.*, the old hash.

:class:`BFAddDupeFilter` is scrapy-redis's dupefilter with its SET swapped for a
RedisBloom filter: the fingerprint scrapy-redis computes, one ``BF.ADD key fp`` per
request, ``BF.RESERVE`` once at start with a capacity and an error rate. That is the
fifteen lines a user of Redis Stack, Redis 8 or valkey-bloom would write.

:func:`old_plugin_offsets` reproduces scrapy-redis-bloomfilter 0.8.1's bit offsets
for many fingerprints at once, so that its false-positive rate can be measured at
full size: through its own code that takes 2k round trips per fingerprint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import redis
from scrapy_redis.dupefilter import RFPDupeFilter

BF_ADD_CLASS = "peers.BFAddDupeFilter"

#: Fingerprints per BF.MADD / BF.MEXISTS command, and commands per pipeline flush.
BF_CHUNK = 1_000
BF_BATCH = 10


class BFAddDupeFilter(RFPDupeFilter):  # type: ignore[misc]  # scrapy-redis is untyped
    """scrapy-redis's RFPDupeFilter over a RedisBloom filter: ``BF.ADD`` per request.

    Settings: ``REDISBLOOM_CAPACITY`` and ``REDISBLOOM_ERROR_RATE`` (BF.RESERVE's),
    ``REDISBLOOM_EXPANSION`` (0: NONSCALING; default RedisBloom's own, 2).
    """

    @classmethod
    def from_settings(cls, settings: Any) -> BFAddDupeFilter:
        """Build it as scrapy-redis does (key dupefilter:<timestamp>), then reserve."""
        dupefilter: BFAddDupeFilter = super().from_settings(settings)
        dupefilter.reserve(settings)
        return dupefilter

    @classmethod
    def from_spider(cls, spider: Any) -> BFAddDupeFilter:
        """Build it as scrapy-redis's Scheduler does (key <spider>:dupefilter), then reserve."""
        dupefilter: BFAddDupeFilter = super().from_spider(spider)
        dupefilter.reserve(spider.settings)
        return dupefilter

    def reserve(self, settings: Any) -> None:
        """BF.RESERVE the filter; one that exists is kept (another worker made it)."""
        expansion = settings.getint("REDISBLOOM_EXPANSION", 2)
        bf_reserve(
            self.server,
            self.key,
            settings.getint("REDISBLOOM_CAPACITY", 1_000_000),
            settings.getfloat("REDISBLOOM_ERROR_RATE", 1e-4),
            expansion,
        )

    def request_seen(self, request: Any) -> bool:
        """BF.ADD replies 1 when the fingerprint was added, 0 when it was (maybe) there."""
        added = self.server.execute_command("BF.ADD", self.key, self.request_fingerprint(request))
        return bool(added == 0)


def bf_reserve(
    client: redis.Redis, key: str, capacity: int, error_rate: float, expansion: int = 2
) -> None:
    """``BF.RESERVE key error_rate capacity``, NONSCALING for ``expansion`` 0."""
    scaling = ["NONSCALING"] if expansion == 0 else ["EXPANSION", expansion]
    try:
        client.execute_command("BF.RESERVE", key, repr(error_rate), capacity, *scaling)
    except redis.ResponseError as exc:
        if "exists" not in str(exc).lower():
            raise


def bf_madd(client: redis.Redis, key: str, elements: Sequence[str]) -> int:
    """Add elements with BF.MADD in chunks, pipelined; return how many were new."""
    return _bf_many(client, "BF.MADD", key, elements)


def bf_mexists(client: redis.Redis, key: str, elements: Sequence[str]) -> int:
    """Return how many elements BF.MEXISTS reports present (chunked, pipelined)."""
    return _bf_many(client, "BF.MEXISTS", key, elements)


def _bf_many(client: redis.Redis, command: str, key: str, elements: Sequence[str]) -> int:
    """Send ``command key e1 e2 ...`` in chunks, pipelined; return the sum of the replies."""
    total = 0
    pipe = client.pipeline(transaction=False)
    for i in range(0, len(elements), BF_CHUNK):
        pipe.execute_command(command, key, *elements[i : i + BF_CHUNK])
        if len(pipe) >= BF_BATCH:
            total += sum(sum(int(x) for x in reply) for reply in pipe.execute())
    total += sum(sum(int(x) for x in reply) for reply in pipe.execute())
    return total


def bf_geometry(client: redis.Redis, key: str) -> dict[str, int]:
    """Bits and hash functions of a RedisBloom filter's first layer (``BF.DEBUG``).

    Its reply: ``size:N``, then one ``bytes:B bits:M hashes:K hashwidth:W ...`` line
    per layer. Returns {} when BF.DEBUG is not there.
    """
    try:
        reply = client.execute_command("BF.DEBUG", key)
    except redis.ResponseError:
        return {}
    lines = [x.decode() if isinstance(x, bytes) else str(x) for x in reply]
    fields = dict(part.split(":", 1) for part in lines[1].split() if ":" in part)
    return {name: int(fields[name]) for name in ("bytes", "bits", "hashes") if name in fields}


def bloom_rate(bits: int, hashes: int, items: int) -> float:
    """Return a Bloom filter's expected false-positive rate: (1 - e^(-k n / m))^k."""
    return float((-math.expm1(-hashes * items / bits)) ** hashes)


def bf_expected_rate(client: redis.Redis, key: str) -> float:
    """Return the expected false-positive rate of a RedisBloom filter, every layer.

    From ``BF.DEBUG``: each layer's bits, hashes and items; a probe is a false
    positive when any layer answers yes. NaN when BF.DEBUG is not there.
    """
    try:
        reply = client.execute_command("BF.DEBUG", key)
    except redis.ResponseError:
        return float("nan")
    lines = [x.decode() if isinstance(x, bytes) else str(x) for x in reply]
    clear = 1.0
    for line in lines[1:]:
        fields = dict(part.split(":", 1) for part in line.split() if ":" in part)
        clear *= 1 - bloom_rate(int(fields["bits"]), int(fields["hashes"]), int(fields["size"]))
    return 1 - clear


def old_plugin_offsets(values: Sequence[str], bit: int, hash_number: int) -> list[list[int]]:
    """scrapy-redis-bloomfilter 0.8.1's bit offsets of each value, one list per seed.

    Its ``HashMap(m, seed).hash(value)`` is ``ret = ret * (seed + 1) + ord(c)`` over the
    characters, masked with ``m - 1 = 2**bit - 1``; the mask commutes with the
    recurrence, so it is computed modulo 2**bit for all values at once, each in its
    own 64-bit lane of one Python integer (ASCII values of equal length only, as
    fingerprints are). :func:`check_old_plugin_offsets` compares it with its code.
    """
    if not values:
        return [[] for _ in range(hash_number)]
    length = len(values[0])
    if bit > 32 or any(len(v) != length or not v.isascii() for v in values):
        raise ValueError("old_plugin_offsets takes ASCII values of one length, bit <= 32")
    count = len(values)
    joined = "".join(values).encode()
    columns = []
    for i in range(length):
        lanes = bytearray(8 * count)
        lanes[0::8] = joined[i::length]
        columns.append(int.from_bytes(lanes, "little"))
    mask = int.from_bytes(((1 << bit) - 1).to_bytes(8, "little") * count, "little")
    out = []
    for seed in range(hash_number):
        acc = 0
        for column in columns:
            acc = (acc * (seed + 1) + column) & mask
        raw = memoryview(acc.to_bytes(8 * count, "little")).cast("Q")
        out.append(list(raw))
    return out


def check_old_plugin_offsets(values: Sequence[str], bit: int, hash_number: int) -> bool:
    """Tell whether :func:`old_plugin_offsets` agrees with the plugin's own HashMap."""
    from scrapy_redis_bloomfilter.bloomfilter import HashMap

    ours = old_plugin_offsets(values, bit, hash_number)
    theirs = [[HashMap(1 << bit, seed).hash(v) for v in values] for seed in range(hash_number)]
    return ours == theirs


def old_plugin_false_positives(
    added: Sequence[str], probes: Sequence[str], bit: int, hash_number: int
) -> int:
    """How many ``probes`` scrapy-redis-bloomfilter would call seen after ``added``.

    Its bit array is rebuilt in memory from its offsets (what its SETBITs would set);
    a probe is seen when all of its bits are set, as its ``exists`` answers.
    """
    bits = bytearray((1 << bit) // 8 + 1)
    for offsets in old_plugin_offsets(added, bit, hash_number):
        for o in offsets:
            bits[o >> 3] |= 1 << (o & 7)
    per_seed = old_plugin_offsets(probes, bit, hash_number)
    return sum(all(bits[o >> 3] >> (o & 7) & 1 for o in row) for row in zip(*per_seed, strict=True))

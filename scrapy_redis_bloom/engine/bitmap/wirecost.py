"""What a byte costs to move between this worker and a Redis node: measured, not assumed.

A bulk load moves a shard whole or only the 64-byte blocks its elements touch; which
costs less depends on the link, which the package cannot know. So it measures, per node:
the best of :data:`TRIES` ``GETRANGE`` reads of up to :data:`PROBE_BYTES` against as
many of one byte, at first use and every :data:`REMEASURE` seconds. What a byte costs
beyond loopback's (:data:`LOOPBACK_NS_PER_BYTE`, which the bulk path's constants were
measured with) is added to each way's cost (:meth:`WireCost.extra`): on loopback the
choices stay as they were; over a network, blocks wherever the whole shard would move
mostly untouched bytes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from scrapy_redis_bloom.core.errors import BloomFilterError
from scrapy_redis_bloom.transport.executor import Call, Executor
from scrapy_redis_bloom.transport.wire import pack_command

logger = logging.getLogger(__name__)

#: Bytes the probe reads at most (less when the key is shorter), and at least for a
#: figure to be taken (below it, loopback's noise is the size of the signal).
PROBE_BYTES = 65_536
LEAST_BYTES = 16_384
#: Reads of each size per measure, the two sizes in turn: the best of each counts (noise
#: only ever adds, and a busy spell then hits both sizes).
TRIES = 5
#: Seconds between two measures of a node (a failover may move it elsewhere).
REMEASURE = 300.0
#: What a byte costs on loopback (bench/NOTES.md): the part of a byte's cost that the
#: bulk path's constants already hold.
LOOPBACK_NS_PER_BYTE = 0.4
#: Below this much beyond loopback's, a byte's cost is taken as loopback's: above a busy
#: machine's loopback noise, below a 1 Gbit/s link's (bench/NOTES.md).
NOISE_NS_PER_BYTE = 2.0


@dataclass(slots=True)
class _Measure:
    extra: float
    at: float


class WireCost:
    """Per node, the ns a byte costs to move beyond loopback's; ``clock``: monotonic seconds."""

    def __init__(self, executor: Executor, clock: Callable[[], float] = time.monotonic) -> None:
        self.executor = executor
        self.clock = clock
        self._nodes: dict[str, _Measure] = {}

    def extra(self, address: str, key: str) -> float:
        """Return the ns a byte costs on the node at ``address`` beyond loopback's (>= 0).

        ``key``: a key on that node to read. A probe that fails keeps the last figure (0 at
        first) until the next measure is due, and logs it: the bulk call itself then meets the
        same fault.
        """
        now = self.clock()
        known = self._nodes.get(address)
        if known is not None and now - known.at < REMEASURE:
            return known.extra
        extra = known.extra if known is not None else 0.0
        try:
            measured = self._measure(key)
        except BloomFilterError as exc:
            logger.info("Could not measure the link to Redis %s (%s): kept %.1f ns/byte.",
                        address, exc, extra)  # fmt: skip
        else:
            if measured is not None:
                extra = measured - LOOPBACK_NS_PER_BYTE
                extra = extra if extra >= NOISE_NS_PER_BYTE else 0.0
                if known is None or abs(extra - known.extra) > 1.0:
                    logger.debug("Moving a byte to or from Redis %s costs %.1f ns beyond"
                                 " loopback's.", address, extra)  # fmt: skip
        self._nodes[address] = _Measure(extra, now)
        return extra

    def _measure(self, key: str) -> float | None:
        """Return ns per byte read from ``key``'s node, or None when the key is too short."""
        best: dict[int, float] = {}
        size = PROBE_BYTES
        calls = {
            span: Call(pack_command(b"GETRANGE", key, 0, span - 1), key=key)
            for span in (PROBE_BYTES, 1)
        }
        for _ in range(TRIES):
            for span, call in calls.items():
                start = time.perf_counter()
                reply = self.executor.run("measure the link to Redis", [call], timeout=0)
                took = time.perf_counter() - start
                best[span] = min(best.get(span, took), took)
                got = reply.replies[0]
                if span > 1:
                    size = len(got) if isinstance(got, bytes) else 0
                    if size < LEAST_BYTES:
                        return None
        return max(0.0, best[PROBE_BYTES] - best[1]) / size * 1e9

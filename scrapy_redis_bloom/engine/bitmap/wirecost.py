"""What a byte costs to move between this worker and a Redis node: measured, not assumed.

Which costs less, a shard moved whole or only its touched blocks, depends on the link.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from scrapy_redis_bloom.core.errors import BloomFilterError
from scrapy_redis_bloom.transport.executor import Call, Executor
from scrapy_redis_bloom.transport.wire import pack_command

logger = logging.getLogger(__name__)

#: Bytes the probe reads at most, and at least for a figure (below: noise).
PROBE_BYTES = 65_536
LEAST_BYTES = 16_384
#: Reads of each size per measure, in turn: the best counts (noise only ever adds).
TRIES = 5
#: Seconds between two measures of a node (a failover may move it elsewhere).
REMEASURE = 300.0
#: What a byte costs on loopback (bench/NOTES.md), held in the bulk path's constants.
LOOPBACK_NS_PER_BYTE = 0.4
#: Below this much beyond loopback's, a byte costs loopback's (noise, not a 1 Gbit/s link).
NOISE_NS_PER_BYTE = 2.0


class WireCost:
    """Per node, the ns a byte costs to move beyond loopback's; ``clock``: monotonic seconds."""

    def __init__(self, executor: Executor, clock: Callable[[], float] = time.monotonic) -> None:
        self.executor = executor
        self.clock = clock
        self._nodes: dict[str, tuple[float, float]] = {}  # address -> (extra, measured at)

    def extra(self, address: str, key: str) -> float:
        """Return the ns a byte costs on ``address`` beyond loopback's (failed probe: the last)."""
        now = self.clock()
        last, at = self._nodes.get(address, (None, 0.0))
        if last is not None and now - at < REMEASURE:
            return last
        extra = last if last is not None else 0.0
        try:
            measured = self._measure(key)
        except BloomFilterError as exc:
            logger.info("Could not measure the link to Redis %s (%s): kept %.1f ns/byte.",
                        address, exc, extra)  # fmt: skip
        else:
            if measured is not None:
                extra = measured - LOOPBACK_NS_PER_BYTE
                extra = extra if extra >= NOISE_NS_PER_BYTE else 0.0
                if last is None or abs(extra - last) > 1.0:
                    logger.debug("Moving a byte to or from Redis %s costs %.1f ns beyond"
                                 " loopback's.", address, extra)  # fmt: skip
        self._nodes[address] = (extra, now)
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

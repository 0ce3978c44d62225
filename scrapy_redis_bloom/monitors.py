"""The public path of :mod:`scrapy_redis_bloom.scrapy.monitors` (needs the ``spidermon`` extra)."""

from scrapy_redis_bloom.scrapy.monitors import (
    BloomFilterMonitorSuite,
    CapacityMonitor,
    DoubtMonitor,
    FailoverMonitor,
    FalsePositiveRateMonitor,
)

__all__ = [
    "BloomFilterMonitorSuite",
    "CapacityMonitor",
    "DoubtMonitor",
    "FailoverMonitor",
    "FalsePositiveRateMonitor",
]

"""The public path of the Spidermon monitors (``scrapy_redis_bloom.monitors``).

The code lives in :mod:`scrapy_redis_bloom.scrapy.monitors` (needs the ``spidermon`` extra).
"""

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

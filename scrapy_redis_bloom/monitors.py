"""The public path of :mod:`scrapy_redis_bloom.scrapy.monitors` (needs the ``spidermon`` extra)."""

from scrapy_redis_bloom.scrapy.monitors import BloomFilterMonitorSuite as BloomFilterMonitorSuite
from scrapy_redis_bloom.scrapy.monitors import CapacityMonitor as CapacityMonitor
from scrapy_redis_bloom.scrapy.monitors import DoubtMonitor as DoubtMonitor
from scrapy_redis_bloom.scrapy.monitors import FailoverMonitor as FailoverMonitor
from scrapy_redis_bloom.scrapy.monitors import FalsePositiveRateMonitor as FalsePositiveRateMonitor

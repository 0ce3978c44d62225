"""The public path of :mod:`scrapy_redis_bloom.scrapy.scheduler`'s ``Scheduler``."""

from scrapy_redis_bloom.scrapy.scheduler import Scheduler as Scheduler

"""The public path of :mod:`scrapy_redis_bloom.scrapy.batching`'s ``BatchingMiddleware``."""

from scrapy_redis_bloom.scrapy.batching import BatchingMiddleware as BatchingMiddleware

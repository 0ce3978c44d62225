"""The public path of the Sentinel client (``scrapy_redis_bloom.sentinel.SentinelRedis``).

The code lives in :mod:`scrapy_redis_bloom.transport.sentinel`.
"""

from scrapy_redis_bloom.transport.sentinel import SentinelRedis

__all__ = ["SentinelRedis"]

"""The public path of :mod:`scrapy_redis_bloom.transport.sentinel`'s ``SentinelRedis``."""

from scrapy_redis_bloom.transport.sentinel import SentinelRedis as SentinelRedis

"""The public path of the batching middleware (``scrapy_redis_bloom.batching.BatchingMiddleware``).

The code lives in :mod:`scrapy_redis_bloom.scrapy.batching`.
"""

from scrapy_redis_bloom.scrapy.batching import BatchingMiddleware

__all__ = ["BatchingMiddleware"]

"""The public path of the dupefilter (``scrapy_redis_bloom.dupefilter.RFPDupeFilter``).

The code lives in :mod:`scrapy_redis_bloom.scrapy.dupefilter`.
"""

from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter

__all__ = ["RFPDupeFilter"]

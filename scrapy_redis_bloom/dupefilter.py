"""The public path of :mod:`scrapy_redis_bloom.scrapy.dupefilter`'s ``RFPDupeFilter``."""

from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter as RFPDupeFilter

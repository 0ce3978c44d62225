"""The engine: a Bloom filter in Redis, knowing nothing of Scrapy.

:mod:`.backend` chooses :mod:`.bitmap` (bits in Redis strings) or :mod:`.native`
(``BF.*``); both build on :mod:`.base` and :mod:`.lifecycle`. Import the public names
from the package root (``scrapy_redis_bloom``).
"""

"""The engine: a Bloom filter in Redis, knowing nothing of Scrapy (:mod:`.backend` chooses)."""

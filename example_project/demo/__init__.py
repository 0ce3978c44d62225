"""The demo Scrapy project of scrapy-redis-bloom: scrapy-redis workers sharing a Bloom filter."""

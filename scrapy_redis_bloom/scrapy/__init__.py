"""The Scrapy glue: the dupefilter Scrapy's and scrapy-redis's schedulers call, and its helpers."""

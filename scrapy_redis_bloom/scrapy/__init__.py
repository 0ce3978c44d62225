"""The Scrapy glue: the dupefilter Scrapy's and scrapy-redis's schedulers call, and its helpers.

:mod:`.dupefilter` (``RFPDupeFilter``), :mod:`.batching` (one round trip per page),
:mod:`.reservations` (answers given ahead to a page's links), :mod:`.stats` (the
``bloomfilter/*`` stats), :mod:`.addon` (``ADDONS``), :mod:`.monitors` (Spidermon).
"""

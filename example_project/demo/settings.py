"""Settings of the demo project: scrapy-redis workers sharing one Bloom-filter dupefilter.

Each worker is a plain ``scrapy crawl demo``. They share, in the Redis of ``REDIS_URL``:

* the start URLs, ``demo:start_urls`` (scrapy-redis's ``RedisSpider`` reads them);
* the request queue, ``demo:requests`` (scrapy-redis's ``Scheduler``);
* the dupefilter, the Bloom filter ``demo:bloomfilter`` (scrapy-redis-bloom's ``RFPDupeFilter``).

``run.py`` sets the environment variables read below; see the README beside it.
"""

import os

BOT_NAME = "demo"
SPIDER_MODULES = ["demo.spiders"]
NEWSPIDER_MODULE = "demo.spiders"

# -- scrapy-redis: the request queue lives in Redis, shared by every worker ----------------

SCHEDULER = "scrapy_redis.scheduler.Scheduler"
# Keep the queue and the dupefilter when a worker closes. With False, the last worker to
# close clears both (the Bloom filter is kept while other workers use it), and run.py
# could not read the filter after the crawl.
SCHEDULER_PERSIST = True
SCHEDULER_QUEUE_KEY = "%(spider)s:requests"
# Where the spider reads its start URLs (JSON: {"url": "..."}), one list per spider.
REDIS_START_URLS_KEY = "%(name)s:start_urls"
# Where Redis is: run.py passes the URL of its embedded server, or yours.
REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
# A worker stops on its own once it has been idle this many seconds: the shared queue is
# empty and it has nothing in flight. Scrapy checks an idle spider every 5 seconds, so a
# worker exits 3 to 8 seconds after the crawl drains. Short for the demo; a long crawl
# would rather outwait gaps in the queue, e.g. with 60 (0 never stops).
MAX_IDLE_TIME_BEFORE_CLOSE = 3

# -- scrapy-redis-bloom: the dupefilter -------------------------------------------------------

DUPEFILTER_CLASS = "scrapy_redis_bloom.dupefilter.RFPDupeFilter"
# Size the filter for the crawl you expect: the number of distinct requests...
BLOOMFILTER_CAPACITY = 1_000_000
# ...and the chance, once that many are in, that a new URL is taken for a seen one and
# skipped. 1,000,000 at 1e-4 takes 2.9 MiB of Redis, whether the filter is empty or full
# (past a million it grows, keeping that rate, and takes more).
BLOOMFILTER_ERROR_RATE = 0.0001
# The filter's Redis keys: <key>:meta (its configuration), {<key>:<n>}:g0 (the bits of
# shard n), <key>:count (all workers' counts) and <key>:workers (their leases).
BLOOMFILTER_KEY = "%(spider)s:bloomfilter"

# -- politeness and speed --------------------------------------------------------------------

# The demo site runs on 127.0.0.1 and has no robots.txt. On a real site, obey it.
ROBOTSTXT_OBEY = False
USER_AGENT = "scrapy-redis-bloom-demo"
# Per worker: 8 requests in flight, at most 4 per site, no delay. The demo site is local
# and answers in milliseconds; for a real site add DOWNLOAD_DELAY or AUTOTHROTTLE_ENABLED.
# scrapy-redis 0.9 also takes start URLs this many at a time (it ignores the older
# REDIS_START_URLS_BATCH_SIZE): run.py pushes one such batch per worker.
CONCURRENT_REQUESTS = 8
CONCURRENT_REQUESTS_PER_DOMAIN = 4
DOWNLOAD_DELAY = 0
DOWNLOAD_TIMEOUT = 20
COOKIES_ENABLED = False
# No consoles into the workers: neither the telnet console nor Scrapy 2.19's remote-control
# HTTP server (which also writes a job file to your profile directory).
TELNETCONSOLE_ENABLED = False
REMOTE_CONTROL_ENABLED = False
LOG_LEVEL = "INFO"
FEED_EXPORT_ENCODING = "utf-8"

# -- the demo's own settings --------------------------------------------------------------------

# The demo site's base URL: the spider follows links under it only.
DEMO_SITE_URL = os.environ.get("DEMO_SITE_URL", "")
# How long a worker that starts before there is any work waits for the crawl to begin
# (the start URL, or requests in the shared queue) before going idle.
DEMO_START_WAIT = 15
# Where this worker writes its final stats as JSON (demo.extensions.StatsDump).
DEMO_STATS_FILE = os.environ.get("DEMO_STATS_FILE", "")
EXTENSIONS = {"demo.extensions.StatsDump": 500}

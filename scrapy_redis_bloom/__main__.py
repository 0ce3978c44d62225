"""Run the operations commands: ``python -m scrapy_redis_bloom COMMAND``."""

from scrapy_redis_bloom.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

"""The operations commands: ``scrapy bloom COMMAND``, and the ``scrapy-redis-bloom`` alias.

One module per job: :mod:`.context` connects from the crawl settings, turns failures
into one error line and finds and opens the filter; :mod:`.streams` prints results,
JSON, prompts and progress bars, and reads fingerprints and URLs; :mod:`.figures`
holds the commands that show figures (``info``, ``watch``, ``size``), :mod:`.contents`
those that change or move what a filter holds (``add``, ``check``, ``migrate``,
``dump``, ``restore``, ``reset``); :mod:`.options` is the one table of the commands and
their options both front ends build their parsers from: :mod:`.scrapy_command` the
Scrapy command (``BloomCommand``, registered in the ``scrapy.commands`` entry point
group), :mod:`.alias` the older command line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_redis_bloom.cli.alias import PROG, build_parser, main

if TYPE_CHECKING:
    from scrapy_redis_bloom.cli.scrapy_command import BloomCommand

__all__ = ["PROG", "BloomCommand", "build_parser", "main"]


def __getattr__(name: str) -> Any:
    # Loaded on first access: the alias runs without importing Scrapy's command machinery.
    if name == "BloomCommand":
        from scrapy_redis_bloom.cli.scrapy_command import BloomCommand

        return BloomCommand
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

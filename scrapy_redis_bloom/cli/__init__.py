"""The operations commands: ``scrapy bloom COMMAND``, and the ``scrapy-redis-bloom`` alias.

:mod:`.context` connects and opens the filter, :mod:`.streams` prints and reads,
:mod:`.figures` and :mod:`.contents` hold the commands, and :mod:`.options` the table of
commands and options both front ends (:mod:`.scrapy_command`, :mod:`.alias`) build their
parsers from.
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

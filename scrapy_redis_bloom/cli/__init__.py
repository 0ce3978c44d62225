"""The operations commands: ``scrapy bloom COMMAND``, and the ``scrapy-redis-bloom`` alias."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_redis_bloom.cli.alias import PROG, build_parser, main

if TYPE_CHECKING:
    from scrapy_redis_bloom.cli.scrapy_command import BloomCommand

__all__ = ["PROG", "BloomCommand", "build_parser", "main"]


def __getattr__(name: str) -> Any:  # the alias runs without Scrapy's command machinery
    if name == "BloomCommand":
        from scrapy_redis_bloom.cli.scrapy_command import BloomCommand

        return BloomCommand
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The ``scrapy-redis-bloom`` console script: an alias of ``scrapy bloom`` (see :mod:`.commands`).

Kept for scripts written against earlier releases; the commands live in
:mod:`.commands`, this module only names the entry point.
"""

from __future__ import annotations

from .commands.alias import PROG, build_parser, main

__all__ = ["PROG", "build_parser", "main"]

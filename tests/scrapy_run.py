"""Running ``scrapy`` as a user runs it, in a subprocess, in a temporary Scrapy project.

For the tests of ``scrapy bloom`` (test_scrapy_command.py) and of the README's
``scrapy bloom`` sessions (test_readme.py). The ``scrapy`` executable beside the
running Python must have the command through the ``scrapy.commands`` entry point (an
install of this package); :data:`NOT_INSTALLED` skips the tests otherwise, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

import pytest

SCRAPY = Path(sys.executable).with_name("scrapy")
SUBCOMMANDS = ("info", "size", "reset", "add", "check", "migrate", "dump", "restore", "watch")

NOT_INSTALLED = pytest.mark.skipif(
    not SCRAPY.exists() or "bloom" not in {e.name for e in entry_points(group="scrapy.commands")},
    reason="scrapy bloom is not installed in this environment (pip install -e .)",
)


@dataclass
class Result:
    """What a command did: its exit status and output."""

    code: int
    out: str
    err: str


def scrapy(cwd: Path, *argv: str, stdin: str | None = None, timeout: float = 60) -> Result:
    """Run ``scrapy ARGV`` in ``cwd``, as a user would; return its exit status and output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCRAPY_", "REDIS_URL"))}
    done = subprocess.run(
        [str(SCRAPY), *argv],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Result(done.returncode, done.stdout, done.stderr)


def one_line_error(result: Result, code: int) -> str:
    """Check that a command failed with ``code`` and one error line, no traceback."""
    assert result.code == code, result
    assert result.err.startswith("scrapy bloom: error: "), result.err
    assert result.err.count("\n") == 1, result.err
    assert "Traceback" not in result.err
    return result.err


SPIDER = """
import scrapy


class BooksSpider(scrapy.Spider):
    name = "books"


class MySpider(scrapy.Spider):
    name = "myspider"


class NewsSpider(scrapy.Spider):
    name = "news"
    custom_settings = {"BLOOMFILTER_KEY": "fresh:%(spider)s"}
"""


def make_project(root: Path, settings: str) -> Path:
    """Write a Scrapy project (scrapy.cfg, settings.py, three spiders); return its directory.

    ``settings`` is appended to settings.py: it may override the sizing given first.
    """
    package = root / "shop"
    (package / "spiders").mkdir(parents=True)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = shop.settings\n")
    (package / "__init__.py").write_text("")
    (package / "spiders" / "__init__.py").write_text("")
    (package / "spiders" / "books.py").write_text(SPIDER)
    (package / "settings.py").write_text(
        'BOT_NAME = "shop"\nSPIDER_MODULES = ["shop.spiders"]\n'
        'DUPEFILTER_CLASS = "scrapy_redis_bloom.dupefilter.RFPDupeFilter"\n'
        "BLOOMFILTER_CAPACITY = 20_000\nBLOOMFILTER_ERROR_RATE = 0.0001\n" + settings
    )
    return root

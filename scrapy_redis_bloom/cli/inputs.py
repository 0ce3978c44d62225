"""Reading what ``add`` and ``check`` feed the filter: fingerprints, or URLs to fingerprint.

Fingerprints are 40 hex digits, one per line. URLs (``--urls``) become the
fingerprint the crawl's dupefilter gives a GET request for them
(:func:`url_fingerprinter`), so ``check --urls`` answers what a crawl would.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any

from scrapy_redis_bloom.cli.context import CLIError, Context, UsageError
from scrapy_redis_bloom.cli.output import stdin_is_tty
from scrapy_redis_bloom.core.settings import BloomConfig, SettingsLike

if TYPE_CHECKING:
    from scrapy import Request

#: Fingerprints sent to the engine per bulk call: bounds the commands' memory.
BATCH = 10_000

FINGERPRINT = re.compile(rb"[0-9a-fA-F]{40}")
_URL = re.compile(rb"[A-Za-z][A-Za-z0-9+.-]*://\S+")


class BadLineError(Exception):
    """An input line that is not what the command reads."""

    def __init__(self, source: str, lineno: int, text: bytes) -> None:
        super().__init__(source, lineno, text)
        self.source = source
        self.lineno = lineno
        self.text = text


def url_fingerprinter(settings: SettingsLike) -> Callable[[str], str]:
    """Return the function the crawl's dupefilter fingerprints a URL's GET request with.

    As :class:`..dupefilter.RFPDupeFilter` does: with ``BLOOMFILTER_FINGERPRINTER =
    "crawler"``, the project's ``REQUEST_FINGERPRINTER_CLASS`` (built for a crawler of
    these settings); otherwise the ``request_fingerprint`` of ``DUPEFILTER_CLASS``
    when it is a scrapy-redis dupefilter (ours is), else scrapy-redis's own.
    """
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import Settings
    from scrapy.utils.misc import build_from_crawler, load_object
    from scrapy_redis.dupefilter import RFPDupeFilter as RedisDupeFilter

    config = BloomConfig.from_settings(settings)
    if config.fingerprinter == "crawler":
        crawler = Crawler(Spider, settings if isinstance(settings, (Settings, dict)) else None)
        fingerprinter: Any = build_from_crawler(
            load_object(crawler.settings["REQUEST_FINGERPRINTER_CLASS"]), crawler
        )

        def by_crawler(url: str) -> str:
            return str(fingerprinter.fingerprint(Request(url)).hex())

        return by_crawler
    dupefilter: Any = RedisDupeFilter
    named = settings.get("DUPEFILTER_CLASS")
    if named:
        loaded = load_object(named)
        if isinstance(loaded, type) and issubclass(loaded, RedisDupeFilter):
            dupefilter = loaded
    # request_fingerprint is a pure function of the request: no instance state is needed,
    # and building a dupefilter would open the filter and join it as a worker.
    bare = dupefilter.__new__(dupefilter)

    def by_dupefilter(url: str) -> str:
        request: Request = Request(url)
        return str(bare.request_fingerprint(request))

    return by_dupefilter


def read_lines(
    paths: Sequence[str], parse: Callable[[bytes], bytes | None]
) -> Iterator[list[bytes]]:
    """Yield batches of parsed lines read from files (``-`` is stdin).

    Blank lines are skipped. At a line ``parse`` refuses (None), the lines before it
    are yielded, then :class:`BadLineError` is raised.
    """
    batch: list[bytes] = []
    for path in paths:
        source = "<stdin>" if path == "-" else path
        with contextlib.ExitStack() as stack:
            stream: IO[bytes]
            stream = sys.stdin.buffer if path == "-" else stack.enter_context(open(path, "rb"))
            for lineno, line in enumerate(stream, 1):
                text = line.strip()
                if not text:
                    continue
                parsed = parse(text)
                if parsed is None:
                    if batch:
                        yield batch
                    raise BadLineError(source, lineno, text)
                batch.append(parsed)
                if len(batch) == BATCH:
                    yield batch
                    batch = []
    if batch:
        yield batch


def parser_for(ctx: Context) -> Callable[[bytes], bytes | None]:
    """Return how a line becomes a fingerprint: as given, or from its URL (``--urls``)."""
    if not getattr(ctx.args, "urls", False):
        return lambda text: text.lower() if FINGERPRINT.fullmatch(text) else None
    fingerprint = url_fingerprinter(ctx.settings)

    def from_url(text: bytes) -> bytes | None:
        if not _URL.fullmatch(text):
            return None
        return fingerprint(text.decode(errors="replace")).encode()

    return from_url


def input_paths(ctx: Context) -> list[str]:
    """Return the input files; stdin when none is given, unless it is a terminal."""
    paths = [str(path) for path in ctx.args.files]
    if not paths and stdin_is_tty():
        what = "URLs" if getattr(ctx.args, "urls", False) else "fingerprints"
        raise UsageError(
            f"no FILE given and stdin is a terminal: give files of {what}, or pipe"
            " them in (use - to type them on the terminal)"
        )
    return paths or ["-"]


def bad_line(ctx: Context, exc: BadLineError, done: int, verb: str) -> CLIError:
    """Return the error for an input line that is not a fingerprint (or URL)."""
    shown = exc.text[:60].decode(errors="replace")
    what = "URL" if getattr(ctx.args, "urls", False) else "request fingerprint (40 hex digits)"
    return CLIError(
        f"{exc.source}:{exc.lineno}: not a {what}: {shown!r}."
        f" Stopped there; the {done:,} fingerprint(s) before it were {verb}."
    )

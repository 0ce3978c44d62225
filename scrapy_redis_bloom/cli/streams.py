"""What the commands print and read: results, JSON, prompts and progress; fingerprints and URLs.

stdout carries the result only (``--json`` output can be piped); stderr all else.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import itertools
import json
import os
import re
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

from tqdm import tqdm

from scrapy_redis_bloom.cli.context import EXIT_OK, CLIError, Context, UsageError, err, stdin_is_tty
from scrapy_redis_bloom.core.settings import BloomConfig, SettingsLike
from scrapy_redis_bloom.ops.inventory import Orphan

#: Keys listed one per line in text output, at most (JSON lists them all).
LISTED = 20
#: Rows of the shard fill chart, at most: shards are bucketed beyond that.
CHART_ROWS = 16
#: Width of the chart's longest bar, in characters.
CHART_WIDTH = 30
_EIGHTHS = " ▏▎▍▌▋▊▉█"


def out(text: str = "") -> None:
    """Write a line to stdout (looked up at call time, so capture works)."""
    if sys.stdout is None:  # started with its stdout closed (>&-)
        raise CLIError(
            "Standard output is closed: the result cannot be printed (redirect it to a file or"
            " to /dev/null)."
        )
    sys.stdout.write(text + "\n")


def emit(ctx: Context | argparse.Namespace, data: dict[str, Any], lines: Sequence[str]) -> int:
    """Print a command's result: ``data`` as JSON with ``--json``, else ``lines``; return 0."""
    args = ctx.args if isinstance(ctx, Context) else ctx
    out(json.dumps(data, indent=2) if args.json else "\n".join(lines))
    return EXIT_OK


def table(rows: Sequence[tuple[str, str]]) -> list[str]:
    """Lay out label/value rows in two aligned columns."""
    width = max(len(label) for label, _ in rows)
    return [f"{label:<{width}}  {value}" for label, value in rows]


def bar(fraction: float, width: int = CHART_WIDTH) -> str:
    """Draw ``fraction`` (0 to 1) of ``width`` characters with block eighths."""
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, rest = divmod(eighths, 8)
    return ("█" * full + (_EIGHTHS[rest] if rest else "")).ljust(width)


def fill_chart(per_shard: Sequence[int], bits_per_shard: int) -> list[tuple[str, str]]:
    """Return rows of a bar chart of the shards' fill, scaled to the fullest row (of shards)."""
    if not per_shard or bits_per_shard <= 0:
        return []
    size = -(-len(per_shard) // CHART_ROWS)
    rows: list[tuple[str, float]] = []
    for start in range(0, len(per_shard), size):
        bucket = per_shard[start : start + size]
        label = f"{start}" if len(bucket) == 1 else f"{start}-{start + len(bucket) - 1}"
        rows.append((label, sum(bucket) / (len(bucket) * bits_per_shard)))
    top = max(fill for _, fill in rows) or 1.0
    name = "Fill, shards" if size > 1 else "Fill, shard"
    return [(f"{name} {label}", f"{bar(fill / top)} {100 * fill:.4f} %") for label, fill in rows]


def progress(total: int | None, unit: str, what: str) -> tqdm[Any]:
    """Return a progress bar on stderr, quiet when stderr is not a terminal."""
    quiet = sys.stderr is None or not sys.stderr.isatty()
    return tqdm(total=total, unit=unit, desc=what, file=sys.stderr, disable=quiet, unit_scale=True)


def listing(key: str, orphans: Sequence[Orphan]) -> list[str]:
    """List keys one per line, indented, at most :data:`LISTED` (a filter id's shards summed up)."""
    groups: dict[str, list[Orphan]] = {}
    for orphan in orphans:
        if orphan.kind == "shard":
            groups.setdefault(orphan.filter_id, []).append(orphan)
    pattern = "{" + key + ":<i>}:g<m>"
    lines = [
        f"  {len(shards):,} shard key(s) {pattern!r} of filter id {filter_id}: shards"
        f" {ranges(o.shard or 0 for o in shards)}, on"
        f" {', '.join(sorted({o.address for o in shards}))}"
        for filter_id, shards in groups.items()
    ]
    rest = [o for o in orphans if o.kind != "shard"]
    lines += [f"  {o.key!r} on {o.address}: {o.what}" for o in rest[:LISTED]]
    if len(rest) > LISTED:
        lines.append(f"  ... and {len(rest) - LISTED:,} more")
    return lines


def ranges(numbers: Iterable[int]) -> str:
    """Write numbers as ranges: ``0-5, 7, 9-12``."""
    runs = itertools.groupby(enumerate(sorted(set(numbers))), lambda pair: pair[1] - pair[0])
    spans = [[n for _, n in run] for _, run in runs]
    return ", ".join(f"{s[0]}-{s[-1]}" if len(s) > 1 else f"{s[0]}" for s in spans)


def orphan_data(orphans: Sequence[Orphan]) -> list[dict[str, str]]:
    """Describe keys for JSON."""
    return [{"key": o.key, "server": o.address, "what": o.what} for o in orphans]


def confirm_or_abort(ctx: Context, what: str, lines: Sequence[str] = ()) -> None:
    """Ask before deleting, unless ``--yes``; raise if the answer is not an explicit yes."""
    if ctx.args.yes:
        return
    for line in lines:
        err(line)
    sys.stderr.write(f"Delete {what}? Every request it has seen will be forgotten. [y/N] ")
    sys.stderr.flush()
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise CLIError("Not confirmed: nothing was deleted.")


#: Fingerprints sent to the engine per bulk call: big enough for whole-shard snapshots (~150 MB).
BATCH = 1_000_000

FINGERPRINT = re.compile(rb"[0-9a-fA-F]{40}")
_URL = re.compile(rb"[A-Za-z][A-Za-z0-9+.-]*://\S+")


@dataclass(eq=False)  # hashable, as exceptions are
class BadLineError(Exception):
    """An input line that is not what the command reads (``problem``: why, when known)."""

    source: str
    lineno: int
    text: bytes
    problem: str = ""


class RefusedLineError(Exception):
    """Raised by a line parser for a line it refuses, its message saying why."""


def _request(url: str) -> Any:
    """Return the GET request of ``url``, as the crawl would make it.

    Request parses the URL: its ValueError (a bad port, a bad IPv6 host, ...) means a bad
    input line, so it becomes RefusedLineError; errors of the fingerprinting still surface.
    """
    from scrapy import Request

    try:
        return Request(url)
    except ValueError as exc:
        raise RefusedLineError(str(exc)) from None


def _load_setting(settings: SettingsLike, name: str) -> Any:
    """Return the object the setting ``name`` names; a name that does not load is a UsageError.

    Only a wrong name is reported so: an error raised inside the named module still surfaces.
    """
    from scrapy.utils.misc import load_object

    value = settings.get(name)
    if not isinstance(value, str):  # the object itself, given in settings.py
        return load_object(value)
    module, _, attr = value.rpartition(".")
    if not module:
        raise UsageError(f"{name}={value!r} cannot be loaded: not a full path (module.Object).")
    try:
        return load_object(value)
    except ModuleNotFoundError as exc:
        if exc.name is None or not f"{module}.".startswith(f"{exc.name}."):  # one it imports
            raise
        problem = f"no module named {exc.name!r}"
    except NameError:  # load_object's for a missing object; the module's own surfaces
        if module not in sys.modules or hasattr(sys.modules[module], attr):
            raise
        problem = f"module {module!r} has no {attr!r}"
    raise UsageError(f"{name}={value!r} cannot be loaded: {problem}.")


def url_fingerprinter(settings: SettingsLike) -> Callable[[str], str]:
    """Return the function the crawl's dupefilter fingerprints a URL's GET request with."""
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import Settings
    from scrapy.utils.misc import build_from_crawler
    from scrapy_redis.dupefilter import RFPDupeFilter as RedisDupeFilter

    if BloomConfig.from_settings(settings).fingerprinter == "crawler":
        crawler = Crawler(Spider, settings if isinstance(settings, (Settings, dict)) else None)
        fingerprinter: Any = build_from_crawler(
            _load_setting(crawler.settings, "REQUEST_FINGERPRINTER_CLASS"), crawler
        )
        return lambda url: str(fingerprinter.fingerprint(_request(url)).hex())
    dupefilter: Any = RedisDupeFilter
    if settings.get("DUPEFILTER_CLASS"):
        loaded = _load_setting(settings, "DUPEFILTER_CLASS")
        if isinstance(loaded, type) and issubclass(loaded, RedisDupeFilter):
            dupefilter = loaded
    # request_fingerprint is pure; building a dupefilter would open the filter and join it.
    bare = dupefilter.__new__(dupefilter)
    return lambda url: str(bare.request_fingerprint(_request(url)))


def read_lines(
    paths: Sequence[str], parse: Callable[[bytes], bytes | None]
) -> Iterator[list[bytes]]:
    """Yield batches of parsed lines read from files (``-`` is stdin), skipping blank lines.

    At a line ``parse`` refuses (None, or RefusedLineError saying why), the lines before it
    are yielded, then it raises BadLineError.
    """
    batch: list[bytes] = []
    for path in paths:
        source = "<stdin>" if path == "-" else path
        if path == "-" and sys.stdin is None:  # started with its stdin closed (<&-)
            raise UsageError("Standard input is closed: give the fingerprints in a file.")
        with contextlib.ExitStack() as stack:
            stream: IO[bytes]
            stream = sys.stdin.buffer if path == "-" else stack.enter_context(open(path, "rb"))
            for lineno, line in enumerate(stream, 1):
                if not (text := line.strip()):
                    continue
                problem = ""
                try:
                    parsed = parse(text)
                except RefusedLineError as exc:
                    parsed, problem = None, str(exc)
                if parsed is None:
                    if batch:
                        yield batch
                    raise BadLineError(source, lineno, text, problem)
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
    return lambda text: (
        fingerprint(text.decode(errors="replace")).encode() if _URL.fullmatch(text) else None
    )


def input_paths(ctx: Context) -> list[str]:
    """Return the input files, each readable; stdin when none is given, unless a terminal."""
    paths = [str(path) for path in ctx.args.files]
    if not paths and stdin_is_tty():
        what = "URLs" if getattr(ctx.args, "urls", False) else "fingerprints"
        raise UsageError(
            f"no FILE given and stdin is a terminal: give files of {what}, or pipe"
            " them in (use - to type them on the terminal)"
        )
    for path in paths:
        if path != "-":
            _check_readable(path)
    return paths or ["-"]


def _check_readable(path: str) -> None:
    """Raise the OSError opening ``path`` would: before anything is done (``add`` creates).

    By ``stat`` and ``access`` only: opening a named pipe to check it would take its writer's
    first lines, or kill it (SIGPIPE) when closed again.
    """
    if stat.S_ISDIR(os.stat(path).st_mode):  # missing: FileNotFoundError
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    if not os.access(path, os.R_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)


def bad_line(ctx: Context, exc: BadLineError, done: int, verb: str) -> CLIError:
    """Return the error for an input line that is not a fingerprint (or URL)."""
    shown = exc.text[:60].decode(errors="replace")
    what = "URL" if getattr(ctx.args, "urls", False) else "request fingerprint (40 hex digits)"
    why = f" ({exc.problem})" if exc.problem else ""
    return CLIError(
        f"{exc.source}:{exc.lineno}: not a {what}: {shown!r}{why}."
        f" Stopped there; the {done:,} fingerprint(s) before it were {verb}."
    )

"""``scrapy bloom COMMAND``: the operations commands, run with the project's settings.

Registered through the ``scrapy.commands`` entry point group, so Scrapy's command
line finds it inside a project (settings.py through scrapy.cfg) and outside one
(Scrapy's defaults; scrapy-redis's ``REDIS_URL`` default, ``localhost:6379``).
``-s NAME=VALUE`` overrides a setting, before or after the subcommand's name. The
filter is reached exactly as a crawl reaches it (``REDIS_URL`` / ``REDIS_PARAMS``
or ``BLOOMFILTER_REDIS_URL(S)`` / ``BLOOMFILTER_REDIS_CLUSTER`` /
``BLOOMFILTER_REDIS_PARAMS``) and named as the crawl names it: ``BLOOMFILTER_KEY``
with ``%(spider)s`` filled in by ``--spider NAME`` (whose ``custom_settings`` apply,
as in ``scrapy crawl NAME``), or given whole with ``--key``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError as ScrapyUsageError
from scrapy.settings import Settings
from scrapy.utils.misc import load_object

from scrapy_redis_bloom.cli import feed, info, migrate, reset, size, transfer, watch
from scrapy_redis_bloom.cli.alias import (
    BLOCKED_FLAG,
    SIZING_OPTIONS,
    key_argument,
    positive_int,
    seconds_argument,
)
from scrapy_redis_bloom.cli.context import (
    Context,
    Frontend,
    Layered,
    UsageError,
    connect,
    guarded,
    settings_secrets,
    sizing_from,
)
from scrapy_redis_bloom.cli.inputs import BATCH
from scrapy_redis_bloom.cli.output import stdin_is_tty
from scrapy_redis_bloom.core.settings import BloomConfig

FRONTEND = Frontend(prog="scrapy bloom")

#: The subcommands that work on a filter in Redis, and what runs them.
_HANDLERS: dict[str, Callable[[Context], int]] = {
    "info": info.run,
    "reset": reset.run,
    "add": feed.add,
    "check": feed.check,
    "migrate": migrate.run,
    "watch": watch.run,
    "dump": transfer.dump,
    "restore": transfer.restore,
}


class BloomCommand(ScrapyCommand):
    """``scrapy bloom``: inspect, size, reset, feed, migrate, dump, restore, watch the filter."""

    requires_project = False
    requires_crawler_process = False

    def syntax(self) -> str:
        """Return the command's syntax."""
        return "COMMAND [options]"

    def short_desc(self) -> str:
        """Return the line ``scrapy -h`` shows."""
        return "Inspect, size, reset, feed, migrate, dump, restore or watch the Bloom filter"

    def long_desc(self) -> str:
        """Return the description ``scrapy bloom -h`` shows."""
        return (
            "Work on the crawl's Bloom filter with the project's settings (and -s NAME=VALUE):"
            " connected and named as a crawl does. Name the filter with --spider NAME"
            " (BLOOMFILTER_KEY's %(spider)s) or --key KEY. Exit status: 0 success, 1 failure,"
            " 2 usage or settings error."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        """Add Scrapy's global options and one subparser per subcommand."""
        super().add_options(parser)
        commands = parser.add_subparsers(dest="bloom_command", metavar="COMMAND", title="commands")
        commands.required = True

        def sub(name: str, text: str, description: str, target: bool = True) -> Any:
            found = commands.add_parser(name, help=text, description=description)
            found.add_argument(
                "-s",
                "--set",
                dest="sub_set",
                action="append",
                default=[],
                metavar="NAME=VALUE",
                help="set/override setting (may be repeated)",
            )
            found.add_argument("--json", action="store_true", help="print the result as JSON")
            if target:
                found.add_argument(
                    "--spider",
                    metavar="NAME",
                    help="the spider whose filter it is: fills in BLOOMFILTER_KEY's %%(spider)s",
                )
                found.add_argument(
                    "--key",
                    type=key_argument,
                    metavar="KEY",
                    help="the filter's key itself (instead of --spider)",
                )
            return found

        sub(
            "info",
            "show the filter: capacity, items, fill, FP rate, memory, backend, workers",
            "Show the filter's record and the state of its bits (a bar chart of the shards'"
            " fill), its counters and live workers. Repairs nothing.",
        )
        sizing = sub(
            "size",
            "sizing calculator: capacity/error rate <-> BIT/HASH_NUMBER, with memory",
            "Say what a crawl creates from the sizing settings, overridden by these options.",
            target=False,
        )
        for name, setting in SIZING_OPTIONS.items():
            if name == "blocked":
                sizing.add_argument("--blocked", **BLOCKED_FLAG)
                continue
            kind: type = float if name == "error_rate" else int
            sizing.add_argument("--" + name.replace("_", "-"), type=kind, help=setting)
        resetting = sub(
            "reset",
            "delete the filter: its record and every part, on every server",
            "Delete the filter's record, shards, counters and server markers. Asks first"
            " unless --yes; refuses while workers hold live leases unless --force.",
        )
        resetting.add_argument("-y", "--yes", action="store_true", help="do not ask")
        resetting.add_argument(
            "--force", action="store_true", help="reset even while workers hold live leases"
        )
        for name, text in (
            ("add", "add fingerprints (or --urls) from files or stdin"),
            ("check", "count how many fingerprints (or --urls) the filter holds"),
        ):
            feeding = sub(name, text, text[0].upper() + text[1:] + ".")
            feeding.add_argument(
                "files",
                nargs="*",
                default=[],
                metavar="FILE",
                help="files of fingerprints (40 hex digits) or URLs, one a line; - or none: stdin",
            )
            feeding.add_argument(
                "--urls",
                action="store_true",
                help="the lines are URLs: fingerprint them as the crawl's dupefilter does",
            )
        migrating = sub(
            "migrate",
            "copy a scrapy-redis fingerprint SET into the filter (resumable)",
            "Copy the fingerprints of scrapy-redis's dupefilter SET into the filter by SSCAN;"
            " an interrupted run continues where it stopped. The SET is left in place.",
        )
        migrating.add_argument(
            "--set-key",
            metavar="KEY",
            help="the SET (default: SCHEDULER_DUPEFILTER_KEY for --spider, %%(spider)s:dupefilter)",
        )
        migrating.add_argument("--restart", action="store_true", help="ignore saved progress")
        migrating.add_argument(
            "--batch",
            type=positive_int,
            default=BATCH,
            metavar="N",
            help="fingerprints per bulk call and per progress save (default: %(default)s)",
        )
        dumping = sub(
            "dump",
            "write the filter to a file (streamed, checksummed)",
            "Write the filter's record, counters and bits to FILE, in checksummed chunks:"
            " memory stays flat whatever its size. Refuses while workers hold live leases"
            " unless --force.",
        )
        dumping.add_argument("file", metavar="FILE", help="the dump file to write")
        dumping.add_argument(
            "--force",
            action="store_true",
            help="dump even while workers add (URLs they add meanwhile may be missing)",
        )
        restoring = sub(
            "restore",
            "restore a dump file as the filter, on any topology",
            "Check FILE whole (every checksum), then write the filter it holds on the servers"
            " the settings name; a refused or failed restore leaves nothing behind.",
        )
        restoring.add_argument("file", metavar="FILE", help="the dump file to read")
        restoring.add_argument(
            "--replace",
            action="store_true",
            help="delete a filter already under the key first (else refused)",
        )
        watching = sub(
            "watch",
            "print live items, fill and FP rate every interval while a crawl runs",
            "Print one line of the filter's live figures every --interval seconds.",
        )
        watching.add_argument(
            "--interval",
            type=seconds_argument,
            default=5.0,
            metavar="SECONDS",
            help="seconds between lines (default: %(default)s)",
        )
        watching.add_argument(
            "--count", type=positive_int, metavar="N", help="stop after N lines (default: never)"
        )

    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        """Apply ``-s`` given before or after the subcommand; refuse stray arguments."""
        opts.set = [*opts.set, *getattr(opts, "sub_set", [])]
        super().process_options(args, opts)
        if not hasattr(ScrapyCommand, "requires_crawler_process"):
            # Scrapy < 2.14 starts a crawler process for every command, whose log says
            # "Scrapy started" before a command's output: this command logs nothing.
            assert self.settings is not None
            self.settings.set("LOG_ENABLED", False, priority="cmdline")
        if args:
            raise ScrapyUsageError(f"unexpected argument(s): {' '.join(args)}", print_help=False)

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        """Run the subcommand; its exit status becomes the command's."""
        assert self.settings is not None
        settings: Settings = self.settings
        FRONTEND.where = "Redis"

        def body() -> int:
            nonlocal settings
            if opts.bloom_command == "size":
                given = {s: getattr(opts, n) for n, s in SIZING_OPTIONS.items()}
                return size.run(opts, Layered(settings, size.overrides(given)))
            settings = _for_spider(settings, opts.spider)
            _resolve_key(opts, settings)
            if opts.bloom_command == "migrate" and opts.set_key is None:
                opts.set_key = _set_key(settings, opts.spider)
            if opts.bloom_command == "reset" and not opts.yes and not stdin_is_tty():
                raise UsageError(
                    "reset deletes the filter and cannot ask for confirmation (stdin is not a"
                    " terminal): pass --yes to confirm."
                )
            ctx = connect(opts, settings, FRONTEND, sizing_from(settings))
            with ctx.stack:
                return _HANDLERS[opts.bloom_command](ctx)

        self.exitcode = guarded(FRONTEND, lambda: settings_secrets(settings), body)


def _for_spider(settings: Settings, name: str | None) -> Settings:
    """Return the settings a crawl of spider ``name`` runs with: its custom_settings applied.

    Inside a project, a name no spider has is refused (a typo would name another
    filter); outside one, any name is taken as it is.
    """
    if name is None:
        return settings
    try:
        from scrapy.spiderloader import get_spider_loader

        loader: Any = get_spider_loader(settings)
    except ImportError:  # an older Scrapy, without get_spider_loader
        loader = load_object(settings["SPIDER_LOADER_CLASS"]).from_settings(settings.frozencopy())
    known = loader.list()
    if name not in known:
        if known:
            raise UsageError(
                f"No spider named {name!r} in this project (it has: {', '.join(sorted(known))}):"
                " give one of them to --spider, or the filter's key to --key."
            )
        return settings
    spidercls = loader.load(name)
    updated = settings.copy()
    spidercls.update_settings(updated)
    return updated


def _resolve_key(opts: argparse.Namespace, settings: Settings) -> None:
    """Set ``opts.key`` to the filter's key: ``--key``, else BLOOMFILTER_KEY for ``--spider``."""
    try:
        config = BloomConfig.from_settings(settings)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if opts.key is not None:
        return
    if opts.spider is None and "%(spider)s" in config.key:
        raise UsageError(
            f"Which filter? BLOOMFILTER_KEY ({config.key!r}) names one per spider: give"
            " --spider NAME, or the filter's key with --key."
        )
    try:
        opts.key = config.key_for(opts.spider)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _set_key(settings: Settings, spider: str | None) -> str:
    """Return the SET scrapy-redis's dupefilter keeps for the spider (SCHEDULER_DUPEFILTER_KEY)."""
    from scrapy_redis import defaults

    template = str(settings.get("SCHEDULER_DUPEFILTER_KEY") or defaults.SCHEDULER_DUPEFILTER_KEY)
    if "%(spider)s" in template and spider is None:
        raise UsageError(
            f"Which SET? SCHEDULER_DUPEFILTER_KEY ({template!r}) names one per spider: give"
            " --spider NAME, or the SET's key with --set-key."
        )
    return template % {"spider": spider or ""}

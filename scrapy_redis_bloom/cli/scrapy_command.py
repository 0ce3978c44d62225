"""``scrapy bloom COMMAND``: the operations commands, run with the project's settings.

The filter is reached and named as a crawl does: ``BLOOMFILTER_KEY`` for ``--spider NAME``
(whose ``custom_settings`` apply), or ``--key``.
"""

from __future__ import annotations

import argparse
from typing import Any

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError as ScrapyUsageError
from scrapy.settings import Settings
from scrapy.utils.misc import load_object

from scrapy_redis_bloom.cli.context import (
    Frontend,
    UsageError,
    config_of,
    guarded,
    run_command,
    settings_secrets,
)
from scrapy_redis_bloom.cli.figures import size, size_overrides
from scrapy_redis_bloom.cli.options import (
    add_commands,
    missing_command,
    setting_of_flag,
    sizing_from,
    sizing_given,
)

FRONTEND = Frontend(prog="scrapy bloom")


class BloomCommand(ScrapyCommand):
    """``scrapy bloom``: inspect, size, reset, feed, migrate, dump, restore, watch the filter."""

    requires_project = False
    requires_crawler_process = False
    #: What an option of the alias given here says (:meth:`process_options`); "" if none.
    misplaced = ""

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
            " 2 usage or settings error, 130 interrupted (Ctrl-C; watch stops on it with 0)."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        """Add Scrapy's global options and one subparser per subcommand."""
        super().add_options(parser)
        # prog: else Scrapy's usage line ("scrapy bloom COMMAND [options]") would start theirs
        add_commands(parser, "scrapy", dest="bloom_command", title="commands", prog=FRONTEND.prog)

    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        """Apply ``-s`` given before or after the subcommand; refuse stray arguments."""
        if opts.bloom_command is None:
            raise ScrapyUsageError(missing_command("scrapy", FRONTEND.prog), print_help=False)
        opts.set = [*opts.set, *getattr(opts, "sub_set", [])]
        super().process_options(args, opts)
        if not hasattr(ScrapyCommand, "requires_crawler_process"):
            # Scrapy < 2.14's crawler process would log "Scrapy started" before the output.
            assert self.settings is not None
            self.settings.set("LOG_ENABLED", False, priority="cmdline")
        # An option of the alias (--capacity N) is said in one line, as the command's errors.
        self.misplaced = next(
            (
                f"{arg.partition('=')[0]} is an option of the scrapy-redis-bloom command, not of"
                f" scrapy bloom {opts.bloom_command}, which reads the project's settings: give"
                f" -s {name}=VALUE"
                for arg in args
                if (name := setting_of_flag(arg, opts.bloom_command))
            ),
            "",
        )
        if args and not self.misplaced:
            raise ScrapyUsageError(f"unexpected argument(s): {' '.join(args)}", print_help=False)

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        """Run the subcommand; its exit status becomes the command's."""
        assert self.settings is not None
        settings: Settings = self.settings

        def body() -> int:
            nonlocal settings
            if self.misplaced:
                raise UsageError(self.misplaced)
            if opts.bloom_command == "size":  # the options override, None unsetting
                updated = settings.copy()
                updated.setdict(size_overrides(sizing_given(opts)), priority="cmdline")
                return size(opts, updated)
            settings = _for_spider(settings, opts.spider)
            _resolve_key(opts, settings)
            if opts.bloom_command == "migrate" and opts.set_key is None:
                opts.set_key = _set_key(settings, opts.spider)
            return run_command(opts, settings, FRONTEND, sizing_from(settings))

        self.exitcode = guarded(FRONTEND, lambda: settings_secrets(settings), body)


def _for_spider(settings: Settings, name: str | None) -> Settings:
    """Return the settings a crawl of spider ``name`` runs with: its custom_settings applied.

    Inside a project, a name no spider has is refused: a typo would name another filter.
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
    updated = settings.copy()
    loader.load(name).update_settings(updated)
    return updated


def _resolve_key(opts: argparse.Namespace, settings: Settings) -> None:
    """Set ``opts.key`` to the filter's key: ``--key``, else BLOOMFILTER_KEY for ``--spider``."""
    config = config_of(settings)
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

"""The table of the commands and their options, declared once for both front ends."""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from scrapy_redis_bloom.cli.contents import (
    SCRAPY_REDIS_CONNECTION,
    add,
    check,
    dump,
    migrate,
    reset,
    restore,
)
from scrapy_redis_bloom.cli.context import DEFAULT_RETRY_TIMEOUT, Context, Frontend, config_of
from scrapy_redis_bloom.cli.figures import info, watch
from scrapy_redis_bloom.cli.streams import BATCH
from scrapy_redis_bloom.core.settings import (
    WORKER_TTL,
    BloomConfig,
    SettingsLike,
    check_url,
    key_problem,
    setting,
)
from scrapy_redis_bloom.transport.connection import url_address

#: Where the alias connects without ``--redis-url`` (and without ``$REDIS_URL``).
DEFAULT_REDIS_URL = "redis://localhost:6379"
#: The alias's socket timeout of each Redis command, in seconds.
DEFAULT_TIMEOUT = 30.0

Front = Literal["scrapy", "alias"]


def key_argument(value: str) -> str:
    """Validate ``--key``: a literal Redis key, not a settings template."""
    if "%(spider)s" in value:
        raise argparse.ArgumentTypeError(
            f"{value!r} is the BLOOMFILTER_KEY template: give the key with the spider's name"
            f" filled in, e.g. {value.replace('%(spider)s', 'myspider')!r}"
        )
    if (why := key_problem(value)) is not None:  # (the keys' rules: the settings' own)
        raise argparse.ArgumentTypeError(f"{value!r} cannot name Redis keys. {why}")
    return value


def number_argument(
    value: str, kind: type[float] = float, zero_ok: bool = False, most: float = math.inf
) -> float:
    """Parse a finite number (``kind`` int: a whole one): positive, or also 0 if ``zero_ok``."""
    what = "whole number" if kind is int else "number"
    try:
        number = kind(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a {what}: {value!r}") from None
    if not (math.isfinite(number) and (number > 0 or (zero_ok and number == 0))):
        which = "non-negative" if zero_ok else "positive"
        raise argparse.ArgumentTypeError(f"must be a {which} {what}, got {value!r}")
    if number > most:
        bound = f"{int(most):,}" if float(most).is_integer() else str(most)
        raise argparse.ArgumentTypeError(f"must be at most {bound}, got {value!r}")
    return number


def url_argument(value: str) -> str:
    """Validate a Redis URL given as an option, as redis-py will read it (no password shown)."""
    try:
        return check_url("URL", value, url_address(value))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).partition(" is invalid. ")[2]) from None


positive_int = functools.partial(number_argument, kind=int)
#: The most seconds of ``--timeout`` and ``--interval``: a day.
MAX_SECONDS = 86_400
#: The most fingerprints of ``--batch``: ten times the default, about 1.5 GB of memory.
MAX_BATCH = 10 * BATCH


@dataclass(frozen=True, slots=True)
class Command:
    """A subcommand: its name in ``scrapy bloom`` and in the alias (None: not there)."""

    name: str
    alias: str | None
    handler: Callable[[Context], int] | None
    help: str
    description: str


#: The subcommands the alias has too, by its names; the handlers, by their commands' names.
_ALIASES = dict(info="info", reset="reset", add="add", check="check", migrate="migrate-set")
_HANDLERS = {h.__name__: h for h in (info, reset, add, check, migrate, dump, restore, watch)}


def _command(name: str, help: str, description: str) -> Command:
    return Command(name, _ALIASES.get(name), _HANDLERS.get(name), help, description)


COMMANDS = (
    _command(
        "info",
        "show the filter: capacity, items, fill, FP rate, memory, backend, workers",
        "Show the filter's configuration (from its record) and the state of its bits: bits"
        " set, fill ratio (a bar chart of the shards' fill), estimated items and"
        " false-positive rate now, its counters and live workers. Repairs nothing.",
    ),
    _command(
        "size",
        "sizing calculator: capacity/error rate <-> BIT/HASH_NUMBER, with memory",
        "Say what a crawl creates from the sizing settings, overridden by these options.",
    ),
    _command(
        "reset",
        "delete the filter: its record and every part, on every server",
        "Delete the filter's record, shards, counters and server markers, forgetting every"
        " request it has seen. Stop the crawl first: a filter with live workers (see info)"
        " is refused unless --force. Asks for confirmation on a terminal; otherwise pass"
        " --yes. A filter that does not exist is not an error.",
    ),
    _command(
        "add",
        "add fingerprints from files or stdin",
        "Add request fingerprints to the filter and count those new and those already"
        " present (a false positive counts as present).",
    ),
    _command(
        "check",
        "count how many fingerprints the filter holds",
        "Count the fingerprints the filter (probably) holds. Changes nothing.",
    ),
    _command(
        "migrate",
        "copy a scrapy-redis dupefilter SET into the filter (resumable)",
        "Copy the fingerprints of scrapy-redis's dupefilter SET into the filter by SSCAN, in"
        " batches; an interrupted run continues where it stopped. The SET is left in place.",
    ),
    _command(
        "dump",
        "write the filter to a file (streamed, checksummed)",
        "Write the filter's record, counters and bits to FILE, in checksummed chunks:"
        " memory stays flat whatever its size. Refuses while workers hold live leases"
        " unless --force.",
    ),
    _command(
        "restore",
        "restore a dump file as the filter, on any topology",
        "Check FILE whole (every checksum), then write the filter it holds on the servers"
        " the settings name; a refused or failed restore leaves nothing behind.",
    ),
    _command(
        "watch",
        "print live items, fill and FP rate every interval while a crawl runs",
        "Print one line of the filter's live figures every --interval seconds, --count times"
        " or until Ctrl-C (which stops it with exit status 0).",
    ),
)

#: The subcommands that work on a filter in Redis (all but ``size``), by ``scrapy bloom``'s names.
ON_FILTER = "info reset add check migrate dump restore watch"
#: The subcommands (``scrapy bloom``'s | the alias's) of the connection and sizing options.
CONNECTING = "| " + ON_FILTER
SIZED = "size | add migrate"
#: Titles of the help's sections.
WHERE = "where the filter lives (as the crawl's settings)"
SIZING = "sizing (to create a missing filter; checked against an existing one)"


@dataclass(frozen=True, slots=True)
class Option:
    """An option as argparse takes it, the subcommands that take it, and its alias setting."""

    flags: tuple[str, ...]
    scrapy: tuple[str, ...]
    alias: tuple[str, ...]
    kwargs: dict[str, Any]
    in_alias: dict[str, Any] = field(default_factory=dict)
    group: str | None = None
    setting: str = ""


def option(flags: str, commands: str, help: str, **kwargs: Any) -> Option:
    """Declare an option: flags, then its metavar if in capitals; ``commands``: its subcommands.

    Those of ``scrapy bloom``, then ``|`` and those of the alias, as words.
    """
    words = flags.split()
    if words[-1].isupper():
        kwargs["metavar"] = words.pop()
    scrapy, _, alias = commands.partition("|")
    ours = {name: kwargs.pop(name) for name in ("in_alias", "group", "setting") if name in kwargs}
    return Option(
        tuple(words), tuple(scrapy.split()), tuple(alias.split()), {"help": help, **kwargs}, **ours
    )


def switch(flags: str, commands: str, help: str, **kwargs: Any) -> Option:
    """Declare an option that is off unless given (``store_true``)."""
    return option(flags, commands, help, action="store_true", **kwargs)


def sizing(flags: str) -> Option:
    """Declare a sizing option of ``size`` and of the alias's ``add`` and ``migrate-set``."""
    flag = flags.split()[0]
    row = setting("BLOOMFILTER_" + flag.removeprefix("--").replace("-", "_").upper())
    # Read as the setting reads it (``1e3``, ``1_000``), its refusal in the option's words.
    return option(flags, SIZED, row.summary(), group=SIZING, setting=row.name)


#: The alias's TLS files: each option, the client argument it gives, and what the file is.
TLS_FILES = (
    ("--tls-ca-cert", "ssl_ca_certs", "CA certificate(s) (PEM) to verify a rediss:// server with"),
    ("--tls-cert", "ssl_certfile", "client certificate (PEM) for servers that require one"),
    ("--tls-key", "ssl_keyfile", "the client certificate's private key"),
)

#: Every option and argument of the subcommands, as :func:`option` declares it.
OPTIONS = (
    option(
        "-s --set NAME=VALUE",
        ON_FILTER + " size |",
        "set/override setting (may be repeated)",
        dest="sub_set",
        action="append",
        default=[],
    ),
    option(
        "--redis-url URL",
        CONNECTING,
        "Redis URL; give it several times for a server list, in the crawl's order"
        " (BLOOMFILTER_REDIS_URLS: shard i on server i mod n). Default: $REDIS_URL, else"
        f" {DEFAULT_REDIS_URL}",
        action="append",
        group=WHERE,
        setting="BLOOMFILTER_REDIS_URL",
    ),
    switch(
        "--cluster",
        CONNECTING,
        "the --redis-url is a node of a Redis Cluster (BLOOMFILTER_REDIS_CLUSTER)",
        group=WHERE,
        setting="BLOOMFILTER_REDIS_CLUSTER",
    ),
    *(
        option(f"{flag} FILE", CONNECTING, f"{what} ({param})", group=WHERE)
        for flag, param, what in TLS_FILES
    ),
    option(
        "--spider NAME",
        ON_FILTER + " |",
        "the spider whose filter it is: fills in BLOOMFILTER_KEY's %%(spider)s (or give --key)",
    ),
    option(
        "--key KEY",
        f"{ON_FILTER} | {ON_FILTER}",
        "the filter's key: BLOOMFILTER_KEY with the spider's name filled in,"
        " e.g. myspider:bloomfilter",
        type=key_argument,
        in_alias={"required": True},
    ),
    switch("--json", f"{ON_FILTER} size | {ON_FILTER}", "print the result as JSON"),
    option(
        "--timeout SECONDS",
        CONNECTING,
        f"socket timeout of each Redis command, at most {MAX_SECONDS:,} (default: %(default)s)",
        type=functools.partial(number_argument, most=MAX_SECONDS),
        default=DEFAULT_TIMEOUT,
    ),
    option(
        "--retry-timeout SECONDS",
        CONNECTING,
        "how long a failing Redis command is retried, 0 for once"
        " (BLOOMFILTER_RETRY_TIMEOUT; default: %(default)s)",
        type=functools.partial(number_argument, zero_ok=True),
        default=DEFAULT_RETRY_TIMEOUT,
        setting="BLOOMFILTER_RETRY_TIMEOUT",
    ),
    option(
        "--worker-ttl SECONDS",
        CONNECTING,
        "the crawl's BLOOMFILTER_WORKER_TTL: how long a worker's lease lasts, so how long a"
        " restarted server is waited for to list every live worker (default: %(default)s)",
        type=number_argument,
        default=WORKER_TTL.default,
        setting=WORKER_TTL.name,
    ),
    switch("-v --verbose", CONNECTING, "log what the engine does on stderr"),
    sizing("--capacity N"),
    sizing("--error-rate P"),
    sizing("--bit B"),
    sizing("--hash-number K"),
    sizing("--shard-bit S"),
    sizing("--shards N"),
    sizing("--expansion E"),
    sizing("--ttl SECONDS"),
    option(
        "--blocked",
        SIZED,
        "BLOOMFILTER_BLOCKED: each URL's bits in one 512-bit block, a new bitmap filter's"
        " default; --no-blocked for the classic (unblocked) layout",
        action=argparse.BooleanOptionalAction,
        group=SIZING,
        setting="BLOOMFILTER_BLOCKED",
    ),
    switch("-y --yes", "reset | reset", "do not ask for confirmation"),
    switch("--force", "reset | reset", "reset even while workers hold live leases"),
    option(
        "files FILE",
        "add check | add check",
        "files of fingerprints (40 hex digits), one a line; - for stdin, which is read when no"
        " FILE is given",
        nargs="*",
        default=[],
    ),
    switch(
        "--urls",
        "add check |",
        "the lines are URLs: fingerprint them as the crawl's dupefilter does",
    ),
    option(
        "--set-key KEY",
        "migrate | migrate",
        "the SET (default: SCHEDULER_DUPEFILTER_KEY for --spider, %%(spider)s:dupefilter)",
        in_alias={"required": True, "help": "the SET to read, e.g. myspider:dupefilter"},
    ),
    option(
        "--set-redis-url URL",
        "migrate | migrate",
        "the Redis of the SET (default: scrapy-redis's connection, REDIS_URL and REDIS_PARAMS,"
        " where its dupefilter keeps the SET; the filter's may be another)",
        type=url_argument,
        default=SCRAPY_REDIS_CONNECTION,
        in_alias={
            "default": None,
            "help": "the Redis of the SET (default: the filter's first --redis-url, or its"
            " cluster)",
        },
    ),
    switch(
        "--restart",
        "migrate | migrate",
        "start over, ignoring the progress marker an interrupted run left",
    ),
    option(
        "--batch N",
        "migrate | migrate",
        "fingerprints per bulk call, and between two saves of the progress marker"
        f" (at most {MAX_BATCH:,}; default: %(default)s)",
        type=functools.partial(positive_int, most=MAX_BATCH),
        default=BATCH,
    ),
    option("file", "dump restore |", "the dump file to write (dump) or read (restore)"),
    switch(
        "--force", "dump |", "dump even while workers add (URLs they add meanwhile may be missing)"
    ),
    switch("--replace", "restore |", "delete a filter already under the key first (else refused)"),
    option(
        "--interval SECONDS",
        "watch |",
        f"seconds between lines, at most {MAX_SECONDS:,} (default: %(default)s)",
        type=functools.partial(number_argument, most=MAX_SECONDS),
        default=5.0,
    ),
    option("--count N", "watch |", "stop after N lines (default: never)", type=positive_int),
)


def add_commands(parser: argparse.ArgumentParser, front: Front, **subparsers: Any) -> None:
    """Add the subcommands of ``front`` to ``parser``; a command line without one parses."""
    commands = parser.add_subparsers(metavar="COMMAND", required=False, **subparsers)
    for command, name in _named(front):
        sub = commands.add_parser(name, help=command.help, description=command.description)
        sub.set_defaults(handler=command.handler)
        groups: dict[str | None, Any] = {None: sub}
        for spec in OPTIONS:
            if command.name not in (spec.scrapy if front == "scrapy" else spec.alias):
                continue
            if spec.group not in groups:
                groups[spec.group] = sub.add_argument_group(spec.group)
            kwargs = {**spec.kwargs, **(spec.in_alias if front == "alias" else {})}
            groups[spec.group].add_argument(*spec.flags, **kwargs)


def _named(front: Front) -> list[tuple[Command, str]]:
    return [(c, name) for c in COMMANDS if (name := c.name if front == "scrapy" else c.alias)]


def missing_command(front: Front, prog: str) -> str:
    """Return the usage error of a command line without a command: the commands, one a line."""
    named = _named(front)
    width = max(len(name) for _, name in named)
    lines = [f"  {name:<{width}}  {command.help}" for command, name in named]
    head = "give a command, one of:"
    return "\n".join([head, *lines, f"See '{prog} COMMAND --help' for a command's options."])


def setting_of_flag(flag: str, command: str) -> str | None:
    """Return the setting of an alias option ``scrapy bloom COMMAND`` does not take, or None.

    ``--capacity N`` stands for ``-s BLOOMFILTER_CAPACITY=N`` there.
    """
    name = flag.partition("=")[0]
    for spec in OPTIONS:
        if name in spec.flags and command not in spec.scrapy and spec.setting:
            return spec.setting
    return None


def sizing_from(settings: SettingsLike, frontend: Frontend | None = None) -> BloomConfig | None:
    """Return the configuration the sizing settings describe; None when none sizes the filter."""
    names = [spec.setting for spec in OPTIONS if spec.group == SIZING]
    if all(settings.get(name) is None for name in names if name != "BLOOMFILTER_BLOCKED"):
        return None
    return config_of(settings, frontend)


def sizing_given(args: argparse.Namespace) -> dict[str, Any]:
    """Return the sizing settings given as options: setting -> value."""
    flags = {spec.setting: spec.flags[0] for spec in OPTIONS if spec.group == SIZING}
    values = {name: getattr(args, flag[2:].replace("-", "_"), None) for name, flag in flags.items()}
    return {name: value for name, value in values.items() if value is not None}

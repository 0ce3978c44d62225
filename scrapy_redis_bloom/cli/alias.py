"""``scrapy-redis-bloom`` (and ``python -m scrapy_redis_bloom``): the commands without Scrapy's.

The command line of earlier releases, kept as an alias of ``scrapy bloom``: its
flags become the crawl settings they stand for (``--redis-url`` once is
``BLOOMFILTER_REDIS_URL``, several times ``BLOOMFILTER_REDIS_URLS`` in order,
``--cluster`` is ``BLOOMFILTER_REDIS_CLUSTER``, ``--capacity`` is
``BLOOMFILTER_CAPACITY``...), then the same subcommand modules run. Without
``--redis-url``: the ``REDIS_URL`` environment variable, else
``redis://localhost:6379``. Messages name the flags instead of the settings.

Commands: ``info``, ``reset``, ``add``, ``check``, ``migrate-set`` (``scrapy bloom
migrate``). Exit status: 0 on success (``reset`` of a filter that does not exist
included); 1 when the work could not be done; 2 for a usage error; 130 when
interrupted. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
from importlib.metadata import version
from typing import Any, NoReturn

from scrapy_redis_bloom.cli import feed, info, migrate, reset
from scrapy_redis_bloom.cli.context import (
    DEFAULT_RETRY_TIMEOUT,
    EXIT_OK,
    Frontend,
    UsageError,
    connect,
    describe,
    guarded,
    sizing_from,
)
from scrapy_redis_bloom.cli.inputs import BATCH
from scrapy_redis_bloom.cli.output import stdin_is_tty
from scrapy_redis_bloom.core.redact import url_secrets
from scrapy_redis_bloom.transport.connection import DEFAULT_PARAMS

PROG = "scrapy-redis-bloom"
DEFAULT_REDIS_URL = "redis://localhost:6379"
DEFAULT_TIMEOUT = 30.0

_SETTING = re.compile(r"\bBLOOMFILTER_[A-Z_]+\b")

#: Sizing options: option name -> the BLOOMFILTER_* setting it stands for.
SIZING_OPTIONS = {
    "capacity": "BLOOMFILTER_CAPACITY",
    "error_rate": "BLOOMFILTER_ERROR_RATE",
    "bit": "BLOOMFILTER_BIT",
    "hash_number": "BLOOMFILTER_HASH_NUMBER",
    "shard_bit": "BLOOMFILTER_SHARD_BIT",
    "shards": "BLOOMFILTER_SHARDS",
    "expansion": "BLOOMFILTER_EXPANSION",
    "ttl": "BLOOMFILTER_TTL",
    "blocked": "BLOOMFILTER_BLOCKED",
}
#: The ``--blocked`` flag: BLOOMFILTER_BLOCKED = True when given, the settings' otherwise.
BLOCKED_FLAG: dict[str, Any] = {
    "action": "store_const",
    "const": True,
    "help": "BLOOMFILTER_BLOCKED (each URL's bits in one 512-bit block)",
}
#: Other settings named in messages from the configuration and the engine.
_OTHER_OPTIONS = {
    "BLOOMFILTER_REDIS_URL": "--redis-url",
    "BLOOMFILTER_REDIS_URLS": "--redis-url",
    "BLOOMFILTER_REDIS_CLUSTER": "--cluster",
    "BLOOMFILTER_RETRY_TIMEOUT": "--retry-timeout",
}


def option_names(message: str) -> str:
    """Name the command-line options in a message about BLOOMFILTER_* settings."""
    options = {setting: "--" + name.replace("_", "-") for name, setting in SIZING_OPTIONS.items()}
    options.update(_OTHER_OPTIONS)

    def rename(match: re.Match[str]) -> str:
        return options.get(match.group(0), match.group(0))

    return _SETTING.sub(rename, message.replace(" setting ", " option "))


FRONTEND = Frontend(
    prog=PROG,
    rename=option_names,
    cluster_hint="pass --cluster, with the URL of one node as --redis-url",
)


class _ArgumentParser(argparse.ArgumentParser):
    """An argument parser that reports errors as a :class:`UsageError`, not by exiting."""

    def error(self, message: str) -> NoReturn:
        """Raise the usage error; :func:`main` prints it as one line."""
        raise UsageError(f"{message} (see '{self.prog} --help')")


def key_argument(value: str) -> str:
    """Validate ``--key``: a literal Redis key, not a settings template."""
    if not value:
        raise argparse.ArgumentTypeError("the key must not be empty")
    if "%(spider)s" in value:
        raise argparse.ArgumentTypeError(
            f"{value!r} is the BLOOMFILTER_KEY template: give the key with the spider's name"
            f" filled in, e.g. {value.replace('%(spider)s', 'myspider')!r}"
        )
    if "{" in value or "}" in value:
        raise argparse.ArgumentTypeError(
            f"{value!r} contains {{ or }}, which no filter's key does (its shards' Redis"
            " Cluster hash tags derive from it)"
        )
    return value


def seconds_argument(value: str, zero_ok: bool = False) -> float:
    """Parse a finite number of seconds: positive, or also 0 if ``zero_ok``."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not (math.isfinite(number) and (number > 0 or (zero_ok and number == 0))):
        which = "non-negative" if zero_ok else "positive"
        raise argparse.ArgumentTypeError(f"must be a {which} number, got {value!r}")
    return number


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of all commands."""
    common = _ArgumentParser(add_help=False)
    where = common.add_argument_group("where the filter lives (as the crawl's settings)")
    where.add_argument(
        "--redis-url",
        action="append",
        metavar="URL",
        help="Redis URL; give it several times for a server list, in the crawl's order"
        " (BLOOMFILTER_REDIS_URLS: shard i on server i mod n). Default: $REDIS_URL, else"
        f" {DEFAULT_REDIS_URL}",
    )
    where.add_argument(
        "--cluster",
        action="store_true",
        help="the --redis-url is a node of a Redis Cluster (BLOOMFILTER_REDIS_CLUSTER)",
    )
    where.add_argument(
        "--tls-ca-cert",
        metavar="FILE",
        help="CA certificate(s) (PEM) to verify a rediss:// server with (ssl_ca_certs)",
    )
    where.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="client certificate (PEM) for servers that require one (ssl_certfile)",
    )
    where.add_argument(
        "--tls-key", metavar="FILE", help="the client certificate's private key (ssl_keyfile)"
    )
    common.add_argument(
        "--key",
        required=True,
        type=key_argument,
        help="the filter's key: BLOOMFILTER_KEY with the spider's name filled in,"
        " e.g. myspider:bloomfilter",
    )
    common.add_argument("--json", action="store_true", help="print the result as JSON")
    common.add_argument(
        "--timeout",
        type=seconds_argument,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="socket timeout of each Redis command (default: %(default)s)",
    )
    common.add_argument(
        "--retry-timeout",
        type=lambda value: seconds_argument(value, zero_ok=True),
        default=DEFAULT_RETRY_TIMEOUT,
        metavar="SECONDS",
        help="how long a failing Redis command is retried, 0 for once"
        " (BLOOMFILTER_RETRY_TIMEOUT; default: %(default)s)",
    )
    common.add_argument(
        "-v", "--verbose", action="store_true", help="log what the engine does on stderr"
    )
    sizing = _ArgumentParser(add_help=False)
    group = sizing.add_argument_group(
        "sizing (to create a missing filter; checked against an existing one)"
    )
    group.add_argument("--capacity", type=int, metavar="N", help="BLOOMFILTER_CAPACITY")
    group.add_argument("--error-rate", type=float, metavar="P", help="BLOOMFILTER_ERROR_RATE")
    group.add_argument("--bit", type=int, metavar="B", help="BLOOMFILTER_BIT (m = 2**B bits)")
    group.add_argument("--hash-number", type=int, metavar="K", help="BLOOMFILTER_HASH_NUMBER")
    group.add_argument("--shard-bit", type=int, metavar="S", help="BLOOMFILTER_SHARD_BIT")
    group.add_argument("--shards", type=int, metavar="N", help="BLOOMFILTER_SHARDS")
    group.add_argument(
        "--expansion", type=int, metavar="E", help="BLOOMFILTER_EXPANSION (default 2; 0: fixed)"
    )
    group.add_argument(
        "--ttl", type=int, metavar="SECONDS", help="BLOOMFILTER_TTL (default 0: forever)"
    )
    group.add_argument("--blocked", **BLOCKED_FLAG)

    files = _ArgumentParser(add_help=False)
    files.add_argument(
        "files",
        nargs="*",
        default=[],
        metavar="FILE",
        help="files of fingerprints, 40 hex digits per line; - for stdin, which is read"
        " when no FILE is given",
    )

    parser = _ArgumentParser(
        prog=PROG,
        description="Inspect, reset and feed scrapy-redis-bloom filters in Redis.",
        epilog="Exit status: 0 success, 1 failure, 2 usage error.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {version('scrapy-redis-bloom')}"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    showing = commands.add_parser(
        "info",
        parents=[common],
        help="show a filter's configuration, fill and false-positive rate",
        description="Show a filter's configuration (from its record) and the state of"
        " its bits: bits set, fill ratio, estimated items and false-positive rate now.",
    )
    showing.set_defaults(handler=info.run)

    resetting = commands.add_parser(
        "reset",
        parents=[common],
        help="delete a filter: its record and every shard",
        description="Delete a filter's config record and shards, forgetting every request"
        " it has seen. Stop the crawl first: a filter with live workers (see info) is"
        " refused unless --force. Asks for confirmation on a terminal; otherwise pass"
        " --yes. A filter that does not exist is not an error.",
    )
    resetting.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    resetting.add_argument(
        "--force", action="store_true", help="reset even while workers hold live leases"
    )
    resetting.set_defaults(handler=reset.run)

    adding = commands.add_parser(
        "add",
        parents=[common, sizing, files],
        help="add fingerprints from files or stdin",
        description="Add request fingerprints to a filter and count those new and those"
        " already present (a false positive counts as present).",
    )
    adding.set_defaults(handler=feed.add)

    checking = commands.add_parser(
        "check",
        parents=[common, files],
        help="count how many fingerprints a filter holds",
        description="Count the fingerprints a filter (probably) holds. Changes nothing.",
    )
    checking.set_defaults(handler=feed.check)

    migrating = commands.add_parser(
        "migrate-set",
        parents=[common, sizing],
        help="copy a scrapy-redis dupefilter SET into a filter",
        description="Copy the fingerprints of a scrapy-redis dupefilter SET into a filter,"
        " by SSCAN in batches. The set is left in place.",
    )
    migrating.add_argument(
        "--set-key",
        required=True,
        metavar="KEY",
        help="the SET to read, e.g. myspider:dupefilter",
    )
    migrating.add_argument(
        "--restart",
        action="store_true",
        help="start over, ignoring the progress marker an interrupted run left",
    )
    migrating.add_argument(
        "--batch",
        type=positive_int,
        default=BATCH,
        metavar="N",
        help="fingerprints per bulk call, and between two saves of the progress marker"
        " (default: %(default)s)",
    )
    migrating.set_defaults(handler=migrate.run)
    return parser


def positive_int(value: str) -> int:
    """Parse a positive whole number."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {value!r}")
    return number


def _urls(args: argparse.Namespace) -> list[str]:
    """Return the URLs given, else ``$REDIS_URL``, else the default."""
    given: list[str] = args.redis_url or []
    return given or [os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL]


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """Translate the connection, retry and sizing flags into the crawl settings they mean."""
    urls = _urls(args)
    if args.cluster and len(urls) != 1:
        raise UsageError(
            "--cluster takes one --redis-url: the URL of one node of the cluster to start"
            " from (the client discovers the others)."
        )
    connect_timeout = min(args.timeout, float(DEFAULT_PARAMS["socket_connect_timeout"]))
    params: dict[str, Any] = {
        "socket_timeout": args.timeout,
        "socket_connect_timeout": connect_timeout,
    }
    # TLS files, passed as a crawl passes them in BLOOMFILTER_REDIS_PARAMS.
    tls_options = (
        ("--tls-ca-cert", args.tls_ca_cert, "ssl_ca_certs"),
        ("--tls-cert", args.tls_cert, "ssl_certfile"),
        ("--tls-key", args.tls_key, "ssl_keyfile"),
    )
    for option, path, param in tls_options:
        if path is None:
            continue
        if not all(url.startswith("rediss://") for url in urls):
            raise UsageError(f"{option} needs a rediss:// URL (Redis over TLS) in --redis-url.")
        if not os.path.isfile(path):
            raise UsageError(f"{option}: no such file: {path}")
        params[param] = path
    if args.tls_key is not None and args.tls_cert is None:
        raise UsageError("--tls-key needs --tls-cert: the client certificate it belongs to.")
    settings: dict[str, Any] = {
        "BLOOMFILTER_REDIS_CLUSTER": args.cluster,
        "BLOOMFILTER_REDIS_PARAMS": params,
        "BLOOMFILTER_RETRY_TIMEOUT": args.retry_timeout,
    }
    if len(urls) == 1:
        settings["BLOOMFILTER_REDIS_URL"] = urls[0]
    else:
        settings["BLOOMFILTER_REDIS_URLS"] = urls
    for name, setting in SIZING_OPTIONS.items():
        if getattr(args, name, None) is not None:
            settings[setting] = getattr(args, name)
    return settings


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    secrets: list[str] = url_secrets(os.environ.get("REDIS_URL", ""))
    FRONTEND.where = "Redis"

    def body() -> int:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help, --version
            return exc.code if isinstance(exc.code, int) else EXIT_OK
        if args.verbose:
            logging.getLogger(__package__.rpartition(".")[0]).setLevel(logging.DEBUG)
        urls = _urls(args)
        for url in urls:
            secrets[:0] = url_secrets(url)
        FRONTEND.where = describe(urls, args.cluster)[0]
        if args.command == "reset" and not args.yes and not stdin_is_tty():
            raise UsageError(
                "reset deletes the filter and cannot ask for confirmation (stdin is not a"
                " terminal): pass --yes to confirm."
            )
        settings = settings_of(args)
        sizing = {name: settings[name] for name in SIZING_OPTIONS.values() if name in settings}
        ctx = connect(args, settings, FRONTEND, sizing_from(sizing, option_names))
        with ctx.stack:
            code: int = args.handler(ctx)
            return code

    return guarded(FRONTEND, lambda: secrets, body)

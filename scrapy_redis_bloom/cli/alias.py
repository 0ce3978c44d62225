"""``scrapy-redis-bloom`` (and ``python -m scrapy_redis_bloom``): the commands without Scrapy's.

The servers and sizing are flags, each becoming the crawl setting it stands for; messages name
the flags.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import ssl
from importlib.metadata import version
from typing import Any, NoReturn

from scrapy_redis_bloom.cli.context import (
    EXIT_OK,
    EXIT_USAGE,
    Frontend,
    UsageError,
    describe,
    err,
    guarded,
    run_command,
)
from scrapy_redis_bloom.cli.options import (
    DEFAULT_REDIS_URL,
    OPTIONS,
    TLS_FILES,
    add_commands,
    missing_command,
    sizing_from,
    sizing_given,
)
from scrapy_redis_bloom.core.errors import TLS_PARAMS
from scrapy_redis_bloom.core.redact import url_secrets
from scrapy_redis_bloom.transport.connection import DEFAULT_PARAMS

PROG = "scrapy-redis-bloom"

#: The settings the alias's options stand for, and the option that names each.
_OPTION_OF = {
    **{spec.setting: spec.flags[-1] for spec in OPTIONS if spec.alias and spec.setting},
    "BLOOMFILTER_REDIS_URLS": "--redis-url",
    "BLOOMFILTER_KEY": "--key",
    TLS_PARAMS: ", ".join(option for option, _, _ in TLS_FILES),
}

FRONTEND = Frontend(
    prog=PROG,
    name=lambda setting: _OPTION_OF.get(setting, setting),
    word="option",
    cluster_hint="pass --cluster, with the URL of one node as --redis-url",
)


class _ArgumentParser(argparse.ArgumentParser):
    """An argument parser that reports errors as a :class:`UsageError`, not by exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of all commands."""
    parser = _ArgumentParser(
        prog=PROG,
        description="Inspect, reset and feed scrapy-redis-bloom filters in Redis.",
        epilog="Exit status: 0 success, 1 failure, 2 usage error, 130 interrupted (Ctrl-C).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version(PROG)}")
    add_commands(parser, "alias", dest="command")
    return parser


def _urls(args: argparse.Namespace) -> list[str]:
    """Return the URLs given, else ``$REDIS_URL``, else the default."""
    return list(args.redis_url or [os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL])


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """Translate the connection, retry and lease flags into the crawl settings they mean."""
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
    for option, param, _ in TLS_FILES:
        if (path := getattr(args, option.removeprefix("--").replace("-", "_"))) is None:
            continue
        if not all(url.startswith("rediss://") for url in urls):
            raise UsageError(f"{option} needs a rediss:// URL (Redis over TLS) in --redis-url.")
        if not os.path.isfile(path):
            raise UsageError(f"{option}: no such file: {path}")
        params[param] = path
    if args.tls_key is not None and args.tls_cert is None:
        raise UsageError("--tls-key needs --tls-cert: the client certificate it belongs to.")
    if args.tls_cert is not None:  # a pair that cannot load would fail every connection
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(args.tls_cert, args.tls_key)
        except OSError as exc:
            why = str(exc).rstrip(".")
            if not isinstance(exc, ssl.SSLError):
                raise UsageError(f"--tls-cert or --tls-key: cannot read it ({why}).") from None
            if args.tls_key is None:
                raise UsageError(
                    f"--tls-cert needs --tls-key: {args.tls_cert} holds no private key ({why})."
                ) from None
            raise UsageError(
                f"--tls-key {args.tls_key} is not the private key of --tls-cert"
                f" {args.tls_cert} ({why})."
            ) from None
    settings: dict[str, Any] = {
        "BLOOMFILTER_REDIS_CLUSTER": args.cluster,
        "BLOOMFILTER_REDIS_PARAMS": params,
        "BLOOMFILTER_RETRY_TIMEOUT": args.retry_timeout,
        "BLOOMFILTER_WORKER_TTL": args.worker_ttl,
    }
    if len(urls) == 1:
        settings["BLOOMFILTER_REDIS_URL"] = urls[0]
    else:
        settings["BLOOMFILTER_REDIS_URLS"] = urls
    return settings


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    secrets: list[str] = url_secrets(os.environ.get("REDIS_URL", ""))

    def body() -> int:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help, --version
            return exc.code if isinstance(exc.code, int) else EXIT_OK
        if args.command is None:  # the commands, one a line: the one usage error of many
            err(f"{PROG}: error: {missing_command('alias', PROG)}")
            return EXIT_USAGE
        if args.verbose:
            logging.getLogger(__package__.rpartition(".")[0]).setLevel(logging.DEBUG)
        urls = _urls(args)
        for url in urls:
            secrets[:0] = url_secrets(url)
        with contextlib.suppress(ValueError):  # a malformed URL: run_command names the option
            FRONTEND.where = describe(urls, args.cluster)[0]
        sizing = sizing_given(args)
        settings = {**settings_of(args), **sizing}
        return run_command(args, settings, FRONTEND, sizing_from(sizing, FRONTEND))

    return guarded(FRONTEND, lambda: secrets, body)

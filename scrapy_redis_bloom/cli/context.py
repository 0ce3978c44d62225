"""What every operations command gets: its connection to the filter's Redis, and its errors.

Both front ends (``scrapy bloom`` and the ``scrapy-redis-bloom`` alias) turn their
command line into crawl settings and call :func:`connect`, which builds the clients
exactly as a crawl does (:func:`..connection.filter_clients`), then run the
subcommand under :func:`guarded`, which turns every failure into one line on stderr
and an exit status, with passwords scrubbed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from redis.exceptions import AuthenticationError, RedisClusterException, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from scrapy_redis_bloom.core.errors import BloomFilterError, FilterUnavailableError
from scrapy_redis_bloom.core.redact import is_secret, scrub, url_secrets
from scrapy_redis_bloom.core.settings import (
    BloomConfig,
    ConnectionConfig,
    FaultPolicy,
    SettingsLike,
)
from scrapy_redis_bloom.engine.bitmap.filter import RedisBloomFilter
from scrapy_redis_bloom.engine.native.filter import NativeBloomFilter
from scrapy_redis_bloom.transport.connection import filter_clients, url_address
from scrapy_redis_bloom.transport.topology import server_address

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: Seconds a failing Redis command is retried: shorter than a crawl's default (20 s),
#: since someone is waiting at the terminal.
DEFAULT_RETRY_TIMEOUT = 5.0

#: The settings that size a filter: given any, ``add`` / ``migrate`` may create it.
SIZING_SETTINGS = (
    "BLOOMFILTER_CAPACITY",
    "BLOOMFILTER_ERROR_RATE",
    "BLOOMFILTER_BIT",
    "BLOOMFILTER_HASH_NUMBER",
    "BLOOMFILTER_SHARD_BIT",
    "BLOOMFILTER_SHARDS",
    "BLOOMFILTER_EXPANSION",
    "BLOOMFILTER_TTL",
)


class CLIError(Exception):
    """A failure reported as one line on stderr, with ``code`` as the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class UsageError(CLIError):
    """The command line or the settings are wrong: exit status 2."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


def _same(message: str) -> str:
    return message


@dataclass
class Frontend:
    """How a front end names itself and the settings in messages.

    ``prog`` starts every error line and the commands it suggests (``scrapy bloom``);
    ``rename`` rewrites a message about ``BLOOMFILTER_*`` settings into the front
    end's words (the alias names its options instead).
    """

    prog: str
    rename: Callable[[str], str] = _same
    #: How to name a Redis Cluster, for a command given one of its nodes as a server.
    cluster_hint: str = (
        "set BLOOMFILTER_REDIS_CLUSTER = True, with the URL of one node as BLOOMFILTER_REDIS_URL"
    )
    #: The servers, as error messages name them: set once they are known.
    where: str = "Redis"


#: Either backend's filter, as owned by a command.
_B = TypeVar("_B", RedisBloomFilter, NativeBloomFilter, RedisBloomFilter | NativeBloomFilter)


@dataclass
class Context:
    """What every command gets: its options, the clients, and what to close at the end.

    ``args`` holds the subcommand's options (``key``, ``json``, ...); ``settings`` the
    crawl settings it connects and fingerprints with; ``sizing`` the configuration
    that may create a missing filter (None: none was asked for). ``where`` names the
    servers in messages; ``address`` is the same without words, for JSON.
    """

    args: argparse.Namespace
    settings: SettingsLike
    frontend: Frontend
    clients: list[Any]
    where: str
    address: str
    cluster: bool
    faults: FaultPolicy
    sizing: BloomConfig | None
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def key(self) -> str:
        """The filter's key."""
        return str(self.args.key)

    @property
    def prog(self) -> str:
        """The command that runs these commands, for the commands messages suggest."""
        return self.frontend.prog

    def own(self, bloom: _B) -> _B:
        """Close ``bloom``'s connections when the command ends."""
        self.stack.callback(bloom.close)
        return bloom


class Layered:
    """Settings with some overridden: what a command's options change for this run only."""

    def __init__(self, base: SettingsLike, overrides: dict[str, Any]) -> None:
        self.base = base
        self.overrides = overrides

    def get(self, name: str, default: Any = None) -> Any:
        """Return the overridden value, else the base settings' one."""
        if name in self.overrides:
            value = self.overrides[name]
            return default if value is None else value
        return self.base.get(name, default)


def describe(urls: Sequence[str], cluster: bool) -> tuple[str, str]:
    """Return (``where`` for messages, ``address`` for JSON): addresses, no password."""
    address = ", ".join(url_address(url) for url in urls)
    return (f"the Redis Cluster at {address}" if cluster else address), address


def settings_secrets(settings: SettingsLike) -> list[str]:
    """Return the passwords the connection settings carry, to scrub from messages."""
    found = url_secrets(os.environ.get("REDIS_URL", ""))
    urls = settings.get("BLOOMFILTER_REDIS_URLS")
    listed = urls.split(",") if isinstance(urls, str) else list(urls or [])
    for url in [settings.get("REDIS_URL"), settings.get("BLOOMFILTER_REDIS_URL"), *listed]:
        if isinstance(url, str):
            found += url_secrets(url.strip())
    for name in ("REDIS_PARAMS", "BLOOMFILTER_REDIS_PARAMS"):
        params = settings.get(name)
        if isinstance(params, dict):
            found += [str(v) for k, v in params.items() if is_secret(str(k)) and v]
            if isinstance(params.get("url"), str):
                found += url_secrets(params["url"])
    return found


def faults_from(settings: SettingsLike, rename: Callable[[str], str] = _same) -> FaultPolicy:
    """Return the commands' fault policy: the retry timeout; errors and losses raise.

    A command never answers "new" for a filter it cannot reach (a crawl may, under
    ``BLOOMFILTER_ON_ERROR = "allow"``): someone is waiting for a true answer.
    """
    timeout = settings.get("BLOOMFILTER_RETRY_TIMEOUT")
    try:
        return FaultPolicy.from_settings(
            {"BLOOMFILTER_RETRY_TIMEOUT": DEFAULT_RETRY_TIMEOUT if timeout is None else timeout}
        )
    except ValueError as exc:
        raise UsageError(rename(str(exc))) from None


def sizing_from(settings: SettingsLike, rename: Callable[[str], str] = _same) -> BloomConfig | None:
    """Return the configuration the sizing settings describe; None when none is set."""
    if all(settings.get(name) is None for name in SIZING_SETTINGS):
        return None
    try:
        return BloomConfig.from_settings(settings)
    except ValueError as exc:
        raise UsageError(rename(str(exc))) from None


def connect(
    args: argparse.Namespace,
    settings: SettingsLike,
    frontend: Frontend,
    sizing: BloomConfig | None = None,
) -> Context:
    """Build the clients from the settings as a crawl does; return the command's context."""
    rename = frontend.rename
    try:
        config = ConnectionConfig.from_settings(settings)
    except ValueError as exc:
        raise UsageError(rename(str(exc))) from None
    faults = faults_from(settings, rename)
    try:
        clients = filter_clients(config, settings)
    except ValueError as exc:  # e.g. a port that is not a number
        raise UsageError(rename(str(exc))) from None
    except RedisClusterException as exc:  # the cluster client reads the slot map at once
        where = describe(config.urls, config.cluster)[0]
        raise CLIError(f"cannot connect to {where}: {exc}") from None
    if config.urls:
        where, address = describe(config.urls, config.cluster)
    else:  # scrapy-redis's connection: REDIS_URL, REDIS_HOST/PORT, REDIS_PARAMS
        where = address = server_address(clients[0])
    ctx = Context(
        args=args,
        settings=settings,
        frontend=frontend,
        clients=clients,
        where=where,
        address=address,
        cluster=config.cluster,
        faults=faults,
        sizing=sizing,
    )
    for client in clients:
        ctx.stack.callback(client.close)
    frontend.where = where
    logger.debug("Connecting to %s", where)
    return ctx


def err(text: str) -> None:
    """Write a line to stderr."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def guarded(
    frontend: Frontend,
    secrets: Callable[[], Sequence[str]],
    body: Callable[[], int],
) -> int:
    """Run a command; turn every failure into one line on stderr and an exit status.

    ``secrets`` is called when a message is printed, so that it sees the settings
    read by then. Library warnings go to stderr unless the host program configured
    logging (the body may lower the level: it is restored at the end).
    """
    package_logger = logging.getLogger(__package__.rpartition(".")[0])
    handler: logging.Handler = logging.NullHandler()
    if not package_logger.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"{frontend.prog}: %(levelname)s: %(message)s"))
    package_logger.addHandler(handler)
    level = package_logger.level

    def fail(message: str, code: int = EXIT_FAILURE) -> int:
        text = " ".join(scrub(message, secrets()).split())
        err(f"{frontend.prog}: error: {text}")
        return code

    try:
        return body()
    except CLIError as exc:
        return fail(exc.message, exc.code)
    except FilterUnavailableError as exc:  # the engine retried for the retry timeout
        return fail(frontend.rename(str(exc)))
    except BloomFilterError as exc:
        return fail(str(exc))
    except AuthenticationError as exc:
        return fail(f"Redis at {frontend.where} refused the credentials: {exc}")
    except RedisTimeoutError as exc:
        return fail(f"Redis at {frontend.where} did not answer in time: {exc}")
    except RedisConnectionError as exc:
        return fail(f"cannot connect to Redis at {frontend.where}: {exc}")
    except ResponseError as exc:
        return fail(f"Redis at {frontend.where} refused a command: {exc}")
    except (RedisError, RedisClusterException) as exc:
        return fail(f"Redis error from {frontend.where}: {exc}")
    except BrokenPipeError:
        # The reader of stdout went away (e.g. `| head`): stop quietly.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILURE
    except OSError as exc:
        name = f"{exc.filename}: " if exc.filename else ""
        return fail(f"{name}{exc.strerror or exc}")
    except KeyboardInterrupt:
        return fail("interrupted", EXIT_INTERRUPTED)
    finally:
        package_logger.removeHandler(handler)
        package_logger.setLevel(level)

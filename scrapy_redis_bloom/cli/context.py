"""What every operations command stands on: its connection, its errors, and the filter it opens.

The clients are built from crawl settings as a crawl builds them; every failure is one line on
stderr, passwords scrubbed. Only ``add`` and ``migrate`` may create a filter.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from redis.exceptions import AuthenticationError, RedisClusterException, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from scrapy_redis_bloom.core import layout
from scrapy_redis_bloom.core.errors import (
    BloomFilterError,
    ConfigMismatchError,
    ServerListMismatchError,
    WordedError,
    Wording,
    setting_name,
)
from scrapy_redis_bloom.core.events import guard_loggers
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.core.redact import is_secret, scrub, url_secrets
from scrapy_redis_bloom.core.settings import (
    WORKER_TTL,
    BloomConfig,
    ConnectionConfig,
    FaultPolicy,
    SettingsLike,
)
from scrapy_redis_bloom.core.sizing import filter_allocation, format_bytes
from scrapy_redis_bloom.engine.backend import make_filter
from scrapy_redis_bloom.engine.bitmap.filter import RedisBloomFilter
from scrapy_redis_bloom.engine.native import parts as native_parts
from scrapy_redis_bloom.engine.native.filter import NativeBloomFilter
from scrapy_redis_bloom.ops import inventory
from scrapy_redis_bloom.ops.inventory import StoredRecord
from scrapy_redis_bloom.scrapy.connection import filter_clients
from scrapy_redis_bloom.transport.connection import url_address
from scrapy_redis_bloom.transport.topology import server_address

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: The reset the package's messages advise, named as the front end at hand runs it.
ADVISED_RESET = "scrapy bloom reset"

#: Seconds a failing Redis command is retried: shorter than a crawl's, someone is waiting.
DEFAULT_RETRY_TIMEOUT = 5.0


class CLIError(Exception):
    """A failure reported as one line on stderr, with ``code`` as the exit status."""

    code = EXIT_FAILURE


class UsageError(CLIError):
    """The command line or the settings are wrong: exit status 2."""

    code = EXIT_USAGE


@dataclass
class Frontend:
    """How a front end names itself (``prog``) and the settings (the alias: as its options)."""

    prog: str
    name: Callable[[str], str] = setting_name
    word: str = "setting"
    #: How to name a Redis Cluster, for a command given one of its nodes as a server.
    cluster_hint: str = (
        "set BLOOMFILTER_REDIS_CLUSTER = True, with the URL of one node as BLOOMFILTER_REDIS_URL"
    )
    #: The servers, as error messages name them: set once they are known.
    where: str = "Redis"

    def words(self, message: BaseException | Wording) -> str:
        """Return an error's message (or a wording) with the settings in this front end's words."""
        if isinstance(message, (Wording, WordedError)):
            return message.render(self.name, self.word)
        return str(message)


_B = TypeVar("_B", RedisBloomFilter, NativeBloomFilter, RedisBloomFilter | NativeBloomFilter)


@dataclass
class Context:
    """What every command gets: its options, the clients (named by ``where`` in messages)."""

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

    def result(self, **fields: Any) -> dict[str, Any]:
        """Return a command's result for JSON: the filter's key and servers, then ``fields``."""
        return {"key": self.key, "server": self.address, **fields}

    def refusal(self, template: str, /, **values: object) -> CLIError:
        """Return the error of a :class:`~..core.errors.Wording`, in the front end's words."""
        return CLIError(self.frontend.words(Wording(template, **values)))

    def own(self, bloom: _B) -> _B:
        """Close ``bloom``'s connections when the command ends."""
        self.stack.callback(bloom.close)
        return bloom


def config_of(settings: SettingsLike, frontend: Frontend | None = None) -> BloomConfig:
    """Return the configuration the settings give; a bad value is a usage error."""
    try:
        return BloomConfig.from_settings(settings)
    except ValueError as exc:
        raise UsageError(str(exc) if frontend is None else frontend.words(exc)) from None


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
        if isinstance(params := settings.get(name), dict):
            found += [str(v) for k, v in params.items() if is_secret(str(k)) and v]
            if isinstance(params.get("url"), str):
                found += url_secrets(params["url"])
    return found


def run_command(
    args: argparse.Namespace, settings: SettingsLike, frontend: Frontend, sizing: BloomConfig | None
) -> int:
    """Build the clients from the settings as a crawl does; run the subcommand (``handler``)."""
    if getattr(args, "yes", True) is False and not stdin_is_tty():
        raise UsageError(
            "reset deletes the filter and cannot ask for confirmation (stdin is not a"
            " terminal): pass --yes to confirm."
        )
    # The retry timeout alone: errors and losses raise, never answered "new" as a crawl may.
    timeout = settings.get("BLOOMFILTER_RETRY_TIMEOUT")
    retry = {"BLOOMFILTER_RETRY_TIMEOUT": DEFAULT_RETRY_TIMEOUT if timeout is None else timeout}
    try:
        config = ConnectionConfig.from_settings(settings)
        faults = FaultPolicy.from_settings(retry)
        if timeout is None:  # a crawl's default is 20 s: say whose 5 s it is
            budget = Wording("{BLOOMFILTER_RETRY_TIMEOUT} not set: the command's default")
            faults = replace(faults, retry_budget=budget)
        WORKER_TTL.read(settings)  # read by the commands that list workers: refused up front
        where, address = describe(config.urls, config.cluster)
        clients = filter_clients(config, settings, faults.retry_timeout)
    except ValueError as exc:  # a bad setting, or e.g. a port that is not a number
        raise UsageError(frontend.words(exc)) from None
    except RedisClusterException as exc:  # the cluster client reads the slot map at once
        raise CLIError(f"cannot connect to {where}: {exc}") from None
    if not config.urls:  # scrapy-redis's connection: REDIS_URL, REDIS_HOST/PORT, REDIS_PARAMS
        where = address = server_address(clients[0])
    ctx = Context(args, settings, frontend, clients, where, address, config.cluster, faults, sizing)
    for client in clients:
        ctx.stack.callback(client.close)
    frontend.where = where
    logger.debug("Connecting to %s", where)
    with ctx.stack:
        return int(args.handler(ctx))


def err(text: str) -> None:
    """Write a line to stderr."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def stdin_is_tty() -> bool:
    """Tell whether stdin is an interactive terminal."""
    return sys.stdin is not None and not sys.stdin.closed and sys.stdin.isatty()


def guarded(
    frontend: Frontend, secrets: Callable[[], Sequence[str]], body: Callable[[], int]
) -> int:
    """Run a command; turn every failure into one line on stderr and an exit status.

    ``secrets`` is called as a message is printed, to see the settings read by then.
    """
    frontend.where = "Redis"  # until the command knows its servers
    guard_loggers()  # the commands' loggers too: no log call raises (see core.events)
    package_logger = logging.getLogger(__package__.rpartition(".")[0])
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{frontend.prog}: %(levelname)s: %(message)s"))
    if not package_logger.hasHandlers():  # unless the host program configured logging
        package_logger.addHandler(handler)
    level = package_logger.level

    def fail(message: str, code: int = EXIT_FAILURE) -> int:
        text = " ".join(scrub(message, secrets()).split())
        text = text.replace(ADVISED_RESET, f"{frontend.prog} reset")
        err(f"{frontend.prog}: error: {text}")
        return code

    try:
        return body()
    except CLIError as exc:
        return fail(str(exc), exc.code)
    except BloomFilterError as exc:  # e.g. unavailable past the retry timeout: named settings
        return fail(frontend.words(exc))
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
        return fail(os_error_text(exc))
    except KeyboardInterrupt:
        return fail("interrupted", EXIT_INTERRUPTED)
    finally:
        package_logger.removeHandler(handler)
        package_logger.setLevel(level)


def os_error_text(exc: OSError) -> str:
    """Return what an OSError says, as an error line does: the file, then what went wrong."""
    name = f"{exc.filename}: " if exc.filename else ""
    return f"{name}{exc.strerror or exc}"


def stored(ctx: Context) -> tuple[RedisBloomFilter, StoredRecord | None]:
    """Read the filter's record; return a filter of the stored geometry (never opened)."""
    bloom = ctx.own(inventory.probe(ctx.clients, ctx.key, ctx.faults))
    if nodes := inventory.cluster_nodes(bloom):  # they would answer MOVED until the retry timeout
        raise UsageError(
            f"Redis at {', '.join(nodes)} is a node of a Redis Cluster:"
            f" {ctx.frontend.cluster_hint}."
        )
    found = inventory.read_record(bloom)
    if found is not None and found.record is not None:
        bloom.close()
        bloom = ctx.own(RedisBloomFilter.of_record(ctx.clients, ctx.key, found.record, ctx.faults))
    return bloom, found


def usable(ctx: Context) -> tuple[RedisBloomFilter, FilterRecord | None]:
    """Return the stored filter and its record, checked against the servers; refuse a bad one."""
    bloom, found = stored(ctx)
    if found is None:
        return bloom, None
    if found.record is None:
        raise CLIError(found.problem)
    check_servers(ctx, bloom, found.record)
    return bloom, found.record


def check_servers(ctx: Context, bloom: RedisBloomFilter, record: FilterRecord) -> None:
    """Refuse a server list of another length than the filter's: shards would be misplaced."""
    if record.servers != bloom.topology.servers:
        raise ctx.refusal(
            "The Bloom filter {key!r} (id {id}) was created on {servers} server(s); {given} given."
            " Give each of its servers in {BLOOMFILTER_REDIS_URLS}, in the crawl's order: shard i"
            " lives on server i mod {servers}.",
            key=ctx.key,
            id=record.filter_id,
            servers=record.servers,
            given=bloom.topology.servers,
        )


def native_if(ctx: Context, record: FilterRecord) -> NativeBloomFilter | None:
    """Return the native filter a record of the native backend describes (not opened)."""
    if record.backend != "native":
        return None
    return ctx.own(NativeBloomFilter.of_record(ctx.clients, ctx.key, record, ctx.faults))


def existing(
    ctx: Context, hint: str = ""
) -> tuple[RedisBloomFilter | NativeBloomFilter, FilterRecord]:
    """Return the stored filter (not opened) and its record; ``hint`` says what to do if none."""
    bloom, record = usable(ctx)
    if record is not None:
        return native_if(ctx, record) or bloom, record
    bloom.lifecycle.check_placement()  # servers listed out of order: say so, not "missing"
    key = ctx.key
    meta = layout.meta_key(key)
    message = f"No Bloom filter {key!r} on {ctx.where}: its config record {meta!r} does not exist."
    if key.endswith(":meta"):
        message += f" Give the filter's key without ':meta': --key {key[: -len(':meta')]!r}."
    elif bloom.parts.existing([0]):
        message += (
            f" Its shard key {layout.shard_key(key, 0)!r} exists without the record (orphaned"
            f" bits): delete them with '{ctx.frontend.prog} reset --key {key}'."
        )
    elif hint:
        message += " " + hint
    raise CLIError(message)


def open_existing(
    ctx: Context, hint: str = "A crawl creates it on its first request."
) -> RedisBloomFilter | NativeBloomFilter:
    """Open a filter that must exist, with the geometry its record describes."""
    opened, _ = existing(ctx, hint)
    opened.open(create=False)  # checks every part: a lost shard is an error, not "absent"
    return opened


def open_for_writing(ctx: Context) -> tuple[RedisBloomFilter | NativeBloomFilter, bool]:
    """Open the filter for ``add`` / ``migrate``, creating it if sizing was given; and if it did."""
    if ctx.sizing is None:
        hint = Wording(
            "Start the crawl once to create it, or give its sizing ({BLOOMFILTER_CAPACITY} and"
            " {BLOOMFILTER_ERROR_RATE}, or {BLOOMFILTER_BIT} and {BLOOMFILTER_HASH_NUMBER}) to"
            " create it here."
        )
        return open_existing(ctx, ctx.frontend.words(hint)), False
    created = usable(ctx)[1] is None
    opened = ctx.own(make_filter(ctx.clients, ctx.key, ctx.sizing, faults=ctx.faults))
    try:
        opened.open(create=True)
    except ServerListMismatchError:
        raise
    except ConfigMismatchError as exc:
        raise ctx.refusal(
            "The sizing {settings} do not match the existing filter (leave them out to use the"
            " filter as it is): {exc}",
            exc=exc.wording or str(exc),
        ) from None
    if created:
        ctx.stack.enter_context(_saying_created(ctx, opened))
    return opened, created


@contextlib.contextmanager
def _saying_created(ctx: Context, bloom: RedisBloomFilter | NativeBloomFilter) -> Iterator[None]:
    """End the error of a command that created the filter, then failed, saying it did.

    The filter stays, allocated whole: created under a mistyped key, it would hold its
    memory unseen. Entered on ``ctx.stack``, so it sees the command's error first.
    """
    try:
        yield
    except (CLIError, BloomFilterError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):
            raise  # the reader of stdout went away: no line (see guarded)
        if isinstance(exc, OSError):
            said = os_error_text(exc)
        else:
            said = str(exc) if isinstance(exc, CLIError) else ctx.frontend.words(exc)
        record = bloom.record
        assert record is not None  # opened
        error = CLIError(
            f"{said.rstrip('.')}. The Bloom filter {ctx.key!r} on {ctx.where} was created by"
            f" this command ({format_bytes(allocated(record))}): '{ctx.frontend.prog} reset"
            f" --key {ctx.key}' deletes it if it is not wanted."
        )
        error.code = exc.code if isinstance(exc, CLIError) else EXIT_FAILURE
        raise error from None


def allocated(record: FilterRecord) -> int:
    """Return the bytes a filter takes in Redis from its creation: its shards, allocated whole."""
    if record.backend == "native":
        return record.spec.shards * native_parts.shard_bytes(record)
    return filter_allocation(record.spec)

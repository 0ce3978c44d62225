"""Settings to a validated, immutable filter configuration.

Every ``BLOOMFILTER_*`` setting is read once, here, into a frozen
:class:`BloomConfig`. A bad value raises :class:`ValueError` naming the setting, the
value and what is allowed, so a crawl fails at startup rather than halfway through.
Nothing here talks to Redis or needs a crawler: any object with a ``get(name)``
method (Scrapy's ``Settings``, a ``dict``) will do.

Sizing, in one of two ways (giving both kinds is refused; see :mod:`.sizing`):

* ``BLOOMFILTER_BIT`` / ``BLOOMFILTER_HASH_NUMBER``: m = 2**BIT bits and k hash
  functions, as in scrapy-redis-bloomfilter. ``BLOOMFILTER_CAPACITY`` may be added
  to state how many items you expect (for the capacity warning and the reported
  false-positive rate). This is the default: BIT 30 (128 MiB), k = 6.
* ``BLOOMFILTER_CAPACITY`` / ``BLOOMFILTER_ERROR_RATE``: m = -n ln p / (ln 2)**2
  and k = (m / n) ln 2, rounded. ERROR_RATE defaults to 0.001 when only CAPACITY
  is given.

``BLOOMFILTER_BLOCKED`` (default False) keeps each URL's k bits in one 512-bit block
(hash scheme 2, :mod:`.hashing`): a check costs Redis one or two cache misses instead
of k, for about 4% (at 1e-2) to 14% (at 1e-4) more bits at the same error rate.

Growth and forgetting (see :mod:`.engine.generations`): ``BLOOMFILTER_EXPANSION``
(default 2; 0 for a fixed-size filter) lets each shard start a larger generation when
it is full, so the false-positive rate stays under ERROR_RATE at any fill;
``BLOOMFILTER_TTL`` (seconds, default 0: forever) forgets a URL between TTL and 2 x TTL
after it was added. Both shrink the error rate generation 0 is sized for (see
:attr:`.sizing.Sizing.rate_share`).

Faults, in :class:`FaultPolicy`: how long to retry (``BLOOMFILTER_RETRY_TIMEOUT``),
what to answer when Redis stays unavailable (``BLOOMFILTER_ON_ERROR``) and what to do
when part of the filter is lost (``BLOOMFILTER_ON_LOSS``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar
from urllib.parse import urlsplit

from redis.connection import parse_url as _redis_parse_url

from scrapy_redis_bloom.core.generations import DEFAULT_EXPANSION, DEFAULT_TIGHTENING, Growth
from scrapy_redis_bloom.core.hashing import BLOCK_BITS, MAX_SHARD_BITS, FilterSpec
from scrapy_redis_bloom.core.redact import masked, scrub
from scrapy_redis_bloom.core.sizing import (
    Sizing,
    false_positive_rate,
    format_bytes,
    optimal_capacity,
    optimal_geometry,
)

DEFAULT_KEY = "%(spider)s:bloomfilter"
DEFAULT_BIT = 30
DEFAULT_HASH_NUMBER = 6
DEFAULT_ERROR_RATE = 0.001
#: Fingerprints each worker remembers locally (about 150 bytes each: 15 MB).
DEFAULT_CACHE_SIZE = 100_000
MAX_CACHE_SIZE = 100_000_000
#: Seconds a worker's lease lasts without renewal (it renews every third of that).
DEFAULT_WORKER_TTL = 30.0

#: Seconds a failing Redis call is retried (with backoff, across reconnects) before
#: BLOOMFILTER_ON_ERROR decides: long enough for a Redis restart or a failover.
DEFAULT_RETRY_TIMEOUT = 20.0
MAX_RETRY_TIMEOUT = 3600.0
MAX_WORKER_TTL = 86_400.0

#: 2**47 bits = 16 TiB: 2,097,165 shards of the default size, within MAX_SHARDS.
#: Most generations a shard's items may grow by per generation.
MAX_EXPANSION = 1024
#: Longest re-crawl window: ten years.
MAX_TTL = 10 * 365 * 86_400
MAX_BIT = 47
MAX_HASH_NUMBER = 64
#: Smallest shard: 2**7 bits, the payload of the smallest allocator block that holds a
#: shard's header and string overhead.
MIN_SHARD_BIT = 7
MAX_SHARD_BIT = 32

OnError = Literal["raise", "allow"]
ON_ERROR: tuple[OnError, ...] = ("raise", "allow")
OnLoss = Literal["raise", "recreate"]
ON_LOSS: tuple[OnLoss, ...] = ("raise", "recreate")
#: Values of BLOOMFILTER_BACKEND: choose by what the servers offer, our bitmaps, or
#: the server's own Bloom filters (BF.*, see :mod:`.engine.native`).
BackendSetting = Literal["auto", "bitmap", "native"]
BACKEND: tuple[BackendSetting, ...] = ("auto", "bitmap", "native")

_T = TypeVar("_T")

Fingerprinter = Literal["scrapy-redis", "crawler"]
FINGERPRINTERS: tuple[Fingerprinter, ...] = ("scrapy-redis", "crawler")


class SettingsLike(Protocol):
    """What the configuration needs of a settings object: Scrapy ``Settings`` or a dict."""

    def get(self, name: str, default: Any = None) -> Any:
        """Return the value of a setting, or ``default`` when it is not set."""


def _invalid(name: str, value: object, allowed: str) -> ValueError:
    """Return the error for a bad setting: its name, value (secrets masked), what is allowed."""
    return ValueError(f"The value of the {name} setting ({masked(value)}) is invalid. {allowed}")


def _number(settings: SettingsLike, name: str, integer: bool, allowed: str) -> float | None:
    """Read a numeric setting given as a number or a string; None when unset."""
    raw = settings.get(name)
    if raw is None:
        return None
    try:
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise TypeError
        value = float(raw)
        if not math.isfinite(value) or (integer and not value.is_integer()):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise _invalid(name, raw, allowed) from None
    if integer and isinstance(raw, int):
        return raw  # exact, even beyond a float's 53 bits
    return int(value) if integer else value


def _int(settings: SettingsLike, name: str, ok: Callable[[int], bool], allowed: str) -> int | None:
    value = _number(settings, name, True, allowed)
    if value is None:
        return None
    if not ok(int(value)):
        raise _invalid(name, settings.get(name), allowed)
    return int(value)


def boolean_setting(settings: SettingsLike, name: str, default: bool = False) -> bool:
    """Read a boolean setting as Scrapy's ``getbool`` does, refusing anything else by name."""
    raw = settings.get(name, default)
    value = raw.lower() if isinstance(raw, str) else raw
    if value in (True, 1, "true", "1"):
        return True
    if value in (False, 0, "false", "0"):
        return False
    raise _invalid(name, raw, "It must be a boolean: True, False, 1 or 0.")


def _or_default(value: _T | None, default: _T) -> _T:
    return default if value is None else value


def int_setting(
    settings: SettingsLike, name: str, default: int, ok: Callable[[int], bool], allowed: str
) -> int:
    """Read an integer setting (a number or a string) that ``ok`` accepts; ``default`` if unset."""
    return _or_default(_int(settings, name, ok, allowed), default)


def float_setting(
    settings: SettingsLike, name: str, default: float, ok: Callable[[float], bool], allowed: str
) -> float:
    """Read a finite number setting (number or string) that ``ok`` accepts; ``default`` if unset."""
    return _or_default(_float(settings, name, ok, allowed), default)


def _float(
    settings: SettingsLike, name: str, ok: Callable[[float], bool], allowed: str
) -> float | None:
    value = _number(settings, name, False, allowed)
    if value is not None and not ok(value):
        raise _invalid(name, settings.get(name), allowed)
    return value


_URL_SCHEMES = ("redis://", "rediss://", "unix://")
#: redis-py's reading of a Redis URL (untyped there).
parse_url: Callable[[str], dict[str, Any]] = _redis_parse_url


def check_url(name: str, value: object, where: object = None) -> str:
    """Check a Redis URL as redis-py will read it: scheme, port, database, query."""
    shown = value if where is None else where
    if not isinstance(value, str) or not value.startswith(_URL_SCHEMES):
        raise _invalid(
            name,
            shown,
            "It must be a Redis URL: redis://[[user]:password@]host[:port][/db],"
            " rediss://... (TLS) or unix:///path/to/socket.",
        )
    try:
        parse_url(value)  # redis-py's own reading; its messages carry no password
        path = urlsplit(value).path
    except ValueError as exc:
        raise _invalid(name, shown, f"It is not a valid Redis URL: {scrub(str(exc))}") from None
    if not value.startswith("unix://") and path not in ("", "/") and not path[1:].isdigit():
        raise _invalid(name, shown, f"Its database ({path[1:]!r}) must be a number, e.g. /0.")
    return value


def check_key(key: str) -> None:
    """Refuse a filter key (before ``%(spider)s`` is filled in) that cannot name Redis keys.

    Braces would change the Redis Cluster hash tags the filter derives from the key;
    any %-sequence but ``%(spider)s`` and ``%%`` would be filled in with junk.
    """
    if "{" in key or "}" in key:
        raise _invalid(
            "BLOOMFILTER_KEY",
            key,
            "It must not contain { or }: the filter derives Redis Cluster hash tags from it.",
        )
    if re.sub(r"%%|%\(spider\)s", "", key).count("%"):
        raise _invalid(
            "BLOOMFILTER_KEY",
            key,
            "It may contain the placeholder %(spider)s and no other %-sequences"
            " (write a literal % as %%).",
        )


#: Client keyword arguments that must be numbers (seconds, counts, indexes).
_NUMERIC_PARAMS = (
    "socket_timeout",
    "socket_connect_timeout",
    "health_check_interval",
    "port",
    "db",
    "max_connections",
)


def client_params(name: str, params: object) -> dict[str, Any]:
    """Check a dict of Redis client keyword arguments (``name`` is its setting)."""
    if params is None:
        return {}
    if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
        raise ValueError(  # its value is not shown: it may hold a password in any form
            f"The value of the {name} setting (a {type(params).__name__}) is invalid. It must"
            " be a dict of keyword arguments for the Redis client, e.g. {'socket_timeout': 30}."
        )
    for param in _NUMERIC_PARAMS:
        value = params.get(param)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise _invalid(name, params, f"Its {param!r} must be a number, not {masked(value)}.")
    return params


#: A host name or IP address (IPv6 in brackets): no user, password, scheme or path.
_HOST = re.compile(r"[A-Za-z0-9._%-]+|\[[0-9A-Fa-f:.%]+\]")


def parse_sentinels(name: str, value: object) -> tuple[tuple[str, int], ...]:
    """Read a list of Sentinel addresses: ``"host:port"`` strings or ``(host, port)`` pairs.

    One comma-separated string is accepted too (``-s NAME=a:26379,b:26379``). ``name``
    is the setting (or parameter) shown in the error.
    """
    allowed = (
        "It must be a non-empty list of Sentinel addresses, e.g."
        " ['10.0.0.1:26379', '10.0.0.2:26379'] (or [('10.0.0.1', 26379), ...], or one"
        " comma-separated string)."
    )
    listed = value.split(",") if isinstance(value, str) else value
    if not isinstance(listed, (list, tuple)) or not listed:
        raise _invalid(name, value, allowed)
    found: list[tuple[str, int]] = []
    for entry in listed:
        if isinstance(entry, str):
            host, sep, port_text = entry.strip().rpartition(":")
            port: object = int(port_text) if sep and port_text.isdigit() else None
        elif isinstance(entry, (list, tuple)) and len(entry) == 2:
            host, port = entry
        else:
            raise _invalid(name, value, allowed)
        if (
            not isinstance(host, str)
            or not _HOST.fullmatch(host)
            or isinstance(port, bool)
            or not isinstance(port, int)
            or not 0 < port < 65536
        ):
            raise _invalid(name, value, f"Its entry {masked(entry)} is no host:port. {allowed}")
        found.append((host.strip("[]"), port))
    if len(set(found)) != len(found):
        raise _invalid(name, value, "It lists the same Sentinel more than once.")
    return tuple(found)


def sentinel_service(name: str, value: object) -> str:
    """Check the name of the service (the ``sentinel monitor`` name) Sentinel watches."""
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        raise _invalid(
            name,
            value,
            "It must be the name the sentinels monitor the primary under"
            " (sentinel monitor <name> ...), e.g. 'mymaster'.",
        )
    return value


@dataclass(frozen=True, slots=True)
class ConnectionConfig:
    """Where the filter's bits live, when not on scrapy-redis's own connection.

    ``urls`` is empty to use scrapy-redis's connection (``REDIS_URL``,
    ``REDIS_PARAMS``); one URL for one server or, with ``cluster``, a Redis Cluster
    node to start from; several URLs for several standalone servers, shard ``i``
    living on server ``i mod len(urls)``. ``sentinels`` (with ``service``) instead: the
    primary that these Sentinels name for that service, followed through failovers.
    """

    urls: tuple[str, ...] = ()
    cluster: bool = False
    params: tuple[tuple[str, Any], ...] = ()
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""

    @classmethod
    def from_settings(cls, settings: SettingsLike) -> ConnectionConfig:
        """Read ``BLOOMFILTER_REDIS_*``. Raises ValueError naming a bad setting."""
        url = settings.get("BLOOMFILTER_REDIS_URL")
        urls = settings.get("BLOOMFILTER_REDIS_URLS")
        if url is not None and urls is not None:
            raise ValueError(
                "The settings BLOOMFILTER_REDIS_URL and BLOOMFILTER_REDIS_URLS contradict each"
                " other: give one server (or cluster node) or a list of servers, not both."
            )
        found: tuple[str, ...] = ()
        if url is not None:
            found = (check_url("BLOOMFILTER_REDIS_URL", url),)
        elif urls is not None:
            listed = urls.split(",") if isinstance(urls, str) else urls
            if not isinstance(listed, (list, tuple)) or not listed:
                raise _invalid(
                    "BLOOMFILTER_REDIS_URLS",
                    urls,
                    "It must be a non-empty list of Redis URLs (or one comma-separated string).",
                )
            found = tuple(
                check_url("BLOOMFILTER_REDIS_URLS", u.strip() if isinstance(u, str) else u, urls)
                for u in listed
            )
            if len(set(found)) != len(found):
                raise _invalid(
                    "BLOOMFILTER_REDIS_URLS", urls, "It lists the same server more than once."
                )
        cluster = boolean_setting(settings, "BLOOMFILTER_REDIS_CLUSTER")
        if cluster and len(found) != 1:
            raise ValueError(
                "The BLOOMFILTER_REDIS_CLUSTER setting needs BLOOMFILTER_REDIS_URL, the URL of"
                " one node of the cluster to start from (the client discovers the others)."
            )
        sentinels, service = _sentinel_settings(settings, found)
        params = client_params("BLOOMFILTER_REDIS_PARAMS", settings.get("BLOOMFILTER_REDIS_PARAMS"))
        if params and not found and not sentinels:
            raise ValueError(
                "The BLOOMFILTER_REDIS_PARAMS setting needs BLOOMFILTER_REDIS_URL,"
                " BLOOMFILTER_REDIS_URLS or BLOOMFILTER_REDIS_SENTINELS; without them the"
                " filter uses scrapy-redis's connection, set by REDIS_URL and REDIS_PARAMS."
            )
        if sentinels:
            check_sentinel_params("BLOOMFILTER_REDIS_PARAMS", params)
        return cls(
            urls=found,
            cluster=cluster,
            params=tuple(sorted(params.items())),
            sentinels=sentinels,
            service=service,
        )


#: Client arguments that name one server: with Sentinel, the sentinels name the primary.
_ONE_SERVER_PARAMS = ("host", "port", "url", "unix_socket_path", "path")


def check_sentinel_params(name: str, params: dict[str, Any]) -> None:
    """Refuse client arguments that would name the server the sentinels are to name."""
    fixed = [param for param in _ONE_SERVER_PARAMS if param in params]
    if fixed:
        raise _invalid(
            name,
            params,
            f"With Sentinel the primary's address comes from the sentinels: remove"
            f" {', '.join(map(repr, fixed))}.",
        )
    inner = params.get("sentinel_kwargs")
    if inner is not None:
        client_params(f"{name}['sentinel_kwargs']", inner)


def _sentinel_settings(
    settings: SettingsLike, urls: tuple[str, ...]
) -> tuple[tuple[tuple[str, int], ...], str]:
    """Read ``BLOOMFILTER_REDIS_SENTINELS`` and ``_SENTINEL_SERVICE`` (both or neither)."""
    raw = settings.get("BLOOMFILTER_REDIS_SENTINELS")
    service = settings.get("BLOOMFILTER_REDIS_SENTINEL_SERVICE")
    if raw is None and service is None:
        return (), ""
    if raw is None or service is None:
        given, missing = (
            ("BLOOMFILTER_REDIS_SENTINELS", "BLOOMFILTER_REDIS_SENTINEL_SERVICE")
            if service is None
            else ("BLOOMFILTER_REDIS_SENTINEL_SERVICE", "BLOOMFILTER_REDIS_SENTINELS")
        )
        raise ValueError(
            f"The {given} setting needs {missing}: the sentinels' addresses and the name"
            " they monitor the primary under go together."
        )
    if urls or boolean_setting(settings, "BLOOMFILTER_REDIS_CLUSTER"):
        raise ValueError(
            "The setting BLOOMFILTER_REDIS_SENTINELS contradicts BLOOMFILTER_REDIS_URL,"
            " BLOOMFILTER_REDIS_URLS and BLOOMFILTER_REDIS_CLUSTER: give the sentinels of"
            " one Sentinel-managed primary, or the servers themselves, not both."
        )
    sentinels = parse_sentinels("BLOOMFILTER_REDIS_SENTINELS", raw)
    return sentinels, sentinel_service("BLOOMFILTER_REDIS_SENTINEL_SERVICE", service)


@dataclass(frozen=True, slots=True)
class FaultPolicy:
    """What the filter does when Redis fails it.

    ``retry_timeout``: seconds a failing call is retried, with backoff and across
    reconnects, before ``on_error`` decides: ``"raise"`` a
    :class:`~.errors.FilterUnavailableError`, or ``"allow"`` the request (answer
    "new": a possible duplicate fetch, never a lost page). ``on_loss``: when part of
    the filter is gone (a shard evicted or deleted, a server emptied or replaced),
    ``"raise"`` a :class:`~.errors.FilterDamagedError`, or ``"recreate"`` the part
    empty and go on, with a warning.
    """

    retry_timeout: float = DEFAULT_RETRY_TIMEOUT
    on_error: OnError = "raise"
    on_loss: OnLoss = "raise"

    @classmethod
    def from_settings(cls, settings: SettingsLike) -> FaultPolicy:
        """Read ``BLOOMFILTER_RETRY_TIMEOUT``, ``_ON_ERROR`` and ``_ON_LOSS``."""
        timeout = _float(
            settings,
            "BLOOMFILTER_RETRY_TIMEOUT",
            lambda v: 0 <= v <= MAX_RETRY_TIMEOUT,
            f"It must be a number of seconds from 0 (no retry) to {MAX_RETRY_TIMEOUT:g}.",
        )
        return cls(
            retry_timeout=_or_default(timeout, DEFAULT_RETRY_TIMEOUT),
            on_error=_choice(
                settings,
                "BLOOMFILTER_ON_ERROR",
                ON_ERROR,
                "It must be 'raise' (stop with an error once retries are exhausted, the"
                " default) or 'allow' (let the request through: a possible duplicate fetch).",
            ),
            on_loss=_choice(
                settings,
                "BLOOMFILTER_ON_LOSS",
                ON_LOSS,
                "It must be 'raise' (stop with an error when part of the filter is lost, the"
                " default) or 'recreate' (recreate the lost part empty and go on).",
            ),
        )


_C = TypeVar("_C", bound=str)


def _choice(settings: SettingsLike, name: str, allowed: tuple[_C, ...], message: str) -> _C:
    """Read a setting that takes one of a few words; the first is the default."""
    raw = settings.get(name)
    if raw is None:
        return allowed[0]
    for value in allowed:
        if raw == value:
            return value
    raise _invalid(name, raw, message)


@dataclass(frozen=True, slots=True)
class BloomConfig:
    """The resolved, validated configuration of one filter.

    ``sizing`` is what the settings ask for and ``spec`` the geometry this release
    gives it (a filter that exists keeps the geometry it was created with, see
    :mod:`.engine.record`); the other fields say how this worker names, reports on,
    feeds and protects the filter.
    """

    key: str
    spec: FilterSpec
    capacity: int
    sizing: Sizing = field(default_factory=lambda: Sizing(bit=30, hash_number=6))
    fingerprinter: Fingerprinter = "scrapy-redis"
    connection: ConnectionConfig = field(default_factory=lambda: ConnectionConfig())
    worker_ttl: float = DEFAULT_WORKER_TTL
    cache_size: int = DEFAULT_CACHE_SIZE
    expansion: int = DEFAULT_EXPANSION
    ttl: int = 0
    faults: FaultPolicy = field(default_factory=lambda: FaultPolicy())
    backend: BackendSetting = "auto"
    #: The false-positive rate above which the Spidermon monitor fails a crawl (None:
    #: :attr:`design_error_rate`).
    monitor_max_fpr: float | None = None

    @property
    def growth(self) -> Growth:
        """How the filter this config creates grows and forgets."""
        return Growth(self.spec, self.capacity, self.expansion, DEFAULT_TIGHTENING, self.ttl)

    @property
    def expected_error_rate(self) -> float:
        """False-positive rate expected once ``capacity`` items are in the filter."""
        spec = self.spec
        return false_positive_rate(spec.bits, spec.hash_count, self.capacity, spec.block_bits)

    @property
    def design_error_rate(self) -> float:
        """The false-positive rate the filter is made for: ERROR_RATE, else that at capacity."""
        return self.sizing.error_rate or self.expected_error_rate

    def key_for(self, spider_name: str | None) -> str:
        """Return the filter's Redis key for a spider (``%(spider)s`` filled in)."""
        if "%(spider)s" not in self.key:
            return self.key % {}
        if spider_name is None:
            raise ValueError(
                f"The BLOOMFILTER_KEY setting ({self.key!r}) uses %(spider)s, but no spider"
                " is known here. Build the dupefilter with from_crawler() or from_spider(),"
                " or give a key without %(spider)s."
            )
        if not spider_name or "{" in spider_name or "}" in spider_name:
            raise ValueError(
                f"The spider's name ({spider_name!r}) cannot fill in %(spider)s of the"
                f" BLOOMFILTER_KEY setting ({self.key!r}): a key must not contain {{ or }}"
                " (the filter derives Redis Cluster hash tags from it). Give BLOOMFILTER_KEY"
                " without %(spider)s."
            )
        return self.key % {"spider": spider_name}

    def describe(self) -> str:
        """One line for the log: m, k, shards, memory and the rate expected at capacity."""
        spec = self.spec
        return (
            f"m={spec.bits:,} bits ({format_bytes(spec.total_bytes)}) in {spec.shards:,} shard(s)"
            f" of {spec.shard_bits:,} bits, k={spec.hash_count} hash functions,"
            f" capacity {self.capacity:,} items, expected false-positive rate at capacity"
            f" {self.expected_error_rate:.3g}{self._growth_text()}"
        )

    def _growth_text(self) -> str:
        growth = self.growth
        text = ""
        if self.expansion:
            text += (
                f"; grows {self.expansion}x per generation up to"
                f" {growth.grown_capacity:,} items, rate under {growth.rate_bound:.3g}"
            )
        if self.ttl:
            text += f"; URLs forgotten {self.ttl:,} to {2 * self.ttl:,} s after being added"
        return text

    @classmethod
    def from_settings(cls, settings: SettingsLike) -> BloomConfig:
        """Read and validate the ``BLOOMFILTER_*`` settings. Raises ValueError."""
        expansion = _or_default(
            _int(
                settings,
                "BLOOMFILTER_EXPANSION",
                lambda v: v == 0 or 2 <= v <= MAX_EXPANSION,
                f"It must be 0 (a fixed-size filter) or an integer from 2 to {MAX_EXPANSION}:"
                " how many times the items of the generation before a new one takes.",
            ),
            DEFAULT_EXPANSION,
        )
        ttl = _or_default(
            _int(
                settings,
                "BLOOMFILTER_TTL",
                lambda v: 0 <= v <= MAX_TTL,
                f"It must be 0 (remember URLs forever) or a whole number of seconds up to"
                f" {MAX_TTL:,} (ten years) after which a URL may be crawled again.",
            ),
            0,
        )
        backend = _choice(
            settings,
            "BLOOMFILTER_BACKEND",
            BACKEND,
            "It must be 'auto' (the server's own Bloom filters when every server has BF.*,"
            " else bitmaps; the default), 'bitmap' or 'native' (BF.*: Redis 8, Redis Stack,"
            " RedisBloom or valkey-bloom).",
        )
        share = (1 - DEFAULT_TIGHTENING if expansion else 1.0) * (0.5 if ttl else 1.0)
        sizing, capacity = _sizing(settings, share)
        if sizing.blocked and backend == "native":
            raise ValueError(
                "The settings BLOOMFILTER_BLOCKED = True and BLOOMFILTER_BACKEND = 'native'"
                " contradict each other: blocks are a layout of the bitmap backend (the"
                " server's BF.* filters have their own). Use BLOOMFILTER_BACKEND = 'bitmap'"
                " or 'auto', or leave BLOOMFILTER_BLOCKED off."
            )
        try:
            spec = sizing.spec()
        except ValueError as exc:  # only with a shard setting: the default shards fit any BIT
            name, value = (
                ("BLOOMFILTER_SHARDS", sizing.shards)
                if sizing.shards is not None
                else ("BLOOMFILTER_SHARD_BIT", sizing.shard_bit)
            )
            raise _invalid(
                name, value, f"It cannot split the filter's bits into shards ({exc})."
            ) from None
        if capacity is None:
            capacity = optimal_capacity(spec.bits, spec.hash_count)
        key = settings.get("BLOOMFILTER_KEY")
        key = DEFAULT_KEY if key is None else key
        if not isinstance(key, str) or not key:
            raise _invalid("BLOOMFILTER_KEY", key, "It must be a non-empty string.")
        check_key(key)
        fingerprinter = settings.get("BLOOMFILTER_FINGERPRINTER")
        fingerprinter = "scrapy-redis" if fingerprinter is None else fingerprinter
        if fingerprinter not in FINGERPRINTERS:
            raise _invalid(
                "BLOOMFILTER_FINGERPRINTER",
                fingerprinter,
                "It must be 'scrapy-redis' (scrapy-redis's fingerprint, the default) or"
                " 'crawler' (the crawler's REQUEST_FINGERPRINTER_CLASS).",
            )
        return cls(
            key=key,
            spec=spec,
            capacity=capacity,
            sizing=sizing,
            fingerprinter=fingerprinter,
            connection=ConnectionConfig.from_settings(settings),
            worker_ttl=_or_default(
                _float(
                    settings,
                    "BLOOMFILTER_WORKER_TTL",
                    lambda v: 1 <= v <= MAX_WORKER_TTL,
                    f"It must be a number of seconds from 1 to {MAX_WORKER_TTL:,.0f} (a day).",
                ),
                DEFAULT_WORKER_TTL,
            ),
            expansion=expansion,
            ttl=ttl,
            cache_size=_or_default(
                _int(
                    settings,
                    "BLOOMFILTER_CACHE_SIZE",
                    lambda v: 0 <= v <= MAX_CACHE_SIZE,
                    f"It must be an integer from 0 (no near-cache) to {MAX_CACHE_SIZE:,}: the"
                    " number of fingerprints this worker remembers locally.",
                ),
                DEFAULT_CACHE_SIZE,
            ),
            faults=FaultPolicy.from_settings(settings),
            backend=backend,
            monitor_max_fpr=_float(
                settings,
                "BLOOMFILTER_MONITOR_MAX_FPR",
                lambda v: 0 < v < 1,
                "It must be a false-positive rate between 0 and 1, e.g. 0.001.",
            ),
        )


def _sizing(settings: SettingsLike, share: float = 1.0) -> tuple[Sizing, int | None]:
    """Read the sizing settings; return the request and the stated capacity, if any.

    ``share``: the part of the error rate generation 0 is sized for (see
    :attr:`.sizing.Sizing.rate_share`).
    """
    bit = _int(
        settings,
        "BLOOMFILTER_BIT",
        lambda v: 1 <= v <= MAX_BIT,
        f"It must be an integer from 1 to {MAX_BIT} (the filter has 2**BIT bits).",
    )
    hash_number = _int(
        settings,
        "BLOOMFILTER_HASH_NUMBER",
        lambda v: 1 <= v <= MAX_HASH_NUMBER,
        f"It must be an integer from 1 to {MAX_HASH_NUMBER}.",
    )
    capacity = _int(
        settings,
        "BLOOMFILTER_CAPACITY",
        lambda v: v > 0,
        "It must be a positive integer (the number of items you expect).",
    )
    error_rate = _float(
        settings,
        "BLOOMFILTER_ERROR_RATE",
        lambda v: 0 < v < 1,
        "It must be a number strictly between 0 and 1, e.g. 0.001.",
    )
    shard_bit = _int(
        settings,
        "BLOOMFILTER_SHARD_BIT",
        lambda v: MIN_SHARD_BIT <= v <= MAX_SHARD_BIT,
        f"It must be an integer from {MIN_SHARD_BIT} to {MAX_SHARD_BIT}: a shard holds"
        f" at most 2**{MAX_SHARD_BIT} bits (Redis's 512 MB string limit).",
    )
    blocked = boolean_setting(settings, "BLOOMFILTER_BLOCKED")
    block_bits = BLOCK_BITS if blocked else 0
    shards = _int(
        settings,
        "BLOOMFILTER_SHARDS",
        lambda v: v >= 1,
        "It must be a positive integer (the number of Redis keys the bits are split over).",
    )
    if shards is not None and shard_bit is not None:
        raise ValueError(
            "The settings BLOOMFILTER_SHARDS and BLOOMFILTER_SHARD_BIT contradict each other:"
            " give the number of shards or the largest shard size, not both."
        )
    if error_rate is not None:
        given = [
            n
            for n, v in (("BLOOMFILTER_BIT", bit), ("BLOOMFILTER_HASH_NUMBER", hash_number))
            if v is not None
        ]
        if given:
            raise ValueError(
                f"The settings BLOOMFILTER_ERROR_RATE and {' and '.join(given)} contradict"
                " each other: size the filter either by BLOOMFILTER_CAPACITY and"
                " BLOOMFILTER_ERROR_RATE, or by BLOOMFILTER_BIT and BLOOMFILTER_HASH_NUMBER."
            )
        if capacity is None:
            raise ValueError(
                "The BLOOMFILTER_ERROR_RATE setting needs BLOOMFILTER_CAPACITY: the error"
                " rate holds for a given number of items."
            )
    if capacity is not None and bit is None and hash_number is None:
        rate = DEFAULT_ERROR_RATE if error_rate is None else error_rate
        bits, k = optimal_geometry(capacity, rate * share, block_bits)
        if k > MAX_HASH_NUMBER:
            raise _invalid(
                "BLOOMFILTER_ERROR_RATE",
                rate,
                f"It needs {k} hash functions; at most {MAX_HASH_NUMBER} are supported,"
                " so the error rate must be at least 1e-19.",
            )
        if bits > 2**MAX_BIT:
            raise _invalid(
                "BLOOMFILTER_CAPACITY",
                settings.get("BLOOMFILTER_CAPACITY"),
                f"At error rate {rate:g} it needs {bits:,} bits, more than the 2**{MAX_BIT}"
                " supported: lower the capacity or raise BLOOMFILTER_ERROR_RATE.",
            )
        sizing = Sizing(
            capacity=capacity,
            error_rate=rate,
            shard_bit=shard_bit,
            shards=shards,
            blocked=blocked,
            rate_share=share,
        )
    else:
        bit = DEFAULT_BIT if bit is None else bit
        hash_number = DEFAULT_HASH_NUMBER if hash_number is None else hash_number
        sizing = Sizing(
            bit=bit, hash_number=hash_number, shard_bit=shard_bit, shards=shards, blocked=blocked
        )
    bits = sizing.geometry()[0]
    if shards is not None:
        if shards > bits:
            raise _invalid(
                "BLOOMFILTER_SHARDS", shards, f"The filter has only {bits:,} bits to split."
            )
        if -(-bits // shards) > MAX_SHARD_BITS:
            raise _invalid(
                "BLOOMFILTER_SHARDS",
                shards,
                f"Each of its shards would hold {-(-bits // shards):,} bits, more than a Redis"
                f" string holds ({MAX_SHARD_BITS:,} after the shard header): use at least"
                f" {-(-bits // MAX_SHARD_BITS):,} shards for {bits:,} bits.",
            )
    return sizing, capacity

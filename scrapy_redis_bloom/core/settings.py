"""Settings to a validated, immutable filter configuration, through one table of settings.

:data:`SETTINGS` describes every ``BLOOMFILTER_*`` setting once: the configuration, the docs'
reference and the commands' options all read its rows. A bad value raises :class:`ValueError`
naming the setting, the value and what is allowed, so a crawl fails at startup, not halfway.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Literal, Protocol, TypeVar, cast, get_args
from urllib.parse import parse_qs, urlsplit

from redis.connection import parse_url as _redis_parse_url

from scrapy_redis_bloom.core.errors import SettingError, SettingName, Wording
from scrapy_redis_bloom.core.generations import (
    DEFAULT_EXPANSION,
    DEFAULT_TIGHTENING,
    Growth,
    growth_text,
)
from scrapy_redis_bloom.core.hashing import MAX_HASH_COUNT, MAX_SHARD_BITS, FilterSpec
from scrapy_redis_bloom.core.record import Backend, FilterRecord
from scrapy_redis_bloom.core.redact import masked, scrub
from scrapy_redis_bloom.core.sizing import (
    DEFAULT_SHARD_BIT,
    Sizing,
    false_positive_rate,
    format_bytes,
    native_link,
    optimal_capacity,
    optimal_geometry,
    rate_share,
)

#: The largest filter: 2**47 bits = 16 TiB, within :data:`.hashing.MAX_SHARDS` by default.
MAX_BIT = 47

OnError = Literal["raise", "allow"]
OnLoss = Literal["raise", "recreate"]
#: BLOOMFILTER_BACKEND: by what the servers offer, our bitmaps, or BF.* (:mod:`.engine.native`).
BackendSetting = Literal["auto", "bitmap", "native"]
Fingerprinter = Literal["scrapy-redis", "crawler"]

_T = TypeVar("_T")


class SettingsLike(Protocol):
    """What the configuration needs of a settings object: Scrapy ``Settings`` or a dict."""

    def get(self, name: str, default: Any = None) -> Any:
        """Return the value of a setting, or ``default`` when it is not set."""


def _refuse(template: str, **values: object) -> SettingError:
    """Return a :class:`SettingError` whose message (a :class:`Wording`) names settings."""
    return SettingError(Wording(template, **values))


def _invalid(name: str, value: object, allowed: str | Wording) -> SettingError:
    """Return the error for a bad setting: its name, value (secrets masked), what is allowed."""
    return _refuse(
        "The value of the {name} {setting} ({value}) is invalid. {allowed}",
        name=SettingName(name),
        value=masked(value),
        allowed=allowed,
    )


def _boolean(name: str, raw: object) -> bool:
    """Read a boolean as Scrapy's ``getbool`` does, refusing anything else by name."""
    value = raw.lower() if isinstance(raw, str) else raw
    if value in (True, 1, "true", "1"):
        return True
    if value in (False, 0, "false", "0"):
        return False
    raise _invalid(name, raw, "It must be a boolean: True, False, 1 or 0.")


def boolean_setting(settings: SettingsLike, name: str) -> bool:
    """Read a boolean setting by name (``DUPEFILTER_DEBUG``); False if unset."""
    raw = settings.get(name)
    return raw is not None and _boolean(name, raw)


#: redis-py's reading of a Redis URL (untyped there).
parse_url: Callable[[str], dict[str, Any]] = _redis_parse_url


def check_url(name: str, value: object, where: object = None) -> str:
    """Check a Redis URL as redis-py will read it: scheme, port, database, query."""
    shown = value if where is None else where
    if not isinstance(value, str) or not value.startswith(("redis://", "rediss://", "unix://")):
        raise _invalid(
            name,
            shown,
            "It must be a Redis URL: redis://[user[:password]@]host[:port][/db],"
            " rediss://... (TLS) or unix:///path/to/socket.",
        )
    try:
        parse_url(value)  # redis-py's own reading; its messages carry no password
        path = urlsplit(value).path
    except ValueError as exc:
        raise _invalid(name, shown, f"It is not a valid Redis URL: {scrub(str(exc))}") from None
    if not value.startswith("unix://") and path not in ("", "/") and not path[1:].isdigit():
        raise _invalid(name, shown, f"Its database ({path[1:]!r}) must be a number, e.g. /0.")
    query = parse_qs(urlsplit(value).query).get("db", [])
    if path[1:].isdigit() and query and query[-1] != path[1:]:  # (redis-py takes the query's)
        raise _invalid(
            name, shown, f"Its database is given twice (/{path[1:]} and db={query[-1]})."
        )
    return value


#: Client arguments a Redis URL gives: given in BLOOMFILTER_REDIS_PARAMS too, the URL's win.
_ADDRESS_PARAMS = ("host", "port", "unix_socket_path", "path")


def _url_db(url: str) -> bool:
    """Tell whether a (checked) Redis URL names a database, by its path or its query."""
    parts = urlsplit(url)
    return parts.path[1:].isdigit() or "db" in parse_qs(parts.query)


def _distinct(
    name: str, value: object, allowed: str, what: str, read: Callable[[Any], _T]
) -> tuple[_T, ...]:
    """Read a non-empty list (or comma-separated string) of entries; refuse a ``what`` twice."""
    listed = value.split(",") if isinstance(value, str) else value
    if not isinstance(listed, (list, tuple)) or not listed:
        raise _invalid(name, value, allowed)
    found = tuple(map(read, listed))
    if len(set(found)) != len(found):
        raise _invalid(name, value, f"It lists the same {what} more than once.")
    return found


def _url_list(name: str, value: object) -> tuple[str, ...]:
    """Read a non-empty list of distinct Redis URLs, or one comma-separated string of them."""
    return _distinct(
        name,
        value,
        "It must be a non-empty list of Redis URLs (or one comma-separated string).",
        "server",
        lambda url: check_url(name, url.strip() if isinstance(url, str) else url, value),
    )


def key_problem(value: object) -> str | None:
    """Return why a filter key (the setting's, or a constructor's) cannot name Redis keys."""
    if not isinstance(value, str) or not value:
        return "It must be a non-empty string."
    if "{" in value or "}" in value:
        return "It must not contain { or }: the filter derives Redis Cluster hash tags from it."
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            return "It must be text that UTF-8 can encode (it has a lone surrogate)."
    return None


def check_key(key: object) -> str:
    """Check a filter's key (filled in) as a constructor takes it: TypeError, or ValueError."""
    why = key_problem(key)
    if isinstance(key, str) and why is None:
        return key
    error = ValueError if isinstance(key, str) else TypeError
    raise error(f"The Bloom filter's key ({key!r}, a {type(key).__name__}) is invalid. {why}")


def _key(name: str, value: object) -> str:
    """Check a filter key (before ``%(spider)s`` is filled in): it must name Redis keys."""
    if (why := key_problem(value)) is not None:
        raise _invalid(name, value, why)
    assert isinstance(value, str)
    if re.sub(r"%%|%\(spider\)s", "", value).count("%"):
        raise _invalid(
            name,
            value,
            "It may contain the placeholder %(spider)s and no other %-sequences"
            " (write a literal % as %%).",
        )
    return value


#: Client keyword arguments that must be numbers (seconds, counts, indexes).
_NUMERIC_PARAMS = (
    "socket_timeout", "socket_connect_timeout", "health_check_interval", "port", "db",
    "max_connections",
)  # fmt: skip


def client_params(name: str, params: object) -> dict[str, Any]:
    """Check a dict of Redis client keyword arguments (``name`` is its setting)."""
    if params is None:
        return {}
    if isinstance(params, str):  # -s NAME='{"socket_timeout": 30}', as Scrapy's getdict reads it
        with contextlib.suppress(ValueError):
            params = json.loads(params)
    if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
        raise _refuse(  # its value is not shown: it may hold a password in any form
            "The value of the {name} {setting} (a {type}) is invalid. It must be a dict of"
            " keyword arguments for the Redis client, e.g. {{'socket_timeout': 30}}, or its"
            " JSON on the command line.",
            name=SettingName(name),
            type=type(params).__name__,
        )
    for param in _NUMERIC_PARAMS:
        value = params.get(param)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _invalid(name, params, f"Its {param!r} must be a number, not {masked(value)}.")
        positive = param.endswith("timeout")  # (0 makes a socket non-blocking: every call fails)
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            least = "above 0" if positive else "0 or more"
            raise _invalid(
                name, params, f"Its {param!r} must be a finite number {least}, not {value!r}."
            )
    return params


#: A host name or IP address (IPv6 in brackets): no user, password, scheme or path.
_HOST = re.compile(r"[A-Za-z0-9._%-]+|\[[0-9A-Fa-f:.%]+\]")


def parse_sentinels(name: str, value: object) -> tuple[tuple[str, int], ...]:
    """Read the Sentinel addresses of ``name``: ``"host:port"``, ``(host, port)``, or a string."""
    allowed = (
        "It must be a non-empty list of Sentinel addresses, e.g."
        " ['10.0.0.1:26379', '10.0.0.2:26379'] (or [('10.0.0.1', 26379), ...], or one"
        " comma-separated string)."
    )

    def address(entry: object) -> tuple[str, int]:
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
        return host.strip("[]"), port

    return _distinct(name, value, allowed, "Sentinel", address)


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


#: Client arguments that name one server: with Sentinel, the sentinels name the primary.
_ONE_SERVER_PARAMS = ("host", "port", "url", "unix_socket_path", "path")


def check_sentinel_params(name: str, params: dict[str, Any]) -> None:
    """Refuse client arguments that would name the server the sentinels are to name."""
    if fixed := [param for param in _ONE_SERVER_PARAMS if param in params]:
        raise _invalid(
            name,
            params,
            f"With Sentinel the primary's address comes from the sentinels: remove"
            f" {', '.join(map(repr, fixed))}.",
        )
    client_params(f"{name}['sentinel_kwargs']", params.get("sentinel_kwargs"))


#: How a setting is read: a number in a range, a boolean, one of a few words, or by ``parse``.
Kind = Literal["int", "float", "bool", "choice", "text"]
#: The reference's type of a kind, where it is not the kind's own name.
_TYPE_CELL: dict[Kind, str] = {"choice": "str", "text": ""}


def _figure(value: float | None) -> str:
    """Write a bound as the README does: no needless decimals, thousands separated from 10,000."""
    if value is None:
        return ""
    if not float(value).is_integer():
        return f"{value:g}"
    return f"{value:,.0f}" if value >= 10_000 else f"{value:.0f}"


@dataclass(frozen=True, slots=True, eq=False)  # a row is itself: compared by identity
class Setting(Generic[_T]):
    """One setting: how it is read and checked, its default, and its row in the reference.

    Numbers: ``low`` to ``high`` (None: unbounded), excluded when ``open``, and 0 too when
    ``zero``; ``rule``: the error's second sentence. ``text``: checked by ``parse``.
    """

    name: str
    kind: Kind
    default: _T
    meaning: str
    low: float | None = None
    high: float | None = None
    shape: str = ""
    rule: str = ""
    open: bool = False
    zero: bool = False
    choices: tuple[str, ...] = ()
    parse: Callable[[str, Any], Any] | None = None
    allowed: str = ""
    default_text: str = ""

    def given(self, settings: SettingsLike) -> _T | None:
        """Return the checked value, or None when the setting is not set."""
        raw = settings.get(self.name)
        return None if raw is None else self.check(raw)

    def read(self, settings: SettingsLike) -> _T:
        """Return the checked value, or the default when the setting is not set."""
        value = self.given(settings)
        return self.default if value is None else value

    def check(self, raw: object) -> _T:
        """Return the value ``raw`` stands for; raise ValueError naming the setting if bad."""
        if self.parse is not None:
            return cast(_T, self.parse(self.name, raw))
        if self.kind == "bool":
            return cast(_T, _boolean(self.name, raw))
        if self.kind == "choice":
            if raw not in self.choices:
                raise _invalid(self.name, raw, self.rule)
            return cast(_T, self.choices[self.choices.index(raw)])
        integer = self.kind == "int"  # a number, or a string of one: finite (whole), in range
        try:
            if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
                raise TypeError
            value = float(raw)
            if not math.isfinite(value) or (integer and not value.is_integer()):
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            raise _invalid(self.name, raw, self.message) from None
        if integer:
            value = raw if isinstance(raw, int) else int(value)  # exact beyond a float's 53 bits
        low = self.low is None or (value > self.low if self.open else value >= self.low)
        high = self.high is None or (value < self.high if self.open else value <= self.high)
        if not ((self.zero and value == 0) or (low and high)):
            raise _invalid(self.name, raw, self.message)
        return cast(_T, value)

    @property
    def message(self) -> str:
        """What the error for a bad value says is allowed."""
        return self.rule.format(low=self.low, high=self.high)

    @property
    def type_text(self) -> str:
        """The reference's type: ``int``, ``float, seconds``, ``list of str``..."""
        return ", ".join(filter(None, (_TYPE_CELL.get(self.kind, self.kind), self.shape)))

    @property
    def allowed_text(self) -> str:
        """The reference's allowed values: a range, the words, or what ``parse`` accepts."""
        if self.kind == "bool":
            return "`True` or `False`"
        if self.kind == "choice":  # `"a"`, `"b"` or `"c"`
            quoted = [f'`"{choice}"`' for choice in self.choices]
            return ", ".join(quoted[:-1]) + " or " + quoted[-1]
        if self.kind == "text":
            return self.allowed
        low, high = _figure(self.low), _figure(self.high)
        if self.open:
            return f"({low}, {high})"
        span = f"≥ {low}" if self.high is None else f"{low}\N{EN DASH}{high}"
        return f"0, or {span}" if self.zero else span

    @property
    def default_cell(self) -> str:
        """The reference's default: the value as it is written in settings.py."""
        if self.default_text:
            return self.default_text
        value: object = self.default
        if value is None or value == ():
            return "—"
        if isinstance(value, str):
            return f'`"{value}"`'
        if isinstance(value, int) and not isinstance(value, bool):
            return f"`{value:_}`"
        if isinstance(value, float):
            return f"`{value:g}`"
        return f"`{value!r}`"

    def row(self) -> str:
        """Return the setting's row of the settings reference's table."""
        cells = (f"`{self.name}`", self.type_text, self.default_cell, self.allowed_text)
        return f"| {' | '.join(cells)} | {self.meaning} |"

    def summary(self) -> str:
        """One plain line for a command's help: ``BLOOMFILTER_BIT (int, 1-47; default 30)``."""
        default = "" if self.default_cell == "—" else f"; default {self.default_cell}"
        return f"{self.name} ({self.type_text}, {self.allowed_text}{default})".replace("`", "")


def _row(head: tuple[Any, ...], meaning: str, **more: Any) -> Setting[Any]:
    """Return a row of the table: ``head`` is ``(name, kind, default[, low[, high[, shape]]])``."""
    name, kind, default, *bounds = head
    return Setting(name, kind, default, meaning, *bounds, **more)


CAPACITY: Setting[int | None] = _row(
    ("BLOOMFILTER_CAPACITY", "int", None, 1),
    "Items you expect. With `BLOOMFILTER_ERROR_RATE` (or alone, with its default) it sizes the"
    " filter; beside `BLOOMFILTER_BIT` it states the load at which the filter grows (a"
    " fixed-size one warns) and its expected false-positive rate is logged, refused where that"
    " rate would pass 0.1 by then."
    " Example: `1_000_000_000`.",
    rule="It must be a positive integer (the number of items you expect).",
)
ERROR_RATE: Setting[float] = _row(
    ("BLOOMFILTER_ERROR_RATE", "float", 0.001, 0, 1),
    "False-positive rate wanted at capacity. Needs `BLOOMFILTER_CAPACITY`. Example: `0.0001`.",
    rule="It must be a number strictly between 0 and 1, e.g. 0.001.",
    default_text="`0.001` when only a capacity is given",
    open=True,
)
BIT: Setting[int] = _row(
    ("BLOOMFILTER_BIT", "int", 30, 1, MAX_BIT),
    "The filter has 2**BIT bits (rounded up to whole allocator blocks). Example: `32` (512 MiB)."
    ' Bitmap backend only: refused with `BLOOMFILTER_BACKEND = "native"` (BF.* filters are sized by'
    ' capacity and error rate); `"auto"` takes bitmaps for a new filter sized by it.',
    rule="It must be an integer from {low} to {high} (the filter has 2**BIT bits).",
)
HASH_NUMBER: Setting[int] = _row(
    ("BLOOMFILTER_HASH_NUMBER", "int", 6, 1, MAX_HASH_COUNT),
    "k, the number of hash functions, with `BLOOMFILTER_BIT`. Bitmap backend only, as"
    " `BLOOMFILTER_BIT`.",
    rule="It must be an integer from {low} to {high}.",
)
EXPANSION: Setting[int] = _row(
    ("BLOOMFILTER_EXPANSION", "int", DEFAULT_EXPANSION, 2, 1024),
    "When a shard's newest generation holds its capacity, the next add starts one with EXPANSION x"
    " the items at half the error rate, so the filter never fills up (see"
    " [Growth](#growth-and-re-crawl-windows)). 0: a fixed-size filter, whose rate rises past its"
    " capacity. Stored in the filter's record: a filter keeps the expansion it was created with.",
    rule="It must be 0 (a fixed-size filter) or an integer from {low} to {high}: how many times the"
    " items of the generation before a new one takes.",
    zero=True,
)
TTL: Setting[int] = _row(
    ("BLOOMFILTER_TTL", "int", 0, 0, 10 * 365 * 86_400, "seconds"),
    'Re-crawl window: a URL answered "new" is remembered at least TTL seconds and forgotten within'
    " 2 x TTL, then may be crawled again. 0: remember forever. With a TTL, `BLOOMFILTER_CAPACITY`"
    " is the items added per TTL. All workers must use the same TTL (a worker with another is"
    " refused).",
    rule="It must be 0 (remember URLs forever) or a whole number of seconds up to {high:,} (ten"
    " years) after which a URL may be crawled again.",
)
KEY: Setting[str] = _row(
    ("BLOOMFILTER_KEY", "text", "%(spider)s:bloomfilter"),
    "Redis key prefix of the filter; `%(spider)s` is the spider's name. Example:"
    ' `"bf:%(spider)s"`.',
    allowed="not empty; no `{` or `}`; no %-sequence but `%(spider)s` and `%%`",
    parse=_key,
    shape="str",
)
BLOCKED: Setting[bool | None] = _row(
    ("BLOOMFILTER_BLOCKED", "bool", None),
    "Keep each URL's k bits in one 512-bit block (hash scheme 2): on a filter bigger than the CPU's"
    " caches about half the Redis time per check of the classic layout, for 9% more memory at 1e-3,"
    " 19% at 1e-4 (see [Layouts](#layouts-classic-blocked-native)). Unset: blocked for a new bitmap"
    " filter, unblocked for a native one, and an existing filter keeps the layout it was created"
    " with. `False`: the classic (unblocked) layout, hash scheme 3 for a new filter (1 for one"
    " created by an earlier build); `True`: blocked (bitmap backend only). Stored in the filter's"
    " record: a worker asking for the other layout is refused.",
    default_text="blocked for a new bitmap filter",
)
SHARD_BIT: Setting[int] = _row(
    # 7: the smallest allocator block past a shard's header and overhead; 32: a Redis string.
    ("BLOOMFILTER_SHARD_BIT", "int", DEFAULT_SHARD_BIT, 7, 32),
    "Largest shard, as 2**SHARD_BIT bits (26: 8 MiB). Shards may come out smaller so that they fill"
    " their allocator blocks; a native filter takes as few as this allows, each shard's first"
    " sub-filter (what BF.RESERVE makes) within it. A blocked filter's"
    " shards hold whole 512-bit blocks: 9 or more."
    " Larger shards grow fewer times: a generation is at most 512 MB, so a shard of 2**27 bits"
    " or more reaches it in fewer generations, and one already near it cannot grow"
    " (`scrapy bloom size` and the crawl's startup line say how far the filter grows).",
    rule="It must be an integer from {low} to {high}: a shard holds at most 2**{high} bits (Redis's"
    " 512 MB string limit).",
)
SHARDS: Setting[int | None] = _row(
    ("BLOOMFILTER_SHARDS", "int", None, 1),
    "Exact number of shards instead (each ≤ 2**32 - 256 bits). Not together with"
    " `BLOOMFILTER_SHARD_BIT`. Few large shards grow fewer times, or not at all: a"
    " generation is at most 512 MB (`scrapy bloom size` and the crawl's startup line say how"
    " far the filter grows).",
    rule="It must be a positive integer (the number of Redis keys the bits are split over).",
)
REDIS_URL: Setting[str | None] = _row(
    ("BLOOMFILTER_REDIS_URL", "text", None),
    "The filter's own Redis, when it should not live beside the queue. Example:"
    ' `"redis://bloom-host:6379/0"`.',
    allowed="`redis://[user[:password]@]host[:port][/db]`, `rediss://...` (TLS) or"
    " `unix:///path/to/socket`",
    default_text="— (scrapy-redis's connection)",
    parse=check_url,
    shape="str",
)
REDIS_CLUSTER: Setting[bool] = _row(
    ("BLOOMFILTER_REDIS_CLUSTER", "bool", False),
    "Treat `BLOOMFILTER_REDIS_URL` as a node of a Redis Cluster (redis-py's `RedisCluster`),"
    " or `BLOOMFILTER_REDIS_URLS` as several: the client starts from any that answers.",
)
REDIS_URLS: Setting[tuple[str, ...]] = _row(
    ("BLOOMFILTER_REDIS_URLS", "text", ()),
    'Several standalone servers; shard i lives on server i mod n. Example: `["redis://r1:6379",'
    ' "redis://r2:6379"]`.',
    allowed="Redis URLs, at least one, none twice (or one comma-separated string)",
    parse=_url_list,
    shape="list of str",
)
REDIS_PARAMS: Setting[dict[str, Any]] = _row(
    ("BLOOMFILTER_REDIS_PARAMS", "text", {}),
    "Client keyword arguments for the URLs above (e.g. TLS options; not the host, port or"
    " database a URL gives), or for the primary the"
    " sentinels name (`password`, `db`, TLS; `sentinel_kwargs` for the sentinels' own"
    " connections).",
    allowed="keyword arguments of the Redis client (`socket_timeout`, `port`, `db`... numbers)",
    parse=client_params,
    shape="dict",
)
SENTINELS: Setting[tuple[tuple[str, int], ...]] = _row(
    ("BLOOMFILTER_REDIS_SENTINELS", "text", ()),
    "The filter's own Sentinel-managed primary, found through these sentinels and followed through"
    " failovers (see [Sentinel](#sentinel)). Needs `BLOOMFILTER_REDIS_SENTINEL_SERVICE`; not with"
    ' the URL settings. Example: `["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"]`.',
    allowed='`"host:port"` or `(host, port)`, at least one, none twice (or one comma-separated'
    " string)",
    parse=parse_sentinels,
    shape='list of `"host:port"`',
)
SENTINEL_SERVICE: Setting[str] = _row(
    ("BLOOMFILTER_REDIS_SENTINEL_SERVICE", "text", ""),
    "The name the sentinels monitor the primary under (`sentinel monitor <name> ...`). Example:"
    ' `"mymaster"`.',
    allowed="a name without surrounding spaces",
    default_text="—",
    parse=sentinel_service,
    shape="str",
)
ADDON_SCHEDULER: Setting[bool] = _row(
    ("BLOOMFILTER_ADDON_SCHEDULER", "bool", False),
    "With the [add-on](#activate): also set `SCHEDULER` to scrapy-redis's Scheduler (its"
    " subclass `scrapy_redis_bloom.scheduler.Scheduler`, whose flush keeps the queue while"
    " other workers keep the filter).",
)
ADDON_BATCHING: Setting[bool] = _row(
    ("BLOOMFILTER_ADDON_BATCHING", "bool", False),
    "With the add-on: also enable `BatchingMiddleware` at order 0 (an order your"
    " `SPIDER_MIDDLEWARES` gives it wins).",
)
WORKER_TTL: Setting[float] = _row(
    ("BLOOMFILTER_WORKER_TTL", "float", 30.0, 1, 86_400, "seconds"),
    "Seconds a worker's lease lasts unless renewed (it renews every third of that).",
    rule="It must be a number of seconds from {low} to {high:,} (a day).",
)
RETRY_TIMEOUT: Setting[float] = _row(
    ("BLOOMFILTER_RETRY_TIMEOUT", "float", 20.0, 0, 3600, "seconds"),
    "Seconds a failing Redis call is retried (backoff 50 ms to 1 s, across reconnects) before"
    " `BLOOMFILTER_ON_ERROR` decides. Long enough for a restart or a failover; `0` never retries."
    " See [Faults](#faults).",
    rule="It must be a number of seconds from {low} (no retry) to {high}.",
)
ON_ERROR: Setting[OnError] = _row(
    ("BLOOMFILTER_ON_ERROR", "choice", "raise"),
    'When Redis stays unavailable past the retry timeout: `"raise"` a `FilterUnavailableError`'
    " naming the server and the operation, and stop the crawl (finish reason `bloomfilter_error`);"
    ' `"allow"` the request (answer "new": it may be fetched twice), count it in'
    " `bloomfilter/errors` and warn once a minute.",
    rule="It must be 'raise' (stop with an error once retries are exhausted, the default) or"
    " 'allow' (let the request through: a possible duplicate fetch).",
    choices=get_args(OnError),
)
ON_LOSS: Setting[OnLoss] = _row(
    ("BLOOMFILTER_ON_LOSS", "choice", "raise"),
    "When part of the filter is gone (a shard evicted or deleted, a server emptied or replaced):"
    ' `"raise"` a `FilterDamagedError` naming the parts, and stop the crawl; or `"recreate"` the'
    " lost parts empty and go on, with a warning (the URLs they held may be fetched again, never"
    " dropped).",
    rule="It must be 'raise' (stop with an error when part of the filter is lost, the default) or"
    " 'recreate' (recreate the lost part empty and go on).",
    choices=get_args(OnLoss),
)
BACKEND: Setting[BackendSetting] = _row(
    ("BLOOMFILTER_BACKEND", "choice", "auto"),
    "Where the bits live: our sharded bitmaps, or the server's own Bloom filters (BF.*);"
    ' `"auto"` takes native where every server has BF.* and no bitmap setting'
    " (`BLOOMFILTER_BIT`, `_HASH_NUMBER`, `_BLOCKED = True`) is given (see [Native Bloom"
    " filters](#native-bloom-filters-bf)). Stored in the filter's record.",
    rule="It must be 'auto' (the server's own Bloom filters when every server has BF.*, else"
    " bitmaps; the default), 'bitmap' or 'native' (BF.*: Redis 8, Redis Stack, RedisBloom or"
    " valkey-bloom).",
    choices=get_args(BackendSetting),
)
BATCH_MAX: Setting[int] = _row(
    ("BLOOMFILTER_BATCH_MAX", "int", 1000, 1),
    "Most requests `BatchingMiddleware` holds before checking them together (see [One round trip"
    " per page](#one-round-trip-per-page)).",
    rule="It must be a whole number of at least {low}: the requests held before they are checked.",
)
BATCH_WINDOW: Setting[float] = _row(
    ("BLOOMFILTER_BATCH_WINDOW", "float", 0.0, 0, 10, "seconds"),
    "How long `BatchingMiddleware` holds a response's requests to check them with those of other"
    " responses: one round trip for several pages (see [One round trip per"
    " page](#one-round-trip-per-page)). Needs the asyncio reactor (Scrapy's default); ignored, with"
    " a WARNING, under another.",
    rule="It must be a number of seconds from {low} (off) to {high}: how long a response's requests"
    " wait to be checked with those of other responses.",
    default_text="`0` (off)",
)
CACHE_SIZE: Setting[int] = _row(
    ("BLOOMFILTER_CACHE_SIZE", "int", 100_000, 0, 100_000_000),
    "Fingerprints each worker remembers locally (the near-cache, about 150 bytes each: 15 MB by"
    " default). `0` turns it off.",
    rule="It must be an integer from {low} (no near-cache) to {high:,}: the number of fingerprints"
    " this worker remembers locally.",
)
MONITOR_MAX_FPR: Setting[float | None] = _row(
    ("BLOOMFILTER_MONITOR_MAX_FPR", "float", None, 0, 1),
    "The false-positive rate above which the Spidermon `FalsePositiveRateMonitor` fails a crawl"
    " (see [Monitoring with Spidermon](#monitoring-with-spidermon)).",
    rule="It must be a false-positive rate between 0 and 1, e.g. 0.001.",
    default_text="the filter's design rate",
    open=True,
)
FINGERPRINTER: Setting[Fingerprinter] = _row(
    ("BLOOMFILTER_FINGERPRINTER", "choice", "scrapy-redis"),
    "Which fingerprint is hashed: scrapy-redis's, or the crawler's `REQUEST_FINGERPRINTER_CLASS`."
    " The record of a filter a crawl created names the function (and class) that made its"
    " fingerprints: a worker making others is refused, since the requests it holds would all"
    " look new (one created by `scrapy bloom` or the Python API does not say: not compared).",
    rule="It must be 'scrapy-redis' (scrapy-redis's fingerprint, the default) or 'crawler' (the"
    " crawler's REQUEST_FINGERPRINTER_CLASS).",
    choices=get_args(Fingerprinter),
)

#: Every ``BLOOMFILTER_*`` setting, in the order of the rows above: the docs' reference's.
SETTINGS: tuple[Setting[Any], ...] = tuple(
    v for v in dict(globals()).values() if isinstance(v, Setting)
)
_BY_NAME = {setting.name: setting for setting in SETTINGS}


def refuse_unknown(settings: SettingsLike) -> None:
    """Refuse a ``BLOOMFILTER_*`` name that is no setting (misspelt, it would go unread).

    In another case, one close to ours: Scrapy's names are case-sensitive
    (``-s bloomfilter_capacity=...`` would go unread).
    """
    if not isinstance(settings, Iterable):
        return
    ours = (n for n in settings if isinstance(n, str) and n.upper().startswith("BLOOMFILTER_"))
    for name in sorted(ours):
        if name in _BY_NAME:
            continue
        cut = len("BLOOMFILTER_")  # alike in every name: compared, it hides the difference
        tails = {known[cut:]: known for known in _BY_NAME}
        close = [tails[t] for t in difflib.get_close_matches(name[cut:].upper(), tails, n=1)]
        if not close and not name.startswith("BLOOMFILTER_"):
            continue  # (another case, like none of ours: a project's own setting, perhaps)
        hint = "Did you mean {close}?" if close else "See the settings reference for the names."
        raise _refuse(
            "The {setting} {name} is unknown: no setting of scrapy-redis-bloom has this name,"
            " so its value would be ignored. " + hint,
            name=name,
            close=SettingName(close[0]) if close else "",
        )


def setting(name: str) -> Setting[Any]:
    """Return the row of a setting by its name (KeyError for a name not in the table)."""
    return _BY_NAME[name]


def reference() -> str:
    """Return the docs' settings reference table, in Markdown (``docs/_ext/srb_reference.py``)."""
    head = "| setting | type | default | allowed | meaning |\n|---|---|---|---|---|\n"
    return head + "".join(row.row() + "\n" for row in SETTINGS)


@dataclass(frozen=True, slots=True)
class ConnectionConfig:
    """Where the bits live if not on scrapy-redis's connection: ``urls`` or ``sentinels``."""

    urls: tuple[str, ...] = ()
    cluster: bool = False
    params: tuple[tuple[str, Any], ...] = ()
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""

    @classmethod
    def from_settings(cls, settings: SettingsLike) -> ConnectionConfig:
        """Read ``BLOOMFILTER_REDIS_*``. Raises ValueError naming a bad setting."""
        url = REDIS_URL.given(settings)
        urls = REDIS_URLS.read(settings)
        if url is not None and urls:
            raise _refuse(
                "The {settings} {BLOOMFILTER_REDIS_URL} and {BLOOMFILTER_REDIS_URLS}"
                " contradict each other: give one server (or cluster node) or a list of"
                " servers, not both."
            )
        found = urls if url is None else (url,)
        cluster = REDIS_CLUSTER.read(settings)
        if cluster and not found:
            raise _refuse(
                "The {BLOOMFILTER_REDIS_CLUSTER} {setting} needs {BLOOMFILTER_REDIS_URL},"
                " the URL of a node of the cluster to start from (the client discovers the"
                " others), or {BLOOMFILTER_REDIS_URLS}, several (any one that answers will do)."
            )
        sentinels, service = _sentinel_settings(settings, bool(found) or cluster)
        params = REDIS_PARAMS.read(settings)
        if params and not found and not sentinels:
            raise _refuse(
                "The {BLOOMFILTER_REDIS_PARAMS} {setting} needs {BLOOMFILTER_REDIS_URL},"
                " {BLOOMFILTER_REDIS_URLS} or {BLOOMFILTER_REDIS_SENTINELS}; without them"
                " the filter uses scrapy-redis's connection, set by REDIS_URL and"
                " REDIS_PARAMS."
            )
        if sentinels:
            check_sentinel_params(REDIS_PARAMS.name, params)
        given = [p for p in _ADDRESS_PARAMS if p in params] if found else []
        given += ["db"] if "db" in params and any(map(_url_db, found)) else []
        if given:
            raise _refuse(
                "The {BLOOMFILTER_REDIS_PARAMS} {setting} gives {given}, which {url} gives too"
                " (its own would win): give them in the URL alone.",
                given=", ".join(map(repr, given)),
                url=SettingName((REDIS_URL if url is not None else REDIS_URLS).name),
            )
        return cls(found, cluster, tuple(sorted(params.items())), sentinels, service)


def _sentinel_settings(
    settings: SettingsLike, servers: bool
) -> tuple[tuple[tuple[str, int], ...], str]:
    """Read ``BLOOMFILTER_REDIS_SENTINELS`` and ``_SENTINEL_SERVICE``: both, or neither."""
    raw = settings.get(SENTINELS.name)
    service = settings.get(SENTINEL_SERVICE.name)
    if raw is None and service is None:
        return (), ""
    if raw is None or service is None:
        names = (SENTINELS.name, SENTINEL_SERVICE.name)
        given, missing = names if service is None else names[::-1]
        raise _refuse(
            "The {given} {setting} needs {missing}: the sentinels' addresses and the name"
            " they monitor the primary under go together.",
            given=SettingName(given),
            missing=SettingName(missing),
        )
    if servers:
        raise _refuse(
            "The {setting} {BLOOMFILTER_REDIS_SENTINELS} contradicts"
            " {BLOOMFILTER_REDIS_URL}, {BLOOMFILTER_REDIS_URLS} and"
            " {BLOOMFILTER_REDIS_CLUSTER}: give the sentinels of one Sentinel-managed"
            " primary, or the servers themselves, not both."
        )
    return SENTINELS.check(raw), SENTINEL_SERVICE.check(service)


@dataclass(frozen=True, slots=True)
class FaultPolicy:
    """What the filter does when Redis fails it: see the settings of its fields."""

    retry_timeout: float = RETRY_TIMEOUT.default
    on_error: OnError = ON_ERROR.default
    on_loss: OnLoss = ON_LOSS.default
    #: How a failure past the retry timeout names it (None: the setting, as a crawl reads it).
    retry_budget: Wording | None = field(default=None, compare=False)

    @classmethod
    def from_settings(cls, settings: SettingsLike) -> FaultPolicy:
        """Read ``BLOOMFILTER_RETRY_TIMEOUT``, ``_ON_ERROR`` and ``_ON_LOSS``."""
        return cls(RETRY_TIMEOUT.read(settings), ON_ERROR.read(settings), ON_LOSS.read(settings))


@dataclass(frozen=True, slots=True)
class BloomConfig:
    """The resolved, validated configuration of one filter.

    ``sizing`` is what the settings ask for, ``spec`` the geometry this release gives it (a
    filter that exists keeps its own, see :mod:`.record`).
    """

    key: str
    spec: FilterSpec
    capacity: int
    sizing: Sizing = field(
        default_factory=lambda: Sizing(bit=BIT.default, hash_number=HASH_NUMBER.default)
    )
    fingerprinter: Fingerprinter = FINGERPRINTER.default
    connection: ConnectionConfig = field(default_factory=ConnectionConfig)
    worker_ttl: float = WORKER_TTL.default
    cache_size: int = CACHE_SIZE.default
    expansion: int = EXPANSION.default
    ttl: int = TTL.default
    faults: FaultPolicy = field(default_factory=FaultPolicy)
    backend: BackendSetting = BACKEND.default
    #: The false-positive rate above which the Spidermon monitor fails a crawl.
    monitor_max_fpr: float | None = MONITOR_MAX_FPR.default
    #: The settings given that only the bitmap backend keeps (``BLOOMFILTER_BIT``,
    #: ``_HASH_NUMBER``): ``BF.RESERVE`` takes a capacity and a rate, so "auto" takes bitmaps.
    bitmap_only: tuple[str, ...] = ()

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

    def record(self, backend: Backend = "bitmap") -> FilterRecord:
        """Return the record of a new filter of these settings (``servers`` and all else unsaid)."""
        return FilterRecord.new(
            self.spec,
            self.capacity,
            self.sizing.canonical(),
            expansion=self.expansion,
            ttl=self.ttl,
            backend=backend,
        )

    def for_native(self) -> BloomConfig:
        """Return this configuration as a native filter's (BF.*), which has no blocks.

        Under ``BLOOMFILTER_BACKEND = 'auto'`` only the servers tell which backend a new filter
        gets; a capacity derived from the bits follows them.
        """
        if self.sizing.native:
            return self
        sizing = replace(self.sizing, native=True)
        spec = sizing.spec()  # no blocks, and as few shards as its shard size allows
        derived = self.sizing.capacity is None and self.capacity == optimal_capacity(
            self.spec.bits, self.spec.hash_count
        )
        capacity = optimal_capacity(spec.bits, spec.hash_count) if derived else self.capacity
        spec = native_shards(sizing, spec, capacity, self.expansion, self.ttl)
        if derived:
            capacity = optimal_capacity(spec.bits, spec.hash_count)
        return replace(self, sizing=sizing, spec=spec, capacity=capacity)

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
        if (why := key_problem(spider_name)) is not None:
            raise ValueError(
                f"The spider's name ({spider_name!r}) cannot fill in %(spider)s of the"
                f" BLOOMFILTER_KEY setting ({self.key!r}). {why} Give BLOOMFILTER_KEY"
                " without %(spider)s."
            )
        return self.key % {"spider": spider_name}

    def describe(self) -> str:
        """One line for the log: m, k, shards, memory and the rate expected at capacity."""
        spec = self.spec
        text = (
            f"m={spec.bits:,} bits ({format_bytes(spec.total_bytes)}) in {spec.shards:,} shard(s)"
            f" of {spec.shard_bits:,} bits, k={spec.hash_count} hash functions,"
            f" capacity {self.capacity:,} items, expected false-positive rate at capacity"
            f" {self.expected_error_rate:.3g}"
        )
        if self.expansion:
            text += f"; {growth_text(self.growth)}, rate under {self.growth.rate_bound:.3g}"
        if self.ttl:
            text += f"; URLs forgotten {self.ttl:,} to {2 * self.ttl:,} s after being added"
        return text

    @classmethod
    def from_settings(cls, settings: SettingsLike) -> BloomConfig:
        """Read and validate the ``BLOOMFILTER_*`` settings. Raises ValueError.

        An unknown ``BLOOMFILTER_*`` name is refused too (:func:`refuse_unknown`).
        """
        refuse_unknown(settings)
        BATCH_MAX.read(settings)  # the middleware's, checked here too: with it off, a bad
        BATCH_WINDOW.read(settings)  # value would pass unsaid, as no other setting does
        expansion = EXPANSION.read(settings)
        ttl = TTL.read(settings)
        backend = BACKEND.read(settings)
        share = rate_share(expansion, ttl, DEFAULT_TIGHTENING)
        bitmap_only = tuple(s.name for s in (BIT, HASH_NUMBER) if s.given(settings) is not None)
        if bitmap_only and backend == "native":
            raise _refuse(
                "The {given} "
                + ("{settings} do" if bitmap_only[1:] else "{setting} does")
                + " not apply to {BLOOMFILTER_BACKEND} = 'native': the"
                " server's Bloom filters (BF.*) are reserved for a capacity at an error rate,"
                " and choose their own bits and hash functions. Size the filter by"
                " {BLOOMFILTER_CAPACITY} and {BLOOMFILTER_ERROR_RATE} instead, or set"
                " {BLOOMFILTER_BACKEND} = 'bitmap' (or 'auto', which takes bitmaps for a"
                " new filter sized by bits).",
                given=Wording(" and ".join("{" + name + "}" for name in bitmap_only)),
            )
        sizing, capacity = _sizing(settings, share, native=backend == "native")
        if sizing.blocked and backend == "native":
            raise _refuse(
                "The {settings} {BLOOMFILTER_BLOCKED} = True and {BLOOMFILTER_BACKEND} ="
                " 'native' contradict each other: blocks are a layout of the bitmap"
                " backend (the server's BF.* filters have their own). Use"
                " {BLOOMFILTER_BACKEND} = 'bitmap' or 'auto', or leave"
                " {BLOOMFILTER_BLOCKED} unset (or False)."
            )
        try:
            spec = sizing.spec()
        except ValueError as exc:  # only with a shard setting
            row = SHARDS if sizing.shards is not None else SHARD_BIT
            blocks = (
                " A blocked filter's shards hold whole {bits}-bit blocks: give larger shards,"
                " or set {BLOOMFILTER_BLOCKED} = False."
            )
            why = Wording(
                "It cannot split the filter's bits into shards ({exc})."
                + (blocks if sizing.block_bits else ""),
                exc=exc,
                bits=sizing.block_bits,
            )
            raise _invalid(row.name, row.given(settings), why) from None
        if backend == "native":
            wanted = optimal_capacity(spec.bits, spec.hash_count) if capacity is None else capacity
            spec = native_shards(sizing, spec, wanted, expansion, ttl)
        if capacity is not None and sizing.capacity is None:
            _refuse_overload(spec, capacity, share, grows=bool(expansion))
        return cls(
            key=KEY.read(settings),
            spec=spec,
            capacity=optimal_capacity(spec.bits, spec.hash_count) if capacity is None else capacity,
            sizing=sizing,
            fingerprinter=FINGERPRINTER.read(settings),
            connection=ConnectionConfig.from_settings(settings),
            worker_ttl=WORKER_TTL.read(settings),
            expansion=expansion,
            ttl=ttl,
            cache_size=CACHE_SIZE.read(settings),
            faults=FaultPolicy.from_settings(settings),
            backend=backend,
            monitor_max_fpr=MONITOR_MAX_FPR.read(settings),
            bitmap_only=bitmap_only,
        )


#: Bits a native shard's first sub-filter keeps clear of its shard size: RedisBloom's own
#: rounding of its bit array, and a derived capacity's rounding up.
NATIVE_SHARD_SLACK = 1024


def native_shards(
    sizing: Sizing, spec: FilterSpec, capacity: int, expansion: int, ttl: int
) -> FilterSpec:
    """Return a native filter's geometry with as many shards as its shard size asks.

    The size bounds what ``BF.RESERVE`` makes of a shard (its first sub-filter, at the rate
    the record reserves it at), not the bitmap's bits: a sub-filter a little past 2**26 bits
    takes jemalloc's next class (8 MiB and 0.3% is reserved as 10 MiB), which left a fifth
    of a 1B-URL filter's memory unused. Shards the user set (``BLOOMFILTER_SHARDS``) are kept.
    """
    if sizing.shards is not None:
        return spec
    shard_bit = DEFAULT_SHARD_BIT if sizing.shard_bit is None else sizing.shard_bit
    most = min(2**shard_bit, MAX_SHARD_BITS) - NATIVE_SHARD_SLACK
    text = sizing.canonical()
    while True:
        record = FilterRecord.new(
            spec, capacity, text, expansion=expansion, ttl=ttl, backend="native"
        )
        _, bits, _ = native_link(record.growth.native_capacity, record.shard_rate, expansion, 0)
        if bits <= most or most <= 0:  # (shards of 2**10 bits or less: kept as split)
            return spec
        shards = max(spec.shards + 1, math.ceil(spec.shards * bits / most))
        spec = FilterSpec(shards, -(-spec.bits // (8 * shards)) * 8, spec.hash_count)


#: The highest false-positive rate a capacity stated beside BLOOMFILTER_BIT may come to.
MAX_RATE_AT_CAPACITY = 0.1


def _refuse_overload(spec: FilterSpec, capacity: int, share: float, grows: bool) -> None:
    """Refuse a capacity that BLOOMFILTER_BIT's bits cannot hold.

    It is where a shard grows, or where a fixed-size filter warns that it is over its
    capacity: either comes after that share of new URLs was already dropped as seen.
    """
    rate = false_positive_rate(spec.bits, spec.hash_count, capacity, spec.block_bits)
    named: dict[str, object] = {"capacity": capacity, "bit": spec.bits.bit_length() - 1}
    named["default"] = ERROR_RATE.default
    if rate == 0:  # (no generation can be sized by it: each shares out that rate)
        raise _refuse(
            "The {setting} {BLOOMFILTER_CAPACITY} = {capacity:,} is so far below what"
            " {BLOOMFILTER_BIT} = {bit} holds with {k} hash functions that its false-positive"
            " rate underflows to 0. State the capacity the crawl expects: these bits hold"
            " about {holds:,} URLs at a rate of {default:g}.",
            k=spec.hash_count,
            holds=int(spec.bits * math.log(2) ** 2 / -math.log(ERROR_RATE.default)),
            **named,
        )
    if rate < MAX_RATE_AT_CAPACITY:
        return
    bits, _ = optimal_geometry(capacity, ERROR_RATE.default * share, spec.block_bits)
    raise _refuse(
        "The {settings} {BLOOMFILTER_CAPACITY} = {capacity:,} and {BLOOMFILTER_BIT} ="
        " {bit} contradict each other: {bits:,} bits hold {capacity:,} URLs at a"
        " false-positive rate of {rate:.2g}, so that share of new URLs would be dropped as"
        " seen before the filter {when} (at its capacity). Set {BLOOMFILTER_BIT} to at least"
        " {needed} (a rate of {default:g}), or leave it unset and size the filter by"
        " {BLOOMFILTER_CAPACITY} and {BLOOMFILTER_ERROR_RATE}.",
        bits=spec.bits,
        rate=rate,
        needed=(bits - 1).bit_length(),
        when="grows" if grows else "warns that it is full (it does not grow)",
        **named,
    )


def _sizing(settings: SettingsLike, share: float, native: bool) -> tuple[Sizing, int | None]:
    """Read the sizing settings; return the request and the stated capacity, if any."""
    bit = BIT.given(settings)
    hash_number = HASH_NUMBER.given(settings)
    capacity = CAPACITY.given(settings)
    error_rate = ERROR_RATE.given(settings)
    shard_bit = SHARD_BIT.given(settings)
    blocked = BLOCKED.given(settings)
    shards = SHARDS.given(settings)
    if shards is not None and shard_bit is not None:
        raise _refuse(
            "The {settings} {BLOOMFILTER_SHARDS} and {BLOOMFILTER_SHARD_BIT} contradict"
            " each other: give the number of shards or the largest shard size, not both."
        )
    if error_rate is not None:
        given = [s.name for s, v in ((BIT, bit), (HASH_NUMBER, hash_number)) if v is not None]
        if given:
            raise _refuse(
                "The {settings} {BLOOMFILTER_ERROR_RATE} and {given} contradict each other:"
                " size the filter either by {BLOOMFILTER_CAPACITY} and"
                " {BLOOMFILTER_ERROR_RATE}, or by {BLOOMFILTER_BIT} and"
                " {BLOOMFILTER_HASH_NUMBER}.",
                given=Wording(" and ".join("{" + name + "}" for name in given)),
            )
        if capacity is None:
            raise _refuse(
                "The {BLOOMFILTER_ERROR_RATE} {setting} needs {BLOOMFILTER_CAPACITY}: the"
                " error rate holds for a given number of items."
            )
    asked = Sizing(shard_bit=shard_bit, shards=shards, blocked=blocked, native=native)
    if capacity is not None and bit is None and hash_number is None:
        rate = ERROR_RATE.default if error_rate is None else error_rate
        at_least = (
            f"at most {MAX_HASH_COUNT} are supported, so the error rate must be at least 1e-19."
        )
        if rate * share == 0:  # a denormal rate (5e-324): its share underflows, log(0)
            raise _invalid(ERROR_RATE.name, rate, f"It needs too many hash functions; {at_least}")
        bits, k = optimal_geometry(capacity, rate * share, asked.block_bits)
        if k > MAX_HASH_COUNT:
            raise _invalid(ERROR_RATE.name, rate, f"It needs {k} hash functions; {at_least}")
        if bits > 2**MAX_BIT:
            raise _invalid(
                CAPACITY.name,
                settings.get(CAPACITY.name),
                Wording(
                    "At error rate {rate:g} it needs {bits:,} bits, more than the 2**{max_bit}"
                    " supported: lower the capacity or raise {BLOOMFILTER_ERROR_RATE}.",
                    rate=rate,
                    bits=bits,
                    max_bit=MAX_BIT,
                ),
            )
        sizing = replace(asked, capacity=capacity, error_rate=rate, rate_share=share)
    else:
        sizing = replace(asked, bit=BIT.read(settings), hash_number=HASH_NUMBER.read(settings))
    bits = sizing.geometry()[0]
    if shards is not None:
        if shards > bits:
            raise _invalid(SHARDS.name, shards, f"The filter has only {bits:,} bits to split.")
        if -(-bits // shards) > MAX_SHARD_BITS:
            raise _invalid(
                SHARDS.name,
                shards,
                f"Each of its shards would hold {-(-bits // shards):,} bits, more than a Redis"
                f" string holds ({MAX_SHARD_BITS:,} after the shard header): use at least"
                f" {-(-bits // MAX_SHARD_BITS):,} shards for {bits:,} bits.",
            )
    return sizing, capacity

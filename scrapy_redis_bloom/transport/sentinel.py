"""A Redis client of the primary a group of Sentinels names, followed through failovers.

:class:`SentinelRedis` fits scrapy-redis's ``REDIS_PARAMS["redis_cls"]``, so its queue and this
filter share the primary (docs/howto/topologies.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.connection import Connection, SSLConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
)

from scrapy_redis_bloom.core.errors import UnsupportedServerError
from scrapy_redis_bloom.core.events import RateLimitedLog
from scrapy_redis_bloom.core.redact import masked
from scrapy_redis_bloom.core.settings import (
    check_sentinel_params,
    client_params,
    parse_sentinels,
    sentinel_service,
)
from scrapy_redis_bloom.transport.executor import error_code
from scrapy_redis_bloom.transport.node import add_lookup_wait

logger = logging.getLogger(__name__)

#: Retries of a failed command (backoff 0.1 s doubling to 1 s): about a minute, longer than
#: a failover under Sentinel's default ``down-after-milliseconds`` (30 s) plus its election.
FAILOVER_RETRIES = 60
#: Seconds a Sentinel has to accept a connection, and then to answer, unless ``sentinel_kwargs``
#: says otherwise: a Sentinel answers ``SENTINEL MASTERS`` at once, and one that does not is
#: passed over for the next. (redis-py gave them the primary's timeouts and its retries: with
#: a stopped first Sentinel, every new client waited 11 times 5 s before asking the next.)
SENTINEL_TIMEOUT = 1.0
#: The order the Sentinels of each list last answered in, in this process: each new client
#: starts from it, so a Sentinel down costs a worker one wait, not one per client made.
_ORDER: dict[frozenset[str], tuple[str, ...]] = {}
#: A Sentinel passed over: said at most once a minute per Sentinel, in this process.
_down_log = RateLimitedLog(logger)


def sentinel_defaults() -> dict[str, Any]:
    """Return the connection arguments the Sentinels get unless ``sentinel_kwargs`` sets them.

    No retry: the next Sentinel is asked instead, and the lookup as a whole is retried by the
    primary's connection (its retry policy, or the filter's).
    """
    return {
        "socket_timeout": SENTINEL_TIMEOUT,
        "socket_connect_timeout": SENTINEL_TIMEOUT,
        "retry": Retry(NoBackoff(), 0),
    }


class Sentinels(Sentinel):
    """redis-py's :class:`~redis.sentinel.Sentinel`, whose errors name each Sentinel by address.

    (redis-py's name them by a long repr, and take a server that is no Sentinel for a failing
    one.) ``source`` names the setting that lists them.
    """

    source = "BLOOMFILTER_REDIS_SENTINELS"
    #: The setting whose ``sentinel_kwargs`` hold the Sentinels' connection arguments.
    params_source = "BLOOMFILTER_REDIS_PARAMS"

    def __init__(
        self,
        sentinels: Iterable[tuple[str, int]],
        min_other_sentinels: int = 0,
        sentinel_kwargs: dict[str, Any] | None = None,
        **connection_kwargs: Any,
    ) -> None:
        """As redis-py's; without ``sentinel_kwargs`` the Sentinels get :func:`sentinel_defaults`.

        Without it: the primary's ``socket_*`` arguments (as in redis-py) but its timeouts.
        With it: its timeouts as redis-py reads them; no retry unless it sets one (the next
        Sentinel is asked instead).
        """
        if sentinel_kwargs is None:
            kwargs = {
                k: v
                for k, v in connection_kwargs.items()
                if k.startswith("socket_") and k not in ("socket_timeout", "socket_connect_timeout")
            }
            kwargs.update(sentinel_defaults())
        else:
            kwargs = {"retry": sentinel_defaults()["retry"], **sentinel_kwargs}
        super().__init__(  # type: ignore[no-untyped-call, unused-ignore]
            sentinels, min_other_sentinels, sentinel_kwargs=kwargs, **connection_kwargs
        )
        self._key = frozenset(_address(sentinel) for sentinel in self.sentinels)
        if order := _ORDER.get(self._key):  # as they last answered, in this process
            self.sentinels.sort(key=lambda sentinel: order.index(_address(sentinel)))

    def discover_master(self, service_name: str) -> tuple[str, int]:
        """Return the address of the primary the first Sentinel that knows it names.

        A Sentinel that did not answer before one that did is said, and asked last from then
        on (by every client of these Sentinels in this process); the wait it cost is not the
        primary's (:func:`.lookup_wait`).
        """
        began = time.monotonic()
        try:
            return self._discover(service_name)
        finally:
            add_lookup_wait(began, time.monotonic())

    def _discover(self, service_name: str) -> tuple[str, int]:
        answered: list[str] = []
        down: list[tuple[Any, float, str]] = []  # each Sentinel passed over, its wait and why
        for sentinel in list(self.sentinels):  # (another thread's lookup may reorder them)
            where = _address(sentinel)
            asked = time.monotonic()
            try:
                masters = sentinel.sentinel_masters()
            except (RedisConnectionError, RedisTimeoutError) as exc:
                down.append((sentinel, time.monotonic() - asked, str(exc).rstrip(".")))
                continue
            except ResponseError as exc:
                if not str(exc).lower().startswith("unknown command"):
                    raise
                raise UnsupportedServerError(
                    f"Redis at {where}, listed in {self.source}, is not a Sentinel (unknown"
                    " command SENTINEL): list the Sentinels' addresses there (port 26379 by"
                    " default), not the primary's or a replica's."
                ) from None
            state = masters.get(service_name) if isinstance(masters, dict) else None
            if state and self.check_master_state(state, service_name):  # type: ignore[no-untyped-call]
                self._answered(sentinel, down)
                forced = getattr(self, "_force_master_ip", None)
                return (state["ip"] if forced is None else forced), state["port"]
            answered.append(where)
        found = []
        if answered:
            found.append(
                f"no Sentinel at {', '.join(answered)} knows a primary {service_name!r} that is up"
            )
        if down:
            where = ", ".join(_address(sentinel) for sentinel, _, _ in down)
            why = "; ".join(reason for _, _, reason in down)
            found.append(f"no Sentinel at {where} answered ({why})")
        raise MasterNotFoundError("; ".join(found))

    def _answered(self, sentinel: Any, down: list[tuple[Any, float, str]]) -> None:
        """Ask ``sentinel`` first from now on and those ``down`` last; say each of those."""
        late = [passed for passed, _, _ in down]
        rest = [s for s in self.sentinels if s is not sentinel and all(s is not d for d in late)]
        self.sentinels[:] = [sentinel, *rest, *late]
        _ORDER[self._key] = tuple(_address(s) for s in self.sentinels)
        for passed, waited, why in down:
            where = _address(passed)
            _down_log.log(
                logging.WARNING,
                f"{self.source} {where}",
                "The Sentinel at %s, listed in %s, did not answer (%s): the lookup of the"
                " primary lost %.1f s on it before the Sentinel at %s answered. A Sentinel down,"
                " not a stall of the primary: this process asks it last from now on. Restart it,"
                " or remove it from %s (the Sentinels' timeouts: 'sentinel_kwargs' in %s).",
                where,
                self.source,
                why,
                waited,
                _address(sentinel),
                self.source,
                self.params_source,
            )


def _address(sentinel: Any) -> str:
    """Return a Sentinel's ``host:port``, from its client's connection arguments."""
    kwargs = sentinel.connection_pool.connection_kwargs
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 26379)}"


class PrimaryConnection(SentinelManagedConnection):
    """A connection following the Sentinels' primary; an old one refusing writes reconnects."""

    def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        """Connect to the primary the sentinels name now (redis-py 8 reconnects through here)."""
        if not self._sock:
            self.host, self.port = self.connection_pool.get_master_address()
        # The plain connection's connect, past SentinelManagedConnection's lookup.
        Connection.connect_check_health(self, check_health, retry_socket_connect)

    def connect_to(self, address: tuple[str, int]) -> None:
        """Connect to ``address`` (the primary, just looked up by ``connect()``)."""
        self.host, self.port = address
        Connection.connect_check_health(self, self.connection_pool.check_connection, False)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        """Read a reply; turn ``NOREPLICAS`` or ``READONLY`` (also in a script) into a reconnect."""
        try:
            return super().read_response(*args, **kwargs)
        except ResponseError as exc:
            code = error_code(exc)
            if code not in ("NOREPLICAS", "READONLY") or not self.connection_pool.is_master:
                raise
            self.disconnect()  # type: ignore[no-untyped-call]  # untyped in redis-py
            raise RedisConnectionError(
                f"the primary refuses writes ({exc}): asking the sentinels for the primary again"
            ) from exc


class PrimarySSLConnection(PrimaryConnection, SSLConnection):
    """:class:`PrimaryConnection` over TLS."""


class SentinelRedis(redis.Redis):
    """A client of the primary that ``sentinels`` name for ``service_name``.

    ``sentinels``: ``"host:port"`` strings or ``(host, port)`` pairs; ``sentinel_kwargs``: the
    arguments of the connections to the sentinels (what it leaves out, from
    :func:`sentinel_defaults`); ``setting``: named in errors. Every other
    argument is the primary's, as for ``redis.Redis``, but ``host``, ``port`` and ``url``.
    """

    def __init__(
        self,
        *,
        sentinels: object = None,
        service_name: object = None,
        sentinel_kwargs: dict[str, Any] | None = None,
        min_other_sentinels: int = 0,
        setting: str = "REDIS_PARAMS",
        **kwargs: Any,
    ) -> None:
        if sentinels is None or service_name is None:
            raise ValueError(
                f"The {setting} setting gives redis_cls SentinelRedis without"
                f" {'sentinels' if sentinels is None else 'service_name'}: add"
                " 'sentinels': ['host:26379', ...] and 'service_name': '<monitored name>'."
            )
        addresses = parse_sentinels(f"{setting}['sentinels']", sentinels)
        service = sentinel_service(f"{setting}['service_name']", service_name)
        check_sentinel_params(setting, {**kwargs, "sentinel_kwargs": sentinel_kwargs})
        client_params(setting, kwargs)
        given = dict(kwargs)
        if kwargs.get("retry_on_timeout") is True:
            del kwargs["retry_on_timeout"]  # scrapy-redis's default, deprecated by redis-py 6+
        kwargs.setdefault("retry", Retry(ExponentialBackoff(cap=1.0, base=0.1), FAILOVER_RETRIES))
        self.sentinel_manager = Sentinels(
            addresses, min_other_sentinels, sentinel_kwargs=sentinel_kwargs, **kwargs
        )
        if setting != "BLOOMFILTER_REDIS_PARAMS":  # (whose sentinels are that setting's)
            self.sentinel_manager.source = f"{setting}['sentinels']"
        self.sentinel_manager.params_source = setting
        connection = PrimarySSLConnection if kwargs.pop("ssl", False) else PrimaryConnection
        pool = SentinelConnectionPool(  # type: ignore[no-untyped-call]
            service, self.sentinel_manager, is_master=True, connection_class=connection, **kwargs
        )
        try:
            pool.connection_class(**pool.connection_kwargs)  # an unknown argument, now
        except TypeError as exc:
            self._close_sentinels()
            raise ValueError(
                f"The Redis client refuses the arguments of the {setting} setting"
                f" ({masked(given)}) for the Sentinel-managed primary: {exc}."
            ) from None
        super().__init__(connection_pool=pool)
        self.auto_close_connection_pool = True
        self.service_name = service
        self.sentinel_addresses = addresses

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> SentinelRedis:
        """Refuse a URL: it names one server, where the sentinels are to name the primary."""
        raise ValueError(
            "The REDIS_URL setting names one server, but REDIS_PARAMS makes the client"
            " SentinelRedis, whose primary the sentinels name: remove REDIS_URL (give the"
            " password and db in REDIS_PARAMS)."
        )

    def __repr__(self) -> str:
        where = ",".join(f"{host}:{port}" for host, port in self.sentinel_addresses)
        return f"<{type(self).__name__}(service={self.service_name}, sentinels=[{where}])>"

    def close(self) -> None:
        """Close the connections to the primary and to the sentinels."""
        super().close()
        self._close_sentinels()

    def _close_sentinels(self) -> None:
        for sentinel in self.sentinel_manager.sentinels:  # Sentinel.close(): redis-py >= 7.1
            sentinel.close()

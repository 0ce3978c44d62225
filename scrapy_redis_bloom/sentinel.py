"""A Redis client of the primary a group of Sentinels names, followed through failovers.

scrapy-redis has no Sentinel support of its own: it builds its client as
``REDIS_PARAMS["redis_cls"](**REDIS_PARAMS)``. :class:`SentinelRedis` is such a class, so
one ``REDIS_PARAMS`` gives scrapy-redis's queue and this filter the same primary::

    REDIS_PARAMS = {
        "redis_cls": "scrapy_redis_bloom.sentinel.SentinelRedis",
        "sentinels": ["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"],
        "service_name": "mymaster",
        "password": "...",                          # the primary's
        "sentinel_kwargs": {"password": "..."},     # the sentinels', if they ask for one
    }

It is a plain ``redis.Redis`` over redis-py's ``SentinelConnectionPool``: every new
connection asks the sentinels where the primary is, and a connection that meets a
demoted primary (``READONLY``) is dropped and made again. The filter's own connections
copy the pool's connection class and settings (see :mod:`.engine.node`), so they ask
the sentinels too. Unless ``retry`` is given, a command that meets a dead primary is
retried for about :data:`FAILOVER_RETRIES` seconds: scrapy-redis's queue rides through
a failover instead of losing the request in hand (the filter retries by its own policy,
``BLOOMFILTER_RETRY_TIMEOUT``).
"""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from .config import check_sentinel_params, client_params, parse_sentinels, sentinel_service
from .redact import masked

#: Retries of a failed command, about one a second after the first few (backoff 0.1 s
#: doubling to 1 s): longer than a failover with ``down-after-milliseconds`` up to 20 s.
FAILOVER_RETRIES = 30
#: Where scrapy-redis's parameters come from, for the error messages.
SETTING = "REDIS_PARAMS"


def failover_retry() -> Retry:
    """Return the default retry of a :class:`SentinelRedis`: ride through a failover."""
    return Retry(ExponentialBackoff(cap=1.0, base=0.1), FAILOVER_RETRIES)


class SentinelRedis(redis.Redis):
    """A client of the primary that ``sentinels`` name for ``service_name``.

    Usable as scrapy-redis's ``redis_cls`` (see the module docstring). ``sentinels``:
    ``"host:port"`` strings or ``(host, port)`` pairs. ``sentinel_kwargs``: the
    arguments of the connections to the sentinels (their password, TLS); by default
    the ``socket_*`` ones of the primary's. ``min_other_sentinels``: ignore a sentinel
    that sees fewer peers (one cut off from the others may name a stale primary).
    Every other argument is a connection argument of the primary's, as for
    ``redis.Redis``; ``host``, ``port`` and ``url`` are refused (the sentinels name it).
    """

    def __init__(
        self,
        *,
        sentinels: object = None,
        service_name: object = None,
        sentinel_kwargs: dict[str, Any] | None = None,
        min_other_sentinels: int = 0,
        **kwargs: Any,
    ) -> None:
        if sentinels is None or service_name is None:
            raise ValueError(
                f"The {SETTING} setting gives redis_cls SentinelRedis without"
                f" {'sentinels' if sentinels is None else 'service_name'}: add"
                " 'sentinels': ['host:26379', ...] and 'service_name': '<monitored name>'."
            )
        addresses = parse_sentinels(f"{SETTING}['sentinels']", sentinels)
        service = sentinel_service(f"{SETTING}['service_name']", service_name)
        check_sentinel_params(SETTING, {**kwargs, "sentinel_kwargs": sentinel_kwargs})
        client_params(SETTING, kwargs)
        kwargs.setdefault("retry", failover_retry())
        # redis-py's Sentinel classes are untyped.
        self.sentinel_manager = Sentinel(  # type: ignore[no-untyped-call]
            addresses, min_other_sentinels, sentinel_kwargs=sentinel_kwargs, **kwargs
        )
        pool = SentinelConnectionPool(  # type: ignore[no-untyped-call]
            service, self.sentinel_manager, is_master=True, **kwargs
        )
        try:
            pool.connection_class(**pool.connection_kwargs)  # an unknown argument, now
        except TypeError as exc:
            self.sentinel_manager.close()
            raise ValueError(
                f"The Redis client refuses the arguments of the {SETTING} setting"
                f" ({masked(kwargs)}) for the Sentinel-managed primary: {exc}."
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
        self.sentinel_manager.close()

"""Worker leases: which workers still use the filter (``KEY:workers``).

scrapy-redis clears the dupefilter when any worker closes with
``SCHEDULER_PERSIST = False`` or starts with ``SCHEDULER_FLUSH_ON_START``, which
would wipe a crawl other workers are still running. Each worker holds a lease,
renewed from a daemon thread, and the filter is only cleared by a worker that finds
no other live lease. Expiry is judged by the Redis server's clock (``TIME`` in the
script), never by the workers' clocks.
"""

from __future__ import annotations

import logging
import threading
import weakref
from functools import partial
from typing import Any

from scrapy_redis_bloom.core import layout
from scrapy_redis_bloom.core.errors import BloomFilterError
from scrapy_redis_bloom.core.events import RateLimitedLog
from scrapy_redis_bloom.engine import scripts
from scrapy_redis_bloom.engine.access import check_access
from scrapy_redis_bloom.engine.parts import refusal, text
from scrapy_redis_bloom.transport.executor import Call, Executor
from scrapy_redis_bloom.transport.topology import Topology
from scrapy_redis_bloom.transport.wire import Script, pack_command

logger = logging.getLogger(__name__)


def _script_call(script: Script, key: str, *args: bytes | str | int) -> Call:
    return Call(pack_command(b"EVALSHA", script.sha, 1, key, *args), key=key, script=script)


def workers_of(executor: Executor, key: str) -> list[str]:
    """Return the ids of the workers holding a live lease on the filter ``key``."""
    call = _script_call(scripts.LEASE, layout.workers_key(key), "", 0, "list")
    (reply,) = executor.run("list the live workers", [call]).replies
    if isinstance(reply, BaseException):
        raise refusal(executor, key, reply, layout.workers_key(key), "list the live workers")
    return [text(item) for item in reply]


def live_workers(client: Any, key: str, retry_timeout: float = 5.0) -> list[str]:
    """Return the live workers of the filter ``key`` through a redis-py client.

    Needs no geometry: it works before a worker has created the filter. ``client`` is
    what :class:`~.filter.RedisBloomFilter` takes (the registry is on server 0).
    """
    from scrapy_redis_bloom.transport.topology import make_topology

    topology = make_topology(client)
    try:
        return workers_of(Executor(topology, retry_timeout), key)
    finally:
        topology.close()


class WorkerLease:
    """A worker's lease in a filter's registry of live workers.

    The lease lasts ``ttl`` seconds unless renewed; :meth:`start` renews it every
    ``ttl / 3`` seconds from a daemon thread, so a worker that dies stops counting as
    live within ``ttl``. It talks to Redis on connections of its own (a copy of the
    filter's topology), from whichever thread calls it.
    """

    def __init__(
        self, topology: Topology, key: str, worker_id: str, ttl: float, retry_timeout: float
    ) -> None:
        self._filter_key = key
        self.key = layout.workers_key(key)
        self.worker_id = worker_id
        self.ttl = ttl
        # A renewal that waits longer than a third of the TTL is late anyway.
        self._executor = Executor(topology.copy(), retry_timeout=min(retry_timeout, ttl / 3))
        self._executor.explain_denial = partial(
            check_access, self._executor, self._executor.topology, key
        )
        weakref.finalize(self, self._executor.topology.close)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._log = RateLimitedLog(logger, interval=ttl)

    def _call(self, action: str) -> int:
        ttl_ms = max(1, round(self.ttl * 1000))
        call = _script_call(scripts.LEASE, self.key, self.worker_id, ttl_ms, action)
        with self._lock:
            (reply,) = self._executor.run(f"{action} a worker lease", [call], write=True).replies
        if isinstance(reply, BaseException):
            raise refusal(self._executor, self._filter_key, reply, self.key, f"{action} a lease")
        return int(reply)

    def renew(self) -> int:
        """Take or extend the lease; return how many other workers are live."""
        return self._call("renew")

    def others(self) -> int:
        """Return how many other workers hold a live lease."""
        return self._call("count")

    def start(self) -> None:
        """Take the lease and keep renewing it in the background until :meth:`release`."""
        self.renew()
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._keep, name=f"bloomfilter-lease-{self.worker_id}", daemon=True
            )
            self._thread.start()

    def _keep(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.renew()
            except BloomFilterError as exc:
                self._log.log(
                    logging.WARNING,
                    "renew",
                    "Could not renew the lease of worker %s (other workers take it for gone"
                    " %ss after its last renewal): %s",
                    self.worker_id,
                    f"{self.ttl:g}",
                    exc,
                )

    def stop(self) -> None:
        """Stop renewing; the lease then lapses after its TTL (as if the worker died)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def release(self) -> int:
        """Stop renewing and drop the lease; return how many other workers are live."""
        self.stop()
        try:
            return self._call("release")
        finally:
            self.close()

    def close(self) -> None:
        """Close the lease's own connections."""
        with self._lock:
            self._executor.close()

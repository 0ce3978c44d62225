"""Worker leases: which workers still use the filter (``KEY:workers``).

scrapy-redis clears the dupefilter when any worker closes or starts flushing, wiping a crawl
others still run: so each worker holds a lease (renewed from a thread, expiring by Redis's
clock), and only a worker finding no other live lease clears, claiming the registry.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from scrapy_redis_bloom.core import layout
from scrapy_redis_bloom.core.errors import BloomFilterError, Wording, foreign_reply, taking_apart
from scrapy_redis_bloom.core.events import FilterEvents, RateLimitedLog
from scrapy_redis_bloom.core.settings import WORKER_TTL
from scrapy_redis_bloom.engine import scripts
from scrapy_redis_bloom.engine.access import check_access
from scrapy_redis_bloom.engine.health import info_fields
from scrapy_redis_bloom.engine.parts import refusal, script_call, text
from scrapy_redis_bloom.transport.executor import Call, Executor
from scrapy_redis_bloom.transport.topology import Topology, make_topology
from scrapy_redis_bloom.transport.wire import pack_command

logger = logging.getLogger(__name__)

#: The reply of a renewal while another worker clears the filter: no lease was taken.
CLEARING = -1
#: Seconds between two tries to take a lease while another worker clears the filter.
WAIT_STEP = 0.05

_INFO = pack_command(b"INFO", b"server")
#: Seconds a filter's creation time (a worker's clock) may run ahead of its server's.
CLOCK_MARGIN = 2.0
_refusals = RateLimitedLog(logger)  # a registry's server refusing INFO: once a minute


def settling_calls(key: str) -> list[Call]:
    """Return the calls :func:`unsettled` reads: the registry server's INFO, the filter's age."""
    meta = layout.meta_key(key)
    created = Call(pack_command(b"HGET", meta, b"created"), key=meta)
    return [Call(_INFO, key=layout.workers_key(key)), created]


def unsettled(executor: Executor, key: str, replies: list[Any], settle: float) -> float:
    """Return how long the registry may still miss live workers (0: it lists them all).

    A server up for less than ``settle`` with an older filter restarted since some workers
    renewed (``replies``: of :func:`settling_calls`): the rest of the TTL is waited out.
    """
    info, created = replies
    if isinstance(info, BaseException):
        _refusals.log(
            logging.WARNING,
            key,
            "Redis at %s refuses INFO (%s): whether it restarted from an older snapshot, whose"
            " registry %r may miss live workers until they renew, cannot be told. Grant INFO"
            " (docs/howto/tls-acl.md).",
            executor.topology.route(layout.workers_key(key), None, None).address,
            info,
            layout.workers_key(key),
        )
    fields = {} if isinstance(info, BaseException) else info_fields(info)
    uptime, clock = fields.get("uptime_in_seconds", ""), fields.get("server_time_usec", "")
    try:
        born = float(text(created)) if isinstance(created, bytes) else math.inf
    except ValueError:
        born = math.inf  # not a record's: the record's readers say so
    if not (math.isfinite(born) and born >= 0):
        born = math.inf  # as the record's readers refuse it ('nan' compared with nothing)
    if not (uptime.isdigit() and clock.isdigit()):
        return 0.0
    if born >= int(clock) / 1e6 - int(uptime) - CLOCK_MARGIN or int(uptime) >= settle:
        return 0.0
    wait = settle - int(uptime)
    registry = layout.workers_key(key)
    logger.warning(
        "Redis at %s started %ss ago, with the Bloom filter %r older than that: the"
        " workers' leases may not all be back in %r yet (each renews within"
        " BLOOMFILTER_WORKER_TTL = %ss), so the registry is read again in %.0fs.",
        executor.topology.route(registry, None, None).address,
        uptime,
        key,
        registry,
        f"{settle:g}",
        wait,
    )
    return wait


def workers_of(executor: Executor, key: str, settle: float = WORKER_TTL.default) -> list[str]:
    """Return the ids of the workers leasing the filter ``key`` (waiting: :func:`unsettled`)."""
    registry = layout.workers_key(key)
    while True:
        calls = [*settling_calls(key), script_call(scripts.LEASE, registry, "", 0, "list")]
        *settling, reply = executor.run("list the live workers", calls).replies
        if isinstance(reply, BaseException):
            raise refusal(executor, key, reply, registry, "list the live workers")
        if not isinstance(reply, list) or not all(isinstance(item, bytes) for item in reply):
            shape = ValueError(f"the workers' ids, got {reply!r:.200}")
            raise foreign_reply("a call to list the live workers", registry, shape)
        wait = unsettled(executor, key, settling, settle)
        if not wait:
            return [text(item) for item in reply]
        time.sleep(wait)


def live_workers(
    client: Any, key: str, retry_timeout: float = 5.0, settle: float = WORKER_TTL.default
) -> list[str]:
    """Return the live workers of the filter ``key`` through a redis-py client (no geometry)."""
    topology = make_topology(client)
    try:
        return workers_of(Executor(topology, retry_timeout), key, settle)
    finally:
        topology.close()


class WorkerLease:
    """A worker's lease of ``ttl`` s, on connections of its own; :meth:`start` renews it."""

    def __init__(
        self,
        topology: Topology,
        key: str,
        worker_id: str,
        ttl: float,
        retry_timeout: float,
        events: FilterEvents | None = None,
        follows: Executor | None = None,
        budget: Wording | None = None,
    ) -> None:
        self._filter_key = key
        self.key = layout.workers_key(key)
        self.worker_id = worker_id
        self.ttl = ttl
        self.events = events if events is not None else FilterEvents()
        # A renewal waiting longer than a third of the TTL is late; ``follows``' outage: fast.
        # ``budget`` words the retry timeout as the filter's does (a command's default).
        if retry_timeout > ttl / 3:
            budget = Wording("a third of {BLOOMFILTER_WORKER_TTL}")
        executor = self._executor = Executor(
            topology.copy(), min(retry_timeout, ttl / 3), follows=follows, budget=budget
        )
        executor.explain_denial = partial(check_access, executor, executor.topology, key)
        weakref.finalize(self, executor.topology.close)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._log = RateLimitedLog(logger, interval=ttl)
        #: Whether this worker holds the claim to clear; what the claim found :func:`unsettled`.
        self._claimed = False
        self._settling = 0.0
        self._closing = False  # set by close(): the call holding the connections closes them
        #: Told the number of live workers (this one included) at every renewal.
        self.on_workers: Callable[[int], None] | None = None

    def _forked(self) -> None:
        """Take a lock of its own in a forked child: the parent's renewing thread may hold it."""
        self._lock = threading.Lock()

    def _call(self, action: str) -> int:
        ttl_ms = max(1, round(self.ttl * 1000))
        with self._lock:  # the claim is held or dropped in the same step as its flag
            try:
                if action == "renew" and self._claimed:
                    action = "hold"
                elif action == "unclaim":
                    self._claimed = False  # a failed unclaim: the claim lapses within the TTL
                call = script_call(scripts.LEASE, self.key, self.worker_id, ttl_ms, action)
                # A claim reads the server's uptime in the same trip (see clearing()).
                calls = [*settling_calls(self._filter_key), call] if action == "claim" else [call]
                run = self._executor.run(f"{action} a worker lease", calls, write=True)
                *settling, reply = run.replies
                if isinstance(reply, BaseException):
                    raise refusal(
                        self._executor, self._filter_key, reply, self.key, f"{action} a lease"
                    )
                with taking_apart(f"{action} a worker lease", self.key):
                    others = int(reply)
                if action == "claim":
                    self._claimed = others == 0
                    self._settling = unsettled(self._executor, self._filter_key, settling, self.ttl)
            finally:
                if self._closing:  # close() came meanwhile: the connections close now
                    self._executor.close()
        if action in ("renew", "hold") and others >= 0 and self.on_workers is not None:
            self.on_workers(others + 1)
        return others

    def renew(self) -> int:
        """Take or extend the lease; return how many others are live (:data:`CLEARING`: none)."""
        return self._call("renew")

    def others(self) -> int:
        """Return how many other workers hold a live lease."""
        return self._call("count")

    @contextmanager
    def clearing(self) -> Iterator[int]:
        """Claim the registry to clear the filter; yield how many other workers are live.

        0: none is, nor takes a lease until the block ends, so the filter may be deleted.
        """
        others = self._call("claim")
        while not others and self._settling:
            self._call("unclaim")
            time.sleep(self._settling)
            others = self._call("claim")
        if others:
            yield others
            return
        try:
            yield 0
        finally:
            try:
                self._call("unclaim")
            except Exception as exc:  # the clear's own outcome matters more
                what = (
                    f"end worker {self.worker_id}'s claim to clear the Bloom filter"
                    f" {self._filter_key!r} (it lapses within {self.ttl:g}s; workers starting"
                    " meanwhile wait)"
                )
                self._failed("unclaim", what, exc)

    def start(self) -> int:
        """Take the lease (first waiting out a clear) and renew it; return the other workers."""
        others = self.renew()
        if others == CLEARING:
            logger.info(
                "Worker %s waits: another worker is clearing the Bloom filter %r.",
                self.worker_id,
                self._filter_key,
            )
        while others == CLEARING:
            time.sleep(WAIT_STEP)
            others = self.renew()
        thread = self._thread
        if thread is not None and thread.is_alive() and not self._stop.is_set():
            return others  # renewing already
        if thread is not None:
            thread.join()  # stopped, maybe mid-renewal: one thread at most
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._keep,
            args=(self._stop,),
            name=f"bloomfilter-lease-{self.worker_id}",
            daemon=True,
        )
        self._thread.start()
        return others

    def _keep(self, stop: threading.Event) -> None:
        """Renew until stopped, surviving any failure (a log handler's too): logged, counted."""
        wait = self.ttl / 3
        while not stop.wait(wait):
            failure: BaseException | str | None
            try:
                failure = _TAKEN if self.renew() == CLEARING else None
            except Exception as exc:  # any failure: the thread must go on renewing
                failure = exc
            wait = self.ttl / 3 if failure is None else min(self.ttl / 3, 1.0)  # sooner on failure
            if failure is not None:
                with contextlib.suppress(Exception):  # counted first; saying it may fail
                    what = (
                        f"renew the lease of worker {self.worker_id} (other workers take it for"
                        f" gone {self.ttl:g}s after its last renewal; trying again)"
                    )
                    self._failed("renew", what, failure)

    def _failed(self, topic: str, what: str, failure: BaseException | str) -> None:
        """Count a failure of the lease (``lease_failed``) and say it, at most once per TTL."""
        self.events.count("lease_failed")
        if isinstance(failure, BaseException) and not isinstance(failure, BloomFilterError):
            failure = f"{type(failure).__name__}: {failure}"  # redis-py's words need its name
        self._log.log(logging.WARNING, topic, "Could not %s: %s", what, failure)

    def stop(self, wait: float = 5.0) -> None:
        """Stop renewing (the lease lapses after its TTL); wait up to ``wait`` s for a renewal."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=wait)

    def release(self) -> int:
        """Stop renewing and drop the lease (fast while Redis fails); return the other workers."""
        try:
            self._stop.set()
            failure = self._executor.refusal("release a worker lease", write=True)
            if failure is not None:
                raise failure
            self.stop()
            return self._call("release")
        finally:
            self.close()

    def close(self) -> None:
        """Close the lease's own connections (a call using them closes them when it ends)."""
        self._closing = True  # first: a call that holds them now sees it when it lets go
        if self._lock.acquire(blocking=False):
            try:
                self._executor.close()
            finally:
                self._lock.release()


#: Why a renewal took no lease while another worker clears the filter.
_TAKEN = (
    "another worker is clearing the filter, as this worker's lease had lapsed: the filter"
    " may be deleted under its crawl (a longer BLOOMFILTER_WORKER_TTL avoids this)"
)

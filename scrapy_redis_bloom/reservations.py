"""Answers given ahead to a response's links, kept until the scheduler asks for them.

The batching middleware (:mod:`.batching`) checks-and-adds the links of a response in
one round trip; the dupefilter's ``request_seen`` then takes each answer here instead
of asking Redis. A Bloom filter cannot forget, so a link answered "new" is already
marked seen in Redis: if its request never reaches the scheduler (a
``request_scheduled`` handler raised ``IgnoreRequest``, the crawl stopped first), no
worker would fetch it again. That is told apart exactly, without relying on when
Scrapy resumes the middleware: each reserved request is watched through a weak
reference, and a request collected (or still pending when the crawl ends) with its
"new" answer not taken is *unscheduled*. Unscheduled fingerprints are remembered by
this worker, which answers "new" the next time it meets them; other workers, and
later runs, cannot know (see NOTES-batch12.md).
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy import Request

#: Unscheduled fingerprints remembered at least, whatever the near-cache's size.
MIN_UNSCHEDULED = 10_000


@dataclass(eq=False)
class _Reservation:
    """The answer for one fingerprint, shared by the requests of one batch that carry it."""

    fingerprint: str
    url: str
    #: The batch's answer, for the first request to reach ``request_seen``.
    answer: bool
    #: Requests of the batch with this fingerprint not yet taken an answer.
    pending: int
    #: Of those, how many are still alive (not collected).
    alive: int
    refs: list[weakref.ref[Request]] = field(default_factory=list)


class Reservations:
    """Answers by fingerprint, each taken once; unscheduled "new" answers reported.

    ``on_unscheduled(urls)`` is called with the URLs of requests answered "new" that
    will never reach the scheduler. ``size``: how many unscheduled fingerprints are
    remembered (the oldest are forgotten first, and counted by ``on_forgotten``).
    Single-threaded, as Scrapy's engine is; weak-reference callbacks only queue their
    reservation, handled at the next call.
    """

    def __init__(
        self,
        on_unscheduled: Callable[[list[str]], None],
        size: int = MIN_UNSCHEDULED,
    ) -> None:
        self._items: dict[str, _Reservation] = {}
        self._dead: deque[_Reservation] = deque()
        self._unscheduled: dict[str, None] = {}
        self._size = max(size, MIN_UNSCHEDULED)
        self._on_unscheduled = on_unscheduled
        #: Unscheduled fingerprints forgotten because too many were remembered.
        self.forgotten = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, fingerprint: object) -> bool:
        return fingerprint in self._items or fingerprint in self._unscheduled

    def reserve(
        self, requests: Sequence[Request], fingerprints: Sequence[str], answers: Sequence[bool]
    ) -> None:
        """Hold ``answers[i]`` for the first request with ``fingerprints[i]``.

        Other requests with the same fingerprint in ``requests`` answer "seen".
        """
        self._reap()
        new: dict[str, _Reservation] = {}
        for fingerprint, answer, request in zip(fingerprints, answers, requests, strict=True):
            if fingerprint in self._items:
                continue  # held for a request of an earlier batch: it answers for both
            reservation = new.get(fingerprint)
            if reservation is None:
                reservation = _Reservation(fingerprint, request.url, answer, 0, 0)
                new[fingerprint] = reservation
            reservation.pending += 1
            reservation.alive += 1
            reservation.refs.append(weakref.ref(request, partial(self._collected, reservation)))
        self._items.update(new)

    def take(self, fingerprint: str) -> bool | None:
        """Return the answer held for ``fingerprint`` (None: none held), once.

        An unscheduled fingerprint answers "new" once: the request that carries it
        now is fetched, and the filter already holds it.
        """
        if self._dead:
            self._reap()
        reservation = self._items.get(fingerprint)
        if reservation is None:
            if self._unscheduled and fingerprint in self._unscheduled:
                del self._unscheduled[fingerprint]
                return False
            return None
        answer, reservation.answer = reservation.answer, True
        reservation.pending -= 1
        if not reservation.pending:
            del self._items[fingerprint]
        return answer

    def close(self) -> None:
        """Report every "new" answer not taken: the crawl ends, no request will take it."""
        self._reap()
        left = [r for r in self._items.values() if not r.answer]
        self._items.clear()
        if left:
            self._unschedule(left)

    def _collected(self, reservation: _Reservation, ref: weakref.ref[Request]) -> None:
        # A weak-reference callback runs wherever the collector does: only queue.
        self._dead.append(reservation)

    def _reap(self) -> None:
        """Handle the requests collected since the last call."""
        lost: list[_Reservation] = []
        while self._dead:
            reservation = self._dead.popleft()
            if self._items.get(reservation.fingerprint) is not reservation:
                continue  # taken in full already
            reservation.alive -= 1
            if reservation.alive <= 0:
                del self._items[reservation.fingerprint]
                if not reservation.answer:
                    lost.append(reservation)
        if lost:
            self._unschedule(lost)

    def _unschedule(self, lost: list[_Reservation]) -> None:
        for reservation in lost:
            self._unscheduled[reservation.fingerprint] = None
        excess = len(self._unscheduled) - self._size
        if excess > 0:
            for fingerprint in list(self._unscheduled)[:excess]:
                del self._unscheduled[fingerprint]
            self.forgotten += excess
        self._on_unscheduled([reservation.url for reservation in lost])

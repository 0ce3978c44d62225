"""Answers given ahead to a response's links, kept until the scheduler asks for them.

A link answered "new" whose request never reaches ``request_seen`` is seen in Redis but
fetched by no worker: it is reported, and answered "new" by this worker when met again.
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

MIN_UNSCHEDULED = 10_000  #: Unscheduled fingerprints remembered at least, whatever the cache.


@dataclass(eq=False)
class _Reservation:
    """The answer for one fingerprint, shared by the requests of one batch that carry it."""

    fingerprint: str
    url: str
    answer: bool  #: The answer for the next request to take it: the batch's, then "seen".
    taken: bool = False  #: Whether a request took the batch's answer (the next ones repeat it).
    #: The batch's requests with this fingerprint that did not take an answer yet.
    members: dict[int, weakref.ref[Request]] = field(default_factory=dict)

    def alive(self, key: int) -> Request | None:
        """Return the member request ``key``, if it is one and alive."""
        ref = self.members.get(key)
        return ref() if ref is not None else None


class Reservations:
    """Answers by fingerprint, each taken once; "new" ones never taken go to ``on_unscheduled``.

    A request that takes a fingerprint's answer after another did is a duplicate the filter
    was never asked about (the batch checked the fingerprint once): ``on_repeat`` counts it,
    as the filter counts the duplicates it answers.
    """

    def __init__(
        self,
        on_unscheduled: Callable[[list[str]], None],
        size: int,
        on_repeat: Callable[[], object] = lambda: None,
    ) -> None:
        self._items: dict[str, _Reservation] = {}
        self._members: dict[int, _Reservation] = {}  #: id() of each member: its reservation.
        self._dead: deque[tuple[_Reservation, int, weakref.ref[Request]]] = deque()
        #: A member that passed ``request_scheduled``, whose ``request_seen`` must come next.
        self._pending: tuple[_Reservation, int] | None = None
        self._unscheduled: dict[str, None] = {}
        self._size = max(size, MIN_UNSCHEDULED)
        self._on_unscheduled = on_unscheduled
        self._on_repeat = on_repeat
        self.forgotten = 0  #: Unscheduled fingerprints forgotten because too many were remembered.

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, fingerprint: object) -> bool:
        return fingerprint in self._items or fingerprint in self._unscheduled

    def reserve(
        self, requests: Sequence[Request], fingerprints: Sequence[str], answers: Sequence[bool]
    ) -> None:
        """Hold ``answers[i]`` for the first request with ``fingerprints[i]``; "seen" for others."""
        self._settle()
        for fingerprint, answer, request in zip(fingerprints, answers, requests, strict=True):
            if fingerprint not in self._items:
                self._items[fingerprint] = _Reservation(fingerprint, request.url, answer)
            reservation = self._items[fingerprint]
            key = id(request)
            callback = partial(self._collected, reservation, key)
            reservation.members[key] = weakref.ref(request, callback)
            self._members[key] = reservation

    def scheduled(self, request: Request) -> None:
        """Note a request the engine is about to schedule (a ``request_scheduled`` handler)."""
        self._settle()
        key = id(request)
        reservation = self._members.get(key)
        if reservation is not None and reservation.alive(key) is request:
            self._pending = (reservation, key)

    def take(self, fingerprint: str, request: Request) -> bool | None:
        """Return the answer held for ``fingerprint``, once (None: none; unscheduled: "new")."""
        pending = self._pending
        if pending is not None:
            self._pending = None
            if pending[1] != id(request):  # its request_seen never came: dropped
                self._resolve(*pending, dropped=True)
        if self._dead:
            self._reap()
        reservation = self._items.get(fingerprint)
        if reservation is None:
            if self._unscheduled and fingerprint in self._unscheduled:
                del self._unscheduled[fingerprint]
                return False
            return None
        answer, reservation.answer = reservation.answer, True
        if reservation.taken:
            self._on_repeat()
        reservation.taken = True
        key = id(request)
        if reservation.alive(key) is request:
            self._resolve(reservation, key, dropped=False)
        return answer

    def close(self) -> None:
        """Report every "new" answer not taken: the crawl ends, no request will take it."""
        self._settle()
        left = [r for r in self._items.values() if not r.answer]
        self._items.clear()
        self._members.clear()
        if left:
            self._unschedule(left)

    def _collected(self, reservation: _Reservation, key: int, ref: weakref.ref[Request]) -> None:
        # A weak-reference callback runs wherever the collector does: only queue.
        self._dead.append((reservation, key, ref))

    def _settle(self) -> None:
        """Resolve a pending request that was dropped, and the requests collected."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._resolve(*pending, dropped=True)
        if self._dead:
            self._reap()

    def _reap(self) -> None:
        while self._dead:
            reservation, key, ref = self._dead.popleft()
            if reservation.members.get(key) is ref:  # else it took its answer already
                self._resolve(reservation, key, dropped=True)

    def _resolve(self, reservation: _Reservation, key: int, dropped: bool) -> None:
        """Settle a member that took its answer, or never will; the last one ends it."""
        reservation.members.pop(key, None)
        if self._members.get(key) is reservation:
            del self._members[key]
        if reservation.members:
            return
        if self._items.get(reservation.fingerprint) is reservation:
            del self._items[reservation.fingerprint]
        if dropped and not reservation.answer:
            self._unschedule([reservation])

    def _unschedule(self, lost: list[_Reservation]) -> None:
        self._unscheduled.update(dict.fromkeys(reservation.fingerprint for reservation in lost))
        excess = len(self._unscheduled) - self._size
        if excess > 0:
            for fingerprint in list(self._unscheduled)[:excess]:
                del self._unscheduled[fingerprint]
            self.forgotten += excess
        self._on_unscheduled([reservation.url for reservation in lost])

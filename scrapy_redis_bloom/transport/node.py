"""One Redis server as the filter talks to it: a connection it owns, every reply accounted.

A reply goes only to its batch's ticket; a failure between a send and its last reply throws
the connection away with all owed on it, so no reply is read later as another command's.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import ssl
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from redis.backoff import NoBackoff
from redis.connection import SSLConnection
from redis.exceptions import AuthenticationError, BusyLoadingError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from scrapy_redis_bloom.core.errors import (
    SHAPE_ERRORS,
    TLS_PARAMS,
    CertificateError,
    SettingName,
    UnsupportedServerError,
    Wording,
)
from scrapy_redis_bloom.transport.wire import pack_command

logger = logging.getLogger(__name__)

IDLE_CHECK = 1.0  #: Seconds a connection may sit unused before a send checks it is open.
#: Errors of the connection itself, after which it is thrown away.
CONNECTION_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)
#: A server process's id in its INFO reply: another after every restart.
_RUN_ID = re.compile(rb"^run_id:(\w+)", re.MULTILINE)
_PLAIN = frozenset((bytes, int))  #: Replies that need no check (:func:`_replies`).
#: Error replies (redis-py raises -LOADING and -NOAUTH as ConnectionError subclasses).
ERROR_REPLIES = (ResponseError, BusyLoadingError, AuthenticationError)
#: Asks whether a server runs commands again: a script no one loaded, which runs nothing but
#: waits, as writes do, during a ``CLIENT PAUSE WRITE`` (a failover), which a ``PING`` does not.
_PROBE = pack_command(b"EVALSHA", b"0" * 40, 0)
_lookups = threading.local()  # (:func:`lookup_wait`)
LOOKUPS_KEPT = 8  #: A thread's latest lookups through the Sentinels that :func:`lookup_wait` sees.


def lookup_wait(since: float, until: float) -> float:
    """Return the seconds this thread spent from ``since`` to ``until`` asking Sentinels.

    A connect to a Sentinel-managed primary asks them first; a Sentinel down costs that
    connect its timeout. The executor leaves this time out of a reply's: it is no stall of
    the primary, and the Sentinel that cost it is said on its own (:mod:`.sentinel`).
    """
    spans: list[tuple[float, float]] = getattr(_lookups, "spans", [])
    return sum(max(0.0, min(end, until) - max(began, since)) for began, end in spans)


def add_lookup_wait(began: float, ended: float) -> None:
    """Note a lookup through the Sentinels from ``began`` to ``ended`` (:func:`lookup_wait`)."""
    spans: list[tuple[float, float]] = getattr(_lookups, "spans", [])
    _lookups.spans = [*spans[-(LOOKUPS_KEPT - 1) :], (began, ended)]


class TransportError(Exception):
    """A batch's replies cannot be read. ``address`` names the server, ``cause`` why."""

    def __init__(self, address: str, cause: BaseException | str) -> None:
        super().__init__(f"{address}: {cause}")
        self.address = address
        self.cause = cause


class NotSentError(TransportError):
    """Nothing was sent: the server could not be reached. Retrying is safe."""


class SwitchedError(NotSentError):
    """Nothing was sent: the connection an exchange began on was replaced (the server answers)."""


class ReplyLostError(TransportError):
    """The commands may have run, but their replies will never be read."""


class RefusedError(TransportError):
    """The server refused the connection's credentials (``AUTH``): retrying cannot help."""


class TripCounter:
    """Network round trips made to Redis by the nodes of one filter (each counts its own)."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []  #: The nodes counted (each adds itself, under :attr:`lock`).
        self.lock = threading.Lock()
        #: Told when a node's new connection reached another server (a failover).
        self.on_moved: Callable[[], None] | None = None
        #: Told when a node connects again, with whether the server is not known to be the
        #: process it was (restarted, perhaps from an old copy, or its INFO refused).
        self.on_reconnect: Callable[[bool], None] | None = None

    @property
    def value(self) -> int:
        """Round trips made so far by every node counted."""
        with self.lock:
            return sum(node.trips_made for node in self.nodes)


@dataclass(slots=True, eq=False)
class Ticket:
    """A sent batch of ``count`` commands whose replies are owed on connection ``serial``."""

    serial: int
    count: int


def connection_factory(pool: Any) -> Callable[[], Any]:
    """Return a maker of a pool's connections, without retries, health checks or decoding."""
    kwargs = {
        **pool.connection_kwargs,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
        "decode_responses": False,
    }
    return functools.partial(pool.connection_class, **kwargs)


def _replies(connection: Any) -> Callable[[int], list[Any]]:
    """Return what reads a connection's next ``count`` replies (with hiredis: from its reader)."""
    parser: Any = getattr(connection, "_parser", None)
    read: Callable[[], Any] = functools.partial(connection.read_response, disconnect_on_error=False)
    if parser is not None and callable(getattr(parser, "read_response", None)):
        read = parser.read_response
    reader: Any = getattr(parser, "_reader", None)
    missing = getattr(sys.modules.get(type(parser).__module__), "NOT_ENOUGH_DATA", None)
    if missing is None or not callable(getattr(reader, "gets", None)):
        return functools.partial(_one_by_one, read)
    push = getattr(parser, "_hiredis_PushNotificationType", None)

    def fast(count: int) -> list[Any]:
        replies: list[Any] = []
        if count and getattr(parser, "_next_response", missing) is not missing:
            replies += _one_by_one(read, 1)  # one read ahead by ``can_read`` (redis-py 7)
        gets, append = reader.gets, replies.append
        for _ in range(count - len(replies)):
            reply = gets()
            if type(reply) in _PLAIN:
                append(reply)
            elif reply is missing or (push and isinstance(reply, push)):
                if reply is not missing:
                    parser.handle_push_response(reply)  # not a reply: read the next
                replies += _one_by_one(read, 1)
            elif isinstance(reply, RedisConnectionError) and not isinstance(reply, ERROR_REPLIES):
                raise reply  # the connection failed (-LOADING, -NOAUTH are replies)
            elif isinstance(reply, list) and reply and isinstance(reply[0], RedisConnectionError):
                raise reply[0]
            else:
                append(reply)
        return replies

    return fast


def _one_by_one(read: Callable[[], Any], count: int) -> list[Any]:
    """Read ``count`` replies with ``read``; an error reply it raises comes back as the reply."""
    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(read())
        except ERROR_REPLIES as exc:
            replies.append(exc)
    return replies


def _local_tls_problem(connection: Any) -> str | None:
    """Return why a TLS connection's own files do not load (a setting to fix, not an outage)."""
    certfile, keyfile = getattr(connection, "certfile", None), getattr(connection, "keyfile", None)
    cafile, capath = getattr(connection, "ca_certs", None), getattr(connection, "ca_path", None)
    if not (certfile or keyfile or cafile or capath):
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        if certfile or keyfile:
            password = getattr(connection, "certificate_password", None)
            context.load_cert_chain(str(certfile or keyfile), keyfile, password)
        if cafile or capath:
            context.load_verify_locations(cafile, capath)
    except (ssl.SSLError, OSError, ValueError) as exc:
        what = "the client certificate or its key" if certfile or keyfile else "the CA"
        return f"{what} cannot be loaded ({exc})"
    return None


class Node:
    """A server at ``address`` (``host:port``), reached through ``factory``. One per thread."""

    def __init__(
        self, address: str, factory: Callable[[], Any], trips: TripCounter | None = None
    ) -> None:
        self.address = address
        self.trips = trips if trips is not None else TripCounter()
        self.trips_made = 0  #: Round trips made by this node (summed by :attr:`trips`).
        with self.trips.lock:
            self.trips.nodes.append(self)
        self._factory = factory
        self._connection: Any = None
        self._serial = 0
        self._owed: deque[Ticket] = deque()
        self._pid = os.getpid()
        #: When the connection last sent or read (monotonic): an idle one is checked before
        #: use, and a reply that took long is said (:meth:`.Executor.fast`).
        self.used = 0.0
        self._peer: str | None = None  # host:port the last connection reached (failovers)
        self._run: bytes | None = None  # the run_id of the server it reached (restarts)
        self._read_replies: Callable[[int], list[Any]] | None = None  # (:func:`_replies`)
        self._spare: Node | None = None  # a second connection (:meth:`spare`)

    def __repr__(self) -> str:
        return f"<Node {self.address} owed={len(self._owed)}>"

    @property
    def owed(self) -> int:
        """Number of batches whose replies are still to be read."""
        return len(self._owed)

    def owes(self, ticket: Ticket) -> bool:
        """Tell whether ``ticket``'s replies are still to be read on this connection."""
        return ticket in self._owed

    def _connect(self, check: bool = False) -> Any:
        """Return the connection, a new one if none or found closed (idle or ``check``)."""
        if self._pid != os.getpid():  # a forked child: the socket is the parent's
            self._connection, self._pid = None, os.getpid()
            self._owed.clear()
        if (
            self._connection is not None
            and (check or time.monotonic() - self.used >= IDLE_CHECK)
            and not self._owed
            and self._stale()
        ):
            self.abandon()  # closed by the server, found before sending: nothing in doubt
        if self._connection is None:
            connection = self._factory()
            try:
                connection.connect()
            except AuthenticationError as exc:
                connection.disconnect()
                raise RefusedError(self.address, exc) from exc
            except CONNECTION_ERRORS as exc:
                connection.disconnect()
                # A certificate that did not verify, or TLS files that do not load: no retry helps.
                causes = (exc, exc.__cause__, exc.__context__)
                why = _local_tls_problem(connection)
                if (
                    why is not None
                    or any(isinstance(c, ssl.SSLCertVerificationError) for c in causes)
                    or "CERTIFICATE_VERIFY_FAILED" in str(exc)
                ):
                    raise CertificateError(
                        Wording(
                            "Redis at {server} cannot be reached over TLS: {why}. Check the CA,"
                            " the client certificate and its key ({files}) and the host name in"
                            " the URL (see docs/howto/tls-acl.md#tls).",
                            server=self.address,
                            why=str(exc if why is None else why).rstrip("."),
                            files=SettingName(TLS_PARAMS),
                        )
                    ) from None
                if isinstance(exc, RedisTimeoutError) and isinstance(connection, SSLConnection):
                    tls = "a TLS handshake (rediss://) got no answer: is the server TLS-enabled?"
                    raise NotSentError(self.address, f"{exc}; {tls}") from exc
                raise NotSentError(self.address, exc) from exc
            except SHAPE_ERRORS as exc:  # redis-py taking apart a handshake reply not HELLO's
                connection.disconnect()
                detail = f"a handshake reply not its command's: {exc}"
                raise NotSentError(self.address, detail) from None
            except ResponseError as exc:  # its SELECT, HELLO or CLIENT SETNAME refused
                connection.disconnect()
                raise UnsupportedServerError(
                    f"Redis at {self.address} refuses the connection's setup: {exc}. Check the"
                    " database number (/db) of the Redis URL, the connection parameters"
                    " (BLOOMFILTER_REDIS_PARAMS or REDIS_PARAMS) and that it is a Redis server"
                    " (a Sentinel's address goes in BLOOMFILTER_REDIS_SENTINELS)."
                ) from None
            run = self._server_run(connection)
            self._connection = connection
            self._read_replies = _replies(connection)
            self._serial += 1
            if self._serial > 1 and self.trips.on_reconnect is not None:
                self.trips.on_reconnect(run is None or run != self._run)
            self._run = run
            self._note_peer(connection)
        return self._connection

    def _server_run(self, connection: Any) -> bytes | None:
        """Return the server process's ``run_id`` on a new connection (None: not said).

        A connection made again to the same process (dropped, killed) finds what Redis held;
        another process (a restart, a failover) may have forgotten some of it.
        """
        try:
            connection.send_command("INFO", "server")
            reply = connection.read_response()
        except ResponseError:  # INFO refused (ACL): whether it restarted is not known
            return None
        except AuthenticationError as exc:  # -NOAUTH: a password needed, as connect() says it
            connection.disconnect()
            raise RefusedError(self.address, exc) from exc
        except CONNECTION_ERRORS as exc:
            connection.disconnect()
            raise NotSentError(self.address, exc) from exc
        if isinstance(reply, str):
            reply = reply.encode()
        if not isinstance(reply, bytes) or b"_version:" not in reply:  # not INFO's reply
            connection.disconnect()
            detail = f"INFO server answered by a reply not this command's: {reply!r:.60}"
            raise NotSentError(self.address, detail)
        found = _RUN_ID.search(reply)
        return found[1] if found else None

    def _note_peer(self, connection: Any) -> None:
        """Log when a new connection reaches another server than the last one did: a failover."""
        peer = f"{getattr(connection, 'host', '')}:{getattr(connection, 'port', '')}"
        if self._peer is not None and peer != self._peer:
            logger.warning(
                "Redis %s is now served at %s, no longer at %s (a failover): the Bloom"
                " filter follows it.",
                self.address,
                peer,
                self._peer,
            )
            if self.trips.on_moved is not None:
                self.trips.on_moved()
        self._peer = peer

    def _stale(self) -> bool:
        """Tell whether an idle connection has something to read: EOF, an error, junk."""
        try:
            return bool(self._connection.can_read(timeout=0))
        except CONNECTION_ERRORS:
            return True

    def send(
        self,
        payload: bytes | Sequence[bytes | memoryview],
        count: int,
        serial: int | None = None,
        check: bool = False,
    ) -> Ticket:
        """Send ``count`` packed commands; return a ticket (``check``: the connection first)."""
        connection = self._connect(check)
        if serial is not None and serial != self._serial:
            raise SwitchedError(self.address, "the connection the exchange began on was dropped")
        self.trips_made += 1
        try:
            pieces = [payload] if isinstance(payload, bytes) else payload
            connection.send_packed_command(pieces, check_health=False)
        except BaseException as exc:
            self._broken(exc)
        ticket = Ticket(self._serial, count)
        self._owed.append(ticket)
        self.used = time.monotonic()
        return ticket

    def receive(self, ticket: Ticket) -> list[Any]:
        """Read a ticket's replies (tickets in the order sent); an error reply as its exception."""
        read = self._read_replies
        if read is None or ticket not in self._owed:  # (every drop empties it)
            raise ReplyLostError(self.address, "the connection was dropped before the replies came")
        if self._owed[0] is not ticket:  # an earlier batch's replies come first
            self.abandon()
            raise ReplyLostError(self.address, "replies owed to an earlier batch were not read")
        try:
            replies = read(ticket.count)
        except BaseException as exc:
            self._broken(exc)
        self._owed.popleft()
        self.used = time.monotonic()
        return replies

    def call(self, payload: bytes) -> Any:
        """Send one packed command and return its reply: :meth:`exchange` with no ticket."""
        connection = self._connection
        if (
            connection is None
            or self._owed
            or self._pid != os.getpid()
            or time.monotonic() - self.used >= IDLE_CHECK
        ):
            if self._owed:
                return self.exchange(payload, 1)[0]
            connection = self._connect()
        self.trips_made += 1
        try:
            connection.send_packed_command([payload], check_health=False)
            try:
                reply = connection.read_response(disconnect_on_error=False)
            except ERROR_REPLIES as exc:
                reply = exc
        except BaseException as exc:
            self._broken(exc)
        self.used = time.monotonic()
        return reply

    def responds(self) -> bool:
        """Tell whether the server answers :data:`_PROBE` (any reply), on a connection apart."""
        connection = self._factory()
        try:
            connection.connect()
            connection.send_packed_command([_PROBE], check_health=False)
            connection.read_response(disconnect_on_error=False)
        except ERROR_REPLIES:  # (AuthenticationError and -LOADING before the others)
            return True
        except CONNECTION_ERRORS:
            return False
        finally:
            connection.disconnect()
        return True

    def exchange(self, payload: bytes | Sequence[bytes | memoryview], count: int) -> list[Any]:
        """Send ``count`` packed commands and return their replies (see :meth:`receive`)."""
        return self.receive(self.send(payload, count))

    def _broken(self, exc: BaseException) -> NoReturn:
        """Throw the connection away after a failure between a send and its last reply; raise."""
        self.abandon()
        if isinstance(exc, Exception):
            raise ReplyLostError(self.address, exc) from exc
        raise exc

    def abandon(self) -> None:
        """Throw the connection away, with every reply still owed on it."""
        connection, self._connection = self._connection, None
        self._owed.clear()
        if connection is not None:
            connection.disconnect()

    def spare(self) -> Node:
        """Return a node of the same server on a connection of its own (overlapping exchanges)."""
        if self._spare is None:
            self._spare = Node(self.address, self._factory, self.trips)
        return self._spare

    def close(self) -> None:
        """Close the connection, and the :meth:`spare`'s (nothing may be owed)."""
        self.abandon()
        if self._spare is not None:
            self._spare.close()

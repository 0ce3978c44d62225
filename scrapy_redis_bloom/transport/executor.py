"""Runs the filter's Redis commands under one retry policy, knowing which answers to trust.

Every command goes through :meth:`Executor.run` (batches of :class:`Call`, pipelined per node)
or a :class:`Session` (rounds on one connection). Each reply is sorted (:func:`classify`);
"not now" errors and lost replies are retried with backoff until ``retry_timeout`` (a write
whose reply was lost marked **ambiguous**), then one attempt a second until Redis answers
again, so a crawl under ``BLOOMFILTER_ON_ERROR = "allow"`` does not stall (docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from typing import Any

from redis.exceptions import (
    AskError,
    AuthenticationError,
    BusyLoadingError,
    ExecAbortError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from scrapy_redis_bloom.core.errors import (
    AccessDeniedError,
    CredentialsRefusedError,
    FilterUnavailableError,
    UnsupportedServerError,
    Wording,
)
from scrapy_redis_bloom.core.events import FilterEvents, RateLimitedLog
from scrapy_redis_bloom.transport.node import (
    ERROR_REPLIES,
    Node,
    NotSentError,
    RefusedError,
    ReplyLostError,
    SwitchedError,
    Ticket,
    TransportError,
    lookup_wait,
)
from scrapy_redis_bloom.transport.topology import Topology
from scrapy_redis_bloom.transport.wire import Script, pack_command

logger = logging.getLogger(__name__)

FIRST_BACKOFF = 0.05  #: Backoff between retry rounds: from this, doubling, up to MAX_BACKOFF.
MAX_BACKOFF = 1.0
PROBE_INTERVAL = 1.0  #: After the retry timeout ran out, at most one attempt per this many s.
#: A reply that took longer than this many s is said and counted: a stall the caller waited
#: out (below the socket timeout nothing fails, so nothing else would say it).
SLOW_REPLY = 1.0
#: And this many s more per command of a round: a batch's own cost is no stall (a round of
#: 300,000 checks takes ~3 s on loopback, ~10 µs a command of the client's sending and sorting).
SLOW_PER_COMMAND = 25e-6
STALE = 10.0  #: Seconds past twice the retry timeout when :meth:`Executor.stumbled` is forgotten.
MAX_REDIRECTS = 16  #: Redirections and script loads followed at once for one batch, before waiting.

_ASKING = pack_command(b"ASKING")
#: Redis's replies to a connection that gave no password where one is needed (as redis-py
#: words them: RESP3's HELLO, RESP2's NOAUTH, read by older releases as this text).
NO_PASSWORD_GIVEN = (
    "NOAUTH",
    "HELLO must be called with the client already authenticated",
    "Authentication required",
)
_PLAIN = (int, list)  #: Reply types that are results, whatever they hold (the hot path's replies).
_READ = (int, list, bytes)  #: The same, and the strings its reads reply (GETRANGE).


class Kind(Enum):
    """What a reply means for its call."""

    RESULT = "result"
    NOSCRIPT = "noscript"
    MOVED = "moved"
    ASK = "ask"
    LATER = "later"
    #: A script its cluster stopped part way: tried again later; its writes before that stand.
    PARTIAL = "partial"


#: What an error reply's code means when it is not a result. "Not run, try again later"
#: includes ``NOREPLICAS`` and ``MISCONF``: a primary refuses writes before running them.
_ACT_ON: dict[str, Kind] = {"NOSCRIPT": Kind.NOSCRIPT, "MOVED": Kind.MOVED, "ASK": Kind.ASK}
_ACT_ON.update(dict.fromkeys(("OOM", "LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN"), Kind.LATER))
_ACT_ON.update(dict.fromkeys(("MASTERDOWN", "READONLY", "NOREPLICAS", "MISCONF"), Kind.LATER))
#: A script stopped by its cluster ("Script attempted to access a non local key...", "... to
#: execute a (write) command while the cluster is down"; Redis 6.2: "Lua script attempted").
_STOPPED = re.compile(r"cript attempted to (?:access a non local key|execute .* cluster is down)")


#: The prefix redis-py strips from the error replies it raises as these classes.
_PREFIXES = {
    "OutOfMemoryError": "OOM",
    "BusyLoadingError": "LOADING",
    "ReadOnlyError": "READONLY",
    "NoScriptError": "NOSCRIPT",
    "TryAgainError": "TRYAGAIN",
    "MasterDownError": "MASTERDOWN",
    "ClusterDownError": "CLUSTERDOWN",
    "NoPermissionError": "NOPERM",
    "MovedError": "MOVED",
    "AskError": "ASK",
}


def error_text(reply: BaseException) -> str:
    """Return an error reply's text with its prefix (redis-py strips known prefixes)."""
    text, prefix = str(reply), _PREFIXES.get(type(reply).__name__)
    return f"{prefix} {text}" if prefix and not text.startswith(prefix) else text


#: An error code inside a script's error: "... @user_script: 7: -OOM command not ...".
_IN_SCRIPT = re.compile(r"(?:^|\s)-([A-Z]{2,})\s")


def error_code(reply: BaseException) -> str:
    """Return an error reply's code (``OOM``, ``MOVED``...), also from inside a script's error."""
    text = error_text(reply)
    if "script" in text and (inside := _IN_SCRIPT.search(text)):
        return inside.group(1)
    return text.split(" ", 1)[0]


def acl_denial(reply: Any) -> str | None:
    """Say whether a reply is a Redis ACL refusal: ``"command"``, ``"key"``, or None.

    Worded by version and place: ``NOPERM ...``; in a script ``The user executing the script
    can't ...``; Valkey 9, in a script: ``ACL failure in script: ...``.
    """
    if reply.__class__ is int or not isinstance(reply, ResponseError):
        return None
    message = error_text(reply)
    scripted = "user executing the script can't" in message
    if not (scripted or message.startswith(("NOPERM", "ACL failure in script"))):
        return None
    # The command is named in quotes ('hkeys'): look at Redis's words around it only.
    if "no permissions to run" in message or "can't run this command" in message:
        return "command"
    return "key" if "access" in message else "command"


def access_denied(
    reply: Any, operation: str, key: str | None, where: str
) -> AccessDeniedError | None:
    """Return the error for a reply by which a Redis ACL refused a command; None otherwise."""
    kind = acl_denial(reply)
    if kind is None:
        return None
    message = error_text(reply)
    what = f"refused the {kind}"
    if "executing the script" in message or message.startswith("ACL failure in script"):
        inside = ("refused a command of the filter's script", "refused the filter's script a key")
        what = inside[kind == "key"]
    on_key = f" (key {key!r})" if key else ""
    return AccessDeniedError(
        f"{where} could not {operation}{on_key}: a Redis ACL {what} (Redis: {message})."
        " Grant the filter's Redis user the commands and key patterns listed in"
        " docs/howto/tls-acl.md#least-privilege (ACL SETUSER).",
        server=where,
    )


def classify(reply: Any) -> Kind:
    """Say what a reply means: a result (or final error), or something to act on."""
    if (
        reply.__class__ is int
        or not isinstance(reply, ERROR_REPLIES)
        or isinstance(reply, AuthenticationError)
    ):
        return Kind.RESULT
    kind = _ACT_ON.get(error_code(reply), Kind.RESULT)
    if kind is Kind.RESULT and _STOPPED.search(str(reply)):
        return Kind.PARTIAL
    return kind


class Commit(Enum):
    """What a transaction's ``EXEC`` did (:meth:`Session.settle`)."""

    DONE = "done"  #: Ran: every queued command's result is in.
    ABORTED = "aborted"  #: A watched key changed: nothing ran.
    REFUSED = "refused"  #: A queued command was refused (``EXECABORT``): nothing ran.
    UNSENT = "unsent"  #: Nothing was sent: the transaction's connection was gone.
    #: The writes may have run, in part or outside it: a lost reply, or replies not its own.
    DOUBT = "doubt"


def settled(replies: list[Any], queued: int) -> tuple[Commit, Any]:
    """Sort a transaction's replies (its ``queued`` commands', then ``EXEC``'s): what it did.

    With ``EXEC``'s results (DONE) or the refusal (REFUSED). Replies not its own: a doubt.
    """
    *queue, result = replies
    refused = None
    # One count, not a test per command: a bulk transaction queues a SETRANGE per block changed.
    if queue.count(b"QUEUED") != len(queue):
        refused = next((r for r in queue if isinstance(r, ERROR_REPLIES)), None)
        if any(r not in (b"QUEUED", "QUEUED") and not isinstance(r, ERROR_REPLIES) for r in queue):
            return Commit.DOUBT, result
    if refused is None and result is None:
        return Commit.ABORTED, None
    if refused is None and isinstance(result, list) and len(result) == queued:
        if any(issubclass(kind, ERROR_REPLIES) for kind in set(map(type, result))):
            return Commit.DOUBT, result  # ran in part (tested per type: one per SETRANGE)
        return Commit.DONE, result
    if refused is not None and isinstance(result, ExecAbortError):
        return Commit.REFUSED, refused
    return Commit.DOUBT, result


def describe_failure(failure: BaseException | str) -> str:
    """Say in words why Redis did not carry out a command."""
    if isinstance(failure, NotSentError):
        return f"cannot connect ({failure.cause})"
    if isinstance(failure, ReplyLostError):
        return f"the connection failed before the reply came ({failure.cause})"
    if isinstance(failure, ResponseError | BusyLoadingError):
        text = error_text(failure)
        meaning = {
            "OOM": "Redis is out of memory (used_memory is above maxmemory, so it refuses"
            " writes; see maxmemory and maxmemory-policy)",
            "LOADING": "Redis is loading its data set after a restart",
            "BUSY": "Redis is busy running a script",
            "READONLY": "the server is a read-only replica (a failover moved its master)",
            "MASTERDOWN": "the replica has lost its master",
            "CLUSTERDOWN": "the Redis Cluster is down",
            "TRYAGAIN": "a cluster slot is being migrated",
            "MISCONF": "Redis cannot save to disk (its last RDB save failed, so it refuses"
            " writes until one succeeds; see the Redis log and stop-writes-on-bgsave-error)",
        }.get(error_code(failure))
        return f"{meaning}: {text.rstrip('.')}" if meaning else text
    return str(failure)


@dataclass(slots=True)
class Call:
    """One command: packed, routed by its key, shard or server; ``script``: loaded on NOSCRIPT."""

    payload: bytes
    key: str | None = None
    shard: int | None = None
    server: int | None = None
    script: Script | None = None
    #: Sent instead once a write that must not run twice may have run (``b""``: nothing).
    resend: bytes | None = None


@dataclass(slots=True)
class Results:
    """Replies of a batch, in call order; ``ambiguous[i]``: call ``i`` may have run twice."""

    replies: list[Any]
    ambiguous: list[bool] = field(default_factory=list)
    #: With ``partial=True``: why the calls whose reply is None were given up on.
    failure: FilterUnavailableError | None = None


class Session:
    """Rounds of pipelined commands on one node, every round on the first one's connection.

    A later round raises :class:`NotSentError` if that connection is gone, sending nothing:
    a transaction's writes never run outside it.
    """

    __slots__ = ("_began", "_executor", "_probing", "_serial", "_shut", "_write", "node")

    def __init__(
        self, executor: Executor, node: Node, write: bool, probing: bool, shut: str | None
    ) -> None:
        self.node = node
        self._executor, self._write, self._probing = executor, write, probing
        self._serial: int | None = None  # the connection of the first round
        self._shut = shut  # why no round is sent (its first failed, an outage), or None
        self._began = 0.0  # when its first round was sent

    def post(self, payload: bytes | Sequence[bytes | memoryview], count: int) -> Ticket:
        """Send ``count`` packed commands; return their replies' ticket (:meth:`.Node.send`)."""
        if self._shut is not None:
            raise NotSentError(self.node.address, self._shut)
        self._shut = "the connection it began on failed"
        self._began = self._began or time.monotonic()
        try:
            ticket = self.node.send(payload, count, self._serial, check=True)
        except SwitchedError:
            raise  # not a failure of the server's: its connection was replaced
        except TransportError:
            self._executor.stumbled(self._began)
            raise
        self._shut, self._serial = None, ticket.serial
        return ticket

    def replies(self, ticket: Ticket) -> list[Any]:
        """Read a ticket's replies, in order (:meth:`.Node.receive`)."""
        try:
            got = self.node.receive(ticket)
        except TransportError:
            self._executor.stumbled(self._began)
            raise
        self._executor._stumbled = None  # it answers
        if self._probing:  # the one attempt of a second during an outage: it answered
            self._probing = False
            self._executor._recovered(self._write)
        return got

    def round(self, payload: bytes | Sequence[bytes | memoryview], count: int) -> list[Any]:
        """Send commands and read their replies: one round trip."""
        return self.replies(self.post(payload, count))

    def propose(
        self, payload: Sequence[bytes | memoryview], queued: int
    ) -> Ticket | tuple[Commit, Any]:
        """Send a transaction's commands and ``EXEC``: the ticket, or UNSENT/DOUBT if it failed."""
        try:
            return self.post(payload, queued + 1)
        except (NotSentError, RefusedError):
            return Commit.UNSENT, None
        except ReplyLostError as exc:
            return Commit.DOUBT, exc

    def settle(self, sent: Ticket | tuple[Commit, Any], queued: int) -> tuple[Commit, Any]:
        """Read the replies of what :meth:`propose` sent; say what it did; drop it on a doubt."""
        if not isinstance(sent, Ticket):
            return sent
        try:
            got = self.replies(sent)
        except ReplyLostError as exc:
            return Commit.DOUBT, exc
        outcome = settled(got, queued)
        if outcome[0] is Commit.DOUBT:
            if classify(got[-1]) in (Kind.MOVED, Kind.ASK):  # a resharding: EXEC not run
                logger.info(
                    "%s: a transaction's slot moved before its EXEC (%s): its elements are"
                    " done again where the slot is now.",
                    self.node,
                    error_text(got[-1]),
                )
            else:
                what = "%s: a transaction's replies are not its own: %r"
                logger.warning(what, self.node, got[-1])
            self.drop()
        return outcome

    def drop(self) -> None:
        """Throw the node's connection away (replies owed, a transaction open), if it sent."""
        if self._serial is not None:
            self.node.abandon()


@dataclass
class _Outage:
    """Redis failing a kind of command (reads or writes) for a whole retry window."""

    since: float
    why: str
    where: str
    next_attempt: float = 0.0
    watched: _Watch | None = None


@dataclass
class _Watch:
    """One server's watch (:meth:`Executor._watch`) and the outages it ends when it answers."""

    address: str
    outages: list[_Outage] = field(default_factory=list)
    over: threading.Event = field(default_factory=threading.Event)


class Watches:
    """The watches of silent servers, one per address, shared by a filter's executors.

    A silent server is asked once a second, whichever executor found it silent.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_address: dict[str, _Watch] = {}

    def join(self, outage: _Outage, address: str, start: Callable[[_Watch], None]) -> None:
        """Have ``address``'s watch end ``outage``; ``start`` one if it has none."""
        with self._lock:
            watch = self._by_address.get(address)
            if watch is None:
                watch = self._by_address[address] = _Watch(address)
                start(watch)
            if all(other is not outage for other in watch.outages):
                watch.outages.append(outage)
            outage.watched = watch

    def leave(self, outage: _Outage) -> None:
        """Take an outage out of its watch (recovered, or its executor closed)."""
        with self._lock:
            watch, outage.watched = outage.watched, None
            if watch is not None:
                watch.outages = [other for other in watch.outages if other is not outage]
                if not watch.outages:
                    self._end(watch)

    def answered(self, watch: _Watch) -> None:
        """End a watch whose server answers, and its outages: their next call tries it."""
        with self._lock:
            for outage in watch.outages:
                outage.next_attempt, outage.watched = 0.0, None
            watch.outages = []
            self._end(watch)  # a failure noted from now on starts a watch of its own

    def forked(self) -> None:
        """In a forked child, end the outages the parent's watches were to end.

        Their threads stayed in the parent: the child's next call tries its server (and
        starts a watch of its own if the server is still silent).
        """
        self._lock = threading.Lock()
        watches, self._by_address = self._by_address.values(), {}
        for outage in (outage for watch in watches for outage in watch.outages):
            outage.next_attempt, outage.watched = 0.0, None

    def _end(self, watch: _Watch) -> None:
        watch.over.set()
        if self._by_address.get(watch.address) is watch:
            del self._by_address[watch.address]


@dataclass
class _Batch:
    """A run's calls, what is known of them so far, and what its last round left to do."""

    operation: str
    calls: list[Call]
    write: bool
    replies: list[Any]
    ambiguous: list[bool]
    asking: dict[int, str] = field(default_factory=dict)  #: Calls to send to the node ASK named.
    again: list[int] = field(default_factory=list)  # at once: redirected, script loaded
    later: list[int] = field(default_factory=list)  # after a backoff
    failure: BaseException | None = None
    where: str = ""
    #: The nodes that answered in the rounds since the last failed one.
    answered: list[str] = field(default_factory=list)
    asked: set[int] = field(default_factory=set)  #: Calls sent after ``ASKING`` in the round.
    given: list[Call] = field(default_factory=list)  #: The caller's calls (``calls``: as sent).
    #: Per node and script: its SCRIPT LOAD's outcome (one for many NOSCRIPT replies).
    loads: dict[tuple[int, str], TransportError | None] = field(default_factory=dict)

    def doubt(self, i: int) -> bool:
        """Mark call ``i`` as one that may have run; return whether to send it (or its resend)."""
        self.ambiguous[i] = True
        call = self.calls[i]
        if call.resend is None:
            return True
        if self.calls is self.given:  # the caller's list stays as it was
            self.calls = list(self.given)
        self.calls[i] = Call(call.resend, call.key, call.shard, call.server)
        return bool(call.resend)


class Executor:
    """Runs batches of calls on a topology, retrying for up to ``retry_timeout`` seconds.

    One per thread (its nodes are not thread-safe). With ``follows`` (the filter's, for the
    lease's), it fails fast while that one does, and shares its :class:`Watches`.
    """

    def __init__(
        self,
        topology: Topology,
        retry_timeout: float,
        events: FilterEvents | None = None,
        follows: Executor | None = None,
        budget: Wording | None = None,
    ) -> None:
        self.topology = topology
        self.retry_timeout = retry_timeout
        self.budget = budget if budget is not None else Wording("{BLOOMFILTER_RETRY_TIMEOUT}")
        self.events = events if events is not None else FilterEvents()
        #: Raises the error naming what a refused script lacks.
        self.explain_denial: Callable[[], None] | None = None
        #: Per kind of command (an out-of-memory Redis still serves reads): runs fail fast.
        self._outages: dict[bool, _Outage] = {}
        #: The other thread's outages, read only (a dict lookup, safe across threads).
        self._followed = follows._outages if follows is not None else {}
        self._watches: Watches = follows._watches if follows is not None else Watches()
        self._stumbled: float | None = None  #: When a failed exchange began (:meth:`stumbled`).
        self._watch_log = RateLimitedLog(logger)  # a watch's own failures: once a minute
        self._retry_log = RateLimitedLog(logger)  # a fault ridden through by retries: the same
        self._slow_log = RateLimitedLog(logger)  # a reply that took long (:data:`SLOW_REPLY`)

    def run(
        self,
        operation: str,
        calls: list[Call],
        *,
        write: bool = False,
        timeout: float | None = None,
        partial: bool = False,
        since: float | None = None,
        prior: TransportError | None = None,
    ) -> Results:
        """Run the calls; return their replies. ``operation`` names them in errors.

        ``write``: a lost reply's call sent again (or its resend) is marked ambiguous.
        ``timeout`` replaces the retry timeout (0: one attempt), counted from ``since``;
        ``prior``: how the hot path's attempt then failed. Raises :class:`FilterUnavailableError`
        when Redis does not answer in time (``partial``: returns it in :attr:`Results.failure`,
        None for the replies it lacks).
        """
        started = time.monotonic() if since is None else since
        # An exchange that failed just before (a bulk call's session) began the retry window;
        # a run of one attempt leaves it to the retries.
        failed_at = self._stumbling()
        failure = None
        if failed_at is not None and timeout is not None:
            failure = FilterUnavailableError(
                f"{self.topology.describe()} could not {operation}: an exchange failed"
                " just before (left to the retries).",
                operation=operation,
            )
        elif failed_at is not None:
            self._stumbled = None
            started = min(started, failed_at)
        # A stalled server (each attempt waits a socket timeout) costs the budget and one more.
        end = started + (self.retry_timeout if timeout is None else timeout)
        outage = self._outages.get(write) or self._followed.get(write)
        if outage is not None and failure is None:
            if started < outage.next_attempt:
                failure = self._still_failing(operation, outage, started)
            end = started  # one attempt: it has been failing for a while
        if failure is not None:
            if partial:
                return Results([None] * len(calls), [False] * len(calls), failure)
            raise failure
        batch = _Batch(
            operation, calls, write, [None] * len(calls), [False] * len(calls), given=calls
        )
        todo = list(range(len(calls)))
        backoff, redirects, first_failure, why, where = FIRST_BACKOFF, 0, 0.0, "", ""
        retried = prior is not None  # (then this run is a retry)
        if prior is not None:  # said and counted as run()'s own failed rounds are
            first_failure, why, where = started, describe_failure(prior), prior.address
            self.events.count("retries")
        while todo:
            began, commands = time.monotonic(), len(todo)
            self._round(batch, todo)
            if batch.again and redirects < MAX_REDIRECTS and not batch.later:
                redirects += 1
                todo = batch.again
                continue
            todo = batch.again + batch.later
            if not todo:
                if (now := time.monotonic()) - began > SLOW_REPLY:
                    where = ", ".join(dict.fromkeys(batch.answered))
                    self.slow(operation, where, began, now, SLOW_PER_COMMAND * commands)
                break
            now = time.monotonic()
            first_failure = first_failure or began  # (its socket timeout was part of it)
            if now >= end:
                why = describe_failure(batch.failure or "no answer")
                if timeout is None:  # a whole retry window: fail fast from now on
                    self._failing(write, first_failure, why, batch.where, now, batch.failure)
                elif isinstance(batch.failure, TransportError):  # one attempt: the next's window
                    self.stumbled(started)
                failure = self._unavailable(operation, why, batch.where, started, retried)
                if partial:
                    return Results(batch.replies, batch.ambiguous, failure)
                raise failure
            self.events.count("retries")
            retried = True
            why, where = describe_failure(batch.failure or "no answer"), batch.where
            batch.answered = []
            time.sleep(min(backoff * (0.5 + random.random()), end - now))
            backoff = min(backoff * 2, MAX_BACKOFF)
            redirects = 0
            if isinstance(batch.failure, TransportError):
                self.topology.refresh()
        if not self._recovered(write) and first_failure:
            # A fault ridden through is said, naming who answered (after a failover, another).
            by = ", ".join(dict.fromkeys(batch.answered)) or where or self.topology.describe()
            took_over = batch.answered and where and where not in batch.answered
            self._retry_log.log(
                logging.WARNING,
                where,
                "%s answered %s after %.1f s of retries (%s): carried out%s.",
                by,
                operation,
                time.monotonic() - first_failure,
                why,
                f" ({by} took over from {where}: a failover, or its slots moved)"
                if took_over
                else "",
            )
        return Results(batch.replies, batch.ambiguous)

    def slow(
        self, operation: str, where: str, started: float, ended: float, allowance: float = 0.0
    ) -> None:
        """Say and count a reply that took over :data:`SLOW_REPLY` (plus ``allowance``) s.

        The caller waited. Not the time its connect spent asking Sentinels
        (:func:`.lookup_wait`): a Sentinel down is said on its own (:mod:`.sentinel`).
        """
        took = ended - started - lookup_wait(started, ended)
        if took <= SLOW_REPLY + allowance:
            return
        self.events.count("slow_replies")
        self._slow_log.log(
            logging.WARNING,
            "slow",
            "Redis at %s took %.1f s to answer a call to %s, and the call waited for it: a stall (a"
            " slow command, a fork for a snapshot, swapping, a paused machine or a congested"
            " link). A reply that takes longer than the socket timeout is retried, and past"
            " BLOOMFILTER_RETRY_TIMEOUT answered per BLOOMFILTER_ON_ERROR.",
            where or self.topology.describe(),
            took,
            operation,
        )

    def refusal(self, operation: str, write: bool) -> FilterUnavailableError | None:
        """Return the error :meth:`run` fails fast with now, or None (uses no connection)."""
        outage = self._outages.get(write) or self._followed.get(write)
        now = time.monotonic()
        if outage is None or now >= outage.next_attempt:
            return None
        return self._still_failing(operation, outage, now)

    def _failing(
        self, write: bool, since: float, why: str, where: str, now: float, failure: object
    ) -> _Outage:
        """Note that a kind of command failed for a whole retry window: fail fast from now on."""
        node = None  # (not a node of the topology now: an attempt a second)
        if isinstance(failure, TransportError) and not isinstance(failure, RefusedError):
            with contextlib.suppress(RedisError, RedisClusterException, ValueError):
                node = self.topology.node_at(failure.address)
        outage = self._outages.setdefault(write, _Outage(since, why, where))
        outage.why, outage.where = why, where
        outage.next_attempt = now + PROBE_INTERVAL if node is None else math.inf
        if node is None:
            return outage
        # A server that stopped answering: reads and writes alike wait for the watch to see it.
        self._outages.setdefault(not write, outage)
        if outage.watched is None:
            self._watches.join(outage, node.address, partial(self._start_watch, node))
        return outage

    def forked(self) -> None:
        """In a forked child: the watches' threads are not there (see :meth:`Watches.forked`)."""
        self._watches.forked()

    def _start_watch(self, node: Node, watch: _Watch) -> None:
        threading.Thread(
            target=self._watch,
            args=(watch, node),
            name=f"bloomfilter-watch-{node.address}",
            daemon=True,
        ).start()

    def _watch(self, watch: _Watch, node: Node) -> None:
        """Ask a silent server once a second until it answers (meanwhile calls fail fast)."""
        while not watch.over.wait(PROBE_INTERVAL):
            try:
                answered = node.responds() or not self.topology.serves(node)
            except Exception as exc:  # never ends the watch: the outage would never end
                logger.debug("Asking Redis at %s failed", node.address, exc_info=True)
                self._watch_log.log(
                    logging.WARNING,
                    node.address,
                    "Could not ask Redis at %s whether it answers (%s: %s); asking again"
                    " every second",
                    node.address,
                    type(exc).__name__,
                    exc,
                )
                continue
            if answered:
                self._watches.answered(watch)
                logger.debug("Redis at %s answers again, or no longer serves the filter: the next"
                             " call tries it", node.address)  # fmt: skip
                return

    def stumbled(self, began: float) -> None:
        """Note a failed exchange outside :meth:`run`, begun at ``began``: the next run's window.

        So a bulk call going to Redis several ways ends within the retry timeout, as a check does.
        """
        if self._stumbled is None:
            self._stumbled = began

    def _stumbling(self) -> float | None:
        """Return when a failed exchange noted by :meth:`stumbled` began; None: long ago."""
        began = self._stumbled
        if began is not None and time.monotonic() - began > 2 * self.retry_timeout + STALE:
            self._stumbled = began = None
        return began

    def _recovered(self, write: bool) -> bool:
        """Say that a kind of command runs again after an outage; return whether there was one."""
        outage = self._outages.pop(write, None)
        both = outage is not None and self._outages.get(not write) is outage
        if both:  # a server that stopped answering
            del self._outages[not write]
        if outage is not None:
            self._watches.leave(outage)
            logger.warning(
                "%s carries out %s again, after %.1f s of: %s",
                self.topology.describe(),
                "reads and writes" if both else "writes" if write else "reads",
                time.monotonic() - outage.since,
                outage.why,
            )
        return outage is not None

    def _admit(self, operation: str, write: bool) -> bool:
        """Let a hot-path call through, or fail fast; True if it is an outage's attempt a second."""
        outage = self._outages.get(write)
        if outage is None:
            return False
        now = time.monotonic()
        if now < outage.next_attempt:
            raise self._still_failing(operation, outage, now)
        return True

    def _spent(
        self, operation: str, write: bool, failure: TransportError, started: float, probing: bool
    ) -> None:
        """Raise if a failed hot-path call must not be retried: an outage's attempt, or too late."""
        now = time.monotonic()
        if not probing and now - started < self.retry_timeout:
            return
        why, outage = describe_failure(failure), self._outages.get(write)
        since = outage.since if outage is not None else started
        outage = self._failing(write, since, why, failure.address, now, failure)
        if probing:
            raise self._still_failing(operation, outage, now) from None
        retried = self.retry_timeout > 0
        raise self._unavailable(operation, why, failure.address, started, retried) from None

    def _round(self, batch: _Batch, todo: list[int]) -> None:
        """Send the calls still to do, pipelined per node; sort out their replies."""
        batch.again, batch.later, batch.asked, batch.loads = [], [], set(), {}
        batch.failure, batch.where = None, ""
        calls, asked = batch.calls, batch.asked
        groups: dict[int, tuple[Node, list[int]]] = {}
        for i in todo:
            call = calls[i]
            target = batch.asking.pop(i, None)
            try:
                if target is None:
                    node = self.topology.route(call.key, call.shard, call.server)
                else:
                    node = self.topology.node_at(target)
                    asked.add(i)
            except (RedisError, RedisClusterException, ValueError) as exc:
                batch.later.append(i)  # e.g. a slot no node covers during a failover
                batch.failure = exc
                continue
            groups.setdefault(id(node), (node, []))[1].append(i)
        # Every node's batch is sent before any is read: one round trip in all.
        sent: list[tuple[Node, list[int], Ticket | TransportError]] = []
        try:
            for node, indexes in groups.values():
                payload = b"".join(
                    (_ASKING if i in asked else b"") + calls[i].payload for i in indexes
                )
                count = len(indexes) + len(asked.intersection(indexes))
                try:
                    ticket: Ticket | TransportError = node.send(payload, count, check=True)
                except TransportError as exc:
                    ticket = exc
                sent.append((node, indexes, ticket))
            for node, indexes, ticket in sent:
                self._sort_out(batch, node, indexes, ticket)
        finally:
            # An error raised above leaves replies unread: no later call may read them.
            for node, _, ticket in sent:
                if isinstance(ticket, Ticket) and node.owes(ticket):
                    node.abandon()

    def _sort_out(
        self, batch: _Batch, node: Node, indexes: list[int], ticket: Ticket | TransportError
    ) -> None:
        """Read one node's replies of a round and sort them into ``batch``."""
        try:
            if isinstance(ticket, TransportError):
                raise ticket
            got = node.receive(ticket)
        except RefusedError as exc:
            raise self.refused(batch.operation, exc) from None
        except TransportError as exc:
            if batch.write and isinstance(exc, ReplyLostError):
                indexes = [i for i in indexes if batch.doubt(i)]
            batch.later += indexes
            batch.failure, batch.where = exc, node.address
            return
        if batch.asked:  # drop the replies to ASKING
            keep = [k for i in indexes for k in ((False, True) if i in batch.asked else (True,))]
            got = list(itertools.compress(got, keep))
        where, answered = f"Redis at {node.address}", False
        moved: BaseException | None = None
        for i, reply in zip(indexes, got, strict=True):
            kind, call = classify(reply), batch.calls[i]
            if kind is Kind.NOSCRIPT and call.script is not None:
                load = (id(node), call.script.sha)
                if load not in batch.loads:
                    batch.loads[load] = self.load(node, call.script, batch.operation)
                if batch.loads[load] is None:
                    batch.again.append(i)
                    continue
                kind, reply = Kind.LATER, batch.loads[load]  # not run: resent after a backoff
            if kind is Kind.MOVED:  # followed once for the batch: one re-read of the slot map
                moved = reply
                batch.again.append(i)
            elif kind is Kind.ASK:  # to the host:port it names
                target = f"{reply.host}:{reply.port}" if isinstance(reply, AskError) else None
                batch.asking[i] = target or error_text(reply).split()[-1]
                batch.again.append(i)
            elif kind is Kind.LATER or kind is Kind.PARTIAL:
                if kind is Kind.PARTIAL and batch.write and not batch.doubt(i):
                    continue
                batch.later.append(i)
                batch.failure, batch.where = reply, node.address
            else:  # a result, or an error reply retrying cannot fix
                if isinstance(reply, AuthenticationError):
                    raise self.refused(batch.operation, RefusedError(node.address, reply))
                if call.script is not None and (
                    denied := access_denied(reply, batch.operation, call.key, where)
                ):
                    raise self.explain(denied)
                batch.replies[i] = reply
                answered = True
        if moved is not None:
            self.topology.moved(node.address, moved)
        if answered:
            batch.answered.append(node.address)

    def fast(
        self,
        operation: str,
        payload: bytes,
        key: str,
        shard: int,
        script: Script | None,
        resend: bytes | None = None,
    ) -> tuple[Any, bool]:
        """Run one write on a shard's key; return its reply and whether it may have run twice.

        The hot path: one round trip, anything but a plain reply retried by :meth:`run`.
        ``resend``: as :attr:`Call.resend`.
        """
        probing = self._admit(operation, True)
        started, prior = time.monotonic(), None
        try:
            node = self.topology.route(key, shard, None)
            reply = node.call(payload)
        except RefusedError as exc:
            raise self.refused(operation, exc) from None
        except TransportError as exc:
            self._spent(operation, True, exc, started, probing)
            lost = isinstance(exc, ReplyLostError)  # else not sent: retried
            prior = exc
        except (RedisError, RedisClusterException, ValueError):
            lost = False  # no node for the slot now (a failover): retried
        else:
            if isinstance(reply, AuthenticationError):  # as run() has it: refused, no answer
                raise self.refused(operation, RefusedError(node.address, reply))
            if node.used - started > SLOW_REPLY:
                self.slow(operation, node.address, started, node.used)
            # An int or an array is never an error reply: no need to classify it.
            if reply.__class__ in _PLAIN or classify(reply) is Kind.RESULT:
                if probing:
                    self._recovered(True)
                return reply, False
            lost = classify(reply) is Kind.PARTIAL
        if lost and resend is not None:
            payload, resend = resend, None
        calls = [Call(payload, key, shard, script=script, resend=resend)]
        results = self.run(operation, calls, write=True, since=started, prior=prior)
        return results.replies[0], lost or results.ambiguous[0]

    def fast_many(
        self, operation: str, payloads: list[bytes], key: str, shard: int, *, write: bool = False
    ) -> Results:
        """Run commands of one key's slot in one round trip as :meth:`fast` (a grown shard's)."""
        probing = self._admit(operation, write)
        started, prior = time.monotonic(), None
        replies: list[Any] = [None] * len(payloads)
        rest: Sequence[int] = range(len(payloads))  # to run again: all of them after a failure
        try:
            node = self.topology.route(key, shard, None)
            replies = node.exchange(b"".join(payloads), len(payloads))
            if node.used - started > SLOW_REPLY:
                self.slow(operation, node.address, started, node.used)
        except RefusedError as exc:
            raise self.refused(operation, exc) from None
        except TransportError as exc:
            self._spent(operation, write, exc, started, probing)
            lost = isinstance(exc, ReplyLostError)
            prior = exc
        except (RedisError, RedisClusterException, ValueError):
            lost = False
        else:
            for reply in replies:
                if isinstance(reply, AuthenticationError):
                    raise self.refused(operation, RefusedError(node.address, reply))
            done = [r.__class__ in _READ or classify(r) is Kind.RESULT for r in replies]
            if all(done):
                if probing:
                    self._recovered(write)
                return Results(replies, [False] * len(replies))
            lost = any(
                not ok and classify(r) is Kind.PARTIAL for r, ok in zip(replies, done, strict=True)
            )
            rest = [i for i, ok in enumerate(done) if not ok]  # a write that ran: not twice
        calls = [Call(payloads[i], key, shard) for i in rest]
        again = self.run(operation, calls, write=write, since=started, prior=prior)
        ambiguous = [False] * len(replies)
        for i, reply, doubt in zip(rest, again.replies, again.ambiguous, strict=True):
            replies[i], ambiguous[i] = reply, doubt or (lost and write)
        return Results(replies, ambiguous)

    def session(
        self, node: Node, operation: str | None = None, write: bool = False, spare: bool = False
    ) -> Session:
        """Return a :class:`Session` on ``node`` (``spare``: its second connection)."""
        if spare:
            node = node.spare()
        try:
            probing = self._admit(operation or "reach Redis", write)
        except FilterUnavailableError as exc:
            return Session(self, node, write, False, str(exc))
        if self._stumbling() is not None:  # one failed just before: the retries' turn
            return Session(self, node, write, False, "an exchange failed just before")
        return Session(self, node, write, probing, None)

    def refused(self, operation: str, exc: RefusedError) -> CredentialsRefusedError:
        """Return the error for credentials Redis refused (a rotated password, say)."""
        cause = str(exc.cause)
        problem = f"refused the filter's credentials, so it could not {operation} ({cause})"
        if any(raw in cause for raw in NO_PASSWORD_GIVEN):
            problem = f"needs a password, and none was given, so it could not {operation}"
        return CredentialsRefusedError(
            f"Redis at {exc.address} {problem}. Check the user name and password of the filter's"
            " Redis URL (BLOOMFILTER_REDIS_URL, REDIS_URL or REDIS_PARAMS) and the user's"
            " ACL (docs/howto/tls-acl.md#least-privilege).",
            server=f"Redis at {exc.address}",
        )

    def load(self, node: Node, script: Script, operation: str) -> TransportError | None:
        """Load a script on a node that answered ``NOSCRIPT``; return the failure if unconfirmed."""
        try:
            (reply,) = node.exchange(pack_command(b"SCRIPT", b"LOAD", script.source), 1)
        except RefusedError as exc:
            raise self.refused(f"load a script to {operation}", exc) from None
        except TransportError as exc:
            return exc
        if isinstance(reply, ERROR_REPLIES) and classify(reply) is Kind.RESULT:
            where = f"Redis at {node.address}"
            denied = access_denied(reply, f"load a script to {operation}", None, where)
            if denied is not None:
                raise self.explain(denied)
            raise UnsupportedServerError(
                f"{where} cannot load the filter's Lua scripts to {operation} (SCRIPT LOAD:"
                f" {error_text(reply)}). The filter needs scripting: EVALSHA and SCRIPT LOAD"
                " enabled and not renamed (rename-command)."
            )
        if reply != script.sha.encode():  # not SCRIPT LOAD's reply: the script is not known
            return NotSentError(node.address, f"SCRIPT LOAD answered {reply!r:.100}")
        return None

    def explain(self, denied: AccessDeniedError) -> AccessDeniedError:
        """Return the error naming what a refused script lacked, which Redis does not say."""
        probe, self.explain_denial = self.explain_denial, None  # the probe runs no script
        if probe is None:
            return denied
        try:
            probe()
        except AccessDeniedError as precise:
            doing = str(denied).partition(": a Redis ACL")[0]
            named = AccessDeniedError(
                f"{doing}: {precise}", precise.server, precise.commands, precise.keys
            )
            named.__cause__ = denied
            return named
        finally:
            self.explain_denial = probe
        return denied

    def _unavailable(
        self, operation: str, why: str, where: str, started: float, retried: bool = True
    ) -> FilterUnavailableError:
        """Return the error of an operation that failed past its budget (``retried``: or once)."""
        place = f"Redis at {where}" if where else self.topology.describe()
        message = Wording(
            "{place} could not {operation}: {why}. "
            + ("Retried for" if retried else "Tried once, for")
            + " {waited:.1f} s ({budget} = {timeout:g} s).",
            place=place,
            operation=operation,
            why=why,
            waited=time.monotonic() - started,
            timeout=self.retry_timeout,
            budget=self.budget,
        )
        return FilterUnavailableError(message, operation=operation, server=place)

    def _still_failing(self, operation: str, outage: _Outage, now: float) -> FilterUnavailableError:
        place = f"Redis at {outage.where}" if outage.where else self.topology.describe()
        message = (
            f"{place} could not {operation}: still failing after {now - outage.since:.0f} s"
            f" ({outage.why}; tried again once a second meanwhile)."
        )
        return FilterUnavailableError(message, operation=operation, server=place)

    def close(self) -> None:
        """Close the topology's connections; end any watch (a later call makes the attempt)."""
        for outage in self._outages.values():
            if outage.watched is not None:
                self._watches.leave(outage)
                outage.next_attempt = 0.0
        self.topology.close()

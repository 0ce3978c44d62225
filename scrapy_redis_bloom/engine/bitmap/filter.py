"""The bitmap backend's filter: :class:`RedisBloomFilter`, bits in Redis strings, sharded.

"Seen" only when Redis confirmed, in this call, every bit set in a shard carrying this
filter's id; any doubt answers "new" (docs/explanation/contract.md). Calls hold a lock.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, Self, TypeVar

from scrapy_redis_bloom.core import layout
from scrapy_redis_bloom.core.errors import (
    AccessDeniedError,
    BloomFilterError,
    FilterDamagedError,
    FilterUnavailableError,
    foreign_reply,
)
from scrapy_redis_bloom.core.generations import seed_arguments
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.core.settings import BloomConfig
from scrapy_redis_bloom.core.sizing import STRING_OVERHEAD, allocation
from scrapy_redis_bloom.engine import scripts
from scrapy_redis_bloom.engine.access import check_access
from scrapy_redis_bloom.engine.base import FilterBase, Outcome, item_count
from scrapy_redis_bloom.engine.bitmap.bulk import Bulk, ScriptHooks
from scrapy_redis_bloom.engine.bitmap.fastpath import STATE_EVERY, Command, FastPath
from scrapy_redis_bloom.engine.bitmap.shards import Bitmaps
from scrapy_redis_bloom.engine.bitmap.stackpath import ADD, SEEN, Check, StackPath
from scrapy_redis_bloom.engine.health import info_fields, short_of_room
from scrapy_redis_bloom.engine.lifecycle import Lifecycle
from scrapy_redis_bloom.engine.parts import script_call, text
from scrapy_redis_bloom.engine.state import (
    FilterState,
    estimate_from_items,
    read_counts,
    read_state,
)
from scrapy_redis_bloom.transport.executor import Call, Results, error_text
from scrapy_redis_bloom.transport.topology import Cluster
from scrapy_redis_bloom.transport.wire import command_head, encode, pack_command

#: What a check-and-add does, in the executor's errors.
OPERATION = "check and add a request"
BATCH_OPERATION = "check and add a batch of requests"

#: What ``TYPE`` says of a shard's key: a string, or none when missing.
TYPES = ("string", "none")

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_Failure = FilterUnavailableError | AccessDeniedError | None


class RedisBloomFilter(FilterBase):
    """A Bloom filter kept in Redis string bitmaps, sharded over several keys.

    ``client``: a ``redis.Redis``, a ``redis.cluster.RedisCluster``, or a sequence of
    standalone clients (shard ``i`` on server ``i mod n``), whose settings it connects
    with. ``spec``, ``capacity`` and ``sizing`` (:class:`..sizing.Sizing`) say what to
    create; a filter that exists keeps its record's geometry. Opened on first use.
    """

    def _setup(self) -> None:
        self.executor.explain_denial = partial(check_access, self.executor, self.topology, self.key)
        self._shards = Bitmaps(self.parts, self.topology, self.events)
        self.lifecycle = Lifecycle(self._shards, self.faults, self.events)
        self._script = scripts.check_and_add(self.wanted.growth, one=True)  # (_adopt: record's)
        self._bulk_script = scripts.check_and_add(self.wanted.growth)
        self._heads: dict[int, tuple[bytes, str]] = {}
        #: Shards whose next script recreates lost parts (whose reads in the call pass over them).
        self._recreate: set[int] = set()
        #: The call's recovery deadline (monotonic; 0: not yet), pause, recreated shards.
        self._deadline = 0.0
        self._pause = 0.0
        self._recreated: set[int] = set()
        #: (server, generation) whose room to grow was checked (see :meth:`_room_to_grow`),
        #: and (shard, generation) a bulk call's growth left to check once its replies are in.
        self._room_checked: set[tuple[str, int]] = set()
        self._room_due: list[tuple[int, int]] = []
        self._fast: FastPath | None = None  # the scriptless hot paths, once open
        self._grown: dict[int, int] = {}  # per shard, the most generations a script reported
        self._stack: StackPath | None = None
        self._identities: dict[int, bytes] = {}
        self._bulk = Bulk(
            self.topology,
            self.executor,
            self.parts,
            self._identity,
            self._recover,
            allow=self.faults.on_error == "allow",
            again=self._recover_again,
            hooks=ScriptHooks(
                active=lambda: bool(self.record and (self.record.expansion or self.record.ttl)),
                script=lambda: self._bulk_script,
                head=partial(self._scripted_head, bulk=True),
                note=partial(self._note, later=True),
                mismatch=self._mismatch,
                scriptless=self._scriptless,
                growth=lambda: self._current().growth,
            ),
        )

    @classmethod
    def from_config(cls, client: Any, key: str, config: BloomConfig, **options: Any) -> Self:
        """Return the bitmap filter ``config`` asks for (``options``: the constructor's).

        This class is the bitmap backend's: ``config.backend == 'native'`` is a ValueError, and
        under ``'auto'`` or ``'bitmap'`` a native filter in Redis is refused when opened.
        ``key``: the filter's, filled in (``BloomConfig.key_for``), under BLOOMFILTER_KEY's
        rule: a key that breaks it is a TypeError or ValueError.
        """
        if config.backend == "native":
            raise ValueError(
                "RedisBloomFilter is the bitmap backend's class, and this configuration asks"
                " for BLOOMFILTER_BACKEND = 'native' (the servers' own Bloom filters, BF.*)."
                " Use BLOOMFILTER_BACKEND = 'bitmap' or 'auto' with this class, or the Scrapy"
                " dupefilter (scrapy_redis_bloom.dupefilter.RFPDupeFilter), which opens native"
                " filters."
            )
        bloom = super().from_config(client, key, config, **options)
        bloom.lifecycle.fixed = (
            "RedisBloomFilter is the bitmap backend's class: it opens bitmap filters only,"
            " whatever BLOOMFILTER_BACKEND says"
        )
        return bloom

    def __repr__(self) -> str:
        return (
            f"<RedisBloomFilter key={self.key!r} bits={self.spec.bits} shards={self.spec.shards}"
            f" hash_count={self.spec.hash_count} capacity={self.capacity}"
            f" servers={self.topology.servers}>"
        )

    @property
    def shard_keys(self) -> list[str]:
        """The keys of every shard, in shard order (built on demand)."""
        return [self.parts.shard_key(shard) for shard in range(self.spec.shards)]

    def _adopt(self, record: FilterRecord) -> None:
        old, self.record = self.record, record
        if old is None or old.filter_id != record.filter_id or old.growth != record.growth:
            self._script = scripts.check_and_add(record.growth, one=True)
            self._bulk_script = scripts.check_and_add(record.growth)
            self._heads.clear()
            self._hot_paths(record)
            self._identities.clear()
            self._grown.clear()
            self.counters.follow(record.expansion, record.ttl)
            if old is not None:
                self._cache.clear()

    def _hot_paths(self, record: FilterRecord) -> None:
        """Set up, knowing nothing yet, the scriptless hot paths the record's growth allows."""
        growth, workers = record.growth, lambda: self.workers
        self._fast = self._stack = None
        if FastPath.applies(growth):
            self._fast = FastPath(growth, self.parts.shard_key, self._identity, workers)
        if StackPath.applies(growth):
            self._stack = StackPath(growth, self.key, self._identity, workers)

    def _forked(self) -> None:
        """In a forked child, also drop the shard counts the parent holds back (it sends them)."""
        super()._forked()
        if self.record is not None:
            self._hot_paths(self.record)

    def clear(self) -> None:
        """Delete the filter (see :meth:`.FilterBase.clear`); the next check opens it anew."""
        with self._lock:
            super().clear()
            self._fast = self._stack = None

    def estimate(self, items: int) -> FilterState:
        """Return the state ``items`` distinct adds leave, by the geometry alone: no Redis call."""
        count = item_count(items)
        return estimate_from_items((self.record or self.wanted).growth, count)

    def state(self) -> FilterState:
        """Count the bits set per shard and the memory Redis holds for them (O(m) in Redis).

        No filter under the key raises FilterMissingError: a read creates none. Parts missing
        or not the filter's are in its ``damaged`` (a check raises, or recreates them under
        ``BLOOMFILTER_ON_LOSS = "recreate"``).
        """
        with self._lock:
            return read_state(self.parts, self._existing())

    def _windows_state(self, record: FilterRecord) -> FilterState:
        """Read the item counts in the live windows' headers (:func:`.read_counts`), not the bits.

        The counts this worker holds back are sent first, so that they are in it.
        """
        self._flush_counts()
        return read_counts(self.parts, record)

    def _check_and_add(
        self, element: str | bytes, h1: int, h2: int, recovered: bool = False
    ) -> bool:
        """One ``BITFIELD`` (:mod:`.fastpath`); reads, then one (:mod:`.stackpath`); the script."""
        if not recovered:  # a call begins (:meth:`_begin`, inline on the hot path)
            self._deadline = 0.0
            if self._recreate:
                self._recreate.clear()
        fast = self._fast
        command = fast.pack(h1, h2) if fast is not None else None
        if command is None:
            stack = self._stack
            check = stack.plan(h1, h2) if stack is not None and not recovered else None
            if check is not None:
                seen = self._stacked(check)
                if seen is not None:
                    return seen
            command = self._scripted(h1, h2)
        try:
            reply, ambiguous = self.executor.fast(
                OPERATION,
                command.payload,
                command.key,
                command.shard,
                command.script,
                command.resend,
            )
        except (FilterUnavailableError, AccessDeniedError):
            command.give_back()
            raise
        return self._conclude(command, reply, ambiguous, element, h1, h2, recovered)

    def _stacked(self, check: Check) -> bool | None:
        """Check an element of a grown or windowed shard without the script; None: the script's."""
        stack = self._stack
        assert stack is not None
        key, sent_at = check.keys[0].name, time.time()
        replies = self.executor.fast_many(OPERATION, check.reads, key, check.shard).replies
        judge = partial(stack.judge, check, sent_at=sent_at)
        verdict = self._read(key, replies, judge, [k.name for k in check.keys])
        if verdict != ADD:
            return verdict == SEEN or None
        try:
            if check.count:  # the count this worker owes goes with it, to the same node
                results = self.executor.fast_many(
                    OPERATION, [check.add, check.count], check.add_key, check.shard, write=True
                )
                reply, ambiguous = results.replies[0], results.ambiguous[0]
                stack.counted(check, results.replies[1])
            else:
                reply, ambiguous = self.executor.fast(
                    OPERATION, check.add, check.add_key, check.shard, None
                )
        except (FilterUnavailableError, AccessDeniedError):
            check.give_back()
            check.unjudge()
            raise
        return self._added(check, reply, ambiguous)

    def _read(
        self,
        key: str,
        replies: list[Any],
        read: Callable[[list[Any]], _T],
        keys: Sequence[str] = (),
    ) -> _T:
        """Return what ``read`` makes of a round's replies; an error reply or wrong shape raises."""
        for reply in replies:
            if isinstance(reply, BaseException):
                if keys and "WRONGTYPE" in error_text(reply):
                    calls = [Call(pack_command(b"TYPE", k), key=k) for k in keys]
                    found = self.parts.run("read the types of a shard's keys", calls, take=text)
                    key = next((k for k, t in zip(keys, found, strict=True) if t not in TYPES), key)
                raise self.parts.refusal(reply, key, OPERATION)
        try:
            return read(replies)
        except ValueError as exc:
            raise foreign_reply("a check", key, exc) from None

    def _added(self, check: Check, reply: Any, ambiguous: bool) -> bool | None:
        """Read a stacked check's add: its answer, or None (the key was not this filter's)."""
        stack = self._stack
        assert stack is not None
        if isinstance(reply, BaseException):  # refused, not run
            check.add_undone()
            raise self.parts.refusal(reply, check.add_key, OPERATION)
        seen = self._read(check.add_key, [reply], lambda got: stack.added(check, got[0]))
        if seen is None:  # lost or reset between the reads and the add: the script sorts it out
            self._take_back_bits(check.add_key, check.shard, reply, check.add_bits)
            return None
        if check.again:  # new to a generation sealed meanwhile: add it to the next one too
            key = check.again_key
            results = self.executor.fast_many(
                OPERATION, [check.again], key, check.shard, write=True
            )
            again = results.replies[0]
            seen = self._read(key, [again], lambda got: stack.looked(check, got[0]))
            if seen is None:  # not this filter's: its bits go, and the element is new
                self._take_back_bits(key, check.shard, again, check.again_bits)
                return False
            ambiguous = ambiguous or results.ambiguous[0]
        if seen and ambiguous:
            self.events.count("ambiguous")
            return False  # the bits may be this call's own, set by a lost attempt
        return seen

    def _look(self, fast: FastPath, shards: set[int]) -> None:
        """Read the state of the shards whose count this worker never read (one round trip).

        Only for shards a batch checks more than :data:`STATE_EVERY` elements of: fewer
        are safe without it. A batch's fast checks, planned before any reply, stop at the
        growth boundary only by a count: without one, 100,000 checks all went to generation
        0 (300,110 items in a generation of 206,940). A read that fails leaves them to the
        script past a few.
        """
        unknown = fast.unknown(shards)
        if not unknown:
            return
        calls = [Call(read, key=key, shard=shard) for shard, key, read in unknown]
        try:
            replies = self.parts.run(BATCH_OPERATION, calls)  # (the batch's first round)
        except FilterUnavailableError:  # (said and counted; a refusal raises, as the batch's)
            return  # each shard's checks then take the script past STATE_EVERY
        for (shard, _, _), reply in zip(unknown, replies, strict=True):
            fast.looked(shard, reply)

    def _check_and_add_all(self, todo: list[tuple[int, int, str | bytes, int, int]]) -> Outcome:
        """Check and add elements (``(position, tag, element, h1, h2)``) in few round trips."""
        self._begin()
        if self.record is None:
            # Opened first: the hot paths are set up by the record, and every check is
            # planned before any reply (unopened, each went to the general script).
            try:
                self._current()
            except FilterUnavailableError as exc:  # answered as the checks' own outage
                self._unavailable(exc, len(todo))  # (raises unless ON_ERROR = "allow")
                lost = [element for _, _, element, _, _ in todo]
                return Outcome([False] * len(todo), errors=len(todo), failed=lost)
        answers: list[bool | None] = [None] * len(todo)
        stack = self._stack
        checks: dict[int, Check] = {}
        commands: dict[int, Command] = {}
        fast = self._fast
        if fast is not None and len(todo) > STATE_EVERY:
            per_shard = Counter(h1 % self.spec.shards for _, _, _, h1, _ in todo)
            self._look(fast, {s for s, n in per_shard.items() if n > STATE_EVERY})
        blind: Counter[int] = Counter()  # fast checks planned per shard of unknown count
        for i, (_, _, _, h1, h2) in enumerate(todo):
            command = None
            if fast is not None:
                shard = h1 % self.spec.shards
                if not fast.blind(shard):
                    command = fast.pack(h1, h2)
                elif blind[shard] < STATE_EVERY:  # the rest: the script, which grows it
                    blind[shard] += 1
                    command = fast.pack(h1, h2)
            check = stack.plan(h1, h2) if command is None and stack is not None else None
            if check is not None:
                checks[i] = check
            else:
                commands[i] = command if command is not None else self._scripted(h1, h2)
        failure = self._scripts_and_fast(todo, commands, answers, checks)
        adds = [i for i, check in checks.items() if answers[i] is None and check.add]
        again = [i for i, check in checks.items() if answers[i] is None and not check.add]
        if adds:
            calls = [
                Call(command, key=checks[i].add_key, shard=checks[i].shard)
                for i in adds
                for command in (checks[i].add, checks[i].count)
                if command
            ]
            assert stack is not None
            results, failed = self._partial(calls)
            failure = failure or failed
            at, refused = 0, None
            for i in adds:
                check = checks[i]
                reply, ambiguous = results.replies[at], results.ambiguous[at]
                if check.count:
                    stack.counted(check, results.replies[at + 1])
                at += 1 + bool(check.count)
                if reply is None or isinstance(reply, BaseException):
                    check.add_undone()
                    if reply is not None:  # raised once every add's count is sorted
                        refused = refused or self.parts.refusal(reply, check.add_key, OPERATION)
                    continue
                try:
                    seen = self._added(check, reply, ambiguous)
                except FilterUnavailableError as exc:  # a foreign reply: answered as an outage
                    failure = failure or exc
                    continue
                if seen is None:
                    again.append(i)
                else:
                    answers[i] = seen
            if refused is not None:
                raise refused
        if again:  # the script answers where the reads could not
            scripted = {i: self._scripted(todo[i][3], todo[i][4]) for i in again}
            failure = self._scripts_and_fast(todo, scripted, answers, {}) or failure
        rest = [todo[i][2] for i, seen in enumerate(answers) if seen is None]
        if rest:
            assert failure is not None
            self._unavailable(failure, len(rest))  # raises, or answers "new" (False) for them
        outcome = Outcome([seen is True for seen in answers], errors=len(rest), failed=rest)
        outcome.added, outcome.seen = answers.count(False), answers.count(True)
        return outcome

    def _scripts_and_fast(
        self,
        todo: list[tuple[int, int, str | bytes, int, int]],
        commands: dict[int, Command],
        answers: list[bool | None],
        checks: dict[int, Check],
    ) -> _Failure:
        """Run ``checks``' reads and ``commands`` in one batch into ``answers``; return failure."""
        calls = [
            Call(payload, key=check.keys[0].name, shard=check.shard)
            for check in checks.values()
            for payload in check.reads
        ]
        first = len(calls)
        calls += [
            Call(c.payload, key=c.key, shard=c.shard, script=c.script, resend=c.resend)
            for c in commands.values()
        ]
        sent_at = time.time()
        results, failure = self._partial(calls)
        stack, at = self._stack, 0
        for i, check in list(checks.items()):
            replies = results.replies[at : at + len(check.reads)]
            at += len(check.reads)
            if any(reply is None for reply in replies):
                continue
            assert stack is not None
            judge = partial(stack.judge, check, sent_at=sent_at)
            try:
                names = [k.name for k in check.keys]
                answers[i] = self._read(names[0], replies, judge, names) == SEEN or None
            except FilterUnavailableError as exc:  # a foreign reply: answered as an outage
                failure = failure or exc
                del checks[i]  # neither added nor scripted
        refused = None
        for at, (i, command) in enumerate(commands.items(), first):
            reply = results.replies[at]
            if reply is None or isinstance(reply, BaseException):
                if not results.ambiguous[at]:
                    command.give_back()  # not run: its count goes with a later command
                if reply is not None:  # raised once every command's count is sorted
                    refused = refused or self.parts.refusal(reply, command.key, OPERATION)
                continue
            _, _, element, h1, h2 = todo[i]
            try:
                answers[i] = self._conclude(
                    command, reply, results.ambiguous[at], element, h1, h2, False
                )
            except FilterUnavailableError as exc:  # a foreign reply, or an outage in recovery
                failure = failure or exc
        if refused is not None:
            raise refused
        return failure

    def _partial(self, calls: list[Call]) -> tuple[Results, _Failure]:
        """Run a batch of check-and-add calls, keeping what Redis answered if it fails."""
        try:
            results = self.executor.run(BATCH_OPERATION, calls, write=True, partial=True)
        except AccessDeniedError as exc:
            return Results([None] * len(calls), [False] * len(calls)), exc
        return results, results.failure

    def _scripted(self, h1: int, h2: int) -> Command:
        """Pack an element's check-and-add script (its shard has grown, or forgets)."""
        record = self.record if self.record is not None else self._current()
        spec = record.spec
        shard = h1 % spec.shards
        if self._fast is not None or self._stack is not None:
            self._flush_counts(shard)  # the script counts from here: give it this worker's
        cached = self._heads.get(shard)
        if shard in self._recreate:  # once, not kept: a lost part to recreate
            cached = self._scripted_head(shard, True), self.parts.shard_key(shard)
        elif cached is None:
            key = self.parts.shard_key(shard)
            cached = self._heads[shard] = self._scripted_head(shard, True), key
        head, key = cached
        payload = head + seed_arguments(h1, h2, spec.shards, spec.shard_bits, spec.seed_range)
        return Command(shard, key, payload, script=self._script)

    def _conclude(
        self,
        command: Command,
        reply: Any,
        ambiguous: bool,
        element: str | bytes,
        h1: int,
        h2: int,
        recovered: bool,
    ) -> bool:
        """Read a check-and-add's reply: its answer, once a shard found wrong is recovered."""
        if isinstance(reply, BaseException):  # refused, not run: its count goes later
            if not ambiguous:  # (unless an attempt before, whose reply was lost, ran)
                command.give_back()
            raise self.parts.refusal(reply, command.key, "check and add a request")
        if command.fast is not None:
            # A lost reply's retry went without the count (``resend``): one field fewer.
            fields = 1 if ambiguous and command.resend is not None else command.fields
            if fields < command.fields:
                logger.debug(
                    "A check's reply was lost: its shard's count of %d went with it, counted"
                    " as sent (the count is short of them if it did not run).",
                    command.counted,
                )
            try:
                seen, generations = command.fast.read(command.shard, reply, fields)
            except ValueError as exc:
                raise foreign_reply("a check", command.key, exc) from None
            if seen is None:
                # Its bits went to a lost shard or a reset filter: recover, check again.
                if recovered:
                    self._again(command.key)
                # A bit another worker set meanwhile may be cleared too: a duplicate at worst.
                bits = command.bits or []
                self._take_back_bits(command.key, command.shard, reply, bits, fields)
                self._recover([command.shard])
                seen, ambiguous = self._check_and_add(element, h1, h2, recovered=True), True
            elif generations > self.generations:
                self._note(command.shard, 0, generations)
        elif reply.__class__ is int and reply in (0, 1):  # the script's common reply
            seen = reply == 1
        else:
            try:
                reply = scripts.script_reply(reply, 1)
            except ValueError as exc:
                raise foreign_reply("a check", command.key, exc) from None
            if reply[0] == scripts.MISMATCH:
                self._mismatch(command.shard, command.key, reply[1], recovered)
                return self._check_and_add(element, h1, h2, recovered=True)
            if reply[1] or reply[2] > self.generations:
                self._note(command.shard, reply[1], reply[2])
            if self._stack is not None:
                self._stack.scripted(command.shard, reply[2])
            seen = reply[3] == 1
        if seen and ambiguous:
            self.events.count("ambiguous")
            return False  # the bits may be this call's own, set by a lost attempt
        return seen

    def _take_back_bits(
        self, key: str, shard: int, reply: list[Any], sent: list[int], fields: int = 2
    ) -> None:
        """Clear the bits a ``BITFIELD`` set in a foreign key, while it holds the id found there."""
        found = reply[0].to_bytes(8, "big", signed=True)
        bits = [bit for bit, was in zip(sent, reply[fields:], strict=True) if not was]
        calls = []
        if bits:
            calls.append(script_call(scripts.TAKE_BACK, key, found, *bits, shard=shard))
        if not found.strip(b"\0") and key != self.parts.shard_key(shard):
            calls.append(script_call(scripts.DROP_STRAY, key, shard=shard))
        if calls:
            self.executor.run("take back bits set in a foreign shard", calls, write=True)
        self.events.count("taken_back", len(bits))
        self._log.log(
            logging.WARNING,
            "taken_back",
            "A check of the Bloom filter %r wrote to %r (shard %d) after it was lost or"
            " replaced: Redis lost data (an eviction, a restart from an older snapshot, a"
            " failover to a replica behind) or the filter was reset. The check's bits there"
            " were cleared and it is made again; URLs the part held may be fetched again.",
            self.key,
            key,
            shard,
        )

    def _flush_counts(self, only: int | None = None) -> None:
        """Send the counts of items the scriptless path found new (``only``: one shard's)."""
        keepers: list[Any] = [keeper for keeper in (self._fast, self._stack) if keeper]
        owed = [(keeper, flush) for keeper in keepers for flush in keeper.flushes(only)]
        if not owed:
            return
        # A count whose reply was lost is not sent again, nor given back: it may have run.
        calls = [
            Call(command, key=key, shard=shard, resend=b"") for _, (shard, key, command, _) in owed
        ]
        try:
            results = self.executor.run(
                "add to the shards' counts", calls, write=True, partial=True
            )
        except BloomFilterError:  # the checks themselves report an outage
            results = Results([None] * len(owed), [False] * len(owed))
        except BaseException:
            for keeper, (shard, _, _, items) in owed:
                keeper.give_back(shard, items)  # nothing counted is lost to a bug or an interrupt
            raise
        for (keeper, (shard, _, _, items)), reply, lost in zip(
            owed, results.replies, results.ambiguous, strict=True
        ):
            if lost:
                logger.debug(
                    "The reply to adding %d to a shard's count was lost: not sent again, as it"
                    " may have run (the count is short of them if not).",
                    items,
                )
            elif reply is None or isinstance(reply, BaseException):
                keeper.give_back(shard, items)  # kept for the next sync (a refusal, no memory)

    def _mismatch(self, shard: int, key: str, found: object, again: bool = False) -> None:
        """Sort out the part a script found wrong, before the check runs again.

        A generation or window still this filter's was out of the script's reach (a Cluster
        slot moving): wait for it. Missing under ``on_loss = "recreate"``: the next script
        recreates it. Else raise.
        """
        bad = found.decode() if isinstance(found, bytes) else str(found)
        if bad == key:
            if again:
                self._again(key)
            self._start_deadline()
            self._recover([shard])
            return
        deadline = self._start_deadline()
        there = self._shards.part_identity(bad)
        if there == self._identity(shard):
            self._await_part(shard, key, bad, deadline)
        elif not there.strip(b"\0") and self.faults.on_loss == "recreate":
            if shard in self._recreated:  # recreated in this call, and lost again
                self._again(bad)
            self._recreate.add(shard)
            self._recreated.add(shard)
        else:
            if not there.strip(b"\0"):  # lost: what may have evicted it is said with it
                self.lifecycle.loss_found(self._current().ttl > 0)
            raise self._shards.lost_part(self._current(), shard, bad, there)

    def _begin(self) -> None:
        """Start a call: no recovery deadline yet, no lost part it may recreate or pass over.

        (A part found lost is recreated, or passed over by reads, only once this call has
        looked at it by its own key: out of reach while a Cluster slot moves, it is waited
        for.)
        """
        self._deadline = 0.0
        self._recreate.clear()

    def _start_deadline(self) -> float:
        """Return when the call under way stops recovering: a retry timeout from its first."""
        if not self._deadline:
            self._deadline = time.monotonic() + self.faults.retry_timeout
            self._pause = 0.02
            self._recreated.clear()
        return self._deadline

    def _again(self, key: str) -> None:
        """Raise, or pause before ``key``'s next recovery (a full Redis may evict it at once)."""
        if self.faults.on_loss != "recreate":
            raise FilterDamagedError(
                f"{key!r} of the Bloom filter {self.key!r} still does not carry its id after"
                " recovery."
            )
        if time.monotonic() + self._pause > self._start_deadline():
            raise self._lost_again(key)
        time.sleep(self._pause)
        self._pause = min(2 * self._pause, 0.5)

    def _recover_again(self, shards: Iterable[int]) -> None:
        """Recover shards still wrong in a call that recovered them (see :meth:`_again`)."""
        wrong = sorted(shards)
        for shard in wrong:
            self._again(self.parts.shard_key(shard))
        self._recover(wrong)

    def _lost_again(self, key: str) -> FilterUnavailableError:
        """Return the error for a part recreated, and lost again, until the call's deadline."""
        where = self.topology.describe()
        try:
            call = Call(pack_command(b"INFO", b"memory"), key=key)
            policy = info_fields(self.parts.run("read INFO", [call])[0]).get("maxmemory_policy")
        except BloomFilterError:
            policy = None
        evicting = f"evicts it (maxmemory-policy {policy})" if policy else "evicts or deletes it"
        return FilterUnavailableError(
            f"{where} could not {OPERATION}: {key!r} of the Bloom filter {self.key!r} was lost"
            " again each time it was recreated (BLOOMFILTER_ON_LOSS = 'recreate') for"
            f" {self.faults.retry_timeout:g} s: Redis {evicting} as soon as it is made. Give"
            " Redis more memory (maxmemory), or use maxmemory-policy noeviction.",
            operation=OPERATION,
            server=where,
        )

    def _await_part(self, shard: int, key: str, part: str, deadline: float) -> None:
        """Wait (until ``deadline``) until a script routed by ``key`` sees ``part``."""
        cluster = isinstance(self.topology, Cluster)
        if cluster:
            self._report(
                "retries",
                logging.WARNING,
                "Part %r of shard %d of the Bloom filter %r is not yet where its shard key is"
                " (a Redis Cluster slot moving, the shard key first): that shard's checks wait"
                " for it.",
                part,
                shard,
                self.key,
            )
        identity = self._identity(shard)
        call = script_call(scripts.PART_IDENTITY, key, part, layout.IDENTITY_BYTES, shard=shard)
        delay = 0.02
        while (
            time.monotonic() > deadline
            or self.parts.run("wait for a moving Cluster slot", [call])[0] != identity
        ):
            now = time.monotonic()
            if now + delay > deadline:
                waited = now - deadline + self.faults.retry_timeout
                where = self.topology.describe()
                why = (
                    "a Redis Cluster slot migrating, or left half-migrated: see redis-cli"
                    " --cluster fix"
                    if cluster
                    else "lost again each time it was made meanwhile"
                )
                raise FilterUnavailableError(
                    f"{where} could not {OPERATION}: part {part!r} of shard {shard} stayed out"
                    f" of reach of the shard's key {key!r} for {waited:.1f} s, the"
                    f" call's retry timeout of {self.faults.retry_timeout:g} s ({why}).",
                    operation=OPERATION,
                    server=where,
                )
            time.sleep(delay)
            delay = min(2 * delay, 0.5)

    def _note(self, shard: int, flags: int, generations: int, later: bool = False) -> None:
        """Report what a check-and-add did beside answering: growth, a full shard, a loss.

        ``later``: a bulk call's, whose other replies may still be owed: what asks Redis
        waits for :meth:`_room_later` (a command sent meanwhile would drop them).
        """
        if generations > self.generations:
            self.generations = generations
            self.events.set("generations", generations)
        if not self._current().ttl:  # (a window starts with one generation)
            known = self._grown.get(shard, 0)
            # Fewer generations, or one this worker knew started again: the later ones were
            # lost (an add of this worker's wrote into one, and the script took it up).
            again = flags & scripts.GREW and not flags & scripts.RECREATED
            if generations < known or (again and generations <= known):
                self._report(
                    "rolled_back",
                    logging.WARNING,
                    "Shard %d of the Bloom filter %r had %d generations and now has %d: Redis"
                    " lost writes it had acknowledged (a restart from an older snapshot, a"
                    " failover to a replica behind). URLs the lost generations held may be"
                    " fetched again; see the persistence and replication of %s.",
                    shard,
                    self.key,
                    known,
                    generations - bool(again),
                    self.topology.describe(),
                )
            self._grown[shard] = generations
        if flags & scripts.GREW:
            growth = self._current().growth
            self._report(
                "grown",
                logging.INFO,
                "The Bloom filter %r grows: shard %d started generation %d of at most %d"
                " (it takes %s more items at a false-positive rate of %.2g).",
                self.key,
                shard,
                generations - 1,
                growth.last,
                f"{growth.generation(generations - 1).capacity:,}",
                growth.generation(generations - 1).error_rate,
            )
            if later:
                self._room_due.append((shard, generations - 1))
            else:
                self._room_to_grow(shard, generations - 1)
        if flags & scripts.FULL:
            self._report(
                "full",
                logging.WARNING,
                "Shard %d of the Bloom filter %r is past the capacity of its last generation"
                " (%d generations, %s items in all): it cannot grow further, and its"
                " false-positive rate now rises, so some new URLs will be taken for seen."
                " Create a larger filter (a higher BLOOMFILTER_CAPACITY) for this crawl.",
                shard,
                self.key,
                generations,
                f"{self._current().growth.grown_capacity:,}",
            )
        shifts = (("current", scripts.KEPT_SHIFT), ("previous", scripts.KEPT_SHIFT + 4))
        kept = [(which, flags >> shift & 15) for which, shift in shifts if flags >> shift & 15]
        for which, grown in kept:
            self.events.count("recreated")
            self._log.log(
                logging.WARNING,
                "recreated_kept",
                "Generation 0 of the %s re-crawl window of shard %d of the Bloom filter %r was"
                " lost, and recreated empty (BLOOMFILTER_ON_LOSS = 'recreate'): URLs it held may"
                " be fetched again. What the window grew after it was kept (%s): URLs there are"
                " still seen. It was evicted or deleted; see the maxmemory-policy of %s.",
                which,
                shard,
                self.key,
                "generation 1" if grown == 1 else f"generations 1 to {grown}",
                self.topology.describe(),
            )
        if kept:
            self.lifecycle.loss_found(True)
        elif flags & scripts.RECREATED:
            self._report(
                "recreated",
                logging.WARNING,
                "A lost generation or re-crawl window of shard %d of the Bloom filter %r was"
                " recreated empty (BLOOMFILTER_ON_LOSS = 'recreate'): URLs it held may be"
                " fetched again. It was evicted or deleted; see the maxmemory-policy of %s.",
                shard,
                self.key,
                self.topology.describe(),
            )
            self.lifecycle.loss_found(self._current().ttl > 0)

    def _room_to_grow(self, shard: int, started: int) -> None:
        """Warn, once per server and generation, when growing takes the server past maxmemory.

        A shard that starts generation ``started`` is followed by the others on its server
        (they fill alike), and later by the next generation: said while the crawl runs, before
        Redis refuses the writes of the crawl's queue or evicts keys. (``INFO`` refused or
        failed: not checked.)
        """
        route, key = self.topology.route, self.parts.shard_key(shard)
        address = route(key, shard, None).address
        if (address, started) in self._room_checked:
            return
        self._room_checked.add((address, started))
        record = self._current()
        there = sum(
            route(self.parts.shard_key(s), s, None).address == address
            for s in range(record.spec.shards)
        )
        growth = record.growth
        needs = []
        for g in range(started, min(started + 1, growth.last) + 1):  # it and the next
            each = allocation(
                layout.HEADER_BYTES + -(-growth.generation(g).bits // 8) + STRING_OVERHEAD
            )
            needs.append((g, (there - (g == started)) * each))  # (the shard's own is made)
        try:
            call = Call(pack_command(b"INFO", b"memory"), key=key)
            reply = self.executor.run("read INFO", [call], timeout=0).replies[0]  # no retries
            if isinstance(reply, BaseException):
                raise self.parts.refusal(reply, key, "read INFO")
            info = info_fields(reply)
        except BloomFilterError as exc:
            logger.debug("Could not read INFO memory of Redis at %s: %s", address, exc)
            return
        warning = short_of_room(self.key, address, info, needs)
        if warning:
            self._report("memory_short", logging.WARNING, "%s", warning)

    def _scripted_head(
        self, shard: int, write: bool, elements: int = 1, bulk: bool = False
    ) -> bytes:
        """Pack the start of a call of the hot path's (``bulk``: the bulk) script."""
        recreate = b"1" if shard in self._recreate else b"0"
        if write:  # it recreates the lost part: once; a read passes over it, for the call
            self._recreate.discard(shard)
        return command_head(
            7 + 4 * elements,
            b"EVALSHA",
            (self._bulk_script if bulk else self._script).sha,
            b"1",
            encode(self.parts.shard_key(shard)),
            self._identity(shard),
            b"w" if write else b"r",
            recreate,
        )

    def _scriptless(self) -> int:
        """Return the scriptless limit of a filter that grows but does not forget; else 0."""
        record = self._current()
        return record.growth.scriptless_limit if record.expansion and not record.ttl else 0

    def _identity(self, shard: int) -> bytes:
        found = self._identities.get(shard)
        if found is None:
            record = self._current()
            found = layout.identity(record.filter_id, shard, record.spec.hash_count)
            self._identities[shard] = found
        return found

    def _room_later(self) -> None:
        """Check the room to grow that a bulk call's growth left due (see :meth:`_note`)."""
        while self._room_due:
            self._room_to_grow(*self._room_due.pop(0))

    def _add_owed(self, elements: list[str | bytes]) -> Outcome:
        self._begin()
        try:
            return self._bulk.run(True, elements)
        finally:
            self._room_later()

    def _many(
        self, write: bool, elements: Iterable[str | bytes], outcome: Outcome | None = None
    ) -> Outcome:
        outcome = Outcome() if outcome is None else outcome
        try:
            self._current()
        except FilterUnavailableError as exc:
            items = list(elements)
            outcome.answers, outcome.failed = self._unavailable(exc, len(items)), items
            return outcome
        self._begin()
        try:
            self._bulk.run(write, elements, outcome)
        finally:
            self._room_later()
        self.events.count("ambiguous", outcome.ambiguous)
        if outcome.errors:
            self._unavailable(
                FilterUnavailableError(f"Redis could not take {outcome.errors:,} element(s)"),
                outcome.errors,
            )
        return outcome

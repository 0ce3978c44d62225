"""The native backend: :class:`NativeBloomFilter`, each shard a server-side Bloom filter.

A check is one atomic ``BF.INSERT ... NOCREATE`` on shard ``h1 mod shards`` (``BF.ADD``
would silently create a default filter in place of a lost one); bulk calls pipeline many.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from functools import partial
from typing import Any

import mmh3

from scrapy_redis_bloom.core.errors import (
    AccessDeniedError,
    BloomFilterError,
    FilterDamagedError,
    FilterUnavailableError,
    foreign_reply,
    taking_apart,
)
from scrapy_redis_bloom.core.record import Backend, FilterRecord
from scrapy_redis_bloom.core.settings import BloomConfig, FaultPolicy
from scrapy_redis_bloom.engine.base import FilterBase, Outcome, item_count
from scrapy_redis_bloom.engine.lifecycle import Lifecycle
from scrapy_redis_bloom.engine.native import parts as native_parts
from scrapy_redis_bloom.engine.native import ttl as native_ttl
from scrapy_redis_bloom.engine.native.parts import Blooms
from scrapy_redis_bloom.engine.parts import pairs
from scrapy_redis_bloom.engine.state import FilterState, FilterTotals
from scrapy_redis_bloom.transport.executor import Call, error_text
from scrapy_redis_bloom.transport.wire import Script, command_head, encode, pack_command

logger = logging.getLogger(__name__)

#: What a check-and-add does, in the executor's errors.
OPERATION = "check and add a request"

#: Items per ``BF.INSERT`` / ``BF.MEXISTS`` of the bulk path.
CHUNK = 1000
#: Commands per pipelined batch of the bulk path.
BATCH = 32
#: Share of a fixed-size filter's capacity past which a shard may soon refuse (said once).
NEAR_FULL = 0.9
#: Seconds between two reads of the re-crawl windows' sub-filters (at a counter sync).
WINDOW_LOOK = 10.0


class NativeBloomFilter(FilterBase):
    """:class:`.RedisBloomFilter`'s interface on ``BF.*``; of ``spec`` only its shard count."""

    backend: Backend = "native"

    def _setup(self) -> None:
        self._heads: list[tuple[str, bytes]] = []  # per shard: key, packed command start
        self.lifecycle = Lifecycle(Blooms(self.parts, self.topology), self.faults, self.events)
        self._script: Script | None = None
        self._near_full_said = ""  # the id of the filter whose nearing its limit was said
        self._window_said = (-1, 1)  # the window whose growth was said, and to how many
        self._window_look = 0.0  # when the windows' sub-filters may be read again

    @classmethod
    def of_record(
        cls, client: Any, key: str, record: FilterRecord, faults: FaultPolicy | None = None
    ) -> NativeBloomFilter:
        """Return the filter a stored record describes, adopted (for the CLI's reads)."""
        bloom = super().of_record(client, key, record, faults)
        bloom._adopt(record)
        return bloom

    def describe_geometry(self, config: BloomConfig, record: FilterRecord) -> str:
        """Say what ``BF.RESERVE`` gave the shards: RedisBloom's own bits and k.

        Not the bitmap geometry of ``config`` or the record, which the servers do not hold.
        Warns when the shards cannot keep the error rate asked (:func:`.native_parts.rate_bound`).
        """
        bound = native_parts.rate_bound(record)
        if bound is not None and not native_parts.reachable(record):
            logger.warning(
                "The native Bloom filter %r cannot keep its error rate of %.3g: each of its %d"
                " shard(s) takes %s items in its first sub-filter: too few bits for RedisBloom,"
                " whose probes meet in a small filter, at any rate (up to %.3g past its"
                " capacity). Give BLOOMFILTER_CAPACITY more, or BLOOMFILTER_SHARDS fewer (a"
                " filter's shards are fixed when it is created: reset it, or choose another"
                " BLOOMFILTER_KEY).",
                self.key,
                record.target_rate,
                record.spec.shards,
                f"{record.growth.native_capacity:,}",
                bound,
            )
        elif bound is not None:
            logger.warning(
                "The native Bloom filter %r passes its error rate of %.3g: its shards were"
                " reserved at error rate %.3g%s, and RedisBloom's probes meet in a small filter,"
                " so past its capacity it may answer up to %.3g. A filter created anew reserves"
                " them at a rate that keeps it: reset it, or choose another BLOOMFILTER_KEY.",
                self.key,
                record.target_rate,
                record.shard_rate,
                f" (by an earlier build: layout {record.layout})"
                if record.reserved_rate is None
                else "",
                bound,
            )
        return native_parts.describe(record)

    def existing(self) -> list[int]:
        """Return the shards whose key holds a Bloom filter (any other type raises)."""
        record = self._existing()
        gone = self.lifecycle.shards.missing(record, range(record.spec.shards))
        return [s for s in range(record.spec.shards) if s not in gone]

    def __repr__(self) -> str:
        return (
            f"<NativeBloomFilter key={self.key!r} shards={self.spec.shards}"
            f" capacity={self.capacity} servers={self.topology.servers}>"
        )

    @property
    def shard_keys(self) -> list[str]:
        """The keys of every shard, in shard order (no filter: FilterMissingError)."""
        self._existing()
        return [key for key, _ in self._heads]

    def _adopt(self, record: FilterRecord) -> None:
        old, self.record = self.record, record
        self._ttl = record.ttl
        self._script = native_ttl.CHECK if record.ttl else None
        anchor = partial(native_parts.shard_key, self.key, filter_id=record.filter_id)
        self._windows = native_ttl.Windows(record.ttl, anchor) if record.ttl else None
        if old is None or old.filter_id != record.filter_id:
            self._heads = [
                (key, self._command_head(record, key, True, 1))
                for key in map(anchor, range(record.spec.shards))
            ]
            self.counters.follow(record.expansion, record.ttl)
            if old is not None:
                self._cache.clear()

    def sync_counters(self) -> FilterTotals | None:
        """Sync the counts (see :class:`.FilterBase`); say growth, or a fixed filter's limit."""
        synced = self.counters.synced
        pending = self.counters.current().added - (synced.added if synced is not None else 0)
        totals = super().sync_counters()
        record = self.record
        if totals is None or record is None:
            return totals
        if record.ttl:  # the counts span windows: the current ones' sub-filters are read
            if record.expansion:
                self._window_grown(record)
            return totals
        if record.expansion:
            self._grown(record, max(0, totals.added - pending), totals.added)
        else:
            self._near_full(record, totals.added)
        return totals

    def _grown(self, record: FilterRecord, before: int, after: int) -> None:
        """Count and say the sub-filters started from ``before`` items to ``after`` (a sync's).

        RedisBloom grows a shard unseen (a ``BF.INFO`` per check would be a command more), so
        the counters tell it: :func:`started`. The workers' syncs add up (``HINCRBY``), so
        their shares of ``grown`` do too.
        """
        now = started(record, after)
        generations = 1 + sum(1 for shards in now if shards >= 0.5)
        if generations > self.generations:
            self.generations = generations
            self.events.set("generations", generations)
        grown = round(sum(now)) - round(sum(started(record, before)))
        if grown <= 0:
            return
        self.events.count("grown", grown)
        self._log.log(
            logging.INFO,
            "grown",
            "The native Bloom filter %r grows: about %d more sub-filter(s) started in its %d"
            " shard(s), up to %d per shard, as its %s items fill them (estimated from the"
            " counters: RedisBloom grows its filters unseen).",
            self.key,
            grown,
            record.spec.shards,
            generations,
            f"{after:,}",
        )

    def _window_grown(self, record: FilterRecord) -> None:
        """Say when a shard's current re-crawl window holds more sub-filters than said before.

        One ``BF.INFO`` per shard every :data:`WINDOW_LOOK` seconds at most (a window not
        started answers "not found": one).
        Each window starts small again, so what is said is per window.
        """
        if time.monotonic() < self._window_look:
            return
        self._window_look = time.monotonic() + WINDOW_LOOK
        try:
            window = self.parts.live_windows(record.ttl)[-1]
            calls = [
                Call(pack_command(b"BF.INFO", key), key=key, shard=shard)
                for shard, (anchor, _) in enumerate(self._heads)
                for key in [native_ttl.window_key(anchor, window)]
            ]
            replies = self.executor.run("read the re-crawl windows' sub-filters", calls).replies
            counts = []
            for call, reply in zip(calls, replies, strict=True):
                if native_parts.is_not_found(reply):  # not started yet
                    counts.append(1)
                    continue
                if isinstance(reply, BaseException):
                    raise self.parts.refusal(reply, call.key or "", "read a window's sub-filters")
                with taking_apart("read a window's sub-filters", call.key or ""):
                    counts.append(int(pairs(reply).get("Number of filters", "1")))
        except BloomFilterError as exc:  # said as a failed sync is: the next one reads again
            self._log.log(
                logging.WARNING,
                "sync",
                "Could not read whether the re-crawl windows of the native Bloom filter %r"
                " grow: %s",
                self.key,
                exc,
            )
            return
        most = max(counts, default=1)
        said = self._window_said if self._window_said[0] == window else (window, 1)
        self._window_said = (window, max(said[1], most))
        if most > self.generations:
            self.generations = most
            self.events.set("generations", most)
        if most <= said[1]:
            return
        self._log.log(
            logging.INFO,
            "grown",
            "The native Bloom filter %r grows: a re-crawl window holds up to %d sub-filters in"
            " a shard, as more than its BLOOMFILTER_CAPACITY of %s URLs a window (%d shards)"
            " come in (RedisBloom grows its filters unseen: read every 10 s at most).",
            self.key,
            most,
            f"{record.capacity:,}",
            record.spec.shards,
        )

    def _near_full(self, record: FilterRecord, items: int) -> None:
        """Say once when a fixed filter passes :data:`NEAR_FULL` of its capacity.

        Its shards (``NONSCALING``) refuse items past their size, which stops the crawl: with
        headroom, only past the capacity (but for a negligible chance); a shard reserved with
        its bare share (by releases before the headroom), a little before it.
        """
        if items < NEAR_FULL * record.capacity or self._near_full_said == record.filter_id:
            return
        self._near_full_said = record.filter_id
        self._report(
            "near_full",
            logging.WARNING,
            "The native Bloom filter %r holds about %s items, %.0f%% of its capacity of %s,"
            " and does not grow (BLOOMFILTER_EXPANSION = 0): once one of its %d shards holds"
            " %s items, Redis refuses new ones and the crawl stops with an error. Reset it"
            " with a larger BLOOMFILTER_CAPACITY, or create it growing (BLOOMFILTER_EXPANSION"
            " >= 2).",
            self.key,
            f"{items:,}",
            100 * items / record.capacity,
            f"{record.capacity:,}",
            record.spec.shards,
            f"{native_parts.reserve_arguments(record)[1]:,}",
        )

    def _command_head(self, record: FilterRecord, key: str, write: bool, items: int) -> bytes:
        """Pack ``BF.INSERT key NOCREATE ITEMS``, ``BF.MEXISTS key`` or the TTL script's call."""
        if record.ttl:
            rate, capacity, _ = native_parts.reserve_arguments(record)
            recreate = b"1" if self.faults.on_loss == "recreate" else b"0"
            mode = b"w" if write else b"r"
            args = (record.ttl, repr(rate), capacity, record.expansion, recreate, mode)
            sha = native_ttl.CHECK.sha
            return command_head(4 + len(args) + items, b"EVALSHA", sha, b"1", encode(key), *args)
        verb = (b"BF.INSERT", b"NOCREATE", b"ITEMS") if write else (b"BF.MEXISTS",)
        return command_head(len(verb) + 1 + items, verb[0], encode(key), *verb[1:])

    def estimate(self, items: int) -> FilterState:
        """Return the state ``items`` adds leave, by RedisBloom's sizing: no Redis call."""
        return native_parts.estimate(self.record or self.wanted, item_count(items))

    def state(self, shards: list[int] | None = None) -> FilterState:
        """Read each shard's (or live window's) items, sub-filters and memory (``BF.INFO``).

        No filter under the key raises FilterMissingError: a read creates none. A live
        window lost or replaced is listed in the state's ``damaged``.
        """
        with self._lock:
            record = self._existing()
            chosen = range(record.spec.shards) if shards is None else shards
            found = native_parts.read_state(self.parts, record, list(chosen))
            generations = len(found.generations)
            if generations > self.generations:
                self.generations = generations
                self.events.set("generations", generations)
            return found

    def _windows_state(self, record: FilterRecord) -> FilterState:
        """Read the live windows' ``BF.INFO`` (:meth:`state`): O(shards), no bit counted."""
        return self.state()

    def _check_and_add(
        self, element: str | bytes, h1: int, h2: int, recovered: bool = False
    ) -> bool:
        """One ``BF.INSERT ... NOCREATE``; with windows, reads then one, or the TTL script."""
        record = self.record if self.record is not None else self._current()
        shard = h1 % record.spec.shards
        key, head = self._heads[shard]
        item = encode(element)
        windows = self._windows
        if windows is not None and not recovered:
            answer = self._windowed(windows, item, shard, key)
            if answer is not None:
                return answer
        payload = head + b"$%d\r\n%b\r\n" % (len(item), item)
        reply, ambiguous = self.executor.fast(OPERATION, payload, key, shard, self._script)
        answers = self._read(reply, key, True, 1)
        if answers is None:
            if recovered:
                raise self._refused(None, key)
            self._recover([shard])
            return self._check_and_add(element, h1, h2, recovered=True)
        if windows is not None:
            windows.scripted(shard)
        seen = answers[0]
        if seen and ambiguous:  # maybe this call's own add, by an attempt whose reply was lost
            self.events.count("ambiguous")
        return seen and not ambiguous

    def _windowed(
        self, windows: native_ttl.Windows, item: bytes, shard: int, key: str
    ) -> bool | None:
        """Check an item in a shard's live windows without the script; None: the script must."""
        check = windows.plan(shard, item)
        if check is None:
            return None
        if check.reads:  # else the add alone answers (no window before)
            sent_at = time.time()
            replies = self.executor.fast_many(OPERATION, check.reads, key, shard).replies
            try:
                for reply in replies:
                    if isinstance(reply, BaseException):
                        raise self._refused(reply, key)
                verdict = windows.judge(check, replies, sent_at, item)
            except ValueError as exc:
                raise foreign_reply("a check", key, exc) from None
            if verdict != native_ttl.ADD:
                return verdict == native_ttl.SEEN or None
        reply, ambiguous = self.executor.fast(OPERATION, check.add, key, shard, None)
        last = reply[-1] if isinstance(reply, list) and reply else reply
        if native_parts.is_not_found(last):
            return None  # the window is not started yet: the script starts it
        if isinstance(last, BaseException):
            raise self._refused(last, key)
        if not isinstance(reply, list) or len(reply) != 1 or reply[0] not in (0, 1):
            shape = ValueError(f"one reply to one item, got {reply!r:.200}")
            raise foreign_reply("a check", key, shape)
        seen = reply[0] == 0  # BF.INSERT: 1 (or true) when added
        if seen and ambiguous:  # maybe this call's own add, by an attempt whose reply was lost
            self.events.count("ambiguous")
        return seen and not ambiguous

    def _read(self, reply: Any, key: str, write: bool, items: int) -> list[bool] | None:
        """Return per item whether a reply says "seen"; None: the shard is missing; else raise."""
        listed = isinstance(reply, list)
        error = reply[-1] if listed and reply else reply  # (RedisBloom stops at a refused item)
        if isinstance(error, BaseException):
            if native_parts.is_not_found(error):
                return None
            raise self._refused(error, key)
        code = reply[0] if self._ttl and listed and reply else 0
        if code == native_ttl.ANCHOR_LOST and len(reply) == 1:
            return None
        if (
            (code == native_ttl.FOREIGN and len(reply) == 1)
            or (code == native_ttl.WINDOW_LOST and len(reply) == 2)
            or (code == native_ttl.WRONG_WINDOW and len(reply) == 3)
        ) and all(isinstance(part, bytes) for part in reply[1:]):
            raise self._window_refused(code, reply, key)
        answers = reply[1:] if self._ttl and listed else reply
        if (
            not listed
            or code not in (0, native_ttl.RECREATED)
            or len(answers) != items
            or answers.count(0) + answers.count(1) != len(answers)  # (at C speed)
        ):
            shape = ValueError(f"a reply to {items} item(s), got {reply!r:.200}")
            raise foreign_reply("a check", key, shape)
        if code == native_ttl.RECREATED:
            self._report(
                "recreated",
                logging.WARNING,
                "A lost re-crawl window of the native Bloom filter %r (shard key %r) was"
                " passed over (BLOOMFILTER_ON_LOSS = 'recreate'): URLs it held may be"
                " fetched again. See the maxmemory-policy of %s.",
                self.key,
                key,
                self.topology.describe(),
            )
            self.lifecycle.loss_found(True)
        if self._ttl or not write:
            return [answer == 1 for answer in answers]
        return [answer == 0 for answer in answers]  # BF.INSERT: 1 (or true) when added

    def _window_refused(self, code: int, reply: Any, key: str) -> FilterDamagedError:
        if code == native_ttl.WINDOW_LOST:
            self.lifecycle.loss_found(True)
            window = reply[1].decode()
            return FilterDamagedError(
                f"Re-crawl window {window!r} of the native Bloom filter {self.key!r} is gone"
                f" from {self.topology.describe()} before its time: it was evicted (see"
                " maxmemory-policy) or deleted. The URLs it held would be taken for new, so the"
                " crawl stops here. Set BLOOMFILTER_ON_LOSS = 'recreate' to go on without it"
                " (URLs it held may be fetched again), or reset the filter."
            )
        if code == native_ttl.WRONG_WINDOW:
            window, kind = (part.decode(errors="replace") for part in reply[1:])
            return FilterDamagedError(
                f"Where the native Bloom filter {self.key!r} keeps a shard's re-crawl window"
                f" {window!r}, Redis holds a {kind}. It is never overwritten: remove that key,"
                " or choose another BLOOMFILTER_KEY."
            )
        return FilterDamagedError(
            f"Where the native Bloom filter {self.key!r} keeps the anchor of a shard ({key!r}),"
            " Redis holds a string that is not one. It is never overwritten: remove that key,"
            " or choose another BLOOMFILTER_KEY."
        )

    def _refused(
        self, error: BaseException | None, key: str, operation: str = OPERATION
    ) -> BloomFilterError:
        if error is None:
            return FilterDamagedError(
                f"Shard {key!r} of the native Bloom filter {self.key!r} is still missing after"
                " recovery."
            )
        if "full" in error_text(error):
            self.events.count("full")
            if self.record is not None and self.record.expansion:  # not made by this filter
                return FilterDamagedError(
                    f"Shard {key!r} of the native Bloom filter {self.key!r} is full: it does"
                    " not grow, though the filter's record says BLOOMFILTER_EXPANSION ="
                    f" {self.record.expansion}, so another program replaced it (BF.RESERVE"
                    " ... NONSCALING). Remove that key and reset the filter, or choose"
                    " another BLOOMFILTER_KEY."
                )
            return BloomFilterError(
                f"Shard {key!r} of the native Bloom filter {self.key!r} is full: it was created"
                " not to grow (BLOOMFILTER_EXPANSION = 0) and holds its capacity, so Redis"
                " refuses new items. Reset it with a larger BLOOMFILTER_CAPACITY, or create it"
                " growing (BLOOMFILTER_EXPANSION >= 2)."
            )
        return self.parts.refusal(error, key, operation)

    def _many(
        self, write: bool, elements: Iterable[str | bytes], outcome: Outcome | None = None
    ) -> Outcome:
        """Check (and add) elements: per shard, chunks of :data:`CHUNK` items per command."""
        items = list(elements)
        outcome = Outcome() if outcome is None else outcome
        outcome.answers = [False] * len(items)
        try:
            record = self._current()
        except FilterUnavailableError as exc:
            self._give_up(exc, items, outcome)
            return outcome
        shards = record.spec.shards
        hash64 = mmh3.hash64
        # Keywords: mmh3 ignores a positional ``signed`` (elements would move shards).
        places = [hash64(item, seed=0, x64arch=True, signed=False)[0] % shards for item in items]
        groups: list[list[int]] = [[] for _ in range(shards)]
        appenders = [group.append for group in groups]
        for i, shard in enumerate(places):
            appenders[shard](i)
        chunks = [
            (shard, indexes[start : start + CHUNK])
            for shard, indexes in enumerate(groups)
            for start in range(0, len(indexes), CHUNK)
        ]
        for start in range(0, len(chunks), BATCH):
            self._bulk_batch(write, items, chunks[start : start + BATCH], outcome)
        self.events.count("ambiguous", outcome.ambiguous)
        return outcome

    def _bulk_batch(
        self,
        write: bool,
        items: list[str | bytes],
        chunks: list[tuple[int, list[int]]],
        outcome: Outcome,
        recovered: bool = False,
    ) -> None:
        """Run one pipelined batch of bulk commands; recover lost shards and run theirs again."""
        record = self._current()
        calls = [
            Call(
                self._command_head(record, key, write, len(part))
                + pack_items([items[i] for i in part]),
                key=key,
                shard=shard,
                script=self._script,
            )
            for shard, part in chunks
            for key in [self._heads[shard][0]]
        ]
        # BF.MEXISTS answers "absent" for a missing shard, or a key of another type: a TYPE
        # after it tells (anything but a Bloom filter goes to recovery, which says which).
        if not (write or record.ttl):
            calls += [
                Call(pack_command(b"TYPE", key), key=key, shard=shard)
                for shard, _ in chunks
                for key in [self._heads[shard][0]]
            ]
        operation = "add requests in bulk" if write else "check requests in bulk"
        try:
            results = self.executor.run(operation, calls, write=write)
        except (FilterUnavailableError, AccessDeniedError) as exc:
            self._give_up(exc, [items[i] for _, part in chunks for i in part], outcome)
            return
        redo: list[tuple[int, list[int]]] = []
        n = len(chunks)
        kinds = (
            results.replies[n:] or [native_ttl.BLOOM_TYPE] * n
        )  # (writes and windows: none sent)
        for (shard, part), call, reply, ambiguous, kind in zip(
            chunks, calls[:n], results.replies[:n], results.ambiguous[:n], kinds, strict=True
        ):
            key = call.key or ""
            if isinstance(kind, BaseException):  # TYPE refused (an ACL): no blind answers
                raise self._refused(kind, key, operation)
            try:
                found = (
                    self._read(reply, key, write, len(part))
                    if kind == native_ttl.BLOOM_TYPE
                    else None
                )
            except FilterUnavailableError as exc:  # a foreign reply: those items are in doubt
                self._give_up(exc, [items[i] for i in part], outcome)
                continue
            if found is None:
                if recovered:
                    raise self._refused(None, key)
                redo.append((shard, part))
                continue
            if write and ambiguous:  # "already there" may be this command's own lost attempt
                outcome.ambiguous += found.count(True)
                outcome.added += len(found)  # (answered "new")
            else:
                for i, seen in zip(part, found, strict=True):
                    outcome.answers[i] = seen
                if write:  # counted as answered: a later chunk that raises keeps these
                    present = found.count(True)
                    outcome.added += len(found) - present
                    outcome.seen += present
        if redo:
            self._recover(sorted({shard for shard, _ in redo}))
            self._bulk_batch(write, items, redo, outcome, recovered=True)

    def _give_up(
        self,
        exc: FilterUnavailableError | AccessDeniedError,
        items: list[str | bytes],
        outcome: Outcome,
    ) -> None:
        """Apply BLOOMFILTER_ON_ERROR to items Redis could not answer; count them failed."""
        self._unavailable(exc, len(items))
        outcome.errors += len(items)
        outcome.failed += items


def started(record: FilterRecord, items: int) -> list[float]:
    """Return how many shards are expected to have started sub-filter 1, 2, ... at ``items``.

    A shard starts sub-filter ``g`` at its item past the first ``g`` ones' capacities, and
    holds Binomial(items, 1/shards) items: a normal tail (exact for one shard).
    """
    shards = record.spec.shards
    mean = items / shards
    sigma = math.sqrt(mean * (1 - 1 / shards))
    out: list[float] = []
    held = 0
    for link in native_parts.links(record, 64):
        held += link.capacity
        if sigma:
            chance = 0.5 * math.erfc((held + 0.5 - mean) / (sigma * math.sqrt(2)))
        else:
            chance = 1.0 if mean > held else 0.0
        if chance < 1e-9:
            break
        out.append(shards * chance)
    return out


def pack_items(items: list[str | bytes]) -> bytes:
    """Pack items as RESP bulk strings: at C speed for ASCII text of one length (fingerprints)."""
    texts = [item for item in items if isinstance(item, str)]
    size = len(texts[0]) if texts else 0
    if (
        len(texts) == len(items)
        and all(len(text) == size for text in texts)
        and "".join(texts).isascii()
    ):
        head = f"${size}\r\n"
        return (head + f"\r\n{head}".join(texts) + "\r\n").encode()
    return b"".join([b"$%d\r\n%b\r\n" % (len(data), data) for data in map(encode, items)])

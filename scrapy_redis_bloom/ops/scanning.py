"""Cursor scans (``SCAN``, ``SSCAN``) through the executor, held to one server process.

A cursor does not outlive its server process (it would skip members after a failover), so
each scan call goes with ``INFO server``, and another ``run_id`` starts the scan over from 0
(what the stale cursor read is dropped: the scan from 0 reads it again).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from scrapy_redis_bloom.core.errors import BloomFilterError, taking_apart
from scrapy_redis_bloom.engine.health import info_fields
from scrapy_redis_bloom.engine.parts import Parts, text
from scrapy_redis_bloom.transport.executor import Call
from scrapy_redis_bloom.transport.wire import pack_command

logger = logging.getLogger(__name__)

_INFO = pack_command(b"INFO", b"server")


class ScannedKeyGoneError(BloomFilterError):
    """The key a scan reads (``SSCAN``) is gone part-way: evicted, expired or deleted."""


@dataclass(eq=False)
class Scan:
    """A scan by the filter's executor (its retries, its routing), on one server process.

    ``command``/``options``: the arguments before/after the cursor; ``what`` names what is
    scanned in the warning; ``process``: the ``run_id`` a saved cursor came from.
    """

    parts: Parts
    command: tuple[bytes | str, ...]
    what: str
    options: tuple[bytes | str, ...] = ()
    key: str | None = None
    server: int | None = None
    process: str = ""
    restarts: int = field(default=0, init=False)

    def next(self, cursor: int, count: int) -> tuple[int | None, list[bytes]]:
        """Scan on from ``cursor``: the cursor to go on from (None: done) and the items read.

        After a restart or failover: cursor 0 and no items (those of the stale cursor would
        be read twice).
        """
        operation = f"scan with {text(self.command[0])}"
        scan = pack_command(*self.command, cursor, *self.options, b"COUNT", count)
        calls = [Call(_INFO, key=self.key, server=self.server)]
        if self.key is not None:  # a missing key scans as empty: told apart by EXISTS
            calls.append(Call(pack_command(b"EXISTS", self.key), key=self.key))
        calls.append(Call(scan, key=self.key, server=self.server))
        info, *there, reply = self.parts.run(operation, calls)
        if there and there[0] == 0 and cursor != 0:
            raise ScannedKeyGoneError(f"{self.what} is gone (evicted, expired or deleted)")
        with taking_apart(operation, self.key or ""):
            answered = info_fields(info)["run_id"]
            following, items = reply
            following = int(following)
            if not isinstance(items, list):
                raise ValueError(f"a scan's items, got {items!r:.200}")
        found = [item if isinstance(item, bytes) else str(item).encode() for item in items]
        restarted = cursor != 0 and answered != self.process
        self.process = answered
        if restarted:
            self.restarts += 1
            where = self.parts.executor.topology.route(self.key, None, self.server).address
            logger.warning(
                "Redis at %s restarted or failed over during the scan of %s: a cursor does not"
                " outlive its server process, so the scan starts over.",
                where,
                self.what,
            )
            return 0, []
        return following or None, found

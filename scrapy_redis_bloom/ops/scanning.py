"""Cursor scans (``SCAN``, ``SSCAN``) through the executor, held to one server process.

A scan's cursor is a place in one server process's hash table, whose hash seed that process
drew at its start: after a restart or a failover the same cursor goes on elsewhere and skips
members (a fifth of a 60,000-member SET in ``tests/test_cli.py``). So each scan call goes in
one trip with ``INFO server``, whose ``run_id`` names the process that answered, and a cursor
from another process is not followed: the scan starts over from 0. What it returned before
stands (a scan may return an item twice anyway).
"""

from __future__ import annotations

from typing import Any

from scrapy_redis_bloom.core.errors import taking_apart
from scrapy_redis_bloom.engine.parts import Parts, text
from scrapy_redis_bloom.transport.executor import Call
from scrapy_redis_bloom.transport.wire import pack_command

_INFO = pack_command(b"INFO", b"server")


def run_id(info: Any) -> str:
    """Return the ``run_id`` of an ``INFO server`` reply: which process of the server answered."""
    for line in text(info).splitlines():
        name, _, value = line.partition(":")
        if name == "run_id" and value.strip():
            return value.strip()
    raise ValueError(f"an INFO server reply with a run_id, got {text(info)[:100]!r}")


class Scan:
    """A scan by the filter's executor (its retries, its routing), on one server process.

    ``command``: the command and its arguments before the cursor (``SSCAN key``; ``SCAN``);
    ``options``: those after it (``MATCH pattern``); ``key`` or ``server`` route it.
    ``process``: the ``run_id`` a saved cursor came from ("" for none).
    """

    def __init__(
        self,
        parts: Parts,
        command: tuple[bytes | str, ...],
        options: tuple[bytes | str, ...] = (),
        key: str | None = None,
        server: int | None = None,
        process: str = "",
    ) -> None:
        self.parts = parts
        self.command, self.options = command, options
        self.key, self.server = key, server
        self.process = process

    def next(self, cursor: int, count: int) -> tuple[int | None, list[bytes]]:
        """Scan on from ``cursor``: the next cursor (0: done) and the items read.

        None for the cursor: another process answered than the one ``cursor`` came from (a
        restart, a failover); its items are real all the same, and the scan starts over.
        """
        operation = f"scan with {text(self.command[0])}"
        scan = pack_command(*self.command, cursor, *self.options, b"COUNT", count)
        calls = [Call(_INFO, key=self.key, server=self.server)]
        calls.append(Call(scan, key=self.key, server=self.server))
        info, reply = self.parts.run(operation, calls)
        with taking_apart(operation, self.key or ""):
            answered = run_id(info)
            following, items = reply
            following = int(following)
            if not isinstance(items, list):
                raise ValueError(f"a scan's items, got {items!r:.200}")
        moved_on = cursor != 0 and answered != self.process
        self.process = answered
        found = [item if isinstance(item, bytes) else str(item).encode() for item in items]
        return (None if moved_on else following), found

"""Redis command time: what a contender's commands cost the shared Redis server.

A worker's own rate is bound by its round trip, so per-call client rates are alike;
what differs is the server's work per call, and one Redis core serves every worker.
Redis times each command it runs (``INFO commandstats``: calls and usec per command
name). A command run inside a script is timed twice there, once on its own and
once within the script's EVALSHA (likewise a command inside MULTI/EXEC), so summing
commandstats would count it twice. The slow log, with a threshold of 0, records every
command with the same duration (both come from one measurement in Redis's ``call()``)
and the client that sent it; a command a script ran is logged for the script's fake
client (address ``?:0``). A transaction's commands are logged one by one (EXEC is
not logged). :class:`CommandClock` therefore sums the slow log's durations of the
commands clients sent, leaving out those scripts ran, and keeps ``INFO commandstats``
beside it as the breakdown by command.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

logger = logging.getLogger("bench.cmdtime")

#: The slow log's address for commands a script ran (Redis's Lua client).
SCRIPT_CLIENT = "?:0"
#: Entries the slow log keeps at most while a measure runs.
SLOWLOG_MAX_LEN = 1_000_000


@dataclass(frozen=True)
class Command:
    """One top-level command as the slow log recorded it."""

    name: str
    key: str | None
    usec: int
    client: str


@dataclass
class CommandTime:
    """Top-level commands run during a measurement, and what they cost Redis."""

    commands: list[Command]
    #: ``INFO commandstats`` of the same span: {command: {"calls", "usec"}}, nested included.
    commandstats: dict[str, dict[str, int]] = field(default_factory=dict)
    #: The slow log was full, so it dropped its oldest entries: the sums miss commands.
    overflowed: bool = False

    def select(self, keep: Callable[[Command], bool]) -> list[Command]:
        """Return the commands ``keep`` accepts."""
        return [c for c in self.commands if keep(c)]

    @staticmethod
    def usec(commands: Iterable[Command]) -> int:
        """Total Redis time of some commands, in microseconds."""
        return sum(c.usec for c in commands)

    @staticmethod
    def by_name(commands: Iterable[Command]) -> dict[str, int]:
        """How many of each command."""
        return dict(Counter(c.name for c in commands))

    @staticmethod
    def usec_by_name(commands: Iterable[Command]) -> dict[str, int]:
        """Redis time of each command, in microseconds, most costly first."""
        spent: Counter[str] = Counter()
        for c in commands:
            spent[c.name] += c.usec
        return dict(spent.most_common())


class CommandClock:
    """Reset Redis's command timing, then read what ran since, top-level commands only.

    ``client`` is the benchmark's own connection: its commands (SLOWLOG, INFO, ...)
    are left out by its address.
    """

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.me = str(client.client_info().get("addr", ""))
        self._saved: dict[str, str] = {}

    def __enter__(self) -> CommandClock:
        saved = self.client.config_get("slowlog-*")
        self._saved = {k: str(v) for k, v in saved.items() if k in _SLOWLOG_SETTINGS}
        self.client.config_set("slowlog-max-len", SLOWLOG_MAX_LEN)
        self.client.config_set("slowlog-log-slower-than", 0)
        self.reset()
        return self

    def __exit__(self, *exc: object) -> None:
        for name, value in self._saved.items():
            self.client.config_set(name, value)
        self.client.slowlog_reset()

    def reset(self) -> None:
        """Start a new span: CONFIG RESETSTAT and SLOWLOG RESET."""
        self.client.config_resetstat()
        self.client.slowlog_reset()

    def read(self) -> CommandTime:
        """Return the top-level commands run since :meth:`reset`, oldest first."""
        stats = self.client.info("commandstats")
        entries = self.client.execute_command("SLOWLOG", "GET", -1)
        commands = _top_level(entries, self.me)
        commandstats = {
            name.removeprefix("cmdstat_"): {"calls": int(v["calls"]), "usec": int(v["usec"])}
            for name, v in stats.items()
        }
        overflowed = len(entries) >= SLOWLOG_MAX_LEN
        if overflowed:
            logger.warning(
                "The slow log filled up (%d entries): Redis time is undercounted", len(entries)
            )
        return CommandTime(commands, commandstats, overflowed)


_SLOWLOG_SETTINGS = ("slowlog-max-len", "slowlog-log-slower-than")


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _top_level(entries: list[Any], me: str) -> list[Command]:
    """Top-level commands from raw ``SLOWLOG GET`` entries (newest first).

    Entry: [id, unix time, usec, argv, client addr, client name]. Those of the
    scripts' client and of the benchmark's own connection are left out.
    """
    commands: list[Command] = []
    for entry in reversed(entries):
        usec, argv, addr = int(entry[2]), [_text(a) for a in entry[3]], _text(entry[4])
        if addr in (SCRIPT_CLIENT, me) or not argv:
            continue
        name = argv[0].lower()
        commands.append(Command(name, _key_of(name, argv), usec, addr))
    return commands


def _key_of(name: str, argv: list[str]) -> str | None:
    """Return the first key a command names (EVALSHA's first key argument), or None."""
    if name in ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"):
        return argv[3] if len(argv) > 3 and argv[2] not in ("0", "") else None
    if name in _KEYLESS or len(argv) < 2:
        return None
    return argv[1]


_KEYLESS = frozenset(
    {"ping", "hello", "client", "info", "script", "config", "select", "auth", "time", "multi"}
    | {"command", "function", "module", "flushall", "flushdb", "echo", "readonly"}
)


def per_call(usec: int, calls: int) -> float:
    """Microseconds per call (NaN without calls)."""
    return usec / calls if calls else float("nan")


__all__ = ["Command", "CommandClock", "CommandTime", "per_call"]

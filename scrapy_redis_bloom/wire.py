"""Commands packed by hand and sent on a held connection: the hot path and the bulk path.

redis-py's generic ``execute_command`` spends 30-40 µs of Python per call on a
2-vCPU VM (pool checkout and its socket check, generic argument packing, the retry
wrapper, response callbacks): a third of a loopback round trip, as much as the
Redis work itself. Its pipelines pack every argument the same generic way, which
for the bulk path's BITFIELD commands (four arguments per bit) costs more than
Redis spends running them. The filter sends few kinds of commands, so this module
packs them from templates and sends them on a connection of the client's own pool,
held by the filter.

Behaviour is redis-py's where it matters: the same connection class (TCP, TLS,
Unix socket; RESP2 or 3; hiredis when installed), its health checks, its error
types. Only standalone clients are driven this way; a cluster client (which routes
and follows MOVED/ASK itself), another thread or a forked child goes through the
client as usual.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

#: Errors after which a held connection is dropped: it may be dead or out of step.
CONNECTION_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)


def bulk_string(value: bytes) -> bytes:
    """Pack one argument as a RESP bulk string."""
    return b"$%d\r\n%b\r\n" % (len(value), value)


def command_head(count: int, *args: bytes) -> bytes:
    """Pack the start of a command of ``count`` arguments: its first ``args``."""
    return b"*%d\r\n" % count + b"".join(bulk_string(arg) for arg in args)


def pack_command(*args: bytes) -> bytes:
    """Pack a whole command."""
    return command_head(len(args), *args)


class HeldConnection:
    """A connection of a standalone client's pool, held by the thread that took it.

    ``usable`` tells whether the caller may use it (a standalone client, and the
    same process and thread as the holder, or no holder yet).
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self._pool = getattr(client, "connection_pool", None)
        self.encode = client.get_encoder().encode if self._pool is not None else None
        self._connection: Any = None
        self._owner: tuple[int, int] | None = None
        #: Counts connections given up: replies owed on one of those never come.
        self.generation = 0

    @property
    def usable(self) -> bool:
        """Tell whether this thread may send on the held connection."""
        return self._pool is not None and self._owner in (None, _here())

    def get(self) -> Any:
        """Return the held connection, taking one from the pool on first use."""
        if self._connection is None:
            pool = self._pool
            assert pool is not None
            try:
                connection = pool.get_connection()
            except TypeError:  # redis-py < 5.3 requires a command name
                connection = pool.get_connection("EVALSHA")
            self._connection, self._owner = connection, _here()
        return self._connection

    def send(self, payload: bytes) -> int:
        """Send packed commands; return the connection's generation, for :meth:`receive`.

        On a lost connection or a timeout the connection is dropped and the error
        raised.
        """
        connection = self.get()
        try:
            connection.send_packed_command([payload])
        except BaseException:  # lost, timed out, or interrupted mid-send
            self.drop()
            raise
        return self.generation

    def receive(self, replies: int) -> list[Any]:
        """Read that many replies; an error reply comes back as its exception.

        Every reply is read, error or not, so the stream stays in step. On a lost
        connection or a timeout the connection is dropped and the error raised.
        """
        connection = self.get()
        out: list[Any] = []
        try:
            for _ in range(replies):
                try:
                    out.append(connection.read_response())
                except ResponseError as exc:
                    out.append(exc)
        except BaseException:  # lost, timed out, or interrupted between send and read
            self.drop()
            raise
        return out

    def exchange(self, payload: bytes, replies: int) -> list[Any]:
        """Send packed commands and return their replies (see :meth:`receive`)."""
        self.send(payload)
        return self.receive(replies)

    def close(self) -> None:
        """Give the held connection back to the client's pool."""
        connection, self._connection, self._owner = self._connection, None, None
        if connection is not None and self._pool is not None:
            self.generation += 1
            self._pool.release(connection)

    def drop(self) -> None:
        """Disconnect the held connection (its stream may be out of step), then release it."""
        if self._connection is not None:
            self._connection.disconnect()
        self.close()


class ScriptCaller:
    """Call one Lua script as ``EVALSHA sha 1 key x y`` and return its integer reply."""

    def __init__(self, held: HeldConnection, source: str, sha: str) -> None:
        self.held = held
        self.client = held.client
        self.source = source
        self.sha = sha
        self._head = command_head(6, b"EVALSHA", sha.encode(), b"1")
        self._keys: dict[str, bytes] = {}

    def __call__(self, key: str, x: int, y: int) -> int:
        """Run the script on ``key`` with arguments ``x`` and ``y``."""
        held = self.held
        if not held.usable:
            return self._through_client(key, x, y)
        packed = self._keys.get(key)
        if packed is None:
            assert held.encode is not None
            packed = self._keys[key] = self._head + bulk_string(held.encode(key))
        sx, sy = b"%d" % x, b"%d" % y
        command = packed + b"$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(sx), sx, len(sy), sy)
        try:
            (reply,) = held.exchange(command, 1)
            if isinstance(reply, NoScriptError):  # a restart or SCRIPT FLUSH
                self.client.script_load(self.source)
                (reply,) = held.exchange(command, 1)
        except CONNECTION_ERRORS:
            # Dropped already; let the client retry by its own policy. (As with any
            # retry, a call that ran but lost its reply then reads "seen".)
            return self._through_client(key, x, y)
        if isinstance(reply, Exception):
            raise reply
        return int(reply)

    def _through_client(self, key: str, x: int, y: int) -> int:
        try:
            return int(self.client.evalsha(self.sha, 1, key, x, y))
        except NoScriptError:
            self.client.script_load(self.source)
            return int(self.client.evalsha(self.sha, 1, key, x, y))


class BitfieldPacker:
    """Pack ``BITFIELD key SET u1 <offset> 1 ...`` (or ``GET u1 <offset>``) commands."""

    def __init__(self, write: bool) -> None:
        self._arguments_per_bit = 4 if write else 3
        op = b"$3\r\nSET\r\n$2\r\nu1\r\n" if write else b"$3\r\nGET\r\n$2\r\nu1\r\n"
        # Per decimal length of the offset: the op's bytes up to the offset itself.
        self._heads = [(op + b"$%d\r\n" % n).decode() for n in range(21)]
        self._tail = "\r\n$1\r\n1\r\n" if write else "\r\n"

    def pack(self, key: bytes, offsets: Sequence[int]) -> bytes:
        """Return one BITFIELD command over ``offsets`` of the string ``key``."""
        heads, tail = self._heads, self._tail
        parts = [
            command_head(2 + self._arguments_per_bit * len(offsets), b"BITFIELD", key).decode(
                "latin-1"
            )
        ]
        append = parts.append
        for offset in offsets:
            text = str(offset)
            append(heads[len(text)])
            append(text)
            append(tail)
        return "".join(parts).encode("latin-1")


def _here() -> tuple[int, int]:
    return os.getpid(), threading.get_ident()

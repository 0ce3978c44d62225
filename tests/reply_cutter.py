"""A TCP proxy to a real redis-server that cuts a connection once a chosen reply is in.

The fault it makes is the one a client cannot tell apart from success or failure: the
server ran the command (its reply came back), but the client never reads the reply,
its connection closed right before it. A SIGKILL timed between a transaction's
``EXEC`` and its reply (the AOF, with ``appendfsync always``, holding the commit) is
that fault by chance; :class:`ReplyCutter` makes it on purpose, at one exact command.

It reads both directions as RESP (2 or 3, as the client asked): the client's
commands in order, and the server's replies, each matched to its command. While
:attr:`ReplyCutter.armed`, each reply that ``cut`` picks is held back
and both sides of that connection are closed instead; everything before it on the
connection was forwarded. Later connections go through as usual, so the client's
retry reaches the server. Each cut is recorded in :attr:`ReplyCutter.cuts` (the
command's name), so a test can assert that the fault it meant really happened.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections import deque
from collections.abc import Callable
from types import TracebackType

logger = logging.getLogger("tests.reply_cutter")

#: A command as the client sent it: its arguments, the name (upper-cased) first.
Command = list[bytes]


class _IncompleteError(Exception):
    """The buffer ends before the value does: read more."""


def _line(buffer: bytes | bytearray, at: int) -> tuple[bytes, int]:
    end = buffer.find(b"\r\n", at)
    if end < 0:
        raise _IncompleteError
    return bytes(buffer[at:end]), end + 2


def parse(buffer: bytes | bytearray, at: int = 0) -> tuple[object, int]:
    """Parse one RESP2 or RESP3 value at ``at``; return it and where it ends.

    Bulk strings come back as bytes, aggregates as lists (a map's keys and values in
    turn), any other reply as the bytes of its line: the proxy needs only the
    commands' arguments and the replies' ends. Raises :class:`_IncompleteError` when the
    buffer ends first.
    """
    if at >= len(buffer):
        raise _IncompleteError
    kind, (head, at) = bytes(buffer[at : at + 1]), _line(buffer, at + 1)
    if kind in _LINES:
        return head, at
    if kind in _BLOBS:
        size = int(head)
        if size < 0:
            return None, at
        if len(buffer) < at + size + 2:
            raise _IncompleteError
        return bytes(buffer[at : at + size]), at + size + 2
    if kind in _AGGREGATES:
        count = int(head)
        if count < 0:
            return None, at
        items = []
        for _ in range(count * _AGGREGATES[kind]):
            item, at = parse(buffer, at)
            items.append(item)
        if kind == b"|":  # attributes come before the reply they describe
            return parse(buffer, at)
        return items, at
    raise ValueError(f"not RESP: {bytes(buffer[at - 1 : at + 20])!r}")


#: RESP types by how they end: their line; a length and that many bytes; a count of
#: values (per item: a map's and an attribute's items are pairs).
_LINES = (b"+", b"-", b":", b"_", b",", b"#", b"(")
_BLOBS = (b"$", b"!", b"=")
_AGGREGATES = {b"*": 1, b"~": 1, b">": 1, b"%": 2, b"|": 2}


class _Pair:
    """One client connection and its own to the server, with the commands owed a reply."""

    def __init__(self, cutter: ReplyCutter, client: socket.socket, server: socket.socket) -> None:
        self.cutter, self.client, self.server = cutter, client, server
        self.owed: deque[Command] = deque()
        self.lock = threading.Lock()
        self.closed = False

    def start(self) -> None:
        for target in (self._commands, self._replies):
            threading.Thread(target=target, daemon=True).start()

    def close(self) -> None:
        with self.lock:
            self.closed = True
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _commands(self) -> None:
        """Forward the client's bytes as they come; note each whole command, in order."""
        buffer = bytearray()
        try:
            while data := self.client.recv(1 << 16):
                buffer += data
                at = 0
                # Noted before the bytes go on: its reply cannot come first.
                with self.lock, contextlib.suppress(_IncompleteError):
                    while True:
                        command, at = parse(buffer, at)
                        assert isinstance(command, list)
                        command[0] = bytes(command[0]).upper()
                        self.owed.append(command)
                del buffer[:at]
                self.server.sendall(data)
        except OSError:
            pass
        self.close()

    def _replies(self) -> None:
        """Forward the server's replies whole, one by one; cut before a chosen one."""
        buffer = bytearray()
        try:
            while data := self.server.recv(1 << 16):
                buffer += data
                at = 0
                with contextlib.suppress(_IncompleteError):
                    while True:
                        _, end = parse(buffer, at)
                        with self.lock:
                            if not self.owed:
                                raise OSError("a reply to no command")
                            command = self.owed.popleft()
                        reply = bytes(buffer[at:end])
                        if self.cutter.picks(command, reply):
                            if self.cutter.replace is None:
                                logger.info("Cut before the reply to %s", command[0].decode())
                                self.close()
                                return
                            logger.info("Replaced the reply to %s", command[0].decode())
                            reply = self.cutter.replace
                        self.client.sendall(reply)
                        at = end
                del buffer[:at]
        except OSError:
            pass
        self.close()


class ReplyCutter:
    """A proxy on 127.0.0.1 to ``port``: cut a connection before the replies ``cut`` picks.

    ``cut(command, reply)`` is asked about each command whose reply (its RESP bytes)
    came in while :attr:`armed`; True closes that connection (both sides) instead of
    passing the reply on. ``times`` bounds the cuts (then it passes everything on). With
    ``replace`` (RESP bytes), a picked reply is replaced by it instead, and the connection
    goes on: a reply that is not its command's. Use as a context manager; :attr:`port` is
    where clients connect.
    """

    def __init__(
        self,
        port: int,
        cut: Callable[[Command, bytes], bool],
        times: int = 1,
        replace: bytes | None = None,
    ) -> None:
        self.upstream = port
        self.cut = cut
        self.times = times
        self.replace = replace
        self.armed = False
        #: The names of the commands whose replies were cut (or replaced), in order.
        self.cuts: list[str] = []
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> ReplyCutter:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def picks(self, command: Command, reply: bytes) -> bool:
        """Whether ``reply``, to ``command``, is cut (and count it)."""
        with self._lock:
            if not self.armed or len(self.cuts) >= self.times or not self.cut(command, reply):
                return False
            self.cuts.append(command[0].decode())
            return True

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = _Pair(self, client, server)
            with self._lock:
                self._pairs.append(pair)
            pair.start()

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._listener.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()

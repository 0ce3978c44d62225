"""A Sentinel-managed primary for the tests: a primary, its replicas and three sentinels.

Every process is the same ``redis-server`` binary (:func:`redis_server.find_redis_server`),
the sentinels started as ``redis-server <conf> --sentinel``, all bound to 127.0.0.1 on
free ports. Three sentinels with a quorum of 2, as in production: one sentinel alone
could neither agree that a primary is down nor be outvoted when it is wrong. The
primary is declared down after ``down_after_ms`` (1000 ms here, 30 s by default in
Redis), so a failover takes a few seconds; every wait is bounded.

Faults: :meth:`SentinelGroup.failover` (``SENTINEL FAILOVER``: the replica is promoted
while the primary is healthy) and :meth:`SentinelGroup.kill_primary` (SIGKILL; the
sentinels find it down and promote the replica). :meth:`wait_for_failover` waits until
every sentinel names a new primary that says it is one.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis
from redis_server import RedisServer, _tail, find_redis_server, free_port, no_retry
from running import Running, terminate

SERVICE = "mymaster"


class SentinelProcess:
    """One ``redis-server --sentinel`` on 127.0.0.1, monitoring ``primary_port``."""

    def __init__(
        self,
        primary_port: int,
        quorum: int,
        down_after_ms: int,
        binary: str,
        service: str = SERVICE,
        auth_pass: str | None = None,
    ) -> None:
        self.binary = binary
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="srb-sentinel-")
        self.conf = Path(self.dir) / "sentinel.conf"
        self.conf.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            "daemonize no\n"
            f"dir {self.dir}\n"
            f"logfile {self.dir}/sentinel.log\n"
            f"sentinel monitor {service} 127.0.0.1 {primary_port} {quorum}\n"
            f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
            f"sentinel failover-timeout {service} 10000\n"
            f"sentinel parallel-syncs {service} 1\n"
            + (f"sentinel auth-pass {service} {auth_pass}\n" if auth_pass else "")
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            socket_timeout=5,
            socket_connect_timeout=2,
            retry=no_retry(),
            decode_responses=True,
        )

    def log_tail(self, lines: int = 10) -> str:
        return _tail(Path(self.dir) / "sentinel.log", lines)

    def start(self, timeout: float = 10.0) -> None:
        """Start the sentinel and wait (bounded) until it answers PING."""
        self.process = subprocess.Popen(
            [self.binary, str(self.conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        with contextlib.closing(self.client()) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"sentinel on port {self.port} exited: {self.log_tail()}")
                with contextlib.suppress(redis.RedisError):
                    if client.ping():
                        return
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"sentinel on port {self.port} did not answer PING")

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after 10 s) and delete its directory."""
        terminate(self.process)
        self.process = None
        shutil.rmtree(self.dir, ignore_errors=True)


class SentinelGroup(Running):
    """A primary, ``replicas`` replicas (``replicaof``) and ``sentinels`` sentinels (quorum 2).

    ``servers`` are the two data servers (:class:`RedisServer`); which one is the primary
    changes with a failover: ask :meth:`primary`. ``server_args`` go to both (e.g.
    ``"--min-replicas-to-write", "1"``). With ``password`` the servers require it (and
    use it to replicate) and the sentinels know it; the sentinels themselves need none.
    """

    def __init__(
        self,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 1000,
        server_args: tuple[str, ...] = (),
        binary: str | None = None,
        password: str | None = None,
        replicas: int = 1,
    ) -> None:
        self.binary = binary or find_redis_server()
        self.password = password
        self.replicas = replicas
        self.down_after_ms = down_after_ms
        self.quorum = quorum
        self.sentinel_count = sentinels
        self.server_args = server_args
        self.servers: list[RedisServer] = []
        self.sentinels: list[SentinelProcess] = []

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> SentinelGroup:
        """Start everything; return once the sentinels know the replica and each other."""
        try:
            # With a password, each server also uses it to reach its primary (masterauth).
            auth = ("--masterauth", self.password) if self.password else ()
            args = (*self.server_args, *auth)
            primary = RedisServer(*args, binary=self.binary, password=self.password).start()
            self.servers.append(primary)
            for _ in range(self.replicas):
                replica = RedisServer(
                    *args,
                    "--replicaof", "127.0.0.1", str(primary.port),
                    binary=self.binary,
                    password=self.password,
                ).start()  # fmt: skip
                self.servers.append(replica)
            self._wait(
                lambda: all(
                    s.info("replication").get("master_link_status") == "up"
                    for s in self.servers[1:]
                ),
                timeout,
                "the replicas to sync",
            )
            for _ in range(self.sentinel_count):
                sentinel = SentinelProcess(
                    primary.port,
                    self.quorum,
                    self.down_after_ms,
                    self.binary,
                    auth_pass=self.password,
                )
                self.sentinels.append(sentinel)
                sentinel.start()
            self._wait(self._settled, timeout, "the sentinels to find the replica and each other")
        except BaseException:
            self.stop()
            raise
        return self

    def _settled(self) -> bool:
        for sentinel in self.sentinels:
            with contextlib.closing(sentinel.client()) as client:
                # sentinel_masters(): redis-py 7.0.0's sentinel_master() cannot parse.
                state = client.sentinel_masters()[SERVICE]
            if (
                int(state["num-slaves"]) < self.replicas
                or int(state["num-other-sentinels"]) < self.sentinel_count - 1
            ):
                return False
        return True

    def stop(self) -> None:
        """Stop every sentinel and server (those still running) and delete their files."""
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.stop()

    # -- inspection -----------------------------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        """The sentinels as ``host:port`` strings (what the settings take)."""
        return [sentinel.address for sentinel in self.sentinels]

    def named_primary(self) -> set[int]:
        """Return the primary's port as each answering sentinel names it."""
        ports = set()
        for sentinel in self.sentinels:
            with (
                contextlib.suppress(redis.RedisError),
                contextlib.closing(sentinel.client()) as client,
            ):
                # Sent raw: redis-py 7.0's sentinel_get_master_addr_by_name() cannot parse.
                address = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
                if address:
                    ports.add(int(address[1]))
        return ports

    def primary(self) -> RedisServer:
        """Return the server every sentinel names as the primary."""
        ports = self.named_primary()
        if len(ports) != 1:
            raise RuntimeError(f"the sentinels disagree on the primary: {ports}")
        return next(s for s in self.servers if s.port == next(iter(ports)))

    # -- faults ---------------------------------------------------------------------------

    def failover(self, pause_ms: int = 4000) -> RedisServer:
        """Switch the primary over as planned; return the old primary.

        As an operator does it: ``CLIENT PAUSE pause_ms WRITE`` on the primary, wait
        until every replica has all it wrote, then ``SENTINEL FAILOVER``. Without the
        pause, a write the primary acknowledged an instant before the promotion may not
        have reached the replica yet, and is lost with the old primary's data (Redis
        replication is asynchronous). Writes held by the pause meet, once it ends, a
        primary whose replica left (``NOREPLICAS`` under ``min-replicas-to-write``):
        nothing ran, and they are retried on the new primary.
        """
        old = self.primary()
        with contextlib.closing(old.client()) as client:
            client.execute_command("CLIENT", "PAUSE", pause_ms, "WRITE")
            offset = int(client.info("replication")["master_repl_offset"])
        replicas = [s for s in self.servers if s is not old]

        def caught_up() -> bool:
            return all(
                int(r.info("replication").get("slave_repl_offset", -1)) >= offset for r in replicas
            )

        self._wait(caught_up, pause_ms / 2000, "the replicas to catch up")
        with contextlib.closing(self.sentinels[0].client()) as client:
            client.execute_command("SENTINEL", "FAILOVER", SERVICE)
        return old

    def kill_primary(self) -> RedisServer:
        """SIGKILL the primary (no save, no goodbye); return it."""
        old = self.primary()
        old.kill()
        return old

    def wait_for_failover(self, old: RedisServer, timeout: float = 30.0) -> RedisServer:
        """Wait until every sentinel names another primary, and it says it is one."""

        def done() -> bool:
            ports = self.named_primary()
            if len(ports) != 1 or old.port in ports:
                return False
            new = next(s for s in self.servers if s.port in ports)
            return bool(new.info("replication")["role"] == "master")

        self._wait(done, timeout, "the failover")
        return self.primary()

    def wait_for_replica(self, timeout: float = 30.0) -> RedisServer:
        """Wait until the primary has a replica in sync (it takes writes again); return it.

        The primary is looked up on every poll: a busy machine has seen the sentinels fail
        over a second time meanwhile.
        """

        def synced() -> bool:
            info = self.primary().info("replication")
            return any(
                isinstance(value, dict) and value.get("state") == "online"
                for name, value in info.items()
                if name.startswith("slave")
            )

        self._wait(synced, timeout, "a replica of the new primary")
        return self.primary()

    def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if ready():
                    return
            time.sleep(0.1)
        logs = "\n".join(
            [s.log_tail() for s in self.sentinels]
            + [f"server {s.port}:\n{s.log_tail(15)}" for s in self.servers]
        )
        raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}:\n{logs}")

"""A throwaway Redis Cluster for the tests: N masters on free loopback ports, maybe replicas.

Each node is a :class:`redis_server.RedisServer` started with ``--cluster-enabled yes``.
The cluster is formed through redis-py alone (no ``redis-cli``): every node gets a
distinct config epoch, each master an even share of the 16384 slots (``CLUSTER ADDSLOTS``),
every other node sends ``CLUSTER MEET`` to the first one, each replica (if any) sends
``CLUSTER REPLICATE`` to its master, then the start waits (bounded) until every node reports
``cluster_state:ok`` and the same, complete ``CLUSTER SLOTS`` map, and every replica's
link to its master is up.

Helpers let a test break the cluster on purpose: move a slot between masters (``MOVED``
and ``ASK`` redirections), ``SCRIPT FLUSH`` one node (``NOSCRIPT``), stop and restart a
master (``cluster_state:fail`` after the node timeout, then recovery), SIGKILL a master and
wait for one of its replicas to take over (failover), freeze a node (``DEBUG SLEEP``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis_server import PauseThread, RedisServer
from running import Running

HOST = "127.0.0.1"
#: The cluster bus listens on the client port + 10000, so client ports stay below this.
MAX_PORT = 65535 - 10000
#: Keys moved per ``MIGRATE`` while a slot changes hands.
MIGRATE_BATCH = 100

Address = tuple[str, int]
#: A node by its index in :attr:`RedisClusterNodes.nodes` or by its ``(host, port)``.
NodeRef = int | Address
#: One ``CLUSTER SLOTS`` range: first slot, last slot, owner's address.
SlotRange = tuple[int, int, Address]


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def free_cluster_port(taken: Iterable[int] = ()) -> int:
    """Return a port P below 55535 such that P and its bus port P + 10000 are both free."""
    avoid = set(taken)
    for _ in range(500):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        if port >= MAX_PORT or port in avoid or port + 10000 in avoid:
            continue
        if _port_is_free(port + 10000):
            return port
    raise RuntimeError("no free port pair (P, P + 10000) on 127.0.0.1")


def _text(value: Any) -> Any:
    """Decode the bytes in a raw RESP reply, recursively."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list | tuple):
        return [_text(item) for item in value]
    return value


def _log_tail(server: RedisServer, lines: int = 15) -> str:
    try:
        text = (Path(server.dir) / "redis.log").read_text(errors="replace")
    except OSError:
        return "    (no log)"
    return os.linesep.join("    " + line for line in text.splitlines()[-lines:])


class RedisClusterNodes(Running):
    """A Redis Cluster of ``n`` masters on 127.0.0.1, as a context manager.

    Each master gets ``replicas`` replicas (default none). Nodes ``0 .. n-1`` start as the
    masters; node ``n + k * n + m`` starts as the ``k``-th replica of master ``m``. Roles
    change after a failover: :meth:`masters` and :meth:`replicas_of` tell the current ones.

    ``node_timeout_ms`` is ``cluster-node-timeout``: how long a stopped master takes to be
    marked failed (and the cluster to turn ``cluster_state:fail``, or a replica to take
    over); keep it small (1000-2000) for failover tests. ``startup_timeout`` bounds the wait
    for the cluster to converge, in seconds. ``extra_args`` go to every ``redis-server``,
    replicas included. The binary is the one :func:`redis_server.find_redis_server` picks.
    """

    def __init__(
        self,
        n: int = 3,
        *,
        replicas: int = 0,
        node_timeout_ms: int = 5000,
        startup_timeout: float = 30.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        if not 1 <= n <= 100:
            raise ValueError(f"n must be between 1 and 100, not {n}")
        if not 0 <= replicas <= 5:
            raise ValueError(f"replicas must be between 0 and 5, not {replicas}")
        self.n = n
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.startup_timeout = startup_timeout
        self.extra_args = tuple(extra_args)
        self.dir = ""
        self.ports: list[int] = []
        self.node_ids: list[str] = []
        self.servers: list[RedisServer | None] = []
        #: Nodes taken down by :meth:`kill_node`, kept for :meth:`restart_node`.
        self._killed: dict[int, RedisServer] = {}
        #: What a node served when it went down: its slot ranges and its replicas.
        self._lost: dict[int, tuple[list[tuple[int, int]], list[int]]] = {}
        self._admins: dict[int, redis.Redis] = {}
        #: Seconds the last :meth:`start` took, for the curious.
        self.startup_seconds = 0.0

    # -- addresses ------------------------------------------------------------------------

    @property
    def nodes(self) -> list[Address]:
        """Every node's ``(host, port)``, in start order (stopped nodes included)."""
        return [(HOST, port) for port in self.ports]

    @property
    def startup_url(self) -> str:
        """The first node's URL, enough for a cluster client to discover the rest."""
        return f"redis://{HOST}:{self.ports[0]}"

    @property
    def size(self) -> int:
        """The number of nodes: masters plus replicas."""
        return self.n * (1 + self.replicas)

    def initial_master(self, i: int) -> int:
        """Return the index of the master that node ``i`` started under (itself if one)."""
        return i if i < self.n else (i - self.n) % self.n

    @property
    def live(self) -> list[int]:
        """Indexes of the nodes whose process is running."""
        return [i for i, server in enumerate(self.servers) if server is not None]

    def index(self, node: NodeRef) -> int:
        """Return the index of a node given by index or by ``(host, port)``."""
        if isinstance(node, int):
            if not 0 <= node < len(self.ports):
                raise IndexError(f"no node {node} in a cluster of {len(self.ports)}")
            return node
        host, port = node
        if host not in (HOST, "localhost") or port not in self.ports:
            raise ValueError(f"{host}:{port} is not a node of this cluster")
        return self.ports.index(port)

    # -- clients --------------------------------------------------------------------------

    def client(self, **kwargs: Any) -> RedisCluster:
        """Return a new redis-py cluster client started from the first live node."""
        first = self.live[0] if self.live else 0
        return RedisCluster(host=HOST, port=self.ports[first], **kwargs)

    def node_client(self, node: NodeRef, **kwargs: Any) -> redis.Redis:
        """Return a new plain client of one node (the caller closes it)."""
        return redis.Redis(host=HOST, port=self.ports[self.index(node)], **kwargs)

    def _admin(self, i: int) -> redis.Redis:
        """Return the cached raw (bytes) client of node ``i`` used by the helpers."""
        if i not in self._admins:
            self._admins[i] = redis.Redis(
                host=HOST, port=self.ports[i], socket_timeout=10, socket_connect_timeout=2
            )
        return self._admins[i]

    def _drop_admin(self, i: int) -> None:
        client = self._admins.pop(i, None)
        if client is not None:
            client.close()

    def execute(self, node: NodeRef, *args: Any) -> Any:
        """Run one command on one node; return its reply with bytes decoded.

        redis-py's response callback still applies where it has one for the command name
        (``execute(0, "INFO")`` is a dict, ``execute(0, "CLUSTER", "INFO")`` a string).
        """
        return _text(self._admin(self.index(node)).execute_command(*args))

    # -- lifecycle ------------------------------------------------------------------------

    def _node_args(self, port: int) -> tuple[str, ...]:
        # Redis 7 syncs replicas over the socket after a 5 s wait for more of them: no wait.
        sync = ("--repl-diskless-sync-delay", "0") if self.replicas else ()
        return (
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(Path(self.dir) / f"nodes-{port}.conf"),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--cluster-announce-ip", HOST,
            *sync,
            *self.extra_args,
        )  # fmt: skip

    def _start_server(self, port: int) -> RedisServer:
        server = RedisServer(*self._node_args(port), port=port)
        try:
            return server.start()
        except RuntimeError:
            server.stop()  # start() leaves the temp dir behind when redis-server exits
            raise

    def start(self) -> RedisClusterNodes:
        """Start the nodes and form the cluster; a port race is retried twice."""
        began = time.monotonic()
        for attempt in range(3):
            self.dir = tempfile.mkdtemp(prefix="srb-cluster-")
            try:
                self._start_nodes()
                break
            except RuntimeError:
                self.stop()
                if attempt == 2:
                    raise
        try:
            self._form_cluster()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _start_nodes(self) -> None:
        taken: set[int] = set()
        self.ports = []
        for _ in range(self.size):
            port = free_cluster_port(taken)
            taken.update((port, port + 10000))
            self.ports.append(port)
        self.servers = []
        for port in self.ports:
            self.servers.append(self._start_server(port))

    def _form_cluster(self) -> None:
        self.node_ids = [self.execute(i, "CLUSTER", "MYID") for i in range(self.size)]
        for i in range(self.size):
            # Distinct epochs up front, as redis-cli does: no collision to resolve later.
            self.execute(i, "CLUSTER", "SET-CONFIG-EPOCH", i + 1)
            if i < self.n:
                first, last = self.expected_range(i)
                self.execute(i, "CLUSTER", "ADDSLOTS", *range(first, last + 1))
        for i in range(1, self.size):
            self.execute(i, "CLUSTER", "MEET", HOST, self.ports[0])
        if self.replicas:
            self._attach_replicas()
        expected = [(*self.expected_range(i), (HOST, self.ports[i])) for i in range(self.n)]
        self._wait(
            lambda: self._problems(expected, "ok") + self._layout_problems(),
            self.startup_timeout,
            "cluster_state:ok with consistent CLUSTER SLOTS",
        )

    def _attach_replicas(self) -> None:
        """``CLUSTER REPLICATE`` each replica to its master, once it knows that master."""
        pending = set(range(self.n, self.size))

        def replicate() -> list[str]:
            problems = []
            for i in sorted(pending):
                master = self.node_ids[self.initial_master(i)]
                try:
                    # "Unknown node" until the MEET gossip has reached this node.
                    self.execute(i, "CLUSTER", "REPLICATE", master)
                except redis.ResponseError as error:
                    problems.append(f"node {i}: CLUSTER REPLICATE {master}: {error}")
                else:
                    pending.discard(i)
            return problems

        self._wait(replicate, self.startup_timeout, "every replica attached to its master")

    def _layout_problems(self) -> list[str]:
        """Return the replicas that do not (yet) replicate from their initial master."""
        problems = []
        for i in range(self.n, self.size):
            info = self.execute(i, "INFO", "replication")
            master_port = self.ports[self.initial_master(i)]
            if info.get("role") != "slave" or info.get("master_port") != master_port:
                problems.append(f"node {i}: not yet a replica of port {master_port}")
        return problems

    def expected_range(self, i: int) -> tuple[int, int]:
        """Return the first and last slot that node ``i`` gets at start."""
        first = i * REDIS_CLUSTER_HASH_SLOTS // self.n
        return first, (i + 1) * REDIS_CLUSTER_HASH_SLOTS // self.n - 1

    def stop(self) -> None:
        """Stop every node and delete the temporary directories. Idempotent."""
        for i in list(self._admins):
            self._drop_admin(i)
        for server in [*self.servers, *self._killed.values()]:
            if server is not None:
                server.stop()
        self.servers = []
        self._killed = {}
        self._lost = {}
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""

    # -- state ----------------------------------------------------------------------------

    def cluster_info(self, node: NodeRef) -> dict[str, str]:
        """Return one node's ``CLUSTER INFO`` as a dict of strings."""
        text = self.execute(node, "CLUSTER", "INFO")
        pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
        return {key: value.strip() for key, value in pairs}

    def slot_map(self, node: NodeRef | None = None) -> list[SlotRange]:
        """Return one node's (default: the first live) ``CLUSTER SLOTS``, sorted."""
        i = self.live[0] if node is None else self.index(node)
        ranges = self.execute(i, "CLUSTER", "SLOTS")
        return sorted((int(r[0]), int(r[1]), (str(r[2][0]), int(r[2][1]))) for r in ranges)

    def role(self, node: NodeRef) -> str:
        """Return a live node's own view of its role: ``master`` or ``slave``."""
        return str(self.execute(node, "INFO", "replication")["role"])

    def masters(self) -> list[Address]:
        """Return the live nodes that serve slots now (per ``CLUSTER SLOTS``), by index."""
        serving = {address for _, _, address in self.slot_map()}
        return [self.nodes[i] for i in self.live if self.nodes[i] in serving]

    def replicas_of(self, master: NodeRef) -> list[Address]:
        """Return the live nodes that replicate from ``master`` now, by index.

        A replica counts once its own ``INFO replication`` names the master, even while its
        link is still syncing.
        """
        port = self.ports[self.index(master)]
        found = []
        for i in self.live:
            info = self.execute(i, "INFO", "replication")
            if info.get("role") == "slave" and info.get("master_port") == port:
                found.append(self.nodes[i])
        return found

    def open_migrations(self) -> list[tuple[int, int, str, int]]:
        """Return the slots some live node has MIGRATING or IMPORTING.

        Each entry is ``(node index, slot, "migrating" or "importing", other node index)``,
        read from the ``myself`` line of each node's ``CLUSTER NODES``.
        """
        found = []
        for i in self.live:
            lines = self.execute(i, "CLUSTER", "NODES").splitlines()
            mine = next(line for line in lines if "myself" in line.split()[2])
            for field in mine.split()[8:]:
                if not field.startswith("["):
                    continue
                slot, arrow, other = field.strip("[]").partition("->-")
                direction = "migrating"
                if not arrow:
                    slot, _, other = field.strip("[]").partition("-<-")
                    direction = "importing"
                found.append((i, int(slot), direction, self.node_ids.index(other)))
        return found

    def _problems(self, expected: list[SlotRange] | None, state: str) -> list[str]:
        """Return why the live nodes do not (yet) agree on a healthy cluster."""
        problems: list[str] = []
        maps = []
        for i in self.live:
            info = self.cluster_info(i)
            if info.get("cluster_state") != state:
                problems.append(f"node {i}: cluster_state:{info.get('cluster_state')}")
            if info.get("cluster_known_nodes") != str(self.size):
                problems.append(f"node {i}: knows {info.get('cluster_known_nodes')} nodes")
            maps.append(self.slot_map(i))
        if state == "ok":
            for i, ranges in zip(self.live, maps, strict=True):
                covered = sum(last - first + 1 for first, last, _ in ranges)
                if covered != REDIS_CLUSTER_HASH_SLOTS or any(
                    addr not in self.nodes for _, _, addr in ranges
                ):
                    problems.append(f"node {i}: CLUSTER SLOTS incomplete: {ranges}")
                elif expected is not None and ranges != expected:
                    problems.append(f"node {i}: CLUSTER SLOTS {ranges} != {expected}")
                elif ranges != maps[0]:
                    problems.append(f"node {i}: CLUSTER SLOTS differs from node {self.live[0]}")
            problems.extend(
                f"node {i}: slot {slot} {direction} (node {other})"
                for i, slot, direction, other in self.open_migrations()
            )
            if self.replicas:
                problems.extend(self._replication_problems())
        return problems

    def _roles_seen_by(self, i: int) -> dict[str, str]:
        """Return node id -> master id (``-`` for a master) per node ``i``'s CLUSTER NODES."""
        seen = {}
        for line in self.execute(i, "CLUSTER", "NODES").splitlines():
            node_id, _, _, master_id, *_ = line.split()
            seen[node_id] = master_id
        return seen

    def _replication_problems(self) -> list[str]:
        """Return replicas whose link is down, and disagreements on who replicates whom."""
        problems = []
        views = {i: self._roles_seen_by(i) for i in self.live}
        for i in self.live:
            info = self.execute(i, "INFO", "replication")
            if info.get("role") == "slave" and info.get("master_link_status") != "up":
                problems.append(f"node {i}: master_link_status:{info.get('master_link_status')}")
            if views[i] != views[self.live[0]]:
                problems.append(f"node {i}: CLUSTER NODES roles differ from node {self.live[0]}")
        return problems

    def _wait(self, problems: Callable[[], list[str]], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        found = ["not checked"]
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                found = problems()
                if not found:
                    return
            time.sleep(0.05)
        servers = {i: s for i, s in enumerate(self.servers) if s is not None} | self._killed
        logs = "\n".join(
            f"  node {i} (port {self.ports[i]}{', killed' if i in self._killed else ''})"
            f" log:\n{_log_tail(servers[i])}"
            for i in sorted(servers)
        )
        raise RuntimeError(
            f"Redis Cluster did not reach {what} within {timeout:g} s:\n  "
            + "\n  ".join(found)
            + f"\n{logs}"
        )

    def wait_until_consistent(
        self, expected: list[SlotRange] | None = None, timeout: float | None = None
    ) -> None:
        """Wait until every live node is ``ok``, knows all nodes and agrees on all slots.

        A slot left MIGRATING or IMPORTING also counts as inconsistent.
        """
        self._wait(
            lambda: self._problems(expected, "ok"),
            self.startup_timeout if timeout is None else timeout,
            "cluster_state:ok with consistent CLUSTER SLOTS",
        )

    def wait_for_state(self, state: str, timeout: float | None = None) -> None:
        """Wait until every live node reports ``cluster_state:<state>`` (``ok``/``fail``)."""
        if timeout is None:
            timeout = self.node_timeout_ms / 1000 * 4 + 10
        self._wait(
            lambda: [
                f"node {i}: cluster_state:{self.cluster_info(i).get('cluster_state')}"
                for i in self.live
                if self.cluster_info(i).get("cluster_state") != state
            ],
            timeout,
            f"cluster_state:{state}",
        )

    # -- keys -----------------------------------------------------------------------------

    def flushall(self) -> None:
        """Empty every live master (the replicas follow)."""
        for i in self.live:
            if not self.replicas or self.role(i) == "master":
                self._admin(i).flushall()

    def keyslot(self, key: str | bytes) -> int:
        """Return the key's hash slot, as ``CLUSTER KEYSLOT`` on a live node says."""
        return int(self.execute(self.live[0], "CLUSTER", "KEYSLOT", key))

    def owner_of_slot(self, slot: int) -> Address:
        """Return the ``(host, port)`` that ``CLUSTER SLOTS`` gives for a slot."""
        for first, last, address in self.slot_map():
            if first <= slot <= last:
                return address
        raise LookupError(f"slot {slot} is not served by any node")

    def node_of(self, key: str | bytes) -> Address:
        """Return the ``(host, port)`` of the master serving ``key``."""
        return self.owner_of_slot(self.keyslot(key))

    def key_on(self, node: NodeRef, prefix: str = "key:") -> str:
        """Return the first key ``<prefix><i>`` (i = 0, 1, ...) that ``node`` serves."""
        address = self.nodes[self.index(node)]
        ranges = self.slot_map()
        for i in range(100_000):
            key = f"{prefix}{i}"
            slot = key_slot(key.encode())
            if any(first <= slot <= last and a == address for first, last, a in ranges):
                return key
        raise LookupError(f"no key {prefix}<i> lands on {address}")

    # -- breaking things on purpose -------------------------------------------------------

    def script_flush(self, node: NodeRef) -> None:
        """``SCRIPT FLUSH`` one node: its next ``EVALSHA`` answers ``NOSCRIPT``."""
        self.execute(node, "SCRIPT", "FLUSH")

    def begin_slot_migration(self, slot: int, target: NodeRef) -> int:
        """Mark ``slot`` IMPORTING on ``target`` and MIGRATING on its owner; return owner.

        While a slot migrates, the owner still serves the keys it holds and answers
        ``ASK`` for the others, which the target serves after ``ASKING``.
        """
        source = self.index(self.owner_of_slot(slot))
        dest = self.index(target)
        if source == dest:
            raise ValueError(f"slot {slot} already lives on node {dest}")
        self.execute(dest, "CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_ids[source])
        self.execute(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_ids[dest])
        return source

    def move_slot_keys(self, slot: int, source: NodeRef, target: NodeRef, limit: int = 0) -> int:
        """``MIGRATE`` the keys of ``slot`` from ``source`` to ``target``; return how many.

        ``limit`` > 0 moves at most that many keys (to leave a slot half-migrated).
        """
        src, dest = self.index(source), self.index(target)
        moved = 0
        while not limit or moved < limit:
            batch = MIGRATE_BATCH if not limit else min(MIGRATE_BATCH, limit - moved)
            keys = self._admin(src).execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not keys:
                break
            self._admin(src).execute_command(
                "MIGRATE", HOST, self.ports[dest], "", 0, 10_000, "KEYS", *keys
            )
            moved += len(keys)
        return moved

    def finish_slot_migration(self, slot: int, target: NodeRef) -> None:
        """``CLUSTER SETSLOT <slot> NODE <target>`` on the target, the owner, then the rest."""
        dest = self.index(target)
        owner = self.index(self.owner_of_slot(slot))
        order = [dest, owner, *(i for i in self.live if i not in (dest, owner))]
        for i in dict.fromkeys(order):
            self.execute(i, "CLUSTER", "SETSLOT", slot, "NODE", self.node_ids[dest])

    def migrate_slot(self, slot: int, target: NodeRef) -> int:
        """Move ``slot`` and its keys to ``target``; return the former owner's index."""
        source = self.begin_slot_migration(slot, target)
        self.move_slot_keys(slot, source, target)
        self.finish_slot_migration(slot, target)
        return source

    def abort_slot_migration(self, slot: int) -> None:
        """``CLUSTER SETSLOT <slot> STABLE`` everywhere (keys already moved stay moved)."""
        for i in self.live:
            self.execute(i, "CLUSTER", "SETSLOT", slot, "STABLE")

    def _take_down(self, i: int) -> RedisServer:
        """Note what node ``i`` serves (for :meth:`wait_for_failover`); mark it stopped."""
        server = self.servers[i]
        if server is None:
            raise ValueError(f"node {i} is already stopped")
        if self.replicas:
            # Best effort: a cluster already in pieces may not answer.
            with contextlib.suppress(redis.RedisError, LookupError):
                ranges = [(f, last) for f, last, a in self.slot_map(i) if a == self.nodes[i]]
                replicas = [self.index(address) for address in self.replicas_of(i)]
                self._lost[i] = (ranges, replicas)
        self._drop_admin(i)
        self.servers[i] = None
        return server

    def stop_node(self, node: NodeRef) -> None:
        """Stop one master, leaving its slots uncovered.

        After the node timeout the others report ``cluster_state:fail``
        (see :meth:`wait_for_state`), unless a replica takes over.
        """
        self._take_down(self.index(node)).stop()

    def kill_node(self, node: NodeRef) -> None:
        """SIGKILL one node (no shutdown), keeping its directory for :meth:`restart_node`.

        A killed master with a replica fails over after the node timeout
        (see :meth:`wait_for_failover`); without one, the cluster turns ``fail``.
        """
        i = self.index(node)
        server = self._take_down(i)
        self._killed[i] = server
        server.kill()

    def restart_node(self, node: NodeRef, wait: bool = True) -> None:
        """Restart a stopped or killed node on its port, with its ``nodes.conf``.

        It keeps its id; a killed node also keeps its directory (and its AOF, if
        ``--appendonly yes`` was among the extra args). A former master whose slots a
        replica took over rejoins as that replica's replica. Without persistence a node
        comes back empty. With ``wait``, wait until the whole cluster is consistent again
        (replicas' links up included).
        """
        i = self.index(node)
        if self.servers[i] is not None:
            raise ValueError(f"node {i} is running")
        killed = self._killed.get(i)
        if killed is None:
            self.servers[i] = self._start_server(self.ports[i])
        else:
            killed.restart()  # on failure it stays in _killed, for stop() to clean up
            self.servers[i] = self._killed.pop(i)
        self._lost.pop(i, None)
        if wait:
            self.wait_until_consistent(timeout=self.node_timeout_ms / 1000 * 4 + 20)

    def wait_for_failover(self, old_master: NodeRef, timeout: float | None = None) -> Address:
        """Wait until a replica of a killed or stopped master serves its slots; return it.

        Also waits (bounded, RuntimeError with the node logs on timeout) until every live
        node reports ``cluster_state:ok`` and all agree on a complete slot map and on who
        replicates whom. The default timeout is four node timeouts plus 10 s.
        """
        i = self.index(old_master)
        if self.servers[i] is not None:
            raise ValueError(f"node {i} is running: kill_node() or stop_node() it first")
        if i not in self._lost or not self._lost[i][1]:
            raise ValueError(f"node {i} had no replica when it went down (or no slots known)")
        ranges, candidates = self._lost[i]
        if timeout is None:
            timeout = self.node_timeout_ms / 1000 * 4 + 10
        promoted: list[Address] = []

        def problems() -> list[str]:
            promoted.clear()
            masters = [c for c in candidates if c in self.live and self.role(c) == "master"]
            if not masters:
                return [f"no replica of node {i} ({candidates}) promoted yet"]
            new = self.nodes[masters[0]]
            found = self._problems(None, "ok")
            owned = [(f, last) for f, last, a in self.slot_map() if a == new]
            found.extend(
                f"slots {first}-{last} of node {i} not served by node {masters[0]}"
                for first, last in ranges
                if not any(f <= first and last <= end for f, end in owned)
            )
            if not found:
                promoted.append(new)
            return found

        self._wait(problems, timeout, f"a failover of node {i}")
        return promoted[0]

    def wait_for_replication(self, master: NodeRef, timeout: float = 10.0) -> None:
        """Wait until every replica of ``master`` has applied all of its writes so far.

        Replication is asynchronous: call this after a write that must survive a kill of
        the master. Compares the master's ``master_repl_offset`` now with each replica's
        ``slave_repl_offset``.
        """
        i = self.index(master)
        target = int(self.execute(i, "INFO", "replication")["master_repl_offset"])
        replicas = [self.index(address) for address in self.replicas_of(i)]
        if not replicas:
            raise ValueError(f"node {i} has no replica")

        def behind() -> list[str]:
            found = []
            for r in replicas:
                info = self.execute(r, "INFO", "replication")
                offset = int(info.get("slave_repl_offset", -1))
                if info.get("master_link_status") != "up" or offset < target:
                    found.append(f"node {r}: at offset {offset} of {target}")
            return found

        self._wait(behind, timeout, f"node {i}'s replicas caught up")

    def pause_node(self, node: NodeRef, seconds: float) -> PauseThread:
        """Freeze one node for ``seconds`` (``DEBUG SLEEP``); see ``RedisServer.pause``."""
        i = self.index(node)
        server = self.servers[i]
        if server is None:
            raise ValueError(f"node {i} is not running")
        return server.pause(seconds)

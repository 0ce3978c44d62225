"""The hot path's wire: one script call per request, packed by hand on a held connection.

redis-py's generic ``execute_command`` spends 30-40 µs of Python per call on a
2-vCPU VM (pool checkout and its socket check, generic argument packing, the
retry wrapper, response callbacks): a third of a loopback round trip, and as much
as the Redis work itself. ``check_and_add`` always sends the same command,
``EVALSHA <sha> 1 <shard> <x> <y>``, so this module pre-packs everything but the
two integers and sends it on a connection held for the filter's life.

Behaviour is redis-py's where it matters: the same connection class (TCP, TLS,
Unix socket; RESP2 or 3; hiredis when installed), its health checks, its error
types. On a lost connection the call is retried once through the client itself,
which applies the client's own retry policy. Cluster clients and calls from
another thread or a forked child take that client path too.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError


class ScriptCaller:
    """Call one Lua script as ``EVALSHA sha 1 key x y`` and return its integer reply.

    Not thread-safe by itself: the thread that made the first call owns the held
    connection; any other thread goes through the client (which is thread-safe).
    """

    def __init__(self, client: Any, source: str, sha: str) -> None:
        self.client = client
        self.source = source
        self.sha = sha
        self._pool = getattr(client, "connection_pool", None)
        encoder = client.get_encoder() if self._pool is not None else None
        self._encode = encoder.encode if encoder is not None else None
        self._prefix = b"*6\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n$1\r\n1\r\n" % sha.encode()
        self._keys: dict[str, bytes] = {}
        self._connection: Any = None
        self._owner: tuple[int, int] | None = None  # (pid, thread) holding the connection

    def __call__(self, key: str, x: int, y: int) -> int:
        """Run the script on ``key`` with arguments ``x`` and ``y``."""
        if self._encode is None or self._owner not in (None, _here()):
            return self._through_client(key, x, y)
        connection = self._connection or self._acquire()
        packed = self._keys.get(key)
        if packed is None:
            raw = self._encode(key)
            packed = self._keys[key] = self._prefix + b"$%d\r\n%b\r\n" % (len(raw), raw)
        sx, sy = b"%d" % x, b"%d" % y
        command = packed + b"$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(sx), sx, len(sy), sy)
        try:
            try:
                connection.send_packed_command([command])
                return int(connection.read_response())
            except NoScriptError:  # a restart or SCRIPT FLUSH: load it, send again
                self.client.script_load(self.source)
                connection.send_packed_command([command])
                return int(connection.read_response())
        except ResponseError:  # an error reply, read to its end: the stream is in step
            raise
        except (RedisConnectionError, RedisTimeoutError, OSError):
            # Lost or timed out: drop the connection, let the client retry by its policy.
            # (As with any retry, a call that ran but lost its reply then reads "seen".)
            self._drop()
            return self._through_client(key, x, y)
        except BaseException:  # e.g. Ctrl-C between send and read: a reply may be pending
            self._drop()
            raise

    def _acquire(self) -> Any:
        pool = self._pool
        assert pool is not None
        try:
            connection = pool.get_connection()
        except TypeError:  # redis-py < 5.3 requires a command name
            connection = pool.get_connection("EVALSHA")
        self._connection, self._owner = connection, _here()
        return connection

    def _through_client(self, key: str, x: int, y: int) -> int:
        try:
            return int(self.client.evalsha(self.sha, 1, key, x, y))
        except NoScriptError:
            self.client.script_load(self.source)
            return int(self.client.evalsha(self.sha, 1, key, x, y))

    def close(self) -> None:
        """Give the held connection back to the client's pool."""
        connection, self._connection, self._owner = self._connection, None, None
        if connection is not None and self._pool is not None:
            self._pool.release(connection)

    def _drop(self) -> None:
        """Disconnect the held connection (its stream may be out of step), then release it."""
        connection = self._connection
        if connection is not None:
            connection.disconnect()
        self.close()


def _here() -> tuple[int, int]:
    return os.getpid(), threading.get_ident()

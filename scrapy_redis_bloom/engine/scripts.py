"""Lua scripts run by Redis: atomic check-and-add, shard allocation, leases, the record.

A script runs atomically: of any number of workers offering the same element, exactly
one is told it is new. Every script that writes bits first compares the shard's header
with the identity the caller expects and writes nothing when they differ: a lost or
foreign shard is reported, never written to. Scripts are called by SHA and loaded on
``NOSCRIPT`` by the executor.
"""

from __future__ import annotations

import re
from functools import cache, lru_cache
from importlib import resources

from scrapy_redis_bloom.core.generations import Growth
from scrapy_redis_bloom.core.hashing import BLOCK_BITS
from scrapy_redis_bloom.core.layout import HEADER_BITS, HEADER_BYTES, IDENTITY_BYTES
from scrapy_redis_bloom.transport.wire import Script

#: Where the scripts' Lua lives: ``.lua`` files inside the package (they ship in the wheel).
_LUA = resources.files("scrapy_redis_bloom.engine") / "lua"
#: A line of a ``.lua`` file that includes another there (see :func:`lua`).
_INCLUDE = re.compile(r"^[ \t]*--@ (\w+)[ \t]*\n", re.MULTILINE)

#: Reply of the check-and-add scripts when the shard's header is not the expected one.
MISMATCH = 2


#: Flags in a check-and-add reply (its second item): this call started a generation;
#: a shard is past its last generation's capacity (it cannot grow further); a lost
#: generation or window was recreated empty (``BLOOMFILTER_ON_LOSS = "recreate"``).
GREW, FULL, RECREATED = 1, 2, 4


@cache
def lua(name: str) -> str:
    """Return the source of ``lua/<name>.lua``, each line ``--@ other`` replaced by ``other``'s.

    Included as text, not as a Lua function: Redis runs a script's top level on every call,
    making such a closure anew each time.
    """
    source = _LUA.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return _INCLUDE.sub(lambda match: lua(match[1]), source)


def declare(**values: int | bool | str | list[int]) -> str:
    """Return Lua declaring ``values`` as locals: the numbers a ``.lua`` file takes from Python.

    So a layout constant or a geometry is written once, here, and the Lua reads as Lua.
    """
    return "".join(f"local {name} = {_literal(value)}\n" for name, value in values.items())


def _literal(value: int | bool | str | list[int]) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "{" + ", ".join(str(item) for item in value) + "}"
    if isinstance(value, str):
        return repr(value)
    return str(value)


#: What every check-and-add script declares first: the layout's constants and reply codes.
LAYOUT = declare(
    IDENTITY_BYTES=IDENTITY_BYTES,
    HEADER_BYTES=HEADER_BYTES,
    H=HEADER_BITS,
    MISMATCH=MISMATCH,
    GREW=GREW,
    FULL=FULL,
    RECREATED=RECREATED,
)


def check_and_add(growth: Growth, one: bool = False) -> Script:
    """Return the script that checks (and adds) elements of one shard, for a geometry.

    ``one``: the hot path's script, for one element (``SETBIT`` k times), used only where
    :mod:`.fastpath` and :mod:`.stackpath` cannot answer; else the bulk path's (``BITFIELD``).

    ``KEYS[1]``: the shard's key ``{KEY:<i>}:g0``; its generations and windows are named
    after it, in its cluster slot (only the script knows which exist; see
    docs/howto/topologies.md). ``ARGV``: the shard's identity; ``w`` (add) or ``r`` (check);
    ``1`` to recreate a lost generation or window empty, ``0`` to report it; then four
    numbers per element: its seeds of generation 0 and of later ones
    (:func:`.generations.seed_arguments`).

    Reply: ``{0, flags, generations, answer...}`` (1: it was probably there already), the
    hot path's the answer alone when there is nothing else to report; or ``{MISMATCH, key}``
    when ``key`` is missing or not this filter's (nothing written). Adds go to the newest
    generation, started first when the one before holds its capacity: atomically, so
    workers crossing the boundary together start it once.
    """
    return Script(_check_and_add_source(growth, one))


@lru_cache(maxsize=64)
def _check_and_add_source(growth: Growth, one: bool) -> str:
    # The layout's constants, the scheme, the first generation's shortcut (one, no TTL),
    # the geometry, the shared part, where the bits are (shard or windows), then the body.
    gens = growth.generations
    first = gens[0]
    parts = [LAYOUT, lua("scheme")]
    if one and not growth.ttl:
        parts.append(
            declare(
                FIRST_CAPACITY=first.capacity,
                FIRST_K=first.hash_count,
                FIRST_SPAN=first.span,
                FIRST_AT=[0] * first.hash_count,
            )
        )
        parts.append(lua("first_generation"))
    parts.append(geometry(growth))
    parts.append(lua("check_and_add"))
    if growth.ttl:
        parts += [lua("windows"), lua("bitmap_windows")]
    else:
        parts.append(lua("shard"))
    parts.append(lua("one" if one else "many"))
    return "".join(parts)


def geometry(growth: Growth) -> str:
    """Return Lua declaring a shard's generations, as ``check_and_add.lua`` reads them.

    Per generation g + 1: ``M`` bits, ``K`` hash functions, ``C`` capacity, ``B`` span, ``W``
    seed range; ``LAST``, ``COUNTED`` (the newest's items counted), ``TTL``; ``at``, room for
    one element's offsets.
    """
    gens = growth.generations
    return declare(
        M=[gen.bits for gen in gens],
        K=[gen.hash_count for gen in gens],
        C=[gen.capacity for gen in gens],
        B=[gen.span for gen in gens],
        W=[gen.seed_range for gen in gens],
        LAST=len(gens),
        # Items in the newest generation are counted where it may grow or is per window.
        COUNTED=growth.expansion > 0 or growth.ttl > 0,
        TTL=growth.ttl,
        # A table made at its size: filling it with an element's offsets allocates nothing.
        at=[0] * max(gen.hash_count for gen in gens),
    )


#: Allocate a shard whole, at its exact size, with its header (``lua/allocate.lua``).
#: Reply: 0 if the shard is there with this identity, 1 if this call allocated it, -1 if
#: the key holds something else.
ALLOCATE = Script(declare(IDENTITY_BYTES=IDENTITY_BYTES) + lua("allocate"))

#: The worker registry (``lua/lease.lua``), a sorted set of worker ids scored by lease
#: expiry (ms, server clock). ``KEYS[1]`` the registry; ``ARGV`` worker id, TTL in ms,
#: and ``renew``, ``release``, ``count`` or ``list``. Expired leases are dropped first. Reply: the
#: number of OTHER live workers, or with ``list`` the ids of all live workers, soonest
#: expiry first. The registry expires when no worker renews it; a renewal only ever
#: extends that expiry, so a worker with a short TTL cannot cut another's lease.
#: To clear the filter, ``claim`` counts the others and, if none is live (nor clearing),
#: adds the member ``(clearing)`` in the same step; ``hold`` renews the lease and the
#: claim; ``unclaim`` drops it. While it lives, ``renew`` replies -1 and takes no lease.
LEASE = Script(lua("lease"))

#: Delete ``KEYS[1]`` only if it is still the filter's part it was proven to be
#: (``lua/delete_if_still.lua``); reply 1 if deleted, 0 if it is something else. ``ARGV``:
#: the kind of part and the proof: a shard's identity, a server marker's value, the
#: record's id (or empty for a record this version cannot read: then only a hash with
#: ``layout`` and ``scheme``).
DELETE_IF_STILL = Script(declare(IDENTITY_BYTES=IDENTITY_BYTES) + lua("delete_if_still"))

#: Write the config record unless one exists; reply with the record in Redis
#: (``lua/create_record.lua``).
CREATE_RECORD = Script(lua("create_record"))

#: Clear bits a scriptless check set in a shard that turned out not to be its filter's
#: (see :meth:`.fastpath.FastPath.strays`; ``lua/take_back.lua``).
TAKE_BACK = Script(lua("take_back"))
#: Then delete a key such a check made where a generation or window was missing, once
#: it holds no bit (see :mod:`.bitmap.stackpath`; ``lua/drop_stray.lua``).
DROP_STRAY = Script(lua("drop_stray"))

#: A blocked shard's bulk snapshot reads (``lua/read_blocks.lua``) and writes back
#: (``lua/write_blocks.lua``) only the blocks of its batch: one reply per shard, however
#: many blocks (see :func:`.bitmap.snapshot.take`).
_BLOCKS = declare(HEADER_BYTES=HEADER_BYTES, BLOCK_BYTES=BLOCK_BITS // 8)
READ_BLOCKS = Script(_BLOCKS + lua("read_blocks"))
WRITE_BLOCKS = Script(_BLOCKS + lua("write_blocks"))

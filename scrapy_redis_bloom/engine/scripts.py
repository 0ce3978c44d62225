"""Lua scripts run by Redis: atomic check-and-add, shard allocation, leases, the record.

A script that writes bits first checks the shard's header is the identity expected: a lost
or foreign shard is reported, never written to.
"""

from __future__ import annotations

import re
from functools import cache, lru_cache
from importlib import resources
from typing import Any

from scrapy_redis_bloom.core.generations import Growth
from scrapy_redis_bloom.core.hashing import BLOCK_BITS
from scrapy_redis_bloom.core.layout import HEADER_BITS, HEADER_BYTES, IDENTITY_BYTES
from scrapy_redis_bloom.transport.wire import Script

_LUA = resources.files("scrapy_redis_bloom.engine") / "lua"
_INCLUDE = re.compile(r"^[ \t]*--@ (\w+)[ \t]*\n", re.MULTILINE)  # a line including a file

#: Reply of the check-and-add scripts when the shard's header is not the expected one.
MISMATCH = 2
#: Flags in a check-and-add reply (its second item): a generation started; a shard past its
#: last generation's capacity; a lost generation or window recreated empty.
GREW, FULL, RECREATED = 1, 2, 4
#: Where a reply's flags give the later generations kept by a window whose lost generation
#: 0 was recreated (4 bits: the current window's; the 4 above: the window before's).
KEPT_SHIFT = 8


@cache
def lua(name: str) -> str:
    """Return the source of ``lua/<name>.lua``, each line ``--@ other`` replaced by ``other``'s."""
    source = _LUA.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return _INCLUDE.sub(lambda match: lua(match[1]), source)


def declare(**values: int | bool | str | list[int] | list[float]) -> str:
    """Return Lua declaring ``values`` as locals: the numbers a ``.lua`` file takes from Python."""
    return "".join(f"local {name} = {_literal(value)}\n" for name, value in values.items())


def _literal(value: int | bool | str | list[int] | list[float]) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "{" + ", ".join(str(item) for item in value) + "}"
    return repr(value)  # a number, or a quoted string


#: What every check-and-add script declares first: the layout's constants and reply codes.
LAYOUT = declare(
    IDENTITY_BYTES=IDENTITY_BYTES,
    HEADER_BYTES=HEADER_BYTES,
    H=HEADER_BITS,
    MISMATCH=MISMATCH,
    GREW=GREW,
    FULL=FULL,
    RECREATED=RECREATED,
    KEPT_SHIFT=KEPT_SHIFT,
)


@lru_cache(maxsize=64)
def check_and_add(growth: Growth, one: bool = False) -> Script:
    """Return the script that checks (and adds) elements of one shard, for a geometry.

    ``one``: the hot path's (``SETBIT`` k times); else the bulk path's (``BITFIELD``). Reply:
    ``{0, flags, generations, answer...}`` (the hot path's the answer alone when nothing else
    is to report), or ``{MISMATCH, key}`` (nothing written).
    """
    parts = [LAYOUT, lua("scheme")]
    if one and not growth.ttl:
        first = growth.generations[0]
        capacity, k, span = first.capacity, first.hash_count, first.span
        parts.append(declare(FIRST_CAPACITY=capacity, FIRST_K=k, FIRST_SPAN=span, FIRST_AT=[0] * k))
        parts.append(lua("first_generation"))
    parts += [geometry(growth), lua("check_and_add")]
    parts += [lua("windows"), lua("bitmap_windows")] if growth.ttl else [lua("shard")]
    parts.append(lua("one" if one else "many"))
    return Script("".join(parts))


def script_reply(reply: Any, answers: int) -> list[Any]:
    """Return a check-and-add script's list reply for ``answers`` elements; else ``ValueError``."""
    if isinstance(reply, list) and reply:
        if reply[0] == MISMATCH and len(reply) == 2 and isinstance(reply[1], bytes):
            return reply
        if (
            reply[0] == 0
            and len(reply) == 3 + answers
            and all(value.__class__ is int for value in reply[1:3])
            and (given := reply[3:]).count(0) + given.count(1) == answers
        ):
            return reply
    raise ValueError(f"the script's reply for {answers} element(s), got {reply!r:.200}")


def geometry(growth: Growth) -> str:
    """Return Lua declaring each generation of a shard: ``M``, ``K``, ``C``, ``B``, ``W``, ``D``."""
    gens = growth.generations
    return declare(
        M=[gen.bits for gen in gens],
        K=[gen.hash_count for gen in gens],
        C=[gen.capacity for gen in gens],
        B=[gen.span for gen in gens],
        W=[gen.seed_range for gen in gens],
        D=[gen.distinct for gen in gens],  # distinct bits per item: to count a generation's
        LAST=len(gens),
        COUNTED=growth.expansion > 0 or growth.ttl > 0,  # items counted where it may grow
        TTL=growth.ttl,
        at=[0] * max(gen.hash_count for gen in gens),  # made at its size: fills allocate nothing
    )


#: Allocate a shard whole, at its exact size, with its header (see :meth:`.Parts.allocate`).
ALLOCATE = Script(declare(IDENTITY_BYTES=IDENTITY_BYTES) + lua("allocate"))

#: The worker registry (``lua/lease.lua``). ``ARGV``: worker id, TTL in ms, ``renew``,
#: ``release``, ``count``, ``list``, ``claim`` (to clear), ``hold`` (lease and claim) or
#: ``unclaim``. Reply: how many OTHER workers are live (``list``: all ids; -1: a ``renew``
#: while another worker clears).
LEASE = Script(lua("lease"))
DELETE_IF_STILL = Script(declare(IDENTITY_BYTES=IDENTITY_BYTES) + lua("delete_if_still"))
PART_IDENTITY = Script(lua("part_identity"))
CREATE_RECORD = Script(lua("create_record"))
#: Clear bits a scriptless check set in a shard not its filter's; drop a key it made, empty.
TAKE_BACK = Script(lua("take_back"))
DROP_STRAY = Script(lua("drop_stray"))

#: A blocked shard's snapshot reads and writes only its batch's blocks (:func:`.snapshot.take`).
_BLOCKS = declare(HEADER_BYTES=HEADER_BYTES, BLOCK_BYTES=BLOCK_BITS // 8)
READ_BLOCKS = Script(_BLOCKS + lua("read_blocks"))
WRITE_BLOCKS = Script(_BLOCKS + lua("write_blocks"))

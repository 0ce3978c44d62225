"""Redis commands packed by hand (RESP): less Python per command than redis-py's."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

Arg = bytes | str | int


def encode(value: Arg) -> bytes:
    """Return one argument as bytes: str as UTF-8, int in decimal."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, int):
        return b"%d" % value
    return value.encode()


def command_head(count: int, *args: Arg) -> bytes:
    """Pack the start of a command of ``count`` arguments: its first ``args`` (bulk strings)."""
    return b"*%d\r\n" % count + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in map(encode, args))


def pack_command(*args: Arg) -> bytes:
    """Pack a whole command."""
    return command_head(len(args), *args)


#: A ``BITFIELD``'s ``SET u1 <bit> 1``, to fill by ``%`` with the bit's decimal length and the
#: bit: one format for a check's k bits costs less than packing 4k arguments one by one.
SET_BIT = "$3\r\nSET\r\n$2\r\nu1\r\n$%d\r\n%d\r\n$1\r\n1\r\n"


class BitfieldPacker:
    """Pack ``BITFIELD key SET u1 <offset> 1 ...`` (or ``GET u1 <offset>``) commands."""

    def __init__(self, write: bool) -> None:
        self._arguments_per_bit = 4 if write else 3
        op = b"$3\r\nSET\r\n$2\r\nu1\r\n" if write else b"$3\r\nGET\r\n$2\r\nu1\r\n"
        # Per decimal length of the offset: the op's bytes up to the offset itself.
        self._heads = [(op + b"$%d\r\n" % n).decode() for n in range(21)]
        self._tail = "\r\n$1\r\n1\r\n" if write else "\r\n"

    def pack(self, key: bytes, offsets: Sequence[int]) -> bytes:
        """Return one BITFIELD command over ``offsets`` of the string ``key``."""
        heads, tail = self._heads, self._tail
        count = 2 + self._arguments_per_bit * len(offsets)
        parts = [command_head(count, b"BITFIELD", key).decode("latin-1")]
        append = parts.append
        for offset in offsets:
            text = str(offset)
            append(heads[len(text)])
            append(text)
            append(tail)
        return "".join(parts).encode("latin-1")


@dataclass(frozen=True)
class Script:
    """A Lua script and its SHA1, as ``EVALSHA`` names it."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())

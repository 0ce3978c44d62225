"""The dump file of a filter: a versioned header, checksummed chunks, a checksummed trailer.

Written and read as a stream, so memory stays flat. All integers big-endian.

* **Header**: ``SRBDUMP`` and a NUL byte, the version (u16), the JSON's length (u32), the
  JSON (key, config record, counters, source, time), its CRC32 (u32).
* **Chunks**: ``C``, kind (u8: 0 bitmap, 1 native), shard (u32), generation (u16), position
  (u64: byte offset, or ``BF.SCANDUMP`` iterator), length (u32), CRC32 (u32), the data.
  A part's chunks follow each other, in order.
* **Trailer**: ``E``, counts of parts, chunks and data bytes (u64 each), then the SHA-256
  of every byte before it. Nothing may follow.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

MAGIC = b"SRBDUMP\0"
VERSION = 1
BITMAP, NATIVE = 0, 1  #: Kinds of parts a chunk belongs to.
MAX_CHUNK = 1 << 30  #: Largest chunk a reader accepts: a bitmap's are 1 MiB.
MAX_HEADER = 1 << 20  #: Largest header JSON a reader accepts.

_START = struct.Struct("!8sHI")
_CHUNK = struct.Struct("!BIHQII")
_TRAILER = struct.Struct("!QQQ")
_U32 = struct.Struct("!I")
_SHA = 32


class DumpFileError(ValueError):
    """A dump file that cannot be restored: truncated, corrupted, or of another format."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """A chunk read back: its part, position, data, ``index`` (from 1), ``where`` for messages."""

    kind: int
    shard: int
    generation: int
    position: int
    data: bytes
    index: int
    where: str


@dataclass(frozen=True, slots=True)
class Totals:
    """The trailer's counts, and the whole file's SHA-256 (hex)."""

    parts: int
    chunks: int
    data_bytes: int
    file_bytes: int
    sha256: str


def part_name(kind: int, shard: int, generation: int) -> str:
    """Name a part in a message: ``shard 3 (generation 1)`` or ``native shard 3``."""
    return f"native shard {shard}" if kind == NATIVE else f"shard {shard} (generation {generation})"


class DumpWriter:
    """Writes a dump file to ``out`` as a stream, hashing every byte as it goes."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self._sha = hashlib.sha256()
        self.file_bytes = self.parts = self.chunks = self.data_bytes = 0
        self._part: tuple[int, int, int] | None = None

    def _write(self, data: bytes) -> None:
        self.out.write(data)
        self._sha.update(data)
        self.file_bytes += len(data)

    def header(self, fields: dict[str, Any]) -> None:
        """Write the magic, the version and the header's JSON (``fields``)."""
        body = json.dumps(fields, sort_keys=True).encode()
        self._write(_START.pack(MAGIC, VERSION, len(body)) + body + _U32.pack(zlib.crc32(body)))

    def chunk(self, kind: int, shard: int, generation: int, position: int, data: bytes) -> None:
        """Write one chunk of a part; a part's chunks must be written one after another."""
        if (kind, shard, generation) != self._part:
            self._part = (kind, shard, generation)
            self.parts += 1
        self.chunks += 1
        self.data_bytes += len(data)
        head = _CHUNK.pack(kind, shard, generation, position, len(data), zlib.crc32(data))
        self._write(b"C" + head)
        self._write(data)

    def finish(self) -> Totals:
        """Write the trailer; return the counts and the file's SHA-256."""
        self._write(b"E" + _TRAILER.pack(self.parts, self.chunks, self.data_bytes))
        digest = self._sha.digest()
        self.out.write(digest)
        self.file_bytes += len(digest)
        self.out.flush()
        return Totals(self.parts, self.chunks, self.data_bytes, self.file_bytes, digest.hex())


class DumpReader:
    """Reads a dump file as a stream, checking every checksum (:attr:`totals`: once whole)."""

    def __init__(self, inp: BinaryIO, name: str) -> None:
        self.inp = inp
        self.name = name
        self._sha = hashlib.sha256()
        self.offset = 0
        self.totals: Totals | None = None

    def refuse(self, problem: str) -> DumpFileError:
        """Return the error refusing the file for ``problem``."""
        return DumpFileError(f"The dump file {self.name} cannot be restored: {problem}.")

    def _read(self, size: int, what: str) -> bytes:
        """Read exactly ``size`` bytes of ``what``, or refuse the file as truncated."""
        data = self.inp.read(size)
        if len(data) != size:
            raise self.refuse(
                f"it is truncated: {what} ends at byte {self.offset + len(data):,} of the file,"
                f" {size - len(data):,} byte(s) short of its length"
            )
        self._sha.update(data)
        self.offset += size
        return data

    def header(self) -> dict[str, Any]:
        """Read and check the magic, the version and the header's JSON; return the JSON."""
        start = self.inp.read(_START.size)
        if start[: len(MAGIC)] != MAGIC:
            raise self.refuse(
                "it is not a scrapy-redis-bloom dump (it does not start with"
                f" {MAGIC!r}, but {start[: len(MAGIC)]!r})"
            )
        if len(start) < _START.size:
            raise self.refuse("it is truncated inside its header")
        self._sha.update(start)
        self.offset += len(start)
        _, version, size = _START.unpack(start)
        if version != VERSION:
            raise self.refuse(
                f"it has format version {version}, and this version of scrapy-redis-bloom"
                f" reads version {VERSION} only"
            )
        if size > MAX_HEADER:
            raise self.refuse(f"its header claims {size:,} bytes (at most {MAX_HEADER:,})")
        body = self._read(size, "the header")
        (crc,) = _U32.unpack(self._read(_U32.size, "the header's checksum"))
        if zlib.crc32(body) != crc:
            raise self.refuse("its header's checksum does not match (the header is corrupted)")
        try:
            fields = json.loads(body)
        except ValueError as exc:
            raise self.refuse(f"its header is not JSON ({exc})") from None
        if not isinstance(fields, dict):
            raise self.refuse("its header is not a JSON object")
        return fields

    def chunks(self) -> Iterator[Chunk]:
        """Read the header if not done yet, yield every chunk CRC32-checked, check the trailer."""
        if not self.offset:
            self.header()
        number = index = parts = data_bytes = 0
        part: tuple[int, int, int] | None = None
        while True:
            tag = self._read(1, f"the frame after chunk {number}")
            if tag == b"E":
                break
            if tag != b"C":
                raise self.refuse(
                    f"byte {self.offset - 1:,} should start a chunk or the trailer, and holds"
                    f" {tag!r} (the file is corrupted)"
                )
            number += 1
            head = self._read(_CHUNK.size, f"the frame of chunk {number}")
            kind, shard, generation, position, size, crc = _CHUNK.unpack(head)
            if kind not in (BITMAP, NATIVE) or size > MAX_CHUNK:
                raise self.refuse(f"the frame of chunk {number} is corrupted")
            if (kind, shard, generation) != part:
                part, index = (kind, shard, generation), 0
                parts += 1
            index += 1
            where = f"chunk {index} of {part_name(kind, shard, generation)}"
            data = self._read(size, f"{where} (chunk {number} of the file)")
            end = self.offset
            if zlib.crc32(data) != crc:
                raise self.refuse(
                    f"{where} (chunk {number} of the file, bytes"
                    f" {end - size:,} to {end:,}) fails its checksum: the file is corrupted"
                )
            data_bytes += size
            yield Chunk(kind, shard, generation, position, data, index, where)
        counts = _TRAILER.unpack(self._read(_TRAILER.size, "the trailer"))
        expected = self._sha.digest()
        digest = self.inp.read(_SHA)
        if len(digest) != _SHA:
            raise self.refuse(
                f"it is truncated: the trailer's SHA-256 ends at byte {self.offset + len(digest):,}"
                f" of the file, {_SHA - len(digest)} byte(s) short"
            )
        self.offset += _SHA
        if counts != (parts, number, data_bytes):
            raise self.refuse(
                f"its trailer counts {counts[0]:,} part(s), {counts[1]:,} chunk(s) and"
                f" {counts[2]:,} byte(s), and the file holds {parts:,}, {number:,} and"
                f" {data_bytes:,} (the file is corrupted)"
            )
        if digest != expected:
            raise self.refuse("its SHA-256 does not match its content (the file is corrupted)")
        if self.inp.read(1):
            raise self.refuse(f"bytes follow its trailer (at byte {self.offset:,})")
        self.totals = Totals(parts, number, data_bytes, self.offset, expected.hex())

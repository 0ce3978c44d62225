"""The config record stored beside a filter's bits (``KEY:meta``): parsed, checked, compared.

It holds all a worker needs to read the bits, the filter's random id and the sizing request
(a worker asking the same adopts the stored geometry). A corrupt or foreign hash is refused
naming the key, never half-used.
"""

from __future__ import annotations

import logging
import math
import re
import secrets
import time
from dataclasses import dataclass, replace
from typing import Literal

from scrapy_redis_bloom.core.errors import (
    BloomFilterError,
    ConfigMismatchError,
    ServerListMismatchError,
    Wording,
)
from scrapy_redis_bloom.core.generations import DEFAULT_TIGHTENING, Growth, growth_limit
from scrapy_redis_bloom.core.hashing import (
    BLOCK_BITS,
    BLOCKED_SCHEME,
    CLASSIC_SCHEME,
    SCHEME_VERSION,
    FilterSpec,
)
from scrapy_redis_bloom.core.layout import ID_BYTES, LAYOUT_VERSION
from scrapy_redis_bloom.core.sizing import native_reserve_rate

logger = logging.getLogger(__name__)

State = Literal["creating", "ready"]
#: Where a filter keeps its bits: our bitmaps, or the server's own ``BF.*`` (:mod:`.native`).
Backend = Literal["bitmap", "native"]
BACKENDS: tuple[Backend, ...] = ("bitmap", "native")
#: A native filter's layout: its record says the error rate its shards were reserved at
#: (``reserved_rate``). A release reading layout 2 only, or 2 and 3, refuses it.
NATIVE_LAYOUT = 4
#: The native layout of earlier builds: no ``reserved_rate``, its shards reserved at the bare
#: :attr:`FilterRecord.target_rate`. Still read (and described, estimated) as it is.
BARE_NATIVE_LAYOUT = 3
#: Each layout this version reads, and the backend it is of.
_LAYOUTS: dict[str, Backend] = {
    str(LAYOUT_VERSION): "bitmap",
    str(BARE_NATIVE_LAYOUT): "native",
    str(NATIVE_LAYOUT): "native",
}

#: Fields of the record, in the order they are written.
FIELDS = (
    "layout", "scheme", "id", "state", "shards", "shard_bits", "hash_count", "bits",
    "capacity", "sizing", "servers", "generations", "created",
    "expansion", "tightening", "ttl", "backend", "fingerprints", "reserved_rate",
)  # fmt: skip
#: Fields that are the geometry's (:class:`FilterSpec`'s attributes).
_SPEC_FIELDS = ("shards", "shard_bits", "hash_count", "bits")
#: Fields older records lack: read as no growth, no TTL, a bitmap filter. ``reserved_rate``:
#: a native record's of :data:`NATIVE_LAYOUT` only (not written for others).
LATER_FIELDS = ("expansion", "tightening", "ttl", "backend", "fingerprints", "reserved_rate")
#: What a record says of its fingerprints when the program that created it did not say.
UNSAID = ""

#: Fields every config record has had: a hash with both is one of ours (``reset`` deletes it).
RECORD_MARKS = ("layout", "scheme")

#: Most servers a filter may be spread over.
MAX_SERVERS = 1024
_ID = re.compile(f"[0-9a-f]{{{2 * ID_BYTES}}}")
#: The error rate asked, in a sizing request's text (:meth:`..sizing.Sizing.canonical`).
_ERROR_RATE = re.compile(r"(?:^| )error_rate=([0-9.e+-]+)(?: |$)")


@dataclass(frozen=True, slots=True)
class FilterRecord:
    """The config record of one filter: ``creating`` until every shard and marker exists."""

    spec: FilterSpec
    capacity: int
    filter_id: str
    sizing: str
    created: float
    servers: int = 1
    expansion: int = 0
    tightening: float = DEFAULT_TIGHTENING
    ttl: int = 0
    state: State = "ready"
    backend: Backend = "bitmap"
    layout: int = LAYOUT_VERSION
    #: What makes the elements: the Scrapy dupefilter's fingerprint function (``scrapy-redis``,
    #: or ``crawler:<class>``), compared between workers; :data:`UNSAID` for other callers.
    fingerprints: str = UNSAID
    #: A native filter's: the error rate ``BF.RESERVE`` was handed for each shard (layout
    #: :data:`NATIVE_LAYOUT`); None: :attr:`target_rate` (layout :data:`BARE_NATIVE_LAYOUT`).
    reserved_rate: float | None = None

    @classmethod
    def new(
        cls,
        spec: FilterSpec,
        capacity: int,
        sizing: str,
        servers: int = 1,
        *,
        expansion: int = 0,
        ttl: int = 0,
        backend: Backend = "bitmap",
        fingerprints: str = UNSAID,
    ) -> FilterRecord:
        """Return the record of a filter about to be created (state ``creating``).

        A native filter's record says scheme 1, as it always has, and the rate its shards are
        reserved at (:attr:`reserved_rate`): :attr:`target_rate` less RedisBloom's index
        excess (:func:`.native_reserve_rate`), which passed the target in small shards.
        """
        native = backend == "native"
        record = cls(
            spec=replace(spec, two_seeds=True) if native and not spec.block_bits else spec,
            capacity=capacity,
            filter_id=secrets.token_hex(ID_BYTES),
            sizing=sizing,
            created=time.time(),
            servers=servers,
            expansion=expansion,
            ttl=ttl,
            state="creating",
            backend=backend,
            layout=NATIVE_LAYOUT if native else LAYOUT_VERSION,
            fingerprints=fingerprints,
        )
        if not native:
            return record
        capacity = record.growth.native_capacity
        return replace(
            record, reserved_rate=native_reserve_rate(capacity, record.target_rate, expansion)
        )

    @property
    def scheme(self) -> int:
        """The hashing scheme's version, as its geometry says."""
        return self.spec.scheme

    @property
    def growth(self) -> Growth:
        """How the filter's shards grow and forget."""
        return Growth(self.spec, self.capacity, self.expansion, self.tightening, self.ttl)

    @property
    def target_rate(self) -> float:
        """The rate a native shard must stay under (every sub-filter it grows, together).

        The asked error rate (half of it per re-crawl window: a check reads two), else the
        bitmap geometry's bound. Earlier builds reserved the shards at it.
        """
        asked = _ERROR_RATE.search(self.sizing)
        rate = float(asked.group(1)) if asked else self.growth.bound
        if self.ttl and asked:  # two re-crawl windows are consulted: half the rate each
            rate /= 2
        return rate

    @property
    def shard_rate(self) -> float:
        """The error rate a native shard is reserved at: :attr:`reserved_rate`, else the target."""
        return self.target_rate if self.reserved_rate is None else self.reserved_rate

    @property
    def shard_payload(self) -> int:
        """Bytes of bits a shard key holds after its header: none for a TTL filter's anchor."""
        return 0 if self.ttl > 0 else self.spec.shard_bytes

    def ready(self) -> FilterRecord:
        """Return this record in state ``ready``."""
        return replace(self, state="ready")

    def fields(self) -> dict[str, str]:
        """Return the record as the hash fields written to Redis (floats as their repr)."""
        values: dict[str, object] = {"id": self.filter_id, "generations": self.growth.last + 1}
        for name in FIELDS:
            if name not in values:
                values[name] = getattr(self.spec if name in _SPEC_FIELDS else self, name)
        if self.reserved_rate is not None:
            values["reserved_rate"] = repr(self.reserved_rate)
        return {name: str(values[name]) for name in FIELDS if values[name] is not None}

    @classmethod
    def parse(cls, key: str, fields: dict[str, str]) -> FilterRecord:
        """Build a record from the hash read back; refuse one this version cannot trust."""

        def refuse(problem: str) -> BloomFilterError:
            if not all(name in fields for name in RECORD_MARKS):  # reset leaves it alone
                return BloomFilterError(
                    f"The hash {key!r} is not a config record of scrapy-redis-bloom ({problem}):"
                    " another program's key? Choose another BLOOMFILTER_KEY, or, if nothing"
                    f" needs that hash, delete it by hand (redis-cli DEL {key!r})."
                )
            return BloomFilterError(
                f"The config record {key!r} cannot be used: {problem}. Check that"
                " BLOOMFILTER_KEY names a filter created by this version of"
                f" scrapy-redis-bloom; reset it (scrapy bloom reset --key"
                f" {key.removesuffix(':meta')!r}) to start over."
            )

        backend = fields.get("backend", "bitmap")
        if backend not in BACKENDS:
            raise refuse(f"its backend is {backend!r}, not 'bitmap' or 'native'")
        layout = LAYOUT_VERSION if backend == "bitmap" else NATIVE_LAYOUT
        natives = f"{BARE_NATIVE_LAYOUT} or {NATIVE_LAYOUT}"
        if fields.get("layout") in _LAYOUTS:
            if _LAYOUTS[fields["layout"]] != backend:
                raise refuse(
                    f"its backend ({backend!r}) and its layout ({fields['layout']!r}) contradict"
                    f" each other: layout {LAYOUT_VERSION} is the bitmap backend's,"
                    f" {natives} the native one's"
                )
            layout = int(fields["layout"])
        elif "layout" in fields:
            raise refuse(
                f"it was written with layout {fields['layout']!r}, and this version reads"
                f" layout {LAYOUT_VERSION} (bitmap) or {natives} (native) only, as its"
                f" backend says (layout 1 was that of development builds before 0.1.0)"
            )
        if missing := [name for name in FIELDS if name not in fields and name not in LATER_FIELDS]:
            raise refuse(f"it lacks the field(s) {', '.join(missing)}")
        if ("reserved_rate" in fields) != (layout == NATIVE_LAYOUT):
            raise refuse(
                f"its layout ({fields.get('layout')!r}) and its reserved_rate"
                f" ({fields.get('reserved_rate', 'none')!r}) contradict each other: a native"
                f" record of layout {NATIVE_LAYOUT} says the error rate its shards were"
                " reserved at, and no other does"
            )

        def integer(name: str, low: int, high: int) -> int:
            text = fields[name]
            if not re.fullmatch(r"[0-9]{1,20}", text) or not low <= int(text) <= high:
                raise refuse(f"its {name} is {text!r}, not an integer from {low:,} to {high:,}")
            return int(text)

        if fields["scheme"] not in map(str, (SCHEME_VERSION, BLOCKED_SCHEME, CLASSIC_SCHEME)):
            raise refuse(
                f"its hash scheme is {fields['scheme']!r}; this version knows schemes"
                f" {SCHEME_VERSION}, {BLOCKED_SCHEME} (blocked) and {CLASSIC_SCHEME} only"
            )
        scheme = int(fields["scheme"])
        if scheme == BLOCKED_SCHEME and backend == "native":
            raise refuse("its hash scheme is the blocked one, which the native backend has not")
        if not _ID.fullmatch(fields["id"]):
            raise refuse(f"its id is {fields['id']!r}, not {2 * ID_BYTES} hex digits")
        state = fields["state"]
        if state not in ("creating", "ready"):
            raise refuse(f"its state is {state!r}, not 'creating' or 'ready'")
        try:
            spec = FilterSpec(
                shards=integer("shards", 1, 2**63),
                shard_bits=integer("shard_bits", 1, 2**63),
                hash_count=integer("hash_count", 1, 2**63),
                block_bits=BLOCK_BITS if scheme == BLOCKED_SCHEME else 0,
                two_seeds=scheme == SCHEME_VERSION,
            )
        except ValueError as exc:
            raise refuse(f"its geometry is impossible ({exc})") from None
        if integer("bits", 1, 2**63) != spec.bits:
            raise refuse(f"its bits ({fields['bits']}) are not shards x shard_bits ({spec.bits})")
        try:
            created = float(fields["created"])
        except ValueError:
            created = math.nan
        if not 0 <= created < 253_402_300_800:  # (to 9999-12-31, what a date can show)
            raise refuse(f"its creation time is {fields['created']!r}, not a Unix timestamp")
        expansion = integer("expansion", 0, 2**16) if "expansion" in fields else 0
        if expansion == 1:
            raise refuse("its expansion is 1: 0 (no growth) or at least 2")
        try:
            tightening = float(fields.get("tightening", DEFAULT_TIGHTENING))
        except ValueError:
            tightening = math.nan
        if not 0.01 <= tightening <= 0.99:  # (smaller: a generation's rate underflows to 0)
            raise refuse(
                f"its tightening is {fields['tightening']!r}, not a number from 0.01 to 0.99"
            )
        reserved_rate = None
        if "reserved_rate" in fields:
            try:
                reserved_rate = float(fields["reserved_rate"])
            except ValueError:
                reserved_rate = math.nan
            if not 0 < reserved_rate < 1:
                raise refuse(
                    f"its reserved_rate is {fields['reserved_rate']!r}, not a number between 0"
                    " and 1"
                )
        return cls(
            spec=spec,
            expansion=expansion,
            tightening=tightening,
            ttl=integer("ttl", 0, 2**31) if "ttl" in fields else 0,
            capacity=integer("capacity", 1, 2**63),
            filter_id=fields["id"],
            sizing=fields["sizing"],
            created=created,
            servers=integer("servers", 1, MAX_SERVERS),
            state="creating" if state == "creating" else "ready",
            backend="native" if backend == "native" else "bitmap",
            layout=layout,
            fingerprints=fields.get("fingerprints", UNSAID),
            reserved_rate=reserved_rate,
        )

    def describe(self) -> str:
        """Return the geometry as the user would compare it with settings."""
        spec = self.spec
        return (
            f"m={spec.bits:,} bits in {spec.shards:,} shard(s) of {spec.shard_bits:,} bits,"
            f" k={spec.hash_count}, {self.servers} server(s), hash scheme {self.scheme}"
            f"{f' (blocked, {spec.block_bits}-bit blocks)' if spec.block_bits else ''},"
            f" layout {self.layout}{' (native backend)' if self.backend == 'native' else ''}"
            f" (sized for {self.capacity:,} items: {self.sizing}),"
            f" {self.growth_text()}"
        )

    def growth_limit(self) -> str:
        """Say what bounds a bitmap filter's growth, after "; " ("" if nothing does).

        (A native filter's layers are RedisBloom's, not bound by a bitmap generation's size.)
        """
        limit = growth_limit(self.growth) if self.expansion and self.backend != "native" else ""
        return f"; {limit}" if limit else ""

    def growth_text(self) -> str:
        """Say how the filter grows and forgets, as settings would."""
        grows = f"growing {self.expansion}x per generation" if self.expansion else "fixed size"
        forgets = f"URLs forgotten after {self.ttl:,} to {2 * self.ttl:,} s"
        return f"{grows}, {forgets if self.ttl else 'URLs remembered forever'}"

    def created_text(self) -> str:
        """Return the creation time as ``YYYY-MM-DD HH:MM:SS UTC``."""
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.created))

    def check(self, key: str, wanted: FilterRecord, fixed: str | None = None) -> None:
        """Refuse a worker whose request (:func:`same_sizing`, or geometry) is not this filter's.

        ``fixed``: why the worker's backend is not BLOOMFILTER_BACKEND's to choose (a class of
        one backend), said instead of advice to set it.
        """

        def mismatch(
            text: str, kind: type[ConfigMismatchError] = ConfigMismatchError, **values: object
        ) -> Exception:
            return kind(Wording(text, key=key, **values))

        if wanted.backend != self.backend and fixed is not None:
            raise mismatch(
                "The Bloom filter {key!r} is {backend} (its record says so), and {fixed}."
                " Open it by the Scrapy dupefilter (scrapy_redis_bloom.dupefilter.RFPDupeFilter),"
                " which takes the filter's backend, choose another key, or reset the filter"
                " (scrapy bloom reset --key {key!r}).",
                backend=self.backend,
                fixed=fixed,
            )
        if wanted.backend != self.backend:
            raise mismatch(
                "The Bloom filter {key!r} was created with {BLOOMFILTER_BACKEND} ="
                " {backend!r}; this worker asks for {wanted!r}. Every worker must use the"
                " filter's backend: set {BLOOMFILTER_BACKEND} = 'auto' (it adopts the"
                " filter's) or {backend!r}, choose another {BLOOMFILTER_KEY}, or reset the"
                " filter (scrapy bloom reset --key {key!r}).",
                backend=self.backend,
                wanted=wanted.backend,
            )
        blocked = bool(self.spec.block_bits)
        if not (
            same_sizing(wanted.sizing, self.sizing, blocked)
            or wanted.spec.geometry == self.spec.geometry
        ):
            raise mismatch(
                "The Bloom filter {key!r} in Redis was created on {created} with {stored};"
                " this worker is configured with {wanted}. A filter's layout cannot change"
                " once it holds bits. Either start this worker with the {settings} the"
                " filter was created with, choose another {BLOOMFILTER_KEY}, or reset the"
                " filter (scrapy bloom reset --key {key!r}), which forgets every URL"
                " it has seen.",
                created=self.created_text(),
                stored=self.describe(),
                wanted=wanted.describe(),
            )
        if not same_sizing(wanted.sizing, self.sizing, blocked):
            logger.info(
                "The Bloom filter %r was created with %s; this worker asks for %s, which gives"
                " the same layout: it uses the filter's.",
                key,
                self.sizing,
                wanted.sizing,
            )
        if wanted.spec.block_bits != self.spec.block_bits:
            logger.info(
                "The Bloom filter %r keeps the %s layout it was created with"
                " (BLOOMFILTER_BLOCKED is unset: a new bitmap filter would be blocked).",
                key,
                "blocked" if blocked else "classic (unblocked)",
            )
        if wanted.ttl != self.ttl:
            raise mismatch(
                "The Bloom filter {key!r} was created with {BLOOMFILTER_TTL} = {ttl}"
                " ({growth}); this worker sets {wanted}. Every worker must forget URLs"
                " after the same time: set {BLOOMFILTER_TTL} as the filter was created,"
                " choose another {BLOOMFILTER_KEY}, or reset the filter"
                " (scrapy bloom reset --key {key!r}).",
                ttl=self.ttl,
                growth=self.growth_text(),
                wanted=wanted.ttl,
            )
        if UNSAID not in (wanted.fingerprints, self.fingerprints) and (
            wanted.fingerprints != self.fingerprints
        ):
            raise mismatch(
                "The Bloom filter {key!r} holds the fingerprints of {stored}; this worker makes"
                " those of {wanted}. Every URL the filter holds would look new to it (and be"
                " fetched again), and the filter would fill with both. Crawl with the"
                " {BLOOMFILTER_FINGERPRINTER} (and REQUEST_FINGERPRINTER_CLASS) the filter was"
                " created with, choose another {BLOOMFILTER_KEY}, or reset the filter"
                " (scrapy bloom reset --key {key!r}).",
                stored=self.fingerprints,
                wanted=wanted.fingerprints,
            )
        if wanted.servers != self.servers:
            raise mismatch(
                "The Bloom filter {key!r} was created on {servers} server(s); this worker"
                " lists {wanted}. List the servers in {BLOOMFILTER_REDIS_URLS} exactly as"
                " when the filter was created (same servers, same order): shards are"
                " never re-mapped to other servers.",
                ServerListMismatchError,
                servers=self.servers,
                wanted=wanted.servers,
            )
        if wanted.expansion != self.expansion:
            logger.warning(
                "The Bloom filter %r was created with BLOOMFILTER_EXPANSION = %d; this worker's"
                " setting (%d) does not apply to it, so that all workers grow it alike.%s",
                key,
                self.expansion,
                wanted.expansion,
                " It cannot grow: past its capacity its false-positive rate rises (reset it to"
                " create it growing)."
                if not self.expansion
                else "",
            )


#: The layout's word in a sizing request's text (:meth:`..sizing.Sizing.canonical`).
_BLOCKED_WORDS = ("blocked=True", "blocked=False")


def same_sizing(wanted: str, stored: str, blocked: bool) -> bool:
    """Tell whether a request's text asks for the stored one's (one naming no layout, either)."""
    said = [w for w in wanted.split() if w in _BLOCKED_WORDS]
    rest = [[w for w in text.split() if w not in _BLOCKED_WORDS] for text in (wanted, stored)]
    return rest[0] == rest[1] and (not said or said == [f"blocked={blocked!r}"])

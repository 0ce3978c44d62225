"""Choosing a filter's backend (``BLOOMFILTER_BACKEND``) and the interface both share.

``auto``: the record's backend, else native when every server has ``BF.*`` (and no
``BLOOMFILTER_BLOCKED = True``, ``BLOOMFILTER_BIT`` or ``BLOOMFILTER_HASH_NUMBER``: bitmap
layouts and geometry), else bitmap.
"""

from __future__ import annotations

import logging
from typing import Any

from scrapy_redis_bloom.core.errors import AccessDeniedError
from scrapy_redis_bloom.core.record import Backend, FilterRecord
from scrapy_redis_bloom.core.settings import BloomConfig
from scrapy_redis_bloom.engine.base import FilterBase
from scrapy_redis_bloom.engine.bitmap import shards as bitmap_shards
from scrapy_redis_bloom.engine.bitmap.filter import RedisBloomFilter
from scrapy_redis_bloom.engine.native import parts as native_parts
from scrapy_redis_bloom.engine.native.filter import NativeBloomFilter
from scrapy_redis_bloom.engine.parts import Parts

logger = logging.getLogger(__name__)

#: A filter of either backend, as the Scrapy layer's stats (``FilterStats``) use it.
BloomBackend = FilterBase


def delete(parts: Parts, record: FilterRecord) -> int:
    """Delete the filter ``record`` describes, by its backend; return how many keys deleted."""
    if record.backend == "native":
        return native_parts.delete(parts, record)
    return bitmap_shards.delete(parts, record)


def choose(native: NativeBloomFilter, config: BloomConfig) -> Backend:
    """Return the backend a filter uses: its record's, else per ``config.backend`` (said)."""
    record = native.parts.read_record()
    if record is not None:
        if config.backend == "auto":
            logger.info(
                "BLOOMFILTER_BACKEND = 'auto': the Bloom filter %r uses the %s backend, as its"
                " record says (it was created so).",
                native.key,
                record.backend,
            )
            if record.backend == "native" and config.bitmap_only:
                # A record an earlier release made from them: reserved by capacity and rate.
                logger.warning(
                    "%s %s not apply to the native Bloom filter %r: the server reserved its"
                    " shards for a capacity at an error rate (BF.RESERVE), with bits and hash"
                    " functions of its own (the startup line gives them). Leave %s unset, or"
                    " reset the filter to recreate it on bitmaps.",
                    " and ".join(config.bitmap_only),
                    "do" if config.bitmap_only[1:] else "does",
                    native.key,
                    " and ".join(config.bitmap_only),
                )
            return record.backend
        return config.backend
    if config.backend != "auto":
        return config.backend
    if config.sizing.blocked:  # asked for: a blocked filter is a bitmap layout
        logger.info(
            "BLOOMFILTER_BACKEND = 'auto' picks the bitmap backend for the Bloom filter %r:"
            " BLOOMFILTER_BLOCKED = True asks for a bitmap layout.",
            native.key,
        )
        return "bitmap"
    if config.bitmap_only:  # BF.RESERVE takes no bits nor k: they would not apply
        logger.info(
            "BLOOMFILTER_BACKEND = 'auto' picks the bitmap backend for the Bloom filter %r:"
            " %s %s a bitmap geometry (the servers' Bloom filters, BF.*, are sized by"
            " BLOOMFILTER_CAPACITY and BLOOMFILTER_ERROR_RATE).",
            native.key,
            " and ".join(config.bitmap_only),
            "give" if config.bitmap_only[1:] else "gives",
        )
        return "bitmap"
    if native.parts.existing([0]):  # a bitmap filter's shard 0: its record was lost
        logger.info(
            "BLOOMFILTER_BACKEND = 'auto' picks the bitmap backend for the Bloom filter %r: it"
            " has no config record, but a bitmap shard of it (%r) is there.",
            native.key,
            native.parts.shard_key(0),
        )
        return "bitmap"
    try:
        missing = native_parts.missing_bloom(native.executor, native.topology)
    except AccessDeniedError as exc:  # optional for the bitmaps: said, never taken for "none"
        logger.info(
            "BLOOMFILTER_BACKEND = 'auto' picks the bitmap backend for the Bloom filter %r: it"
            " cannot tell whether the servers have Bloom filter commands (BF.*). %s To say"
            " so, set BLOOMFILTER_BACKEND = 'bitmap'.",
            native.key,
            exc,
        )
        return "bitmap"
    servers = [node.address for node in native.topology.primaries()]
    if missing and len(missing) < len(servers):
        logger.warning(
            "BLOOMFILTER_BACKEND = 'auto' picks the bitmap backend for the Bloom filter %r:"
            " Redis at %s has Bloom filter commands (BF.*), but Redis at %s has none, and the"
            " native backend needs them on every server. Install %s there (or set"
            " BLOOMFILTER_BACKEND = 'bitmap' to say so).",
            native.key,
            ", ".join(address for address in servers if address not in missing),
            ", ".join(missing),
            native_parts.INSTALL_HINT,
        )
        return "bitmap"
    if missing:
        logger.info(
            "BLOOMFILTER_BACKEND = 'auto' picks the bitmap backend for the Bloom filter %r:"
            " Redis at %s has no Bloom filter commands (BF.*).",
            native.key,
            ", ".join(missing),
        )
        return "bitmap"
    logger.info(
        "BLOOMFILTER_BACKEND = 'auto' picks the native backend for the Bloom filter %r: every"
        " server has Bloom filter commands (BF.*).",
        native.key,
    )
    return "native"


def make_filter(
    client: Any, key: str, config: BloomConfig, **options: Any
) -> RedisBloomFilter | NativeBloomFilter:
    """Return the filter ``config`` asks for (``options``: the constructor's), not opened."""
    bloom: RedisBloomFilter | NativeBloomFilter | None = None
    if config.backend != "bitmap":
        native = NativeBloomFilter.from_config(client, key, config.for_native(), **options)
        try:
            if choose(native, config) == "native":
                bloom = native
        finally:
            if bloom is None:  # its connections are closed whatever went wrong
                native.close()
    if bloom is None:
        bloom = RedisBloomFilter.from_config(client, key, config, **options)
        bloom.lifecycle.fixed = None  # BLOOMFILTER_BACKEND chose it: the record check says so
    bloom.events.set("backend", bloom.backend)
    return bloom

"""scrapy-redis-bloom: a Bloom-filter dupefilter for scrapy-redis.

Activate it in a Scrapy project's settings.py::

    DUPEFILTER_CLASS = "scrapy_redis_bloom.dupefilter.RFPDupeFilter"
    BLOOMFILTER_CAPACITY = 1_000_000_000
    BLOOMFILTER_ERROR_RATE = 0.0001

The engine (:mod:`.engine`) and the configuration (:mod:`.config`) import without
Scrapy; ``RFPDupeFilter`` is loaded on first access.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from .config import BloomConfig, FaultPolicy
from .engine.events import FilterEvents
from .engine.filter import RedisBloomFilter
from .engine.lease import WorkerLease
from .engine.state import FilterState, FilterTotals
from .errors import (
    BloomFilterError,
    ConfigMismatchError,
    FilterDamagedError,
    FilterMissingError,
    FilterUnavailableError,
    NotEnoughMemoryError,
    OrphanedShardsError,
    ServerListMismatchError,
    UnsupportedServerError,
    WrongTypeError,
)
from .hashing import SCHEME_VERSION, FilterSpec

if TYPE_CHECKING:
    from .dupefilter import RFPDupeFilter

__version__ = version("scrapy-redis-bloom")

__all__ = [
    "SCHEME_VERSION",
    "BloomConfig",
    "BloomFilterError",
    "ConfigMismatchError",
    "FaultPolicy",
    "FilterDamagedError",
    "FilterEvents",
    "FilterMissingError",
    "FilterSpec",
    "FilterState",
    "FilterTotals",
    "FilterUnavailableError",
    "NotEnoughMemoryError",
    "OrphanedShardsError",
    "RFPDupeFilter",
    "RedisBloomFilter",
    "ServerListMismatchError",
    "UnsupportedServerError",
    "WorkerLease",
    "WrongTypeError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name == "RFPDupeFilter":
        from .dupefilter import RFPDupeFilter

        return RFPDupeFilter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

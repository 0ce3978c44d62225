"""scrapy-redis-bloom: a Bloom-filter dupefilter for scrapy-redis.

Activate it in a Scrapy project's settings.py, with the add-on (:class:`Addon`)::

    ADDONS = {"scrapy_redis_bloom.Addon": 100}
    BLOOMFILTER_CAPACITY = 1_000_000_000
    BLOOMFILTER_ERROR_RATE = 0.0001

(or ``DUPEFILTER_CLASS = "scrapy_redis_bloom.dupefilter.RFPDupeFilter"``). ``RFPDupeFilter``
is loaded on first access: the rest imports without Scrapy.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from scrapy_redis_bloom.core.errors import (
    AccessDeniedError,
    BloomFilterError,
    CertificateError,
    ConfigMismatchError,
    CredentialsRefusedError,
    FilterBusyError,
    FilterDamagedError,
    FilterMissingError,
    FilterUnavailableError,
    NotEnoughMemoryError,
    OrphanedShardsError,
    ServerListMismatchError,
    SettingError,
    UnsupportedServerError,
    WrongTypeError,
)
from scrapy_redis_bloom.core.events import FilterEvents, guard_loggers
from scrapy_redis_bloom.core.hashing import SCHEME_VERSION, FilterSpec
from scrapy_redis_bloom.core.settings import BloomConfig, FaultPolicy
from scrapy_redis_bloom.core.versions import UnsupportedVersionError
from scrapy_redis_bloom.engine.bitmap.filter import RedisBloomFilter
from scrapy_redis_bloom.engine.lease import WorkerLease
from scrapy_redis_bloom.engine.state import FilterState, FilterTotals
from scrapy_redis_bloom.ops.dump import dump_filter
from scrapy_redis_bloom.ops.dumpfile import DumpFileError
from scrapy_redis_bloom.ops.restore import FilterExistsError, RestoreFailedError, restore_filter
from scrapy_redis_bloom.scrapy.addon import Addon

if TYPE_CHECKING:
    from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter

__version__ = version("scrapy-redis-bloom")

guard_loggers()  # no log call of the package raises, whichever log handler fails

__all__ = [
    "SCHEME_VERSION",
    "AccessDeniedError",
    "Addon",
    "BloomConfig",
    "BloomFilterError",
    "CertificateError",
    "ConfigMismatchError",
    "CredentialsRefusedError",
    "DumpFileError",
    "FaultPolicy",
    "FilterBusyError",
    "FilterDamagedError",
    "FilterEvents",
    "FilterExistsError",
    "FilterMissingError",
    "FilterSpec",
    "FilterState",
    "FilterTotals",
    "FilterUnavailableError",
    "NotEnoughMemoryError",
    "OrphanedShardsError",
    "RFPDupeFilter",
    "RedisBloomFilter",
    "RestoreFailedError",
    "ServerListMismatchError",
    "SettingError",
    "UnsupportedServerError",
    "UnsupportedVersionError",
    "WorkerLease",
    "WrongTypeError",
    "__version__",
    "dump_filter",
    "restore_filter",
]


def __getattr__(name: str) -> Any:
    if name == "RFPDupeFilter":
        from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter

        return RFPDupeFilter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

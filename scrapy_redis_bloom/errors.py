"""Exceptions raised when the filter in Redis cannot be used as configured.

Bad settings raise plain :class:`ValueError` (Scrapy's convention for a component
with an invalid setting). The classes here cover what is found in Redis at run time:
a filter created with other parameters, or a key of the wrong type where the filter
lives. Each message says what was found and how to proceed.
"""

from __future__ import annotations


class BloomFilterError(RuntimeError):
    """Base class of the errors this package raises about the filter in Redis."""


class ConfigMismatchError(BloomFilterError):
    """The filter in Redis was created with other parameters than this worker's."""


class ServerListMismatchError(ConfigMismatchError):
    """The filter's servers are listed in another order or number than at creation."""


class WrongTypeError(BloomFilterError):
    """A key where the filter lives holds a value of another Redis type."""


class OrphanedShardsError(BloomFilterError):
    """Shard keys exist but the config record that describes their layout does not."""


class FilterMissingError(BloomFilterError):
    """The filter was to be opened without being created, and it does not exist."""

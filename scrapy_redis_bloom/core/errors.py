"""Exceptions raised when the filter in Redis cannot be used as configured.

Bad settings raise plain :class:`ValueError` (Scrapy's convention for a component
with an invalid setting). The classes here cover what is found in Redis at run time.
Each message says what was found, where (``host:port``, never a password) and how to
proceed.
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


class FilterUnavailableError(BloomFilterError):
    """Redis did not carry out an operation within ``BLOOMFILTER_RETRY_TIMEOUT``.

    ``operation`` names what the filter was doing, ``server`` where (``host:port``).
    """

    def __init__(self, message: str, operation: str = "", server: str = "") -> None:
        super().__init__(message)
        self.operation = operation
        self.server = server


class FilterDamagedError(BloomFilterError):
    """Part of the filter is gone: a shard evicted or deleted, a server emptied or replaced.

    Raised under ``BLOOMFILTER_ON_LOSS = "raise"``; the filter is never used with a
    part silently missing, since a lost shard answers "new" for URLs already crawled
    and a replaced one would mix two filters' bits.
    """


class NotEnoughMemoryError(BloomFilterError):
    """A server's ``maxmemory`` cannot hold the filter that is to be created on it."""


class UnsupportedServerError(BloomFilterError):
    """The server is older than the Redis version the filter needs."""


class AccessDeniedError(BloomFilterError):
    """A Redis ACL does not let the filter's user run a command it needs, or reach its keys.

    Raised at open by the permission check (:mod:`.engine.access`), which names every
    refused command and key pattern at once, and later when Redis refuses a command
    (for instance one inside the filter's scripts) of a user whose rights changed.
    ``server`` names where (``Redis at host:port``, never a password); ``commands``
    the refused commands by their ACL names (``time``, ``memory|usage``) and ``keys``
    the refused key patterns (``~KEY*``, ``~{KEY:*``), as far as they are known.
    """

    def __init__(
        self,
        message: str,
        server: str = "",
        commands: tuple[str, ...] = (),
        keys: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.server = server
        self.commands = commands
        self.keys = keys


class CredentialsRefusedError(AccessDeniedError):
    """Redis refused the filter's user name or password (``AUTH``): a setting to fix."""


class CertificateError(BloomFilterError):
    """The TLS handshake failed on a certificate: a setting to fix, not a fault to retry."""

"""Exceptions raised when the settings, or the filter in Redis, cannot be used.

Bad settings raise a :class:`ValueError` (Scrapy's convention), :class:`SettingError` where
the message names settings, as a :class:`Wording` so that each front end names them in its
own words. Messages say what was found, where (``host:port``, never a password), what to do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from string import Formatter


def setting_name(setting: str) -> str:
    """Name a setting as Scrapy users write it: unchanged (the default naming)."""
    return setting


class SettingName(str):
    """A setting's name given as a template's value: it is named as the settings are."""

    __slots__ = ()


#: The client's TLS files, named as one setting: the alias names its ``--tls-*`` options.
TLS_PARAMS = "ssl_ca_certs, ssl_certfile, ssl_keyfile in BLOOMFILTER_REDIS_PARAMS or REDIS_PARAMS"


class Wording:
    """A message whose settings are data, so that each front end names them in its words.

    A :meth:`str.format` template: ``{BLOOMFILTER_TTL}`` names a setting, ``{setting}`` /
    ``{settings}`` are the word for one or several; other fields are ``values``, formatted
    once (a ``{`` in a value is no field). ``str()`` is the message in Scrapy's words.
    """

    __slots__ = ("template", "values")

    def __init__(self, template: str, /, **values: object) -> None:
        self.template = template
        self.values: Mapping[str, object] = values

    @property
    def settings(self) -> tuple[str, ...]:
        """The settings the message names, in order, each once."""
        found: list[str] = []
        for _, field, _, _ in Formatter().parse(self.template):
            value = self.values.get(field or "")
            if field and field.startswith("BLOOMFILTER_"):
                found.append(field)
            elif isinstance(value, SettingName):
                found.append(str(value))
            elif isinstance(value, Wording):
                found += value.settings
        return tuple(dict.fromkeys(found))

    def render(self, name: Callable[[str], str] = setting_name, word: str = "setting") -> str:
        """Return the message, each setting named by ``name`` and called a ``word``."""
        fields: dict[str, object] = {"setting": word, "settings": word + "s"}
        for field, value in self.values.items():
            if isinstance(value, SettingName):
                value = name(value)
            elif isinstance(value, Wording):
                value = value.render(name, word)
            fields[field] = value
        for setting in self.settings:
            fields.setdefault(setting, name(setting))
        return self.template.format_map(fields)

    def __str__(self) -> str:
        return self.render()

    def __repr__(self) -> str:
        return f"Wording({self.template!r}, **{dict(self.values)!r})"


class WordedError(Exception):
    """An error whose message may be a :class:`Wording`, which :meth:`render` words anew."""

    wording: Wording | None = None

    def __init__(self, message: str | Wording = "", *args: object) -> None:
        if isinstance(message, Wording):
            self.wording = message
            message = message.render()
        super().__init__(message, *args)

    def render(self, name: Callable[[str], str] = setting_name, word: str = "setting") -> str:
        """Return the message, its settings named by ``name`` and called a ``word``."""
        return str(self) if self.wording is None else self.wording.render(name, word)


class SettingError(WordedError, ValueError):
    """A setting's value is bad: a :class:`ValueError`, as Scrapy's components raise."""


class BloomFilterError(WordedError, RuntimeError):
    """Base class of the errors this package raises about the filter in Redis."""


class ConfigMismatchError(BloomFilterError):
    """The filter in Redis was created with other parameters than this worker's."""


class ServerListMismatchError(ConfigMismatchError):
    """The filter's servers are listed in another order or number than at creation."""


class WrongTypeError(BloomFilterError):
    """A key where the filter lives holds a value of another Redis type."""


class OrphanedShardsError(BloomFilterError):
    """Shard keys exist but the config record that describes their layout does not."""


class FilterBusyError(BloomFilterError):
    """Workers hold live leases on a filter that is to be cleared, dumped or restored over."""


class FilterMissingError(BloomFilterError):
    """The filter was to be opened without being created, and it does not exist."""


class FilterUnavailableError(BloomFilterError):
    """Redis did not carry out ``operation`` at ``server`` within the retry timeout."""

    def __init__(self, message: str | Wording, operation: str = "", server: str = "") -> None:
        super().__init__(message)
        self.operation = operation
        self.server = server


def foreign_reply(what: str, key: str, exc: Exception) -> FilterUnavailableError:
    """Return the error for a reply not of its command's shape: what Redis did is unknown."""
    return FilterUnavailableError(
        f"Redis answered {what} on {key!r} with a reply that is not this command's ({exc});"
        " answering nothing from it."
    )


#: What taking apart a reply of another shape than expected raises.
SHAPE_ERRORS = (ValueError, TypeError, IndexError, KeyError, AttributeError)


@contextmanager
def taking_apart(operation: str, key: str) -> Iterator[None]:
    """Inside, a reply of another shape raises :func:`foreign_reply`; ours pass through."""
    try:
        yield
    except WordedError:
        raise
    except SHAPE_ERRORS as exc:
        raise foreign_reply(f"a call to {operation}", key, exc) from None


class FilterDamagedError(BloomFilterError):
    """Part of the filter is gone: a shard evicted or deleted, a server emptied or replaced.

    A lost shard would answer "new" for URLs already crawled, a replaced one mix two filters.
    """


class NotEnoughMemoryError(BloomFilterError):
    """A server's ``maxmemory`` cannot hold the filter that is to be created on it."""


class UnsupportedServerError(BloomFilterError):
    """The server cannot hold the filter: too old, a replica, or without a command it needs."""


class AccessDeniedError(BloomFilterError):
    """A Redis ACL does not let the filter's user run a command it needs, or reach its keys."""

    def __init__(
        self,
        message: str | Wording,
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

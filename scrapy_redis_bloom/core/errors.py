"""Exceptions raised when the filter in Redis cannot be used as configured.

Bad settings raise a :class:`ValueError` (Scrapy's convention for a component with
an invalid setting), :class:`SettingError` where the message names settings. The other
classes here cover what is found in Redis at run time.
Each message says what was found, where (``host:port``, never a password) and how to
proceed. A message that names settings is a :class:`Wording`, so that each front end
names them in its own words; ``str(exc)`` names them as Scrapy settings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from string import Formatter

#: The prefix of the setting names a template's fields may hold (``{BLOOMFILTER_TTL}``).
SETTING_PREFIX = "BLOOMFILTER_"


def setting_name(setting: str) -> str:
    """Name a setting as Scrapy users write it: unchanged (the default naming)."""
    return setting


class SettingName(str):
    """A setting's name given as a template's value: it is named as the settings are."""

    __slots__ = ()


class Wording:
    """A message whose settings are data, so that each front end names them in its words.

    ``template`` is a :meth:`str.format` template: a field named as a setting
    (``{BLOOMFILTER_RETRY_TIMEOUT}``) is the setting's name; ``{setting}`` and
    ``{settings}`` are the word for one or several settings; any other field is one of
    ``values``, formatted once (so a value holding ``{`` is never read as a field). A
    value that is a :class:`SettingName` is named as a setting; one that is a
    :class:`Wording` is rendered in the same words. Scrapy's words are the default:
    ``str()`` is the message as a Scrapy user reads it.
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
            if field and field.startswith(SETTING_PREFIX):
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
    """An error whose message may be a :class:`Wording`: front ends name its settings.

    ``str(exc)`` (and ``exc.args[0]``) is the message in Scrapy's words, as before;
    :meth:`render` words it otherwise (the ``scrapy-redis-bloom`` command names its
    options). ``wording`` is None for a message given as a plain string.
    """

    wording: Wording | None = None

    def __init__(self, message: str | Wording = "", *args: object) -> None:
        if isinstance(message, Wording):
            self.wording = message
            message = message.render()
        super().__init__(message, *args)

    def render(self, name: Callable[[str], str] = setting_name, word: str = "setting") -> str:
        """Return the message, its settings named by ``name`` and called a ``word``."""
        if self.wording is None:
            return str(self)
        return self.wording.render(name, word)


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


class FilterMissingError(BloomFilterError):
    """The filter was to be opened without being created, and it does not exist."""


class FilterUnavailableError(BloomFilterError):
    """Redis did not carry out an operation within ``BLOOMFILTER_RETRY_TIMEOUT``.

    ``operation`` names what the filter was doing, ``server`` where (``host:port``).
    """

    def __init__(self, message: str | Wording, operation: str = "", server: str = "") -> None:
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

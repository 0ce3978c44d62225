"""Keeping secrets out of messages: the one place that masks passwords.

Crawl logs and CLI output go to aggregators, tickets and chat: a message that may show a
setting's value, a URL or a client's arguments goes through :func:`masked` or :func:`scrub`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, unquote, urlsplit

#: Shown in place of a secret.
MASK = "***"

#: Parts of an argument's (or URL query parameter's) name that make its value a secret.
_SECRET_PARTS = ("pass", "pasw", "pwd", "secret", "token", "credential", "auth")


def is_secret(name: str) -> bool:
    """Tell whether a keyword argument named ``name`` holds a secret."""
    lowered = name.lower()
    return any(part in lowered for part in _SECRET_PARTS)


#: A run of text up to its last ``@``: where a URL's ``user:password@`` would end.
_BEFORE_AT = re.compile(r"[^\s'\"()\[\],]*@")
#: A scheme (``redis://``, or forgotten colon or slash: ``redis//``, ``redis:/``).
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*(?::/{1,2}|//)", re.IGNORECASE)


def _mask_credentials(found: re.Match[str]) -> str:
    """Mask from the first colon after the scheme to the ``@``: ``user:***@``."""
    before = found.group(0)[:-1]
    scheme = _SCHEME.match(before)
    colon = before.find(":", scheme.end() if scheme else 0)
    return found.group(0) if colon < 0 else f"{before[: colon + 1]}{MASK}@"


#: ``password=...`` (any name :func:`is_secret` would mask) in a URL's query.
_QUERY_PASSWORD = re.compile(
    rf"([?&][^=&\s]*(?:{'|'.join(_SECRET_PARTS)})[^=&\s]*=)[^&\s'\"]*", re.IGNORECASE
)


def url_secrets(url: str) -> list[str]:
    """Return the secrets a Redis URL (even malformed) carries, raw and decoded, longest first."""
    found: list[str] = []
    for run in _BEFORE_AT.finditer(url):  # parseable or not
        masked = _mask_credentials(run)
        if masked != run.group(0):
            found.append(run.group(0)[masked.index(MASK) : -1])
    try:
        parts = urlsplit(url)
        if parts.password:
            found += [parts.password, unquote(parts.password)]
        found += [value for name, value in parse_qsl(parts.query) if is_secret(name)]
    except ValueError:
        pass
    return sorted({secret for secret in found if secret}, key=len, reverse=True)


def mask_url(url: str) -> str:
    """Return a text with every URL password (and secret query parameter) masked."""
    text = _BEFORE_AT.sub(_mask_credentials, url)
    return _QUERY_PASSWORD.sub(rf"\1{MASK}", text)


def masked_value(value: object) -> object:
    """Return a setting's value with secrets masked: URLs, lists of them, kwargs dicts."""
    if isinstance(value, str):
        return mask_url(value)
    if isinstance(value, Mapping):
        return {str(k): MASK if is_secret(str(k)) else masked_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(masked_value(item) for item in value)
    return value


def masked(value: object) -> str:
    """Return ``repr(value)`` with secrets masked: for a setting's value in a message."""
    return repr(masked_value(value))


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """Remove the given secrets, and any URL password, from a message."""
    for secret in sorted(set(secrets) - {""}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return mask_url(text)

"""The oldest versions of the libraries the dupefilter runs with, checked when it is built.

pip enforces them at install time only: a lock file or ``--no-deps`` may bring older ones.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version

#: Distribution -> (its name for readers, oldest version): as pyproject.toml and the docs.
MINIMUMS: dict[str, tuple[str, tuple[int, ...]]] = {
    "scrapy": ("Scrapy", (2, 13)),
    "scrapy-redis": ("scrapy-redis", (0, 9)),
    "redis": ("redis-py", (7, 0)),
    "mmh3": ("mmh3", (4, 0)),
    "tqdm": ("tqdm", (4, 60)),
}

#: The ``numpy`` extra's minimum: an older numpy is not used (the bulk path does without).
NUMPY_MINIMUM = (1, 24)


class UnsupportedVersionError(ImportError):
    """An installed library is older than the oldest version this package supports."""


def parse_version(text: str) -> tuple[int, ...]:
    """Return the leading numeric release of a version string: ``"8.1.0b1"`` -> (8, 1, 0)."""
    found = re.match(r"\d+(?:\.\d+)*", text.strip())
    if found is None:
        raise ValueError(f"{text!r} is not a version number")
    return tuple(int(part) for part in found.group().split("."))


def check_versions(installed: Mapping[str, str]) -> None:
    """Refuse any library of ``installed`` below its minimum (a missing one fails on import)."""
    too_old, upgrades = [], []
    for dist, (name, minimum) in MINIMUMS.items():
        have = installed.get(dist)
        if have is not None and parse_version(have) < minimum:
            need = ".".join(map(str, minimum))
            too_old.append(f"{name} {have} is installed, and it needs {name} {need} or newer")
            upgrades.append(f'"{dist}>={need}"')
    if too_old:
        raise UnsupportedVersionError(
            f"scrapy-redis-bloom cannot run here: {'; '.join(too_old)}."
            f" Upgrade with: pip install {' '.join(upgrades)}"
        )


@functools.cache
def installed_versions() -> dict[str, str]:
    """Return the installed version of each library of :data:`MINIMUMS` that is installed."""
    found = {}
    for dist in MINIMUMS:
        with contextlib.suppress(PackageNotFoundError):
            found[dist] = version(dist)
    return found


def check_installed() -> None:
    """Refuse an installed library older than supported (see :func:`check_versions`)."""
    check_versions(installed_versions())

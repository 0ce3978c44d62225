"""What publishing needs: Read the Docs installs the docs group from docs/requirements.txt."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def group(name: str) -> set[str]:
    """Return a dependency group of pyproject.toml (included groups too), normalized."""
    groups: dict[str, list[Any]] = tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "dependency-groups"
    ]
    found: set[str] = set()
    for entry in groups[name]:
        if isinstance(entry, dict):
            found |= group(entry["include-group"])
        else:
            found.add(str(Requirement(entry)))
    return found


def requirements(path: Path) -> set[str]:
    """Return the requirements a requirements file lists, normalized."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {str(Requirement(line)) for line in lines if line}


def test_docs_requirements_are_the_docs_group() -> None:
    assert requirements(ROOT / "docs" / "requirements.txt") == group("docs")


def test_read_the_docs_installs_them_and_the_package() -> None:
    config = (ROOT / ".readthedocs.yaml").read_text()
    assert "- requirements: docs/requirements.txt\n" in config
    assert "- method: pip\n      path: .\n" in config
    assert "configuration: docs/conf.py\n" in config
    assert "fail_on_warning: true\n" in config

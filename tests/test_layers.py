"""The package's layers point down only (docs/architecture.md), and no import circles.

From the top: the operations commands (``cli``), the Scrapy glue (``scrapy``), the
operations on whole filters (``ops``), the engine (``engine``: its shared modules above
the two backends, ``engine.bitmap`` and ``engine.native``, which never import each
other), then the Redis transport (``transport``) and the pure core (``core``) at the
bottom. The modules at the package's root are its public import paths, free to import
anything; nothing inside imports them. Nothing below the Scrapy glue (``transport``,
``engine``, ``core``, ``ops``) imports Scrapy or scrapy-redis, not even lazily.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "scrapy_redis_bloom"
NAME = "scrapy_redis_bloom"

#: Layer of each folder, higher imports lower only. ``engine`` (its shared modules) sits
#: above its backends; ``engine.backend`` chooses between them, so it is a layer of its own.
RANKS = {
    "cli": 70,
    "scrapy": 60,
    "ops": 50,
    "engine.backend": 45,
    "engine": 40,
    "engine.bitmap": 30,
    "engine.native": 30,
    "engine.shared": 20,
    "transport": 10,
    "core": 0,
}
#: The engine's modules that both backends build on (the filter base and its bookkeeping).
SHARED = {"base", "cache", "counters", "lease", "parts", "scripts", "state", "checks", "lifecycle"}
SHARED |= {"health", "access", "clock"}


FILES = sorted(PACKAGE.rglob("*.py"))


def module_of(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_of(p) for p in FILES}
PACKAGES = {f"{module_of(p)}.__init__" for p in FILES if p.name == "__init__.py"}


def layer(module: str) -> str | None:
    """Return the layer of a package module, or None for the public modules at the root."""
    parts = module.split(".")[1:]
    if not parts or (len(parts) == 1 and f"{module}.__init__" not in PACKAGES):
        return None
    if parts[0] == "engine" and len(parts) > 1:
        if parts[1] in ("bitmap", "native"):
            return f"engine.{parts[1]}"
        if parts[1] == "backend":
            return "engine.backend"
        if parts[1] in SHARED:
            return "engine.shared"
        return "engine"
    return parts[0]


def imports(path: Path) -> set[str]:
    """Return the package modules a file imports (at import time or inside functions)."""
    found = set()
    this = module_of(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = this.split(".")[: -node.level if path.name != "__init__.py" else None]
                if path.name == "__init__.py" and node.level > 1:
                    base = base[: -(node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.startswith(NAME):
                submodules = {f"{target}.{alias.name}" for alias in node.names}
                # ``from package import module`` imports the module, not the package's names.
                found.update(submodules if submodules & MODULES else {target})
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(NAME))
    return {m for m in found if m in MODULES and m != this}


def test_every_module_has_a_layer() -> None:
    unknown = {module_of(p) for p in FILES if layer(module_of(p)) not in (None, *RANKS)}
    assert not unknown


@pytest.mark.parametrize("path", FILES, ids=lambda p: module_of(p))
def test_imports_point_down(path: Path) -> None:
    this = layer(module_of(path))
    if this is None:
        return  # the public modules at the root re-export from below
    upward = []
    for target in imports(path):
        other = layer(target)
        if other is None:
            upward.append(f"{target} (a public module at the root)")
        elif RANKS[other] > RANKS[this] or (
            other != this and RANKS[other] == RANKS[this] and other.startswith("engine.")
        ):
            upward.append(f"{target} ({other} is not below {this})")
    assert not upward, f"{module_of(path)} imports upward: {upward}"


def test_no_import_circles() -> None:
    graph = {module_of(p): imports(p) for p in FILES}
    # Only imports at module level make circles; those inside functions are lazy on purpose.
    eager = {}
    for path in FILES:
        this = module_of(path)
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        module = ast.Module(body=top, type_ignores=[])
        names = set()
        for node in ast.walk(module):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(NAME):
                submodules = {f"{node.module}.{a.name}" for a in node.names}
                names.update(submodules if submodules & MODULES else {node.module or ""})
        eager[this] = {m for m in names if m in graph and m != this}
    state: dict[str, int] = {}
    circle: list[str] = []

    def visit(module: str, stack: list[str]) -> bool:
        state[module] = 1
        for target in sorted(eager[module]):
            if state.get(target) == 1:
                circle.extend([*stack[stack.index(target) :], target])
                return True
            if target not in state and visit(target, [*stack, target]):
                return True
        state[module] = 2
        return False

    for module in sorted(eager):
        if module not in state and visit(module, [module]):
            break
    assert not circle, " -> ".join(circle)


# -- Scrapy stays in the Scrapy layer ------------------------------------------------------

#: The layers below the Scrapy glue: none of them may import Scrapy or scrapy-redis.
BELOW_SCRAPY = ("transport", "engine", "core", "ops")
#: The distributions they must not import (a module of theirs, or the package itself).
SCRAPY_MODULES = ("scrapy", "scrapy_redis")


def is_scrapy(name: str) -> bool:
    """Tell whether a module name is Scrapy's or scrapy-redis's (not this package's)."""
    return name.split(".")[0] in SCRAPY_MODULES


def scrapy_imports(source: str) -> list[str]:
    """Return the Scrapy and scrapy-redis modules a source imports, with their lines.

    Every import counts: at module level or inside a function (a lazy import runs
    too), ``import x``, ``from x import y``, and ``importlib.import_module("x")`` or
    ``__import__("x")`` with a literal name.
    """
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if called in ("import_module", "__import__") and isinstance(first, ast.Constant):
                names = [str(first.value)]
        found += [(node.lineno, name) for name in names if is_scrapy(name)]
    return [f"{name} (line {line})" for line, name in sorted(found)]


def folder(path: Path) -> str:
    """Return the package folder a module is in (``engine``...); "" at the package's root."""
    parts = module_of(path).split(".")
    return parts[1] if len(parts) > 1 and f"{NAME}.{parts[1]}.__init__" in PACKAGES else ""


BELOW = [p for p in FILES if folder(p) in BELOW_SCRAPY]


def test_the_scan_sees_every_form_of_import() -> None:
    """The scan finds Scrapy in each form of import, and not in this package's names."""
    source = """
import scrapy
import scrapy_redis.connection as c
from scrapy.utils.misc import load_object
from scrapy_redis import defaults
import importlib
def lazy():
    from scrapy import Request
    importlib.import_module("scrapy_redis.stats")
    __import__("scrapy.http")
import scrapy_redis_bloom.core
from scrapy_redis_bloom.scrapy import stats
from . import scrapy
importlib.import_module("scrapy_redis_bloom.core")
"""
    assert scrapy_imports(source) == [
        "scrapy (line 2)",
        "scrapy_redis.connection (line 3)",
        "scrapy.utils.misc (line 4)",
        "scrapy_redis (line 5)",
        "scrapy (line 8)",
        "scrapy_redis.stats (line 9)",
        "scrapy.http (line 10)",
    ]


def test_the_layers_below_scrapy_are_found() -> None:
    assert {folder(p) for p in BELOW} == set(BELOW_SCRAPY)
    assert len(BELOW) > 40  # every module of theirs, not only the packages


@pytest.mark.parametrize("path", BELOW, ids=lambda p: module_of(p))
def test_no_scrapy_below_the_scrapy_layer(path: Path) -> None:
    """Nothing under transport/, engine/, core/ or ops/ imports Scrapy or scrapy-redis."""
    found = scrapy_imports(path.read_text())
    assert not found, f"{module_of(path)} imports {', '.join(found)}"

"""Sphinx configuration of the scrapy-redis-bloom documentation.

Build it with ``sphinx-build -W --keep-going -b html docs docs/_build/html`` (see
docs/README.md). The reference pages of settings, stats and commands are generated from
the code at build time by the ``srb_reference`` extension in ``docs/_ext``.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

project = "scrapy-redis-bloom"
author = "scrapy-redis-bloom developers"
release = metadata.version("scrapy-redis-bloom")
version = release
copyright = "scrapy-redis-bloom developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "srb_reference",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
# design/: drafts kept as a record, not published (their figures are superseded).
exclude_patterns = ["_build", "README.md", "reference/generated", "design"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = "scrapy-redis-bloom"
html_static_path = ["_static"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"

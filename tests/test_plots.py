"""``python bench/plots.py`` draws the docs' plots from the committed benchmark results."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLOTS = ("memory.png", "fpr.png", "redis_time.png", "crawl.png")


def test_plots_from_the_committed_results(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is in the bench and docs groups")
    env = {**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl")}
    done = subprocess.run(
        [sys.executable, "bench/plots.py", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for name in PLOTS:
        drawn = tmp_path / name
        assert drawn.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert (ROOT / "docs" / "_static" / "plots" / name).is_file(), f"{name} is not committed"

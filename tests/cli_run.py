"""Running the operations CLI in-process, as the CLI tests do."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from scrapy_redis_bloom.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the CLI; return its exit status, stdout and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    """Run the CLI with ``--json``; it must succeed; return what it printed."""
    code, out, err = run(capsys, *argv, "--json")
    assert (code, err) == (0, ""), err
    data: dict[str, Any] = json.loads(out)
    return data


def assert_one_line_error(err: str) -> None:
    """Check that an error is one line on stderr, never a traceback."""
    assert err.startswith("scrapy-redis-bloom: error: ")
    assert err.count("\n") == 1
    assert "Traceback" not in err


def write_lines(path: Path, lines: list[str]) -> str:
    """Write a file of lines; return its path."""
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def run_scrapy_bloom(
    capsys: pytest.CaptureFixture[str], settings: dict[str, Any], *argv: str
) -> tuple[int, str, str]:
    """Run ``scrapy bloom ARGV`` in-process with ``settings``; return its status and output.

    For its commands the alias has not (dump, restore), where a test reaches inside.
    """
    from scrapy.settings import Settings

    from scrapy_redis_bloom.cli import BloomCommand

    command = BloomCommand()
    command.settings = Settings(settings)
    parser = argparse.ArgumentParser()
    command.add_options(parser)
    opts = parser.parse_args(list(argv))
    command.process_options([], opts)
    command.run([], opts)
    out, err = capsys.readouterr()
    return int(command.exitcode), out, err

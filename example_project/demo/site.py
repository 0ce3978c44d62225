"""The demo website: generated, heavily interlinked pages served on 127.0.0.1.

``/page/<i>`` (``0 <= i < pages``) is a small HTML page whose links point mostly at pages
that many other pages link to as well: the home page, its neighbours, its parent and
children in a binary tree, a few "related" pages and itself (``#top``). A crawler that
follows every link is therefore offered each page about ten times, as in real crawls
where navigation links repeat on every page, and its dupefilter has to let exactly one
of those requests through. Every page is reachable from ``/page/0`` (through "next").

Everything is deterministic: the links of a page depend only on its number and the
number of pages. The server counts every request it answers, so the demo can check
that each page was fetched exactly once without trusting what the crawler reports.
"""

from __future__ import annotations

import collections
import re
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import urlsplit

_PAGE_PATH = re.compile(r"/page/(0|[1-9][0-9]*)")

_WORDS = (
    "bloom",
    "filter",
    "redis",
    "shard",
    "bitmap",
    "crawler",
    "queue",
    "worker",
    "request",
    "fingerprint",
    "spider",
    "scheduler",
)


class Site:
    """The structure of the site: how many pages it has and where each one links."""

    def __init__(self, pages: int = 500) -> None:
        if pages < 1:
            raise ValueError(f"a site needs at least one page, got {pages}")
        self.pages = pages

    def links(self, page: int) -> list[str]:
        """Return the hrefs on ``page``, in document order, repeats included."""
        n = self.pages
        targets = [
            0,  # home (navigation bar)
            page - 1,  # previous
            page + 1,  # next: connects every page to the home page
            page // 2,  # parent
            2 * page + 1,  # children
            2 * page + 2,
            (7 * page + 3) % n,  # related pages
            (page * page + 1) % n,
            (page + n // 2) % n,
            0,  # home again (footer)
        ]
        hrefs = [f"/page/{target}" for target in targets if 0 <= target < n]
        hrefs.append(f"/page/{page}#top")  # same page: same request once canonicalized
        return hrefs

    def links_offered(self) -> int:
        """Return the number of links on all pages together, repeats included."""
        return sum(len(self.links(page)) for page in range(self.pages))

    def page_number(self, path: str) -> int | None:
        """Return the page a URL path names, or None if it is not one of the site's pages."""
        match = _PAGE_PATH.fullmatch(path)
        if match is None or int(match.group(1)) >= self.pages:
            return None
        return int(match.group(1))

    def render(self, page: int) -> str:
        """Return the HTML of a page."""
        words = " ".join(_WORDS[(page * 5 + i * 7) % len(_WORDS)] for i in range(12))
        items = "".join(
            f'<li><a href="{href}">{href.rsplit("/", 1)[-1]}</a></li>' for href in self.links(page)
        )
        return (
            "<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>Demo page {page}</title></head>"
            f'<body><h1 id="top">Demo page {page}</h1><p>{words}</p>'
            f"<ul>{items}</ul></body></html>"
        )


class _HTTPServer(ThreadingHTTPServer):
    """A threaded HTTP server whose listen backlog takes a crawler's burst of connections."""

    daemon_threads = True
    request_queue_size = 128


class SiteServer:
    """Serve a :class:`Site` from a daemon thread on 127.0.0.1, on a free port.

    Use it as a context manager. ``latency`` (seconds) delays every response, like a
    real web server's response time. The server counts the requests it answers per
    page (:meth:`page_hits`) and per other path (:meth:`other_hits`).
    """

    def __init__(self, site: Site, latency: float = 0.0) -> None:
        self.site = site
        self.latency = latency
        self._page_hits: collections.Counter[int] = collections.Counter()
        self._other_hits: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._first: float | None = None
        self._last: float | None = None
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Return the base URL of the running server, e.g. ``http://127.0.0.1:41234``."""
        if self._httpd is None:
            raise RuntimeError("the demo site is not being served")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def page_url(self, page: int) -> str:
        """Return the absolute URL of a page."""
        return f"{self.url}/page/{page}"

    def page_hits(self) -> collections.Counter[int]:
        """Return how many times each page was requested (pages never requested: absent)."""
        with self._lock:
            return collections.Counter(self._page_hits)

    def other_hits(self) -> collections.Counter[str]:
        """Return the requests for paths that are not pages of the site, per path."""
        with self._lock:
            return collections.Counter(self._other_hits)

    def served_between(self) -> tuple[float, float] | None:
        """Return when the first and the last request arrived (``time.monotonic()``)."""
        with self._lock:
            if self._first is None or self._last is None:
                return None
            return self._first, self._last

    def count(self, path: str) -> int | None:
        """Count one request for ``path``; return its page number, or None."""
        page = self.site.page_number(urlsplit(path).path)
        now = time.monotonic()
        with self._lock:
            if self._first is None:
                self._first = now
            self._last = now
            if page is None:
                self._other_hits[path] += 1
            else:
                self._page_hits[page] += 1
        return page

    def start(self) -> SiteServer:
        """Bind a free port on 127.0.0.1 and start serving."""
        self._httpd = _HTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="demo-site",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> SiteServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _handler_for(server: SiteServer) -> type[BaseHTTPRequestHandler]:
    """Build the request handler class of one :class:`SiteServer`."""

    class Handler(BaseHTTPRequestHandler):
        """Answer ``GET /page/<i>`` with the page, anything else with 404; count each request."""

        def do_GET(self) -> None:
            """Serve one page, after the server's latency."""
            page = server.count(self.path)
            if server.latency:
                time.sleep(server.latency)
            if page is None:
                self._send(HTTPStatus.NOT_FOUND, "<html><body>Not found</body></html>")
            else:
                self._send(HTTPStatus.OK, server.site.render(page))

        def _send(self, status: HTTPStatus, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            """Stay quiet: the server counts requests instead of logging each one."""

    return Handler

"""A generated website served by a real local HTTP server, for the crawl tests.

``/page/<i>`` (0 <= i < pages) links to a handful of other pages, chosen so that most
links point at pages already linked from elsewhere: a crawler that follows every link
offers each page many times, and its dupefilter must let exactly one of those through.
``/search?wd=<i>`` returns a small page without links. Everything is deterministic:
the links of a page depend only on its number and the number of pages.

The server also counts what it served, per path and query, so a test can check that
each page was downloaded exactly once independently of what the crawler reports.
"""

from __future__ import annotations

import collections
import html
import re
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from running import Running

_PAGE = re.compile(r"/page/(0|[1-9][0-9]*)")


class Site:
    """The site's structure: which pages exist and where each one links.

    ``pages`` is the number of pages; page ``i`` links to :meth:`links` ``(i)``.
    """

    def __init__(self, pages: int = 300) -> None:
        if pages < 1:
            raise ValueError(f"a site needs at least one page, got {pages}")
        self.pages = pages

    def links(self, page: int) -> list[int]:
        """Return the pages that ``page`` links to, in document order, repeats included.

        Neighbours, doubles, halves, the home page and the page itself: the link
        graph is connected through i -> i + 1, and most targets repeat across pages.
        """
        n = self.pages
        targets = [
            page + 1,
            2 * page,
            page // 2,
            0,
            (3 * page + 1) % n,
            (page + n // 2) % n,
            (page * page + 7) % n,
            page,
            0,
            page + 1,
        ]
        return [target for target in targets if 0 <= target < n]

    def reachable(self, start: int = 0) -> set[int]:
        """Return the pages reachable from ``start`` by following links (``start`` included)."""
        seen = {start}
        todo = [start]
        while todo:
            for target in self.links(todo.pop()):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    def links_offered(self, pages: set[int]) -> int:
        """Return the number of links found on ``pages``, repeats included."""
        return sum(len(self.links(page)) for page in pages)

    def render(self, page: int) -> str:
        """Return the HTML of a page."""
        items = "".join(
            f'<li><a href="/page/{target}">page {target}</a></li>' for target in self.links(page)
        )
        return (
            f"<!DOCTYPE html><html><head><title>Page {page}</title></head>"
            f"<body><h1>Page {page}</h1><ul>{items}</ul></body></html>"
        )


class TreeSite(Site):
    """A site where each page but the home page is linked from exactly one other page.

    Page ``i`` links to its children ``2i + 1`` and ``2i + 2``, and back to its parent,
    the home page and itself: links the crawler has seen before. A link the dupefilter
    wrongly drops loses the page it leads to, and every page below it, for good; on
    :class:`Site`, most pages are linked from several others and would survive. This
    is the site that counts lost pages.
    """

    def links(self, page: int) -> list[int]:
        """Return the children, then the parent, the home page and the page itself."""
        children = [child for child in (2 * page + 1, 2 * page + 2) if child < self.pages]
        return [*children, (page - 1) // 2 if page else 0, 0, page]


class _Server(ThreadingHTTPServer):
    """A threaded HTTP server whose listen backlog takes a crawler's burst of connections."""

    daemon_threads = True
    request_queue_size = 128


class SiteServer(Running):
    """A threaded ``http.server`` on 127.0.0.1, on a free port, serving a :class:`Site`.

    Use it as a context manager. ``url`` is the base URL (no trailing slash);
    ``hits`` counts the requests served per path (with its query string). ``delay``
    seconds of latency per response make a crawl last long enough to be shared.
    """

    def __init__(self, site: Site | None = None, delay: float = 0.0) -> None:
        self.site = site if site is not None else Site()
        self.delay = delay
        self.hits: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL of the running server, e.g. ``http://127.0.0.1:12345``."""
        if self._httpd is None:
            raise RuntimeError("the site server is not running")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def page_url(self, page: int) -> str:
        """Absolute URL of a page."""
        return f"{self.url}/page/{page}"

    def search_url(self, wd: int | str) -> str:
        """Absolute URL of a search result page."""
        return f"{self.url}/search?wd={wd}"

    def reachable_urls(self, start: int = 0) -> set[str]:
        """Absolute URLs of the pages reachable from page ``start``."""
        return {self.page_url(page) for page in self.site.reachable(start)}

    def hits_snapshot(self) -> collections.Counter[str]:
        """Return a copy of the per-path request counts."""
        with self._lock:
            return collections.Counter(self.hits)

    def _count(self, target: str) -> None:
        with self._lock:
            self.hits[target] += 1

    def start(self) -> SiteServer:
        """Bind a free port on 127.0.0.1 and serve from a daemon thread."""
        handler = _handler_for(self)
        self._httpd = _Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="site-server",
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


def _handler_for(server: SiteServer) -> type[BaseHTTPRequestHandler]:
    """Build the request handler class bound to one :class:`SiteServer`."""
    site = server.site

    class Handler(BaseHTTPRequestHandler):
        """Serve ``/page/<i>`` and ``/search?wd=<i>``; 404 for anything else."""

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            server._count(self.path)
            if server.delay:
                time.sleep(server.delay)
            match = _PAGE.fullmatch(parts.path)
            if match and int(match.group(1)) < site.pages:
                self._send(HTTPStatus.OK, site.render(int(match.group(1))))
            elif parts.path == "/search":
                words = parse_qs(parts.query).get("wd", [""])
                word = html.escape(words[0])
                self._send(
                    HTTPStatus.OK,
                    f"<!DOCTYPE html><html><head><title>Search {word}</title></head>"
                    f"<body><p>Results for {word}</p></body></html>",
                )
            else:
                self._send(HTTPStatus.NOT_FOUND, "<html><body>Not found</body></html>")

        def _send(self, status: HTTPStatus, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            """Keep the test output quiet: the server counts hits instead of logging."""

    return Handler

"""A partner's webhook endpoint, played by a tiny HTTP server on 127.0.0.1.

It starts down (every call gets HTTP 503) and is healthy from ``fix()`` on.
It counts what it received:
refused calls, and accepted deliveries by job id (the ``Idempotency-Key``)
and by order, so the demo can check that every order reached the partner.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATH = "/webhooks/orders"


class PartnerServer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._up = False
        #: calls answered with 503
        self.refused = 0
        #: accepted deliveries per job id; more than 1 means a duplicate delivery
        self.by_job: Counter[str] = Counter()
        #: orders the partner has heard about
        self.orders: set[str] = set()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="demo-partner",
            daemon=True,
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{PATH}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    # -- health ----------------------------------------------------------------

    def fix(self) -> None:
        """The partner is healthy from now on."""
        with self._lock:
            self._up = True

    @property
    def up(self) -> bool:
        with self._lock:
            return self._up

    @property
    def deliveries(self) -> int:
        with self._lock:
            return sum(self.by_job.values())

    # -- one call --------------------------------------------------------------

    def handle(self, job_id: str, body: bytes) -> int:
        """The status code for one call (and count it)."""
        with self._lock:
            if not self._up:
                self.refused += 1
                return 503
        try:
            order_id = str(json.loads(body)["order_id"])
        except (ValueError, KeyError, TypeError):
            return 400
        with self._lock:
            self.by_job[job_id] += 1
            self.orders.add(order_id)
        return 200


def _handler(partner: PartnerServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if self.path != PATH:
                code = 404
            else:
                code = partner.handle(self.headers.get("Idempotency-Key") or "", body)
            self.send_response(code)
            if code == 503:
                self.send_header("Retry-After", "1")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: the demo reports counts instead

    return Handler

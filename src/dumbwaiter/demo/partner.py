"""A partner's webhook receiver, played by a tiny HTTP server on 127.0.0.1.

It does what the docs ask of a receiver: it checks each request with
``dumbwaiter.webhooks.verify`` (signature and timestamp) before reading the
body, and de-duplicates on ``webhook-id``.  It has two faults, as partners
do: it starts down (every call gets HTTP 503 with ``Retry-After: 1``) until
``come_back()``, and its catalog lacks the shop's newest product, so an
order of it gets HTTP 422 until ``update_catalog()``.  The first trips the
sender's circuit breaker; the second does not (the partner is up), so those
deliveries use their attempts and die, to be replayed.  It counts what it
received, so the demo can check that every order reached the partner,
signed, and say how many arrived twice.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..webhooks import WebhookVerificationError, verify

PATH = "/webhooks/orders"
#: the shop's newest product, missing from the partner's catalog at first
NEW_PRODUCT = "gift-card"


class PartnerServer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._up = False
        self._catalog_updated = False
        #: calls answered with 422 (a product the partner does not know yet)
        self.unknown_product = 0
        #: the endpoint's secret (``set_secret``, once the endpoint is registered)
        self.secret = ""
        #: calls answered with 503, per webhook-id
        self.refused: Counter[str] = Counter()
        #: verified deliveries per webhook-id; more than 1 means a duplicate delivery
        self.by_webhook: Counter[str] = Counter()
        #: requests whose signature or timestamp did not verify (answered 400)
        self.bad_signatures = 0
        #: orders the partner has heard about
        self.orders: set[str] = set()
        #: the first verified request (headers, body), for the demo to show
        self.sample: tuple[dict[str, str], bytes] | None = None
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

    def come_back(self) -> None:
        """The partner's endpoint is up from now on."""
        with self._lock:
            self._up = True

    def update_catalog(self) -> None:
        """The partner knows every product from now on."""
        with self._lock:
            self._catalog_updated = True

    @property
    def up(self) -> bool:
        with self._lock:
            return self._up

    @property
    def deliveries(self) -> int:
        with self._lock:
            return sum(self.by_webhook.values())

    def refused_calls(self) -> int:
        with self._lock:
            return sum(self.refused.values())

    def after_refusal(self) -> int:
        """Webhooks delivered after the partner had refused them at least once."""
        with self._lock:
            return sum(1 for w in self.by_webhook if w in self.refused)

    # -- one call --------------------------------------------------------------

    def handle(self, headers: dict[str, str], body: bytes) -> int:
        """The status code for one call (and count it)."""
        webhook_id = headers.get("webhook-id", "")
        with self._lock:
            if not self._up:
                self.refused[webhook_id] += 1
                return 503
        try:
            verify(self.secret, headers, body)
        except WebhookVerificationError:
            with self._lock:
                self.bad_signatures += 1
            return 400
        try:
            data = json.loads(body)["data"]
            order_id, product = str(data["order_id"]), str(data["product"])
        except (ValueError, KeyError, TypeError):
            return 400
        with self._lock:
            if product == NEW_PRODUCT and not self._catalog_updated:
                self.unknown_product += 1
                return 422
            self.by_webhook[webhook_id] += 1
            self.orders.add(order_id)
            if self.sample is None:
                self.sample = (headers, body)
        return 204


def _handler(partner: PartnerServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: one request per connection, closed after the answer.  (A
        # keep-alive receiver would leave the worker's pooled connections open at
        # its exit: the worker does not close the app's webhook client.)
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if self.path != PATH:
                code = 404
            else:
                headers = {k.lower(): v for k, v in self.headers.items()}
                code = partner.handle(headers, body)
            self.send_response(code)
            answer = b""
            if code == 503:
                self.send_header("Retry-After", "1")
            elif code == 422:
                answer = b'{"error": "unknown product: ' + NEW_PRODUCT.encode() + b'"}'
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: the demo reports counts instead

    return Handler

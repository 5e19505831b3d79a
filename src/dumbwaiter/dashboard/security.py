"""The dashboard's guard: who may look, and which requests may change things.

* **Without auth** the dashboard answers loopback clients only (127.0.0.0/8,
  ::1), whatever address it was bound to: a dashboard mounted in a public
  FastAPI app, or reached through a local reverse proxy (which passes the real
  client in ``X-Forwarded-For``), refuses the outside world with 403.
* **With auth** (``Auth(token=...)`` or ``Auth(username=, password=)``) every
  request must carry it: ``Authorization: Bearer TOKEN``, HTTP Basic, or the
  session cookie the sign-in form sets (an HMAC of the credentials, never the
  credentials).  A browser that has not signed in gets the sign-in form as a
  styled 401 page that shows nothing of the deployment (no broker, no
  queues, no navigation); scripts get a one-line 401.
* **CSRF**: every state change is a POST, and every POST must carry the token
  of the signed double-submit pattern: a random ``dw_csrf`` cookie
  (``SameSite=Strict``, ``HttpOnly``) and, in the form or the ``X-CSRF-Token``
  header, HMAC(secret, cookie).  A cross-site page can neither read the
  cookie nor forge the HMAC.  A POST whose ``Origin`` is another site is
  refused too.
* Every response gets a strict Content Security Policy (scripts and styles
  from the dashboard itself only), ``X-Frame-Options: DENY``, ``nosniff``,
  ``Referrer-Policy: same-origin`` and ``Cache-Control: no-store``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSRF_COOKIE = "dw_csrf"
SESSION_COOKIE = "dw_session"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]


@dataclass(frozen=True, slots=True)
class Auth:
    """How clients prove who they are: a bearer token, or HTTP Basic."""

    token: str | None = None
    username: str | None = None
    password: str | None = None

    def __post_init__(self) -> None:
        if self.token is not None and len(self.token) < 16:
            raise ValueError("the dashboard token must be at least 16 characters")
        if (self.username is None) != (self.password is None):
            raise ValueError("basic auth needs both a username and a password")

    @classmethod
    def basic(cls, spec: str) -> Auth:
        """``user:password``."""
        user, sep, password = spec.partition(":")
        if not sep or not user or not password:
            raise ValueError("basic auth is given as USER:PASSWORD")
        return cls(username=user, password=password)

    @property
    def configured(self) -> bool:
        return self.token is not None or self.username is not None

    @property
    def scheme(self) -> str:
        return "basic" if self.username is not None else "token"

    def session_value(self, secret: bytes) -> str:
        """The session cookie the sign-in form sets: proves the credentials were typed."""
        if self.username is not None:
            return _mac(secret, f"session:basic:{self.username}\x00{self.password}")
        return _mac(secret, "session:" + (self.token or ""))

    def signs_in(self, form: Any) -> bool:
        """Whether the sign-in form's fields are the credentials."""
        if self.token is not None:
            return _same(str(form.get("token") or ""), self.token)
        user, password = str(form.get("username") or ""), str(form.get("password") or "")
        ok_user = _same(user, self.username or "")
        ok_pass = _same(password, self.password or "")
        return ok_user and ok_pass and self.username is not None

    def check(self, request: Request, secret: bytes) -> bool:
        header = request.headers.get("authorization", "")
        kind, _, value = header.partition(" ")
        cookie = request.cookies.get(SESSION_COOKIE, "")
        if cookie and _same(cookie, self.session_value(secret)):
            return True
        if self.token is not None:
            return kind.lower() == "bearer" and _same(value.strip(), self.token)
        if self.username is not None and kind.lower() == "basic":
            try:
                decoded = base64.b64decode(value.strip(), validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                return False
            user, _, password = decoded.partition(":")
            ok_user = _same(user, self.username)
            ok_pass = _same(password, self.password or "")
            return ok_user and ok_pass
        return False


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def _mac(secret: bytes, value: str) -> str:
    return hmac.new(secret, value.encode(), hashlib.sha256).hexdigest()


def csrf_token(secret: bytes, seed: str) -> str:
    return _mac(secret, "csrf:" + seed)


def is_loopback(host: str | None) -> bool:
    """True for 127.0.0.0/8, ::1 (and ::ffff:127.x), and the name localhost."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


#: ``signin(base, csrf, scheme, next, failed)``: the sign-in page's HTML
SignIn = Callable[[str, str, str, str, bool], str]


class Guard:
    """ASGI middleware: loopback-or-auth, the CSRF cookie, security headers.

    The CSRF *check* is done by the POST handlers (``verify_csrf``), which
    read the form anyway; the guard gives every request its CSRF seed (the
    cookie, or a fresh one it sets on the response)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        auth: Auth | None,
        secret: bytes,
        signin: SignIn | None = None,
    ) -> None:
        self.app = app
        self.auth = auth if auth is not None and auth.configured else None
        self.secret = secret
        #: renders the sign-in page (the body of a browser's 401)
        self.signin = signin

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        base = scope.get("root_path", "")
        path = scope["path"][len(base) :] if scope["path"].startswith(base) else scope["path"]
        public = path.startswith("/static/") or path == "/login"
        seed = request.cookies.get(CSRF_COOKIE, "")
        fresh = not (16 <= len(seed) <= 128 and seed.isascii())
        if fresh:
            seed = secrets.token_urlsafe(32)
        csrf = csrf_token(self.secret, seed)
        scope.setdefault("state", {})["csrf"] = csrf
        refusal: Response | None = None
        if self.auth is None:
            client = request.client.host if request.client else None
            if not is_loopback(client):
                refusal = PlainTextResponse(
                    "403 Forbidden: this dashboard has no authentication configured, so it "
                    "answers loopback clients only. Start it with --token or --basic-auth "
                    "(or pass auth= to create_app) to serve other addresses.\n",
                    status_code=403,
                )
        elif not public and not self.auth.check(request, self.secret):
            refusal = self._challenge(request, base, path, csrf)
        cookie = _cookie(CSRF_COOKIE, seed, base or "/", request.url.scheme == "https")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += SECURITY_HEADERS
                if not any(k == b"cache-control" for k, _ in headers):
                    headers.append((b"cache-control", b"no-store"))
                if fresh:
                    headers.append((b"set-cookie", cookie))
                message = {**message, "headers": headers}
            await send(message)

        if refusal is not None:
            await refusal(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    def _challenge(self, request: Request, base: str, path: str, csrf: str) -> Response:
        """401: the sign-in page for a browser's GET, one line for the rest."""
        assert self.auth is not None
        if self.auth.scheme == "basic":
            challenge = 'Basic realm="dumbwaiter", charset="UTF-8"'
            text = "401 Unauthorized: send HTTP Basic credentials\n"
        else:
            challenge = 'Bearer realm="dumbwaiter"'
            text = "401 Unauthorized: send Authorization: Bearer TOKEN\n"
        headers = {"WWW-Authenticate": challenge}
        if (
            self.signin is not None
            and request.method == "GET"
            and "text/html" in request.headers.get("accept", "")
        ):
            query = request.url.query
            back = base + path + ("?" + query if query else "")
            page = self.signin(base, csrf, self.auth.scheme, back, False)
            return HTMLResponse(page, status_code=401, headers=headers)
        return PlainTextResponse(text, status_code=401, headers=headers)


def _cookie(name: str, value: str, path: str, secure: bool) -> bytes:
    c: SimpleCookie = SimpleCookie()
    c[name] = value
    c[name]["path"] = path
    c[name]["httponly"] = True
    c[name]["samesite"] = "Strict"
    if secure:
        c[name]["secure"] = True
    return c[name].OutputString().encode()


def session_cookie(auth: Auth, secret: bytes, path: str, secure: bool) -> str:
    return _cookie(SESSION_COOKIE, auth.session_value(secret), path, secure).decode()


def verify_csrf(request: Request, form: Any, secret: bytes) -> bool:
    """True if this POST carries the CSRF token of its cookie and comes from this site."""
    origin = request.headers.get("origin")
    if origin and origin != "null":
        if urlsplit(origin).netloc != request.headers.get("host", ""):
            return False
    seed = request.cookies.get(CSRF_COOKIE, "")
    if not seed:
        return False
    sent = request.headers.get(CSRF_HEADER) or (form.get(CSRF_FIELD) if form else None) or ""
    return isinstance(sent, str) and _same(sent, csrf_token(secret, seed))

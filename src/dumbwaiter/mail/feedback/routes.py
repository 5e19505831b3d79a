"""A Starlette route per provider, for the app's web server:

    from dumbwaiter.mail.feedback import feedback_route
    routes = [feedback_route(app, "postmark", "/hooks/postmark", basic_auth=("pm", secret))]

A route needs authentication, because whoever can post to it can put any
address on the suppression list: HTTP basic auth (SNS, SendGrid and
Postmark let the webhook URL carry ``user:password@``), and for Resend its
Svix signature (``secret="whsec_..."``).  ``allow_unauthenticated=True``
is for a route already behind authentication of your own.  The route
answers 200 with the number of events, 400 to a body that is not the
provider's, 401 to bad credentials, 413 to a body over 1 MiB; any other
failure (the broker unreachable) is a 500, and the provider retries.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...errors import ConfigurationError
from .base import FeedbackError, Parsed, SignatureError
from .receive import receive_postmark, receive_resend, receive_sendgrid, receive_ses

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from ...app import App

PROVIDERS = ("ses", "sendgrid", "postmark", "resend")
MAX_BODY = 1024 * 1024


def feedback_route(
    app: App,
    provider: str,
    path: str | None = None,
    *,
    basic_auth: tuple[str, str] | None = None,
    secret: str | None = None,
    topic_arns: Sequence[str] | None = None,
    confirm_subscriptions: bool = False,
    allow_unauthenticated: bool = False,
) -> Route:
    """A POST route at ``path`` (default ``/mail/feedback/<provider>``) that
    feeds ``provider``'s bounce and complaint webhooks to ``app``."""
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    if provider not in PROVIDERS:
        raise ConfigurationError(
            f"unknown mail provider {provider!r}; known: {', '.join(PROVIDERS)}"
        )
    if secret is not None and provider != "resend":
        raise ConfigurationError("secret= is Resend's (Svix) signing secret; use basic_auth= here")
    if basic_auth is None and secret is None and not allow_unauthenticated:
        raise ConfigurationError(
            f"the {provider} feedback route needs authentication: anyone who can post to it "
            "can suppress any address. Give basic_auth=(user, password)"
            + (" or secret='whsec_...'" if provider == "resend" else "")
            + ", or allow_unauthenticated=True behind authentication of your own"
        )

    async def receive(request: Request, body: bytes) -> Parsed:
        if provider == "ses":
            return await receive_ses(
                app, body, topic_arns=topic_arns, confirm_subscriptions=confirm_subscriptions
            )
        if provider == "sendgrid":
            return await receive_sendgrid(app, body)
        if provider == "postmark":
            return await receive_postmark(app, body)
        return await receive_resend(app, body, request.headers, secret=secret)

    async def endpoint(request: Request) -> Response:
        if basic_auth is not None and not _authorized(request, basic_auth):
            return JSONResponse(
                {"error": "unauthorized"},
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="mail feedback"'},
            )
        body = await _body(request)
        if body is None:
            return JSONResponse({"error": "body too large"}, status_code=413)
        try:
            parsed = await receive(request, body)
        except SignatureError as exc:
            return JSONResponse({"error": str(exc)}, status_code=401)
        except FeedbackError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse({"events": len(parsed.events)})

    return Route(path or f"/mail/feedback/{provider}", endpoint, methods=["POST"])


async def _body(request: Request) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _authorized(request: Any, expected: tuple[str, str]) -> bool:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return False
    ok_user = hmac.compare_digest(user.encode(), expected[0].encode())
    ok_password = hmac.compare_digest(password.encode(), expected[1].encode())
    return ok_user and ok_password

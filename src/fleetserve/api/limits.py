"""Bounded input at the front door: request bodies and headers past a size cap are refused before any work.

A pure ASGI middleware (Starlette's style): it reads the declared `content-length` and counts the body as it
streams in, so a client cannot make a server buffer more than `max_body_bytes`, with or without a declared
length. Header bytes are counted from the parsed scope (the HTTP parser has already read them; this keeps
them out of everything after it). Refusals are OpenAI error JSON: 413 for the body, 431 for headers.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetserve.api.errors import APIError

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # a 128k-token prompt as text is about 0.5 MB; 4 MiB leaves room
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
# Idle keep-alive of our servers (uvicorn's default is 5 s): longer than a client pool's expiry (httpx: 5 s) and
# than any Retry-After we send, so a client never reuses a connection in the instant the server closes it
# (a request written into a closing connection gets no answer at all). 75 s, as nginx's default.
KEEP_ALIVE_S = 75
# From a request's first byte to its last: a client that sends its headers or body slower than this (a slowloris,
# a stalled upload) is answered 408 and closed. Before, a partial request held its connection for ever: the idle
# timer stops at the first byte. 60 s, as nginx's client_header_timeout and Node's headersTimeout.
REQUEST_READ_S = 60
# Longest a client may take no byte of its answer while we have bytes for it (its socket buffer full): past it
# the connection is cut and the request ends as the client's (499). A stream whose client stopped reading had
# held its replica slot, its queue place and its engine's sequence for as long as the socket stayed open: one
# tenant's idle readers starved the others, and kept a fleet from scaling to zero. 60 s, as nginx's send_timeout.
SEND_S = 60
# How often an engine's stream whose text is held back (incomplete UTF-8, a possible stop string) says it is alive
# with an SSE comment: the router's stream idle timeout had cut such a stream while it generated
STREAM_KEEPALIVE_S = 15.0


def stream_keepalive_s(silence_s: float) -> float:
    """The keep-alive of an engine behind a router that cuts a stream silent for `silence_s` (the shorter of its
    stream idle and upstream timeouts): a third of it, so one late comment is no cut."""
    return min(STREAM_KEEPALIVE_S, silence_s / 3)


@dataclass(frozen=True)
class SizeLimits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES


def engine_body_limit(max_body_bytes: int) -> int:
    """The body limit of an engine behind the router: twice the clients' limit, which the router enforces. The
    router adds to what it forwards (a tenant's cache_salt, a stream's include_usage) and may re-encode it: a
    request just under the limit got a 413 from the engine that it had passed at the router."""
    return 2 * max_body_bytes


def engine_header_limit(max_header_bytes: int) -> int:
    """Likewise for headers: the router adds its own (x-request-id, the tenant, x-forwarded-for, credentials), and
    headers just under the clients' limit got a 431 from the engine."""
    return 2 * max_header_bytes


class BodyTooLarge(APIError):
    """Raised from `receive` mid-body; handlers that catch APIError answer it like any bad request."""


class RequestSizeLimit:
    def __init__(self, app, limits: SizeLimits = SizeLimits()):
        self.app = app
        self.limits = limits

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limits = self.limits
        header_bytes = sum(len(k) + len(v) + 4 for k, v in scope.get("headers", ()))
        if header_bytes > limits.max_header_bytes:
            await send_error(send, APIError(
                431, f"request headers are {header_bytes} bytes; the limit is {limits.max_header_bytes} "
                     "(spec.requestLimits.maxHeaderBytes)", code="headers_too_large"))
            return
        declared = _content_length(scope)
        if declared is not None and declared > limits.max_body_bytes:
            await send_error(send, _body_error(declared, limits.max_body_bytes))
            return
        received = 0
        started = False

        async def counted_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limits.max_body_bytes:
                    raise _body_error(received, limits.max_body_bytes)
            return message

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracking_send)
        except BodyTooLarge as err:
            if not started:
                await send_error(send, err)


def _body_error(size: int, limit: int) -> BodyTooLarge:
    return BodyTooLarge(413, f"request body is at least {size} bytes; the limit is {limit} "
                             "(spec.requestLimits.maxBodyBytes)", code="request_too_large")


def _content_length(scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def send_error(send, error: APIError) -> None:
    """Answer an ASGI request with an OpenAI error before the app saw it (and close: the body may be unread)."""
    response = error.response()
    response.headers["connection"] = "close"
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})

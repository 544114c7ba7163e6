"""Serve an ASGI app (the control routes, router/admin.py) on the raw front door, one request at a time.

The subset of ASGI 3 that Starlette apps use for plain HTTP: the body in one `http.request` message, then
`http.disconnect` when the client goes; responses with or without `more_body`. No lifespan: the gateway
starts and stops its own parts.
"""

from __future__ import annotations

import asyncio

from fleetserve.router.http1 import Request, Responder


async def call_asgi(app, request: Request, responder: Responder, *, scheme: str, server: tuple[str, int],
                    extra_headers: list[tuple[bytes, bytes]] = ()) -> int:
    """Serve `request` with an ASGI app; `extra_headers` go on its answer. Returns the answer's status."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": request.http_version,
        "method": request.method,
        "scheme": scheme,
        "path": request.path,
        "raw_path": request.path.encode("latin-1"),
        "query_string": request.query,
        "root_path": "",
        "headers": request.headers,
        "client": request.client,
        "server": server,
    }
    delivered = False
    status = 500
    headers: list[tuple[bytes, bytes]] = []
    length: int | None = None

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await asyncio.shield(responder.disconnected())
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        nonlocal status, headers, length
        kind = message["type"]
        if kind == "http.response.start":
            status = message["status"]
            headers = []
            for k, v in message.get("headers", ()):
                k = bytes(k).lower()
                if k == b"content-length":
                    length = int(v)
                elif k not in (b"connection", b"transfer-encoding"):
                    headers.append((k, bytes(v)))
            headers.extend(extra_headers)
        elif kind == "http.response.body":
            body = message.get("body", b"")
            more = message.get("more_body", False)
            if not responder.started:
                if not more:
                    responder.send(status, headers, body)
                    return
                responder.start(status, headers, length)
            responder.write(body)
            await responder.drain()
            if not more:
                responder.end()

    await app(scope, receive, send)
    return status

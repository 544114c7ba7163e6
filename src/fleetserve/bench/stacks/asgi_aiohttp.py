"""A raw ASGI proxy with an aiohttp client: the app that stacks (b) uvicorn and (d) granian serve."""

from __future__ import annotations

import json
import os

import aiohttp

from fleetserve.bench.stacks.common import HEALTH, LeastLoaded

BACKENDS_ENV = "FLEETSERVE_STACK_BACKENDS"  # comma-separated, for servers that import the app by name
JSON_HEADERS = [(b"content-type", b"application/json")]


def build_app(backends: list[str]):
    lb = LeastLoaded(backends)
    session: aiohttp.ClientSession | None = None

    async def app(scope, receive, send):
        nonlocal session
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    if session is not None:
                        await session.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["method"] == "GET" and scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": JSON_HEADERS})
            await send({"type": "http.response.body", "body": HEALTH})
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        json.loads(body)
        if session is None:  # created on the server's own loop
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=75),
                                            auto_decompress=False)
        i = lb.acquire()
        try:
            async with session.post(lb.backends[i] + scope["path"], data=body,
                                    headers={"content-type": "application/json"}) as upstream:
                ctype = upstream.headers.get("content-type", "application/json").encode()
                await send({"type": "http.response.start", "status": upstream.status,
                            "headers": [(b"content-type", ctype)]})
                async for chunk in upstream.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
        finally:
            lb.release(i)

    return app


def app_from_env():
    return build_app([b for b in os.environ.get(BACKENDS_ENV, "").split(",") if b])

"""Stack (c): aiohttp's own server with an aiohttp client (one library, one event loop, uvloop)."""

from __future__ import annotations

import json

import aiohttp
from aiohttp import web

from fleetserve.bench.stacks.common import HEALTH, LeastLoaded, parse_args


def build_app(backends: list[str]) -> web.Application:
    lb = LeastLoaded(backends)
    app = web.Application()

    async def open_client(app: web.Application):
        app["client"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=75),
                                              auto_decompress=False)
        yield
        await app["client"].close()

    async def health(request: web.Request) -> web.Response:
        return web.Response(body=HEALTH, content_type="application/json")

    async def proxy(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        json.loads(body)
        i = lb.acquire()
        try:
            async with app["client"].post(lb.backends[i] + request.path, data=body,
                                          headers={"content-type": "application/json"}) as upstream:
                response = web.StreamResponse(status=upstream.status)
                response.content_type = upstream.content_type
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        finally:
            lb.release(i)

    app.cleanup_ctx.append(open_client)
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", proxy)
    app.router.add_post("/v1/completions", proxy)
    return app


def main(argv: list[str] | None = None) -> None:
    import uvloop

    args = parse_args(__doc__, argv)
    uvloop.install()
    web.run_app(build_app(args.backend), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()

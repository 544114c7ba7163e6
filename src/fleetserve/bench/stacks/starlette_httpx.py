"""Stack (a), today's gateway stack: Starlette on uvicorn (uvloop, httptools) with an httpx streaming client."""

from __future__ import annotations

import json

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from fleetserve.bench.stacks.common import HEALTH, LeastLoaded, parse_args


def build_app(backends: list[str]) -> Starlette:
    lb = LeastLoaded(backends)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=75)
    client = httpx.AsyncClient(limits=limits, timeout=30, trust_env=False)

    async def health(request: Request) -> Response:
        return Response(HEALTH, media_type="application/json")

    async def proxy(request: Request) -> Response:
        body = await request.body()
        json.loads(body)
        i = lb.acquire()
        try:
            upstream = await client.send(client.build_request(
                "POST", lb.backends[i] + request.url.path, content=body,
                headers={"content-type": "application/json"}), stream=True)
        except BaseException:
            lb.release(i)
            raise

        async def relay():
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()
                lb.release(i)

        return StreamingResponse(relay(), status_code=upstream.status_code,
                                 media_type=upstream.headers.get("content-type"))

    return Starlette(routes=[Route("/health", health), Route("/v1/chat/completions", proxy, methods=["POST"]),
                             Route("/v1/completions", proxy, methods=["POST"])])


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    args = parse_args(__doc__, argv)
    uvicorn.run(build_app(args.backend), host=args.host, port=args.port, loop="uvloop", http="httptools",
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()

"""Stack (b): a raw ASGI app (no framework) on uvicorn with uvloop and httptools, aiohttp as the client."""

from __future__ import annotations

from fleetserve.bench.stacks.asgi_aiohttp import build_app
from fleetserve.bench.stacks.common import parse_args


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    args = parse_args(__doc__, argv)
    uvicorn.run(build_app(args.backend), host=args.host, port=args.port, loop="uvloop", http="httptools",
                log_level="warning", access_log=False, lifespan="on")


if __name__ == "__main__":
    main()

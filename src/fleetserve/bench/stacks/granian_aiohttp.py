"""Stack (d): the raw ASGI app of stack (b) on granian (a Rust HTTP server), aiohttp as the client."""

from __future__ import annotations

import os

from fleetserve.bench.stacks.asgi_aiohttp import BACKENDS_ENV
from fleetserve.bench.stacks.common import parse_args


def main(argv: list[str] | None = None) -> None:
    from granian import Granian
    from granian.constants import HTTPModes, Interfaces, Loops

    args = parse_args(__doc__, argv)
    os.environ[BACKENDS_ENV] = ",".join(args.backend)  # the worker imports the app by name
    Granian("fleetserve.bench.stacks.asgi_aiohttp:app_from_env", address=args.host, port=args.port,
            interface=Interfaces.ASGI, factory=True, workers=1, loop=Loops.uvloop, http=HTTPModes.http1,
            log_enabled=False).serve()


if __name__ == "__main__":
    main()

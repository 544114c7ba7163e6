"""An engine's stop that ends its answers rather than cutting them.

uvicorn's graceful shutdown waits `timeout_graceful_shutdown` (the engine's `--drain-timeout`) for requests under
way, then cancels them: a stream still running was cut mid-answer (an unterminated chunked body: the client
cannot tell it from a network fault). `serve` runs uvicorn with one change: shortly before that deadline it calls
`before_cut` on the server's loop, which ends what still runs with an error the client can read (an error event
and `[DONE]` in a stream, a 503 otherwise); the cancel that follows then finds nothing left to cut.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

import uvicorn

CUT_MARGIN_S = 0.1  # before uvicorn's own deadline (which starts ~0.2 s after the signal): the last writes go out


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, before_cut: Callable[[], None]):
        super().__init__(config)
        self._before_cut = before_cut
        self._loop: asyncio.AbstractEventLoop | None = None
        self._armed = False

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig, frame) -> None:  # a signal handler: it only schedules
        super().handle_exit(sig, frame)
        grace = self.config.timeout_graceful_shutdown
        if self._loop is not None and not self._armed and grace is not None:  # None: uvicorn waits for ever
            self._armed = True
            self._loop.call_soon_threadsafe(self._loop.call_later, max(0.0, grace - CUT_MARGIN_S), self._before_cut)


def serve(app, before_cut: Callable[[], None], **config) -> None:
    """`uvicorn.run(app, **config)` for one process, with `before_cut` called a margin before the graceful
    shutdown's end (see the module's docstring). Exits 1 when the server did not start, as uvicorn.run does."""
    server = _Server(uvicorn.Config(app, **config), before_cut)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:
        sys.exit(1)

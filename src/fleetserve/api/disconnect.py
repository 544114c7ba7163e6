"""Client disconnects must cancel work: a streaming response and a waiter that both watch for them.

Starlette's StreamingResponse stops watching `http.disconnect` on ASGI 2.4 servers and only notices a gone
client on the next write; a generation that is still in prefill would run on. These helpers always watch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

T = TypeVar("T")


class ClientGone(Exception):
    """The client closed the connection before the answer was ready."""


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


# an event stream is never cached, and a proxy in front (nginx) must not buffer it: TTFT is the first event's
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class WatchedStreamingResponse(StreamingResponse):
    """Streams the body while watching for disconnect; on disconnect the body iterator is closed at once.

    `on_close` runs exactly once when the response ends for any reason, even if the body never started.
    """

    def __init__(self, *args, on_close: Callable[[], None] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stream = asyncio.ensure_future(self.stream_response(send))
        watch = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            done, _ = await asyncio.wait({stream, watch}, return_when=asyncio.FIRST_COMPLETED)
            if stream in done:
                stream.result()
        except OSError:
            pass  # the client went away while we wrote
        finally:
            for task in (stream, watch):
                task.cancel()
            await asyncio.gather(stream, watch, return_exceptions=True)
            close = getattr(self.body_iterator, "aclose", None)
            try:
                if close is not None:
                    await close()
            finally:
                if self._on_close is not None:
                    self._on_close()


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it and raising ClientGone if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        raise ClientGone()
    finally:
        for t in (task, watch):
            t.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)

"""The client's `x-request-id`, kept only when it is sane, and echoed on the answer.

A client that tags a request with an id finds it again in the answer and in every log line about it, with the
router in front (which sets its own when the client's is missing or not sane) and with an engine on its own.
An id of 1-128 visible ASCII characters is sane; any other is dropped at the engine's front door, so a
50,000-character id is neither echoed nor written into a log line (the engine's log then names the request by
its completion id, as without an id). The router drops an engine's echo: its own answer carries the id it set.
"""

from __future__ import annotations

import re

REQUEST_ID_HEADER = b"x-request-id"
SANE_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")


def sane_request_id(given: bytes | None) -> bytes | None:
    """`given` when it is a sane id, else None."""
    return given if given and SANE_REQUEST_ID.fullmatch(given) else None


class RequestIdEcho:
    """A pure ASGI middleware: an insane `x-request-id` is removed from the request, a sane one is sent back as
    a header of the answer, whatever answers it (the OpenAI API, an error of a middleware behind this one)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", [])
        given = [v for k, v in headers if k.lower() == REQUEST_ID_HEADER]
        if not given:
            await self.app(scope, receive, send)
            return
        rid = sane_request_id(given[0]) if len(given) == 1 else None  # two ids: which one is the client's?
        kept = [(k, v) for k, v in headers if k.lower() != REQUEST_ID_HEADER]
        if rid is None:
            await self.app({**scope, "headers": kept}, receive, send)
            return

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                out = [(k, v) for k, v in message.get("headers", []) if k.lower() != REQUEST_ID_HEADER]
                message = {**message, "headers": [*out, (REQUEST_ID_HEADER, rid)]}
            await send(message)

        await self.app({**scope, "headers": [*kept, (REQUEST_ID_HEADER, rid)]}, receive, send_with_id)

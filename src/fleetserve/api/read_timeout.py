"""An engine's HTTP connections answer 408 and close when a request does not arrive whole in time.

uvicorn bounds an idle keep-alive connection, not a request being read: its idle timer stops at the first byte,
so a client that sent half its headers (a slowloris) or part of its body held the connection for ever. The
router had the bound (`REQUEST_READ_S`, router/http1.py); an engine on its own had not, and on Kubernetes an
engine's port is reachable by any pod of the cluster. This protocol is uvicorn's httptools one with the
router's rule: from a request's first byte to its last, at most `read_timeout_s`, else a 408 in OpenAI's error
JSON and the connection closed. The time an earlier pipelined answer takes does not count against the next
request (its time starts again, whole, when that answer ends), and an app that takes long to answer a request read
whole is not cut. The app reading a body that stops arriving reads a disconnect (the engines log that request
as 408, as the client got it: `disconnect_status`); an app that began answering before it read the whole body has
its connection closed (the engines read the body first).
"""

from __future__ import annotations

import asyncio
import logging

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from fleetserve.api.errors import APIError
from fleetserve.api.limits import REQUEST_READ_S

log = logging.getLogger(__name__)


READ_TIMED_OUT = "fleetserve.read_timed_out"  # in a request's scope["extensions"] once the bound answered it


def disconnect_status(scope: dict) -> int:
    """The status a request whose client went away mid-body is logged with: 408 when the bound cut it (the client
    got that answer), else 499."""
    return 408 if (scope.get("extensions") or {}).get(READ_TIMED_OUT) else 499


def request_timeout_answer(read_timeout_s: float) -> bytes:
    err = APIError(408, f"the request did not arrive whole within {read_timeout_s:g}s; send its headers and body "
                        "without pauses", code="request_timeout")
    body = orjson.dumps(err.body())
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class ReadTimeoutProtocol(HttpToolsProtocol):
    read_timeout_s: float = REQUEST_READ_S

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._reading: asyncio.TimerHandle | None = None
        self._headers_done = False

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._headers_done = False
        self._stop_reading_timer()
        self._reading = self.loop.call_later(self.read_timeout_s, self._read_too_slow)

    def on_headers_complete(self) -> None:
        self._headers_done = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._stop_reading_timer()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._reading is not None and not self.transport.is_closing():  # a pipelined request waited for that
            # answer: its time starts now, whole
            self._reading.cancel()
            self._reading = self.loop.call_later(self.read_timeout_s, self._read_too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_reading_timer()
        super().connection_lost(exc)

    def _stop_reading_timer(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            self._reading = None

    def _read_too_slow(self) -> None:
        self._reading = None
        if self.transport is None or self.transport.is_closing():
            return
        cycle = self.cycle
        waiting_for_us = (self.pipeline or (not self._headers_done and cycle is not None and
                                            not cycle.response_complete)
                          or (self.flow is not None and self.flow.read_paused)
                          or (self._headers_done and cycle is not None and cycle.waiting_for_100_continue))
        if waiting_for_us:  # an earlier answer is under way, or uvicorn holds the body back until the app reads it
            # (64 KiB buffered, or `Expect: 100-continue` not answered yet): the client is not late, its time restarts
            self._reading = self.loop.call_later(self.read_timeout_s, self._read_too_slow)
            return
        if self._headers_done and cycle is not None:  # the app has the request and waits for the rest of its body
            cycle.scope.setdefault("extensions", {})[READ_TIMED_OUT] = True  # its request line says 408, not 499
            cycle.disconnected = True  # its answer is ours now: it reads a disconnect, and writes nothing more
            cycle.message_event.set()
            if cycle.response_started:  # it had answered before the body came whole (an early refusal; no
                log.warning("request from %s did not arrive whole within %gs, after it was answered: connection "
                            "closed", self.client and self.client[0], self.read_timeout_s)  # engine route streams)
                self.transport.close()
                return
        log.warning("request from %s did not arrive whole within %gs: answered 408", self.client and self.client[0],
                    self.read_timeout_s)
        self.transport.write(request_timeout_answer(self.read_timeout_s))
        self.transport.close()


def read_timeout_protocol(read_timeout_s: float) -> type[ReadTimeoutProtocol]:
    """The protocol class for uvicorn's `http` setting, bounding a request's arrival to `read_timeout_s`."""
    return type("ReadTimeoutProtocol", (ReadTimeoutProtocol,), {"read_timeout_s": read_timeout_s})

"""The engines' read bound (api/read_timeout.py) in virtual time: uvicorn's httptools protocol driven by hand on
a loop whose clock jumps, with a transport that records what was written. No sockets, no sleeps: the deadlines
are checked exactly (the end-to-end test, test_request_read_timeout.py, checks the wiring on real sockets)."""

from __future__ import annotations

import asyncio
import re

import uvicorn
from uvicorn.server import ServerState

from fleetserve.api.read_timeout import disconnect_status, read_timeout_protocol
from tests.virtual_loop import run_virtual

BOUND = 60.0
GONE: list[int] = []  # the status the app logs a request whose client it saw go away with


class Transport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.written, self.closed, self.paused = b"", False, False

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5555)}.get(name, default)

    def write(self, data):
        self.written += data

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True

    def pause_reading(self):
        self.paused = True

    def resume_reading(self):
        self.paused = False


async def app(scope, receive, send):
    """Reads its body after `wait` seconds (query), answers with its length after `slow` more."""
    if scope["type"] != "http":
        return
    query = dict(p.split("=") for p in scope["query_string"].decode().split("&") if p)
    await asyncio.sleep(float(query.get("wait", 0)))
    body, more = b"", True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            GONE.append(disconnect_status(scope))
            return
        body, more = body + message.get("body", b""), message.get("more_body", False)
    await asyncio.sleep(float(query.get("slow", 0)))
    text = str(len(body)).encode()
    length = [(b"content-length", str(len(text)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": length})
    await send({"type": "http.response.body", "body": text})


def connection():
    config = uvicorn.Config(app, http=read_timeout_protocol(BOUND), log_config=None, lifespan="off")
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={},
                                          _loop=asyncio.get_running_loop())
    transport = Transport()
    protocol.connection_made(transport)
    return protocol, transport


def statuses(transport) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", transport.written)]


def test_half_the_headers_then_silence_is_a_408_at_the_bound_not_before():
    async def main():
        protocol, transport = connection()
        protocol.data_received(b"POST /echo HTTP/1.1\r\nHost: x\r\ncontent-le")
        await asyncio.sleep(BOUND - 0.01)
        before = (transport.written, transport.closed)
        await asyncio.sleep(0.02)
        return before, transport

    before, transport = run_virtual(main())
    assert before == (b"", False)
    assert statuses(transport) == [408] and transport.closed and b'"code":"request_timeout"' in transport.written


def test_a_pipelined_request_has_its_whole_bound_once_the_answer_before_it_ends():
    """Re-armed while the first answer ran, the timer left the second request from 0 to the whole bound once that
    answer ended: the rest of its body, a moment later, got a 408 (found in review)."""
    async def main():
        protocol, transport = connection()
        slow = 2 * BOUND - 1  # the first answer ends 1 s before the re-armed timer would have fired
        protocol.data_received(f"POST /echo?slow={slow} HTTP/1.1\r\nHost: x\r\ncontent-length: 2\r\n\r\nhi".encode()
                               + b"POST /echo HTTP/1.1\r\nHost: x\r\ncontent-length: 4\r\n\r\nab")
        await asyncio.sleep(slow + 5)  # past the old deadline, well within the new one
        protocol.data_received(b"cd")
        await asyncio.sleep(1)
        return transport

    transport = run_virtual(main())
    assert statuses(transport) == [200, 200] and not transport.closed, transport.written


def test_a_client_waiting_for_100_continue_or_for_the_app_to_read_is_not_late():
    """uvicorn answers `Expect: 100-continue` only when the app first reads, and stops reading past 64 KiB the app
    has not read: a client doing nothing wrong got a 408 while an app was slow to read (found in review)."""
    async def main():
        protocol, transport = connection()
        protocol.data_received(f"POST /echo?wait={BOUND * 3} HTTP/1.1\r\nHost: x\r\nexpect: 100-continue\r\n"
                               "content-length: 4\r\n\r\n".encode())
        await asyncio.sleep(BOUND * 3 + 1)  # the app reads now: uvicorn says 100 Continue
        continued = b"100 Continue" in transport.written
        protocol.data_received(b"abcd")
        await asyncio.sleep(1)
        big, transport2 = connection()
        body = b"x" * (256 << 10)
        big.data_received(f"POST /echo?wait={BOUND * 3} HTTP/1.1\r\nHost: x\r\ncontent-length: {len(body)}\r\n\r\n"
                          .encode() + body[:128 << 10])  # past uvicorn's 64 KiB: it pauses reading
        paused = transport2.paused
        await asyncio.sleep(BOUND * 3 + 1)
        big.data_received(body[128 << 10:])  # the app reads: reading resumes, the rest comes at once
        await asyncio.sleep(1)
        return continued, transport, paused, transport2

    continued, transport, paused, transport2 = run_virtual(main())
    assert continued and statuses(transport) == [100, 200], transport.written
    assert paused and statuses(transport2) == [200] and transport2.written.endswith(str(256 << 10).encode())


def test_a_body_that_stops_arriving_is_a_408_the_app_logs_as_408():
    """The app reading the body saw a disconnect and logged 499, while the client got the bound's 408."""
    async def main():
        protocol, transport = connection()
        protocol.data_received(b"POST /echo HTTP/1.1\r\nHost: x\r\ncontent-length: 10\r\n\r\nabc")
        await asyncio.sleep(BOUND + 1)
        return transport

    GONE.clear()
    transport = run_virtual(main())
    assert statuses(transport) == [408] and transport.closed and GONE == [408]
    assert disconnect_status({"type": "http"}) == 499  # a client that left on its own

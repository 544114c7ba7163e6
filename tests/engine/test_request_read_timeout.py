"""An engine answers 408 and closes when a request does not arrive whole in time (api/read_timeout.py).

uvicorn's idle timer stops at a request's first byte: a client that sent half its headers or part of its body
held the engine's connection for ever. The server below is `api.graceful.serve`, as engines run it, with the
read bound cut to 2 s (60 s in engines); the deadlines themselves are checked exactly in virtual time
(test_read_timeout_virtual.py). An app that is slow to answer a request it has whole is not cut.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time

import orjson
import pytest

from fleetserve.fleet.process import free_port
from tests.helpers import wait_until

SERVER = textwrap.dedent("""
    import asyncio, sys
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from fleetserve.api import graceful
    from fleetserve.api.graceful import bind_port, serve
    from fleetserve.observe.logs import configure_logging

    async def echo(request: Request):
        body = await request.body()
        await asyncio.sleep(float(request.query_params.get("slow", 0)))  # answering is not reading
        return JSONResponse({"got": len(body)})

    configure_logging("text", "engine")
    graceful.REQUEST_READ_S = 2.0  # what every engine gets, at 60 s
    port = int(sys.argv[1])
    sock = bind_port("127.0.0.1", port)
    serve(Starlette(routes=[Route("/echo", echo, methods=["POST"])]), lambda: None, sock=sock, host="127.0.0.1",
          port=port, log_level="warning", timeout_graceful_shutdown=1)
""")


@pytest.fixture(scope="module")
def server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stderr=subprocess.PIPE, text=True)

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            return False

    try:
        wait_until(listening, 60, what="server")
        yield port
    finally:
        proc.kill()
        proc.wait()


def _read_all(sock: socket.socket, limit_s: float = 20) -> bytes:
    """Everything until the server closes (or `limit_s`, a bound for a broken server, not a timing claim)."""
    sock.settimeout(limit_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pass
    return data


def _answer(data: bytes) -> tuple[int, dict]:
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), orjson.loads(body)


def _one_answer(sock: socket.socket) -> bytes:
    """One answer on a kept-alive connection: its headers, then content-length bytes."""
    sock.settimeout(20)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head = data.partition(b"\r\n\r\n")[0].lower()
    length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
    while len(data.partition(b"\r\n\r\n")[2]) < length:
        data += sock.recv(65536)
    return data


@pytest.mark.parametrize("sent", [
    b"POST /echo HTTP/1.1\r\nHost: x\r\ncontent-le",  # half its headers
    b"POST /echo HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"a\": ",
])
def test_a_request_that_stops_arriving_is_answered_408_and_closed(server, sent):
    with socket.create_connection(("127.0.0.1", server)) as sock:
        sock.sendall(sent)
        data = _read_all(sock)
    status, body = _answer(data)
    assert status == 408 and body["error"]["code"] == "request_timeout", data
    assert b"connection: close" in data.lower()


def test_a_whole_request_is_not_cut_however_long_its_answer_takes_and_keep_alive_goes_on(server):
    with socket.create_connection(("127.0.0.1", server)) as sock:
        for query in ("?slow=4.5", ""):
            sock.sendall(b"POST /echo" + query.encode() + b" HTTP/1.1\r\nHost: x\r\ncontent-length: 2\r\n\r\nhi")
            data = _one_answer(sock)
            status, body = _answer(data)
            assert (status, body) == (200, {"got": 2}), data
            time.sleep(2.5)  # idle between requests is keep-alive's business, not the read bound's


def test_a_body_sent_in_pieces_within_the_bound_is_read_whole(server):
    with socket.create_connection(("127.0.0.1", server)) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\ncontent-length: 4\r\n\r\nab")
        time.sleep(0.2)
        sock.sendall(b"cd")
        status, body = _answer(_one_answer(sock))
    assert (status, body) == (200, {"got": 4})


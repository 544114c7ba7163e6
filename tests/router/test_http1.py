"""The gateway's front door on a real loopback socket: limits, pipelining, 100-continue, HTTP/1.0, disconnects."""

from __future__ import annotations

import asyncio
from resource import RLIM_INFINITY

import orjson
import pytest

from fleetserve.api.limits import SizeLimits
from fleetserve.router import http1


def error(responder, status, message, code):
    responder.send(status, [(b"content-type", b"application/json")],
                   orjson.dumps({"error": {"message": message, "code": code}}))


async def start(handler, limits=SizeLimits()):
    door = await http1.serve(handler, error, "127.0.0.1", 0, limits=limits)
    return door, door.server.sockets[0].getsockname()[1]


async def echo(request, responder):
    responder.send(200, [(b"x-path", request.path.encode())], request.body)


async def stream(request, responder):
    responder.start(200, [(b"content-type", b"text/event-stream")])
    for i in range(3):
        responder.write(b"data: %d\n\n" % i)
        await asyncio.sleep(0)
    responder.end()


def answered_after(release: asyncio.Event):
    """A handler whose answer waits for `release`: a request held under way."""
    async def handler(request, responder):
        await release.wait()
        responder.send(200, [], b"ok")

    return handler


async def exchange(port: int, data: bytes, read_until_close: bool = True) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    if read_until_close:
        out = await asyncio.wait_for(reader.read(), 10)
    else:
        out = await asyncio.wait_for(reader.read(65536), 10)
    writer.close()
    return out


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_pipelined_requests_are_answered_in_order_then_close():
    async def main():
        door, port = await start(echo)
        data = (b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nonePOST /b HTTP/1.1\r\nhost: x\r\n"
                b"content-length: 3\r\nconnection: close\r\n\r\ntwo")
        out = await exchange(port, data)
        await door.shutdown(1)
        return out

    out = run(main())
    assert out.index(b"x-path: /a") < out.index(b"one") < out.index(b"x-path: /b") < out.index(b"two")
    assert out.count(b"HTTP/1.1 200 OK") == 2 and b"connection: close" in out


def test_requests_before_a_malformed_one_in_the_same_packet_are_answered_then_the_error():
    """A valid request followed, in the same read, by garbage, an oversized body or headers got no answer at all:
    the stream was shut under the request being served ("Cannot call write() after write_eof()")."""
    limits = SizeLimits(max_body_bytes=1024, max_header_bytes=1024)

    async def slow_echo(request, responder):
        await asyncio.sleep(0.05)  # still serving when the bad bytes are parsed
        responder.send(200, [(b"x-path", request.path.encode())], request.body)

    async def main():
        door, port = await start(slow_echo, limits)
        good = b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\none"
        second = b"POST /b HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\ntwo"
        outs = [await exchange(port, good + tail) for tail in (
            b"GARBAGE\r\n\r\n", b"POST /c HTTP/1.1\r\nhost: x\r\ncontent-length: 999999\r\n\r\n",
            b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 2000 + b"\r\n\r\n", second + b"GARBAGE\r\n\r\n")]
        await door.shutdown(1)
        return outs

    garbage, too_large, headers, two_then_garbage = run(main())
    for out, status in ((garbage, b"400"), (too_large, b"413"), (headers, b"431"), (two_then_garbage, b"400")):
        assert out.startswith(b"HTTP/1.1 200 OK") and b"x-path: /a" in out and out.endswith(b"}"), out
        assert out.index(b"one") < out.index(b"HTTP/1.1 " + status), out
        assert b"connection: close" in out.split(b"HTTP/1.1 " + status)[1]
    assert two_then_garbage.index(b"x-path: /b") < two_then_garbage.index(b"HTTP/1.1 400")
    assert b"connection: close" not in garbage.split(b"HTTP/1.1 400")[0]  # the first answer kept the connection


def test_headers_and_bodies_past_the_limits_get_431_and_413_in_openai_shape():
    limits = SizeLimits(max_body_bytes=1024, max_header_bytes=1024)

    async def main():
        door, port = await start(echo, limits)
        big_header = await exchange(port, b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 2000 + b"\r\n\r\n")
        declared = await exchange(port, b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5000\r\n\r\n")
        chunk = b"400\r\n" + b"b" * 1024 + b"\r\n"
        chunked = await exchange(port, b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
                                       + chunk * 2 + b"0\r\n\r\n")
        await door.shutdown(1)
        return big_header, declared, chunked

    big_header, declared, chunked = run(main())
    assert big_header.startswith(b"HTTP/1.1 431") and b"headers_too_large" in big_header
    assert declared.startswith(b"HTTP/1.1 413") and b"maxBodyBytes" in declared
    assert chunked.startswith(b"HTTP/1.1 413") and b"request_too_large" in chunked


def test_expect_100_continue_is_answered_before_the_body():
    async def main():
        door, port = await start(echo)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n")
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.write(b"body")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        body = await reader.readexactly(4)
        writer.close()
        await door.shutdown(1)
        return interim, head, body

    interim, head, body = run(main())
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n" and head.startswith(b"HTTP/1.1 200") and body == b"body"


def test_a_stream_to_an_http10_client_is_not_chunked_and_ends_with_the_connection():
    async def main():
        door, port = await start(stream)
        out10 = await exchange(port, b"GET /s HTTP/1.0\r\n\r\n")
        out11 = await exchange(port, b"GET /s HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        await door.shutdown(1)
        return out10, out11

    out10, out11 = run(main())
    assert b"transfer-encoding" not in out10 and out10.endswith(b"data: 0\n\ndata: 1\n\ndata: 2\n\n")
    assert b"transfer-encoding: chunked" in out11 and out11.endswith(b"0\r\n\r\n")


def test_a_client_that_goes_away_cancels_its_request():
    cancelled = asyncio.Event()

    async def slow(request, responder):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def main():
        door, port = await start(slow)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.close()
        await asyncio.wait_for(cancelled.wait(), 5)
        await door.shutdown(1)

    run(main())
    assert cancelled.is_set()


def test_a_client_pipelining_without_end_is_held_in_its_socket_not_in_memory():
    release = asyncio.Event()
    held = answered_after(release)

    async def main():
        door, port = await start(held)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
        writer.write(request * 100)
        await asyncio.sleep(0.3)
        (conn,) = door.connections
        first = len(conn._queue)
        writer.write(request * 400)  # reading is paused: these wait in the socket
        await asyncio.sleep(0.3)
        waiting = len(conn._queue) - first
        release.set()
        answers = 0
        while answers < 500:
            answers += (await asyncio.wait_for(reader.readuntil(b"ok"), 10)).count(b"HTTP/1.1 200")
        writer.close()
        await door.shutdown(1)
        return waiting, answers

    waiting, answers = run(main())
    assert waiting == 0 and answers == 500


def test_a_request_that_trickles_in_is_answered_408_and_closed():
    """A connection with half its headers, or its body cut short, was held open for ever (the idle timer stops at
    a request's first byte): a slowloris held connections up to the file-descriptor limit."""
    async def main():
        door = await http1.serve(echo, error, "127.0.0.1", 0, read_timeout_s=0.3)
        port = door.server.sockets[0].getsockname()[1]
        partial_headers = await exchange(port, b"POST /a HTTP/1.1\r\nhost: x\r\nx-slow: ")
        partial_body = await exchange(port, b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n12345678")
        whole = await exchange(port, b"POST /b HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
        await door.shutdown(1)
        return partial_headers, partial_body, whole

    partial_headers, partial_body, whole = run(main())
    for out in (partial_headers, partial_body):
        assert out.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in out, out
    assert whole.startswith(b"HTTP/1.1 200") and whole.endswith(b"ok")


def test_a_trickling_request_behind_one_being_answered_lets_that_answer_out_first():
    """The read deadline fired while an earlier request was answered and closed the connection after it, dropping
    complete requests queued behind (reading paused by the front door itself looked like a slow client)."""
    async def slow(request, responder):
        await asyncio.sleep(0.6)
        responder.send(200, [(b"x-path", request.path.encode())], request.body)

    async def main():
        door = await http1.serve(slow, error, "127.0.0.1", 0, read_timeout_s=0.3)
        port = door.server.sockets[0].getsockname()[1]
        out = await exchange(port, b"POST /first HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\na"
                                   b"POST /second HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\nb"
                                   b"POST /third HTTP/1.1\r\nhost: x\r\nx-slow: ")
        await door.shutdown(1)
        return out

    out = run(main())
    assert out.index(b"x-path: /first") < out.index(b"x-path: /second") < out.index(b"HTTP/1.1 408")


def test_an_answer_finished_during_a_stop_says_connection_close():
    """A keep-alive client whose request was under way at the stop got its answer without `connection: close`,
    sent its next request on that connection, and found it closed under it: no answer at all."""
    release = asyncio.Event()
    slow = answered_after(release)

    async def main():
        door, port = await start(slow)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)  # the request is under way
        stopping = asyncio.create_task(door.shutdown(10))
        await asyncio.sleep(0.1)
        release.set()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        await stopping
        writer.close()
        return head

    head = run(main()).lower()
    assert head.startswith(b"http/1.1 200") and b"connection: close" in head, head


def test_a_status_outside_the_common_table_gets_its_standard_reason_phrase():
    from fleetserve.router.http1 import status_line

    assert status_line(303) == b"HTTP/1.1 303 See Other\r\n"  # the dashboard's login redirect read "303 Status"
    assert status_line(200) == b"HTTP/1.1 200 OK\r\n"
    assert status_line(599) == b"HTTP/1.1 599 Status\r\n"  # no standard phrase: still a valid status line


def test_a_request_sent_on_an_idle_connection_as_the_router_stops_is_answered():
    """`down` closed idle keep-alive connections at once: a client that had just written its next request on one
    got no answer at all (3 of 49 requests under load). They stay open briefly, answer with `connection: close`,
    and close."""
    async def main():
        door, port = await start(echo)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /first HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\na")
        await writer.drain()
        first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        await asyncio.wait_for(reader.readexactly(1), 10)
        stopping = asyncio.create_task(door.shutdown(5))
        await asyncio.sleep(0.1)  # the router is stopping; the idle connection is still open
        writer.write(b"POST /second HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\nb")
        await writer.drain()
        second = await asyncio.wait_for(reader.read(), 10)  # answered, then closed
        writer.close()
        await stopping
        return first, second

    first, second = run(main())
    assert b"x-path: /first" in first
    assert second.startswith(b"HTTP/1.1 200") and b"x-path: /second" in second  # and then closed (read to EOF)


def firehose_until_cancelled(ended: asyncio.Event):
    """A handler that streams as fast as the client takes it, and sets `ended` when its request is cut."""
    async def firehose(request, responder):
        responder.start(200, [(b"content-type", b"text/event-stream")])
        try:
            while True:
                responder.write(b"data: " + b"x" * 65536 + b"\n\n")
                await responder.drain()
        except asyncio.CancelledError:
            ended.set()
            raise

    return firehose


def small_window_stream(port: int):
    """A client socket with a 4 KiB receive buffer that has asked for the stream (it reads only if the test does)."""
    import socket

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
    return sock


def test_a_client_that_stops_reading_is_cut_and_its_request_ends():
    """A stream whose client took no bytes held its replica slot for as long as the socket stayed open: one
    tenant's idle readers starved the others (found in a black-box pass)."""
    ended = asyncio.Event()

    async def main():
        door = await http1.serve(firehose_until_cancelled(ended), error, "127.0.0.1", 0, send_timeout_s=0.5)
        sock = small_window_stream(door.server.sockets[0].getsockname()[1])  # and never reads
        await asyncio.wait_for(ended.wait(), 20)
        for _ in range(100):
            if not door.connections:
                break
            await asyncio.sleep(0.05)
        left = len(door.connections)
        sock.close()
        await door.shutdown(1)
        return left

    assert run(main()) == 0


def test_connections_past_the_limit_get_503_and_a_close_and_room_comes_back():
    """Connections that idle or dribble took every file descriptor, and then the router could reach no replica
    either; the clients got a reset and the log said nothing (found in a black-box pass)."""
    async def main():
        door = await http1.serve(echo, error, "127.0.0.1", 0, max_connections=3)
        port = door.server.sockets[0].getsockname()[1]
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        await asyncio.sleep(0.1)
        refused = await exchange(port, b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n")
        _, writer = held.pop()
        writer.close()
        for _ in range(100):
            if len(door.connections) < 3:
                break
            await asyncio.sleep(0.02)
        answered = await exchange(port, b"GET /y HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        for _, w in held:
            w.close()
        await door.shutdown(1)
        return refused, answered

    refused, answered = run(main())
    assert refused.startswith(b"HTTP/1.1 503") and b"too_many_connections" in refused, refused
    assert b"connection: close" in refused and b"retry-after: 1" in refused
    assert answered.startswith(b"HTTP/1.1 200") and b"x-path: /y" in answered


@pytest.mark.parametrize("soft, hard, asked, limit", [
    (1024, 1024, None, 768),  # a quarter kept for replica connections: `soft - 1024` had left 16
    (1024, 65536, None, 10_000),  # the soft limit raised to the hard one first
    (256, RLIM_INFINITY, 500, 500),  # an unlimited hard limit: raised to a finite one
    (20_000, 20_000, 50_000, 18_976),
])
def test_the_connection_limit_leaves_descriptors_for_the_replicas(monkeypatch, caplog, soft, hard, asked, limit):
    import resource

    from fleetserve.router import server

    limits = {"now": (soft, hard)}
    monkeypatch.setattr(resource, "getrlimit", lambda _: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", lambda _, value: limits.__setitem__("now", value))
    assert server.connection_limit(asked) == limit
    assert ("takes at most" in caplog.text) == (limit < (asked or server.DEFAULT_MAX_CONNECTIONS))


def test_a_client_that_reads_slowly_but_reads_is_not_cut():
    """The send timeout timed the whole wait for the buffer to drain, not the time since the client last took a
    byte: a reader slower than the buffer's low-water mark per timeout was cut while it read (found in review)."""
    ended = asyncio.Event()

    async def main():
        door = await http1.serve(firehose_until_cancelled(ended), error, "127.0.0.1", 0, send_timeout_s=0.5)
        sock = small_window_stream(door.server.sockets[0].getsockname()[1])
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        got = 0
        for _ in range(30):  # 3 s of 2 KiB every 0.1 s: far slower than the buffer drains per timeout
            got += len(await loop.sock_recv(sock, 2048))
            await asyncio.sleep(0.1)
        cut_while_reading = ended.is_set()
        await asyncio.wait_for(ended.wait(), 20)  # and once it stops reading, it is cut
        sock.close()
        await door.shutdown(1)
        return cut_while_reading, got

    cut_while_reading, got = run(main())
    assert not cut_while_reading and got > 0


def test_an_upgrade_or_connect_gets_one_answer_that_says_so():
    """A request with `Upgrade: h2c` (curl --http2 on http://) was served with its body unread ("request body is
    empty") and then answered a second, unrequested 400; a CONNECT got "`on_message_complete` callback error"."""
    async def main():
        door, port = await start(echo)
        upgrade = await exchange(port, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n"
                                       b"connection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\n"
                                       b"http2-settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
                                       b"content-length: 2\r\n\r\n{}")
        ws = await exchange(port, b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n"
                                  b"\r\nGET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        connect = await exchange(port, b"CONNECT 127.0.0.1:443 HTTP/1.1\r\nhost: 127.0.0.1:443\r\n\r\n")
        plain = await exchange(port, b"GET /a HTTP/1.1\r\nhost: x\r\nupgrade: h2c\r\nconnection: close\r\n\r\n")
        await door.shutdown(1)
        return upgrade, ws, connect, plain

    upgrade, ws, connect, plain = run(main())
    for out, protocol in ((upgrade, b"h2c"), (ws, b"websocket")):
        assert out.count(b"content-length:") == 1 and out.startswith(b"HTTP/1.1 400"), out  # one answer
        assert b"protocol upgrades are not supported (Upgrade: " + protocol + b")" in out, out
    assert connect.count(b"content-length:") == 1 and connect.startswith(b"HTTP/1.1 501"), connect
    assert b"CONNECT is not supported" in connect and b"callback" not in connect
    assert plain.startswith(b"HTTP/1.1 200") and b"x-path: /a" in plain  # Upgrade without Connection: upgrade


def test_a_transfer_coding_other_than_chunked_is_501_naming_it():
    """`Transfer-Encoding: gzip, chunked` was answered "request body is not valid JSON: 'utf-8' codec can't
    decode byte 0x8b": the parser undoes chunked only."""
    async def main():
        door, port = await start(echo)
        out = await exchange(port, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n"
                                   b"\r\n2\r\n{}\r\n0\r\n\r\n")
        fine = await exchange(port, b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close"
                                    b"\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
        await door.shutdown(1)
        return out, fine

    out, fine = run(main())
    assert out.startswith(b"HTTP/1.1 501") and b"transfer coding 'gzip' is not supported" in out, out
    assert fine.startswith(b"HTTP/1.1 200") and fine.endswith(b"{}")


def test_tls_agrees_on_http11_by_alpn(tmp_path):
    """A client offering h2 and http/1.1 got "server did not agree on a protocol"."""
    import ssl

    from fleetserve.router.server import server_tls
    from fleetserve.router.tls import ensure_self_signed

    cert, key = ensure_self_signed(tmp_path)

    async def main():
        door = await http1.serve(echo, error, "127.0.0.1", 0, limits=SizeLimits(),
                                 ssl=server_tls((str(cert), str(key))))
        port = door.server.sockets[0].getsockname()[1]
        client = ssl.create_default_context(cafile=str(cert))
        client.set_alpn_protocols(["h2", "http/1.1"])
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        agreed = writer.get_extra_info("ssl_object").selected_alpn_protocol()
        writer.write(b"GET /x HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        out = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        await door.shutdown(1)
        return agreed, out

    agreed, out = run(main())
    assert agreed == "http/1.1" and out.startswith(b"HTTP/1.1 200") and b"x-path: /x" in out

"""The gateway's pooled client against real loopback servers: reuse, concurrency, timeouts, cuts."""

from __future__ import annotations

import asyncio

import pytest

from fleetserve.router.upstream import Broken, Dropped, Timeout, Unreachable, Upstream

OK = b'{"ok": true}'


async def serve(behaviour) -> tuple[asyncio.base_events.Server, str]:
    """A raw HTTP/1.1 server on a free loopback port; `behaviour(reader, writer)` answers each connection."""
    server = await asyncio.start_server(behaviour, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


def answer(body: bytes = OK) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


async def keep_alive(reader, writer):
    while await read_request(reader) is not None:
        writer.write(answer())  # head and body in one segment: the answer completes in one read
        await writer.drain()
    writer.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_many_concurrent_requests_over_reused_connections_all_complete():
    # Regression: a short answer completed (and its connection went back to the pool and on to the next request)
    # before the first request's coroutine resumed, which then cleared the next request's header wait: it hung.
    async def main():
        server, url = await serve(keep_alive)
        client = Upstream(read_timeout=5)
        connects = 0
        connect = client._connect

        async def counting(origin):
            nonlocal connects
            connects += 1
            return await connect(origin)

        client._connect = counting

        async def one(i):
            for _ in range(20):
                response = await client.request(url, "POST", "/v1/completions", [(b"x-n", str(i).encode())], b"{}")
                assert response.status == 200 and await response.body() == OK
                response.close()

        await asyncio.gather(*(one(i) for i in range(32)))
        await client.aclose()
        server.close()
        return connects

    connects = run(main())
    assert connects <= 32 * 2  # connections are reused, not opened per request (640 requests)


def test_a_connection_the_server_closed_while_idle_is_replaced_without_an_error():
    async def once_then_close(reader, writer):
        await read_request(reader)
        writer.write(answer())
        await writer.drain()
        writer.close()  # the server ends keep-alive without saying so

    async def main():
        server, url = await serve(once_then_close)
        client = Upstream(read_timeout=5)
        for _ in range(3):
            response = await client.request(url, "GET", "/health")
            assert response.status == 200 and await response.body() == OK
            await asyncio.sleep(0.05)  # the close reaches us, or is about to
        await client.aclose()
        server.close()

    run(main())


def test_silence_is_a_timeout_and_a_cut_body_is_broken_and_a_closed_port_unreachable():
    async def silent(reader, writer):
        await read_request(reader)
        await asyncio.sleep(10)

    async def cut(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()

    async def main():
        client = Upstream(read_timeout=0.3, connect_timeout=1)
        server, url = await serve(silent)
        with pytest.raises(Timeout):
            await client.request(url, "POST", "/v1/completions", body=b"{}")
        server.close()
        server, url = await serve(cut)
        response = await client.request(url, "POST", "/v1/completions", body=b"{}")
        assert await response.read() == b"partial"
        with pytest.raises(Broken):
            await response.read()
        server.close()
        await server.wait_closed()
        with pytest.raises(Unreachable):
            await client.request(url, "GET", "/health")
        await client.aclose()

    run(main())


def test_a_replica_that_reads_the_request_and_closes_has_dropped_it_and_a_reused_connection_tries_once_more():
    """Connected and written, then closed with no answer: `Dropped`, not `Unreachable` (which takes the replica out).
    On a pooled connection that may be the idle close racing the request, so it goes once more on a fresh one."""
    seen = []

    async def answer_once_then_drop(reader, writer):
        while (request := await read_request(reader)) is not None:
            seen.append(request.split(b" ")[1])
            if b"poison" in request:
                writer.transport.abort()
                return
            writer.write(answer())
            await writer.drain()

    async def main():
        server, url = await serve(answer_once_then_drop)
        client = Upstream(read_timeout=5)
        with pytest.raises(Dropped):  # a fresh connection: sent once
            await client.request(url, "POST", "/poison", body=b"{}")
        assert seen == [b"/poison"]
        response = await client.request(url, "POST", "/ok", body=b"{}")
        assert await response.body() == OK  # its connection goes back to the pool
        with pytest.raises(Dropped):  # the pooled connection, then once on a fresh one
            await client.request(url, "POST", "/poison", body=b"{}")
        await client.aclose()
        server.close()

    run(main())
    assert seen == [b"/poison", b"/ok", b"/poison", b"/poison"]


def test_an_answer_that_ends_with_the_connection_is_complete_on_a_clean_close_and_broken_on_a_reset():
    """HTTP/1.1 lets a server end a body without length or chunking by closing: the gateway read such complete
    answers as failures (an SSE stream got [DONE] then an error event; a JSON body was cut)."""
    async def close_delimited(reader, writer):
        request = await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n" + OK)
        await writer.drain()
        if b"/reset" in request:  # a reset (SO_LINGER 0), not the FIN a killed process's socket sends
            import socket
            import struct

            writer.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                                 struct.pack("ii", 1, 0))
        writer.close()

    async def main():
        server, url = await serve(close_delimited)
        client = Upstream(read_timeout=5)
        response = await client.request(url, "POST", "/v1/completions", body=b"{}")
        assert response.content_length is None and await response.body() == OK and response.complete
        response = await client.request(url, "POST", "/reset", body=b"{}")
        with pytest.raises(Broken):
            while await response.read():
                pass
        await client.aclose()
        server.close()

    run(main())


def test_abandon_cuts_only_the_requests_a_replica_has_not_begun_to_answer():
    """A stalled replica (SIGSTOP, a hung GPU) held what it was sent until the read timeout, 30 minutes by default,
    after its probes had taken it out. `abandon` fails those with no body byte yet (Stalled); a stream under way
    is left alone."""
    from fleetserve.router.upstream import Stalled

    async def silent_or_streaming(reader, writer):
        request = await read_request(reader)
        if request is not None and b"/stream" in request:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                         b"9\r\ndata: 1\n\n\r\n")
            await writer.drain()
        await asyncio.sleep(30)  # then nothing more

    async def main():
        server, url = await serve(silent_or_streaming)
        client = Upstream(read_timeout=25)
        stream = await client.request(url, "POST", "/stream", [], b"{}")
        first = await stream.read()
        waiting = asyncio.ensure_future(client.request(url, "POST", "/v1/chat/completions", [], b"{}"))
        await asyncio.sleep(0.2)
        assert client.abandon(url, "the replica stopped answering its health checks") == 1
        assert client.abandon("http://127.0.0.1:9", "never used") == 0
        with pytest.raises(Stalled, match="stopped answering its health checks"):
            await waiting
        assert not stream._conn.closed  # the stream under way stays
        stream.close()
        await client.aclose()
        server.close()
        return first

    assert run(main()) == b"data: 1\n\n"


def test_once_an_answer_began_a_silence_longer_than_the_stream_idle_timeout_fails_its_read():
    """The read timeout (30 minutes by default) covers the wait for an answer's first byte, which for a long
    prompt or a non-streamed answer is long; between a stream's chunks a silence that long is a hung replica.
    A late first byte is no failure; a stream that stops mid-way fails within the idle timeout."""
    async def late_then_stalled(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()  # headers at once (as an SSE server sends them), the first event much later:
        await asyncio.sleep(2.5)  # longer than the idle timeout, before the body began
        writer.write(b"9\r\ndata: 1\n\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"9\r\ndata: 2\n\n\r\n")
        await writer.drain()
        await asyncio.sleep(30)  # then hung

    async def main():
        server, url = await serve(late_then_stalled)
        client = Upstream(read_timeout=60, stream_idle_timeout=1.5)  # 60 s: past run()'s 30 s limit
        assert client.between == 1.5 and Upstream(read_timeout=5, stream_idle_timeout=60).between == 5
        stream = await client.request(url, "POST", "/stream", [], b"{}")
        first = await stream.read()  # waited 2.5 s: the read timeout's
        second = await stream.read()
        with pytest.raises(Timeout, match="silent mid-answer"):
            await stream.read()
        stream.close()
        await client.aclose()
        server.close()
        return first + second

    assert run(main()) == b"data: 1\n\ndata: 2\n\n"


def _prover(secret: str | None, replay: bytes | None = None, close_after_proof: bool = False):
    """A server that answers /health with the HMAC of the challenge under `secret` (or replays `replay`), every
    other request with OK, and records what it received."""
    import json as json_module

    from fleetserve.engine.instance import proof

    received: list[bytes] = []

    async def behaviour(reader, writer):
        while (request := await read_request(reader)) is not None:
            received.append(request)
            if request.startswith(b"GET /health"):
                challenge = next((line.split(b":", 1)[1].strip().decode() for line in request.split(b"\r\n")
                                  if line.lower().startswith(b"x-fleetserve-challenge:")), "")
                body = replay if replay is not None else json_module.dumps(
                    {"status": "ok", **({"instance": proof(secret, challenge)} if secret else {})}).encode()
                writer.write(answer(body))
                await writer.drain()
                if close_after_proof:
                    break
                continue
            writer.write(answer())
            await writer.drain()
        writer.close()

    return behaviour, received


def test_a_fresh_connection_carries_a_request_only_after_the_replica_proves_its_secret():
    # A process that bound a crashed replica's port got what the router routed there until the supervisor's next
    # round (and the internal token with it): each fresh connection now proves the start first, on its own.
    from fleetserve.router.upstream import Impostor

    async def main():
        behaviour, received = _prover("right")
        server, url = await serve(behaviour)
        client = Upstream(read_timeout=5, headers={"authorization": "Bearer internal"})
        client.identity = lambda base: ("right", "/health") if base == url else None
        for _ in range(3):
            response = await client.request(url, "POST", "/v1/completions", body=b"{}")
            assert await response.body() == OK
        # one connection, proved once, then reused: the challenge went first and without the token
        assert [r.split(b"\r\n", 1)[0] for r in received] == [b"GET /health HTTP/1.1"] + [
            b"POST /v1/completions HTTP/1.1"] * 3
        assert b"authorization" not in received[0].lower() and b"x-fleetserve-challenge" in received[0]
        assert b"authorization: Bearer internal" in received[1]

        # a squatter replaying a proof it read earlier (for a challenge of its own) gets the challenge alone
        from fleetserve.engine.instance import proof

        replayed = b'{"status": "ok", "instance": "%s"}' % proof("right", "c0ffee").encode()
        behaviour, seen = _prover(None, replay=replayed)
        squat, squat_url = await serve(behaviour)
        client.identity = lambda base: ("right", "/health")
        with pytest.raises(Impostor) as caught:
            await client.request(squat_url, "POST", "/v1/completions", body=b"{}")
        assert caught.value.kind == "unreachable" and "another process" in str(caught.value)
        assert [r.split(b"\r\n", 1)[0] for r in seen] == [b"GET /health HTTP/1.1"]
        assert all(b"authorization" not in r.lower() for r in seen)
        assert not client.origin(squat_url).idle and not client.origin(squat_url).busy

        # one with no proof at all, and one that closes after proving: neither takes the request
        behaviour, seen = _prover(None)
        bare, bare_url = await serve(behaviour)
        with pytest.raises(Impostor):
            await client.request(bare_url, "POST", "/v1/completions", body=b"{}")
        behaviour, seen = _prover("right", close_after_proof=True)
        closing, closing_url = await serve(behaviour)
        with pytest.raises((Unreachable, Dropped)):  # closed before the request went, or under it
            await client.request(closing_url, "POST", "/v1/completions", body=b"{}")
        assert [r.split(b"\r\n", 1)[0] for r in seen] == [b"GET /health HTTP/1.1"]

        # no identity expected (vLLM, SGLang, a backend given by URL alone): no challenge
        behaviour, seen = _prover(None)
        plain, plain_url = await serve(behaviour)
        client.identity = lambda base: None
        assert await (await client.request(plain_url, "POST", "/v1/completions", body=b"{}")).body() == OK
        assert [r.split(b"\r\n", 1)[0] for r in seen] == [b"POST /v1/completions HTTP/1.1"]
        await client.aclose()
        for s in (server, squat, bare, closing, plain):
            s.close()

    run(main())



def test_a_challenge_answered_late_or_a_backend_moved_mid_connect_never_lets_a_request_through_unproved():
    """Found in review: (1) a challenge answered after the client's connect timeout had taken a working replica out
    as unreachable (a burst makes health answers late); it is `Unproven` now, which the dispatcher retries elsewhere
    without taking the replica out, and its wait is at least the probes'. (2) The identity was looked up after the
    connect: a supervisor's push that moved the backend meanwhile let the request, token included, go unproved."""
    from fleetserve.router.pool import BackendPool
    from fleetserve.router.upstream import Unproven

    async def main():
        behaviour, seen = _prover(None)  # proves nothing: an impostor, or a replica not answering its challenge
        server, url = await serve(behaviour)
        pool = BackendPool([url], timeout=0.2)
        pool.set_backends([url], instances={url: "secret"})
        client = Upstream(connect_timeout=0.1, read_timeout=5, headers={"authorization": "Bearer internal"})
        pool.client = client
        assert client.proof_timeout == 0.2  # the probes' wait, not the shorter connect timeout
        connect = client._connect

        async def moved_while_connecting(origin):
            conn = await connect(origin)
            pool.set_backends(["http://127.0.0.1:1"], instances={"http://127.0.0.1:1": "new"})
            return conn

        client._connect = moved_while_connecting
        with pytest.raises(Unreachable):
            await client.request(url, "POST", "/v1/completions", body=b"{}")
        assert [r.split(b"\r\n", 1)[0] for r in seen] == [b"GET /health HTTP/1.1"]  # the challenge alone
        client._connect = connect

        async def late(reader, writer):  # the challenge read, no answer within the wait
            await read_request(reader)
            await asyncio.sleep(1)
            writer.close()

        slow, slow_url = await serve(late)
        client.identity = lambda base: ("secret", "/health")
        with pytest.raises(Unproven):
            await client.request(slow_url, "POST", "/v1/completions", body=b"{}")
        for s in (server, slow):
            s.close()

    run(main())


def test_a_new_start_of_a_replica_closes_the_idle_connections_to_the_one_before():
    from fleetserve.router.pool import BackendPool

    async def main():
        behaviour, seen = _prover("first")
        server, url = await serve(behaviour)
        pool = BackendPool([url])
        pool.set_backends([url], instances={url: "first"})
        client = Upstream(read_timeout=5)
        pool.client = client
        await (await client.request(url, "POST", "/v1/completions", body=b"{}")).body()
        assert len(client.origin(url).idle) == 1
        pool.set_backends([url], instances={url: "second"})
        assert not client.origin(url).idle
        await client.aclose()
        server.close()

    run(main())


def test_a_proof_cut_short_never_leaves_an_unproved_connection_in_the_pool():
    """Found in review: a request cancelled while its challenge's answer came (the client left) let the answer
    complete later and the connection go to the idle pool unchecked: the next request, token included, went to
    the impostor. And a squatter answering HTTP/1.0 with `connection: close` was classed late, not wrong."""
    from fleetserve.router.upstream import Impostor

    async def slow_body(reader, writer):
        await read_request(reader)
        body = b'{"status": "ok"}'
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body))
        await writer.drain()
        await asyncio.sleep(0.3)  # the body after the client gave up
        writer.write(body)
        await writer.drain()
        while await read_request(reader) is not None:  # a request on it would be answered
            writer.write(answer())
            await writer.drain()
        writer.close()

    async def http10_squatter(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\ncontent-type: text/html\r\nconnection: close\r\n\r\n<html></html>")
        await writer.drain()
        writer.close()

    async def main():
        server, url = await serve(slow_body)
        client = Upstream(read_timeout=5)
        client.identity = lambda base: ("secret", "/health")
        task = asyncio.create_task(client.request(url, "POST", "/v1/completions", body=b"{}"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.5)  # the answer's body has come by now
        assert not client.origin(url).idle
        squat, squat_url = await serve(http10_squatter)
        with pytest.raises(Impostor):
            await client.request(squat_url, "POST", "/v1/completions", body=b"{}")
        for s in (server, squat):
            s.close()

    run(main())

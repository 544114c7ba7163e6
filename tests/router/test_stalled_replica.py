"""A replica that stops answering (SIGSTOP, a hung GPU) with requests under way, on real loopback sockets: once its
probes take it out, what it had not begun to answer goes to another replica instead of waiting out the read timeout
(30 minutes by default)."""

from __future__ import annotations

import asyncio

import orjson

from fleetserve.router.gateway import Gateway, RouterSettings
from fleetserve.router.pool import BackendPool
from tests.recording_responder import Recorder
from tests.router.test_gateway_inprocess import chat
from tests.router.test_upstream import answer, read_request, serve

ANSWER = orjson.dumps({"id": "x", "object": "chat.completion", "choices": [], "usage": {"prompt_tokens": 3}})


async def silent(reader, writer):
    await read_request(reader)
    await asyncio.sleep(60)  # stopped: reads, never answers (health checks included)


async def healthy(reader, writer):
    while await read_request(reader) is not None:
        writer.write(answer(ANSWER))
        await writer.drain()
    writer.close()


def test_requests_a_stalled_replica_had_not_answered_move_when_its_probes_take_it_out():
    async def main():
        stalled_server, stalled = await serve(silent)
        good_server, good = await serve(healthy)
        pool = BackendPool([stalled, good], interval=60, timeout=0.2)
        pool.backends[stalled.split("://")[1]].healthy = True  # the only one ready when the request comes
        pool._signal()
        gw = Gateway(pool, RouterSettings(strategy="roundrobin", upstream_read_timeout=1800))
        out = Recorder()
        task = asyncio.ensure_future(gw.handle(chat(), out))
        await asyncio.sleep(0.3)
        assert not task.done()  # sent to the stalled replica, waiting
        for backend in pool.backends.values():
            await pool.probe(backend)
            await pool.probe(backend)  # unhealthy_after 2: the stalled one is out, the good one in
        await asyncio.wait_for(task, 10)
        retries = gw.metrics.retries.labels("stalled")._value.get()
        await gw.upstream.aclose()
        stalled_server.close()
        good_server.close()
        return out, retries

    out, retries = asyncio.run(asyncio.wait_for(main(), 30))
    assert out.status == 200 and orjson.loads(out.body)["id"] == "x"
    assert retries == 1

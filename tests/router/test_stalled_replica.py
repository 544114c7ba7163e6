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


class RecordingClient:
    """The pool's client: health checks fail as told; abandon calls recorded."""

    def __init__(self, failure):
        self.failure = failure
        self.abandoned: list[str] = []

    async def get(self, url, timeout, credentials=True, headers=()):
        raise self.failure

    def abandon(self, base_url, why):
        self.abandoned.append(base_url)
        return 0


def test_a_replica_taken_out_by_a_failed_request_first_still_has_its_waiting_requests_moved():
    """abandon ran only on the probe that took a replica out: when a failed request had done that first, what it
    had been sent waited out the read timeout."""
    from fleetserve.router.upstream import Timeout

    async def main():
        pool = BackendPool(["http://10.0.0.1:8000"], interval=60)
        backend = next(iter(pool.backends.values()))
        backend.healthy = True
        pool.client = RecordingClient(Timeout("no answer"))
        pool.mark_unreachable(backend, "connect timed out")  # out before any probe failed
        await pool.probe(backend)
        await pool.probe(backend)
        return pool.client.abandoned

    assert set(asyncio.run(main())) == {"http://10.0.0.1:8000"}  # every silent round while out


def test_a_replica_that_answers_its_checks_unhealthy_keeps_what_it_serves():
    """A 503 from /health is an answer: a slow, working replica's requests were all thrown away and resent."""
    async def main():
        pool = BackendPool(["http://10.0.0.1:8000"], interval=60)
        backend = next(iter(pool.backends.values()))
        backend.healthy = True

        class Unhealthy(RecordingClient):
            async def get(self, url, timeout, credentials=True, headers=()):
                return 503, b"{}"

        pool.client = Unhealthy(None)
        for _ in range(3):
            await pool.probe(backend)
        return backend.healthy, pool.client.abandoned

    assert asyncio.run(main()) == (False, [])


def test_a_replica_whose_listener_is_closed_keeps_what_it_serves():
    """A replica stopping gracefully (its supervisor gone: the orphan signal) closes its listener, then finishes
    what it serves. The refused probes read as silence, and its non-streamed requests mid-generation were cut:
    retried on another replica, or, with the router stopping too, answered 503 after their work was thrown away."""
    from fleetserve.router.pool import REFUSED_DRAIN_S
    from fleetserve.router.upstream import Unreachable

    now = [1000.0]

    async def main():
        pool = BackendPool(["http://10.0.0.1:8000"], interval=60, clock=lambda: now[0])
        backend = next(iter(pool.backends.values()))
        backend.healthy = True
        refused = Unreachable("connection refused")
        refused.refused = True
        pool.client = RecordingClient(refused)
        for _ in range(3):
            await pool.probe(backend)
            now[0] += 5
        draining = (backend.healthy, backend.refused, list(pool.client.abandoned))
        now[0] += REFUSED_DRAIN_S  # refused past any drain: wedged after it closed its listener, silence again
        await pool.probe(backend)
        return draining, pool.client.abandoned

    assert asyncio.run(main()) == ((False, True, []), ["http://10.0.0.1:8000"])


def test_the_silence_of_a_replicas_probes_is_timed_and_an_answer_or_a_refusal_ends_it():
    """A stalled replica stayed "ready" for its supervisor for good: the router's load report now says how long
    its probes have had no answer (`silent_s`), which the supervisor restarts it on (fleet/supervisor.py)."""
    from fleetserve.clock import ManualClock
    from fleetserve.router.upstream import Timeout, Unreachable

    async def main():
        clock = ManualClock(10.0)
        pool = BackendPool(["http://10.0.0.1:8000"], interval=60, clock=clock)
        backend = next(iter(pool.backends.values()))
        backend.healthy = True
        pool.client = RecordingClient(Timeout("no answer"))
        seen = [backend.silent_s]
        await pool.probe(backend)
        clock.advance(45)
        await pool.probe(backend)
        seen.append(backend.silent_s)  # from the first silent probe
        class Unhealthy(RecordingClient):
            async def get(self, url, timeout, credentials=True, headers=()):
                return 503, b"{}"  # an answer, unhealthy: not silent

        pool.client = Unhealthy(None)
        await pool.probe(backend)
        seen.append(backend.silent_s)
        pool.client = RecordingClient(Timeout("no answer"))
        await pool.probe(backend)
        clock.advance(5)
        seen.append(backend.silent_s)
        refused = Unreachable("connection refused")
        refused.refused = True
        pool.client = RecordingClient(refused)  # nothing listens: a process gone, its exit the supervisor's news
        await pool.probe(backend)
        seen.append(backend.silent_s)
        return seen

    assert asyncio.run(main()) == [0.0, 45.0, 0.0, 5.0, 0.0]


def test_a_stopped_engine_behind_the_real_router_reads_silent_in_its_load_report(tmp_path):
    import os
    import signal

    import httpx

    from tests.helpers import Server, wait_until

    engine = Server(["engine", "--simulate", "fast", "--served-model-name", "sim"], tmp_path / "engine.log").start()
    router = Server(["router", "--backend", engine.url], tmp_path / "router.log").start()

    def silent_s() -> float:
        return httpx.get(router.url + "/admin/load", timeout=10).json()["backends"][0]["silent_s"]

    try:
        assert silent_s() == 0
        os.killpg(engine.proc.pid, signal.SIGSTOP)
        wait_until(lambda: silent_s() >= 3, 60, what="the router's probes timing the silence")
        os.killpg(engine.proc.pid, signal.SIGCONT)
        wait_until(lambda: silent_s() == 0, 60, what="an answer ending it")
    finally:
        os.killpg(engine.proc.pid, signal.SIGCONT)
        router.stop()
        engine.stop()

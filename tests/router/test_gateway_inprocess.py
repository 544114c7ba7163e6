"""The gateway in process, with an injected upstream client: dispatch, retries, relay and admission in
virtual time, no subprocess and no socket."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from fleetserve.router.gateway import Gateway, RouterSettings
from fleetserve.router.http1 import Request
from fleetserve.router.pool import BackendPool
from fleetserve.router.upstream import Broken, Dropped, Timeout, Unreachable
from tests.recording_responder import Recorder
from tests.virtual_loop import run_virtual

A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"
OK = orjson.dumps({"id": "x", "choices": [], "usage": {"prompt_tokens": 3, "prompt_tokens_details":
                                                      {"cached_tokens": 0}}})


class FakeResponse:
    """What upstream.UpstreamResponse offers the gateway, from a script."""

    def __init__(self, status: int, chunks: list, headers=None, length: bool = True):
        self.status = status
        self.headers = list(headers or [(b"content-type", b"application/json")])
        body = b"".join(c for c in chunks if isinstance(c, bytes))
        self.content_length = len(body) if length and all(isinstance(c, bytes) for c in chunks) else None
        self.complete = self.content_length is not None
        self._chunks = list(chunks)
        self.closed = False

    def header(self, name: bytes):
        return dict(self.headers).get(name)

    async def read(self) -> bytes:
        if not self._chunks:
            return b""
        item = self._chunks.pop(0)
        if isinstance(item, Exception):
            raise item
        await asyncio.sleep(0)
        return item

    def close(self) -> None:
        self.closed = True


class FakeUpstream:
    """Answers per replica URL from a queue of scripted outcomes (a FakeResponse or an exception)."""

    def __init__(self, script: dict[str, list]):
        self.script = script
        self.sent: list[str] = []
        self.paths: list[str] = []

    async def request(self, base_url, method, path, headers=(), body=b"", read_timeout=None, credentials=True):
        self.sent.append(base_url)
        self.paths.append(path)
        outcome = self.script[base_url].pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def aclose(self) -> None:
        pass


def gateway(script: dict[str, list], clock=None, **settings) -> tuple[Gateway, FakeUpstream]:
    pool = BackendPool(list(script), interval=0.05, **({"clock": clock} if clock else {}))
    for b in pool.backends.values():
        b.healthy = True
    pool._signal()
    upstream = FakeUpstream(script)
    return Gateway(pool, RouterSettings(strategy="roundrobin", **settings), upstream=upstream), upstream


def healthy_after(gw: Gateway, backend, seconds: float) -> None:
    """The replica answers its probes again `seconds` from now (virtual time): restarted, or its cold start over."""
    def back():
        backend.healthy = True
        gw.pool._signal()

    asyncio.get_running_loop().call_later(seconds, back)


def chat(stream: bool = False) -> Request:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return Request("POST", "/v1/chat/completions", b"", [(b"content-type", b"application/json")],
                   orjson.dumps(body), ("127.0.0.1", 5555), "1.1", True)


def test_non_streaming_answer_goes_out_in_one_write_with_our_headers():
    async def main():
        gw, up = gateway({A: [FakeResponse(200, [OK])], B: []})
        out = Recorder()
        await gw.handle(chat(), out)
        return out, up

    out, up = run_virtual(main())
    assert out.status == 200 and out.body == OK and out.ended
    assert out.header(b"x-fleetserve-replica") == b"10.0.0.1:8000" and out.header(b"x-request-id")


def test_an_invocation_path_sends_generation_there_and_counts_it_as_the_openai_route():
    """A SageMaker-style image (DJL-LMI) serves chat bodies on /invocations only: engine.invocationPath."""
    async def main():
        gw, up = gateway({A: [FakeResponse(200, [OK])], B: [FakeResponse(200, [OK])]}, invocation_path="/invocations")
        first, second = Recorder(), Recorder()
        await gw.handle(chat(), first)
        text = Request("POST", "/v1/completions", b"", [(b"content-type", b"application/json")],
                       orjson.dumps({"model": "m", "prompt": "hi"}), ("127.0.0.1", 5555), "1.1", True)
        await gw.handle(text, second)
        return first, second, up, gw

    first, second, up, gw = run_virtual(main())
    assert first.status == second.status == 200 and up.paths == ["/invocations", "/invocations"]
    counted = {s.labels["path"] for s in gw.metrics.requests.collect()[0].samples
               if s.name.endswith("_total") and s.value}
    assert counted == {"/v1/chat/completions", "/v1/completions"}


@pytest.mark.parametrize("failure", [FakeResponse(503, [b"busy"]), Unreachable("refused")])
def test_failure_before_the_first_byte_is_retried_on_another_replica(failure, caplog):
    import logging

    async def main():
        gw, up = gateway({A: [failure], B: [FakeResponse(200, [OK])]})
        out = Recorder()
        await gw.handle(chat(), out)
        return gw, out, up

    with caplog.at_level(logging.INFO, logger="fleetserve.router.access"):
        gw, out, up = run_virtual(main())
    assert up.sent == [A, B] and out.status == 200 and out.body == OK
    # the request's line says which replica failed it and why (only a counter had, with no replica)
    (line,) = [r for r in caplog.records if r.getMessage() == "request"]
    why = "status_503" if isinstance(failure, FakeResponse) else "unreachable"
    assert line.attempts == 2 and line.retried == f"10.0.0.1:8000:{why}"
    assert gw.pool.book.in_flight[A.split("://")[1]] == 0 and gw.pool.book.in_flight[B.split("://")[1]] == 0


def test_a_silent_replica_is_a_504_and_never_retried_elsewhere():
    async def main():
        gw, up = gateway({A: [Timeout("silent")], B: [FakeResponse(200, [OK])]})
        out = Recorder()
        await gw.handle(chat(), out)
        return out, up

    out, up = run_virtual(main())
    assert up.sent == [A] and out.status == 504 and out.json()["error"]["code"] == "upstream_timeout"


def test_every_replica_failing_is_a_502_with_retry_after():
    async def main():
        gw, up = gateway({A: [FakeResponse(502, [b""])], B: [FakeResponse(503, [b""])]}, max_attempts=2)
        out = Recorder()
        await gw.handle(chat(), out)
        return out

    out = run_virtual(main())
    assert out.status == 502 and out.json()["error"]["code"] == "upstream_failed"
    assert out.header(b"retry-after") == b"1"


def test_every_replica_answering_the_same_status_is_that_status_and_an_html_error_page_becomes_openai_json():
    """All replicas' 503 (no Retry-After) reached the client as 502; a replica's HTML 500 page went through whole,
    with nothing for an OpenAI client to read."""
    html = [(b"content-type", b"text/html")]

    async def main():
        gw, up = gateway({A: [FakeResponse(503, [b""]), FakeResponse(500, [b"<html><body><h1>Internal ", b"Server "
                                                                             b"Error</h1></body></html>"], html)],
                          B: [FakeResponse(503, [b""])]}, max_attempts=2)
        same, page = Recorder(), Recorder()
        await gw.handle(chat(), same)
        await gw.handle(chat(), page)
        return same, page

    same, page = run_virtual(main())
    assert same.status == 503 and same.json()["error"]["code"] == "upstream_failed"
    assert "every replica tried (2) answered 503" in same.json()["error"]["message"]
    assert page.status == 500 and page.header(b"content-type") == b"application/json"
    error = page.json()["error"]
    assert error["code"] == "upstream_error" and error["type"] == "server_error"
    assert "text/html body, not OpenAI JSON: Internal Server Error" in error["message"], error


def busy_answer(after: bytes = b"1") -> FakeResponse:
    """The engine's own "queue full" answer."""
    return FakeResponse(503, [b'{"error": {"code": "overloaded"}}'],
                        [(b"content-type", b"application/json"), (b"retry-after", after)])


def test_busy_replicas_are_tried_elsewhere_without_tripping_their_breaker_and_the_client_gets_overloaded():
    """An engine's 503 with Retry-After (its waiting queue is full) counted as a replica failure: ten in a burst
    opened the breaker of an idle, healthy replica and the next request waited 60 s; when all were busy the
    client read 502 upstream_failed or 503 no_replica."""
    async def main():
        gw, up = gateway({A: [busy_answer() for _ in range(12)] + [FakeResponse(200, [OK])],
                          B: [busy_answer(b"3") for _ in range(12)]})
        outs = []
        for _ in range(12):
            out = Recorder()
            await gw.handle(chat(), out)
            outs.append(out)
        last = Recorder()
        await gw.handle(chat(), last)
        return gw, outs, last, up

    gw, outs, last, up = run_virtual(main())
    mixed = Recorder()

    async def one_failed_one_busy():
        gw, up = gateway({A: [FakeResponse(502, [b""])], B: [busy_answer()]}, max_attempts=2)
        await gw.handle(chat(), mixed)

    run_virtual(one_failed_one_busy())
    assert mixed.status == 502 and mixed.json()["error"]["code"] == "upstream_failed"  # not "every replica busy"
    for out in outs:
        assert out.status == 503 and out.json()["error"]["code"] == "overloaded"
        assert out.header(b"retry-after") == b"3" and "at capacity" in out.json()["error"]["message"]
    assert all(b.breaker == "closed" and b.eligible for b in gw.pool.backends.values())
    assert last.status == 200 and up.sent[-1] == A
    assert all(v == 0 for v in gw.pool.book.in_flight.values())


def test_a_request_that_replicas_drop_tries_one_more_and_takes_none_out():
    """One request that made replicas close the connection was sent to every replica and ejected them all; a
    replica that died under a request (kill -9) must still have the request answered by another."""
    C = "http://10.0.0.3:8000"

    async def main():
        gw, up = gateway({A: [Dropped("closed")], B: [Dropped("closed")], C: [Dropped("closed")]})
        out = Recorder()
        await gw.handle(chat(), out)
        return gw, out, up

    gw, out, up = run_virtual(main())
    assert len(up.sent) == 2 and out.status == 502 and out.json()["error"]["code"] == "upstream_dropped"
    assert all(b.healthy and b.breaker == "closed" for b in gw.pool.backends.values())

    async def died():
        gw, up = gateway({A: [Dropped("closed")], B: [FakeResponse(200, [OK])], C: [FakeResponse(200, [OK])]})
        out = Recorder()
        await gw.handle(chat(), out)
        return out, up

    out, up = run_virtual(died())
    assert up.sent[0] == A and len(up.sent) == 2 and out.status == 200


def stream_failing_with(failure: Exception, **settings) -> tuple[Gateway, Recorder]:
    """A streamed chat whose replica sends one event, then fails with `failure` (in virtual time)."""
    sse = [(b"content-type", b"text/event-stream")]
    chunks = [b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n', failure]

    async def main():
        gw, up = gateway({A: [FakeResponse(200, chunks, sse, length=False)], B: []}, **settings)
        out = Recorder()
        await gw.handle(chat(stream=True), out)
        return gw, out

    return run_virtual(main())


def test_a_stream_that_breaks_mid_way_ends_with_an_openai_error_event():
    gw, out = stream_failing_with(Broken("cut"))
    text = out.body.decode()
    assert text.startswith('data: {"choices"') and '"code":"upstream_failed"' in text
    assert text.endswith("data: [DONE]\n\n") and out.ended and not out.aborted
    assert not gw.pool.backends["10.0.0.1:8000"].healthy  # a replica that cut a stream is taken out


@pytest.mark.parametrize("scope", ["all", "router"])
def test_a_stream_cut_mid_way_is_an_error_in_the_model_series_and_a_warning_in_the_access_log(scope, caplog):
    """The client got an error event under a 200 status line, and that was all anyone counted: the access line said
    200 at INFO, and no model_errors_total moved (the engine that would have counted it was dead), so the error
    ratio, the burn-rate alerts and the dashboards' error panels read 0 % for what streaming clients saw."""
    import logging

    from fleetserve.observe.metrics import ModelIdentity

    with caplog.at_level(logging.INFO, logger="fleetserve.router.access"):
        gw, out = stream_failing_with(Broken("cut"), model_identity=ModelIdentity("ns", "m", "1", "g5", ""),
                                      model_metrics_scope=scope)
    assert '"code":"upstream_failed"' in out.body.decode()
    errors = {s.labels["status"]: s.value for f in gw.metrics.registry.collect() for s in f.samples
              if s.name == "model_errors_total" and s.labels["replica"] == "10.0.0.1:8000" and s.value}
    assert errors == {"502": 1.0}
    (line,) = [r for r in caplog.records if r.getMessage() == "request"]
    assert line.levelname == "WARNING" and line.status == 502 and line.error == "upstream_failed"
    # the router's own request series too (they counted a 200 at the first byte: an error ratio built on them
    # read a replica killed under streaming load as error-free)
    counted = {(s.name, s.labels.get("code")): s.value for f in gw.metrics.registry.collect() for s in f.samples
               if s.name in ("fleetserve_router_requests_total", "fleetserve_router_tenant_requests_total") and s.value}
    assert counted == {("fleetserve_router_requests_total", "502"): 1.0,
                       ("fleetserve_router_tenant_requests_total", "502"): 1.0}, counted
    received = [s.value for f in gw.metrics.registry.collect() for s in f.samples
                if s.name == "fleetserve_router_requests_received_total" and s.value]
    assert received == [1.0]  # on arrival: the request_rate scaling signal on Kubernetes reads it


def test_a_stream_silent_past_the_idle_timeout_ends_with_a_504_event_and_leaves_the_replica_to_its_probes():
    """A mid-stream silence (a hung replica, or one preempting under KV pressure) ends that stream; it took the
    replica out of rotation too, so an overloaded one that still answered its probes lost every other stream."""
    from fleetserve.router.upstream import Timeout

    gw, out = stream_failing_with(Timeout("silent mid-answer for 60s", 60))
    text = out.body.decode()
    assert '"code":"upstream_timeout"' in text and "sent nothing for 60s mid-stream" in text
    assert text.endswith("data: [DONE]\n\n")
    a = gw.pool.backends["10.0.0.1:8000"]
    assert a.healthy and a.request_failures == 1  # still in rotation; the failure counts toward its breaker


def test_a_stream_cut_when_its_draining_replica_stopped_says_the_drain_time_ran_out():
    """It read "the model replica failed mid-stream", as if the replica had crashed."""
    sse = [(b"content-type", b"text/event-stream")]
    chunks = [b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n', Broken("cut")]

    async def main():
        gw, up = gateway({A: [FakeResponse(200, chunks, sse, length=False)], B: []})
        gw.set_backends([A, B], ready={A, B})
        out = Recorder()
        task = asyncio.ensure_future(gw.handle(chat(stream=True), out))
        await asyncio.sleep(0)
        gw.set_backends([A, B], ready={B}, draining={A})  # the fleet drains A while it streams
        await task
        return out

    text = run_virtual(main()).body.decode()
    assert '"code":"upstream_failed"' in text and "engine.drainTimeoutSeconds" in text, text
    assert "failed mid-stream" not in text


def test_no_replica_holds_the_request_then_503_after_the_buffer_timeout_in_virtual_time():
    async def main():
        gw, up = gateway({A: []}, buffer_timeout=600.0)
        gw.pool.backends["10.0.0.1:8000"].healthy = False
        gw.pool._signal()
        loop = asyncio.get_running_loop()
        started = loop.time()
        out = Recorder()
        await gw.handle(chat(), out)
        return out, loop.time() - started

    out, waited = run_virtual(main())
    assert out.status == 503 and out.header(b"retry-after")
    assert waited == pytest.approx(600.0)


@pytest.mark.parametrize("death", [Unreachable("refused"), Dropped("closed")])
def test_a_request_whose_only_replica_died_under_it_waits_for_one_to_come_back(death):
    """A crash of the only replica: the request sent to it (refused, or cut before any answer) was a 503
    no_replica at once while the fleet restarted it in seconds. It waits as a request at zero does, once."""
    async def main():
        loop = asyncio.get_running_loop()
        gw, up = gateway({A: [death, FakeResponse(200, [OK])]}, clock=loop.time, buffer_timeout=600.0)
        backend = gw.pool.backends["10.0.0.1:8000"]
        if isinstance(death, Dropped):  # a drop leaves the replica to the probes: here they find it gone
            # before the retry's back-off ends (at least 50 ms); later, the request is a 502 as before
            loop.call_later(0.01, lambda: (setattr(backend, "healthy", False), gw.pool._signal()))

        healthy_after(gw, backend, 5.0)  # restarted
        out = Recorder()
        started = loop.time()
        await gw.handle(chat(), out)
        return out, loop.time() - started, up

    out, waited, up = run_virtual(main())
    assert out.status == 200 and out.body == OK and up.sent == [A, A]
    assert waited == pytest.approx(5.0, abs=0.6)


def test_the_wait_for_a_replica_that_died_is_left_out_of_the_served_ttft():
    """The second wait's seconds were dropped: a streamed request that waited 5 s for its restarted replica
    counted 5,000 ms in the ttft_p95 scaling signal, which scaled the fleet up after every crash."""
    async def main():
        loop = asyncio.get_running_loop()
        gw, up = gateway({A: [Unreachable("refused"), FakeResponse(200, [b"data: x\n\n"], length=False)]},
                         clock=loop.time, buffer_timeout=600.0)
        backend = gw.pool.backends["10.0.0.1:8000"]

        healthy_after(gw, backend, 5.0)
        out = Recorder()
        started = loop.time()
        await gw.handle(chat(stream=True), out)
        return out, gw, loop.time() - started

    out, gw, took = run_virtual(main())
    assert out.status == 200 and took == pytest.approx(5.0, abs=0.6)
    assert [ms for _, ms in gw._ttfb] and all(ms < 1000 for _, ms in gw._ttfb), gw._ttfb


def test_a_request_held_after_its_replica_died_is_refused_when_none_comes_back():
    async def main():
        gw, up = gateway({A: [Unreachable("refused")]}, buffer_timeout=30.0)
        out = Recorder()
        await gw.handle(chat(), out)
        return out, up

    out, up = run_virtual(main())
    assert out.status == 503 and up.sent == [A] and out.header(b"retry-after")


def test_a_held_request_goes_as_soon_as_a_replica_is_ready():
    async def main():
        loop = asyncio.get_running_loop()
        sse = [(b"content-type", b"text/event-stream")]
        gw, up = gateway({A: [FakeResponse(200, [b"data: 1\n\n"], sse, length=False)]}, clock=loop.time,
                         buffer_timeout=600.0)
        backend = gw.pool.backends["10.0.0.1:8000"]
        backend.healthy = False
        gw.pool._signal()

        healthy_after(gw, backend, 42.0)
        out = Recorder()
        started = loop.time()
        await gw.handle(chat(stream=True), out)
        return out, loop.time() - started, gw.ttft_p95_ms(), gw.metrics

    out, waited, scaling_ttft_ms, metrics = run_virtual(main())
    assert out.status == 200 and waited == pytest.approx(42.0)
    # the client waited 42 s for the cold start; the ttft_p95 scaling signal leaves it out (it would scale a
    # fleet woken by one request to its max), the client-side histogram keeps it
    assert scaling_ttft_ms < 1000
    served = metrics.registry.get_sample_value("fleetserve_router_served_ttfb_milliseconds_sum")
    client = metrics.registry.get_sample_value("fleetserve_router_ttfb_milliseconds_sum")
    assert metrics.registry.get_sample_value("fleetserve_router_served_ttfb_milliseconds_count") == 1
    assert served < 1000 and client == pytest.approx(42000, rel=0.01)


def test_the_queue_waits_for_a_free_slot_and_overflows_past_its_size():
    async def main():
        slow = FakeResponse(200, [OK])
        gw, up = gateway({A: [slow, FakeResponse(200, [OK])]}, max_concurrent_per_replica=1, max_queue=1,
                         buffer_timeout=30.0)
        book = gw.pool.book
        book.sent("10.0.0.1:8000", 0)  # a request in flight holds the only slot
        loop = asyncio.get_running_loop()
        queued, overflow = Recorder(), Recorder()
        first = asyncio.ensure_future(gw.handle(chat(), queued))
        await asyncio.sleep(1.0)
        await gw.handle(chat(), overflow)  # the queue (size 1) is full: refused at once
        loop.call_later(5.0, lambda: (book.finished("10.0.0.1:8000"), gw.gate.slot_freed()))
        await first
        return queued, overflow

    queued, overflow = run_virtual(main())
    assert overflow.status == 429 and overflow.header(b"retry-after")
    assert queued.status == 200


def test_a_request_queued_at_the_limit_goes_to_a_replica_that_joins_at_once():
    """Queued requests looked again only when a request ended: a replica added by a scale-up stood idle while
    the queue waited for the old replicas' long answers (found by the gateway-simulator parity test)."""
    async def main():
        gw, up = gateway({A: [], B: [FakeResponse(200, [OK])]}, max_concurrent_per_replica=1, max_queue=4,
                         buffer_timeout=600.0)
        gw.set_backends([A], ready={A})
        gw.pool.book.sent("10.0.0.1:8000", 0)  # a long answer holds A's only slot for good
        loop = asyncio.get_running_loop()
        out = Recorder()
        queued = asyncio.ensure_future(gw.handle(chat(), out))
        await asyncio.sleep(5.0)
        assert not queued.done() and gw.gate.queued == 1
        gw.set_backends([A, B], ready={A, B})  # the scale-up's replica is ready
        await queued
        return out, up, loop.time()

    out, up, answered_at = run_virtual(main())
    assert out.status == 200 and up.sent == [B] and answered_at == 5.0


def test_a_replica_that_left_leaves_no_gauge_behind():
    from prometheus_client import generate_latest

    async def main():
        gw, _ = gateway({A: [], B: []})
        gw.refresh_gauges()
        before = generate_latest(gw.metrics.registry).decode()
        gw.set_backends([A], ready={A})
        gw.refresh_gauges()
        return before, generate_latest(gw.metrics.registry).decode()

    before, after = run_virtual(main())
    assert 'fleetserve_router_backend_healthy{backend="10.0.0.2:8000"}' in before
    gauges = [line for line in after.splitlines()
              if line.startswith(("fleetserve_router_backend_healthy{", "fleetserve_router_backend_in_flight{"))]
    assert gauges and not [line for line in gauges if "10.0.0.2:8000" in line]
    assert 'fleetserve_router_backend_healthy{backend="10.0.0.1:8000"} 1.0' in after


def test_the_load_report_counts_requests_still_running_on_a_replica_taken_out_of_the_set():
    """/admin/load (the autoscaler's input) summed only the current backends: streams still running on a removed
    one were missing."""
    release = []

    class Held(FakeResponse):
        async def read(self) -> bytes:
            if self._chunks:
                return await super().read()
            if not release:
                release.append(asyncio.get_running_loop().create_future())
            await release[0]
            return b""

    sse = [(b"content-type", b"text/event-stream")]

    async def main():
        gw, up = gateway({A: [Held(200, [b"data: 1\n\n"], sse, length=False)], B: []})
        task = asyncio.create_task(gw.handle(chat(stream=True), Recorder()))
        while not release:
            await asyncio.sleep(0.01)
        gw.set_backends([B])
        during = gw.load_report()["in_flight"]
        release[0].set_result(None)
        await task
        return during, gw.load_report()["in_flight"]

    assert run_virtual(main()) == (1, 0)


def test_only_streamed_answers_feed_the_ttft_scaling_signal():
    """A non-streamed answer's first byte is its last: one default chat (the whole generation) read as a 3.2 s
    TTFT scaled an idle fleet up. Errors carry no token either."""
    sse = [(b"content-type", b"text/event-stream")]

    async def main():
        clock = [0.0]
        gw, up = gateway({A: [FakeResponse(200, [OK]), FakeResponse(400, [b'{"error": {}}']),
                              FakeResponse(200, [b"data: 1\n\n"], sse, length=False)]}, clock=lambda: clock[0])
        for request in (chat(), chat()):
            await gw.handle(request, Recorder())
        after_plain = gw.ttft_p95_ms(), len(gw._ttfb)
        await gw.handle(chat(stream=True), Recorder())
        return after_plain, len(gw._ttfb)

    (p95, plain), streamed = run_virtual(main())
    assert (p95, plain, streamed) == (0.0, 0, 1)


def test_a_client_that_hangs_up_after_done_had_the_whole_stream_not_a_499():
    """openai's client closes after [DONE]; the router waited for the replica's end of the body, was cancelled by
    the disconnect, and logged 27 of 150 whole streams as 499 (and never learned their cached tokens)."""
    sse = [(b"content-type", b"text/event-stream")]
    waiting = []

    class Trailing(FakeResponse):
        async def read(self) -> bytes:
            if self._chunks:
                return await super().read()
            waiting.append(asyncio.get_running_loop().create_future())
            await waiting[-1]  # the replica's chunked terminator, not there yet
            return b""

    async def main():
        gw, up = gateway({A: [Trailing(200, [b'data: {"a": 1}\n\ndata: [DONE]\n\n'], sse, length=False)]})
        logged = []
        gw._log = lambda rid, tenant, path, status, *a, **k: logged.append(status)
        out = Recorder()
        task = asyncio.create_task(gw.handle(chat(stream=True), out))
        while not waiting:
            await asyncio.sleep(0.01)
        task.cancel()  # the front door cancels the request when its client hangs up
        await asyncio.gather(task, return_exceptions=True)
        return out, logged, gw.pool.book.in_flight

    out, logged, in_flight = run_virtual(main())
    assert out.body.endswith(b"data: [DONE]\n\n") and out.ended
    assert logged == [200] and all(v == 0 for v in in_flight.values())


def test_held_requests_hear_at_once_that_no_replica_can_start():
    """A fleet whose replica crash-looped at zero (or had no capacity) let held requests wait out the buffer
    timeout (600 s by default) for a 503 that named nothing; the fleet now says why, and they are told."""
    async def main():
        loop = asyncio.get_running_loop()
        gw, up = gateway({A: [FakeResponse(200, [OK])]}, clock=loop.time, buffer_timeout=600.0)
        backend = gw.pool.backends["10.0.0.1:8000"]
        backend.healthy = False
        gw.pool._signal()
        held = Recorder()
        task = asyncio.create_task(gw.handle(chat(), held))
        while not gw.gate.pending:
            await asyncio.sleep(0.1)
        gw.set_backends([A], failing=None)  # the fleet pushes its backends (a replica starting) before it fails
        await asyncio.sleep(1.0)
        started = loop.time()
        gw.set_backends([A], failing="replica r0 exited with code 1 and is restarting; last log line: "
                                     "SafetensorError")
        await task
        waited = loop.time() - started
        late = Recorder()
        await gw.handle(chat(), late)  # while it lasts, refused without being held
        gw.set_backends([A], failing=None)
        again = asyncio.create_task(gw.handle(chat(), Recorder()))
        while not gw.gate.pending:
            await asyncio.sleep(0.1)
        again.cancel()
        await asyncio.gather(again, return_exceptions=True)
        return held, late, waited

    held, late, waited = run_virtual(main())
    for out in (held, late):
        assert out.status == 503 and out.json()["error"]["code"] == "replicas_failing"
        assert "no model replica can start: replica r0 exited with code 1" in out.json()["error"]["message"]
        assert out.header(b"retry-after") == b"30"
    assert waited < 1.0  # told when the fleet said so, not at the buffer timeout


@pytest.mark.parametrize("scope", ["all", "router"])
def test_a_timed_out_request_is_one_invocation_and_one_error_in_the_model_series(scope):
    """The attempt's 504 was counted where it failed, and the final 504 again as a refusal: two invocations and
    two errors for one request, so the error ratio read double."""
    from fleetserve.observe.metrics import ModelIdentity

    async def main():
        gw, _ = gateway({A: [Timeout("silent")], B: [FakeResponse(200, [OK])]},
                        model_identity=ModelIdentity("ns", "m", "1", "g5", ""), model_metrics_scope=scope)
        out = Recorder()
        await gw.handle(chat(), out)
        return gw, out

    gw, out = run_virtual(main())
    assert out.status == 504
    registry = gw.metrics.registry

    def total(name, **labels):
        return sum(s.value for f in registry.collect() for s in f.samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

    assert total("model_errors_total", status="504") == 1
    assert total("model_invocations_total") == (1 if scope == "all" else 0)  # the engine counted its own


def test_a_retry_waits_for_a_slot_when_the_replicas_left_are_at_their_limit():
    """With per-replica limits, a request whose replica crashed under it was answered 502 while the survivor was
    busy a moment: a retry now queues for a slot as a first attempt does."""
    async def main():
        gw, up = gateway({A: [Unreachable("crashed")], B: [FakeResponse(200, [OK])]}, max_concurrent_per_replica=1,
                         max_queue=4, buffer_timeout=30.0)
        book = gw.pool.book
        book.sent("10.0.0.2:8000", 0)  # B's only slot is taken by a long answer
        loop = asyncio.get_running_loop()
        loop.call_later(3.0, lambda: (book.finished("10.0.0.2:8000"), gw.gate.slot_freed()))
        out = Recorder()
        await gw.handle(chat(), out)
        return out, up, loop.time()

    out, up, answered_at = run_virtual(main())
    assert out.status == 200 and up.sent == [A, B] and answered_at >= 3.0


def test_a_replica_answering_500_to_everything_is_taken_out_by_its_breaker():
    """A 500 is not retried elsewhere (the request may be its cause), but it counted neither as a failure nor as
    a success: a replica failing every request kept its share of the traffic."""
    async def main():
        error = orjson.dumps({"error": {"message": "engine dead", "type": "server_error"}})
        gw, up = gateway({A: [FakeResponse(500, [error]) for _ in range(30)],
                          B: [FakeResponse(200, [OK]) for _ in range(30)]})
        a = gw.pool.backends["10.0.0.1:8000"]
        statuses = []
        for _ in range(30):
            out = Recorder()
            await gw.handle(chat(), out)
            statuses.append(out.status)
        return statuses, up, a

    statuses, up, a = run_virtual(main())
    # out at its 11th answer: the first with another replica of 10 answers to compare with (router/outliers.py)
    assert statuses.count(500) == 11 and a.breaker == "open"
    assert up.sent.count(A) == 11 and statuses.count(200) == 19


def test_a_501_does_not_count_against_the_replica():
    async def main():
        gw, up = gateway({A: [FakeResponse(501, [b"{}"]) for _ in range(12)], B: []})
        gw.set_backends([A], ready={A})
        for _ in range(12):
            await gw.handle(chat(), Recorder())
        return gw.pool.backends["10.0.0.1:8000"]

    assert run_virtual(main()).breaker == "closed"


def test_a_retry_whose_replicas_left_go_out_while_it_waits_ends_instead_of_spinning():
    """The retry's wait for a slot fell into the hold for a ready replica, which returned at once while the replica
    it had excluded was ready: thousands of holds a second, until something changed."""
    async def main():
        gw, up = gateway({A: [FakeResponse(502, [b""])], B: []}, max_concurrent_per_replica=1, max_queue=4,
                         buffer_timeout=30.0)
        gw.pool.book.sent("10.0.0.2:8000", 0)  # B's only slot is taken
        b = gw.pool.backends["10.0.0.2:8000"]
        holds = []
        hold = gw.gate._hold_until_ready

        async def counted():
            holds.append(1)
            return await hold()

        gw.gate._hold_until_ready = counted
        loop = asyncio.get_running_loop()
        loop.call_later(1.0, lambda: (setattr(b, "healthy", False), gw.pool._signal()))
        out = Recorder()
        await gw.handle(chat(), out)
        return out, holds

    out, holds = run_virtual(main())
    assert out.status == 502 and len(holds) <= 1


def test_server_errors_every_replica_answers_alike_open_no_breaker():
    """A 500 may be the request's own doing: one client's poison requests, failing on every replica, opened every
    breaker in turn (then half of them, with the cap). Failing like the others, no replica is an outlier."""
    async def main():
        error = orjson.dumps({"error": {"message": "bad input crashed it", "type": "server_error"}})
        gw, up = gateway({A: [FakeResponse(500, [error]) for _ in range(40)],
                          B: [FakeResponse(500, [error]) for _ in range(40)]})
        for _ in range(40):
            await gw.handle(chat(), Recorder())
        return [b.breaker for b in gw.pool.backends.values()]

    assert run_virtual(main()) == ["closed", "closed"]


def test_a_replica_failing_every_other_request_goes_out():
    """Counted in a row, a replica that failed half of its answers never reached ten in a row and kept its share."""
    async def main():
        error = orjson.dumps({"error": {"message": "flaky GPU", "type": "server_error"}})
        gw, up = gateway({A: [FakeResponse(500 if i % 2 else 200, [error if i % 2 else OK]) for i in range(60)],
                          B: [FakeResponse(200, [OK]) for _ in range(80)]})
        statuses = []
        for _ in range(80):
            out = Recorder()
            await gw.handle(chat(), out)
            statuses.append(out.status)
        return gw.pool.backends["10.0.0.1:8000"], statuses, gw.metrics.ejections.labels("10.0.0.1:8000",
                                                                                         "breaker")._value.get()

    a, statuses, ejections = run_virtual(main())
    assert a.breaker == "open" and ejections == 1
    assert statuses.count(500) == 13  # out at its 26th answer (z 4.1); the rest of the traffic went to B


def test_retry_and_ejection_counters_exist_at_zero_before_their_first_event():
    """They had no series at all (not even a TYPE line) until the first retry or ejection: rate() missed an
    incident's first burst, as it would have for model_errors_total, which is made at 0 for that reason."""
    from fleetserve.observe.metrics import EJECTION_REASONS, RETRY_REASONS

    gw, _ = gateway({A: [], B: []})
    gw.refresh_gauges()
    samples = [s for f in gw.metrics.registry.collect() for s in f.samples]
    retries = {s.labels["reason"]: s.value for s in samples if s.name == "fleetserve_router_retries_total"}
    ejections = {(s.labels["backend"], s.labels["reason"]): s.value for s in samples
                 if s.name == "fleetserve_router_ejections_total"}
    assert retries == dict.fromkeys(RETRY_REASONS, 0.0)
    assert ejections == {(b, r): 0.0 for b in ("10.0.0.1:8000", "10.0.0.2:8000") for r in EJECTION_REASONS}


def test_the_model_series_name_a_replica_as_its_fleet_and_engine_do(caplog):
    """The router labelled them by address (10.0.0.1:8000) where the engine labels its own r0: one replica read
    as two series in every per-replica view. Its request lines named the address alone, so a line could not be
    matched with the replica's series or its engine's lines without a lookup."""
    import logging

    from fleetserve.observe.metrics import ModelIdentity

    async def main():
        gw, _ = gateway({A: [FakeResponse(200, [OK])], B: [FakeResponse(200, [OK])]},
                        model_identity=ModelIdentity("ns", "m", "1", "g5", ""), model_metrics_scope="all")
        gw.set_backends([A, B], ready={A, B}, names={A: "r0", B: "r1"})
        outs = [Recorder(), Recorder()]
        for out in outs:
            await gw.handle(chat(), out)
        return gw, outs

    with caplog.at_level(logging.INFO, logger="fleetserve.router.access"):
        gw, outs = run_virtual(main())
    assert [out.status for out in outs] == [200, 200]
    replicas = {s.labels["replica"] for f in gw.metrics.registry.collect() for s in f.samples
                if s.name == "model_invocations_total" and s.value}
    assert replicas == {"r0", "r1"}
    lines = [r for r in caplog.records if r.getMessage() == "request"]
    assert {(r.replica, r.backend) for r in lines} == {("r0", "10.0.0.1:8000"), ("r1", "10.0.0.2:8000")}


def model_samples(gw, name: str) -> dict[tuple, float]:
    return {(s.labels["replica"], s.labels.get("status")): s.value for f in gw.metrics.registry.collect()
            for s in f.samples if s.name == name and s.value}


@pytest.mark.parametrize("scope", ["all", "router"])
def test_a_request_answered_after_a_retry_is_one_invocation_and_no_error(scope):
    """A request answered 200 after a dead replica counted an invocation and a 502 there (and in scope all a
    second invocation where it was answered): the error ratio and the burn alerts read errors no client got. A
    request no replica answered is one invocation and one error, on the last replica tried."""
    from fleetserve.observe.metrics import ModelIdentity

    async def main(script):
        gw, _ = gateway(script, model_identity=ModelIdentity("ns", "m", "1", "g5", ""), model_metrics_scope=scope)
        gw.set_backends(list(script), ready=set(script), names={A: "r0", B: "r1"})
        out = Recorder()
        await gw.handle(chat(), out)
        return gw, out

    gw, out = run_virtual(main({A: [Unreachable("refused")], B: [FakeResponse(200, [OK])]}))
    assert out.status == 200
    assert model_samples(gw, "model_errors_total") == {}
    assert model_samples(gw, "model_invocations_total") == ({("r1", None): 1.0} if scope == "all" else {})
    assert [s.value for f in gw.metrics.registry.collect() for s in f.samples
            if s.name == "fleetserve_router_retries_total" and s.labels["reason"] == "unreachable"] == [1.0]
    gw, out = run_virtual(main({A: [Unreachable("refused")], B: [Unreachable("refused")]}))
    assert out.status in (502, 503)
    (where,) = model_samples(gw, "model_errors_total")  # the engines saw nothing: the router counts it, in both
    assert where[0] in ("r0", "r1") and model_samples(gw, "model_invocations_total") == {(where[0], None): 1.0}


async def at_zero_for_42s(request: Request, check_bodies: bool, cards: dict | None = None) -> tuple[Recorder, float]:
    """The answer to `request` at zero replicas (one comes up after 42 s), and how long it waited (virtual time)."""
    loop = asyncio.get_running_loop()
    gw, up = gateway({A: [FakeResponse(200, [b"{}"], [(b"content-type", b"application/json")])]},
                     clock=loop.time, buffer_timeout=600.0, check_bodies=check_bodies)
    gw.model_cards.update(cards or {})
    backend = gw.pool.backends["10.0.0.1:8000"]
    backend.healthy = False
    gw.pool._signal()
    healthy_after(gw, backend, 42.0)
    out, started = Recorder(), loop.time()
    await gw.handle(request, out)
    return out, loop.time() - started


def test_a_bad_body_held_for_want_of_a_replica_is_a_400_at_once_in_front_of_built_in_engines():
    """A malformed request woke a fleet at zero and got its 400 after the cold start (or a 503 replicas_failing
    where the answer was a 400): in front of the built-in engines the router runs their checks on what it holds."""
    def bad_chat(**fields) -> Request:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
        return Request("POST", "/v1/chat/completions", b"", [(b"content-type", b"application/json")],
                       orjson.dumps(body), ("127.0.0.1", 5555), "1.1", True)

    def main(check: bool, request: Request):
        return at_zero_for_42s(request, check)

    out, waited = run_virtual(main(True, bad_chat(temperature="hot")))
    assert out.status == 400 and waited == 0.0
    err = orjson.loads(out.body)["error"]
    assert err["param"] == "temperature" and err["type"] == "invalid_request_error"
    out, waited = run_virtual(main(True, bad_chat(n=5)))  # what the built-in engines do not support, too
    assert out.status == 400 and orjson.loads(out.body)["error"]["param"] == "n"
    out, waited = run_virtual(main(True, chat()))  # a good one waits for the replica, as before
    assert out.status == 200 and waited == pytest.approx(42.0)
    out, waited = run_virtual(main(False, bad_chat(n=5)))  # vLLM, SGLang: their checks are not ours to run
    assert out.status == 200 and waited == pytest.approx(42.0)


def test_at_zero_a_request_no_context_of_the_served_model_holds_is_a_400_once_a_replica_gave_its_card():
    """An over-long request held at zero woke the fleet and got its 400 after the cold start. Once a replica gave
    the model's card, its max_model_len refuses at once what no replica could take: a token-id prompt as the
    engines count it, and a max_tokens that leaves no room for a prompt; a text prompt's length waits."""
    def post(path: str, **fields) -> Request:
        body = {"model": "m", **fields}
        return Request("POST", path, b"", [(b"content-type", b"application/json")], orjson.dumps(body),
                       ("127.0.0.1", 5555), "1.1", True)

    def main(request: Request, card: dict | None):
        return at_zero_for_42s(request, True, {"m": card} if card is not None else {})

    card = {"id": "m", "object": "model", "max_model_len": 100}
    chat_messages = [{"role": "user", "content": "hi"}]
    refused = [
        (post("/v1/chat/completions", messages=chat_messages, max_tokens=100), "max_tokens"),
        (post("/v1/chat/completions", messages=chat_messages, max_completion_tokens=500), "max_completion_tokens"),
        (post("/v1/completions", prompt=[1] * 100), "prompt"),
        (post("/v1/completions", prompt=[1] * 90, max_tokens=11), "max_tokens"),
    ]
    for request, param in refused:
        out, waited = run_virtual(main(request, card))
        assert out.status == 400 and waited == 0.0, (param, out.body)
        err = orjson.loads(out.body)["error"]
        assert err["param"] == param and err["code"] == "context_length_exceeded", err
        assert "100 tokens" in err["message"]
    held = [
        (post("/v1/chat/completions", messages=chat_messages, max_tokens=99), card),  # fits with a 1-token prompt
        (post("/v1/completions", prompt=[1] * 90, max_tokens=10), card),  # exactly the context
        (post("/v1/completions", prompt="x" * 10_000, max_tokens=10), card),  # its tokens are the engines' to count
        (post("/v1/chat/completions", messages=chat_messages, max_tokens=100), None),  # no card read yet
        (post("/v1/chat/completions", messages=chat_messages, max_tokens=100), {"id": "m"}),  # a card without it
    ]
    for request, given in held:
        out, waited = run_virtual(main(request, given))
        assert out.status == 200 and waited == pytest.approx(42.0), out.body


def test_a_replica_late_to_prove_itself_is_passed_over_for_the_request_but_not_taken_out():
    """A challenge on a fresh connection answered late (a burst) had taken a working replica out as unreachable."""
    from fleetserve.router.upstream import Impostor, Unproven

    async def main(error, times: int = 1):
        gw, _ = gateway({A: [error] * times, B: [FakeResponse(200, [OK])] * times})
        gw.set_backends([A, B], ready={A, B})
        statuses = []
        for _ in range(times):
            out = Recorder()
            await gw.handle(chat(), out)
            statuses.append(out.status)
        backend = gw.pool.backends["10.0.0.1:8000"]
        return set(statuses), backend.healthy, backend.breaker

    # the other replica answered; this one stays in, and late answers never open its breaker (12 in a row had)
    assert run_virtual(main(Unproven("late"), 12)) == ({200}, True, "closed")
    assert run_virtual(main(Impostor("another process"))) == ({200}, False, "closed")  # not the replica: out


def test_a_head_at_zero_never_wakes_the_fleet():
    """An uptime monitor's HEAD /v1/models (a 405 before the router took HEAD) waited in the scale-from-zero buffer
    when the router knows no served name (LoRA, external engines), and woke the fleet every time (found in review):
    a 503 at once; with the served names the router answers it itself, as GET."""
    async def main(models: tuple[str, ...]):
        loop = asyncio.get_running_loop()
        gw, up = gateway({A: [FakeResponse(200, [b'{"data": []}'])]}, clock=loop.time, buffer_timeout=600.0,
                         served_models=models)
        backend = gw.pool.backends["10.0.0.1:8000"]
        backend.healthy = False
        gw.pool._signal()
        out, started = Recorder(), loop.time()
        await gw.handle(Request("HEAD", "/v1/models", b"", [], b"", ("127.0.0.1", 1), "1.1", True), out)
        return out.status, loop.time() - started, gw.gate.pending

    assert run_virtual(main(())) == (503, 0.0, 0)
    assert run_virtual(main(("m",))) == (200, 0.0, 0)


def test_two_authorization_headers_at_zero_on_a_keyless_router_are_answered_without_a_wake():
    """Found in review: the check of repeated Authorization headers (400 where keys are checked) also kept a
    keyless router from answering GET /v1/models at zero: it waited in the buffer, waking the fleet."""
    async def main():
        loop = asyncio.get_running_loop()
        gw, _ = gateway({A: []}, clock=loop.time, buffer_timeout=600.0, served_models=("m",))
        gw.pool.backends["10.0.0.1:8000"].healthy = False
        gw.pool._signal()
        out, started = Recorder(), loop.time()
        twice = [(b"authorization", b"Bearer a"), (b"authorization", b"Bearer b")]
        await gw.handle(Request("GET", "/v1/models", b"", twice, b"", ("127.0.0.1", 1), "1.1", True), out)
        return out.status, loop.time() - started, gw.gate.pending

    assert run_virtual(main()) == (200, 0.0, 0)


def test_only_model_requests_routed_count_as_the_autoscalers_activity():
    """Found in review: every proxied request counted, so a monitor polling GET /v1/models with a replica ready kept
    the fleet from ever reaching zero."""
    async def main():
        gw, _ = gateway({A: [FakeResponse(200, [b'{"data": []}'])] * 3 + [FakeResponse(200, [OK])]})
        gw.set_backends([A], ready={A})
        for method in ("GET", "HEAD", "GET"):
            await gw.handle(Request(method, "/v1/models", b"", [], b"", ("127.0.0.1", 1), "1.1", True), Recorder())
        listed = gw.load_report()["routed_total"]
        await gw.handle(chat(), Recorder())
        return listed, gw.load_report()["routed_total"]

    assert run_virtual(main()) == (0, 1)


def test_answers_refused_before_routing_have_a_request_line_and_a_tenant_count(caplog):
    """A 404 on an unknown path, a 405, a 413 or 431 found while parsing were counted and carried a request id,
    but wrote no request line, and the tenant series missed them: the id a client quoted led nowhere."""
    import logging

    async def main():
        gw, _ = gateway({A: [], B: []})
        wrong_method = Request("GET", "/v1/chat/completions", b"", [(b"x-request-id", b"mine-1")], b"",
                               ("127.0.0.1", 5555), "1.1", True)
        await gw.handle(wrong_method, Recorder())
        unknown = Request("GET", "/v1/" + "x" * 300, b"", [], b"", ("127.0.0.1", 5555), "1.1", True)
        await gw.handle(unknown, Recorder())
        too_large = Recorder()
        too_large.rejected_path = "/v1/completions"
        gw.error(too_large, 413, "request body is over 1024 bytes", "request_too_large")
        headers_too_large = Recorder()  # the request line never came whole
        gw.error(headers_too_large, 431, "request headers are over 1024 bytes", "request_header_fields_too_large")
        gw.access.close()
        return gw

    with caplog.at_level(logging.INFO, logger="fleetserve.router.access"):
        gw = run_virtual(main())
    lines = [(r.status, r.path, getattr(r, "error", None)) for r in caplog.records if r.getMessage() == "request"]
    assert lines == [(405, "/v1/chat/completions", "method_not_allowed"), (404, "/v1/" + "x" * 196 + "...", None),
                     (413, "/v1/completions", "request_too_large"), (431, "?", "request_header_fields_too_large")]
    assert [r.request_id for r in caplog.records if r.getMessage() == "request"][0] == "mine-1"
    tenants = {s.labels["code"]: s.value for f in gw.metrics.registry.collect() for s in f.samples
               if s.name == "fleetserve_router_tenant_requests_total"}
    assert tenants == {"405": 1.0, "404": 1.0, "413": 1.0, "431": 1.0}


def test_a_bad_key_or_another_models_name_is_no_invocation_of_this_model_in_either_scope():
    """In front of vLLM (scope all) a wrong API key counted an invocation and a 401 error of the model: a scanner
    fed the invocation rate, request-rate triggers and the error panels."""
    from prometheus_client import CollectorRegistry

    from fleetserve.observe.metrics import ModelIdentity
    from fleetserve.router.model_metrics import ModelMetrics

    for scope in ("all", "router"):
        registry = CollectorRegistry()
        metrics = ModelMetrics(ModelIdentity("ns", "m", "1", "g5", ""), registry, scope)
        for status in (401, 403, 404):
            metrics.refused(status)
        metrics.refused(503)
        counted = {(s.name, s.labels.get("status")): s.value for f in registry.collect() for s in f.samples
                   if s.value and s.name in ("model_invocations_total", "model_errors_total")}
        assert counted == {("model_invocations_total", None): 1.0, ("model_errors_total", "503"): 1.0}, scope


def test_a_client_that_leaves_between_attempts_is_one_invocation_and_a_404_only_for_another_model_is_none():
    """Found by review: a client gone during the backoff after a failed attempt counted no invocation at all (the
    failed attempt no longer counts one); and every upstream 404 had been read as another model's, so a container
    without the invocation path (404 to everything) read as an idle fleet."""
    from fleetserve.observe.metrics import ModelIdentity

    identity = ModelIdentity("ns", "m", "1", "g5", "")

    async def left_during_backoff():
        gw, _ = gateway({A: [Unreachable("refused")], B: [FakeResponse(200, [OK])]}, model_identity=identity,
                        model_metrics_scope="all")
        gw.set_backends([A, B], ready={A, B}, names={A: "r0", B: "r1"})
        task = asyncio.ensure_future(gw.handle(chat(), Recorder()))
        await asyncio.sleep(0.02)  # the first attempt failed at once; the retry waits 50-150 ms
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return gw

    gw = run_virtual(left_during_backoff())
    assert model_samples(gw, "model_invocations_total") == {("r0", None): 1.0}
    assert model_samples(gw, "model_errors_total") == {}
    assert not any(s.value for f in gw.metrics.registry.collect() for s in f.samples
                   if s.name == "model_concurrent_requests")

    async def answered_404(body: bytes):
        gw, _ = gateway({A: [FakeResponse(404, [body], [(b"content-type", b"application/json")])]},
                        model_identity=identity, model_metrics_scope="all")
        out = Recorder()
        await gw.handle(chat(), out)
        return gw, out

    gw, out = run_virtual(answered_404(b'{"error": {"message": "no route", "code": "not_found"}}'))
    assert out.status == 404 and model_samples(gw, "model_errors_total") == {("10.0.0.1:8000", "404"): 1.0}
    gw, out = run_virtual(answered_404(b'{"error": {"message": "no such model", "code": "model_not_found"}}'))
    assert out.status == 404 and model_samples(gw, "model_errors_total") == {}
    assert model_samples(gw, "model_invocations_total") == {}


@pytest.mark.parametrize("scope", ["all", "router"])
def test_a_replicas_error_series_and_the_routers_request_counts_are_at_zero_before_any_request(scope):
    """rate() reads a series' first sample as its start: the router made a replica's model_errors_total{status=502}
    at its first 502, so a replica that hung (every request a 502) read 0 % errors in the error ratio, its burn
    alerts and the panels (found in a black-box pass, with the fleet's own Prometheus). Made at 0 when the replica
    joins, at start and on every backend change, as the engines make theirs; the router's request counts too."""
    from fleetserve.observe.metrics import PRESET_ERROR_STATUSES, ModelIdentity

    def zeros(gw):
        found = {}
        for family in gw.metrics.registry.collect():
            for s in family.samples:
                if s.name in ("model_errors_total", "model_invocations_total", "fleetserve_router_requests_total",
                              "fleetserve_router_requests_received_total"):
                    key = s.labels.get("replica") or s.labels.get("path")
                    found.setdefault((s.name, key), set()).add(s.labels.get("status") or s.labels.get("code"))
                    assert s.value == 0
        return found

    gw, _ = gateway({A: [], B: []}, model_identity=ModelIdentity("ns", "m", "1", "g5", ""),
                    model_metrics_scope=scope)
    found = zeros(gw)
    for replica in ("10.0.0.1:8000", "10.0.0.2:8000", "router"):
        assert found[("model_errors_total", replica)] == set(PRESET_ERROR_STATUSES)
        assert ("model_invocations_total", replica) in found
    for path in ("/v1/chat/completions", "/v1/completions"):
        assert found[("fleetserve_router_requests_total", path)] == {"200", *PRESET_ERROR_STATUSES}
        assert ("fleetserve_router_requests_received_total", path) in found
    assert ("fleetserve_router_requests_received_total", "/invocations") in found  # SageMaker's path, as it arrives
    gw.set_backends(["http://10.0.0.3:8000"], ready={"http://10.0.0.3:8000"}, names={"http://10.0.0.3:8000": "r7"})
    assert zeros(gw)[("model_errors_total", "r7")] == set(PRESET_ERROR_STATUSES)


def test_a_replica_that_left_and_came_back_gets_its_series_at_zero_again():
    from prometheus_client import CollectorRegistry

    from fleetserve.observe.metrics import ModelIdentity
    from fleetserve.router.model_metrics import ModelMetrics

    registry = CollectorRegistry()
    metrics = ModelMetrics(ModelIdentity("ns", "m", "1", "g5", ""), registry)

    def replicas() -> set[str]:
        return {s.labels["replica"] for f in registry.collect() for s in f.samples if s.name == "model_errors_total"}

    metrics.start("r1")
    assert replicas() == {"router", "r1"}
    metrics.forget(["r1"])
    assert replicas() == {"router"}
    metrics.start("r1")  # back (a scale-up reusing its name): at 0 again, not left out as already started
    assert replicas() == {"router", "r1"}

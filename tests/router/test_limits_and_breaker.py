"""Request limits (HyperPod's requestLimits) and the circuit breaker."""

from concurrent.futures import ThreadPoolExecutor

import httpx

from fleetserve.clock import ManualClock
from fleetserve.router.pool import BackendPool, BreakerSettings
from tests.helpers import Server, wait_until


def test_limits_queue_then_overflow_with_retry_after(tmp_path):
    engine = Server(["engine", "--simulate", "fast", "--served-model-name", "sim", "--speedup", "0.02"],
                    tmp_path / "sim.log").start()
    gw = Server(["router", "--backend", engine.url, "--max-concurrent-per-replica", "1", "--max-queue", "1"],
                tmp_path / "router.log").start()
    body = {"model": "sim", "prompt": "x", "max_tokens": 160}  # 4 s each: the first still runs when the third comes
    try:
        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(httpx.post, gw.url + "/v1/completions", json=body, timeout=60)
            wait_until(lambda: httpx.get(gw.url + "/health", timeout=5).json()["backends"][0]["in_flight"] == 1, 30)
            second = pool.submit(httpx.post, gw.url + "/v1/completions", json=body, timeout=60)
            wait_until(lambda: httpx.get(gw.url + "/admin/load", timeout=5).json()["pending"] == 0 and
                       _queued(gw) == 1, 30, what="second request queued")
            # a queue_depth trigger counts it: the supervisor reads /admin/load, the simulator counts its queue
            load = httpx.get(gw.url + "/admin/load", timeout=5).json()
            assert load["queued"] == 1 and load["waiting"] == 1, load  # the engine itself runs one, queues none
            third = httpx.post(gw.url + "/v1/completions", json=body, timeout=60)
            assert third.status_code == 429 and third.headers["retry-after"]
            assert third.json()["error"]["code"] == "overloaded"
            assert first.result().status_code == 200 and second.result().status_code == 200
    finally:
        gw.stop()
        engine.stop()


def _queued(gw) -> int:
    from tests.metrics_text import sample

    return int(sample(gw.url, "fleetserve_router_queued_requests"))


def test_circuit_breaker_opens_after_failures_and_closes_after_successes():
    clock = ManualClock()
    pool = BackendPool([], breaker=BreakerSettings(failures_to_open=3, open_seconds=60, successes_to_close=2),
                       clock=clock)
    pool.set_backends(["http://b"], ready={"http://b"})
    backend = pool.get("b")
    pool.request_failed(backend, "boom")
    pool.request_failed(backend, "boom")
    pool.request_succeeded(backend)  # closed: failures count in a row, a success starts over
    pool.request_failed(backend, "boom")
    pool.request_failed(backend, "boom")
    assert backend.eligible and backend.breaker == "closed"
    pool.request_failed(backend, "boom")
    assert not backend.eligible and backend.breaker == "open"  # no traffic even though its probes pass
    clock.now += 59.9
    assert not backend.eligible
    clock.now += 0.2
    assert backend.eligible and backend.breaker == "half-open"
    pool.request_failed(backend, "boom")  # half-open: one failure re-opens at once
    assert backend.breaker == "open" and not backend.eligible
    clock.now += 61
    pool.request_succeeded(backend)
    assert backend.breaker == "half-open"
    pool.request_succeeded(backend)
    assert backend.breaker == "closed" and backend.eligible
    pool.request_failed(backend, "boom")
    pool.request_failed(backend, "boom")
    assert backend.breaker == "closed"  # closed again: it takes failures_to_open in a row to open


def test_a_health_probe_records_our_in_flight_count_with_the_report(tmp_path):
    """The report's queue is as old as the probe; what it held beyond our own requests then is other routers'
    load (ReplicaView.load). A real engine process answers the probe."""
    import asyncio

    engine = Server(["engine", "--simulate", "fast", "--served-model-name", "sim"], tmp_path / "sim.log").start()
    try:
        async def probe():
            pool = BackendPool([])
            pool.set_backends([engine.url], ready={engine.url})
            (backend,) = pool.backends.values()
            backend.in_flight = 2  # ours, outstanding when the engine answers
            await pool.probe(backend)
            await pool.client.aclose()
            return backend

        backend = asyncio.run(probe())
        assert backend.reported_in_flight == 2 and (backend.running, backend.waiting) == (0, 0)
        view = backend.view()
        assert view.reported_in_flight == 2 and view.load == 2  # an idle engine: only ours
    finally:
        engine.stop()

    async def finishing_during_the_probe():
        """Our 3 requests finish while the report (running 3, made before) travels: they are ours, not others'."""
        pool = BackendPool([])
        pool.set_backends(["http://b"], ready={"http://b"})
        backend = pool.get("b")
        backend.in_flight = 3

        async def get(url, timeout=None, credentials=True, headers=()):
            backend.in_flight = 0
            return 200, b'{"running": 3, "waiting": 0}'

        pool.client.get = get
        await pool.probe(backend)
        await pool.client.aclose()
        return backend

    drained = asyncio.run(finishing_during_the_probe())
    assert drained.reported_in_flight == 3 and drained.view().load == 0  # the larger of the two rules said 3


def test_a_backend_restarted_as_a_new_process_takes_nothing_until_its_probes_pass():
    """The router's own probes had taken a replica in before its supervisor said ready; when it crashed and was
    started again (a new instance id), it stayed healthy, and whatever bound its port got requests."""
    from fleetserve.router.pool import BackendPool

    pool = BackendPool([], interval=0.05)
    url = "http://127.0.0.1:9"
    pool.set_backends([url], instances={url: "first"})
    backend = next(iter(pool.backends.values()))
    backend.healthy = True  # its probes passed; the supervisor has not said ready yet
    pool.set_backends([url], instances={url: "second"})
    assert not backend.healthy and backend.instance == "second"
    pool.set_backends([url], ready={url}, instances={url: "second"})  # the supervisor checked the new one
    assert backend.healthy
    pool.set_backends([url], instances={url: "third"})  # said ready, now starting again: a restart
    assert not backend.healthy


def test_a_client_that_stops_reading_gives_its_replica_slot_back(tmp_path):
    """A stream whose client took no bytes held its slot for as long as its socket stayed open: with one slot per
    replica every other tenant waited out the queue and got 429 (found in a black-box pass)."""
    import json
    import socket

    engine = Server(["engine", "--simulate", "fast", "--served-model-name", "sim"], tmp_path / "sim.log").start()
    gw = Server(["router", "--backend", engine.url, "--max-concurrent-per-replica", "1", "--max-queue", "5",
                 "--client-send-timeout", "1"], tmp_path / "router.log").start()
    stalled = socket.socket()
    try:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", gw.port))
        body = json.dumps({"model": "sim", "prompt": "x", "max_tokens": 30000, "stream": True}).encode()
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(body), body))  # and never reads
        wait_until(lambda: httpx.get(gw.url + "/health", timeout=5).json()["backends"][0]["in_flight"] == 1, 30)
        other = httpx.post(gw.url + "/v1/completions", json={"model": "sim", "prompt": "y", "max_tokens": 4},
                           timeout=60)
        assert other.status_code == 200, other.text
        wait_until(lambda: httpx.get(gw.url + "/health", timeout=5).json()["backends"][0]["in_flight"] == 0, 30,
                   what="the cut stream's slot given back")
        assert "took no byte of its answer" in gw.log()
    finally:
        stalled.close()
        gw.stop()
        engine.stop()


def test_a_router_at_its_connection_limit_answers_503_and_says_so(tmp_path):
    import socket

    engine = Server(["engine", "--simulate", "fast", "--served-model-name", "sim"], tmp_path / "sim.log").start()
    gw = Server(["router", "--backend", engine.url, "--max-connections", "16"], tmp_path / "router.log").start()
    held = []
    try:
        for _ in range(16):
            held.append(socket.create_connection(("127.0.0.1", gw.port)))
        wait_until(lambda: "connections open, the most this router takes" in gw.log()
                   or _refused(gw.port), 30, what="a refusal")
        refused = _refused(gw.port)
        assert refused.startswith(b"HTTP/1.1 503") and b"too_many_connections" in refused, refused
        assert "the most this router takes (--max-connections)" in gw.log()
        for s in held:
            s.close()
        held.clear()
        wait_until(lambda: httpx.get(gw.url + "/health", timeout=5).status_code == 200, 30, what="room again")
    finally:
        for s in held:
            s.close()
        gw.stop()
        engine.stop()


def _refused(port: int) -> bytes:
    import socket

    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        s.settimeout(10)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
            if data.startswith(b"HTTP/1.1 200"):
                break
        return data


def test_a_crash_that_cut_many_streams_leaves_no_open_breaker_on_the_next_process():
    """One crash cut each stream under way, each a failure in a row: ten opened the breaker for 60 s, and the
    replica started again took nothing all that time (its probes passing, /admin/load and the healthy gauge saying
    healthy). A new process starts with a closed breaker: a new instance secret, or an answer after refusals."""
    clock = ManualClock()
    pool = BackendPool([], breaker=BreakerSettings(failures_to_open=3, open_seconds=60), clock=clock)
    url = "http://127.0.0.1:9"
    pool.set_backends([url], ready={url}, instances={url: "first"})
    backend = pool.get("127.0.0.1:9")
    for _ in range(5):  # one crash, five streams
        pool.request_failed(backend, "failed mid-response")
    assert backend.breaker == "open" and not backend.takes_traffic and backend.healthy
    pool.set_backends([url], instances={url: "second"})  # its supervisor starts it again
    pool.set_backends([url], ready={url}, instances={url: "second"})
    assert backend.breaker == "closed" and backend.eligible and backend.takes_traffic
    for _ in range(3):  # no secrets (an engine restarted in place): refused connections, then answers
        pool.request_failed(backend, "failed mid-response")
    pool.mark_unreachable(backend, "connection refused", refused=True)
    assert backend.breaker == "open"
    pool.set_backends([url], ready={url}, instances={url: "second"})
    assert backend.breaker == "closed" and backend.eligible
    pool.request_failed(backend, "boom")
    pool.request_failed(backend, "boom")
    assert backend.breaker == "closed"  # counted afresh: three in a row open it again
    pool.request_failed(backend, "boom")
    assert backend.breaker == "open"


def test_a_restarted_engine_behind_the_real_router_is_taken_back_with_its_breaker_closed(tmp_path):
    """The same through processes: 14 streams cut by a SIGKILL, the engine started again on its port."""
    import signal
    import threading

    engine = Server(["engine", "--simulate", "fast", "--speedup", "0.02", "--served-model-name", "sim"],
                    tmp_path / "engine.log").start()
    router = Server(["router", "--backend", engine.url], tmp_path / "router.log").start()
    started, ended = threading.Semaphore(0), []

    def stream():
        body = {"model": "sim", "prompt": "hello there", "max_tokens": 400, "stream": True}
        try:
            with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=60) as response:
                lines = response.iter_lines()
                next(lines)
                started.release()
                ended.append(any("error" in line for line in lines))
        except httpx.HTTPError:
            ended.append(True)

    def backends() -> list[dict]:
        return httpx.get(router.url + "/health", timeout=10).json()["backends"]

    threads = [threading.Thread(target=stream, daemon=True) for _ in range(14)]
    try:
        for t in threads:
            t.start()
        for _ in threads:
            assert started.acquire(timeout=60)
        engine.kill(signal.SIGKILL)
        for t in threads:
            t.join(timeout=60)
        assert len(ended) == 14 and all(ended), ended  # every stream cut, and told so
        assert backends()[0]["breaker"] == "open"  # the crash tripped it
        restarted = Server(["engine", "--simulate", "fast", "--served-model-name", "sim"], tmp_path / "engine2.log",
                           port=engine.port).start()
        try:
            wait_until(lambda: backends()[0]["healthy"], 30, what="the router's probes of the new process")
            (seen,) = backends()
            assert seen["breaker"] == "closed", seen
            load = httpx.get(router.url + "/admin/load", timeout=10).json()["backends"][0]
            assert load["healthy"] and load["breaker"] == "closed", load
            answer = httpx.post(router.url + "/v1/completions", json={"model": "sim", "prompt": "hi", "max_tokens": 3},
                                timeout=30)
            assert answer.status_code == 200, answer.text
        finally:
            restarted.stop()
    finally:
        router.stop()
        engine.stop()

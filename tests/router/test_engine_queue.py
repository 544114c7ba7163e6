"""The queue of engines that publish it on /metrics only (vLLM, SGLang) reaches /admin/load, the local
autoscaler's input: a queue_depth trigger in front of them read only the router's own queue.

The backend is a real HTTP server on loopback that answers /health with an empty 200 and /metrics with vLLM's
or SGLang's gauges, as they do; the router is the real `fleetserve router` process.
"""

from __future__ import annotations

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from fleetserve.router.engine_queue import gauge_sum, read_queue
from tests.helpers import Server, fleetserve, wait_until

VLLM_METRICS = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 4.0
# HELP vllm:num_requests_waiting_by_reason A longer name that starts with the same words.
vllm:num_requests_waiting_by_reason{reason="capacity"} 90.0
vllm:num_requests_running{engine="0",model_name="m"} 5.0
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 12.0
"""
SGLANG_METRICS = 'sglang:num_running_reqs{model_name="m"} 2\nsglang:num_queue_reqs{model_name="m"} 6\n'


def test_the_gauges_are_summed_over_their_series_and_other_names_are_not_read():
    assert read_queue(VLLM_METRICS, "vllm") == (7, 5)
    assert read_queue(SGLANG_METRICS, "sglang") == (6, 2)
    assert read_queue(SGLANG_METRICS, "vllm") is None and read_queue("", "sglang") is None
    assert gauge_sum('x{a="}"} 1\nvllm:num_requests_waiting{a="}"} 2.5\n', "vllm:num_requests_waiting") == 2.5
    assert gauge_sum("vllm:num_requests_waiting 1e1", "vllm:num_requests_waiting") == 10.0  # no label, no newline
    assert gauge_sum("vllm:num_requests_waiting\t4\r\n", "vllm:num_requests_waiting") == 4.0  # a tab, CRLF
    # NaN and Inf are no queue length (int() of them ended the router's probing)
    assert read_queue("vllm:num_requests_waiting NaN\nvllm:num_requests_waiting{e=\"1\"} +Inf\n", "vllm") is None
    assert read_queue("vllm:num_requests_waiting NaN\nvllm:num_requests_waiting{e=\"1\"} 2\n", "vllm") == (2, 0)


class MetricsOnlyEngine:
    """/health: an empty 200, as vLLM and SGLang answer it; /metrics: the text it is given, `metrics_delay` late."""

    def __init__(self, metrics: str, metrics_delay: float = 0.0):
        self.metrics = metrics
        self.metrics_delay = metrics_delay
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path == "/metrics" and owner.metrics_delay:
                    time.sleep(owner.metrics_delay)
                body = owner.metrics.encode() if self.path == "/metrics" else b""
                self.send_response(200 if self.path in ("/health", "/metrics") else 404)
                self.send_header("content-type", "text/plain")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("kind,metrics,waiting", [("vllm", VLLM_METRICS, 7), ("sglang", SGLANG_METRICS, 6)])
def test_admin_load_counts_the_queue_an_engine_publishes_on_metrics(tmp_path, kind, metrics, waiting):
    engine = MetricsOnlyEngine(metrics)
    with_gauge = Server(["router", "--backend", engine.url, "--health-interval", "0.2", "--queue-metrics", kind],
                        tmp_path / "with.log").start()
    without = Server(["router", "--backend", engine.url, "--health-interval", "0.2"], tmp_path / "without.log").start()
    try:
        wait_until(lambda: httpx.get(with_gauge.url + "/admin/load").json()["waiting"] == waiting, 30,
                   what="the engine's gauge in /admin/load")
        load = httpx.get(with_gauge.url + "/admin/load").json()
        assert load["backends"][0]["waiting"] == waiting and load["queued"] == 0
        engine.metrics = metrics.replace(" 3.0", " 13.0").replace(" 6\n", " 1\n")  # the queue moves: so does the load
        wait_until(lambda: httpx.get(with_gauge.url + "/admin/load").json()["waiting"] == {"vllm": 17, "sglang": 1}[
            kind], 30, what="the new gauge")
        assert httpx.get(without.url + "/admin/load").json()["waiting"] == 0  # the health body says nothing
    finally:
        with_gauge.stop()
        without.stop()
        engine.close()


def test_the_gauge_feeds_the_autoscalers_signal_not_the_routing_score():
    """The simulator's blind router and the router on Kubernetes get no queue from vLLM: the routing view stays
    without it, so the three route alike; an unreadable /metrics (no gauge, NaN) leaves the gauge unknown, not
    stale, and the probing goes on."""
    from fleetserve.router.pool import BackendPool

    engine = MetricsOnlyEngine(VLLM_METRICS)

    async def probe(pool, backend):
        await pool.probe(backend)
        await pool.queue_reads_done()
        return backend.healthy, backend.engine_waiting, backend.engine_running, backend.view().waiting

    async def probes():
        pool = BackendPool([engine.url], queue_metrics="vllm")
        backend = next(iter(pool.backends.values()))
        seen = [await probe(pool, backend)]
        for text in ("no gauges here\n", "vllm:num_requests_waiting NaN\n", VLLM_METRICS):
            engine.metrics = text
            seen.append(await probe(pool, backend))
        await pool.aclose()
        return seen

    try:
        seen = asyncio.run(probes())
    finally:
        engine.close()
    assert seen == [(True, 7, 5, 0), (True, None, None, 0), (True, None, None, 0), (True, 7, 5, 0)]


def test_a_slow_metrics_page_does_not_hold_up_the_health_probes():
    """The /metrics read ran inside the probe, before the health state changed: a page that took 1.8 s made a
    replica healthy 1.8 s late and stretched every probe round."""
    from fleetserve.router.pool import BackendPool

    engine = MetricsOnlyEngine(VLLM_METRICS, metrics_delay=3.0)

    async def probe_once():
        pool = BackendPool([engine.url], queue_metrics="vllm", timeout=10.0)
        backend = next(iter(pool.backends.values()))
        await pool.probe(backend)
        healthy_before_the_page = backend.healthy and backend.engine_waiting is None
        await pool.probe(backend)  # a second probe while the first read is under way starts no second read
        reads = len([t for t in pool._queue_reads.values() if not t.done()])
        await pool.queue_reads_done()
        waiting = backend.engine_waiting
        await pool.probe(backend)
        pool.set_backends([])  # a replica that leaves takes its read with it
        left = dict(pool._queue_reads)
        await pool.aclose()
        return healthy_before_the_page, reads, waiting, left

    try:
        assert asyncio.run(probe_once()) == (True, 1, 7, {})
    finally:
        engine.close()


def test_a_replica_that_reports_its_queue_both_ways_is_counted_once():
    """The built-in engine puts its queue in its health body and exports vllm:num_requests_waiting too: with
    --queue-metrics vllm in front of it, /admin/load added both."""
    from fleetserve.router.gateway import _engine_waiting
    from fleetserve.router.pool import Backend

    backend = Backend("b", "http://b", waiting=3)
    assert _engine_waiting(backend) == 3
    backend.engine_waiting = 3
    assert _engine_waiting(backend) == 3


def test_an_engine_kind_without_gauges_is_refused_naming_the_values():
    result = fleetserve("router", "--backend", "http://127.0.0.1:9", "--queue-metrics", "tgi")
    assert result.returncode == 2 and "--queue-metrics" in result.stderr and "vllm, sglang" in result.stderr
    from fleetserve.router.pool import BackendPool

    with pytest.raises(ValueError, match="vllm, sglang"):  # in code too: a KeyError at the first probe ended them
        BackendPool(["http://127.0.0.1:9"], queue_metrics="tgi")

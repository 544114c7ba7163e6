"""The prometheus trigger against a real Prometheus server scraping a real exporter."""

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from fleetserve.autoscale.controller import Controller
from fleetserve.autoscale.policy import ScalingPolicy, ScalingState, Trigger
from fleetserve.autoscale.signals import query_prometheus
from fleetserve.fleet.process import free_port
from tests.helpers import wait_until

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="Debian's prometheus is not installed (scripts/setup.sh installs it as root)")


@pytest.fixture()
def prometheus_with_gauge(tmp_path):
    registry = CollectorRegistry()
    gauge = Gauge("demo_queue_depth", "queue depth", registry=registry)
    exporter_port = free_port()
    server, _ = start_http_server(exporter_port, addr="127.0.0.1", registry=registry)
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: demo
    static_configs: [{{targets: ["127.0.0.1:{exporter_port}"]}}]
""")
    proc = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        yield f"http://127.0.0.1:{port}", gauge
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        server.shutdown()


def test_prometheus_trigger_reads_promql_and_scales(prometheus_with_gauge):
    url, gauge = prometheus_with_gauge
    gauge.set(24)
    query = "sum(demo_queue_depth)"
    wait_until(lambda: query_prometheus(url, query) == 24.0, 60, interval=0.5, what="prometheus to scrape")
    assert query_prometheus(url, "sum(no_such_metric)") == 0.0  # an empty result is zero load
    assert query_prometheus(url, "sum(") is None  # a bad query is a failed read

    policy = ScalingPolicy(min_replicas=1, max_replicas=10, triggers=(Trigger("prometheus", 4.0),))
    controller = Controller(policy, ScalingState.initial(policy, 1, 0.0), read_load=lambda: None,
                            queries=((url, query),))
    decision = controller.tick(100.0)
    assert decision.desired == 5  # ceil(24 / 4) = 6, rate-limited to +4 in the first 15 s
    assert "prometheus=24" in decision.reason


def test_unreachable_prometheus_is_a_failed_read():
    assert query_prometheus(f"http://127.0.0.1:{free_port()}", "up") is None

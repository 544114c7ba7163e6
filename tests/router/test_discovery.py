"""Backends from DNS (a Kubernetes headless Service): every address is a replica, re-resolved as pods change."""

import asyncio

import httpx
import pytest

from fleetserve.router.discovery import DnsBackends
from fleetserve.router.gateway import Gateway, RouterSettings
from fleetserve.router.pool import BackendPool
from tests.helpers import Server, fleetserve


def test_parse_and_urls_for_v4_and_v6():
    name = DnsBackends.parse("engines.default.svc.cluster.local:8000")
    assert (name.host, name.port, name.scheme) == ("engines.default.svc.cluster.local", 8000, "http")
    urls = name.urls(lambda host, port: ["10.0.0.7", "fd00::3"])
    assert urls == ["http://10.0.0.7:8000", "http://[fd00::3]:8000"]
    assert DnsBackends.parse("https://e:443").scheme == "https"


@pytest.mark.parametrize("bad", ["engines", "engines:http", "ftp://e:1", ":8000", "e:70000"])
def test_bad_names_are_refused(bad):
    with pytest.raises(ValueError, match="HOST:PORT"):
        DnsBackends.parse(bad)


def test_the_backend_set_follows_the_name_and_keeps_state_of_replicas_that_stay():
    answers = [["10.0.0.1", "10.0.0.2"], ["10.0.0.2", "10.0.0.3"], OSError("no such host")]

    def resolver(host, port):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def main():
        pool = BackendPool([])
        gateway = Gateway(pool, RouterSettings(backend_dns=(DnsBackends.parse("engines:8000"),)))
        gateway.watcher.resolver = resolver
        await gateway.watcher.discover()
        first = sorted(b.url for b in pool.backends.values())
        pool.get("10.0.0.2:8000").in_flight = 3  # state that must survive the next resolution
        await gateway.watcher.discover()
        second = sorted(b.url for b in pool.backends.values())
        kept = pool.get("10.0.0.2:8000").in_flight
        await gateway.watcher.discover()  # a failed resolution keeps the last set
        third = sorted(b.url for b in pool.backends.values())
        await gateway.upstream.aclose()
        await pool.aclose()
        return first, second, kept, third

    first, second, kept, third = asyncio.run(main())
    assert first == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert second == third == ["http://10.0.0.2:8000", "http://10.0.0.3:8000"]
    assert kept == 3


def test_a_router_finds_its_engine_through_dns(tmp_path):
    engine = Server(["engine", "--simulate", "fast", "--served-model-name", "sim"], tmp_path / "sim.log").start()
    gw = Server(["router", "--backend-dns", f"localhost:{engine.port}", "--health-interval", "0.2"],
                tmp_path / "router.log").start()
    try:
        r = httpx.post(gw.url + "/v1/completions", json={"model": "sim", "prompt": "hi", "max_tokens": 2},
                       timeout=30)
        assert r.status_code == 200 and r.headers["x-fleetserve-replica"] == f"127.0.0.1:{engine.port}"
        backends = httpx.get(gw.url + "/health", timeout=5).json()["backends"]
        assert f"http://127.0.0.1:{engine.port}" in [b["url"] for b in backends]
    finally:
        gw.stop()
        engine.stop()


def test_the_cli_names_the_bad_option():
    out = fleetserve("router", "--backend-dns", "no-port-here")
    assert out.returncode == 2 and "--backend-dns" in out.stderr

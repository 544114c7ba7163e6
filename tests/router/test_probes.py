"""The router's own probes (Kubernetes): live while it answers, ready until it stops, whatever its replicas do."""

from starlette.testclient import TestClient

from fleetserve.router.admin import build_control_app
from fleetserve.router.gateway import Gateway, RouterSettings
from fleetserve.router.pool import BackendPool


def test_readyz_turns_503_when_the_router_stops_and_livez_stays_200():
    gateway = Gateway(BackendPool([]), RouterSettings())  # no replica at all
    client = TestClient(build_control_app(gateway))
    assert client.get("/health").status_code == 503
    assert client.get("/readyz").status_code == 200 and client.get("/livez").status_code == 200
    gateway.gate.close()  # the stop begins: what waits is answered 503, and the Service should send no more
    assert client.get("/readyz").json() == {"status": "stopping"} and client.get("/readyz").status_code == 503
    assert client.get("/livez").status_code == 200

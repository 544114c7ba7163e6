"""`status` and `up` say how each tenant's own Redis is (kvCache.l2.tenantUrls), probed by the supervisor: one
that refused its tenant or had died read nothing anywhere but an engine's log line (found in review)."""

from __future__ import annotations

import copy
import hashlib
from dataclasses import replace

import redis
from typer.testing import CliRunner

from fleetserve.cli.app import _startup_warnings, app
from fleetserve.fleet.process import free_port
from fleetserve.fleet.state import write_state
from fleetserve.fleet.supervisor import Supervisor
from fleetserve.spec import load_spec_text
from tests.cli.test_status_watch import fleet


def _spec(shared: str, alpha: str, beta: str) -> str:
    keys = ", ".join(f"{{tenant: {t}, keySha256: '{hashlib.sha256(t.encode()).hexdigest()}'}}" for t in ("alpha",
                                                                                                         "beta"))
    return ("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {name: tl2}\nspec:\n"
            "  model: {source: builtin:smollm2-135m}\n"
            f"  auth: {{enabled: true, apiKeys: [{keys}]}}\n"
            f"  kvCache: {{l2: {{enabled: true, url: '{shared}',\n"
            f"                tenantUrls: {{alpha: '{alpha}', beta: '{beta}'}}}}}}\n")


def test_the_supervisor_probes_each_tenants_redis_and_says_which_is_not_up(redis_server, tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path))
    shared = redis_server["url"]
    alpha = shared.rsplit("/", 1)[0] + "/1"  # another database of the shared server: it takes its password
    beta = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens
    redis.Redis.from_url(shared).config_set("requirepass", "pw")
    spec = _spec(shared.replace("redis://", "redis://:pw@"), alpha, beta)
    said: list[str] = []
    sup = Supervisor(load_spec_text(spec), str(tmp_path / "e.yaml"), say=said.append)
    sup._start_redis()
    tenants = sup.state.l2_tenants
    assert tenants["alpha"] == {"url": alpha, "status": "up"}
    assert tenants["beta"]["url"] == beta and tenants["beta"]["status"].startswith("unreachable (")
    (line,) = [s for s in said if "tenant" in s]
    assert line.startswith(f"L2 Redis of tenant beta at {beta} is unreachable")
    redis.Redis.from_url(shared, password="pw").config_set("requirepass", "changed")  # alpha's password is wrong now
    sup._probe_l2(sup._l2_probe_at + 1, wait=True)
    assert "wrong user name or password" in tenants["alpha"]["status"], tenants
    state = replace(fleet(), l2_url=shared, l2_status="up", l2_tenants=copy.deepcopy(tenants))
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path / "status"))
    write_state(state)
    shown = CliRunner().invoke(app, ["status"]).output
    assert f"l2 of tenant alpha: {alpha} refused (" in shown and f"l2 of tenant beta: {beta} unreachable (" in shown
    redis.Redis.from_url(shared, password="changed").config_set("requirepass", "pw")  # fixed again
    sup._probe_l2(sup._l2_probe_at + 1)  # as the supervisor's loop does: on a thread, which holds nothing up
    sup._l2_prober.join(30)
    assert tenants["alpha"]["status"] == "up", tenants


def test_a_detached_start_says_which_tenants_redis_does_not_answer(capsys):
    state = replace(fleet(), l2_tenants={"alpha": {"url": "redis://a.x/0", "status": "up"},
                                         "beta": {"url": "redis://b.x/0", "status": "unreachable (ConnectionError)"}})
    _startup_warnings(state)
    err = capsys.readouterr().err
    assert "L2 Redis of tenant beta at redis://b.x/0 is unreachable (ConnectionError)" in err and "alpha" not in err

"""API keys to tenants, tenant-salted caches, TLS with a self-signed certificate."""

import json
import os
import signal
import ssl

import httpx
import openai
import pytest

from fleetserve.router.auth import key_digest
from tests.helpers import Server, fleetserve, internal_token, processes_with_env
from tests.metrics_text import sample


def test_keys_map_to_tenants_and_tenants_do_not_share_cache(tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": {key_digest("alpha-key"): "alpha", key_digest("beta-key"): "beta"}}))
    token_file, internal = internal_token(tmp_path)
    engine = Server(["engine", "--simulate", "fast", "--served-model-name", "sim", "--block-size", "4",
                     "--internal-token-file", token_file], tmp_path / "sim.log").start()
    gw = Server(["router", "--backend", engine.url, "--auth-file", str(keys), "--internal-token-file", token_file],
                tmp_path / "router.log").start()
    body = {"model": "sim", "prompt": list(range(41)), "max_tokens": 2}  # 10 blocks of 4, and the token always computed
    try:
        assert httpx.post(gw.url + "/v1/completions", json=body, timeout=30).status_code == 401
        wrong = httpx.post(gw.url + "/v1/completions", json=body, headers={"authorization": "Bearer nope"}, timeout=30)
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        for pair in (("nope", "alpha-key"), ("alpha-key", "nope")):  # the last had won, whatever the first said
            twice = httpx.post(gw.url + "/v1/completions", json=body, timeout=30,
                               headers=[("authorization", f"Bearer {key}") for key in pair])
            assert twice.status_code == 400 and twice.json()["error"]["param"] == "authorization", twice.text
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=gw.url + "/v1", api_key="nope", max_retries=0).models.list()

        def cached(key, spoof=None):
            headers = {"authorization": f"Bearer {key}"}
            if spoof:
                headers["x-fleetserve-tenant"] = spoof  # a client cannot choose its tenant
            r = httpx.post(gw.url + "/v1/completions", json=body, headers=headers, timeout=30)
            assert r.status_code == 200
            assert "x-fleetserve-replica" not in r.headers  # a tenant is not told the replicas' addresses
            return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

        assert cached("alpha-key") == 0
        assert cached("alpha-key") == 40
        assert cached("beta-key", spoof="alpha") == 0  # same prompt, other tenant: no sharing
        assert sample(gw.url, "fleetserve_router_tenant_requests_total", internal, tenant="alpha", code="200") == 2
        assert sample(gw.url, "fleetserve_router_tenant_requests_total", internal, tenant="-", code="401") >= 2
        # the scaling signal counts the 3 requests with a valid key: the 2 refused 401 had moved it too (a client
        # without a key could scale a Kubernetes fleet up by its request rate)
        assert sample(gw.url, "fleetserve_router_requests_received_total", internal, path="/v1/completions") == 3
        # with keys on, loopback is no credential: any local process (or a TLS proxy on the host) had been admin,
        # and could PUT its own backend to read the tenants' prompts and the internal token the router sends it
        alpha = {"authorization": "Bearer alpha-key"}
        assert httpx.get(gw.url + "/metrics", headers=alpha, timeout=5).status_code == 401
        assert httpx.get(gw.url + "/admin/load", headers=alpha, timeout=5).status_code == 403
        hijack = {"backends": [{"url": "http://127.0.0.1:9", "state": "ready"}]}
        assert httpx.put(gw.url + "/admin/backends", json=hijack, timeout=5).status_code == 403
        assert "backends" not in httpx.get(gw.url + "/health", timeout=5).json()  # replica URLs: admins only
        assert httpx.get(gw.url + "/admin/load", headers=internal, timeout=5).status_code == 200
        # bench replay sends a key (from OPENAI_API_KEY, or --api-key-env): without one every request was a 401
        trace = tmp_path / "t.jsonl"
        trace.write_text("".join(json.dumps({"timestamp": i * 10, "input_length": 8, "output_length": 2}) + "\n"
                                 for i in range(3)))
        args = ("bench", "replay", "--url", gw.url + "/v1", "--trace", str(trace), "--model", "sim")
        with_key = fleetserve(*args, "--api-key-env", "REPLAY_KEY", env={"REPLAY_KEY": "beta-key"})
        assert with_key.returncode == 0 and json.loads(with_key.stdout)["answered"] == 3, with_key.stderr
        without = fleetserve(*args, env={"OPENAI_API_KEY": ""})
        assert without.returncode == 1 and "missing API key" in without.stdout
    finally:
        gw.stop()
        engine.stop()


SPEC = """
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {{name: secure}}
spec:
  model: {{name: tiny, source: "{source}"}}
  engine: {{threads: 1}}
  replicas: 1
  routing: {{strategy: leastload}}
  tls: {{enabled: true}}
  auth:
    enabled: true
    apiKeys: [{{tenant: team-a, keyEnv: TEAM_A_KEY}}, {{tenant: team-b, keySha256: "{digest}"}}]
"""


def test_fleet_with_tls_self_signed_and_api_keys(tmp_path, tiny_model):
    home = {"FLEETSERVE_HOME": str(tmp_path / "home"), "TEAM_A_KEY": "secret-a"}
    spec = tmp_path / "secure.yaml"
    spec.write_text(SPEC.format(source=tiny_model, digest=key_digest("secret-b")))
    try:
        up = fleetserve("up", str(spec), "--detach", env=home)
        assert up.returncode == 0, up.stderr
        state = json.loads(fleetserve("status", "--json", env=home).stdout)[0]
        assert state["url"].startswith("https://") and os.path.isfile(state["tls_cert"])
        assert "TLS certificate" in up.stdout
        with httpx.Client(verify=ssl.create_default_context(cafile=state["tls_cert"])) as http:
            client = openai.OpenAI(base_url=state["url"], api_key="secret-a", http_client=http, max_retries=0)
            reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=2)
            assert reply.choices
            client_b = openai.OpenAI(base_url=state["url"], api_key="secret-b", http_client=http, max_retries=0)
            assert client_b.models.list().data[0].id == "tiny"
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=state["url"], api_key="wrong", http_client=http,
                              max_retries=0).models.list()
        with pytest.raises(httpx.ConnectError):  # an unverified client refuses the self-signed certificate
            httpx.get(state["url"] + "/models", timeout=5)
        auth_file = tmp_path / "home" / "run" / "secure" / "auth.json"
        assert "secret-a" not in auth_file.read_text() and oct(auth_file.stat().st_mode & 0o777) == "0o600"
        # the internal token, which every replica is sent, reads the admin API but never changes the backend set:
        # a process that took a crashed replica's port had read it and PUT itself as the only backend
        token = (tmp_path / "home" / "run" / "secure" / "internal.token").read_text().strip()
        with httpx.Client(verify=ssl.create_default_context(cafile=state["tls_cert"])) as http:
            bearer = {"authorization": f"Bearer {token}"}
            assert http.get(state["url"].removesuffix("/v1") + "/admin/load", headers=bearer).status_code == 200
            hijack = {"backends": [{"url": "http://127.0.0.1:9", "state": "ready"}]}
            assert http.put(state["url"].removesuffix("/v1") + "/admin/backends", json=hijack,
                            headers=bearer).status_code == 403
        # the plaintext key is the supervisor's alone: Prometheus's /proc/PID/environ had held it too
        children = [p for p in processes_with_env("FLEETSERVE_HOME", home["FLEETSERVE_HOME"])
                    if p != state["supervisor_pid"]]
        assert children
        for pid in children:
            try:
                environ = open(f"/proc/{pid}/environ", "rb").read()
            except OSError:
                continue  # gone meanwhile
            assert b"TEAM_A_KEY=" not in environ, open(f"/proc/{pid}/cmdline", "rb").read()
    finally:
        fleetserve("down", env=home)
        for pid in processes_with_env("FLEETSERVE_HOME", home["FLEETSERVE_HOME"]):
            os.kill(pid, signal.SIGKILL)


def test_a_replica_that_refuses_the_routers_credentials_is_a_502_naming_them(tmp_path):
    """A router without the engines' internal token looked healthy (their /health needs none) and answered every
    request 401 invalid_api_key, which a client reads as its own key being wrong."""
    token_file, _ = internal_token(tmp_path)
    engine = Server(["engine", "--simulate", "fast", "--served-model-name", "sim", "--internal-token-file",
                     token_file], tmp_path / "sim.log").start()
    gw = Server(["router", "--backend", engine.url], tmp_path / "router.log").start()
    try:
        r = httpx.post(gw.url + "/v1/completions", json={"model": "sim", "prompt": "hi", "max_tokens": 2}, timeout=30)
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unauthorized", r.text
        assert "--internal-token-file" in r.json()["error"]["message"]
        assert "refused the router's credentials" in (tmp_path / "router.log").read_text()
    finally:
        gw.stop()
        engine.stop()
    # a token rotation under way: a replica with another token is passed over, the request answered elsewhere
    other_file, _ = internal_token(tmp_path / "other")
    right = Server(["engine", "--simulate", "fast", "--served-model-name", "sim", "--internal-token-file",
                    token_file], tmp_path / "right.log").start()
    wrong = Server(["engine", "--simulate", "fast", "--served-model-name", "sim", "--internal-token-file",
                    other_file], tmp_path / "wrong.log").start()
    gw = Server(["router", "--backend", right.url, "--backend", wrong.url, "--strategy", "roundrobin",
                 "--internal-token-file", token_file], tmp_path / "router2.log").start()
    try:
        for _ in range(4):
            r = httpx.post(gw.url + "/v1/completions", json={"model": "sim", "prompt": "hi", "max_tokens": 2},
                           timeout=30)
            assert r.status_code == 200, r.text
    finally:
        gw.stop()
        right.stop()
        wrong.stop()


@pytest.mark.parametrize("tenant", ["a\r\nx-evil: 1", "équipe", " acme", ""])
def test_a_key_files_tenant_a_header_cannot_carry_is_refused(tmp_path, tenant):
    """A tenant travels to the engines in a header: a line break in it wrote a header of its own into every
    upstream request, and a letter past ASCII reached the engines as another tenant (found in review)."""
    from fleetserve.router.auth import KeyRing

    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": {"a" * 64: tenant}}))
    with pytest.raises(ValueError, match="printable ASCII"):
        KeyRing.from_file(path)
    path.write_text(json.dumps({"keys": {key_digest("k"): "Acme Corp/team-1"}}))  # free text otherwise
    assert KeyRing.from_file(path).tenant("Bearer k") == "Acme Corp/team-1"


def test_an_unset_key_variable_is_a_validate_warning_and_bad_input_to_up_before_anything_starts(tmp_path):
    """validate called the spec valid; up exited 1 after it had started Redis, and left a failed fleet whose
    state the next start took for the last run's (a new URL, the last run's logs rotated away)."""
    home = {"FLEETSERVE_HOME": str(tmp_path / "home")}  # TEAM_A_KEY unset
    spec = tmp_path / "secure.yaml"
    spec.write_text(SPEC.format(source=tmp_path / "no-model-needed", digest=key_digest("secret-b")))
    checked = fleetserve("validate", str(spec), env=home)
    assert checked.returncode == 0 and "spec.auth.apiKeys[0].keyEnv" in checked.stderr, checked.stderr
    assert "'TEAM_A_KEY'" in checked.stderr
    up = fleetserve("up", str(spec), "--detach", env=home)
    assert up.returncode == 2 and "spec.auth.apiKeys[0].keyEnv: environment variable 'TEAM_A_KEY'" in up.stderr
    assert json.loads(fleetserve("status", "--json", "--all", env=home).stdout) == []  # no fleet recorded
    same = fleetserve("up", str(spec), "--detach", env={**home, "TEAM_A_KEY": "secret-b"})  # team-b's key too
    assert same.returncode == 2 and "holds the same key as apiKeys[0]" in same.stderr, same.stderr
    assert json.loads(fleetserve("status", "--json", "--all", env=home).stdout) == []


def test_a_tenant_named_like_requests_without_one_is_refused(tmp_path):
    """`-` is the metrics' tenant of requests without one (no key, a wrong key): a tenant of that name shared its
    series with everyone else's auth failures."""
    from fleetserve.router.auth import KeyRing

    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": {"a" * 64: "-"}}))
    with pytest.raises(ValueError, match="names requests without a tenant"):
        KeyRing.from_file(path)

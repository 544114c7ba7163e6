"""What vLLM and SGLang replicas receive from the router: the internal token as their API key, and each
tenant's `cache_salt` (they ignore the tenant header); engines outside the fleet get neither.

The backend is a real HTTP server on loopback that answers like vLLM and records what reached it; the router
is the real `fleetserve router` process; clients use the official `openai` package.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest

from fleetserve.router.auth import key_digest
from tests.helpers import Server, internal_token

ANSWER = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m",
          "choices": [{"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}],
          "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
CHAT = {"id": "chat-1", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


class RecordingEngine:
    """Answers /health and the OpenAI API like an engine; keeps (path, headers, raw body) of every POST."""

    def __init__(self):
        self.seen: list[tuple[str, dict[str, str], bytes]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"status": "ok"} if self.path == "/health" else {"object": "list", "data": []})

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                owner.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, raw))
                self._send(200, CHAT if self.path.endswith("chat/completions") else ANSWER)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self) -> list[dict]:
        return [json.loads(raw) for _, _, raw in self.seen]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine():
    backend = RecordingEngine()
    yield backend
    backend.close()


def _router(tmp_path, engine, *flags, keys: bool = True):
    token_file, _ = internal_token(tmp_path)
    args = ["router", "--backend", engine.url, "--internal-token-file", token_file, *flags]
    if keys:
        path = tmp_path / "keys.json"
        path.write_text(json.dumps({"keys": {key_digest("alpha-key"): "alpha", key_digest("beta-key"): "beta"}}))
        args += ["--auth-file", str(path)]
    return Server(args, tmp_path / "router.log").start(), open(token_file).read().strip()


def _client(router, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key=key, max_retries=0, timeout=30)


def test_each_tenant_reaches_a_gpu_engine_with_its_own_unguessable_cache_salt(tmp_path, engine):
    router, token = _router(tmp_path, engine, "--tenant-cache-salt")
    try:
        alpha, beta = _client(router, "alpha-key"), _client(router, "beta-key")
        alpha.completions.create(model="m", prompt="the same prompt", max_tokens=1)
        alpha.completions.create(model="m", prompt="the same prompt", max_tokens=1)
        beta.completions.create(model="m", prompt="the same prompt", max_tokens=1)
        a1, a2, b = (body["cache_salt"] for body in engine.bodies())
        assert a1 == a2 and a1 != b  # one tenant shares its cache; two tenants never do
        assert len(a1) == 64 and "alpha" not in a1  # an HMAC under the fleet's token: nothing to guess from
        # a client of beta that sends alpha's salt as its own only divides beta's cache further
        beta.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                     extra_body={"cache_salt": a1})
        alpha.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                      extra_body={"cache_salt": "mine"})
        forged, own = (body["cache_salt"] for body in engine.bodies()[3:])
        assert forged not in (a1, b) and own not in (a1, b, forged)
        path, headers, _ = engine.seen[0]
        assert path == "/v1/completions" and headers["authorization"] == f"Bearer {token}"  # vLLM's --api-key
        assert engine.bodies()[0]["prompt"] == "the same prompt"  # the rest of the request is the client's
        # a salt the engine would refuse is refused here, naming the field, and never sent
        sent = len(engine.seen)
        with pytest.raises(openai.BadRequestError) as bad:
            alpha.completions.create(model="m", prompt="x", max_tokens=1, extra_body={"cache_salt": 5})
        assert "cache_salt" in bad.value.message and len(engine.seen) == sent
    finally:
        router.stop()


def test_an_engine_key_is_sent_instead_of_the_internal_token_and_values_survive_the_salt(tmp_path, engine):
    """vLLM/SGLang get an API key of their own (SGLang prints its arguments, key included, in its log): the
    internal token, which opens the router's admin API and keys the salts, never reaches them. The salted body
    keeps what the client wrote, NaN and integers past 64 bits included."""
    key_file = tmp_path / "engine.token"
    key_file.write_text("engine-key-engine-key-0123456789")
    router, token = _router(tmp_path, engine, "--tenant-cache-salt", "--engine-token-file", str(key_file))
    try:
        raw = b'{"model": "m", "prompt": "p", "max_tokens": 1, "seed": 123456789012345678901234567890, ' \
              b'"logit_bias": {"5": -Infinity}}'
        r = httpx.post(router.url + "/v1/completions", content=raw, timeout=30,
                       headers={"content-type": "application/json", "authorization": "Bearer alpha-key"})
        assert r.status_code == 200
        _, headers, sent = engine.seen[0]
        assert headers["authorization"] == "Bearer engine-key-engine-key-0123456789"
        assert token not in json.dumps(headers) and "x-fleetserve-internal" not in headers
        assert sent.startswith(raw[:-1]) and b"123456789012345678901234567890" in sent and b"-Infinity" in sent
        assert len(json.loads(sent)["cache_salt"]) == 64
    finally:
        router.stop()


def test_without_tenants_the_body_reaches_the_engine_byte_for_byte(tmp_path, engine):
    router, _ = _router(tmp_path, engine, "--tenant-cache-salt", keys=False)
    try:
        raw = b'{"model": "m", "prompt": "p",  "max_tokens": 1, "cache_salt": "client-own"}'
        r = httpx.post(router.url + "/v1/completions", content=raw, headers={"content-type": "application/json"},
                       timeout=30)
        assert r.status_code == 200 and engine.seen[0][2] == raw
    finally:
        router.stop()


def test_an_engine_outside_the_fleet_never_receives_the_internal_token(tmp_path, engine):
    router, token = _router(tmp_path, engine, "--no-send-internal-token")
    try:
        _client(router, "alpha-key").completions.create(model="m", prompt="p", max_tokens=1)
        _, headers, _ = engine.seen[0]
        assert "authorization" not in headers and "x-fleetserve-internal" not in headers
        assert token not in json.dumps(headers)
    finally:
        router.stop()


def test_tenant_cache_salt_needs_the_token_that_keys_it(tmp_path):
    from tests.helpers import fleetserve

    out = fleetserve("router", "--backend", "http://127.0.0.1:9", "--tenant-cache-salt", timeout=60)
    assert out.returncode == 2 and "--internal-token-file" in out.stderr


def test_a_fleet_in_front_of_external_engines_keeps_its_token_to_itself(tmp_path, engine, home):
    """`fleetserve up` with `engine.kind: external` answers through the engines (the supervisor used to push
    its empty replica list to the router, so every request waited out the buffer), and the router it starts
    sends them no internal token (that token also opens the router's admin API; the engines are not ours)."""
    from tests.helpers import fleetserve

    spec = tmp_path / "ext.yaml"
    spec.write_text(f"""
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {{name: ext}}
spec:
  model: {{name: m, source: "hf:org/m"}}
  engine: {{kind: external, urls: ["{engine.url}"]}}
  routing: {{strategy: leastload}}
""")
    up = fleetserve("up", str(spec), "--detach", env=home)
    assert up.returncode == 0, up.stderr
    try:
        state = json.loads(fleetserve("status", "ext", "--json", env=home, check=True).stdout)[0]
        openai.OpenAI(base_url=state["url"], api_key="x", max_retries=0, timeout=30).completions.create(
            model="m", prompt="p", max_tokens=1)
        _, headers, _ = engine.seen[0]
        assert "authorization" not in headers and "x-fleetserve-internal" not in headers
    finally:
        assert fleetserve("down", "ext", env=home).returncode == 0


def test_a_standalone_routers_internal_token_never_writes_its_backends_and_odd_credentials_are_no_500(
        tmp_path, engine):
    """Without FLEETSERVE_ADMIN_TOKEN the internal token, which every replica receives, PUT the backend set (any
    replica, or a process on a replica's port, made itself the only one). A non-ASCII credential made the public
    /health a 500 with a traceback per request (`compare_digest` refuses non-ASCII strings)."""
    router, token = _router(tmp_path, engine)
    base = router.url
    try:
        bearer = {"authorization": f"Bearer {token}"}
        assert httpx.get(base + "/admin/load", headers=bearer, timeout=5).status_code == 200  # it reads
        hijack = {"backends": [{"url": "http://127.0.0.1:9", "state": "ready"}]}
        refused = httpx.put(base + "/admin/backends", json=hijack, headers=bearer, timeout=5)
        assert refused.status_code == 403 and "FLEETSERVE_ADMIN_TOKEN" in refused.json()["error"]["message"]
        assert httpx.get(base + "/admin/load", headers=bearer, timeout=5).json()["backends"][0]["url"] == engine.url
        odd = "Bearer \u00e9t\u00e9".encode()  # sent as the raw UTF-8 bytes a client may put there
        for path, headers in (("/health", [(b"authorization", odd)]), ("/ping", [(b"x-fleetserve-internal", odd)]),
                              ("/admin/load", [(b"authorization", odd)]), ("/metrics", [(b"authorization", odd)])):
            answer = httpx.get(base + path, headers=headers, timeout=5)
            assert answer.status_code in (200, 401, 403), (path, answer.status_code, answer.text)
        # the router's own credentials stay with it, and so do the headers a client's Connection names
        _client(router, "alpha-key").completions.create(
            model="m", prompt="p", max_tokens=1,
            extra_headers={"x-fleetserve-admin": "adm", "connection": "keep-alive, x-hop", "x-hop": "1",
                           "x-kept": "2"})
        _, headers, _ = engine.seen[-1]
        assert "x-fleetserve-admin" not in headers and "x-hop" not in headers and headers["x-kept"] == "2"
    finally:
        router.stop()
    assert "Traceback" not in (tmp_path / "router.log").read_text()

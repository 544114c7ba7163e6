"""Finding 3 and the isolation probe: two tenants, every tier, through the router and straight at an engine.

A tenant's cached prefix is reachable only by that tenant through the router; a local process calling the
engine directly can neither claim a tenant (header or cache_salt) nor use the admin API.
"""

import json

import httpx
import redis

from fleetserve.router.auth import key_digest
from tests.helpers import Server, internal_token

PROMPT = "A shared system prompt that both tenants send, long enough for several blocks of sixteen. " * 3


def _cached(url, headers=None, salt=None, prompt=PROMPT):
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    if salt is not None:
        body["cache_salt"] = salt
    r = httpx.post(url + "/v1/completions", json=body, headers=headers or {}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_no_cross_tenant_hit_in_any_tier_and_no_admin_without_credentials(tiny_model, tmp_path, redis_server):
    shared = redis_server["url"]
    vip_db = shared[: shared.rindex("/")] + "/1"
    token_file, internal = internal_token(tmp_path)
    keys = tmp_path / "keys.json"
    names = ("alpha", "beta", "gamma", "delta", "eps", "vip")
    keys.write_text(json.dumps({"keys": {key_digest(f"{n}-key"): n for n in names}}))
    engine = Server(["engine", "--model", str(tiny_model), "--served-model-name", "tiny", "--threads", "1",
                     "--block-size", "16", "--l1-bytes", str(64 << 20), "--l2-url", shared,
                     "--l2-tenant", f"vip={vip_db}", "--internal-token-file", token_file],
                    tmp_path / "engine.log").start()
    gw = Server(["router", "--backend", engine.url, "--auth-file", str(keys), "--internal-token-file", token_file],
                tmp_path / "router.log").start()
    alpha, beta, gamma, delta, eps, vip = ({"authorization": f"Bearer {n}-key"} for n in names)

    def clear(tiers, headers=internal):
        return httpx.post(engine.url + "/admin/kv/clear", params={"tiers": tiers}, headers=headers, timeout=30)

    def flush():
        httpx.post(engine.url + "/admin/kv/flush", headers=internal, timeout=30).raise_for_status()

    try:
        for tiers in ("", "engine", "engine,l1"):  # alpha's prefix lives in: the engine / L1 only / L2 only
            prompt = f"round {tiers or 'none'}: " + PROMPT  # fresh blocks each round (the round comes first)
            assert _cached(gw.url, alpha, prompt=prompt) == 0
            hit = _cached(gw.url, alpha, prompt=prompt)
            assert hit > 0  # alpha reuses its own prefix
            flush()
            if tiers:
                assert clear(tiers).status_code == 200
            # each attempt is a namespace of its own that has never sent this prompt: any hit is alpha's
            assert _cached(gw.url, beta, prompt=prompt) == 0, tiers
            assert _cached(gw.url, {**gamma, "x-fleetserve-tenant": "alpha"}, prompt=prompt) == 0, tiers
            assert _cached(gw.url, delta, salt="alpha", prompt=prompt) == 0, tiers
            assert _cached(gw.url, eps, salt="tenant:alpha", prompt=prompt) == 0, tiers
            # a holder of the token with a client salt named like the tenant is still not the tenant
            assert _cached(engine.url, internal, salt="alpha", prompt=prompt) == 0, tiers
            # straight at the engine without the fleet's token: refused outright
            for headers in ({"x-fleetserve-tenant": "alpha"}, {}, {"x-fleetserve-internal": "guess" * 8}):
                r = httpx.post(engine.url + "/v1/completions", headers=headers, timeout=30,
                               json={"model": "tiny", "prompt": prompt, "max_tokens": 2})
                assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", tiers
            assert _cached(gw.url, alpha, prompt=prompt) == hit, tiers  # alpha still hits, from this tier
        # the vip tenant's blocks live in its own Redis only
        shared_keys = redis.Redis.from_url(shared).dbsize()
        assert _cached(gw.url, vip) == 0
        vip_hit = _cached(gw.url, vip)
        assert vip_hit > 0
        flush()
        assert redis.Redis.from_url(vip_db).dbsize() > 0
        assert redis.Redis.from_url(shared).dbsize() == shared_keys
        assert clear("engine,l1").status_code == 200
        assert _cached(gw.url, vip) == vip_hit  # from its own L2
        assert _cached(gw.url, beta) == 0
        # admin API, KV feed and metrics need the token
        for headers in ({}, {"x-fleetserve-internal": "wrong-token-wrong-token"}, {"authorization": "Bearer x"}):
            assert clear("engine", headers).status_code == 401
            assert httpx.post(engine.url + "/admin/kv/flush", headers=headers, timeout=5).status_code == 401
            assert httpx.get(engine.url + "/kv/blocks", headers=headers, timeout=5).status_code == 401
            assert httpx.get(engine.url + "/metrics", headers=headers, timeout=5).status_code == 401
        assert httpx.get(engine.url + "/health", timeout=5).status_code == 200
    finally:
        gw.stop()
        engine.stop()


def test_standalone_engine_ignores_tenant_claims_and_refuses_admin(tiny_engine):
    r = httpx.post(tiny_engine.url + "/admin/kv/clear", params={"tiers": "engine"}, timeout=5)
    assert r.status_code == 403 and "--internal-token-file" in r.json()["error"]["message"]
    assert httpx.post(tiny_engine.url + "/admin/kv/flush", timeout=5).status_code == 403
    prompt = PROMPT + " standalone"
    _cached(tiny_engine.url, salt="alpha", prompt=prompt)
    # a claimed tenant header is dropped: the request lands in the unsalted namespace, not in alpha's
    assert _cached(tiny_engine.url, {"x-fleetserve-tenant": "alpha"}, prompt=prompt) == 0
    assert _cached(tiny_engine.url, salt="alpha", prompt=prompt) > 0


def test_router_with_keys_refuses_to_start_without_the_engines_token(tmp_path):
    from tests.helpers import fleetserve

    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": {key_digest("k"): "t"}}))
    out = fleetserve("router", "--backend", "http://127.0.0.1:9", "--auth-file", str(keys), timeout=60)
    assert out.returncode == 2 and "--internal-token-file" in out.stderr

"""The engine's tiered prefix cache: exact reuse, block identity, tenants, Redis failures."""

import httpx
import pytest
import torch

from fleetserve.engine.prefix_cache import PrefixCache
from fleetserve.kvcache.blocks import chain_keys
from fleetserve.kvcache.tiers import L1Store, RedisStore, pack_block
from tests.helpers import Server, internal_token, wait_until
from tests.metrics_text import sample

PROMPT = "Once upon a time in a land of tiny models, a router met an engine. " * 4
TOKENS: dict[str, dict] = {}  # engine URL -> the internal token header (these tests play the fleet's router)


def engine(tiny_model, tmp_path, *extra, name="kv"):
    token_file, header = internal_token(tmp_path / name)
    server = Server(["engine", "--model", str(tiny_model), "--served-model-name", "tiny", "--threads", "1",
                     "--block-size", "16", "--internal-token-file", token_file, *extra],
                    tmp_path / f"{name}.log").start()
    TOKENS[server.url] = header
    return server


@pytest.fixture(scope="module")
def plain_engine(tiny_model, tmp_path_factory):
    """One engine with the default cache settings for the tests that only ask it and clear its engine tier (each
    started its own: about 10 s of CPU apiece)."""
    server = engine(tiny_model, tmp_path_factory.mktemp("plain-kv"))
    yield server
    server.stop()


def ask(url, prompt=PROMPT, salt=None, headers=None):
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0}
    if salt:
        body["cache_salt"] = salt
    r = httpx.post(url + "/v1/completions", json=body, headers={**TOKENS[url], **(headers or {})}, timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()
    return data["choices"][0]["text"], data["usage"]["prompt_tokens_details"]["cached_tokens"]


def clear(url, tiers):
    r = httpx.post(url + "/admin/kv/clear", params={"tiers": tiers}, headers=TOKENS[url], timeout=30)
    assert r.status_code == 200, r.text


def test_reuse_from_every_tier_gives_identical_greedy_output(tiny_model, tmp_path, redis_server):
    plain = engine(tiny_model, tmp_path, "--no-kv-cache", name="plain")
    cached = engine(tiny_model, tmp_path, "--l1-bytes", str(64 << 20), "--l2-url", redis_server["url"])
    try:
        reference, none = ask(plain.url)
        assert none == 0
        cold, hit = ask(cached.url)
        assert cold == reference and hit == 0
        from_engine, hit = ask(cached.url)
        assert from_engine == reference and hit > 0
        clear(cached.url, "engine")
        from_l1, hit_l1 = ask(cached.url)
        assert from_l1 == reference and hit_l1 == hit
        clear(cached.url, "engine,l1")
        from_l2, hit_l2 = ask(cached.url)
        assert from_l2 == reference and hit_l2 == hit
        # an L2 hit is promoted into L1: the next read after the engine tier lets go does not cross the network
        l1_before = sample(cached.url, "fleetserve_kv_tier_hits_total", TOKENS[cached.url], tier="l1")
        l2_before = sample(cached.url, "fleetserve_kv_tier_hits_total", TOKENS[cached.url], tier="l2")
        clear(cached.url, "engine")
        assert ask(cached.url) == (reference, hit)
        assert sample(cached.url, "fleetserve_kv_tier_hits_total", TOKENS[cached.url], tier="l1") > l1_before
        assert sample(cached.url, "fleetserve_kv_tier_hits_total", TOKENS[cached.url], tier="l2") == l2_before
        for tier in ("engine", "l1", "l2"):
            assert sample(cached.url, "fleetserve_kv_tier_hits_total", TOKENS[cached.url], tier=tier) > 0
            # every tier's misses (the engine's were not exported: its hit ratio was never recorded)
            assert sample(cached.url, "fleetserve_kv_tier_misses_total", TOKENS[cached.url], tier=tier) > 0
        assert sample(cached.url, "vllm:prefix_cache_hits_total", TOKENS[cached.url], model_name="tiny") > 0
    finally:
        plain.stop()
        cached.stop()


def test_a_block_changed_inside_redis_is_rejected_and_recomputed(tiny_model, tmp_path, redis_server):
    """Bytes flipped inside a value of the right length (a bad write, bit rot, a tool that edited it) passed the
    header checks: the engine answered from tensors that were not its own (an empty answer), and counted nothing."""
    import redis

    plain = engine(tiny_model, tmp_path, "--no-kv-cache", name="plain")
    cached = None
    try:  # the second start inside: one that failed had left the first engine running after the test
        cached = engine(tiny_model, tmp_path, "--l2-url", redis_server["url"])
        reference, _ = ask(plain.url)
        assert ask(cached.url)[0] == reference
        client = redis.Redis.from_url(redis_server["url"])
        def written() -> list:  # the engine writes L2 behind its answer: wait for the writes, not a race
            return [k for k in client.scan_iter(count=1000) if client.type(k) == b"string"]

        wait_until(written, 30, what="the blocks in Redis")
        keys = written()
        # the value format is in the key space: a rolling upgrade's two versions never share (or fight over) keys
        assert keys and all(k.startswith(b"fleetserve:kv2:") for k in keys)
        for key in keys:
            value = bytearray(client.get(key))
            middle = len(value) // 2
            value[middle:middle + 64] = bytes(b ^ 0xFF for b in value[middle:middle + 64])
            client.set(key, bytes(value))
        clear(cached.url, "engine")
        text, hit = ask(cached.url)
        assert (text, hit) == (reference, 0)  # recomputed, not served from the changed blocks
        assert sample(cached.url, "fleetserve_kv_tier_rejected_total", TOKENS[cached.url], tier="l2") >= 1
        clear(cached.url, "engine")
        assert ask(cached.url)[1] > 0  # the recompute wrote good blocks over the changed ones
    finally:
        plain.stop()
        if cached is not None:
            cached.stop()


def test_two_tenants_never_share_and_one_tenant_hits(plain_engine):
    e = plain_engine
    clear(e.url, "engine")  # the engine is the module's: no other test's blocks
    _, first = ask(e.url, salt="tenant-a")
    _, again = ask(e.url, salt="tenant-a")
    _, other = ask(e.url, headers={"x-fleetserve-tenant": "tenant-b"})
    assert first == 0 and again > 0 and other == 0


def test_redis_killed_mid_run_then_restarted(tiny_model, tmp_path, redis_server):
    e = engine(tiny_model, tmp_path, "--l2-url", redis_server["url"])
    try:
        ask(e.url, prompt=PROMPT + "one")
        redis_server["proc"].kill()
        redis_server["proc"].wait()
        for i in range(3):  # requests keep succeeding without L2
            ask(e.url, prompt=PROMPT + f"two {i}")
        assert sample(e.url, "fleetserve_kv_tier_failures_total", TOKENS[e.url], tier="l2") >= 1
        redis_server["restart"]()
        marker = PROMPT + "three " * 10

        def l2_hit():
            ask(e.url, prompt=marker)  # writes (again) once L2 is back
            clear(e.url, "engine")
            return ask(e.url, prompt=marker)[1] > 0

        wait_until(l2_hit, 60, interval=1.0, what="L2 hits to resume after Redis restarted")
    finally:
        e.stop()


def test_kv_events_and_model_info_for_routers(plain_engine):
    e = plain_engine
    clear(e.url, "engine")  # the engine is the module's: the prompt is stored anew
    info = httpx.get(e.url + "/get_model_info", headers=TOKENS[e.url], timeout=5).json()
    assert info["block_size"] == 16 and info["kv_model"] == "tiny"
    seq = httpx.get(e.url + "/kv/blocks", headers=TOKENS[e.url], timeout=5).json()["seq"]
    ask(e.url)
    events = httpx.get(e.url + "/kv/events", params={"since": seq, "wait": 0}, headers=TOKENS[e.url],
                       timeout=5).json()
    assert any(ev["type"] == "stored" and ev["tier"] == "engine" for ev in events["events"])
    blocks = httpx.get(e.url + "/kv/blocks", headers=TOKENS[e.url], timeout=5).json()["blocks"]
    assert blocks and all(b["tier"] == "engine" for b in blocks)


def test_foreign_or_reordered_blocks_are_never_used():
    shape = (2, 2, 1, 4, 8)
    l1 = L1Store(1 << 20)
    cache = PrefixCache(shape, torch.float32, engine_blocks=16, l1=l1)
    keys = chain_keys(list(range(12)), 4)
    blocks = [torch.full(shape, float(i)) for i in range(3)]
    raw = [cache._to_bytes(b) for b in blocks]
    # block 1's value stored under block 0's key (as a reorder or a colliding writer would): rejected
    l1.put_many([(keys[0], pack_block(keys[1], raw[1])), (keys[1], pack_block(keys[1], raw[1]))])
    assert cache.lookup(keys) == []
    assert l1.stats.rejected == 1
    # correct values: used, in chain order
    l1.put_many([(k, pack_block(k, r)) for k, r in zip(keys, raw, strict=True)])
    found = cache.lookup(keys)
    assert [t for t, _ in found] == ["l1", "l1", "l1"]
    assert [float(b[0, 0, 0, 0, 0]) for _, b in found] == [0.0, 1.0, 2.0]
    # read from L1 as L2's reads are counted: the bytes loaded and the latency (both stayed 0 beside its hits)
    assert l1.stats.bytes_out >= sum(len(pack_block(k, r)) for k, r in zip(keys, raw, strict=True))
    assert l1.stats.get_seconds.count and l1.stats.put_seconds.count
    # a chain key depends on everything before it: the same block after another prefix has another key
    assert chain_keys(list(range(4, 8)), 4)[0] != keys[1]


def test_block_keys_are_namespaced_and_deterministic():
    from fleetserve.kvcache.blocks import namespace_key

    tokens = list(range(64))
    a = chain_keys(tokens, 16, namespace_key("m", "1", "float32", "tenant-a"))
    b = chain_keys(tokens, 16, namespace_key("m", "1", "float32", "tenant-b"))
    c = chain_keys(tokens, 16, namespace_key("m", "2", "float32", "tenant-a"))
    assert a == chain_keys(tokens, 16, namespace_key("m", "1", "float32", "tenant-a"))
    assert not set(a) & set(b) and not set(a) & set(c)


@pytest.mark.parametrize("tiers", ["gpu", ""])
def test_clear_rejects_unknown_tiers(plain_engine, tiers):
    e = plain_engine
    r = httpx.post(e.url + "/admin/kv/clear", params={"tiers": tiers}, headers=TOKENS[e.url], timeout=5)
    assert r.status_code == 400 and "allowed values: engine, l1, l2" in r.json()["error"]["message"]


def test_a_tenant_with_its_own_l2_never_writes_to_the_shared_one(tiny_model, tmp_path, redis_server):
    import redis

    shared = redis_server["url"]  # logical database 0
    own = shared[: shared.rindex("/")] + "/1"  # the vip tenant's database
    e = engine(tiny_model, tmp_path, "--l2-url", shared, "--l2-tenant", f"vip={own}")
    try:
        ask(e.url, prompt=PROMPT + " vip", headers={"x-fleetserve-tenant": "vip"})
        httpx.post(e.url + "/admin/kv/flush", headers=TOKENS[e.url], timeout=30)
        db0 = redis.Redis.from_url(shared)
        db1 = redis.Redis.from_url(own)
        assert db1.dbsize() > 0 and db0.dbsize() == 0
        ask(e.url, prompt=PROMPT + " standard", headers={"x-fleetserve-tenant": "standard"})
        httpx.post(e.url + "/admin/kv/flush", headers=TOKENS[e.url], timeout=30)
        assert db0.dbsize() > 0
        clear(e.url, "engine")
        _, hit = ask(e.url, prompt=PROMPT + " vip", headers={"x-fleetserve-tenant": "vip"})
        assert hit > 0  # served from the vip tenant's own L2
        assert sample(e.url, "fleetserve_kv_tier_bytes_in_total", TOKENS[e.url], tier="l2:vip") > 0
        # its hits are the tenant's tier's, as its misses and bytes: they had been counted as the shared L2's
        assert sample(e.url, "fleetserve_kv_tier_hits_total", TOKENS[e.url], tier="l2:vip") == hit // 16
        assert sample(e.url, "fleetserve_kv_tier_hits_total", TOKENS[e.url], tier="l2") == 0
    finally:
        e.stop()


def test_an_l2_password_with_url_characters_works_and_is_never_logged(tmp_path, caplog):
    """`openssl rand -base64 24` (the docs' recipe) gives a `/` in about 40 % of passwords: redis-py's URL parser
    then failed ('Port could not be cast to integer'), and an unreachable L2 logged the URL, password and all."""
    import logging
    import shutil
    import subprocess

    from fleetserve.fleet.process import free_port
    from fleetserve.kvcache.tiers import RedisStore
    from tests.helpers import wait_until

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh installs it as root)")
    password, port = "ab/cd+ef=@x", free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--requirepass", password, "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import redis

        wait_until(lambda: redis.Redis(port=port, password=password).ping(), 30, what="redis-server")
        store = RedisStore(f"redis://:{password}@127.0.0.1:{port}/0")
        assert store.url == f"redis://127.0.0.1:{port}/0"
        assert store.put_many([(7, b"block")]) == [7] and store.get_many([7]) == [b"block"]
        gone = RedisStore(f"redis://:{password}@127.0.0.1:{free_port()}/0", timeout=0.2)
        with caplog.at_level(logging.WARNING):
            assert gone.get_many([7]) == [None]
        assert "unavailable" in caplog.text and password not in caplog.text and "ab/cd" not in caplog.text
    finally:
        proc.kill()
        proc.wait()


def test_two_models_under_one_name_on_one_redis_never_share(tiny_model, tmp_path, redis_server):
    """Two fleets serving different weights as `tiny` on one Redis: the second reported cached tokens for a
    prompt it had never seen and answered from the first model's KV."""
    from fleetserve.engine.tiny import create_tiny_model

    other = create_tiny_model(tmp_path / "other", context_length=512, seed=7)
    first = engine(tiny_model, tmp_path, "--l2-url", redis_server["url"], name="first")
    second = engine(other, tmp_path, "--l2-url", redis_server["url"], name="second")
    again = engine(tiny_model, tmp_path, "--l2-url", redis_server["url"], name="again")
    try:
        import redis

        _, cold = ask(first.url)
        assert cold == 0
        client = redis.Redis.from_url(redis_server["url"])
        wait_until(lambda: client.dbsize() > 0, 30, what="the first engine's L2 writes")
        assert ask(again.url)[1] > 0  # the same model's files: still shared
        assert ask(second.url)[1] == 0
    finally:
        for server in (first, second, again):
            server.stop()


def test_the_fingerprint_follows_the_files_not_the_name(tiny_model, tmp_path):
    from fleetserve.engine.fingerprint import model_fingerprint
    from fleetserve.engine.tiny import create_tiny_model

    same = create_tiny_model(tmp_path / "same", context_length=512)
    other = create_tiny_model(tmp_path / "other", context_length=512, seed=7)
    assert model_fingerprint(tiny_model) == model_fingerprint(same)
    assert model_fingerprint(tiny_model) != model_fingerprint(other)


def test_a_full_redis_under_noeviction_pauses_writes_not_reads(redis_server, caplog):
    """A write refused for memory went the way of a dead server: the blocks already in Redis missed for the
    back-off, and the log said 'unavailable'."""
    import redis

    from fleetserve.kvcache.tiers import RedisStore

    store = RedisStore(redis_server["url"], prefix="t:")
    assert store.state == "unknown"
    assert store.put_many([(1, b"x" * 1000)]) == [1]
    assert store.state == "up"  # the engine's /metrics says so (fleetserve_kv_tier_state): only status had
    client = redis.Redis.from_url(redis_server["url"])
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", client.info("memory")["used_memory"] + 10_000)
    with caplog.at_level("WARNING", logger="fleetserve.kvcache.tiers"):
        assert store.put_many([(2, b"y" * 1_000_000)]) == []
    assert "is full" in caplog.text and "unavailable" not in caplog.text
    assert store.get_many([1, 2]) == [b"x" * 1000, None]  # reads go on
    assert store.stats.failures == 1
    assert store.state == "full"  # a read that worked says nothing of the writes
    gone = RedisStore(redis_server["url"].rsplit(":", 1)[0] + ":1/0", prefix="t:", timeout=0.2)
    assert gone.get_many([1]) == [None] and gone.state == "unavailable"


def _runner_with_l2(tiny_model, redis_url, l1_bytes=0):
    """An in-process runner and engine with an L2 on `redis_url`, whose L2 holds PROMPT's blocks and whose
    engine tier does not."""
    import threading

    import redis

    from fleetserve.api.protocol import SamplingParams
    from fleetserve.engine.main import attach_prefix_cache
    from fleetserve.engine.runner import ModelRunner
    from fleetserve.engine.server import Engine, EngineSettings
    from fleetserve.observe.metrics import ModelIdentity

    runner = ModelRunner(tiny_model, threads=1)
    engine = Engine(runner, EngineSettings("tiny", ModelIdentity("default", "tiny", "1", "local", "r0")))
    attach_prefix_cache(engine, 16, 1 << 20, l1_bytes, redis_url)
    ids = runner.encode(PROMPT)
    runner.generate(ids, SamplingParams(temperature=0.0), 1, lambda token: True, threading.Event())  # fills L2
    wait_until(lambda: redis.Redis.from_url(redis_url).dbsize() > 0, 30, what="L2 writes")
    runner.prefix_cache.flush()  # the writer is done with them (a test read `trusted` before its call returned)
    runner.prefix_cache.clear({"engine"})
    return runner, engine, ids


def _record_l2_readers(cache):
    import threading

    readers = []
    original = cache.l2.get_many
    cache.l2.get_many = lambda keys: readers.append(threading.current_thread().name) or original(keys)
    return readers


def test_the_generation_thread_takes_l2_blocks_read_before_and_never_waits_for_redis(tiny_model, redis_server):
    """L2 was read (one MGET, up to its 0.5 s timeout) inside the generation thread at each new request's
    lookup: a slow Redis stalled every running stream. The tokenizer pool now reads them with the prompt, and
    the batching scheduler hands them to the lookup."""
    import asyncio

    from fleetserve.api.protocol import SamplingParams, parse_completion
    from fleetserve.engine.batching import BatchScheduler
    from fleetserve.engine.scheduler import Job

    runner, engine, ids = _runner_with_l2(tiny_model, redis_server["url"])
    cache = runner.prefix_cache
    readers = _record_l2_readers(cache)

    async def tokenize():
        return await engine._tokenize(parse_completion({"prompt": PROMPT, "max_tokens": 1}))

    prompt_ids, _, prefetched = asyncio.run(tokenize())
    assert prompt_ids == ids and prefetched.values and readers and all(r.startswith("tokenize") for r in readers)
    assert cache._prefetched > 0
    readers.clear()
    scheduler = BatchScheduler.__new__(BatchScheduler)  # its loop thread is not needed: one admission
    scheduler.runner = runner
    job = Job(ids, SamplingParams(temperature=0.0), 1, asyncio.new_event_loop(), prefetched=prefetched)
    del prefetched
    scheduler._start_prefill(job)
    assert scheduler.prefill.cached_tokens > 0 and readers == []  # no Redis call on the generation thread
    assert job.prefetched is None and cache._prefetched == 0  # released at admission: the budget is free again
    cache.close()


def test_a_block_the_engine_tier_let_go_after_the_prefetch_is_still_read_from_l2(tiny_model, redis_server):
    """The prefetch skips what the engine tier holds; evicted before the job's admission, the lookup missed
    at the first such block and lost the whole L2 prefix."""
    runner, engine, ids = _runner_with_l2(tiny_model, redis_server["url"])
    cache = runner.prefix_cache
    cold = runner.cached_prefix(ids, 0, None)[1]  # from L2, into the engine tier
    assert cold > 0
    prefetched = runner.prefetch_l2(ids, 0, None)
    assert prefetched.start > 0 and not prefetched.values  # the engine tier held it all
    cache.clear({"engine"})  # evicted before the admission
    assert runner.cached_prefix(ids, 0, None, prefetched)[1] == cold
    cache.close()


def test_after_a_failed_call_the_generation_thread_reads_nothing_from_redis_until_one_answers(tiny_model,
                                                                                              redis_server):
    """A hung Redis past the prefetch budget stalled every running stream for the read timeout at each new
    request's admission (0.5 s every 2.5 s). After a failure only prefetches and writes call it, until one answers;
    what the lookup would have read there is recomputed."""
    runner, engine, ids = _runner_with_l2(tiny_model, redis_server["url"])
    cache = runner.prefix_cache
    store = cache.l2
    assert store.trusted  # its writes answered
    store._failed(ConnectionError("hung"))
    store._down_until = 0.0  # the back-off is over: the next call may go
    readers = _record_l2_readers(cache)
    assert runner.cached_prefix(ids, 0, None)[1] == 0 and readers == []  # a miss, no call on this thread
    prefetched = runner.prefetch_l2(ids, 0, None)  # the tokenizer pool's call answers: trusted again
    assert prefetched.values and store.trusted and readers
    assert runner.cached_prefix(ids, 0, None, prefetched)[1] > 0
    cache.close()


def test_prefetching_stops_at_its_byte_budget_and_a_dropped_job_gives_its_share_back(tiny_model, redis_server):
    """Past the budget the rest of a prompt is read at admission (while Redis answers); the room left is read
    ahead and reserved first, so two tokenizer threads cannot both take it."""
    import gc

    from fleetserve.kvcache.tiers import packed_size

    runner, engine, ids = _runner_with_l2(tiny_model, redis_server["url"])
    cache = runner.prefix_cache
    cache.prefetch_budget = 1  # nothing held: a whole prompt is read ahead all the same
    first = runner.prefetch_l2(ids, 0, None)
    held = cache._prefetched
    assert first is not None and len(first.values) >= 2 and held > cache.prefetch_budget
    one = packed_size(cache.block_bytes)
    cache.prefetch_budget = held + one + 1  # room for one more block only
    second = runner.prefetch_l2(ids, 0, None)
    assert len(second.values) == 1 and second.end == second.start + 1 and cache._prefetched == held + one
    cache.clear({"engine"})
    full = runner.cached_prefix(ids, 0, None, second)[1]  # its one block, then the rest read at admission
    assert full == len(first.values) * 16
    del first, second  # jobs refused or cancelled before admission
    gc.collect()
    assert cache._prefetched == 0 and runner.prefetch_l2(ids, 0, None) is not None
    cache.close()


def test_prefix_cache_queries_count_every_prompt_token_as_vllm_does(plain_engine):
    """Only the tokens of whole reusable blocks were counted: a hit rate of 1.0 where vLLM's gives 0.9."""
    e = plain_engine
    clear(e.url, "engine")  # the engine is the module's: the first request is cold; its counters count from here
    queries_before = sample(e.url, "vllm:prefix_cache_queries_total", TOKENS[e.url], model_name="tiny")
    hits_before = sample(e.url, "vllm:prefix_cache_hits_total", TOKENS[e.url], model_name="tiny")
    body = {"model": "tiny", "prompt": PROMPT + "tail", "max_tokens": 1}
    usage = [httpx.post(e.url + "/v1/completions", json=body, headers=TOKENS[e.url], timeout=60).json()["usage"]
             for _ in range(2)]
    queries = sample(e.url, "vllm:prefix_cache_queries_total", TOKENS[e.url], model_name="tiny") - queries_before
    hits = sample(e.url, "vllm:prefix_cache_hits_total", TOKENS[e.url], model_name="tiny") - hits_before
    assert queries == sum(u["prompt_tokens"] for u in usage)
    assert hits == usage[1]["prompt_tokens_details"]["cached_tokens"] > 0 and hits < usage[1]["prompt_tokens"]


def test_redis_health_says_why_it_is_not_up(redis_server):
    import os
    import signal

    from fleetserve.kvcache.tiers import redis_health

    url = redis_server["url"]
    assert redis_health(url) == "up"
    os.kill(redis_server["proc"].pid, signal.SIGSTOP)
    try:
        assert redis_health(url) == "not answering (TimeoutError)"
    finally:
        os.kill(redis_server["proc"].pid, signal.SIGCONT)
    redis_server["proc"].kill()
    redis_server["proc"].wait()
    assert redis_health(url).startswith("unreachable")


def test_the_prefetch_skips_what_l1_holds(tiny_model, redis_server):
    """Blocks in L1 were read from Redis too, ahead of the lookup that takes them from L1: a full L1 hit cost the
    network's time (bench kvcache: L1 0.086 x cold where it had read 0.06)."""
    runner, engine, ids = _runner_with_l2(tiny_model, redis_server["url"], l1_bytes=64 << 20)
    cache = runner.prefix_cache
    cache.flush()
    readers = _record_l2_readers(cache)
    prefetched = runner.prefetch_l2(ids, 0, None)
    assert prefetched.start > 0 and not prefetched.values and readers == []
    assert runner.cached_prefix(ids, 0, None, prefetched)[1] > 0  # from L1
    cache.close()



def _blocks(keys):
    return [(k, torch.full((1, 2, 1, 4, 2), float(k))) for k in keys]


def test_the_engine_tier_evicts_a_prompt_from_its_tail():
    """A prompt's first block is the one every longer prompt needs: evicted first, it took the use of all the
    blocks after it while they still filled the tier. Now the tail goes first."""
    cache = PrefixCache((1, 2, 1, 4, 2), torch.float32, engine_blocks=5, l1=L1Store(1 << 20))
    try:
        cache.store(_blocks([1, 2, 3, 4]))
        assert [tier for tier, _ in cache.lookup([1, 2, 3, 4])] == ["engine"] * 4
        cache.store(_blocks([5]), head=[1, 2, 3, 4])  # a longer prompt over that head: the head touched after
        cache.store(_blocks([8, 9]))  # other traffic: two blocks must go, the chain's last two
        cache.flush()
        assert [k for k in (1, 2, 3, 4, 5) if k in cache._blocks] == [1, 2, 3]
        assert [tier for tier, _ in cache.lookup([1, 2, 3, 4, 5])] == ["engine"] * 3 + ["l1"] * 2
    finally:
        cache.close()


def test_l1_and_l2_keep_a_chain_head_first(redis_server):
    one = len(pack_block(0, bytes(8)))
    l1 = L1Store(6 * one)
    l1.put_many([(k, pack_block(k, bytes(8))) for k in (1, 2, 3, 4)])
    l1.put_many([(5, pack_block(5, bytes(8)))], head=[1, 2, 3, 4])  # the writer touches the head it did not write
    l1.put_many([(k, pack_block(k, bytes(8))) for k in (8, 9)])
    assert [k in l1 for k in (1, 2, 3, 4, 5)] == [True] * 4 + [False]
    l1.get_many([1, 2, 3, 4])  # a lookup leaves the head newest too
    l1.put_many([(k, pack_block(k, bytes(8))) for k in (10, 11)])
    assert [k in l1 for k in (1, 2, 3, 4, 8, 9)] == [True, True, True, True, False, False]
    l2 = RedisStore(redis_server["url"], prefix="head:kv:")
    assert l2.put_many([(6, b"six"), (7, b"seven")], head=[1, 6]) == [6, 7]  # TOUCH of keys absent is harmless
    assert l2.get_many([6, 7]) == [b"six", b"seven"]


def test_a_full_l1_keeps_the_head_whose_tail_the_writer_adds():
    """The writer's new tail had evicted the head it was about to touch: the tail stayed, unusable."""
    one = len(pack_block(0, bytes(8)))
    l1 = L1Store(4 * one)
    l1.put_many([(k, pack_block(k, bytes(8))) for k in (1, 2)])
    l1.put_many([(k, pack_block(k, bytes(8))) for k in (8, 9)])
    l1.put_many([(k, pack_block(k, bytes(8))) for k in (3, 4)], head=[1, 2])
    assert [k in l1 for k in (1, 2, 3, 4, 8, 9)] == [True] * 4 + [False] * 2


def test_a_lookup_the_engine_tier_serves_whole_keeps_l1s_copies_fresh():
    one = len(pack_block(0, bytes(64)))
    l1 = L1Store(4 * one)
    cache = PrefixCache((1, 2, 1, 4, 2), torch.float32, engine_blocks=8, l1=l1)
    try:
        cache.store(_blocks([1, 2]))
        cache.store(_blocks([5, 6]))
        cache.flush()
        assert [tier for tier, _ in cache.lookup([1, 2])] == ["engine"] * 2  # L1 is not read, but its copies aged
        cache.store(_blocks([7]))
        cache.flush()
        assert [k in l1 for k in (1, 2, 5, 6, 7)] == [True, True, True, False, True]  # 5, 6 went from its tail
    finally:
        cache.close()


def test_a_redis_that_refuses_touch_still_takes_the_blocks_and_is_asked_no_more(redis_server, caplog):
    """TOUCH rode in the writes' pipeline: an ACL without +touch failed every write with a head, and took the
    store down for its back-off (reads missed too)."""
    import redis as redis_py

    admin = redis_py.Redis.from_url(redis_server["url"])
    admin.acl_setuser("notouch", enabled=True, passwords=["+pw"], keys=["*"],
                      commands=["+set", "+get", "+mget", "+ping", "+scan", "+del", "+info"])
    url = redis_server["url"].replace("redis://", "redis://notouch:pw@")
    store = RedisStore(url, prefix="nt:kv:")
    assert store.put_many([(1, b"one")]) == [1]
    with caplog.at_level("WARNING"):
        assert store.put_many([(2, b"two")], head=[1]) == [2]
        assert store.put_many([(3, b"three")], head=[1, 2]) == [3]
    assert store.available and store.get_many([1, 2, 3]) == [b"one", b"two", b"three"]
    assert sum("refused TOUCH" in r.message for r in caplog.records) == 1


def test_an_l1_smaller_than_one_block_is_named_at_start(caplog):
    """kvCache.l1.maxBytes: 1000 stored nothing (every block is larger), and no metric or line said so."""
    import logging

    shape = (2, 2, 1, 16, 8)
    with caplog.at_level(logging.WARNING, logger="fleetserve.engine.prefix_cache"):
        PrefixCache(shape, torch.float32, engine_blocks=4, l1=L1Store(1000))
        PrefixCache(shape, torch.float32, engine_blocks=4, l1=L1Store(1 << 20))
    (line,) = [r.getMessage() for r in caplog.records]
    assert "(--l1-bytes, a spec's kvCache.l1.maxBytes: 1000 bytes) is smaller than one KV block" in line


def test_one_changed_byte_anywhere_in_a_large_weight_file_changes_the_fingerprint(tmp_path, monkeypatch):
    """The weights were sampled (edges and sixteen slices): a model edited in one layer (a ROME-style edit, a
    partial fine-tune) had its base's fingerprint and read its blocks from a shared Redis. Every byte counts now;
    the digest is cached while the file is unchanged, and a rewrite in place is seen."""
    import os

    from fleetserve.engine import fingerprint

    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path / "home"))
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    weights = model / "model.safetensors"
    data = bytearray(os.urandom(12 << 20))
    weights.write_bytes(data)
    first = fingerprint.model_fingerprint(model)
    assert list((tmp_path / "home" / "fingerprints").iterdir())  # kept for the next start
    reads = []
    real = fingerprint.hashlib.file_digest
    monkeypatch.setattr(fingerprint.hashlib, "file_digest", lambda f, alg: reads.append(1) or real(f, alg))
    assert fingerprint.model_fingerprint(model) == first and not reads  # unchanged: not read again
    at = (12 << 20) * 5 // 34 + 4096  # between two of the old samples
    data[at] ^= 0xFF
    with weights.open("r+b") as f:  # in place: same size, same inode
        f.seek(at)
        f.write(bytes([data[at]]))
    later = weights.stat().st_mtime_ns + 10**9  # a coarse file-system clock could give the same tick in a test
    os.utime(weights, ns=(later, later))
    assert fingerprint.model_fingerprint(model) != first and reads


def test_an_l2_password_reaches_the_engine_off_its_command_line(tiny_model, tmp_path):
    """`fleetserve up` put a spec's `l2.url` with its password on the engine's command line, which any local user
    reads (`ps`, /proc/PID/cmdline is 0444). The supervisor now hands such URLs over in the environment
    (/proc/PID/environ is the owner's alone): the engine reads $FLEETSERVE_L2_URL and $FLEETSERVE_L2_TENANTS."""
    import shutil
    import subprocess

    import redis

    from fleetserve.fleet.process import free_port
    from fleetserve.fleet.supervisor import Supervisor
    from fleetserve.spec.load import load_spec_text

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh installs it as root)")
    password, port = "pw-SECRET-1", free_port()
    url = f"redis://:{password}@127.0.0.1:{port}/0"
    spec = load_spec_text(f"""apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {{name: pw}}
spec:
  model: {{source: {tiny_model}}}
  kvCache: {{l2: {{enabled: true, url: "{url}", tenantUrls: {{acme: "redis://:{password}@127.0.0.1:{port}/1"}}}}}}
""")
    sup = Supervisor(spec, str(tmp_path / "pw.yaml"), say=lambda _m: None)
    try:
        sup.l2_url = url
        cmd = sup._engine_command("r0", 8001, "local")
        assert password not in " ".join(cmd) and "--l2-url" not in cmd and "--l2-tenant" not in cmd
        assert sup._engine_env() == {"FLEETSERVE_L2_URL": url,
                                     "FLEETSERVE_L2_TENANTS": f"acme=redis://:{password}@127.0.0.1:{port}/1"}
    finally:
        sup._http.close()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--requirepass", password, "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = None
    try:
        client = redis.Redis(port=port, password=password)
        wait_until(lambda: client.ping(), 30, what="redis-server")
        token_file, header = internal_token(tmp_path / "envurl")
        server = Server(["engine", "--model", str(tiny_model), "--served-model-name", "tiny", "--threads", "1",
                         "--block-size", "16", "--internal-token-file", token_file], tmp_path / "envurl.log",
                        env=sup._engine_env()).start()
        TOKENS[server.url] = header
        assert password not in open(f"/proc/{server.proc.pid}/cmdline").read()
        ask(server.url)
        wait_until(lambda: client.dbsize() > 0, 30, what="the engine's L2 writes through the URL in its environment")
    finally:
        if server is not None:
            server.stop()
        proc.kill()
        proc.wait()


def test_a_block_size_the_context_cannot_fill_is_named_at_start(tiny_model, caplog):
    """`--block-size 4096` on a model of 2,048 tokens cached nothing without a word: validate sees only a
    contextLength written in the spec, not the model's own (found in review)."""
    import logging

    from fleetserve.engine.main import attach_prefix_cache
    from fleetserve.engine.runner import ModelRunner
    from fleetserve.engine.server import Engine, EngineSettings
    from fleetserve.observe.metrics import ModelIdentity

    runner = ModelRunner(tiny_model, threads=1)
    engine = Engine(runner, EngineSettings("tiny", ModelIdentity("default", "tiny", "1", "local", "r0")))
    with caplog.at_level(logging.WARNING, logger="fleetserve.engine.main"):
        attach_prefix_cache(engine, runner.context_length // 2, 1 << 20, 0, None)
        assert not caplog.records
        attach_prefix_cache(engine, runner.context_length, 1 << 20, 0, None)
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"--block-size {runner.context_length} is not below the model's context length" in line

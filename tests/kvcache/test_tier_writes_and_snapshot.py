"""The prefix cache's background writes, its snapshot for routers, and the engine's use of both.

Found by a review: the writes queued for L1/L2 were bounded by count (1,024 prompts: 512 x the engine tier's memory
behind a slow Redis) and dropped without a word; `/kv/blocks` raised "OrderedDict mutated during iteration" beside
the generation thread and listed a block held in the engine tier and in L1 as the engine's only; `/admin/kv/clear`
waited for the writer on the event loop; an engine that stopped lost the writes queued; the engine tier's
evictions had no series; L1 counted bytes out past a prefix's first miss."""

from __future__ import annotations

import asyncio
import logging
import threading

import torch

from fleetserve.engine.prefix_cache import PrefixCache
from fleetserve.kvcache.tiers import L1Store, pack_block

SHAPE = (1, 2, 1, 4, 2)  # 64 bytes a block in float32


def _blocks(keys):
    return [(k, torch.full(SHAPE, float(k))) for k in keys]


class _HeldL1(L1Store):
    """An L1 whose writes wait until `go` is set: a tier slower than the prefills."""

    def __init__(self, max_bytes: int):
        super().__init__(max_bytes)
        self.go = threading.Event()

    def put_many(self, items, head=()):
        self.go.wait(30)
        return super().put_many(items, head)


def test_queued_writes_are_bounded_by_the_engine_tiers_bytes_and_drops_are_counted_and_said(caplog):
    l1 = _HeldL1(1 << 20)
    cache = PrefixCache(SHAPE, torch.float32, engine_blocks=8, l1=l1)
    try:
        assert cache.write_budget == 8 * cache.block_bytes
        with caplog.at_level(logging.WARNING):
            for first in range(0, 40, 4):  # ten 4-block prompts: 40 blocks where the engine tier holds 8
                cache.store(_blocks(range(first, first + 4)))
                assert cache.write_bytes <= cache.write_budget
        assert cache.dropped_blocks >= 40 - 12  # one prompt in the writer's hands, two queued at most
        said = [r.getMessage() for r in caplog.records if "fall behind" in r.getMessage()]
        assert len(said) == 1 and "blocks kept in the engine tier only" in said[0]  # once a minute, not per prompt
        l1.go.set()
        assert cache.flush(10) and cache.write_bytes == 0
        cache.store(_blocks([100]))  # room again
        assert cache.flush(10) and 100 in l1
    finally:
        l1.go.set()
        cache.close()


def test_a_stopping_cache_lets_its_queued_writes_land_or_says_how_much_did_not(caplog):
    l1 = _HeldL1(1 << 20)
    cache = PrefixCache(SHAPE, torch.float32, engine_blocks=8, l1=l1)
    cache.store(_blocks([1, 2]))
    cache.store(_blocks([3]))
    with caplog.at_level(logging.WARNING):
        cache.close(timeout=0.2)
    assert any("not done" in r.getMessage() and "dropped" in r.getMessage() for r in caplog.records)
    l1.go.set()
    cache = PrefixCache(SHAPE, torch.float32, engine_blocks=8, l1=l1)
    cache.store(_blocks([7, 8]))
    cache.close()
    assert 7 in l1 and 8 in l1  # close waited for them


def test_the_snapshot_lists_every_tier_of_a_block_and_a_router_keeps_them():
    from fleetserve.router.kvindex import KVIndex

    cache = PrefixCache(SHAPE, torch.float32, engine_blocks=4, l1=L1Store(1 << 20))
    try:
        cache.store(_blocks([1, 2]))
        assert cache.flush(10)
        snap = cache.snapshot()
        assert {b["key"]: b["tiers"] for b in snap["blocks"]} == {1: ["engine", "l1"], 2: ["engine", "l1"]}
        assert {b["tier"] for b in snap["blocks"]} == {"engine"}  # the nearest, for a router that reads one
        index = KVIndex()
        index.replace("r0", {b["key"]: b["tiers"] for b in snap["blocks"]})
        index.removed("r0", [1, 2], "engine")  # the engine tier lets them go: L1 still holds them
        assert index.credit("r0", (1, 2), 0.0) > 0
    finally:
        cache.close()


def test_a_snapshot_beside_the_generation_thread_never_raises():
    """Found at 16 of 300 snapshots of a 4,000-block tier at the engine's switch interval."""
    import sys

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)  # what `fleetserve engine` sets
    cache = PrefixCache(SHAPE, torch.float32, engine_blocks=4000)
    block = torch.zeros(SHAPE)
    keys = list(range(1, 4001))
    cache.store([(k, block) for k in keys])
    stop = threading.Event()

    def generation():  # what requests do: lookups touch chains, new prompts store blocks
        i = 0
        while not stop.is_set():
            cache.lookup(keys[i % 3000:i % 3000 + 50])
            cache.store([(10_000 + i, block)])
            i += 1

    thread = threading.Thread(target=generation)
    thread.start()
    try:
        for _ in range(300):
            assert len(cache.snapshot()["blocks"]) <= 4000
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
        cache.close()


def test_engine_tier_evictions_are_counted():
    cache = PrefixCache(SHAPE, torch.float32, engine_blocks=3)
    try:
        cache.store(_blocks([1, 2, 3, 4, 5]))
        assert cache.engine_evictions == 2 and len(cache._blocks) == 3
    finally:
        cache.close()


def test_l1_counts_bytes_out_up_to_a_prefixs_first_miss():
    one = pack_block(1, bytes(64))
    l1 = L1Store(1 << 20)
    l1.put_many([(k, pack_block(k, bytes(64))) for k in (1, 2, 4, 5)])
    values = l1.get_many([1, 2, 3, 4, 5])
    assert [v is not None for v in values] == [True, True, False, False, False]  # a prefix ends at 3
    assert l1.stats.bytes_out == 2 * len(one)


def test_the_engine_clears_tiers_off_the_event_loop_and_closes_its_cache_when_it_stops(tiny_model):
    """`/admin/kv/clear` waited for the writer (and Redis) on the event loop: every stream and /health stalled."""
    from starlette.testclient import TestClient

    from fleetserve.api.internal import INTERNAL_HEADER
    from fleetserve.engine.main import attach_prefix_cache
    from fleetserve.engine.runner import ModelRunner
    from fleetserve.engine.server import Engine, EngineSettings, build_app
    from fleetserve.observe.metrics import ModelIdentity

    runner = ModelRunner(tiny_model, threads=1)
    engine = Engine(runner, EngineSettings("tiny", ModelIdentity("default", "tiny", "1", "local", "r0"),
                                           internal_token="t0ken"))
    attach_prefix_cache(engine, 16, 1 << 20, 1 << 20, None)
    cache = runner.prefix_cache
    on_loop, closed = [], []  # for each flush: was an event loop running on its thread?
    original_flush, original_close = cache.flush, cache.close
    cache.flush = lambda *a, **k: on_loop.append(asyncio._get_running_loop() is not None) or original_flush(*a, **k)
    cache.close = lambda *a, **k: closed.append(True) or original_close(*a, **k)
    with TestClient(build_app(engine), headers={INTERNAL_HEADER: "t0ken"}) as client:
        r = client.post("/v1/completions", json={"model": "tiny", "prompt": "a" * 40, "max_tokens": 1})
        assert r.status_code == 200
        r = client.post("/admin/kv/clear?tiers=engine,l1")
        assert r.status_code == 200 and r.json() == {"cleared": ["engine", "l1"]}
        blocks = client.get("/kv/blocks").json()["blocks"]
        assert blocks == []
    assert on_loop and not any(on_loop)
    assert closed == [True]


def test_the_engine_metrics_say_how_full_l1_is_and_it_stays_within_its_size():
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from fleetserve.observe.metrics import PrefixCacheCollector

    l1 = L1Store(2048)
    cache = PrefixCache(SHAPE, torch.float32, engine_blocks=4, l1=l1)
    try:
        for start in range(0, 200, 20):
            cache.store(_blocks(list(range(start, start + 20))))
        assert cache.flush(10)
        registry = CollectorRegistry()
        registry.register(PrefixCacheCollector(cache, "m"))
        families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
        (used,) = families["fleetserve_kv_tier_used_bytes"].samples
        (capacity,) = families["fleetserve_kv_tier_capacity_bytes"].samples
        assert capacity.value == 2048 and 0 < used.value <= 2048 and used.value == l1.used_bytes
    finally:
        cache.close()

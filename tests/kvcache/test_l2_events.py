"""Redis's own evictions and our L2 clears reach the routers as `removed` KV events of tier l2."""

import logging

import redis
import torch

from fleetserve.engine.prefix_cache import PrefixCache
from fleetserve.kvcache.l2watch import notify_flags
from fleetserve.kvcache.tiers import RedisStore
from tests.helpers import wait_until

SHAPE = (1, 2, 1, 16, 8)  # 1 KiB a block in float32


def blocks(n, start=0):
    return [(start + i, torch.full(SHAPE, float(i))) for i in range(n)]


def removed_l2(cache):
    return [k for e in cache.events.since(0)["events"] if e["type"] == "removed" and e["tier"] == "l2"
            for k in e["keys"]]


def stored_l2(cache):
    return [k for e in cache.events.since(0)["events"] if e["type"] == "stored" and e["tier"] == "l2"
            for k in e["keys"]]


def test_notify_flags_add_only_what_is_missing():
    assert notify_flags("") == "Eex"
    assert notify_flags("Kg") == "KgEex"
    assert notify_flags("AE") is None and notify_flags("Exe") is None


def test_redis_evictions_are_published_as_removed_l2_events(redis_server):
    client = redis.Redis.from_url(redis_server["url"])
    used = client.info("memory")["used_memory"]
    client.config_set("maxmemory", str(used + (512 << 10)))  # about 400 of our blocks fit; allkeys-lru
    cache = PrefixCache(SHAPE, torch.float32, engine_blocks=8, l2=RedisStore(redis_server["url"], prefix="t:kv:"))
    try:
        assert cache.l2_watchers[0].subscribed.wait(10)
        assert "e" in client.config_get("notify-keyspace-events")["notify-keyspace-events"]
        for start in range(0, 3000, 100):
            cache.store(blocks(100, start))
            cache.flush()
        wait_until(lambda: len(removed_l2(cache)) > 1000, 20, what="eviction events")
        gone = removed_l2(cache)
        assert set(gone) <= set(stored_l2(cache))  # only our blocks, by their block keys
        assert all(v is None for v in cache.l2.get_many(gone[:200]))  # and they really are gone
        # notifications may still be arriving: the counter and the events agree once they stop
        wait_until(lambda: cache.l2.stats.evictions == len(removed_l2(cache)), 10, what="eviction counter")
    finally:
        cache.close()


def test_clearing_l2_publishes_every_cleared_block(redis_server):
    cache = PrefixCache(SHAPE, torch.float32, engine_blocks=8, l2=RedisStore(redis_server["url"], prefix="c:kv:"))
    try:
        cache.store(blocks(20, 1000))
        cache.flush()
        cache.clear({"l2"})
        assert sorted(removed_l2(cache)) == list(range(1000, 1020))
    finally:
        cache.close()


def test_a_redis_that_refuses_config_is_logged_once_and_still_serves(redis_server, monkeypatch, caplog):
    def refuse(self, *args, **kwargs):
        raise redis.ResponseError("unknown command 'CONFIG'")

    monkeypatch.setattr(redis.Redis, "config_get", refuse)
    caplog.set_level(logging.WARNING, logger="fleetserve.kvcache.l2watch")
    cache = PrefixCache(SHAPE, torch.float32, engine_blocks=8, l2=RedisStore(redis_server["url"], prefix="r:kv:"))
    try:
        watcher = cache.l2_watchers[0]
        assert watcher.subscribed.wait(10) and watcher.configured is False
        cache.store(blocks(5))
        cache.flush()
        assert sorted(stored_l2(cache)) == list(range(5))
        assert sum("refused CONFIG" in r.getMessage() for r in caplog.records) == 1
    finally:
        cache.close()


def test_an_unreachable_l2_does_not_stop_the_cache():
    cache = PrefixCache(SHAPE, torch.float32, engine_blocks=8, l2=RedisStore("redis://127.0.0.1:1/0", timeout=0.1))
    try:
        cache.store(blocks(3))
        assert [t for t, _ in cache.lookup([0, 1, 2])] == ["engine"] * 3
    finally:
        cache.close()


def test_a_redis_restarted_empty_makes_the_routers_forget_this_engines_l2_blocks(redis_server):
    """A Redis restarted without persistence holds none of the blocks the routers were told it had; they kept
    crediting every one of them for good (found in a black-box pass). The engine's event log now asks its
    subscribers to resynchronise, and its snapshot lists no L2 block."""
    from fleetserve.router.kvindex import KVIndex

    cache = PrefixCache(SHAPE, torch.float32, engine_blocks=8, l2=RedisStore(redis_server["url"], prefix="r:kv:"))
    index = KVIndex()
    try:
        assert cache.l2_watchers[0].subscribed.wait(10)
        cache.store(blocks(20, 500))
        cache.flush()
        seq = 0
        update = cache.events.since(seq)
        for event in update["events"]:
            getattr(index, event["type"])("r0", event["keys"], event["tier"])
        seq = update["seq"]
        assert "l2" in index.tiers("r0", 500)
        redis_server["proc"].kill()
        redis_server["proc"].wait()
        redis_server["restart"]()
        wait_until(lambda: cache.events.since(seq).get("resync"), 30, what="a resync asked of the subscribers")
        snapshot = cache.snapshot()
        index.replace("r0", {b["key"]: b["tiers"] for b in snapshot["blocks"]})
        assert "l2" not in index.tiers("r0", 500)
    finally:
        cache.close()

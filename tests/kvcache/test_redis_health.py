"""What `status` says of an L2 Redis that refuses the fleet, from a real redis-server with a password."""

import shutil
import subprocess

import pytest

from fleetserve.fleet.process import free_port
from fleetserve.kvcache.tiers import redis_health, refusal_reason
from tests.helpers import wait_until


@pytest.fixture()
def guarded(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh installs it as root)")
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--requirepass", "s3cret", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        wait_until(lambda: redis_health(url, "s3cret") == "up", 30, what="redis-server")
        yield url
    finally:
        proc.kill()
        proc.wait()


def test_a_refusal_says_what_is_wrong_in_whole_words(guarded):
    """A missing password read "... otherwise the HELLO )": Redis's sentence cut at 80 characters."""
    missing = redis_health(guarded)
    assert missing.startswith("refused (") and "needs a password" in missing and missing.endswith(")")
    assert "wrong user name or password" in redis_health(guarded, "not-it")
    long = "ERR " + "word " * 60 + "end. Second sentence"
    assert refusal_reason(long).endswith(" ...") and len(refusal_reason(long)) <= 121
    assert refusal_reason("ERR unknown command 'HELLO'. Try again") == "ERR unknown command 'HELLO'"


def test_a_full_redis_that_evicts_nothing_is_not_up(guarded):
    """Every write refused (OOM under noeviction) while `status` read "up"; the engines' logs alone said it."""
    import redis

    client = redis.Redis.from_url(guarded, password="s3cret")
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", str(used // 2))
    health = redis_health(guarded, "s3cret")
    assert health.startswith("full (") and "noeviction" in health
    client.config_set("maxmemory-policy", "volatile-lru")  # ElastiCache's default: only keys with a TTL go
    assert redis_health(guarded, "s3cret").startswith("full (")
    client.config_set("maxmemory-policy", "allkeys-lru")  # it evicts: writes go on
    assert redis_health(guarded, "s3cret") == "up"
    # a user that may not read INFO (a least-privilege ACL) is no refusal: GET and SET work
    client.execute_command("ACL", "SETUSER", "kv", "on", ">kvpass", "~*", "+@all", "-info")
    bare = guarded.replace("redis://", "redis://kv@")
    assert redis_health(bare, "kvpass") == "up"


def test_a_redis_a_block_short_of_its_limit_that_refuses_writes_is_full(guarded):
    """A KV block is large: a write that would pass maxmemory is refused and the memory stays below the limit, so
    `status` read "up" at 96 % used while the engine's log said every write was refused. Writes refused for
    memory with most of it used count as full; the same usage without refusals is up."""
    import redis

    client = redis.Redis.from_url(guarded, password="s3cret")
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", str(used + 300_000))
    assert redis_health(guarded, "s3cret") == "up"  # nothing refused yet
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("block", b"x" * 737_000)  # one block of the demo model
    health = redis_health(guarded, "s3cret")
    assert health.startswith("full (") and "1 writes refused for memory" in health, health


def test_writes_refused_with_most_memory_used_is_full_below_the_limit():
    """The case a real Redis shows once its client buffers are freed: 96 % used, every block write refused."""
    from fleetserve.kvcache.tiers import _full

    memory = {"maxmemory": 8_545_688, "used_memory": 8_245_688, "maxmemory_policy": "noeviction"}
    assert _full(memory) is None  # no write refused: a block may still fit
    assert _full(memory, refused=4).startswith("full (used 8,245,688 of maxmemory 8,545,688 bytes")
    assert _full({**memory, "used_memory": 4_000_000}, refused=4) is None  # room again (maxmemory raised, flushed)
    assert _full({**memory, "maxmemory_policy": "allkeys-lru"}, refused=4) is None  # it evicts
    evicting = {"maxmemory": 1000, "used_memory": 1100, "maxmemory_policy": "allkeys-lru"}
    assert "too small" in _full(evicting, refused=1)  # it evicted all it may and is still over
    assert _full({**evicting, "mem_not_counted_for_evict": 200}, refused=1) is None  # its replication buffers


def test_a_maxmemory_too_small_for_redis_itself_is_full_under_allkeys_lru(guarded):
    """`l2.maxBytes: 512`: Redis used 1.1 MB of its 512 bytes, refused every block under allkeys-lru, and `status`
    read "up" (found in review)."""
    import redis

    client = redis.Redis.from_url(guarded, password="s3cret")
    client.config_set("maxmemory-policy", "allkeys-lru")
    client.config_set("maxmemory", "512")
    assert redis_health(guarded, "s3cret") == "up"  # nothing refused yet
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("block", b"x" * 1000)
    health = redis_health(guarded, "s3cret")
    assert health.startswith("full (") and "allkeys-lru" in health and "too small" in health, health
    client.config_set("maxmemory", "0")  # no limit: room again
    assert redis_health(guarded, "s3cret") == "up"


def test_an_outage_is_said_once_with_its_reason_and_its_end(guarded, caplog):
    """A wrong and a missing password both read `unavailable (AuthenticationError)`, again after every back-off
    as long as requests came (5 lines in 7 s), and nothing said when Redis answered again (found in review)."""
    import logging
    import time

    from fleetserve.kvcache.tiers import RedisStore

    store = RedisStore(guarded, prefix="t:", password="not-it", backoff=0.01)
    with caplog.at_level(logging.INFO, logger="fleetserve.kvcache.tiers"):
        for _ in range(5):
            assert store.get_many([1]) == [None]
            time.sleep(0.02)  # past the back-off: each read tries the server again
        assert store.stats.failures == 5 and store.state == "unavailable"
        (line,) = [r.getMessage() for r in caplog.records]
        assert "unavailable (AuthenticationError: wrong user name or password)" in line, line
        import redis

        redis.Redis.from_url(guarded, password="s3cret").config_set("requirepass", "not-it")  # the operator's fix
        time.sleep(0.02)
        assert store.get_many([1]) == [None] and store.state == "up"
        assert store.get_many([1]) == [None]
    assert [r.getMessage() for r in caplog.records][1:] == [f"L2 Redis at {guarded} answers again"]
    missing = RedisStore(guarded, prefix="t:")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fleetserve.kvcache.tiers"):
        missing.put_many([(1, b"x")])
    assert "the server needs a password" in caplog.text

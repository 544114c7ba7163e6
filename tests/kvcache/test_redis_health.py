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

"""An L2 that answers what it should not: garbage from whatever listens at its address, and a read-only Redis
(a replica, or a primary that failed over). Requests recompute; reads go on where they can."""

import shutil
import socket
import subprocess
import threading
import time

import pytest

from fleetserve.fleet.process import free_port
from fleetserve.kvcache.tiers import RedisStore, redis_health
from tests.helpers import wait_until


class GarbageRedis:
    """A TCP server speaking just enough RESP to get past a client's handshake, then answering MGET with `reply`
    (an integer, or an array of the wrong length): what a proxy in a bad state, or another service on the port,
    sends back."""

    def __init__(self, reply: bytes):
        self.reply = reply
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            buffer = b""
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buffer += data
                while buffer.startswith(b"*"):
                    command, buffer = _one_command(buffer)
                    if command is None:
                        break
                    conn.sendall(self.reply if command[0].upper() == b"MGET" else b"+OK\r\n")

    def close(self):
        self.sock.close()


def _one_command(buffer: bytes):
    """(the command's words, the rest of the buffer), or (None, buffer) when it is not whole yet."""
    lines = buffer.split(b"\r\n")
    try:
        count = int(lines[0][1:])
        words = [lines[2 + 2 * i] for i in range(count)]
    except (ValueError, IndexError):
        return None, buffer
    used = sum(len(line) + 2 for line in lines[:1 + 2 * count])
    return words, buffer[used:]


@pytest.mark.parametrize("reply", [b":1\r\n", b"*1\r\n$-1\r\n", b"$5\r\nhello\r\n"])
def test_garbage_from_the_l2_address_is_a_failure_not_an_error(reply):
    """Every request had failed with a 500 (TypeError or ValueError) for as long as the replies lasted; the tier's
    state, its failures and its back-off never moved (found in a black-box pass)."""
    server = GarbageRedis(reply)
    try:
        store = RedisStore(server.url, prefix="t:", backoff=30)
        assert store.get_many([1, 2, 3]) == [None, None, None]
        assert store.state == "unavailable" and store.stats.failures == 1 and not store.available
        assert store.get_many([1, 2, 3]) == [None, None, None] and store.stats.failures == 1  # backing off
    finally:
        server.close()


def test_an_engine_in_front_of_a_garbage_l2_answers_by_recomputing(tmp_path, tiny_model):
    import httpx

    from tests.helpers import Server

    server = GarbageRedis(b":1\r\n")
    engine = Server(["engine", "--model", str(tiny_model), "--served-model-name", "tiny", "--threads", "1",
                     "--block-size", "16", "--l2-url", server.url], tmp_path / "engine.log").start()
    try:
        for _ in range(2):
            r = httpx.post(engine.url + "/v1/completions", json={"model": "tiny", "prompt": "abc " * 20,
                                                                 "max_tokens": 2, "temperature": 0}, timeout=60)
            assert r.status_code == 200, r.text
    finally:
        engine.stop()
        server.close()


@pytest.fixture()
def primary_and_replica(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh installs it as root)")
    procs, urls = [], []
    primary = free_port()
    for port, extra in ((primary, []), (free_port(), ["--replicaof", "127.0.0.1", str(primary)])):
        folder = tmp_path / str(port)
        folder.mkdir()
        procs.append(subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no", "--dir", str(folder), *extra],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls.append(f"redis://127.0.0.1:{port}/0")
    try:
        for url in urls:  # the replica reads as read-only, once it answers
            wait_until(lambda url=url: redis_health(url).startswith(("up", "read-only")), 30, what="redis-server")
        yield urls
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_read_only_l2_pauses_writes_and_keeps_reading(primary_and_replica):
    """Each refused write (ReadOnlyError) marked the whole store down for its back-off, so the blocks the replica
    held missed too: 1 of 6 prompts already in L2 was a hit (found in a black-box pass)."""
    primary_url, replica_url = primary_and_replica
    writer = RedisStore(primary_url, prefix="t:")
    assert writer.put_many([(1, b"one"), (2, b"two")]) == [1, 2]
    reader = RedisStore(replica_url, prefix="t:", backoff=30)
    wait_until(lambda: reader.get_many([1, 2]) == [b"one", b"two"], 30, what="replication")
    assert reader.put_many([(3, b"three")]) == [] and reader.state == "read_only" and reader.available
    assert reader.get_many([1, 2, 3]) == [b"one", b"two", None] and reader.state == "read_only"
    assert reader.put_many([(4, b"four")]) == []  # paused for the back-off: not even tried


def test_a_read_only_l2_is_said_once_per_episode_and_shown_by_status(primary_and_replica, caplog):
    """The refusal was logged again after every 2 s back-off for as long as traffic lasted (43,000 lines a day),
    and `status` read "up" for a replica that refused every write."""
    import logging

    import redis

    primary_url, replica_url = primary_and_replica
    primary_port = primary_url.rsplit(":", 1)[1].split("/")[0]
    assert redis_health(replica_url).startswith(f"read-only (a replica of 127.0.0.1:{primary_port}")
    assert redis_health(primary_url) == "up"
    reader = RedisStore(replica_url, prefix="t:", backoff=0.01)
    with caplog.at_level(logging.INFO, logger="fleetserve.kvcache.tiers"):
        for key in range(5):
            time.sleep(0.05)  # past the back-off: each write is tried, and refused
            assert reader.put_many([(key, b"v")]) == [] and reader.state == "read_only"
        said = [r.getMessage() for r in caplog.records if "refuses writes" in r.getMessage()]
        assert len(said) == 1, said
        redis.Redis.from_url(replica_url).execute_command("REPLICAOF", "NO", "ONE")
        wait_until(lambda: reader.put_many([(9, b"nine")]) == [9], 30, what="writes taken again")
        assert any(r.getMessage().endswith("takes writes again") for r in caplog.records)
        assert reader.put_many([(10, b"ten")]) == [10]
        assert len([r for r in caplog.records if r.getMessage().endswith("takes writes again")]) == 1

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import Server, processes_with_env


@pytest.fixture(scope="session", autouse=True)
def fleetserve_home(tmp_path_factory) -> Path:
    """Every test run gets its own FLEETSERVE_HOME (fleet state, model cache); the demo model is imported once per
    run for all workers (a link the import follows; 45 s of CPU each, and every worker had imported it), or reused
    from the user's own cache."""
    home = tmp_path_factory.mktemp("fleetserve-home")
    os.environ["FLEETSERVE_HOME"] = str(home)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    demo = Path.home() / ".cache" / "fleetserve" / "models" / "smollm2-135m"
    if not demo.is_dir():
        base = tmp_path_factory.getbasetemp()
        shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's, across its workers
        demo = shared / "demo-models" / "smollm2-135m"
        demo.parent.mkdir(exist_ok=True)
    (home / "models").mkdir(parents=True, exist_ok=True)
    (home / "models" / "smollm2-135m").symlink_to(demo)
    return home


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from fleetserve.engine.tiny import create_tiny_model

    return create_tiny_model(tmp_path_factory.mktemp("models") / "tiny", context_length=512)


@pytest.fixture(scope="session")
def tiny_engine(tiny_model, tmp_path_factory):
    """One per worker for every module that uses it (their tests read it as shared: counters at least 1, prompts
    of their own): as a module fixture each module started its own, and again when xdist came back to it."""
    server = Server(["engine", "--model", str(tiny_model), "--served-model-name", "tiny", "--threads", "1"],
                    tmp_path_factory.mktemp("logs") / "engine.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def slow_model(tmp_path_factory) -> Path:
    """Slow enough (several ms a token) that 3,000 tokens take seconds: streams can be cut mid-way."""
    from fleetserve.engine.tiny import create_tiny_model

    return create_tiny_model(tmp_path_factory.mktemp("models") / "slow", hidden_size=256, layers=4, heads=4,
                             kv_heads=4, context_length=4096)


@pytest.fixture()
def redis_server(tmp_path):
    """A real redis-server on a free loopback port, evicting least recently used keys at its memory cap."""
    import shutil
    import subprocess

    from fleetserve.fleet.process import free_port
    from tests.helpers import wait_until

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh installs it as root)")
    port = free_port()

    import redis

    def start():
        proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru",
                                 "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=port)

        def up():
            try:
                return client.ping()
            except redis.RedisError:
                return False

        try:
            wait_until(up, 30, what="redis-server")
        except BaseException:
            proc.kill()  # never leave a server behind
            raise
        return proc

    server = {"url": f"redis://127.0.0.1:{port}/0", "proc": start()}
    server["restart"] = lambda: server.__setitem__("proc", start())
    yield server
    server["proc"].kill()
    server["proc"].wait()


@pytest.fixture()
def home(tmp_path):
    """A FLEETSERVE_HOME of this test's own: leftovers are found by it in /proc/*/environ and killed."""
    import signal

    path = tmp_path / "home"
    path.mkdir()
    yield {"FLEETSERVE_HOME": str(path)}
    for pid in processes_with_env("FLEETSERVE_HOME", str(path)):  # never leak into other tests
        os.kill(pid, signal.SIGKILL)

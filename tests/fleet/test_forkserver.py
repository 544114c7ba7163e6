"""The engine fork server (fleet/forkserver.py): real server processes, real forked engines."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from fleetserve.fleet.forkserver import ForkServer, become
from fleetserve.fleet.process import Child, fleetserve_command, free_port
from fleetserve.fleet.state import pid_alive
from tests.helpers import http_ok, wait_until


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(") ", 1)[1].split()[1])


@pytest.fixture
def said():
    return []


@pytest.fixture
def server(tmp_path, said):
    forks = ForkServer(tmp_path / "forkserver.log", dict(os.environ), said.append)
    yield forks
    forks.stop()


def test_a_forked_engine_serves_names_itself_and_reports_its_exit(server, tmp_path, tiny_model, said):
    server.start()
    port = free_port()
    engine = Child("r0", fleetserve_command("engine", "--model", str(tiny_model), "--port", str(port),
                                            "--threads", "1"), tmp_path / "r0.log", env={"MARK": "r0"},
                   forks=server)
    engine.start()
    wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/health"), 120, what="the forked engine serving")
    assert _parent(engine.pid) == server.pid  # forked, not started by its own interpreter
    cmdline = Path(f"/proc/{engine.pid}/cmdline").read_bytes().decode()
    assert "fleetserve engine --model" in cmdline and f"--port {port}" in cmdline  # `ps` names the engine
    assert os.getpgid(engine.pid) == engine.pid  # its own group, as process_group=0 gives a plain start
    assert "serving tiny" in (tmp_path / "r0.log").read_text()
    engine.stop(timeout=20)
    assert engine.exit_code() is not None and not pid_alive(engine.pid)
    server.stop()
    assert said == []  # a stop the fleet asked for is not news


def test_a_forked_child_gets_its_own_environment_group_streams_and_random_draws(tmp_path):
    """What `become` gives the child, against what Popen would: the request's environment only, its own process
    group, stdin from /dev/null, stdout and stderr appended to its log; and a random state of its own (a fork
    shares its parent's: every replica would draw the same numbers)."""
    import random

    random.seed(7)
    draws = []
    for i in range(2):
        log = tmp_path / f"child{i}.log"
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its log
            try:
                become({"args": ["version"], "env": {"ONLY": str(i)}, "log": str(log),
                        "death_signal": int(signal.SIGTERM)}, lambda: None)
                # through the descriptors: pytest's capture holds sys.stdout here (the engine's is fd 1's)
                os.write(1, json.dumps({"env": dict(os.environ), "pgid": os.getpgid(0), "pid": os.getpid(),
                                        "stdin": os.read(0, 10).decode(), "draw": random.random(),
                                        "argv": sys.argv}).encode() + b"\n")
                os.write(2, b"to stderr\n")
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        out, err = log.read_text().splitlines()
        seen = json.loads(out)
        assert seen["env"] == {"ONLY": str(i)} and seen["pgid"] == seen["pid"] and seen["stdin"] == ""
        assert seen["argv"] == ["fleetserve", "version"] and err == "to stderr"
        draws.append(seen["draw"])
    assert draws[0] != draws[1]


def test_a_server_that_never_starts_leaves_replicas_starting_as_plain_processes(tmp_path, said):
    forks = ForkServer(tmp_path / "forkserver.log", dict(os.environ), said.append)
    forks.command = [sys.executable, "-c", "import sys; print('no torch here', file=sys.stderr); sys.exit(3)"]
    forks.start()
    child = Child("v", fleetserve_command("version"), tmp_path / "v.log", forks=forks)
    child.start()  # asked before the server died
    wait_until(lambda: child.exit_code() is not None, 120, what="the version command run anyway")
    assert child.exit_code() == 0 and (tmp_path / "v.log").read_text().strip()  # the version printed
    assert _parent(os.getpid()) != child.pid and len(said) == 1 and "did not start" in said[0], said
    later = Child("v2", fleetserve_command("version"), tmp_path / "v2.log", forks=forks)
    later.start()  # asked after: not even tried
    assert later.proc is not None and not hasattr(later.proc, "signal_group")
    later.proc.wait(timeout=120)
    forks.stop()


def test_a_replica_stopped_before_the_server_is_ready_is_never_forked(tmp_path, said):
    forks = ForkServer(tmp_path / "forkserver.log", dict(os.environ), said.append)
    forks.command = [sys.executable, "-c", "import time; time.sleep(120)"]  # importing, forever
    forks.start()
    child = Child("r0", fleetserve_command("version"), tmp_path / "r0.log", forks=forks)
    child.start()
    assert child.alive() and child.pid is None  # starting: no process yet
    child.stop(timeout=30)
    assert child.exit_code() == -signal.SIGTERM and child.pid is None
    forks.stop(timeout=1)  # it never read its pipe: killed
    assert forks.proc.returncode == -signal.SIGKILL and said == []


def test_an_engine_goes_with_its_fork_server(server, tmp_path, tiny_model):
    """The server dies with the supervisor (SIGKILL); its engines then get their own death signal, as they did
    from a supervisor that started them itself."""
    server.start()
    port = free_port()
    engine = Child("r0", fleetserve_command("engine", "--model", str(tiny_model), "--port", str(port),
                                            "--threads", "1"), tmp_path / "r0.log", forks=server,
                   death_signal=signal.SIGTERM)
    engine.start()
    wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/health"), 120, what="the forked engine serving")
    pid = engine.pid
    os.kill(server.pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), 60, what="the engine gone with its server")
    wait_until(lambda: engine.exit_code() is not None, 30, what="its end reported")

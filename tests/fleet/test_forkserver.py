"""The engine fork server (fleet/forkserver.py): real server processes, real forked engines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fleetserve.fleet.forkserver import ForkServer, become
from fleetserve.fleet.process import Child, fleetserve_command
from fleetserve.fleet.state import pid_alive
from tests.helpers import wait_until

ROOT = Path(__file__).parents[2]


def _driver(scenario: str, tiny_model, folder) -> subprocess.Popen:
    """A stand-in supervisor (tests/fleet/forkserver_driver.py): a subreaper, which this test process must not be."""
    return subprocess.Popen([sys.executable, "-m", "tests.fleet.forkserver_driver", scenario, str(tiny_model),
                             str(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"})


def _facts(scenario: str, tiny_model, folder) -> dict:
    """What the driver found, run to its end."""
    driver = _driver(scenario, tiny_model, folder)
    try:
        out, _ = driver.communicate(timeout=900)
    finally:
        driver.kill()
    facts = json.loads(out.splitlines()[-1])
    assert "error" not in facts, facts
    return facts


@pytest.fixture
def said():
    return []


def test_a_forked_engine_is_its_supervisors_child_and_outlives_its_fork_server(tmp_path, tiny_model):
    facts = _facts("serve", tiny_model, tmp_path)
    assert facts["parent_is_me"] and facts["own_group"]  # re-parented to the supervisor, in its own group
    assert "fleetserve engine --model" in facts["cmdline"]  # `ps` names the engine, not the fork server
    assert facts["home_in_environ"]  # /proc/PID/environ stays readable (the suite finds leftovers by it)
    assert facts["serving_logged"]
    assert facts["stopped_in_flight"] == -signal.SIGTERM  # the stop reached it: not lost, not a SIGKILL later
    assert facts["survived_server"]  # the server's death takes no replica with it (it had taken all of them)
    assert facts["fallback_served"]  # and the next start is a new interpreter
    assert facts["exit_code"] == -signal.SIGTERM  # its real status, as Popen reports it
    assert len(facts["said"]) == 1 and "fork server stopped" in facts["said"][0], facts["said"]


def test_an_engine_whose_server_died_before_reporting_it_is_still_tracked(tmp_path, tiny_model):
    """The server died between its fork and its report: the supervisor started the replica again as a plain
    process, which found its port taken by the forked engine nobody tracked (it served, and lived on)."""
    facts = _facts("lost_report", tiny_model, tmp_path)
    assert facts["dead"] and facts["forked"]  # the server is gone; the replica is still the forked one
    assert facts["on_port"] == [facts["tracked"]], facts  # one engine on the port, the one the supervisor knows


def test_an_engine_goes_with_its_supervisor(tmp_path, tiny_model):
    """SIGKILL the supervisor: the fork server goes (its own death signal), and each engine gets its own."""
    driver = _driver("orphan", tiny_model, tmp_path)
    try:
        line = driver.stdout.readline()
        facts = json.loads(line)
        assert "engine" in facts, facts
        os.kill(driver.pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(facts["engine"]), 60, what="the engine gone with its supervisor")
    finally:
        driver.kill()
        driver.wait()


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
                become({"id": i, "args": ["version"], "env": {"ONLY": str(i)}, "log": str(log),
                        "death_signal": int(signal.SIGTERM), "supervisor": os.getppid()}, lambda: None)
                # through the descriptors: pytest's capture holds sys.stdout here (the engine's is fd 1's)
                os.write(1, json.dumps({"env": dict(os.environ), "pgid": os.getpgid(0), "pid": os.getpid(),
                                        "stdin": os.read(0, 10).decode(), "draw": random.random(),
                                        "argv": sys.argv, "main": sys.modules["__main__"].__spec__.name}).encode()
                         + b"\n")
                os.write(2, b"to stderr\n")
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        out, err = log.read_text().splitlines()
        seen = json.loads(out)
        assert seen["env"] == {"ONLY": str(i)} and seen["pgid"] == seen["pid"] and seen["stdin"] == ""
        assert seen["argv"] == ["fleetserve", "version"] and err == "to stderr"
        assert seen["main"] == "fleetserve.__main__"  # click's usage line: "python -m fleetserve engine"
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
    assert len(said) == 1 and "did not start" in said[0], said
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


def test_adopted_orphans_are_reaped_and_known_children_are_left_to_their_owners():
    """The supervisor, a subreaper, adopts what its children leave behind (a killed router's workers): their
    zombies are reaped; a child whose exit Popen or a ForkedProcess reads is not (its status would be lost)."""
    from fleetserve.fleet.supervisor import reap_adopted

    def zombie() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        wait_until(lambda: Path(f"/proc/{proc.pid}/stat").read_text().rsplit(") ", 1)[1].startswith("Z"), 30,
                   what="a zombie")
        return proc

    owned, adopted = zombie(), zombie()
    reap_adopted({owned.pid})
    assert not Path(f"/proc/{adopted.pid}").exists()  # reaped
    assert Path(f"/proc/{owned.pid}").exists() and owned.wait(timeout=5) == 0  # its owner read its status


def test_the_server_imports_the_model_folders_own_architecture_once_and_survives_a_folder_without_one(tmp_path):
    """PRELOAD has Llama's modeling code only: a GPT-2 replica imported its own in every forked start."""
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    script = (
        "import sys\n"
        "from fleetserve.fleet import forkserver as f\n"
        "name = 'transformers.models.gpt2.modeling_gpt2'\n"
        "assert name not in sys.modules\n"
        f"f._preload_architecture(['engine', '--model', {str(gpt2)!r}, '--port', '1'])\n"
        "assert name in sys.modules\n"
        f"f._preload_architecture(['engine', '--model', {str(tmp_path / 'none')!r}])\n"
        "f._preload_architecture(['engine', '--model'])\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert "none's modeling code not preloaded (FileNotFoundError" in done.stderr, done.stderr


def test_a_server_hung_in_its_imports_is_given_up_and_the_replica_starts_as_a_process(tmp_path, said, monkeypatch):
    from fleetserve.fleet import forkserver

    monkeypatch.setattr(forkserver, "READY_TIMEOUT_S", 1.0)
    forks = ForkServer(tmp_path / "forkserver.log", dict(os.environ), said.append)
    forks.command = [sys.executable, "-c", "import time; time.sleep(120)"]  # importing, forever
    forks.start()
    child = Child("v", fleetserve_command("version"), tmp_path / "v.log", forks=forks)
    child.start()
    wait_until(lambda: child.exit_code() is not None, 120, what="the version command run anyway")
    assert child.exit_code() == 0 and (tmp_path / "v.log").read_text().strip()
    assert forks.dead.is_set() and forks.proc.returncode == -signal.SIGKILL
    assert len(said) == 1 and "did not finish its imports within 1s" in said[0], said
    forks.stop(timeout=1)


def test_a_ready_server_that_forks_nothing_is_killed_and_the_replica_starts_as_a_process(tmp_path, said,
                                                                                        monkeypatch):
    from fleetserve.fleet import forkserver

    monkeypatch.setattr(forkserver, "FORK_TIMEOUT_S", 1.0)
    forks = ForkServer(tmp_path / "forkserver.log", dict(os.environ), said.append)
    forks.command = [sys.executable, "-c", "import json, os, sys, time\n"  # ready, then reads and answers nothing
                     "print(json.dumps({'ready': os.getpid()}), flush=True)\nsys.stdin.readline()\ntime.sleep(120)"]
    forks.start()
    wait_until(forks.ready.is_set, 60, what="the stand-in server ready")
    child = Child("v", fleetserve_command("version"), tmp_path / "v.log", forks=forks)
    child.start()
    wait_until(lambda: child.exit_code() is not None, 120, what="the version command run anyway")
    assert child.exit_code() == 0 and (tmp_path / "v.log").read_text().strip()
    assert forks.dead.is_set() and len(said) == 1 and "it forked nothing for 1s" in said[0], said
    forks.stop(timeout=1)


def test_the_servers_command_line_names_its_fleet_folder(tmp_path):
    """`ps | grep NAME` found every process of a fleet but its fork server (its command line was the module and 4 KB
    of spaces)."""
    folder = tmp_path / "run" / "myfleet"
    forks = ForkServer(folder / "logs" / "forkserver.log", {}, lambda _m: None)
    assert str(folder) in forks.command and forks.command[-1].isspace()  # the title's room stays last

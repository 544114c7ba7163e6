"""The fleet's run folder is closed to other users: Prometheus writes its TSDB and WAL (whose series name the
tenants) 0644 inside it, and logs there carry prompts with logPrompts, so the folder's own mode is what keeps
other local users out."""

import logging
import os
import stat

from fleetserve.fleet.state import FleetState, fleet_dir, private_fleet_dir, read_state, write_state


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_run_folder_the_state_write_makes_is_owner_only(monkeypatch, tmp_path):
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path))
    write_state(FleetState(name="private", namespace="default", model="m", spec_path="s.yaml", supervisor_pid=1))
    assert mode(fleet_dir("private")) & 0o077 == 0
    assert read_state("private").name == "private"


def test_a_fleets_start_closes_a_folder_an_earlier_version_left_readable_and_keeps_the_owners_bits(
        monkeypatch, tmp_path):
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path))
    folder = fleet_dir("old")
    (folder / "prometheus" / "data").mkdir(parents=True)
    folder.chmod(0o755)
    assert private_fleet_dir("old") == folder and mode(folder) == 0o700
    assert (folder / "prometheus" / "data").is_dir()  # nothing inside is touched


def test_a_folder_of_another_owner_is_left_with_a_warning_not_a_traceback(monkeypatch, tmp_path, caplog):
    """A shared FLEETSERVE_HOME: chmod on another user's folder raised PermissionError at every state write."""
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path))
    folder = fleet_dir("shared")
    folder.mkdir(parents=True)
    folder.chmod(0o755)
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)  # as if another user ran the fleet
    with caplog.at_level(logging.WARNING, logger="fleetserve.fleet.state"):
        assert private_fleet_dir("shared") == folder
    assert mode(folder) == 0o755 and "belongs to another user" in caplog.text


def test_one_supervisor_per_fleet_name_holds_its_lock_until_it_ends(monkeypatch, tmp_path):
    """Two `up` of one new name at once both passed the state file's check: two whole fleets ran, `down` stopped
    one, and the loser had moved the winner's logs. The name's lock is taken before anything is touched; the
    kernel releases it when its holder ends (a SIGKILLed supervisor leaves no stale lock)."""
    import subprocess
    import sys

    import pytest

    from fleetserve.fleet.control import LOCK_FILE, FleetError, take_fleet_lock

    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path))
    first = take_fleet_lock("chat")
    with pytest.raises(FleetError, match="already running or starting"):
        take_fleet_lock("chat")
    assert take_fleet_lock("other") >= 0  # names are apart
    os.close(first)
    os.close(take_fleet_lock("chat"))
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); "
        "print('held', flush=True); time.sleep(60)"), str(fleet_dir("chat") / LOCK_FILE)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        with pytest.raises(FleetError):
            take_fleet_lock("chat")
    finally:
        holder.kill()
        holder.wait()
    os.close(take_fleet_lock("chat"))  # released with its holder, killed


def test_a_silent_supervisor_is_said_and_its_dead_replicas_are_not_ready(monkeypatch, tmp_path):
    """A supervisor stopped with SIGSTOP while both replicas died: `status` said "ready, desired 2, ready 2" with
    pids that no longer existed, and requests waited in the buffer unsaid."""
    import subprocess
    import sys
    import time

    from fleetserve.fleet.state import ReplicaState, mark_stale, process_start

    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state = FleetState("f", "default", "m", "f.yaml", os.getpid(), status="ready",
                           supervisor_start=process_start(os.getpid()), ready=2,
                           replicas=[ReplicaState("r0", "http://127.0.0.1:1", pid=gone.pid, state="ready"),
                                     ReplicaState("r1", "http://127.0.0.1:2", pid=live.pid, state="ready")])
        write_state(state)
        assert mark_stale(read_state("f")).error == ""  # written just now: its word stands
        old = time.time() - 60
        os.utime(fleet_dir("f") / "state.json", (old, old))
        seen = mark_stale(read_state("f"))
        assert "has not written the fleet's state for 60 s" in seen.error and "SIGSTOP" in seen.error
        assert [(r.id, r.state) for r in seen.replicas] == [("r0", "gone"), ("r1", "ready")] and seen.ready == 1
        state.status = "starting"  # a start prepares its model (minutes) without writing: no false alarm
        write_state(state)
        os.utime(fleet_dir("f") / "state.json", (old, old))
        assert mark_stale(read_state("f")).error == ""
    finally:
        live.kill()
        live.wait()


def test_down_on_a_full_disk_stops_the_fleet_without_a_traceback(monkeypatch, tmp_path):
    """`down` of a fleet whose supervisor had died, on a full disk: everything stopped, then a traceback from the
    state's write, exit 1."""
    import errno
    import subprocess
    import sys

    from fleetserve.fleet import control

    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write_state(FleetState("f", "default", "m", "f.yaml", gone.pid, status="ready"))

    def full(_state):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(control, "write_state", full)
    control.stop_fleet(read_state("f"), timeout=1)  # no exception: the fleet is stopped all the same


def test_a_relative_home_is_read_from_where_the_command_ran_and_handed_on_whole(monkeypatch, tmp_path):
    """FLEETSERVE_HOME=relhome: the fleet's prometheus.yml named relative paths, which Prometheus reads from the
    configuration's own folder (no target, no rule, no alert), and `status` from any other folder saw no fleet."""
    import subprocess
    import sys

    from fleetserve.engine.paths import home, pin_home
    from fleetserve.fleet.prometheus import config

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLEETSERVE_HOME", "relhome")
    assert home() == tmp_path / "relhome" and fleet_dir("x") == tmp_path / "relhome" / "run" / "x"
    made = config(fleet_dir("x") / "prometheus", scrape_interval_s=5, token_file=fleet_dir("x") / "t")
    assert all(os.path.isabs(f) for f in made["rule_files"])
    pin_home()
    assert os.environ["FLEETSERVE_HOME"] == str(tmp_path / "relhome")  # what its children inherit
    script = "import os; from fleetserve.engine.paths import pin_home; pin_home(); print(os.environ['FLEETSERVE_HOME'])"
    child = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                           env={**os.environ, "FLEETSERVE_HOME": "relhome"})
    assert child.stdout.strip() == str(tmp_path / "relhome"), child.stderr


def test_a_state_that_cannot_be_read_is_said_once(monkeypatch, tmp_path, caplog):
    """A fleet whose state.json cannot be parsed vanished from `status` and `down` without a word."""
    from fleetserve.fleet.state import list_fleets, read_state

    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path))
    fleet_dir("bad").mkdir(parents=True)
    (fleet_dir("bad") / "state.json").write_text('{"name": "bad", ')
    with caplog.at_level(logging.WARNING):
        assert read_state("bad") is None and list_fleets() == [] and read_state("missing") is None
    said = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(said) == 1 and "fleet bad" in said[0] and "state.json" in said[0]

"""The fleet's run folder is its owner's only: Prometheus writes its TSDB and WAL (whose series name the tenants)
0644 inside it, and logs there carry prompts with logPrompts, so the folder's own mode is what keeps other
local users out."""

import stat

from fleetserve.fleet.state import FleetState, fleet_dir, private_fleet_dir, read_state, write_state


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_state_write_makes_the_run_folder_owner_only(monkeypatch, tmp_path):
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path))
    write_state(FleetState(name="private", namespace="default", model="m", spec_path="s.yaml", supervisor_pid=1))
    assert mode(fleet_dir("private")) == 0o700
    assert read_state("private").name == "private"


def test_a_folder_an_earlier_version_left_world_readable_is_closed(monkeypatch, tmp_path):
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path))
    folder = fleet_dir("old")
    (folder / "prometheus" / "data").mkdir(parents=True)
    folder.chmod(0o755)
    assert private_fleet_dir("old") == folder and mode(folder) == 0o700
    assert (folder / "prometheus" / "data").is_dir()  # nothing inside is touched

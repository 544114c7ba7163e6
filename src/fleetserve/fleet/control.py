"""Detached fleets: start one in the background, find it again, stop it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from fleetserve.fleet.process import fleetserve_command
from fleetserve.fleet.state import FleetState, fleet_dir, pid_alive, read_state, running_fleets


class FleetError(Exception):
    """A fleet operation that cannot be done; the message says why and what to do."""


def ensure_not_running(name: str) -> None:
    state = read_state(name)
    if state and pid_alive(state.supervisor_pid) and state.status not in ("stopped", "failed"):
        raise FleetError(f"fleet {name!r} is already running (supervisor pid {state.supervisor_pid}, "
                         f"{state.url or 'starting'}); stop it with: fleetserve down {name}")


def start_detached(spec_path: str, name: str, timeout: float) -> FleetState:
    """Start the supervisor in its own session and wait until the fleet is ready or has failed."""
    ensure_not_running(name)
    folder = fleet_dir(name)
    if folder.exists():
        shutil.rmtree(folder / "logs", ignore_errors=True)
        (folder / "state.json").unlink(missing_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / "supervisor.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            fleetserve_command("up", str(Path(spec_path).resolve()), "--quiet-warnings"),
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while True:
        state = read_state(name)
        if state and state.supervisor_pid == proc.pid:
            if state.status == "ready":
                return state
            if state.status == "failed":
                proc.wait(timeout=60)
                raise FleetError(state.error or f"fleet failed to start; see {log_path}")
        code = proc.poll()
        if code is not None:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
            raise FleetError(f"the supervisor exited with code {code} before the fleet was ready:\n{tail}")
        if time.monotonic() > deadline:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            raise FleetError(f"the fleet was not ready after {timeout:.0f}s; see {log_path}")
        time.sleep(0.2)


def pick_fleet(name: str | None) -> FleetState:
    fleets = running_fleets()
    if name:
        match = [f for f in fleets if f.name == name]
        if not match:
            known = ", ".join(f.name for f in fleets) or "none"
            raise FleetError(f"no running fleet named {name!r} (running: {known})")
        return match[0]
    if not fleets:
        raise FleetError("no fleet is running")
    if len(fleets) > 1:
        raise FleetError(f"several fleets are running ({', '.join(f.name for f in fleets)}); name one")
    return fleets[0]


def _is_ours(pid: int) -> bool:
    try:
        return b"fleetserve" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def stop_fleet(state: FleetState, timeout: float = 60.0) -> None:
    """SIGTERM the supervisor (it stops its children in order); SIGKILL whatever is left after `timeout`."""
    pid = state.supervisor_pid
    if pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)  # its children die with it (PR_SET_PDEATHSIG)
    leftovers = [state.router_pid] + [r.pid for r in state.replicas]
    for child in leftovers:
        if child and pid_alive(child) and _is_ours(child):
            try:
                os.killpg(child, signal.SIGKILL)
            except ProcessLookupError:
                pass

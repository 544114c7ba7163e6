"""Detached fleets: start one in the background, find it again, stop it."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from fleetserve.fleet.process import fleetserve_command
from fleetserve.fleet.state import (
    PREVIOUS,
    FleetState,
    failed_start,
    fleet_dir,
    list_fleets,
    mark_stale,
    pid_alive,
    private_fleet_dir,
    read_state,
    running_fleets,
    supervisor_alive,
    write_state,
)

log = logging.getLogger(__name__)


class FleetError(Exception):
    """A fleet operation that cannot be done; the message says why and what to do. `exit_code`: 2 when the
    command's input is at fault (a name no fleet has, or none given where several run), 1 for the fleets' state."""

    def __init__(self, message: str, exit_code: int = 1, stopped: FleetState | None = None):
        super().__init__(message)
        self.exit_code = exit_code
        self.stopped = stopped  # the named fleet's record when it exists but is stopped already (`down`: done)


LOCK_FILE = "supervisor.lock"
LOCK_FD_ENV = "FLEETSERVE_FLEET_LOCK_FD"  # the lock `up --detach` took, inherited by the supervisor it starts


def take_fleet_lock(name: str) -> int:
    """An exclusive lock on the fleet's name, held by its supervisor for its whole life (the kernel releases it
    when the process ends, SIGKILL included): the descriptor, or FleetError when another holds it. Two `up` of one
    name at once had both passed the state file's check and started two whole fleets, and the loser had moved
    the winner's logs; `down` stopped only one."""
    import fcntl

    folder = private_fleet_dir(name)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # EWOULDBLOCK: held
        os.close(fd)
        raise FleetError(f"fleet {name!r} is already running or starting (another supervisor holds "
                         f"{folder / LOCK_FILE}); stop it with: fleetserve down {name}") from None
    except OSError as exc:  # a file system without locks (NFS without lockd, some FUSE homes): said as it is
        os.close(fd)
        raise FleetError(f"cannot lock {folder / LOCK_FILE} ({exc.strerror or exc}): FLEETSERVE_HOME must be on a "
                         "file system with file locks (a local disk)") from None
    return fd


def inherited_fleet_lock() -> int | None:
    """The lock descriptor `up --detach` passed to the supervisor it started, if any."""
    value = os.environ.pop(LOCK_FD_ENV, None)
    return int(value) if value and value.isdigit() else None


def ensure_not_running(name: str) -> None:
    state = read_state(name)
    if state and supervisor_alive(state) and state.status not in ("stopped", "failed"):
        raise FleetError(f"fleet {name!r} is already running (supervisor pid {state.supervisor_pid}, "
                         f"{state.url or 'starting'}); stop it with: fleetserve down {name}")


PREVIOUS_LOGS = "logs.previous"  # the last run's logs (and its supervisor.log), kept through the next start
FAILED_START_LOGS = "logs.failed-start"  # a failed start's, which do not displace the last run's
DETACHED_ENV = "FLEETSERVE_DETACHED_SUPERVISOR"  # set for the supervisor `up --detach` starts


def keep_previous_logs(folder: Path) -> None:
    """The last run's logs move to `logs.previous` (the one before goes): a fleet started again after a crash had
    deleted the crashed run's replica, router and supervisor logs, the evidence of what happened. A start that
    failed before it was ready (its error was printed) keeps its logs in `logs.failed-start` instead: it had
    pushed the last run's away."""
    previous = folder / (FAILED_START_LOGS if failed_start(folder) else PREVIOUS_LOGS)
    if not (folder / "logs").exists() and not (folder / "supervisor.log").exists():
        return
    try:
        shutil.rmtree(previous, ignore_errors=True)
        if (folder / "logs").exists():
            os.replace(folder / "logs", previous)
        previous.mkdir(mode=0o700, exist_ok=True)
        if (folder / "supervisor.log").exists():
            os.replace(folder / "supervisor.log", previous / "supervisor.log")
    except OSError:  # a folder in the way: the new run's lines follow the old ones in the same files, as before
        pass


def set_aside_last_run(folder: Path) -> None:
    """Before a supervisor starts: the last run's logs and state move aside (`logs.previous`, PREVIOUS), where the
    new supervisor carries on from them (read_previous_state: its port, its scaling state). A start that failed
    before it was ready is no last run: its state goes, its logs go to `logs.failed-start`, and the run before
    it stays (one failed `up` had given the next start a new URL and the failed attempt's logs only)."""
    failed = failed_start(folder)
    keep_previous_logs(folder)
    if failed:
        (folder / "state.json").unlink(missing_ok=True)
    elif (folder / "state.json").exists():
        os.replace(folder / "state.json", folder / PREVIOUS)


def start_detached(spec_path: str, name: str, timeout: float, extra_args: tuple[str, ...] = ()) -> FleetState:
    """Start the supervisor in its own session and wait until the fleet is ready or has failed. Ctrl-C or SIGTERM
    while it starts stops it: in its own session it had gone on starting, ready later, its URL never printed."""
    ensure_not_running(name)
    lock = take_fleet_lock(name)  # before the logs move: a second `up` of the name touches nothing
    try:
        folder = fleet_dir(name)
        set_aside_last_run(folder)
        log_path = folder / "supervisor.log"
        with open(log_path, "ab") as log:  # appended to, as the children's logs are: rotated by copy and truncate
            proc = subprocess.Popen(
                fleetserve_command("up", str(Path(spec_path).resolve()), "--quiet-warnings", *extra_args),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                # its logs were kept here: it writes into this supervisor.log; and it holds the lock from here on
                env={**os.environ, DETACHED_ENV: "1", LOCK_FD_ENV: str(lock)}, pass_fds=(lock,),
            )
    finally:
        os.close(lock)  # the supervisor's copy holds it
    try:
        return _wait_started(proc, name, log_path, timeout)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (cli/console.Terminated): the start is called off
        _stop_starting(proc)
        raise


def _stop_starting(proc: subprocess.Popen) -> None:
    """SIGTERM the starting supervisor (it stops what it started, in order); its whole session after 30 s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _wait_started(proc: subprocess.Popen, name: str, log_path: Path, timeout: float) -> FleetState:
    deadline = time.monotonic() + timeout
    while True:
        state = read_state(name)
        if state and state.supervisor_pid == proc.pid:
            if state.status == "ready":
                return state
            if state.status == "failed":
                code = proc.wait(timeout=60)  # 2: the spec named something that is not there (bad input)
                raise FleetError(state.error or f"fleet failed to start; see {log_path}", 2 if code == 2 else 1)
        code = proc.poll()
        if code == 0:  # a clean exit before ready: it was stopped (`fleetserve down`, a signal), not broken
            raise FleetError(f"fleet {name!r} was stopped before it was ready (fleetserve down, or a signal)")
        if code is not None:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
            raise FleetError(f"the supervisor exited with code {code} before the fleet was ready:\n{tail}")
        if time.monotonic() > deadline:
            _stop_starting(proc)
            raise FleetError(f"the fleet was not ready after {timeout:.0f}s; see {log_path}")
        time.sleep(0.2)


def dead_fleets() -> list[FleetState]:
    """Fleets whose supervisor was killed before it could write its end (state says running, no process)."""
    return [mark_stale(f) for f in list_fleets()
            if f.status not in ("stopped", "failed") and not supervisor_alive(f)]


def pick_fleet(name: str | None) -> FleetState:
    """The fleet `down` acts on: a running one, or one whose supervisor died (its leftovers get cleaned)."""
    fleets = running_fleets()
    dead = dead_fleets()
    if name:
        match = [f for f in fleets + dead if f.name == name]
        if not match:
            known = ", ".join(f.name for f in fleets) or "none"
            stopped = next((f for f in list_fleets() if f.name == name), None)  # nothing to do, not a bad name
            raise FleetError(f"no running fleet named {name!r} (running: {known})", 1 if stopped else 2, stopped)
        return match[0]
    if not fleets and len(dead) == 1:
        return dead[0]
    if not fleets and not dead:
        ended = [f for f in list_fleets() if f.status in ("stopped", "failed")]
        raise FleetError("no fleet is running" + (f" ({', '.join(f.name for f in ended)}: stopped already)"
                                                  if ended else ""), stopped=ended[0] if ended else None)
    if not fleets:
        raise FleetError(f"no fleet is running (stale: {', '.join(f.name for f in dead)}; name one)")
    if len(fleets) > 1:
        raise FleetError(f"several fleets are running ({', '.join(f.name for f in fleets)}); name one", 2)
    return fleets[0]


def is_ours(pid: int, state: FleetState) -> bool:
    """A recorded pid may have been reused by an unrelated process: kill only ours (our CLI, or a server started
    in this fleet's folder, like its redis-server and its prometheus)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"fleetserve" in cmdline or str(fleet_dir(state.name)).encode() in cmdline


STOP_MARGIN_S = 30.0  # past the supervisor's own stop time (state.stop_timeout_s) before `down` SIGKILLs it


def stop_wait_s(state: FleetState) -> float:
    """How long `down` waits for the supervisor's own stop before SIGKILL (60 s plus the margin for a state written
    before supervisors said how long theirs takes)."""
    return (state.stop_timeout_s or 60.0) + STOP_MARGIN_S


def _children_of(state: FleetState) -> list[int | None]:
    return [state.router_pid, state.redis_pid, state.prometheus_pid, state.forkserver_pid] + \
        [r.pid for r in state.replicas]


def stop_fleet(state: FleetState, timeout: float | None = None) -> None:
    """SIGTERM the supervisor (it stops its children in order); SIGKILL whatever is left after `timeout` (default:
    the time the fleet's stop may take, its drain included, plus a margin: a fixed 60 s had cut streams that the
    default 120 s drain lets finish, with no error event)."""
    pid = state.supervisor_pid
    timeout = stop_wait_s(state) if timeout is None else timeout
    if supervisor_alive(state):  # never a process that took over a dead supervisor's pid
        os.kill(pid, signal.SIGTERM)
        # one stopped (SIGSTOP) handles it now, and its children drain (a stopped router had held `down` for its
        # whole drain time): `down` had waited its whole timeout
        for stopped in [pid] + [c for c in _children_of(state) if c and pid_alive(c) and is_ours(c, state)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
        deadline = time.monotonic() + timeout
        while supervisor_alive(state) and time.monotonic() < deadline:
            time.sleep(0.1)
        if supervisor_alive(state):
            os.kill(pid, signal.SIGKILL)  # its children die with it (PR_SET_PDEATHSIG)
            gone = time.monotonic() + 5.0  # reaped: else mark_stale below took it for alive and kept "ready" rows
            while supervisor_alive(state) and time.monotonic() < gone:
                time.sleep(0.05)
    for child in _children_of(state):
        if child and pid_alive(child) and is_ours(child, state):
            try:
                os.killpg(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
    final = read_state(state.name)
    if final is not None and final.supervisor_pid == state.supervisor_pid and final.status not in ("stopped",
                                                                                                   "failed"):
        # the supervisor died without writing its end: record it, so status stops showing ready replicas
        mark_stale(final)
        final.status = "stopped"
        for r in final.replicas:  # their leftovers were stopped just now ("stale" stayed in every later status)
            r.state, r.pid = "stopped", None
        final.router_status, final.router_pid, final.prometheus_pid = "stopped", None, None  # stopped with them
        final.error = final.error or "the supervisor had died; its leftovers were stopped by `fleetserve down`"
        try:
            write_state(final)
        except OSError as exc:  # a full disk: everything is stopped all the same (it had ended in a traceback)
            log.warning("fleet %s is stopped, but its state could not be written (%s): status reads it dead",
                        state.name, exc)

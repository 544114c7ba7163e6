"""Test helpers: real child processes on free loopback ports, waited for by polling (never by sleeping)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from fleetserve.fleet.process import free_port


def wait_until(predicate: Callable[[], bool], timeout: float = 60.0, interval: float = 0.1, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


_POLLS = httpx.Client(timeout=1.0)  # one for every poll: `httpx.get` builds a client and TLS context (~36 ms of CPU)


def http_ok(url: str) -> bool:
    try:
        return _POLLS.get(url).status_code == 200
    except httpx.HTTPError:
        return False


def fleetserve(*args: str, env: dict | None = None, timeout: float = 300, check: bool = False,
               cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetserve", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, check=check, cwd=cwd)


def fleet_status(home: dict[str, str], name: str | None = None) -> list[dict]:
    """What `fleetserve status --json [NAME]` prints, read in this process by the functions the command calls: for
    wait_until's polls only (a CLI start is ~0.6 s of CPU, and a poll every 0.1-0.5 s kept a core busy beside the
    fleet under test). What a test asserts is still read through the command."""
    import json

    from fleetserve.fleet.state import list_fleets, mark_stale, serving_note

    key, before = "FLEETSERVE_HOME", os.environ.get("FLEETSERVE_HOME")
    os.environ[key] = home[key]  # one variable, set and put back (never the whole environment: threads read it)
    try:
        fleets = [mark_stale(f) for f in list_fleets() if name is None or f.name == name]
        shown = fleets if name else [f for f in fleets if f.status != "stopped"]
        return json.loads(json.dumps([{**f.to_json(), "serving": serving_note(f)} for f in shown]))
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


PORT_ATTEMPTS = 3  # a server whose free port another process bound first starts again on a new one


class Server:
    """A fleetserve server (engine or router) as a real child process."""

    def __init__(self, args: list[str], log_path: Path, port: int | None = None, env: dict[str, str] | None = None):
        self.env = None if env is None else {**os.environ, **env}
        self._fixed_port = port is not None  # a port the test chose is kept: an error when it is taken
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [*args, "--port", str(self.port)]
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, ready_path: str = "/health", timeout: float = 120.0) -> Server:
        for _attempt in range(PORT_ATTEMPTS):
            start = self.log_path.stat().st_size if self.log_path.exists() else 0
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen([sys.executable, "-m", "fleetserve", *self.args], stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True, env=self.env)
            log.close()
            if not ready_path:
                return self
            try:
                # ready when *this* process listens on the port: a free port can be taken by another test's
                # server before ours binds it, and that server's /health answered for ours
                wait_until(lambda: self.proc.poll() is not None
                           or (self.listening() and http_ok(self.url + ready_path)), timeout,
                           what=f"{self.args[0]} on {self.url}")
                if self.proc.poll() is None:
                    return self
            except BaseException:
                self.kill()  # a server that never became ready must not outlive the test
                raise
            if self._fixed_port or "address already in use" not in self.log()[start:].lower():
                raise AssertionError(f"server exited: {self.log()}")
            self._move_to(free_port())  # another process took the port first: a new one
        raise AssertionError(f"no free port held after {PORT_ATTEMPTS} attempts: {self.log()}")

    def listening(self) -> bool:
        """Whether this server's process (or a worker it started) listens on its port."""
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
            return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.port
                       for p in procs for c in p.net_connections(kind="tcp"))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False

    def _move_to(self, port: int) -> None:
        i = self.args.index("--port")
        self.args[i + 1] = str(port)
        self.port, self.url = port, f"http://127.0.0.1:{port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


def processes_with_env(key: str, value: str) -> list[int]:
    """PIDs of live processes whose environment has key=value (how tests find leftovers of one fleet)."""
    needle = f"{key}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                stat = (entry / "stat").read_text()
                if stat.split(") ", 1)[1][0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def internal_token(folder: Path) -> tuple[str, dict[str, str]]:
    """A fresh router-engine token file and the header that carries it (what a fleet's router sends)."""
    from fleetserve.api.internal import InternalAuth, read_token_file, write_token_file

    path = write_token_file(folder / "internal.token")
    return str(path), InternalAuth(read_token_file(path)).headers()


def endpoint_of(name: str, spec: dict):
    """An Endpoint named `name` from a spec mapping, loaded and checked as `fleetserve validate` would."""
    from fleetserve.spec.load import load_spec_data

    return load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": name},
                           "spec": spec}).endpoint

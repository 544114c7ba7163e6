"""Child processes that cannot outlive their supervisor.

Each child gets its own process group (a terminal's Ctrl-C reaches only the supervisor, which then stops
children in order) and PR_SET_PDEATHSIG, so that even a SIGKILLed supervisor leaves no orphan behind (the
router gets SIGTERM and the engines SIGUSR1: both let the answers under way finish within the router's drain
time, then exit; the others SIGKILL).
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """The child's pre-exec step. libc is loaded here, in the parent: loaded in the forked child (a dlopen), it
    could hang there for good when another thread of the parent (a metrics server, the L2 probe's DNS lookup)
    held the loader's lock at the fork."""
    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        prctl = None  # not Linux: the supervisor's own shutdown path still stops children

    def arm() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, sig)

    return arm


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def bind_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on host:port here, or None when it can (checked by binding, as the router
    will, with SO_REUSEADDR); port 0 checks the host alone."""
    return bind_refusal(host, port)[1]


def bind_refusal(host: str, port: int) -> tuple[str, str | None]:
    """(the setting at fault, "host" or "port", and why) for `bind_problem`; every address the name has is tried,
    as the server binds them all (`localhost`: ::1 and 127.0.0.1)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return "host", f"host {host!r} does not resolve ({exc.strerror})"
    for family, kind, proto, _name, address in dict.fromkeys(infos):
        try:
            s = socket.socket(family, kind, proto)
        except OSError:
            continue  # a family this machine lacks (IPv6 off): the server skips it too
        with s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as asyncio binds each family apart
            try:
                s.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return "port", (f"port {port} on {host} is already in use (another fleet's router, or another "
                                    "server)")
                if exc.errno == errno.EACCES:
                    return "port", f"port {port} on {host} needs privileges this user lacks (ports below 1024)"
                if exc.errno == errno.EADDRNOTAVAIL:
                    return "host", f"{host} is not an address of this machine"
                return "host", f"cannot listen on {host}:{port}: {exc.strerror}"
    return "port", None


def fleetserve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleetserve", *args]


class Child:
    """One supervised process with its log file."""

    def __init__(self, name: str, cmd: list[str], log_path: Path, env: dict[str, str] | None = None,
                 env_drop: frozenset[str] = frozenset(), death_signal: int = signal.SIGKILL, forks=None):
        self.name = name
        self.cmd = cmd
        self.log_path = log_path
        self.env = env
        self.env_drop = env_drop  # secrets of ours this child must not inherit (API keys for engines)
        # what the child gets when its supervisor dies: SIGKILL, or SIGTERM for a server that should first
        # answer what it accepted (the router: streams end with an error event, queued requests get a 503)
        self.death_signal = death_signal
        self.forks = forks  # a fork server (fleet/forkserver.py) that starts `fleetserve ...` commands warm
        self.proc = None  # a subprocess.Popen, or the fork server's ForkedProcess
        self.log_start = 0  # where this run's lines begin: the log is appended to across restarts

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.log_start = log.tell()
        env = {**{k: v for k, v in os.environ.items() if k not in self.env_drop}, **(self.env or {})}
        command = fleetserve_command()
        if self.forks is not None and self.cmd[:len(command)] == command and self.forks.usable():
            self.proc = self.forks.spawn(self.cmd[len(command):], env, self.log_path, self.death_signal,
                                         fallback=lambda: self._popen(env))
        else:
            self.proc = self._popen(env)

    def _popen(self, env: dict[str, str]) -> subprocess.Popen:
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                process_group=0,
                preexec_fn=die_with_parent(self.death_signal),
                close_fds=True,
            )

    @property
    def pid(self) -> int | None:
        """None until started; for a forked start, also until the fork server has made the process."""
        return self.proc.pid if self.proc else None

    def exit_code(self) -> int | None:
        """None while running (or never started), else the exit status."""
        return self.proc.poll() if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if not self.alive():
            return
        if hasattr(self.proc, "signal_group"):  # forked: it may not have a pid yet
            self.proc.signal_group(sig)
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; always reaps."""
        if self.proc is None:
            return
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.alive():
            self.signal(signal.SIGKILL)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def log_tail(self, lines: int = 20, this_run: bool = False) -> str:
        """The log's last `lines`; `this_run`: of the lines the latest start wrote only."""
        try:
            with open(self.log_path, "rb") as f:
                if this_run:
                    f.seek(self.log_start)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

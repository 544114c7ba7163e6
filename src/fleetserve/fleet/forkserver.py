"""Warm engine starts: one process that has imported torch and transformers forks every engine replica.

An engine started as a new interpreter spends most of its start importing (torch, transformers and their
dependencies: about 8 s of the 14 s a tiny model's replica took here, more on a loaded machine), and a fleet
pays it again for every scale-up, every restart after a crash and every wake from zero, where a client waits.
The fork server pays it once per fleet: the supervisor starts it with the fleet, and a replica is then a
`fork()` of it that runs `fleetserve engine ...` as the command line would (same arguments, environment, log
file, process group and parent-death signal), so only the model's load and the server's start remain.

The server does nothing but import, fork and reap: it never loads a model or runs a tensor operation, so no
thread pool or lock of torch is live at a fork. It is the engines' parent: it reports each one's exit status
to the supervisor (a JSON line per event on its stdout), and it dies with the supervisor (SIGKILL on the
supervisor's death), whereupon its engines get their own death signal, as they had from a supervisor that
started them directly. Nothing depends on it for serving: a server that fails to start or dies is said once,
and replicas start as plain processes again (`ForkedProcess` falls back by itself when its fork never came).
`FLEETSERVE_FORK_SERVER=0` turns it off.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fleetserve.fleet.process import die_with_parent
from fleetserve.fleet.state import pid_alive

ENV_SWITCH = "FLEETSERVE_FORK_SERVER"
READY_TIMEOUT_S = 300.0  # imports that take longer: the server is given up and replicas start as processes
# what a replica's start imports: the CLI and the engine, torch, and what transformers imports lazily to load a
# model (its modeling and generation code with torch.distributed, dynamo and sympy under them: about 1,200
# modules, 4 s of a forked start before they were here) and the Llama code most small models use
PRELOAD = ("torch", "transformers", "fleetserve.cli.app", "fleetserve.engine.main", "fleetserve.engine.runner",
           "fleetserve.engine.server", "fleetserve.engine.prefix_cache", "fleetserve.kvcache.tiers",
           "transformers.modeling_utils", "transformers.generation.utils", "transformers.models.llama.modeling_llama")


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


# --- the server (python -m fleetserve.fleet.forkserver) --------------------------------------------------------


def _send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: F401  lazy ones

    try:  # before any change to the environment: it finds the command line's memory from it
        import setproctitle

        setproctitle.getproctitle()
    except ImportError:
        pass


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def serve() -> tuple[dict, Callable[[], None]] | None:
    """Import, then fork one engine per request line until stdin closes. Returns only in a forked child: its
    request, and the setter of its parent-death signal (made here, before the fork: `die_with_parent`)."""
    _preload()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wake-up fd hears it
    _send({"ready": os.getpid()})
    pending = b""
    while True:
        try:
            readable, _, _ = select.select([0, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap()
        if 0 not in readable:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:  # the supervisor closed the pipe (its fleet stops) or died
            return None
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            sys.stdout.flush()  # nothing buffered may be written twice, by the child too
            arm = die_with_parent(int(request["death_signal"]))
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                for fd in (wake_r, wake_w):
                    os.close(fd)
                return request, arm
            _send({"id": request["id"], "pid": pid})
        _reap()


def become(request: dict, arm: Callable[[], None]) -> None:
    """In the forked child: make this process what `subprocess.Popen(cmd, process_group=0, stdout=log,
    stderr=STDOUT, stdin=DEVNULL, env=env)` with the parent-death signal would have started."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    parent = os.getppid()
    arm()
    if os.getppid() != parent:  # the server died before the death signal was armed
        os.kill(os.getpid(), int(request["death_signal"]))
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    import random

    random.seed()  # a fork shares its parent's random state: every replica would draw the same numbers
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    sys.argv = ["fleetserve", *request["args"]]
    if "setproctitle" in sys.modules:  # `ps` and /proc/PID/cmdline name the engine, not its fork server
        sys.modules["setproctitle"].setproctitle(" ".join([sys.executable, "-m", "fleetserve", *request["args"]]))


def main() -> None:
    served = serve()
    if served is None:
        return
    become(*served)
    from fleetserve.cli.app import main as fleetserve_main

    fleetserve_main()  # exits as `python -m fleetserve ...` does: atexit handlers, flushed streams


# --- the supervisor's side --------------------------------------------------------------------------------------


class ForkServer:
    """The supervisor's handle on its fork server. Requests wait in a writer thread until the server has done
    its imports (a start never blocks the supervisor's loop, and one stopped before it was sent is dropped);
    the forks' pids and exits come back through a reader thread."""

    def __init__(self, log_path: Path, env: dict[str, str], say: Callable[[str], None]):
        self.log_path = log_path
        self.env = env
        self.say = say
        self.proc: subprocess.Popen | None = None
        self.ready = threading.Event()
        self.dead = threading.Event()
        self._lock = threading.Lock()
        self._waiting: dict[int, ForkedProcess] = {}
        self._exits: dict[int, int] = {}
        self._outbox: queue.Queue = queue.Queue()
        self._next_id = 0
        self._started_at = 0.0
        self._stopping = False
        self.command = [sys.executable, "-m", "fleetserve.fleet.forkserver"]

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, env=self.env, process_group=0,
                                         preexec_fn=die_with_parent(signal.SIGKILL), close_fds=True)
        self._started_at = time.monotonic()
        threading.Thread(target=self._read, name="forkserver-reader", daemon=True).start()
        threading.Thread(target=self._write, name="forkserver-writer", daemon=True).start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def usable(self) -> bool:
        """Worth asking: running, and ready or still importing within its time."""
        if self.proc is None or self.dead.is_set():
            return False
        if not self.ready.is_set() and time.monotonic() - self._started_at > READY_TIMEOUT_S:
            self.proc.kill()
            self._fail(f"it did not finish its imports within {READY_TIMEOUT_S:.0f}s")
            return False
        return True

    def spawn(self, args: list[str], env: dict[str, str], log_path: Path, death_signal: int,
              fallback: Callable[[], subprocess.Popen]) -> ForkedProcess:
        """A replica forked from the server (its pid comes when the fork is done); `fallback` starts it as a
        plain process if the server dies before forking it."""
        with self._lock:
            self._next_id += 1
            forked = ForkedProcess(self, self._next_id, fallback)
            self._waiting[forked.request_id] = forked
        self._outbox.put((forked, {"id": forked.request_id, "args": args, "env": env, "log": str(log_path),
                                   "death_signal": int(death_signal)}))
        return forked

    def exit_code(self, pid: int) -> int | None:
        with self._lock:
            return self._exits.get(pid)

    def stop(self, timeout: float = 5.0) -> None:
        """Close its pipe (it exits), kill it if it does not; its engines must have been stopped first."""
        if self.proc is None:
            return
        self._stopping = True
        self._outbox.put(None)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    # --- threads ---

    def _write(self) -> None:
        while True:
            item = self._outbox.get()
            if item is not None:
                while not self.ready.wait(0.1):
                    if self.dead.is_set():
                        return
                forked, message = item
                if not forked.sending():
                    continue  # stopped before it was sent
            try:
                if item is None:
                    self.proc.stdin.close()
                    return
                self.proc.stdin.write((json.dumps(message) + "\n").encode())
                self.proc.stdin.flush()
            except (OSError, ValueError):
                self._fail("its pipe closed")
                return

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "ready" in message:
                self.ready.set()
            elif "pid" in message:
                with self._lock:
                    forked = self._waiting.pop(message["id"], None)
                    self._exits.pop(message["pid"], None)  # a pid used again: its earlier exit is not this one's
                if forked is not None:
                    forked.forked(message["pid"])
            elif "exit" in message:
                with self._lock:
                    self._exits[message["exit"]] = message["code"]
        code = self.proc.wait()
        self._fail(f"it exited ({code})")

    def _fail(self, why: str) -> None:
        with self._lock:
            first = not self.dead.is_set()
            self.dead.set()
            orphans, self._waiting = list(self._waiting.values()), {}
        for forked in orphans:
            forked.unforked()
        if not first or self._stopping:  # said once; and not of the stop the fleet asked for
            return
        if self.ready.is_set():
            self.say(f"warning: the engine fork server stopped: {why}; replicas start as new processes from now "
                     f"on (see {self.log_path})")
        else:
            self.say(f"warning: the engine fork server did not start: {why}; replicas start as new processes "
                     f"(see {self.log_path})")


class ForkedProcess:
    """What `Child` needs of a `subprocess.Popen`, for a replica the fork server starts: `pid` (None until the
    fork is done), `poll()`, `wait()` and its process group's signals. A stop before the request was sent drops
    it; a signal sent while the fork is under way is delivered to the process it makes; a fork that never comes
    (the server died) starts the replica as a plain process instead, and everything is then that process's."""

    def __init__(self, server: ForkServer, request_id: int, fallback: Callable[[], subprocess.Popen]):
        self.server = server
        self.request_id = request_id
        self._fallback = fallback
        self._pid: int | None = None
        self._sent = False
        self._failed = False
        self._stopped: int | None = None  # the signal that ended it before it was sent
        self._plain: subprocess.Popen | None = None
        self._signals: list[int] = []
        self._lock = threading.Lock()

    # called by the server's threads
    def sending(self) -> bool:
        with self._lock:
            self._sent = self._stopped is None
            return self._sent

    def forked(self, pid: int) -> None:
        with self._lock:
            self._pid, signals, self._signals = pid, self._signals, []
        for sig in signals:
            _killpg(pid, sig)

    def unforked(self) -> None:
        with self._lock:
            self._failed = self._pid is None and self._stopped is None

    def _settled(self) -> subprocess.Popen | None:
        """The plain process that replaced a fork that never came, started on first need."""
        with self._lock:
            if self._failed and self._plain is None:
                self._plain = self._fallback()
                for sig in self._signals:
                    _killpg(self._plain.pid, sig)
                self._signals = []
            return self._plain

    @property
    def pid(self) -> int | None:
        plain = self._settled()
        return plain.pid if plain is not None else self._pid

    def poll(self) -> int | None:
        plain = self._settled()
        if plain is not None:
            return plain.poll()
        with self._lock:
            pid, stopped = self._pid, self._stopped
        if pid is None:
            return -stopped if stopped is not None else None  # not forked yet: starting, or dropped
        code = self.server.exit_code(pid)
        if code is None and self.server.dead.is_set() and not pid_alive(pid):
            return -signal.SIGKILL  # the server died and its engine with it (its status went to init)
        return code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("fleetserve engine (forked)", timeout)
            time.sleep(0.02)
        return code

    def signal_group(self, sig: int) -> None:
        plain = self._settled()
        if plain is not None:
            _killpg(plain.pid, sig)
            return
        with self._lock:
            pid = self._pid
            if pid is None:
                if not self._sent and sig in STOPPING:
                    self._stopped = sig  # never sent: nothing to stop
                else:
                    self._signals.append(sig)
                return
        _killpg(pid, sig)


STOPPING = (signal.SIGTERM, signal.SIGKILL, signal.SIGINT)


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    main()

"""Warm engine starts: one process that has imported torch and transformers forks every engine replica.

An engine started as a new interpreter spends most of its start importing (torch, transformers and their
dependencies: about 8 s of the 14 s a tiny model's replica took here, more on a loaded machine), and a fleet
pays it again for every scale-up, every restart after a crash and every wake from zero, where a client waits.
The fork server pays it once per fleet: the supervisor starts it with the fleet, and a replica is then a
`fork()` of it that runs `fleetserve engine ...` as the command line would (same arguments, environment, log
file, process group and parent-death signal), so only the model's load and the server's start remain.

The engines are the supervisor's children, not the server's: the supervisor is a child subreaper
(PR_SET_CHILD_SUBREAPER), and the server forks each engine through a middle process that exits at once, so the
engine is re-parented to the supervisor before its pid is reported. The supervisor then waits for it as for any
child (real exit statuses, no pid kept past its reaping), its parent-death signal is armed against the supervisor
(armed against the server, a crash of the server had stopped every replica at once), and the server can die,
or be restarted, without touching a replica. The server does nothing but import and fork: it never loads a
model or runs a tensor operation, so nothing of torch is live at a fork. It dies with the supervisor (SIGKILL).
A server that fails to start, hangs or dies is said once, and replicas start as new interpreters meanwhile
(`ForkedProcess` falls back by itself when its fork never came). `FLEETSERVE_FORK_SERVER=0` turns it off.
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fleetserve.fleet.process import die_with_parent

ENV_SWITCH = "FLEETSERVE_FORK_SERVER"
READY_TIMEOUT_S = 300.0  # imports that take longer: the server is given up and replicas start as processes
READY_WAIT_S = 60.0  # a start asked of a server not ready this long after its own start goes to a new interpreter
FORK_TIMEOUT_S = 30.0  # a fork asked for and not reported within this: the server is taken for hung
PR_SET_CHILD_SUBREAPER = 36
# the title a forked engine gets is written over the server's own command line (setproctitle, with SPT_NOENV so
# that /proc/PID/environ stays readable): the server starts with this much room for it
TITLE_ROOM = 4096
# what a replica's start imports: the CLI and the engine, torch, and what transformers imports lazily to load a
# model (its modeling and generation code with torch.distributed, dynamo and sympy under them: about 1,200
# modules, 4 s of a forked start before they were here) and the Llama code most small models use (the model
# folder's own architecture: `_preload_architecture`, at its first fork)
PRELOAD = ("torch", "transformers", "fleetserve.cli.app", "fleetserve.engine.main", "fleetserve.engine.runner",
           "fleetserve.engine.server", "fleetserve.engine.prefix_cache", "fleetserve.kvcache.tiers",
           "transformers.modeling_utils", "transformers.generation.utils", "transformers.models.llama.modeling_llama")


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def become_subreaper() -> bool:
    """Make this process (the supervisor) the parent of orphaned descendants: the forked engines. False where
    the kernel cannot (not Linux): then there is no fork server."""
    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return False
    return prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


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


_architectures: set[str] = set()  # model folders whose modeling code this server has imported


def _preload_architecture(args: list[str]) -> None:
    """Import the modeling code of the model a fork will load (its config's `model_type`), once per model folder,
    before the first fork: PRELOAD has Llama's only, and a Qwen or GPT-2 replica imported its own in every start.
    A folder that says nothing usable only leaves the engine to import what it needs itself."""
    try:
        folder = args[args.index("--model") + 1]
    except (ValueError, IndexError):
        return
    if folder in _architectures:
        return
    _architectures.add(folder)
    try:
        import importlib

        from transformers.models.auto.configuration_auto import model_type_to_module_name

        model_type = json.loads((Path(folder) / "config.json").read_text())["model_type"]
        name = model_type_to_module_name(str(model_type))
        importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    except Exception as exc:  # noqa: BLE001  a slower start, never a failed one (the log says why)
        print(f"fork server: {folder}'s modeling code not preloaded ({type(exc).__name__}: {exc})", file=sys.stderr)


def _fork_engine(request: dict) -> tuple[int | None, bool]:
    """Fork the engine through a middle process that exits at once, so that the engine is re-parented to the
    supervisor (the subreaper). Returns (the engine's pid, or None if a fork failed; True in the engine)."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(read_end)
            engine = os.fork()
            if engine == 0:
                os.close(write_end)
                return None, True
            try:  # its process group exists before its pid is reported: a signal to the group reaches it
                os.setpgid(engine, engine)
            except OSError:
                pass
            os.write(write_end, str(engine).encode())
        except BaseException:  # noqa: S110  the server hears of it as a fork that made no engine
            pass
        os._exit(0)  # the middle process only: the engine returned above
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 64):
        data += chunk
    os.close(read_end)
    os.waitpid(middle, 0)  # gone: the engine's parent is the supervisor now
    return (int(data) if data else None), False


def serve() -> tuple[dict, Callable[[], None]] | None:
    """Import, then fork one engine per request line until stdin closes. Returns only in a forked engine: its
    request, and the setter of its parent-death signal (made here, before the fork: `die_with_parent`)."""
    _preload()
    _send({"ready": os.getpid()})
    for line in sys.stdin.buffer:
        request = json.loads(line)
        _preload_architecture(request["args"])
        sys.stdout.flush()  # nothing buffered may be written twice, by the child too
        arm = die_with_parent(int(request["death_signal"]))
        try:
            pid, engine = _fork_engine(request)
        except OSError as exc:  # no memory or pids for a fork: that replica starts as a process
            _send({"id": request["id"], "error": f"{type(exc).__name__}: {exc}"})
            continue
        if engine:
            return request, arm
        _send({"id": request["id"], "pid": pid} if pid else {"id": request["id"], "error": "the fork failed"})
    return None


def become(request: dict, arm: Callable[[], None]) -> None:
    """In the forked engine: make this process what `subprocess.Popen(cmd, process_group=0, stdout=log,
    stderr=STDOUT, stdin=DEVNULL, env=env)` with the parent-death signal would have started, as the supervisor's
    child."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    supervisor, death = int(request["supervisor"]), int(request["death_signal"])
    waited = time.monotonic()
    while os.getppid() != supervisor:  # until the middle process has exited
        if os.getppid() == 1 or time.monotonic() - waited > 10:  # no subreaper took it: the supervisor is gone
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.001)
    arm()  # against the supervisor now
    if os.getppid() != supervisor:  # it died before the signal was armed
        os.kill(os.getpid(), death)
    # report itself on the server's stdout, still its fd 1: a server that dies between the fork and its own report
    # leaves the supervisor knowing this engine (the server's pipe cannot close before this process lets fd 1 go)
    os.write(1, (json.dumps({"id": request["id"], "pid": os.getpid()}) + "\n").encode())
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    sys.stdin = open(os.devnull)  # the server's reader may hold requests it had read ahead
    os.environ.clear()
    os.environ.update(request["env"])
    import random

    random.seed()  # a fork shares its parent's random state: every replica would draw the same numbers
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    sys.argv = ["fleetserve", *request["args"]]
    import importlib.util  # click names the program from __main__'s module: ours, not the fork server's (its usage
    # errors read "python -m fleetserve.fleet.fleetserve engine")

    sys.modules["__main__"].__spec__ = importlib.util.find_spec("fleetserve.__main__")
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
    the forks' pids come back through a reader thread, which alone declares the server dead (at its end)."""

    def __init__(self, log_path: Path, env: dict[str, str], say: Callable[[str], None]):
        self.log_path = log_path
        self.env = env
        self.say = say
        self.proc: subprocess.Popen | None = None
        self.ready = threading.Event()
        self.dead = threading.Event()
        self._lock = threading.Lock()
        self._waiting: dict[int, ForkedProcess] = {}
        self._settled: dict[int, int | None] = {}  # request id -> the pid it got (None: it fell back)
        self._outbox: queue.Queue = queue.Queue()
        self._next_id = 0
        self._started_at = 0.0
        self._stopping = False
        self._why: str | None = None  # what killed it, when we did
        # its fleet's folder on its command line, read by nothing but `ps` (ps | grep NAME had not found it)
        self.command = [sys.executable, "-m", "fleetserve.fleet.forkserver", str(log_path.parent.parent),
                        " " * TITLE_ROOM]

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         env={**self.env, "SPT_NOENV": "1"}, process_group=0,
                                         preexec_fn=die_with_parent(signal.SIGKILL), close_fds=True)
        self._started_at = time.monotonic()
        threading.Thread(target=self._read, name="forkserver-reader", daemon=True).start()
        threading.Thread(target=self._write, name="forkserver-writer", daemon=True).start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def usable(self) -> bool:
        """Worth asking: alive, and ready or still within READY_WAIT_S of its start (a start asked of a server
        that hangs in its imports waited for it to be given up, READY_TIMEOUT_S)."""
        if self.proc is None or self.dead.is_set():
            return False
        return self.ready.is_set() or time.monotonic() - self._started_at < READY_WAIT_S

    def in_flight(self) -> bool:
        """A fork asked for whose pid has not come back: its engine may already be this process's child."""
        with self._lock:
            return bool(self._waiting)

    def kill(self, why: str) -> None:
        """Give a hung server up: killed, its reader declares it dead and what waits falls back."""
        if self.proc is not None and self.proc.poll() is None:
            self._why = why
            self.proc.kill()

    def spawn(self, args: list[str], env: dict[str, str], log_path: Path, death_signal: int,
              fallback: Callable[[], subprocess.Popen]) -> ForkedProcess:
        """A replica forked from the server (its pid comes when the fork is done); `fallback` starts it as a
        plain process if the server dies before forking it."""
        with self._lock:
            self._next_id += 1
            forked = ForkedProcess(self, self._next_id, fallback)
            if self.dead.is_set():  # died since `usable`: never sent, never answered
                forked.unforked()
                return forked
            self._waiting[forked.request_id] = forked
        self._outbox.put((forked, {"id": forked.request_id, "args": args, "env": env, "log": str(log_path),
                                   "death_signal": int(death_signal), "supervisor": os.getpid()}))
        return forked

    def stop(self, timeout: float = 5.0) -> None:
        """Close its pipe (it exits), kill it if it does not."""
        if self.proc is None:
            return
        self._stopping = True
        if not self.ready.is_set():  # still importing: its writer waits for it, and nothing is forked
            self.proc.kill()
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
                deadline = self._started_at + READY_TIMEOUT_S
                while not self.ready.wait(0.1):
                    if self.dead.is_set() or self._stopping:
                        return
                    if time.monotonic() > deadline:  # hung in its imports (a stalled disk, a deadlock)
                        self.kill(f"it did not finish its imports within {READY_TIMEOUT_S:.0f}s")
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
            except (OSError, ValueError):  # it died: the reader sees its end
                return

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "ready" in message:
                self.ready.set()
            elif "id" in message:
                pid = message.get("pid")
                with self._lock:
                    forked = self._waiting.pop(message["id"], None)
                    if forked is None:  # a second report (the engine's own and the server's), or a late one
                        late = pid is not None and self._settled.get(message["id"]) != pid
                    else:
                        self._settled[message["id"]] = pid
                if forked is None:
                    if late:  # its request had fallen back to a plain start: an engine nobody tracks
                        _killpg(pid, signal.SIGKILL)
                    continue
                if pid:
                    forked.forked(pid)
                else:
                    forked.unforked()
        code = self.proc.wait()
        self._fail(self._why or f"it exited ({code})")

    def _fail(self, why: str) -> None:
        with self._lock:
            self.dead.set()
            orphans, self._waiting = list(self._waiting.values()), {}
            self._settled.update((forked.request_id, None) for forked in orphans)
        for forked in orphans:
            forked.unforked()
        if self._stopping:  # the stop the fleet asked for is not news
            return
        if self.ready.is_set():
            self.say(f"warning: the engine fork server stopped: {why}; replicas start as new processes until it is "
                     f"started again (its log: {self.log_path})")
        else:
            self.say(f"warning: the engine fork server did not start: {why}; replicas start as new processes "
                     f"(its log: {self.log_path})")


class ForkedProcess:
    """What `Child` needs of a `subprocess.Popen`, for a replica the fork server starts: `pid` (None until the
    fork is done), `poll()`, `wait()` and its process group's signals. The forked engine is this process's child
    (re-parented to it, the subreaper), so `poll` waits for it as Popen does. A stop before the request was sent
    drops it; a signal sent while the fork is under way is delivered to the process it makes; a fork that never
    comes (the server died, or failed to fork) starts the replica as a plain process instead."""

    def __init__(self, server: ForkServer, request_id: int, fallback: Callable[[], subprocess.Popen]):
        self.server = server
        self.request_id = request_id
        self._fallback = fallback
        self._pid: int | None = None
        self._code: int | None = None
        self._sent_at: float | None = None
        self._failed = False
        self._stopped: int | None = None  # the signal that ended it before it was sent
        self._plain: subprocess.Popen | None = None
        self._start_error: str | None = None
        self._signals: list[int] = []
        self._lock = threading.Lock()

    # called by the server's threads
    def sending(self) -> bool:
        with self._lock:
            if self._stopped is None:
                self._sent_at = time.monotonic()
            return self._stopped is None

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
            if self._failed and self._plain is None and self._start_error is None:
                try:
                    self._plain = self._fallback()
                except OSError as exc:  # no memory, no pids: a start that failed, not the supervisor's loop
                    self._start_error = f"{type(exc).__name__}: {exc}"
                    return None
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
            if self._start_error is not None:
                return 1
            if self._code is not None:
                return self._code
            if self._pid is None:
                if self._stopped is not None:
                    return -self._stopped  # dropped before it was sent
                if self._sent_at is not None and time.monotonic() - self._sent_at > FORK_TIMEOUT_S:
                    self.server.kill(f"it forked nothing for {FORK_TIMEOUT_S:.0f}s")  # hung: this one falls back
                return None
            try:
                pid, status = os.waitpid(self._pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: its status is lost
                self._code = -signal.SIGKILL
                return self._code
            if pid == 0:
                return None
            self._code = os.waitstatus_to_exitcode(status)
            return self._code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("fleetserve engine (forked)", timeout)
            time.sleep(0.02)
        return code

    def signal_group(self, sig: int) -> None:
        with self._lock:
            if self._failed and self._plain is None and sig in STOPPING:  # not started for the stop alone
                self._failed, self._stopped = False, sig
                return
        plain = self._settled()
        if plain is not None:
            _killpg(plain.pid, sig)
            return
        with self._lock:
            pid = self._pid
            if pid is None:
                if self._sent_at is None and sig in STOPPING:
                    self._stopped = sig  # never sent: nothing to stop
                else:
                    self._signals.append(sig)
                return
            if self._code is not None:
                return  # reaped: its pid may be another process's now
        _killpg(pid, sig)


STOPPING = (signal.SIGTERM, signal.SIGKILL, signal.SIGINT)


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    main()

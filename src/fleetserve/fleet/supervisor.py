"""`fleetserve up`: start a spec's engine replicas and router as child processes and keep them running.

Start order: resolve the model once (a child process, so the supervisor stays small), start every replica,
wait until each answers /health, start the router, wait until it answers. A crashed replica is restarted on
the same port with exponential backoff while the router's health checks keep traffic away from it. Any stop
(signal, failed start, error) stops the router first, then the replicas; nothing outlives the supervisor.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from fleetserve.fleet.process import Child, fleetserve_command, free_port
from fleetserve.fleet.state import FleetState, ReplicaState, fleet_dir, write_state
from fleetserve.router.policies import registered_policies
from fleetserve.spec.load import LoadedSpec

log = logging.getLogger(__name__)

RESTART_BACKOFF_MAX = 30.0


class StartupError(Exception):
    """The fleet could not start; the message says which part failed and shows its log."""


class Interrupted(Exception):
    """A stop was requested while starting."""


@dataclass
class Replica:
    state: ReplicaState
    child: Child
    restart_at: float | None = None
    crash_times: list[float] = field(default_factory=list)


class Supervisor:
    def __init__(self, loaded: LoadedSpec, spec_path: str, *, say: Callable[[str], None] = print,
                 poll_interval: float = 0.2):
        self.endpoint = loaded.endpoint
        self.spec = loaded.endpoint.spec
        self.name = loaded.endpoint.metadata.name
        self.dir = fleet_dir(self.name)
        self.say = say
        self.poll_interval = poll_interval
        self._stop = False
        self.replicas: list[Replica] = []
        self.router: Child | None = None
        self.router_url = ""
        self.state = FleetState(
            name=self.name,
            namespace=self.endpoint.metadata.namespace,
            model=self.endpoint.served_model_name,
            spec_path=os.path.abspath(spec_path),
            supervisor_pid=os.getpid(),
            warnings=[str(w) for w in loaded.warnings],
        )
        self._http = httpx.Client(timeout=1.0, trust_env=False)

    # --- public --------------------------------------------------------------------------------------------

    def request_stop(self, *_args) -> None:
        self._stop = True

    def run(self, on_ready: Callable[[FleetState], None] | None = None) -> int:
        """Start, supervise until a stop is requested, stop. Returns the process exit code."""
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        code = 0
        try:
            self._start()
            self.state.status = "ready"
            self._save()
            if on_ready:
                on_ready(self.state)
            self._supervise()
        except Interrupted:
            self.say("stop requested during start-up")
        except StartupError as exc:
            self.state.status, self.state.error = "failed", str(exc)
            self._save()
            self.say(f"error: {exc}")
            code = 1
        except Exception as exc:  # never leave children behind, whatever went wrong
            log.exception("supervisor failed")
            self.state.status, self.state.error = "failed", f"{type(exc).__name__}: {exc}"
            self._save()
            code = 1
        finally:
            self._shutdown()
        return code

    # --- start ---------------------------------------------------------------------------------------------

    def _save(self) -> None:
        write_state(self.state)

    def _check_stop(self) -> None:
        if self._stop:
            raise Interrupted()

    def _prepare_model(self) -> str:
        """Resolve the model source once, in a child process, and return the local directory."""
        model = self.spec.model
        cmd = fleetserve_command("model", "prepare", model.source)
        if model.revision:
            cmd += ["--revision", model.revision]
        self.say(f"preparing model {model.source} ...")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=False)
        deadline = time.monotonic() + self.spec.engine.startup_timeout_seconds
        while proc.poll() is None:
            if self._stop or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                self._check_stop()
                raise StartupError(f"model preparation of {model.source} timed out")
            time.sleep(0.1)
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise StartupError(f"cannot prepare model {model.source}: {(err or out).strip().splitlines()[-1:]}")
        return out.strip().splitlines()[-1]

    def _engine_command(self, model_dir: str, replica_id: str, port: int) -> list[str]:
        spec, meta = self.spec, self.endpoint.metadata
        threads = spec.engine.threads or max(1, (os.cpu_count() or 1) // max(1, spec.replicas))
        cmd = fleetserve_command(
            "engine", "--model", model_dir, "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", self.endpoint.served_model_name, "--model-version", spec.model.version,
            "--namespace", meta.namespace, "--instance-type", "local", "--replica", replica_id,
            "--threads", str(threads), "--dtype", spec.model.dtype,
        )
        if spec.model.context_length:
            cmd += ["--context-length", str(spec.model.context_length)]
        return cmd + list(spec.engine.args)

    def _wait_healthy(self, url: str, child: Child, what: str, timeout: float, path: str = "/health") -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_stop()
            code = child.exit_code()
            if code is not None:
                raise StartupError(f"{what} exited with code {code} during start-up; last log lines "
                                   f"({child.log_path}):\n{child.log_tail()}")
            try:
                if self._http.get(url + path).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise StartupError(f"{what} was not ready after {timeout:.0f}s; see {child.log_path}")
            time.sleep(self.poll_interval)

    def _start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._save()
        kind = self.spec.engine.kind
        if kind in ("vllm", "sglang"):
            raise StartupError(
                f"engine.kind {kind!r} runs the {kind} server, which needs a GPU; this machine has none. "
                "Use engine.kind builtin here, or deploy with `fleetserve render k8s`."
            )
        backends: list[str] = []
        if kind == "external":
            backends = list(self.spec.engine.urls)
        elif self.spec.replicas > 0:
            model_dir = self._prepare_model()
            for i in range(self.spec.replicas):
                port = free_port()
                rid = f"r{i}"
                url = f"http://127.0.0.1:{port}"
                child = Child(rid, self._engine_command(model_dir, rid, port), self.dir / "logs" / f"{rid}.log")
                child.start()
                replica = Replica(ReplicaState(rid, url, child.pid), child)
                self.replicas.append(replica)
                self.state.replicas.append(replica.state)
            self._save()
            self.say(f"starting {len(self.replicas)} engine replica(s) ...")
            for r in self.replicas:
                self._wait_healthy(r.state.url, r.child, f"replica {r.state.id}",
                                   self.spec.engine.startup_timeout_seconds, self.spec.engine.health_path)
                r.state.state = "ready"
                self._save()
            backends = [r.state.url for r in self.replicas]
        self._start_router(backends)

    def _start_router(self, backends: list[str]) -> None:
        strategy = self.spec.routing.strategy
        if strategy not in registered_policies():
            strategy = "leastload"
        host = self.spec.router.host
        port = self.spec.router.port or free_port(host)
        cmd = fleetserve_command("router", "--host", host, "--port", str(port), "--strategy", strategy,
                                 "--health-path", self.spec.engine.health_path)
        for url in backends:
            cmd += ["--backend", url]
        self.router = Child("router", cmd, self.dir / "logs" / "router.log")
        self.router.start()
        self.router_url = f"http://{host}:{port}"
        self.state.router_pid, self.state.strategy = self.router.pid, strategy
        self.state.url = f"{self.router_url}/v1"
        self._save()
        # With no backend the router answers 503 on /health; wait only for it to listen then.
        path = "/health" if backends else "/metrics"
        self._wait_healthy(self.router_url, self.router, "router", 60.0, path)

    # --- supervise -----------------------------------------------------------------------------------------

    def _supervise(self) -> None:
        while not self._stop:
            now = time.monotonic()
            changed = False
            for r in self.replicas:
                changed |= self._tend(r, now)
            if self.router and self.router.exit_code() is not None and not self._stop:
                self.say(f"router exited with code {self.router.exit_code()}; restarting")
                self.router.start()
                self.state.router_pid = self.router.pid
                changed = True
            if changed:
                self._save()
            time.sleep(self.poll_interval)

    def _tend(self, r: Replica, now: float) -> bool:
        """Advance one replica's life cycle; True if its state changed."""
        s = r.state
        code = r.child.exit_code()
        if code is not None and r.restart_at is None:
            r.crash_times = [t for t in r.crash_times if now - t < 300] + [now]
            delay = min(RESTART_BACKOFF_MAX, 2.0 ** (len(r.crash_times) - 1))
            r.restart_at = now + delay
            s.state, s.last_exit, s.pid = "restarting", code, None
            self.say(f"replica {s.id} exited with code {code}; restarting in {delay:.0f}s")
            return True
        if r.restart_at is not None and now >= r.restart_at:
            r.restart_at = None
            r.child.start()
            s.pid, s.state, s.restarts = r.child.pid, "starting", s.restarts + 1
            return True
        if s.state == "starting" and code is None:
            try:
                if self._http.get(s.url + self.spec.engine.health_path).status_code == 200:
                    s.state = "ready"
                    self.say(f"replica {s.id} is ready again")
                    return True
            except httpx.HTTPError:
                pass
        return False

    # --- stop ----------------------------------------------------------------------------------------------

    def _shutdown(self) -> None:
        if self.state.status != "failed":
            self.state.status = "stopping"
            self._save()
        children = ([self.router] if self.router else []) + [r.child for r in self.replicas]
        for child in children:
            child.signal(signal.SIGTERM)
        for child in children:
            child.stop(timeout=10.0)
        for r in self.replicas:
            r.state.state, r.state.pid = "stopped", None
        self.state.router_pid = None
        if self.state.status != "failed":
            self.state.status = "stopped"
        self._save()
        self._http.close()

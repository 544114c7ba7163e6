"""`fleetserve router --workers N`: N gateway processes on one port, so the gateway uses every core.

Each worker binds the port with SO_REUSEPORT and the kernel spreads connections over them. A parent process
starts them (forked before any event loop exists), restarts one that dies, and on SIGTERM stops them all
gracefully; a worker exits with its parent (PR_SET_PDEATHSIG), so none is orphaned.

What a worker must know about the others' traffic travels on a peer bus (unix datagram sockets, one per
worker, fire-and-forget; a lost message costs a prediction, never a request):
- routing decisions of a policy with a router-side index (`routed_elsewhere`): every worker's index sees
  the whole fleet's traffic, so cache-aware routing loses no hit rate to being split (workers following KV
  events each subscribe to the engines themselves);
- the backend set the supervisor PUTs to /admin/backends (which reaches one worker; the latest is also kept in
  a file of the bus's folder, which a restarted worker reads);
- each worker's load, a few times a second, so /admin/load (the autoscaler's input) answers for all.

Each worker also writes its counters to a state file of the bus's folder at that pace: a restarted worker
continues its predecessor's counts (they had gone back, 20 to 6, when one restarted), and the file's age is
the worker's heartbeat: one that stops writing (SIGSTOP, a blocked event loop) is killed and restarted by the
parent (it had kept taking its share of new connections, and each of them hung).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path

import orjson

log = logging.getLogger(__name__)

LOAD_EVERY_S = 0.25  # how often a worker tells the others its load (and writes its state file: its heartbeat)
HUNG_S = 15.0  # a worker whose state file is older than this is stopped or hung: the parent kills and restarts it
LOAD_STALE_S = 2.0  # a peer's load older than this no longer counts (the worker died or restarts)
RESTART_DELAY_S = 1.0
QUICK_EXIT_S = 10.0  # a worker that exits this soon after its start, QUICK_EXITS times in a row, cannot start
QUICK_EXITS = 3
BACKENDS_FILE = "backends.json"  # the latest backend set PUT to any worker, for workers that start after it
FOLDER_PREFIX = "fleetserve-router-peers-"
STALE_FOLDER_S = 60.0  # a bus folder younger than this may belong to a router whose workers are still binding


class PeerBus:
    """One worker's end of the bus: send its decisions and load, apply the others'."""

    def __init__(self, index: int, count: int, folder: str):
        self.index = index
        self.folder = folder
        self.paths = [str(Path(folder) / f"w{i}.sock") for i in range(count)]
        self.gateway = None
        self.peer_load: dict[int, tuple[float, dict]] = {}
        # when the backend set this worker has was given: CLOCK_MONOTONIC, one clock for every process on the machine
        # (the wall clock stepped back by NTP had the other workers drop a newer set)
        self._backends_stamp = 0
        self._state_failed = False  # the last state file write failed (said once)
        self._sock: socket.socket | None = None
        self._task: asyncio.Task | None = None

    def attach(self, gateway) -> None:
        self.gateway = gateway
        gateway.peers = self
        path = self.paths[self.index]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self._sock.bind(path)
        self._sock.setblocking(False)
        # bound first: a set PUT to another worker from now on reaches this one, and what was kept before is read
        # after (the newest of the two applies, by its stamp)
        self._restore_backends()
        self._restore_counts()
        self._write_state()
        loop = asyncio.get_running_loop()
        loop.add_reader(self._sock.fileno(), self._receive)
        self._task = loop.create_task(self._tell_load())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._sock is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.paths[self.index])

    # --- sending -------------------------------------------------------------------------------------------

    def _send(self, message: dict) -> None:
        data = orjson.dumps(message)
        for i, path in enumerate(self.paths):
            if i != self.index:
                try:
                    self._sock.sendto(data, path)
                except OSError:
                    pass  # that worker is restarting, or its buffer is full: a lost hint, not a lost request

    def routed(self, replica_id: str, blocks: tuple[int, ...], exact: bool) -> None:
        self._send({"t": "route", "r": replica_id, "k": blocks, "x": exact})

    def backends(self, urls: list[str], ready: set[str], draining: set[str], failing: str | None = None,
                 names: dict[str, str] | None = None, instances: dict[str, str] | None = None) -> None:
        message = {"t": "backends", "urls": urls, "ready": sorted(ready), "draining": sorted(draining),
                   "failing": failing, "names": names or {}, "instances": instances, "stamp": time.monotonic_ns()}
        self._backends_stamp = message["stamp"]
        self._send(message)
        # kept for a worker that starts later (a restart): it had come back with the command line's backends, or
        # none at all under `up`, and held its share of the requests for the buffer timeout while status read ready
        latest = Path(self.folder) / BACKENDS_FILE
        spare = latest.with_suffix(f".{self.index}.tmp")
        try:
            spare.write_bytes(orjson.dumps(message))
            os.replace(spare, latest)
        except OSError as exc:
            log.warning("the backend set was not kept for restarted workers: %s", exc)

    def _restore_backends(self) -> None:
        """The latest backend set any worker was given, when one was given since the router started."""
        try:
            message = orjson.loads((Path(self.folder) / BACKENDS_FILE).read_bytes())
        except FileNotFoundError:
            return
        except (OSError, orjson.JSONDecodeError) as exc:
            log.warning("the kept backend set was not read: %s", exc)
            return
        self._apply(message)

    def _state_path(self) -> Path:
        return Path(self.folder) / f"w{self.index}.state"

    def _restore_counts(self) -> None:
        """A restarted worker's counters go on from its predecessor's (the last state it wrote)."""
        try:
            state = orjson.loads(self._state_path().read_bytes())
        except FileNotFoundError:
            return
        except (OSError, orjson.JSONDecodeError) as exc:
            log.warning("the counts of this worker's predecessor were not read: %s", exc)
            return
        self.gateway.requests_total += int(state.get("total", 0))
        self.gateway.routed_total += int(state.get("routed", 0))

    def _write_state(self) -> None:
        """The counters, written before the load message that carries them (so a successor never starts below
        what the others saw); the write is also the heartbeat the parent watches."""
        gw, path = self.gateway, self._state_path()
        spare = path.with_suffix(".tmp")
        try:
            spare.write_bytes(orjson.dumps({"total": gw.requests_total, "routed": gw.routed_total}))
            os.replace(spare, path)
        except OSError as exc:  # a full disk: the heartbeat at least, or the parent takes this worker for hung
            if not self._state_failed:  # said once until it works again, not four times a second
                log.warning("router worker state not written (its counts restart with it): %s", exc)
            self._state_failed = True
            with contextlib.suppress(OSError):
                os.utime(path)
        else:
            self._state_failed = False

    async def _tell_load(self) -> None:
        while True:
            await asyncio.sleep(LOAD_EVERY_S)
            gw = self.gateway
            self._write_state()
            self._send({"t": "load", "w": self.index, "pending": gw.gate.pending, "queued": gw.gate.queued,
                        "total": gw.requests_total, "routed": gw.routed_total,
                        "p95": gw.ttft_p95_ms(),
                        "in_flight": {b.url: b.in_flight for b in gw.pool.backends.values()}})

    # --- receiving -----------------------------------------------------------------------------------------

    def _receive(self) -> None:
        while True:
            try:
                data = self._sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            try:
                self._apply(orjson.loads(data))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                log.warning("peer message ignored: %s", exc)

    def _apply(self, message: dict) -> None:
        gw = self.gateway
        kind = message["t"]
        if kind == "route":
            share = getattr(gw.policy, "routed_elsewhere", None)
            backend = gw.pool.backends.get(message["r"])
            if backend is None:
                return
            keys = tuple(message["k"])
            if share is not None:
                share(backend.view(), keys, bool(message["x"]), len(gw.pool.backends))
            if gw.kv_index is not None and message["x"]:
                # the engine's KV events will confirm these blocks; until then they are speculative here too, as
                # in the worker that sent them (the event lag would otherwise send a session's next turn away)
                gw.kv_index.speculate(backend.id, keys, gw.clock())
        elif kind == "backends":
            stamp = int(message.get("stamp") or 0)
            if stamp and stamp <= self._backends_stamp:
                return  # older than the set this worker has (the kept file, read after a newer datagram)
            self._backends_stamp = stamp or self._backends_stamp
            gw.set_backends(message["urls"], ready=set(message["ready"]), draining=set(message["draining"]),
                            from_peer=True, failing=message.get("failing"), names=message.get("names") or None,
                            instances=message.get("instances"))
        elif kind == "load":
            self.peer_load[int(message["w"])] = (time.monotonic(), message)

    def merged_load(self, own: dict) -> dict:
        """/admin/load for the whole router: this worker's report plus the others' latest."""
        now = time.monotonic()
        by_worker = {w: m for w, (t, m) in self.peer_load.items() if now - t < LOAD_STALE_S}
        fresh = list(by_worker.values())
        merged = dict(own)
        merged["pending"] = own["pending"] + sum(m["pending"] for m in fresh)
        others_queued = sum(m.get("queued", 0) for m in fresh)  # each worker queues its own requests for a slot
        merged["queued"] = own["queued"] + others_queued
        merged["waiting"] = own["waiting"] + others_queued
        # counters from every worker ever heard, a silent one's too: a worker restarting goes on from its last
        # count (its state file), and dropping it for the restart's seconds made the totals go back meanwhile
        everyone = [m for _, m in self.peer_load.values()]
        merged["requests_total"] = own["requests_total"] + sum(m["total"] for m in everyone)
        merged["routed_total"] = own["routed_total"] + sum(m.get("routed", 0) for m in everyone)
        merged["ttft_p95_ms"] = max([own["ttft_p95_ms"]] + [m["p95"] for m in fresh])
        backends = []
        for b in own["backends"]:
            extra = sum(m["in_flight"].get(b["url"], 0) for m in fresh)
            backends.append({**b, "in_flight": b["in_flight"] + extra})
        merged["backends"] = backends
        merged["in_flight"] = sum(b["in_flight"] for b in backends)
        merged["workers"] = 1 + len(fresh)
        # by worker number, whichever worker answers (this one first had made the list's order change from one
        # read to the next, so a count could not be told apart by worker)
        counts = {self.index: own["requests_total"], **{w: m["total"] for w, m in by_worker.items()}}
        merged["worker_requests"] = [counts[w] for w in sorted(counts)]
        return merged


def _die_with_parent() -> None:
    """Linux: this process gets SIGTERM when its parent dies (no orphaned workers)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class _LiveBackendsOnly:
    """The merged files without the series of replicas that left: prometheus_client cannot remove a series from
    the workers' files, so a replica removed by `PUT /admin/backends` kept its `backend_healthy == 0` (read as a
    dead replica) for good, one more series per pod that ever came and went. `shown`: family -> (label, the
    values shown): the per-backend gauges of live replicas only, counters (and the model_* series) of replicas
    live or gone within router/departed.py's time, as a single process removes them."""

    def __init__(self, inner, shown: dict[str, tuple[str, frozenset[str]]]):
        self.inner, self.shown = inner, shown

    def collect(self):
        for family in self.inner.collect():
            if family.name in self.shown:
                label, values = self.shown[family.name]
                family.samples = [s for s in family.samples if s.labels.get(label) in values]
            yield family


def metrics_registry(shown: dict[str, tuple[str, frozenset[str]]] | None = None):
    """All workers' metrics as one scrape: prometheus_client's multiprocess files, merged at read time, the
    series of replicas that left filtered out (`_LiveBackendsOnly`)."""
    from prometheus_client import CollectorRegistry, multiprocess

    registry = CollectorRegistry()
    registry.register(_LiveBackendsOnly(multiprocess.MultiProcessCollector(None), shown or {}))
    return registry


def _share_metrics(folder: str) -> None:
    """Every metric this process creates from now on lives in a file the other workers' scrapes read."""
    from prometheus_client import values

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
    values.ValueClass = values.MultiProcessValue()


def _worker(index: int, count: int, folder: str, backends, host, port, settings, options) -> None:
    _die_with_parent()
    _share_metrics(str(Path(folder) / "metrics"))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us with SIGTERM (Ctrl-C reaches all)
    from fleetserve.router.server import run_loop, serve_gateway

    run_loop(serve_gateway(backends, host, port, settings, reuse_port=True, peers=PeerBus(index, count, folder),
                           **options))


def failed_at_start(exitcode: int | None, uptime_s: float) -> bool:
    """An exit of its own (a positive code) within QUICK_EXIT_S of its start: it cannot start (a port, a file).
    A death by signal (the OOM killer, a SIGKILL) is no such sign: stopping the router for it was an outage."""
    return uptime_s < QUICK_EXIT_S and (exitcode or 0) > 0


def run_workers(count: int, backends: list[str], host: str, port: int, settings, options: dict) -> None:
    """Start `count` workers, keep them running, stop them on SIGTERM/SIGINT."""
    if port == 0:
        raise ValueError("--workers needs a fixed --port: every worker binds the same one")
    context = multiprocessing.get_context("fork")  # before any event loop: a clean copy, fast to start
    parent = bus_parent()
    remove_stale_folders(parent)
    folder = tempfile.mkdtemp(prefix=FOLDER_PREFIX, dir=parent)
    _mark_parent(Path(folder))
    (Path(folder) / "metrics").mkdir()
    stopping = False

    def start(i: int):
        p = context.Process(target=_worker, args=(i, count, folder, backends, host, port, settings, options),
                            name=f"router-worker-{i}", daemon=False)
        p.start()
        return p

    def stop(signum, _frame) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    procs = [start(i) for i in range(count)]
    started = [time.monotonic()] * count
    quick = [0] * count  # exits in a row, each soon after its start
    log.info("router: %d workers on port %d", count, port)
    try:
        while not stopping:
            time.sleep(0.2)
            for i, p in enumerate(procs):
                if p.is_alive() and not stopping:
                    _kill_if_hung(i, p, Path(folder), started[i])
                    continue
                if not stopping:
                    _metrics_dead(folder, p.pid)
                    quick[i] = quick[i] + 1 if failed_at_start(p.exitcode, time.monotonic() - started[i]) else 0
                    if quick[i] >= QUICK_EXITS:  # it cannot start (a port, a file): restarting forever hid that
                        log.error("router worker %d exited (%s) %d times within %.0f s of its start; stopping the "
                                  "router (the cause is in the lines above)", i, p.exitcode, quick[i], QUICK_EXIT_S)
                        raise SystemExit(1)
                    log.warning("router worker %d exited (%s); restarting", i, p.exitcode)
                    time.sleep(RESTART_DELAY_S)
                    procs[i], started[i] = start(i), time.monotonic()
    finally:
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + options["grace_s"] + 3.0  # their requests' grace, then their exit
        for p in procs:
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(1)
        shutil.rmtree(folder, ignore_errors=True)


def _kill_if_hung(index: int, proc, folder: Path, started: float, now: float | None = None) -> bool:
    """Kill a worker whose state file (its heartbeat, every LOAD_EVERY_S) is older than HUNG_S; the loop restarts
    it as it does a worker that died. A young worker that has written none yet is given HUNG_S from its start."""
    now = time.time() if now is None else now
    try:
        beat = (folder / f"w{index}.state").stat().st_mtime
    except FileNotFoundError:
        beat = None
    if beat is not None and beat >= now - (time.monotonic() - started):  # written by this worker, not its predecessor
        silent = now - beat
    else:
        silent = time.monotonic() - started
    if silent <= HUNG_S:
        return False
    log.error("router worker %d wrote no heartbeat for %.0f s (stopped or hung: its connections would hang); "
              "killing it to restart it", index, silent)
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGKILL)
    return True


SOCKET_PATH_MAX = 107  # a unix socket's path, in bytes (sun_path is 108 with its terminating NUL)


def bus_parent() -> str:
    """Where the bus folder goes: the temporary directory (TMPDIR), or /tmp when a worker's socket path there
    would be too long for a unix socket (a deep TMPDIR had made every worker fail at bind, and the router stop)."""
    parent = tempfile.gettempdir()
    longest = len(os.fsencode(os.path.join(parent, FOLDER_PREFIX + "x" * 8, "w999.sock")))
    return parent if longest <= SOCKET_PATH_MAX else "/tmp"


def remove_stale_folders(parent: str | None = None, now: float | None = None) -> list[str]:
    """Remove the bus folders of routers that are gone: a router SIGKILLed (the OOM killer, kill -9) never ran
    its cleanup, and each such start had left a folder of metric files in the temporary directory for good.
    A folder is gone when its router parent no longer runs and none of its workers' sockets accepts a connection
    (a live router's workers may all be restarting at once); a young one is spared (its workers may not have
    bound yet)."""
    parent = parent or tempfile.gettempdir()
    now = time.time() if now is None else now
    removed = []
    try:
        candidates = [p for p in Path(parent).iterdir() if p.name.startswith(FOLDER_PREFIX)]
    except OSError:
        return removed
    for folder in candidates:
        try:
            info = folder.lstat()
        except OSError:
            continue
        if not folder.is_dir() or folder.is_symlink() or info.st_uid != os.getuid() \
                or now - info.st_mtime < STALE_FOLDER_S or _parent_alive(folder) or _any_worker_listens(folder):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(str(folder))
    if removed:
        log.info("router: removed %d bus folder(s) of routers that are gone", len(removed))
    return removed


PARENT_FILE = "parent"  # in the bus folder: the router parent's pid and start time, while it runs


def _mark_parent(folder: Path) -> None:
    from fleetserve.fleet.state import process_start

    (folder / PARENT_FILE).write_text(f"{os.getpid()} {process_start(os.getpid()) or ''}")


def _parent_alive(folder: Path) -> bool:
    """The router that made the folder still runs (its workers may all be restarting, their sockets closed)."""
    from fleetserve.fleet.state import pid_alive, process_start

    try:
        pid_text, _, start = (folder / PARENT_FILE).read_text().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return False
    return pid_alive(pid) and (not start or process_start(pid) == start)


def _any_worker_listens(folder: Path) -> bool:
    for path in folder.glob("w*.sock"):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            probe.connect(str(path))  # connects without sending: a bound socket is a live worker
            return True
        except OSError:
            pass
        finally:
            probe.close()
    return False


def _metrics_dead(folder: str, pid: int) -> None:
    """A dead worker's live gauges stop counting (its counters stay: they are history)."""
    from prometheus_client import multiprocess

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(Path(folder) / "metrics")
    multiprocess.mark_process_dead(pid)

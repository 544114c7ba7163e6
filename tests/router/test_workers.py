"""`fleetserve router --workers 2`: two processes on one port that route as one router."""

import contextlib
import os
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.helpers import Server, wait_until
from tests.metrics_text import sample

BLOCK = 16


def sims(logs, n):
    return [Server(["engine", "--simulate", "fast", "--served-model-name", "sim", "--block-size", str(BLOCK)],
                   logs / f"sim{i}.log").start() for i in range(n)]


def load(gw) -> dict:
    return httpx.get(gw.url + "/admin/load", timeout=10).json()


@pytest.fixture()
def fleet(tmp_path):
    engines = sims(tmp_path, 3)
    args = ["router", "--strategy", "prefixaware", "--health-interval", "0.2", "--workers", "2"]
    for e in engines:
        args += ["--backend", e.url]
    gw = Server(args, tmp_path / "router.log").start()
    yield gw, engines
    gw.stop()
    for e in engines:
        e.stop()


def test_workers_share_routing_decisions_backends_and_load(fleet):
    gw, engines = fleet
    wait_until(lambda: load(gw).get("workers") == 2, 30, what="both workers report their load")
    docs = [list(range(k * 10_000, k * 10_000 + BLOCK * 12)) for k in range(8)]
    homes = {}
    for k, doc in enumerate(docs):  # a new connection per request: the kernel spreads them over the workers
        r = httpx.post(gw.url + "/v1/completions", json={"model": "sim", "prompt": doc + [1], "max_tokens": 2},
                       timeout=30)
        assert r.status_code == 200
        homes[k] = r.headers["x-fleetserve-replica"]
    assert len(set(homes.values())) >= 2  # cold documents spread
    for k, doc in enumerate(docs):  # whichever worker takes the repeat knows where the document went
        for suffix in ([2, 3], [4, 5]):
            r = httpx.post(gw.url + "/v1/completions", json={"model": "sim", "prompt": doc + suffix, "max_tokens": 2},
                           timeout=30)
            assert r.headers["x-fleetserve-replica"] == homes[k]
            assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == BLOCK * 12
    # in worker order, whichever worker answers the read (it came first, and the order changed between reads):
    # eight reads in a row agree once each worker has heard the other's last count (a load report every 0.25 s,
    # later on a loaded machine: a read right after the last request could still see an older count, and fail)
    agreed: list[list[int]] = []

    def eight_reads_agree() -> bool:
        reads = {tuple(load(gw)["worker_requests"]) for _ in range(8)}
        agreed[:] = [list(r) for r in reads]
        return len(reads) == 1 and len(agreed[0]) == 2 and sum(agreed[0]) == 24

    wait_until(eight_reads_agree, 20, what="both workers' request counts in /admin/load, eight reads agreeing")
    per_worker = agreed[0]
    assert min(per_worker) > 0, f"one worker served everything: {per_worker}"

    for _ in range(10):  # scrapes, answered by either worker, write the per-backend gauges of all three replicas
        assert sample(gw.url, "fleetserve_router_backend_healthy", backend=engines[2].url.split("://")[1]) == 1

    # the supervisor's backend set reaches every worker, whichever one it was sent to
    keep = engines[:2]
    r = httpx.put(gw.url + "/admin/backends", json={"backends": [{"url": e.url, "state": "ready"} for e in keep]},
                  timeout=10)
    assert r.status_code == 200
    wait_until(lambda: len(load(gw)["backends"]) == 2, 10, what="the new backend set")
    allowed = {e.url.split("://")[1] for e in keep}
    for i in range(12):
        r = httpx.post(gw.url + "/v1/completions", json={"model": "sim", "prompt": [7, i], "max_tokens": 1},
                       timeout=30)
        assert r.status_code == 200 and r.headers["x-fleetserve-replica"] in allowed

    # one scrape counts every worker's requests, whichever worker answers it
    for _ in range(4):
        assert sample(gw.url, "fleetserve_router_requests_total", path="/v1/completions", code="200") == 36

    # the replica that left has no per-backend gauge in any scrape, whichever worker answers it, as with one
    # process: the workers' shared files cannot drop a series, and it had stayed at 0 for good (a dead replica
    # to a reader, one more series per pod that ever came and went); each worker's last values (healthy 1, in
    # flight 1) had stayed before that until the worker answered a scrape itself
    gone = engines[2].url.split("://")[1]

    def gone_value(name: str) -> float | None:
        try:
            return sample(gw.url, name, backend=gone)
        except KeyError:
            return None

    wait_until(lambda: gone_value("fleetserve_router_backend_healthy") is None, 10, what="the departed replica gone")
    for _ in range(10):
        assert gone_value("fleetserve_router_backend_healthy") is None
        assert gone_value("fleetserve_router_backend_in_flight") is None
        assert sample(gw.url, "fleetserve_router_backend_healthy", backend=keep[0].url.split("://")[1]) == 1


def test_a_restarted_worker_takes_the_backend_set_the_others_were_given(fleet):
    """A worker restarted after a crash came back with the command line's backends (under `up`: none), so its
    share of the requests went to replicas the set had dropped, or was held for the buffer timeout (10 minutes)
    while `status` read ready."""
    gw, engines = fleet
    keep = engines[:2]
    r = httpx.put(gw.url + "/admin/backends", json={"backends": [{"url": e.url, "state": "ready"} for e in keep]},
                  timeout=10)
    assert r.status_code == 200
    wait_until(lambda: len(load(gw)["backends"]) == 2, 10, what="the new backend set")
    first = psutil.Process(gw.proc.pid).children()
    os.kill(first[0].pid, signal.SIGKILL)
    wait_until(lambda: len(psutil.Process(gw.proc.pid).children()) == 2 and
               first[0].pid not in {c.pid for c in psutil.Process(gw.proc.pid).children()}, 30,
               what="the worker restarted")
    wait_until(lambda: load(gw).get("workers") == 2, 30, what="both workers report their load")
    # each report is the answering worker's own set (a new connection each: the kernel spreads them over both, so
    # twenty all from the old worker would be one chance in a million)
    assert all(len(load(gw)["backends"]) == 2 for _ in range(20))
    allowed = {e.url.split("://")[1] for e in keep}
    for i in range(20):  # a new connection each: the kernel spreads them over both workers
        r = httpx.post(gw.url + "/v1/completions", json={"model": "sim", "prompt": [9, i], "max_tokens": 1},
                       timeout=30)
        assert r.status_code == 200 and r.headers["x-fleetserve-replica"] in allowed, r.headers


def test_workers_exit_with_their_parent(fleet):
    gw, _ = fleet
    workers = psutil.Process(gw.proc.pid).children()
    assert len(workers) == 2
    os.kill(gw.proc.pid, signal.SIGKILL)  # the parent dies without a chance to stop them
    gw.proc.wait(timeout=10)
    _, alive = psutil.wait_procs(workers, timeout=15)
    assert not alive, f"orphaned router workers: {[p.pid for p in alive]}"


def test_a_sigkilled_routers_bus_folder_is_removed_by_the_next_start(monkeypatch):
    """Each SIGKILLed multi-worker router (the OOM killer, kill -9) had left its folder of metric files in the
    temporary directory for good."""
    from fleetserve.router.workers import FOLDER_PREFIX, remove_stale_folders

    tmp_path = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))  # short: a unix socket's path is at most 107 bytes
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the router's temporary directory: this test's alone
    try:
        gw = Server(["router", "--backend", "http://127.0.0.1:9", "--workers", "2"], tmp_path / "router.log").start(
            ready_path="/livez")
        try:
            workers = psutil.Process(gw.proc.pid).children()
            wait_until(lambda: len(list(tmp_path.glob(f"{FOLDER_PREFIX}*/w*.sock"))) == 2, 30,
                       what="both bus sockets")
            (folder,) = tmp_path.glob(f"{FOLDER_PREFIX}*")
            assert not remove_stale_folders(str(tmp_path), now=time.time() + 3600)  # live: its workers listen
            os.kill(gw.proc.pid, signal.SIGKILL)
            gw.proc.wait(timeout=10)
            psutil.wait_procs(workers, timeout=15)
        finally:
            gw.stop()
        assert folder.is_dir()  # nobody ran the parent's cleanup
        assert not remove_stale_folders(str(tmp_path), now=folder.stat().st_mtime + 1)  # young: spared
        assert remove_stale_folders(str(tmp_path), now=time.time() + 3600) == [str(folder)]
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_a_deep_temporary_directory_puts_the_bus_under_tmp(tmp_path, monkeypatch):
    """A worker's socket path past 107 bytes made every worker fail at bind, and the router stop."""
    from fleetserve.router.workers import bus_parent

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / ("deep" * 30)))
    assert bus_parent() == "/tmp"
    monkeypatch.setattr(tempfile, "tempdir", "/var/tmp")
    assert bus_parent() == "/var/tmp"


def test_only_the_bus_folders_of_routers_that_are_gone_are_removed():
    import subprocess
    import sys

    from fleetserve.router.workers import FOLDER_PREFIX, PARENT_FILE, _mark_parent, remove_stale_folders

    tmp_path = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))  # short: a unix socket's path is at most 107 bytes
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        live, dead, other = tmp_path / f"{FOLDER_PREFIX}live", tmp_path / f"{FOLDER_PREFIX}dead", tmp_path / "other"
        restarting = tmp_path / f"{FOLDER_PREFIX}restarting"  # its parent runs; its workers are all restarting
        for folder in (live, dead, other, restarting):
            folder.mkdir()
        listening.bind(str(live / "w0.sock"))
        for folder in (dead, restarting):
            closed = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            closed.bind(str(folder / "w1.sock"))
            closed.close()  # its file stays, as a killed worker's does
        _mark_parent(restarting)  # this process plays the live parent
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout.strip()
        (dead / PARENT_FILE).write_text(f"{gone} 1")  # a parent that exited
        assert remove_stale_folders(str(tmp_path), now=time.time() + 3600) == [str(dead)]
        assert live.is_dir() and other.is_dir() and restarting.is_dir() and not dead.exists()
    finally:
        listening.close()
        shutil.rmtree(tmp_path, ignore_errors=True)

def test_workers_need_a_fixed_port(tmp_path):
    from tests.helpers import fleetserve

    result = fleetserve("router", "--backend", "http://127.0.0.1:9", "--workers", "2", "--port", "0")
    assert result.returncode == 2 and "--port" in result.stderr


def test_a_worker_that_cannot_start_stops_the_router_instead_of_restarting_for_ever(monkeypatch):
    """A worker failing at its start (a port, a file) was restarted every second, for ever, a traceback each time."""
    from fleetserve.router import workers

    def fails(*_args):
        os._exit(1)

    monkeypatch.setattr(workers, "_worker", fails)
    monkeypatch.setattr(workers, "RESTART_DELAY_S", 0.01)
    # run_workers points prometheus at its folder in this process's environment: servers that later tests start
    # from this process would inherit a folder that is gone by then
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)  # run_workers installs its own
    try:
        with pytest.raises(SystemExit) as info:
            workers.run_workers(2, [], "127.0.0.1", 9, None, {"grace_s": 0.1})
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
    assert info.value.code == 1


def test_only_a_workers_own_early_exits_count_as_failing_to_start():
    from fleetserve.router.workers import QUICK_EXIT_S, failed_at_start

    assert failed_at_start(1, 0.5) and failed_at_start(2, QUICK_EXIT_S - 1)
    assert not failed_at_start(-9, 0.5)  # killed (OOM, SIGKILL): restarted, never the router stopped for it
    assert not failed_at_start(1, QUICK_EXIT_S + 1)  # it had run: restarted as before


def test_the_dashboard_reads_the_whole_router_whichever_worker_answers(fleet):
    """Each worker answered with its own counts and its own history: the page's header alternated between two
    request totals, and read "in flight 0" while a panel showed requests in flight."""
    gw, _ = fleet
    wait_until(lambda: load(gw).get("workers") == 2, 30, what="both workers report their load")
    for i in range(12):  # a new connection each: the kernel spreads them over both workers
        r = httpx.post(gw.url + "/v1/completions", json={"model": "sim", "prompt": [7, i], "max_tokens": 2},
                       timeout=30)
        assert r.status_code == 200
    wait_until(lambda: sum(load(gw)["worker_requests"]) == 12, 10, what="both workers' counts")

    def data() -> dict:
        return httpx.get(gw.url + "/dashboard/data", timeout=10).json()

    def points(body: dict) -> int:
        return max([len(line["points"]) for panel in body["panels"] for line in panel["series"]] or [0])

    wait_until(lambda: all(data()["fleet"]["requests_total"] == 12 for _ in range(6)), 15,
               what="every worker's answer to count the whole router's requests")
    # watched: every worker samples, so whichever answers has a history, not only those it answered itself
    wait_until(lambda: min(points(data()) for _ in range(6)) >= 3, 30, what="a history in every worker")


def test_a_stopped_worker_is_restarted_and_the_routers_counts_never_go_back(fleet):
    """A SIGSTOPped (or hung) worker kept its share of new connections, each of which hung, and the parent never
    noticed; a restarted worker's counts started from 0, so /admin/load's requests_total went back (20 to 6)."""
    gw, _ = fleet
    for i in range(12):  # a new connection each: both workers take some
        r = httpx.post(gw.url + "/v1/completions", json={"model": "sim", "prompt": [7, i], "max_tokens": 1},
                       timeout=30)
        assert r.status_code == 200
    wait_until(lambda: load(gw).get("workers") == 2 and load(gw)["requests_total"] == 12, 10,
               what="both workers' counts")
    time.sleep(2 * 0.25)  # past a state write of each worker
    workers = psutil.Process(gw.proc.pid).children()
    stopped = max(workers, key=lambda c: c.pid)
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: stopped.pid not in {c.pid for c in psutil.Process(gw.proc.pid).children()} and
                   len(psutil.Process(gw.proc.pid).children()) == 2, 60, interval=0.5,
                   what="the stopped worker killed and replaced")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stopped.pid, signal.SIGCONT)
    wait_until(lambda: load(gw).get("workers") == 2, 30, what="both workers report their load")
    totals = [load(gw)["requests_total"] for _ in range(20)]  # either worker answers, the new one too
    assert min(totals) >= 12, totals
    assert "wrote no heartbeat" in Path(gw.log_path).read_text()

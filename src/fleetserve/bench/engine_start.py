"""`fleetserve bench engine-start`: a replica's start, from the supervisor's request to `/health` 200, forked from
the engine fork server (fleet/forkserver.py) against a new interpreter, side by side in one run.

Every scale-up, restart after a crash and wake from zero waits for this; the difference is the imports the fork
server has done once. Starts alternate (plain, forked, plain, ...) after one unmeasured start of each, so that a
model's first import and the page cache count for neither, and a machine that gets busier mid-run weighs on both.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from fleetserve.fleet.forkserver import ForkServer, become_subreaper
from fleetserve.fleet.process import Child, fleetserve_command, free_port


def _start_to_health(forks: ForkServer | None, model: str, folder: Path, timeout_s: float) -> float:
    port = free_port()
    child = Child("bench", fleetserve_command("engine", "--model", model, "--port", str(port), "--threads", "1"),
                  folder / f"engine-{port}.log", forks=forks)
    # one client for every poll: `httpx.get` builds one and its TLS context each call (~36 ms of CPU), which every
    # 20 ms kept most of a core from the engine whose start this times
    client = httpx.Client(timeout=1.0, trust_env=False)
    started = time.monotonic()
    child.start()
    try:
        while True:
            code = child.exit_code()
            if code is not None:
                raise RuntimeError(f"the engine exited ({code}) during its start; its log: {child.log_tail()}")
            try:
                if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"the engine did not answer /health within {timeout_s:.0f}s; its log: "
                                   f"{child.log_tail()}")
            time.sleep(0.02)
    finally:
        client.close()
        child.stop(timeout=10)


def _summary(values: list[float]) -> dict:
    return {"p50": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "all": [round(v, 3) for v in values]}


def run(model: str = "tiny", starts: int = 3, timeout_s: float = 600.0,
        progress: Callable[[str], None] = lambda _: None) -> dict:
    with tempfile.TemporaryDirectory(prefix="fleetserve-bench-start-") as tmp:
        folder = Path(tmp)
        if model == "tiny":
            from fleetserve.engine.tiny import create_tiny_model

            source = str(create_tiny_model(folder / "tiny"))
        else:
            source = "builtin:smollm2-135m" if model == "demo" else model
        if not become_subreaper():  # as the supervisor is: the forked engines are re-parented to this process
            raise RuntimeError("this kernel cannot make the bench a child subreaper (PR_SET_CHILD_SUBREAPER), which "
                               "forked engines need; fleets here start replicas as new interpreters")
        forks = ForkServer(folder / "forkserver.log", dict(os.environ), progress)
        began = time.monotonic()
        forks.start()
        try:
            if not forks.ready.wait(timeout_s) or forks.dead.is_set():
                raise RuntimeError(f"the engine fork server did not start; its log: {folder / 'forkserver.log'}")
            imported = time.monotonic() - began
            progress("warming up (one start of each, not measured) ...")
            _start_to_health(None, source, folder, timeout_s)
            _start_to_health(forks, source, folder, timeout_s)
            plain, forked = [], []
            for i in range(starts):
                progress(f"start {i + 1} of {starts}: new interpreter, then forked ...")
                plain.append(_start_to_health(None, source, folder, timeout_s))
                forked.append(_start_to_health(forks, source, folder, timeout_s))
        finally:
            forks.stop()
    return {
        "benchmark": "engine-start",
        "model": model,
        "starts": starts,
        "plain_s": _summary(plain),
        "forked_s": _summary(forked),
        "fork_server_ready_s": round(imported, 3),
        "ratio": {"forked_vs_plain_p50": round(statistics.median(forked) / statistics.median(plain), 3)},
        "note": "seconds from a replica's start to its /health 200 (real processes, wall clock, this machine), as a "
                "new interpreter (`python -m fleetserve engine`) and forked from the fleet's engine fork server, "
                "alternating; fork_server_ready_s is the server's own imports, paid once per fleet as it starts",
    }

"""A stand-in supervisor for the fork server's tests: a subreaper of its own (the test process must not become
one: every detached fleet the suite starts would be re-parented to it), driven by a scenario name, reporting JSON
lines on stdout.

    python -m tests.fleet.forkserver_driver SCENARIO MODEL_DIR FOLDER
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx

from fleetserve.fleet.forkserver import ForkServer, become_subreaper
from fleetserve.fleet.process import Child, fleetserve_command, free_port


def report(**fields) -> None:
    print(json.dumps(fields), flush=True)


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(") ", 1)[1].split()[1])


def healthy(port: int, timeout: float = 300.0) -> bool:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=1) as client:  # one for every poll (`httpx.get`: ~36 ms of CPU each)
        while time.monotonic() < deadline:
            try:
                if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    return False


def engine(forks: ForkServer, model: str, folder: Path, name: str, death=signal.SIGTERM) -> tuple[Child, int]:
    port = free_port()
    child = Child(name, fleetserve_command("engine", "--model", model, "--port", str(port), "--threads", "1"),
                  folder / f"{name}.log", env={"MARK": name}, forks=forks, death_signal=death)
    child.start()
    return child, port


def _names_port(pid: int, port: int) -> bool:
    try:
        return f"--port {port} ".encode() in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ") + b" "
    except OSError:
        return False


def main() -> None:
    scenario, model, folder = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    assert become_subreaper()
    said: list[str] = []
    forks = ForkServer(folder / "forkserver.log", dict(os.environ), said.append)
    if scenario == "lost_report":  # a server that dies right after a fork, before it reports the engine's pid
        forks.command = [sys.executable, "-c", "import os, fleetserve.fleet.forkserver as f\n"
                         "send = f._send\n"
                         "def dying(m):\n"
                         "    if 'pid' in m and 'id' in m: os._exit(3)\n"
                         "    send(m)\n"
                         "f._send = dying\nf.main()\n"]
    forks.start()
    first, port = engine(forks, model, folder, "r0")
    if not healthy(port):
        report(error="r0 never answered", log=first.log_tail())
        return
    if scenario == "lost_report":  # the engine reported itself: tracked, and no second engine was started
        forks.dead.wait(30)
        time.sleep(1)
        on_port = [int(p) for p in os.listdir("/proc") if p.isdigit() and _names_port(int(p), port)]
        report(dead=forks.dead.is_set(), tracked=first.pid, on_port=on_port, forked=hasattr(first.proc, "signal_group"),
               said=said)
        first.stop(timeout=30)
        return
    if scenario == "orphan":  # the test kills this process: r0 must go with it
        report(engine=first.pid)
        time.sleep(600)
        return
    cmdline = Path(f"/proc/{first.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    environ = Path(f"/proc/{first.pid}/environ").read_bytes()
    facts = {"parent_is_me": parent_of(first.pid) == os.getpid(), "cmdline": cmdline,
             "own_group": os.getpgid(first.pid) == first.pid, "home_in_environ": b"FLEETSERVE_HOME=" in environ,
             "serving_logged": "serving" in (folder / "r0.log").read_text()}
    # a stop asked while the fork is under way reaches the process the fork makes: SIGTERM, not a SIGKILL later
    second, _ = engine(forks, model, folder, "r1")
    while not second.proc._sent_at:
        time.sleep(0.001)
    second.stop(timeout=60)
    facts["stopped_in_flight"] = second.exit_code()
    # the server dies: r0 serves on, and the next start falls back to a new interpreter
    os.kill(forks.pid, signal.SIGKILL)
    forks.dead.wait(30)
    facts["survived_server"] = first.exit_code() is None and healthy(port, 10)
    third, third_port = engine(forks, model, folder, "r2")
    facts["fallback_served"] = healthy(third_port) and not hasattr(third.proc, "signal_group")
    third.stop(timeout=30)
    first.stop(timeout=30)
    facts["exit_code"] = first.exit_code()
    facts["said"] = said
    report(**facts)


if __name__ == "__main__":
    main()

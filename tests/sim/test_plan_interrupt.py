"""Ctrl-C during `plan`: it had exited 130 at once, saying nothing and throwing away every trial. The first one now
ends the search after the simulation under way and reports what it found; the exit is still 130."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from fleetserve.sim.plan import plan
from fleetserve.sim.setup import SimOptions
from fleetserve.spec.load import load_spec
from tests.sim.conftest import azure_slice

ROOT = Path(__file__).parents[2]
TRACE = ROOT / "tests" / "data" / "azure_code_trace.csv"


def test_a_stopped_search_reports_the_best_it_found_as_interrupted():
    trace = azure_slice(0, 1200)
    asked = []

    def stop() -> bool:  # as the CLI's Ctrl-C handler answers: true from the fourth simulation's ask on
        asked.append(1)
        return len(asked) > 3

    result = plan(load_spec(ROOT / "examples" / "hyperpod.yaml").endpoint, trace, SimOptions(window_s=120),
                  max_trials=40, stop=stop)
    assert result.interrupted and result.trials < 40
    assert result.cut_short.startswith(f"interrupted (Ctrl-C) after {result.trials} simulations")
    out = result.to_json()
    assert out["interrupted"] is True and out["evaluated"] == result.trials


def _read_until(fd: int, pattern: str, timeout: float) -> str:
    seen, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
            if re.search(pattern, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode("utf-8", "replace"))):
                break
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode("utf-8", "replace"))


def test_ctrl_c_on_a_terminal_says_what_the_search_had(tmp_path):
    """On a terminal, as a user stops it: the progress bar shows once the interrupt is handled."""
    main, side = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "fleetserve", "plan", str(ROOT / "examples" / "hyperpod.yaml"),
                             "--trace", str(TRACE), "-o", str(tmp_path / "planned.yaml"), "--max-trials", "60"],
                            stdin=side, stdout=side, stderr=side, start_new_session=True,
                            env={**os.environ, "COLUMNS": "200"})
    os.close(side)
    try:
        _read_until(main, r"planning", 120)
        os.killpg(proc.pid, signal.SIGINT)
        said = _read_until(main, r"\$ \Z|nothing written to|verified as:|simulations; written", 300)
        said += _read_until(main, r"\Z", 5) if proc.wait(timeout=300) is None else ""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        os.close(main)
    assert proc.returncode == 130, said
    assert "interrupted: stopping after the simulation under way" in said, said
    assert re.search(r"interrupted \(Ctrl-C\) after \d+ simulations", said), said

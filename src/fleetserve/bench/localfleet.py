"""A detached local fleet in a private FLEETSERVE_HOME, for benchmarks: up, status, down, always cleaned up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


class LocalFleet:
    def __init__(self, home: Path, name: str, spec_text: str):
        self.home = Path(home)
        self.name = name
        self.spec = self.home / f"{name}.yaml"
        self.spec.write_text(spec_text)
        self.env = {"FLEETSERVE_HOME": str(self.home)}

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "fleetserve", *args], capture_output=True, text=True,
                              env={**os.environ, **self.env}, timeout=timeout, stdin=subprocess.DEVNULL)

    def up(self) -> dict:
        # --stop-with: the fleet stops itself when this process ends, even killed (no orphaned fleet)
        result = self.cli("up", str(self.spec), "--detach", "--stop-with", str(os.getpid()), timeout=900)
        if result.returncode != 0:
            raise RuntimeError(f"fleet {self.name} did not start: {result.stderr.strip()[-2000:]}")
        return self.status()

    def status(self) -> dict:
        result = self.cli("status", self.name, "--json", timeout=60)
        states = json.loads(result.stdout) if result.returncode == 0 else []
        return states[0] if states else {}

    def wait(self, predicate, timeout: float, interval: float = 0.2) -> float | None:
        """Seconds until `predicate(status)` held, or None after `timeout`."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if predicate(self.status()):
                return time.monotonic() - start
            time.sleep(interval)
        return None

    def token_headers(self) -> dict[str, str]:
        """The fleet's internal token header (an operator's own credentials for the engines' admin API)."""
        from fleetserve.api.internal import InternalAuth, read_token_file

        return InternalAuth(read_token_file(self.home / "run" / self.name / "internal.token")).headers()

    def supervisor_log(self) -> str:
        try:
            return (self.home / "run" / self.name / "supervisor.log").read_text(errors="replace")
        except OSError:
            return ""

    def down(self) -> None:
        """Stop the fleet, and finish stopping it even when Ctrl-C cuts the first `down` short: the caller then
        removes the private home, and a supervisor still shutting down wrote its state file back into it."""
        try:
            self.cli("down", self.name, timeout=180)
        except KeyboardInterrupt:
            self.cli("down", self.name, timeout=180)
            raise

    def __enter__(self) -> LocalFleet:
        return self

    def __exit__(self, *exc) -> None:
        self.down()

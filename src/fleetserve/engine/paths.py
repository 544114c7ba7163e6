"""Where fleetserve keeps models and fleet state: $FLEETSERVE_HOME (default ~/.cache/fleetserve)."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """$FLEETSERVE_HOME as an absolute path (a relative one read from the current folder: the fleet's Prometheus
    resolved the paths in its configuration from the configuration's own folder and watched nothing, and `status`
    from another folder saw no fleet)."""
    return Path(os.environ.get("FLEETSERVE_HOME") or Path.home() / ".cache" / "fleetserve").absolute()


def pin_home() -> None:
    """Make a relative $FLEETSERVE_HOME absolute for this process's children too (each may run elsewhere)."""
    if os.environ.get("FLEETSERVE_HOME"):
        os.environ["FLEETSERVE_HOME"] = str(home())


def models_dir() -> Path:
    return home() / "models"

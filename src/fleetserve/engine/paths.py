"""Where fleetserve keeps models and fleet state: $FLEETSERVE_HOME (default ~/.cache/fleetserve)."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("FLEETSERVE_HOME") or Path.home() / ".cache" / "fleetserve")


def models_dir() -> Path:
    return home() / "models"

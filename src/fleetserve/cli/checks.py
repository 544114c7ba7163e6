"""Checks of command-line values that typer's bounds do not make."""

from __future__ import annotations

import math
from pathlib import Path

import typer


def finite(**flags: float | None) -> None:
    """typer's `min`/`max` let inf through; a limit or factor of inf is a typo (and Infinity is not JSON).
    Keyword names are the flags' names with underscores ("rate_scale" is --rate-scale)."""
    for name, value in flags.items():
        if value is not None and not math.isfinite(value):
            raise typer.BadParameter(f"{value}: must be a finite number", param_hint="--" + name.replace("_", "-"))


def writable(path: str | None, flag: str) -> None:
    """Checked before a run, so that minutes of simulation are not lost to a path that cannot be written;
    missing folders are made."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise typer.BadParameter(f"{path} is a directory; give a file name", param_hint=flag)
    existed = target.exists()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a"):
            pass
    except OSError as exc:
        raise typer.BadParameter(f"cannot write {path}: {exc.strerror}", param_hint=flag) from None
    if not existed:
        target.unlink()

"""Checks of command-line values that typer's bounds do not make."""

from __future__ import annotations

import math

import typer


def finite(**flags: float | None) -> None:
    """typer's `min`/`max` let inf through; a limit or factor of inf is a typo (and Infinity is not JSON).
    Keyword names are the flags' names with underscores ("rate_scale" is --rate-scale)."""
    for name, value in flags.items():
        if value is not None and not math.isfinite(value):
            raise typer.BadParameter(f"{value}: must be a finite number", param_hint="--" + name.replace("_", "-"))

"""What makes a path no input file to read: the commands' FILE and --trace checks and the trace loader say it alike."""

from __future__ import annotations

from pathlib import Path


def not_a_file(path: str | Path) -> str | None:
    """Why `path` is no input file to read ("is a directory", "is not a regular file", "does not exist"), or None.
    A device said "does not exist" (/dev/zero), or was read until memory ran out."""
    p = Path(path)
    if p.is_file():
        return None
    return ("is a directory" if p.is_dir() else "is not a regular file (a device, a pipe or a socket)"
            if p.exists() else "does not exist")

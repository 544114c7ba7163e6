"""Output files written whole or not at all.

A write cut short (a full disk, Ctrl-C) had left a shorter file that reads as a valid one (a trace, a planned spec,
a report) over the file it replaced. A regular file is written beside itself and renamed over the old one; a
device or a pipe (/dev/stdout, a FIFO, /dev/full) is written to as it is, never replaced by a file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TextIO


def write_whole(path: str | Path, write: Callable[[TextIO], object], newline: str | None = None) -> Path:
    """Call `write` with the open file; the file at `path` is the new one only once `write` has finished."""
    p = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)  # the link stays a link
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.exists() and not p.is_file():
        with open(p, "w", newline=newline) as f:
            write(f)
        return Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    mode = p.stat().st_mode & 0o7777 if p.exists() else None  # a file made private stays private
    try:
        with open(tmp, "w", newline=newline) as f:
            write(f)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)
    return Path(path)


def write_whole_text(path: str | Path, text: str) -> Path:
    return write_whole(path, lambda f: f.write(text))

"""Output files written whole or not at all.

A write cut short (a full disk, Ctrl-C) had left a shorter file that reads as a valid one (a trace, a planned spec,
a report) over the file it replaced. A regular file is written beside itself and renamed over the old one; a
device or a pipe (/dev/full, a FIFO) and whatever is reached through /dev or /proc (`-o /dev/stdout`, piped or
redirected to a file the shell opened) are written to as they are, never replaced by a file.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

IN_PLACE_ROOTS = ("/dev/", "/proc/")  # /dev/stdout -> /proc/self/fd/1 -> the shell's file or pipe


def write_whole(path: str | Path, write: Callable[[TextIO], object], newline: str | None = None) -> Path:
    """Call `write` with the open file; the file at `path` is the new one only once `write` has finished."""
    given = Path(path)
    if _in_place(given):  # appended: reopening /dev/stdout with "w" truncated the file the shell had opened
        with open(given, "a", newline=newline) as f:
            write(f)
        return given
    p = Path(os.path.realpath(given)) if given.is_symlink() else given  # a user's link stays a link
    p.parent.mkdir(parents=True, exist_ok=True)
    mode = stat.S_IMODE(p.stat().st_mode) if p.exists() else None  # a file made private stays private
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")  # exclusive, 0600
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        else:  # a new file gets what open() would have given it
            os.fchmod(fd, 0o666 & ~process_umask())
        with os.fdopen(fd, "w", newline=newline) as f:
            write(f)
        os.replace(tmp, p)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return given


def process_umask() -> int:
    """This process's umask, read without setting it (os.umask sets it, racing other threads' new files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _in_place(path: Path) -> bool:
    """A device, a pipe, or a name under /dev or /proc (followed through links)."""
    text = os.path.abspath(path)
    if text.startswith(IN_PLACE_ROOTS) or os.path.realpath(path).startswith(IN_PLACE_ROOTS):
        return True
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


def write_whole_text(path: str | Path, text: str) -> Path:
    return write_whole(path, lambda f: f.write(text))

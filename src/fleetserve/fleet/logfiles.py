"""Size-capped log files of a local fleet: copied and truncated when they grow past a limit.

Every child (router, engines, Redis, Prometheus) writes its stdout and stderr into a file of the run folder, and
the detached supervisor into supervisor.log, all opened for appending. They were never rotated: at about 370 bytes
a request across the router's and an engine's lines, a busy fleet filled the disk. The children cannot reopen a
file, so a file past `max_bytes` is copied to NAME.1 (NAME.1 to NAME.2, ... up to KEEP) and truncated to nothing,
as logrotate's `copytruncate` does: the writers append, so their next line lands at the start of the emptied file
(no hole). Lines written between the copy and the truncation are lost; at one check every ROTATE_EVERY_S that is
rare and bounded.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

KEEP = 3  # rotated generations kept: NAME.1 (the newest) to NAME.3
ROTATE_EVERY_S = 5.0  # one stat per log file: every 30 s, a busy fleet's files reached 3.6 x the limit


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def rotated_name(path: Path, generation: int) -> Path:
    return path.with_name(f"{path.name}.{generation}")


def rotate(path: Path, keep: int = KEEP) -> bool:
    """Copy `path` to its first generation (shifting the older ones) and truncate it; False if it is gone."""
    try:
        for generation in range(keep - 1, 0, -1):
            older = rotated_name(path, generation)
            if older.exists():
                os.replace(older, rotated_name(path, generation + 1))
        shutil.copyfile(path, rotated_name(path, 1))
        os.truncate(path, 0)
    except FileNotFoundError:
        return False
    return True


def rotate_over(paths, max_bytes: int, keep: int = KEEP) -> list[Path]:
    """Rotate each of `paths` past `max_bytes` (0: never); the ones rotated."""
    done = []
    if max_bytes <= 0:
        return done
    for path in paths:
        try:
            if path.stat().st_size <= max_bytes:
                continue
        except OSError:
            continue
        try:
            if rotate(path, keep):
                done.append(path)
        except OSError as exc:  # a full disk, a permission: the log goes on growing, said once per check
            log.warning("could not rotate %s: %s", path, exc)
    return done

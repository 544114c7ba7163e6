"""One entry of the model cache (the demo model's import, an S3 copy), written whole or not at all.

    with locked(target):                 # one writer per entry, across processes (flock on .NAME.lock)
        with partial(target) as tmp:     # write into tmp; renamed onto target when the block ends without error
            ...

A writer killed mid-write (SIGTERM, SIGKILL, a node that lost power) runs no `finally`: its `.NAME.partial-*`
folder stayed in the cache for good, as large as the model. The next writer, holding the lock, removes them:
no live writer can own one. The folder is made with the mode the umask gives a new folder (mkdtemp makes it
0700), so a cache shared by several users, or a pod running as another uid, can read the entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from fleetserve.whole_file import process_umask

PARTIAL = ".partial-"


@contextlib.contextmanager
def locked(target: Path) -> Iterator[None]:
    """Hold the entry's lock (the entry's folder's parent is made if missing)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def stale_partials(target: Path) -> list[Path]:
    """What writers of this entry that died left behind, under this name and the name versions before
    2026-12-06 gave them (mkdtemp's `.NAME-` and 8 characters)."""
    legacy = re.compile(rf"\.{re.escape(target.name)}-[a-z0-9_]{{8}}")
    return sorted([*target.parent.glob(f".{target.name}{PARTIAL}*"),
                   *(p for p in target.parent.glob(f".{target.name}-*") if legacy.fullmatch(p.name) and p.is_dir())])


@contextlib.contextmanager
def partial(target: Path) -> Iterator[Path]:
    """A fresh folder beside `target`, renamed onto it (replacing what was there) when the block succeeds and
    removed when it raises. Call it under `locked(target)`."""
    for left in stale_partials(target):
        shutil.rmtree(left, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}{PARTIAL}", dir=target.parent))
    try:
        tmp.chmod(0o777 & ~process_umask())
        yield tmp
        if target.exists() or target.is_symlink():
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink()
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

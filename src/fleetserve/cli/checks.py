"""Checks of command-line values that typer's bounds do not make."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer


def float_option(*decls: str, min: float | None = None, max: float | None = None, **options: Any) -> Any:  # noqa: A002
    """`typer.Option` for every float flag. typer's own bounds let inf through, and nan fails every comparison,
    so it named the bound ("should be >= 1") rather than the value: a limit or factor of nan or inf is a typo
    (and neither is JSON). Refused here naming the flag, the value and the allowed range; exit 2."""
    return typer.Option(*decls, parser=_bounded(min, max), metavar=f"<float> {_range(min, max)}".rstrip(), **options)


def _range(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"[{low:g}<=x<={high:g}]"
    if low is not None:
        return f"[x>={low:g}]"
    return f"[x<={high:g}]" if high is not None else ""


def _bounded(low: float | None, high: float | None) -> Callable[[str], float]:
    def parse(value: str | float) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise typer.BadParameter(f"{value!r} is not a number") from None
        if not math.isfinite(number):
            raise typer.BadParameter(f"{value}: must be a finite number {_range(low, high)}".rstrip())
        if (low is not None and number < low) or (high is not None and number > high):
            raise typer.BadParameter(f"{value} is not in the range {_range(low, high)}")
        return number

    return parse


def peer_python(path: str | None, module: str, flag: str) -> str | None:
    """A Python a bench runs a peer router with (`--sglang-python`, or the environment variable named as `flag`):
    an executable file, or a name on PATH (`python3.11`), that imports `module`, else exit 2 naming the flag (a
    wrong path was a row reading "failed: ... No such file" after minutes)."""
    if path is None:
        return None
    import shutil
    import subprocess

    path = path if "/" in path else shutil.which(path) or path
    if not Path(path).is_file() or not os.access(path, os.X_OK):
        raise typer.BadParameter(f"{path} is not an executable file", param_hint=flag)
    try:
        found = subprocess.run([path, "-c", f"import {module}"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise typer.BadParameter(f"{path} does not run: {exc}", param_hint=flag) from None
    if not found:
        raise typer.BadParameter(f"{path} cannot import {module}; install it there", param_hint=flag)
    return path


MAX_THREADS = 1024  # torch threads a command takes at most: 100,000 was a "can't start new thread" and a segfault


def writable_folder(path: str, flag: str) -> None:
    """A folder a command will write into: made if missing; a file in its place or above it is exit 2 naming
    `flag` (it was a traceback)."""
    if not path.strip():  # Path("") is the current folder: `model tiny ""` had written a model into it
        raise typer.BadParameter("is empty: give a folder name", param_hint=flag)
    target = Path(path)
    folder = next((p for p in [target, *target.parents] if p.exists()), None)
    if folder is not None and not folder.is_dir():
        raise typer.BadParameter(f"cannot write into {path}: {folder} is a file, not a folder", param_hint=flag)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise typer.BadParameter(f"cannot write into {path}: {exc.strerror}", param_hint=flag) from None


def write_output(path: str, text: str, flag: str) -> str | None:
    """Write a command's output file whole (`whole_file`): the `error:` message when it cannot be, else None. A
    full disk had been a traceback and exit 1 (`verify` read as failed) over a cut-off file that replaced the
    last good one; the caller prints its results first, then exits 2 (`output_failed`), so that minutes of
    simulation are not lost with the file."""
    from fleetserve.whole_file import write_whole_text

    try:
        write_whole_text(path, text)
    except OSError as exc:
        return f"{flag}: cannot write {path}: {exc.strerror or exc}"
    return None


EXIT_READER_GONE = 128 + 13  # what a shell reports for a filter stopped by SIGPIPE (`seq 1e9 | head -1`)


def reader_gone() -> typer.Exit:
    """Standard output's reader stopped (`... -o - | head`): stop quietly, as a Unix filter does; "error: cannot
    write -: Broken pipe" and exit 2 had read as bad input. Standard output is pointed at /dev/null so that the
    interpreter's own flush at exit does not complain again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return typer.Exit(EXIT_READER_GONE)


def output_failed(problem: str) -> typer.Exit:
    """Exit 2 after the results were printed: `error:` on stderr only (stdout keeps the one JSON document)."""
    from fleetserve.cli.console import EXIT_USAGE, err

    err.print("[red]error:[/red] ", end="")
    err.print(problem, markup=False)
    return typer.Exit(EXIT_USAGE)


def writable(path: str | None, flag: str, inputs: tuple[str | None, ...] = ()) -> None:
    """Checked before a run, so that minutes of simulation are not lost to a path that cannot be written;
    missing folders are made. Never one of the command's `inputs` (`trace scale T -o T` replaced the trace it
    was reading, a shared read-only one included: root may write anyway), nor a file without write permission."""
    if path is None:
        return
    if not path.strip():  # Path("") is the current folder: it was called " is a directory"
        raise typer.BadParameter("an empty file name; give a file name", param_hint=flag)
    target = Path(path)
    if target.is_dir():
        raise typer.BadParameter(f"{path} is a directory; give a file name", param_hint=flag)
    existed = target.exists()
    if existed:
        for source in inputs:
            if source is not None and Path(source).exists() and os.path.samefile(source, target):
                raise typer.BadParameter(f"{path} is the command's input {source}; write to another file",
                                         param_hint=flag)
        if not target.stat().st_mode & 0o222:
            raise typer.BadParameter(f"{path} is read-only; choose another file (or make it writable)",
                                     param_hint=flag)
    if existed and not target.is_file():  # a pipe or a device: opened to probe it, a FIFO blocked the command
        if not os.access(target, os.W_OK):  # until a reader came (and then got nothing from the probe)
            raise typer.BadParameter(f"cannot write {path}: permission denied", param_hint=flag)
        return
    folder = next((p for p in [target.parent, *target.parent.parents] if p.exists()), None)
    if folder is not None and not folder.is_dir():
        raise typer.BadParameter(f"cannot write {path}: {folder} is a file, not a folder", param_hint=flag)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a"):
            pass
    except OSError as exc:
        raise typer.BadParameter(f"cannot write {path}: {exc.strerror}", param_hint=flag) from None
    if not existed:
        target.unlink()

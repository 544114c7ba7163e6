"""The CLI's two streams and its one way to fail: figures and tables on stdout (so `--json` output pipes
clean), progress, warnings and errors on stderr, and every error printed as `error: ...` with its exit code
(2 for bad input, as click's own usage errors)."""

from __future__ import annotations

import os

import typer
from rich.console import Console

EXIT_USAGE = 2
PIPED_WIDTH = 400  # stdout into a pipe or a file: as wide as a table needs, up to this


def _stdout() -> Console:
    """stdout's console. Into a pipe or a file rich assumed 80 columns and folded every wide table's cells onto
    extra lines, so `fleetserve status | grep NAME` found half a row; COLUMNS, when set, still wins."""
    console = Console(soft_wrap=True, highlight=False)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = PIPED_WIDTH
    return console


out = _stdout()
err = Console(stderr=True, soft_wrap=True, highlight=False)


def fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    """Print `error: message` on stderr (never read as rich markup: paths and values hold brackets) and return
    the exit to raise."""
    err.print("[red]error:[/red] ", end="")
    err.print(message, markup=False)
    return typer.Exit(code)


def print_spec_errors(exc) -> None:
    """A spec's problems as JSON on stdout, for a command run with --json: a tool reading stdout gets them too
    (`validate`, `render`, `simulate`, `verify` and `plan`; the last three had printed nothing there)."""
    import json

    print(json.dumps({"valid": False, "errors": [{"path": p.path, "message": p.message} for p in exc.problems]},
                     indent=2))


def render_refusal(exc: Exception, prefix: str = ""):
    """`render k8s`'s refusal (a ValueError "spec.x.y: why") as a SpecError naming that field: `validate --json
    --kubernetes` gave it path "" and `render k8s --json` printed nothing on stdout."""
    import re

    from fleetserve.spec.errors import SpecError, SpecProblem

    text = str(exc)
    found = re.match(r"(spec(?:\.[\w\-/\[\]]+)*|metadata(?:\.[\w\-/\[\]]+)*): (.*)", text, re.S)
    path, message = (found.group(1), found.group(2)) if found else ("", text)
    return SpecError([SpecProblem(path, prefix + message)])


def say(message: str) -> None:
    """A progress or status line on stderr, as written."""
    err.print(message, markup=False)


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is (what is under way stops cleanly); the process exits 143, not 130. Typer
    turns any KeyboardInterrupt into exit 130, so `raised` tells `main` which one it was."""

    raised = False

    def __init__(self, *args):
        super().__init__(*args)
        Terminated.raised = True

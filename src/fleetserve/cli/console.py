"""The CLI's two streams and its one way to fail: figures and tables on stdout (so `--json` output pipes
clean), progress, warnings and errors on stderr, and every error printed as `error: ...` with its exit code
(2 for bad input, as click's own usage errors)."""

from __future__ import annotations

import os
import re
import sys

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


def fail(message: str, code: int = EXIT_USAGE, path: str | None = None, fallback: str = "") -> typer.Exit:
    """Print `error: message` on stderr (never read as rich markup: paths and values hold brackets) and return
    the exit to raise. Bad input to a command run with --json is also printed as JSON on stdout, under `path`
    (by default the flag or field the message starts with, else `fallback`: the argument or flag whose file it
    is, where the message starts with the file's name)."""
    if code == EXIT_USAGE and wants_json():
        print_errors_json([((_named_path(message) or fallback) if path is None else path, message)])
    err.print("[red]error:[/red] ", end="")
    err.print(message, markup=False)
    return typer.Exit(code)


class _ErrorsJson:
    printed = False  # this run has printed its errors on stdout: a second document would break the reader


def wants_json() -> bool:
    """Whether the command line asked for --json (read from it: an option that fails to parse comes before the
    rest are read)."""
    args = sys.argv[1:]
    return "--json" in (args[:args.index("--")] if "--" in args else args)


def print_errors_json(errors: list[tuple[str, str]]) -> None:
    """Bad input as JSON on stdout, `{"valid": false, "errors": [{"path", "message"}]}`, once per run: whatever
    refused it (the spec, a flag click refused, a check of the command), a tool reading stdout reads one shape.
    Only the spec's problems had been printed there; a bad --trace printed nothing."""
    import json

    if _ErrorsJson.printed:
        return
    _ErrorsJson.printed = True
    print(json.dumps({"valid": False, "errors": [{"path": p, "message": m} for p, m in errors]}, indent=2))


def print_spec_errors(exc) -> None:
    """A spec's problems as JSON on stdout, for a command run with --json (`validate`, `render`, `simulate`,
    `verify` and `plan`)."""
    print_errors_json([(p.path or "SPEC", p.message) for p in exc.problems])  # the file itself: missing, a folder


_NAMED = re.compile(r"(--[a-z][\w-]*(?=[: ])|(?:spec|metadata)(?:\.[\w\-/\[\]]+)*(?=: )|[A-Z]+(?=: ))")


def _named_path(message: str) -> str:
    """The field or flag a message of ours starts with (`--profile: ...`, `--namespace applies to ...`,
    `spec.slo.ttftP95Ms: ...`), or ""."""
    found = _NAMED.match(message)
    return found.group(1) if found else ""


def usage_error_json(exc) -> None:
    """A usage error click raised (a flag's value refused while parsing, a missing argument) as JSON, when the
    command line asked for --json."""
    if exc.exit_code != EXIT_USAGE or not wants_json():
        return
    hint = getattr(exc, "param_hint", None)
    if isinstance(hint, list | tuple):
        hint = "/".join(hint)
    param = getattr(exc, "param", None)
    if not hint and param is not None:
        hint = param.opts[0] if getattr(param, "opts", None) else param.name
    hint = hint or getattr(exc, "option_name", None) or ""
    print_errors_json([(str(hint).strip("'\""), exc.format_message())])


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

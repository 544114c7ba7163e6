"""ServeGen rate files (alibaba/ServeGen, Apache-2.0) turned into request arrivals.

ServeGen publishes no per-request trace; it publishes, per API client, one row per 600 s window:
`window_start_s, rate_rps, cv, dist (Weibull|Gamma|empty), shape, scale`. Arrivals are drawn as ServeGen's
own generator draws them: ceil(rate x window) inter-arrival times from the window's fitted distribution,
rescaled so that they fill the window exactly (the rate is what the data pins down; the distribution gives
the burstiness). Clients are independent; a folder (or the published .tar.gz) of clients is their
superposition. The computed aggregate file (`model,window_start_s,total_rate_rps,active_clients`) has no
burstiness figure, so its windows get Poisson arrivals.

Request sizes are not in the rate files (ServeGen's per-window length PDFs were too large to copy), so every
request gets `input_tokens` / `output_tokens`; no prefix information (hash ids) either.
"""

from __future__ import annotations

import csv
import io
import math
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fleetserve.traces.model import MAX_REQUESTS, TraceRequest

WINDOW_S = 600.0
DEFAULT_INPUT_TOKENS = 1024  # every request's size: the rate files carry none
DEFAULT_OUTPUT_TOKENS = 128


class ServeGenError(ValueError):
    """A rate file that cannot be read or a selection that does not exist; the message says which."""


@dataclass(frozen=True)
class RateWindow:
    start_s: float
    rate_rps: float
    cv: float = 1.0
    dist: str = ""  # "Gamma", "Weibull" or "" (Poisson)
    shape: float = 0.0
    scale: float = 0.0


CHOOSE_MODEL = ("choose one (--trace-model in simulate, verify and plan; --model in trace scale; for other commands, "
                "write that model's arrivals with `trace scale FILE --model NAME -o out.csv` first)")


def is_servegen(path: Path) -> bool:
    """A folder or archive of ServeGen traces, a per-client chunk CSV, or the aggregate CSV."""
    if path.is_dir() or path.name.endswith((".tar.gz", ".tgz")):
        return True
    if path.suffix != ".csv":
        return False
    with open(path, encoding="utf-8-sig", errors="replace") as f:  # not text: the CSV loader names it
        first = f.readline().strip()
    return first.startswith("model,window_start_s") or _chunk_row(first) is not None


def _chunk_row(line: str) -> RateWindow | None:
    parts = line.strip().split(",")
    if len(parts) != 6:
        return None
    try:
        return RateWindow(float(parts[0]), float(parts[1]), float(parts[2] or 0), parts[3].strip(),
                          float(parts[4] or 0), float(parts[5] or 0))
    except ValueError:
        return None


def _read_chunk(text: str, name: str) -> list[RateWindow]:
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        row = _chunk_row(line)
        if row is None:
            raise ServeGenError(f"{name}:{n}: expected window_start_s,rate_rps,cv,dist,shape,scale")
        rows.append(row)
    return rows


def read_clients(path: str | Path, model: str | None = None) -> list[list[RateWindow]]:
    """Every client's windows from a chunk CSV, the aggregate CSV (one pseudo-client), a folder or a tar.gz."""
    p = Path(path)
    if not p.exists():
        raise ServeGenError(f"rate file {p} does not exist")
    if p.is_dir():
        files = {str(f.relative_to(p)): f.read_text() for f in sorted(p.rglob("chunk-*-trace.csv"))}
        return _select(files, model, p)
    if p.name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(p) as tar:
            files = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()
                     if m.isfile() and m.name.endswith("-trace.csv")}
        return _select(files, model, p)
    text = p.read_text()
    if text.startswith("model,window_start_s"):
        return [_aggregate(text, model, p)]
    return [_read_chunk(text, str(p))]


def _model_of(name: str) -> str:
    parts = Path(name).parts
    return "/".join(parts[-3:-1]) if len(parts) >= 3 else (parts[-2] if len(parts) == 2 else "")


def _select(files: dict[str, str], model: str | None, p: Path) -> list[list[RateWindow]]:
    models = sorted({_model_of(n) for n in files})
    if not files:
        raise ServeGenError(f"{p} is a folder without ServeGen rate files (chunk-*-trace.csv); a trace is a file: "
                            "Mooncake JSONL, Azure CSV, a prompt log, or a ServeGen folder or .tar.gz")
    if model is None and len(models) > 1:
        raise ServeGenError(f"{p} holds several models: {CHOOSE_MODEL}; allowed: {', '.join(models)}")
    wanted = [n for n in files if model is None or _model_of(n) == model or _model_of(n).endswith("/" + model)]
    if not wanted:
        raise ServeGenError(f"unknown ServeGen model {model!r}; allowed: {', '.join(models)}")
    return [_read_chunk(files[n], n) for n in sorted(wanted)]


def _aggregate(text: str, model: str | None, p: Path) -> list[RateWindow]:
    rows = list(csv.DictReader(io.StringIO(text)))
    models = sorted({r["model"] for r in rows})
    if model is None and len(models) > 1:
        raise ServeGenError(f"{p} holds several models: {CHOOSE_MODEL}; allowed: {', '.join(models)}")
    chosen = [r for r in rows if model is None or r["model"] == model or r["model"].endswith("/" + str(model))]
    if not chosen:
        raise ServeGenError(f"unknown ServeGen model {model!r}; allowed: {', '.join(models)}")
    try:
        return [RateWindow(float(r["window_start_s"]), float(r["total_rate_rps"])) for r in chosen]
    except (KeyError, ValueError) as exc:
        raise ServeGenError(f"{p}: bad aggregate row ({exc})") from None


def window_arrivals(w: RateWindow, rng: np.random.Generator, window_s: float = WINDOW_S) -> np.ndarray:
    """Arrival times (absolute seconds) of one client in one window."""
    if w.rate_rps <= 0:
        return np.empty(0)
    if w.dist not in ("Gamma", "Weibull") or w.shape <= 0 or w.scale <= 0:
        n = rng.poisson(w.rate_rps * window_s)
        return w.start_s + np.sort(rng.random(n)) * window_s
    n = math.ceil(w.rate_rps * window_s)
    if w.dist == "Gamma":
        iats = rng.gamma(w.shape, w.scale, n)
    else:
        iats = rng.weibull(w.shape, n) * w.scale
    total = iats.sum()
    iats = iats * (window_s / total) if total > 0 else np.full(n, window_s / n)
    # ServeGen starts the window with a gap and drops the arrival that lands on its end; a random phase on the
    # circle keeps all n arrivals and every gap but one
    phase = rng.random() * window_s
    return w.start_s + np.sort((np.cumsum(iats) + phase) % window_s)


def load_servegen(path: str | Path, model: str | None = None, seed: int = 0, start_s: float = 0.0,
                  duration_s: float | None = None, limit: int | None = None,
                  input_tokens: int = DEFAULT_INPUT_TOKENS,
                  output_tokens: int = DEFAULT_OUTPUT_TOKENS) -> list[TraceRequest]:
    """Requests arriving in [start_s, start_s + duration_s) of the rate file, times rebased to 0."""
    clients = read_clients(path, model)
    end = math.inf if duration_s is None else start_s + duration_s
    starts = sorted({w.start_s for c in clients for w in c if start_s - WINDOW_S < w.start_s < end})
    if limit is None and duration_s is None:
        expected = sum(w.rate_rps * WINDOW_S for c in clients for w in c if w.start_s > start_s - WINDOW_S)
        if expected > MAX_REQUESTS:
            raise ServeGenError(f"{path}: about {expected:,.0f} requests; give a limit (--limit; `trace scale` "
                                f"also takes --duration), at most {MAX_REQUESTS:,} without one")
    by_start: list[dict[float, RateWindow]] = [{w.start_s: w for w in c} for c in clients]
    rng = np.random.default_rng(seed)
    out: list[TraceRequest] = []
    for ws in starts:
        times = [window_arrivals(c[ws], rng) for c in by_start if ws in c]
        merged = np.sort(np.concatenate(times)) if times else np.empty(0)
        merged = merged[(merged >= start_s) & (merged < end)]
        for t in merged:
            out.append(TraceRequest(float(t - start_s), input_tokens, output_tokens))
            if limit is not None and len(out) >= limit:
                return out
    return out

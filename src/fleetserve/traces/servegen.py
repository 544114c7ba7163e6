"""ServeGen rate files (alibaba/ServeGen, Apache-2.0) turned into request arrivals.

ServeGen publishes no per-request trace; it publishes, per API client, one row per 600 s window:
`window_start_s, rate_rps, cv, dist (Weibull|Gamma|Exponential|empty, any case), shape, scale`, with or
without that header row; numbers finite and not negative. Arrivals are drawn as ServeGen's
own generator draws them: ceil(rate x window) inter-arrival times from the window's fitted distribution (Gamma,
Weibull; a window without one, or Exponential, is Poisson: a count drawn around rate x window),
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
import re
import tarfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from fleetserve.traces.model import MAX_REQUESTS, TraceRequest

WINDOW_S = 600.0
DEFAULT_INPUT_TOKENS = 1024  # every request's size: the rate files carry none
DEFAULT_OUTPUT_TOKENS = 128


def size_warning() -> str:
    """What a ServeGen trace's requests are made of, said wherever one is simulated or written out."""
    return (f"ServeGen rate files carry arrivals only: every request gets {DEFAULT_INPUT_TOKENS} prompt and "
            f"{DEFAULT_OUTPUT_TOKENS} output tokens and no shared prefix")


class ServeGenError(ValueError):
    """A rate file that cannot be read or a selection that does not exist; the message says which. `param`:
    the loader's parameter at fault ("model": the model chosen, or none chosen where several are), if any."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


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


CHUNK_HEADER = "window_start_s,rate_rps,cv,dist,shape,scale"
DISTRIBUTIONS = {"gamma": "Gamma", "weibull": "Weibull", "exponential": "", "poisson": "", "": ""}


def is_servegen(path: Path) -> bool:
    """A folder or archive of ServeGen traces, a per-client chunk CSV, or the aggregate CSV."""
    if path.is_dir() or path.name.endswith((".tar.gz", ".tgz")):
        return True
    if path.suffix != ".csv":
        return False
    if re.fullmatch(r"chunk-\d+-trace\.csv", path.name):  # ServeGen's own name: its loader names a bad first row
        return True  # (a malformed first row, or another header, had made it "an azure trace")
    with open(path, encoding="utf-8-sig", errors="replace") as f:  # not text: the CSV loader names it
        first = f.readline().strip()
    return (first.startswith("model,window_start_s") or first.replace(" ", "") == CHUNK_HEADER
            or _chunk_row(first) is not None)


def _chunk_row(line: str) -> RateWindow | None:
    parts = line.strip().split(",")
    if len(parts) != 6:
        return None
    try:
        return RateWindow(float(parts[0]), float(parts[1]), float(parts[2] or 0), parts[3].strip(),
                          float(parts[4] or 0), float(parts[5] or 0))
    except ValueError:
        return None


def _checked(w: RateWindow, where: str) -> RateWindow:
    """A window whose numbers can be drawn from: finite, not negative; the distribution by name, any case
    (an unknown name would silently become Poisson and lose the burstiness the row fitted)."""
    for field, value in (("window_start_s", w.start_s), ("rate_rps", w.rate_rps), ("cv", w.cv), ("shape", w.shape),
                         ("scale", w.scale)):
        if not math.isfinite(value) or value < 0:
            raise ServeGenError(f"{where}: {field} must be a finite number >= 0, got {value!r}")
    if w.rate_rps * WINDOW_S > MAX_REQUESTS:  # numpy would try to allocate them all, whatever the limit
        raise ServeGenError(f"{where}: rate_rps {w.rate_rps:g} makes {w.rate_rps * WINDOW_S:,.0f} requests in one "
                            f"{WINDOW_S:.0f} s window; at most {MAX_REQUESTS:,}")
    dist = DISTRIBUTIONS.get(w.dist.lower())
    if dist is None:
        raise ServeGenError(f"{where}: dist {w.dist!r} is not a distribution; allowed: Gamma, Weibull, Exponential "
                            "or empty (Poisson), any case")
    if dist and w.rate_rps > 0 and (w.shape <= 0 or w.scale <= 0):  # drawn as Poisson, its burstiness lost
        raise ServeGenError(f"{where}: a {dist} window needs shape and scale above 0, got {w.shape:g} and {w.scale:g}")
    return w if dist == w.dist else RateWindow(w.start_s, w.rate_rps, w.cv, dist, w.shape, w.scale)


def _read_chunk(text: str, name: str) -> list[RateWindow]:
    rows = []
    for n, line in enumerate(text.lstrip("\ufeff").splitlines(), 1):  # a BOM, whichever way the file was read
        if not line.strip() or (n == 1 and line.strip().replace(" ", "") == CHUNK_HEADER):
            continue
        row = _chunk_row(line)
        if row is None:
            raise ServeGenError(f"{name}:{n}: expected {CHUNK_HEADER}")
        rows.append(_checked(row, f"{name}:{n}"))
    return rows


def read_clients(path: str | Path, model: str | None = None) -> list[list[RateWindow]]:
    """Every client's windows from a chunk CSV, the aggregate CSV (one pseudo-client), a folder or a tar.gz."""
    p = Path(path)
    if not p.exists():
        raise ServeGenError(f"rate file {p} does not exist")
    if p.is_dir():
        # ServeGen's own layout, CATEGORY/MODEL/chunk-N-trace.csv, or a part of it, or the archive's extracted top
        # folder above it: never deeper (a search of the whole tree took test fixtures of unrelated checkouts under
        # /tmp for one model's clients)
        found = [f for depth in ("", "*/", "*/*/", "*/*/*/") for f in p.glob(depth + "chunk-*-trace.csv")]
        # named with the folder's own two last parts: a MODEL folder's files are that model's (`--trace-model
        # deepseek-r1` on reason/deepseek-r1/ was refused as unknown, with nothing allowed)
        own = Path(*p.resolve().parts[-2:])
        files = {str(own / f.relative_to(p)): _text(f.read_bytes(), f) for f in sorted(found)}
        return _select(files, model, p)
    if p.name.endswith((".tar.gz", ".tgz")):
        try:
            with tarfile.open(p) as tar:
                files = {m.name: _text(tar.extractfile(m).read(), f"{p}:{m.name}") for m in tar.getmembers()
                         if m.isfile() and m.name.endswith("-trace.csv")}
        except (tarfile.TarError, EOFError, OSError) as exc:  # a cut download, a gzipped JSONL of that name
            why = str(exc).splitlines()[0].rstrip(":") if str(exc) else type(exc).__name__
            raise ServeGenError(f"{p} is not a readable tar archive ({why}); ServeGen's rate files come as a "
                                ".tar.gz of CATEGORY/MODEL/chunk-N-trace.csv") from None
        return _select(files, model, p)
    text = _text(p.read_bytes(), p)
    if text.startswith("model,window_start_s"):
        return [_aggregate(text, model, p)]
    return [_read_chunk(text, str(p))]


def _text(data: bytes, name) -> str:
    """A rate file's text (a byte-order mark is not part of the first row); not UTF-8 names where."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ServeGenError(f"{name}:{line}: not UTF-8 text ({exc.reason})") from None


def _model_of(name: str) -> str:
    parts = Path(name).parts
    return "/".join(parts[-3:-1]) if len(parts) >= 3 else (parts[-2] if len(parts) == 2 else "")


def _select(files: dict[str, str], model: str | None, p: Path) -> list[list[RateWindow]]:
    models = sorted({_model_of(n) for n in files})
    if not files:
        raise ServeGenError(f"{p} is a folder without ServeGen rate files (chunk-*-trace.csv, at most three "
                            "folders down: TOP/CATEGORY/MODEL/); a trace is a file: Mooncake JSONL, Azure CSV, a "
                            "prompt log, or a ServeGen folder or .tar.gz")
    if model is None and len(models) > 1:
        raise ServeGenError(f"{p} holds several models: {CHOOSE_MODEL}; allowed: {', '.join(models)}", "model")
    wanted = [n for n in files if model is None or _model_of(n) == model or _model_of(n).endswith("/" + model)]
    if not wanted:
        raise ServeGenError(f"unknown ServeGen model {model!r}; allowed: {', '.join(models)}", "model")
    return [_read_chunk(files[n], n) for n in sorted(wanted)]


def _aggregate(text: str, model: str | None, p: Path) -> list[RateWindow]:
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:  # it had blamed a --model nobody gave ("unknown ServeGen model None")
        raise ServeGenError(f"{p}: no rows after the header; expected model,window_start_s,total_rate_rps,"
                            "active_clients")
    models = sorted({r["model"] for r in rows})
    if model is None and len(models) > 1:
        raise ServeGenError(f"{p} holds several models: {CHOOSE_MODEL}; allowed: {', '.join(models)}", "model")
    chosen = [(n, r) for n, r in enumerate(rows, 2)
              if model is None or r["model"] == model or r["model"].endswith("/" + str(model))]
    if not chosen:
        raise ServeGenError(f"unknown ServeGen model {model!r}; allowed: {', '.join(models)}", "model")
    out = []
    for n, r in chosen:
        try:
            w = RateWindow(float(r["window_start_s"]), float(r["total_rate_rps"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ServeGenError(f"{p}:{n}: bad aggregate row ({exc}); expected model,window_start_s,"
                                "total_rate_rps,active_clients") from None
        out.append(_checked(w, f"{p}:{n}"))
    return out


def window_arrivals(w: RateWindow, rng: np.random.Generator, window_s: float = WINDOW_S,
                    ceil_count: bool = True) -> np.ndarray:
    """Arrival times (absolute seconds) of one client in one window. A Gamma or Weibull window has ServeGen's
    count, rate x window rounded up; `ceil_count` False rounds it at random to the same mean (a rate-scaled file:
    rounded up, every busy window of every client kept at least one request, and 0.001 x of a chunk file was 95
    requests where 14 were due)."""
    if w.rate_rps <= 0:
        return np.empty(0)
    if w.dist not in ("Gamma", "Weibull") or w.shape <= 0 or w.scale <= 0:
        n = rng.poisson(w.rate_rps * window_s)
        return w.start_s + np.sort(rng.random(n)) * window_s
    due = w.rate_rps * window_s
    n = math.ceil(due) if ceil_count else math.floor(due) + int(rng.random() < due - math.floor(due))
    if n == 0:
        return np.empty(0)
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
                  output_tokens: int = DEFAULT_OUTPUT_TOKENS, rate_scale: float = 1.0) -> list[TraceRequest]:
    """The requests of `duration_s` seconds of the rate file from `start_s`, or from the first window after it
    with a rate above 0 (a file whose windows begin at 43,200 s replays from there: the hours before it hold no
    requests, and a fleet simulated through them would be paid for doing nothing); times counted from there.
    `rate_scale` multiplies every window's rate before arrivals are drawn: 0.001 x of a 14-day file of 237
    million requests is 237,000 of them (it had been refused for its size before the thinning, and `--limit`,
    the way out it named, kept the first 25 seconds)."""
    if not (math.isfinite(rate_scale) and rate_scale > 0):
        raise ServeGenError(f"rate scale {rate_scale!r}: it must be a number above 0", "rate_scale")
    clients = read_clients(path, model)
    if rate_scale != 1.0:
        clients = [[replace(w, rate_rps=w.rate_rps * rate_scale) for w in c] for c in clients]
        for c in clients:  # one window's arrivals are drawn at once, whatever the limit: bounded as `_checked` does
            for w in c:
                if w.rate_rps * WINDOW_S > MAX_REQUESTS:
                    raise ServeGenError(f"a rate scale of {rate_scale:g} makes {w.rate_rps * WINDOW_S:,.0f} requests "
                                        f"in one {WINDOW_S:.0f} s window of {path}; at most {MAX_REQUESTS:,}",
                                        "rate_scale")
    busy = [w.start_s for c in clients for w in c if w.start_s > start_s - WINDOW_S and w.rate_rps > 0]
    if not busy:
        why = f"no window from {start_s:g} s on has a rate above 0" if start_s > 0 else "every window's rate is 0"
        raise ServeGenError(f"{path}: no requests: {why}")
    origin = max(start_s, min(busy))
    end = math.inf if duration_s is None else origin + duration_s
    starts = sorted({w.start_s for c in clients for w in c if origin - WINDOW_S < w.start_s < end})
    if limit is None and duration_s is None:
        expected = sum(w.rate_rps * WINDOW_S for c in clients for w in c if w.start_s > start_s - WINDOW_S)
        if expected > MAX_REQUESTS:
            scaled = f" at {rate_scale:g} x its rates" if rate_scale != 1.0 else ""
            raise ServeGenError(f"{path}: about {expected:,.0f} requests{scaled}; give a smaller rate scale, or a "
                                f"limit (--limit; `trace scale` also takes --duration), at most {MAX_REQUESTS:,} "
                                "without one")
    by_start: list[dict[float, RateWindow]] = [{w.start_s: w for w in c} for c in clients]
    rng = np.random.default_rng(seed)
    out: list[TraceRequest] = []
    for ws in starts:
        times = [window_arrivals(c[ws], rng, ceil_count=rate_scale == 1.0) for c in by_start if ws in c]
        merged = np.sort(np.concatenate(times)) if times else np.empty(0)
        merged = merged[(merged >= origin) & (merged < end)]
        for t in merged:
            out.append(TraceRequest(float(t - origin), input_tokens, output_tokens))
            if limit is not None and len(out) >= limit:
                return out
    if not out and rate_scale != 1.0:
        raise ServeGenError(f"a rate scale of {rate_scale:g} leaves none of {path}'s requests; use a larger factor",
                            "rate_scale")
    return out

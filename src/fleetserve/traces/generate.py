"""Workload generators: who sends what, when. Deterministic by seed.

A workload is an arrival process (`arrivals.py`) and a content model:

- independent: every prompt is new (no reuse; the control case);
- chat: multi-turn sessions; each turn resends the whole conversation (system prompt, earlier user turns and
  the assistant's answers) plus a new user message, after a think time;
- system-prompt: a few long system prompts shared by many users (Zipf popularity), each with its own question;
- rag: retrieved documents (Zipf popularity, `docs_per_request` of them, most relevant first) after a shared
  instruction, then the user's question.

A prompt is a list of segments (a system prompt, a document, a user turn); a segment id always stands for
the same text, so equal segment sequences are equal prefixes. Each request carries both forms the project
reads: Mooncake-style `hash_ids` (512-token blocks; a block's id is shared exactly when the whole prefix up to
its end is) and chat `messages` whose text is built from the same segments (one common English word per
token for BPE tokenizers), so one generation can be written as a hash trace or as a prompt log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from fleetserve.traces import arrivals as arrival_processes
from fleetserve.traces.model import MAX_SPAN_S, MOONCAKE_BLOCK_TOKENS, TraceRequest, check_request_count

CONTENTS = ("independent", "chat", "system-prompt", "rag")
# KIND (the CLI's word) -> the arrival process and content model it stands for
KINDS = {
    "diurnal": ("diurnal", "independent"),
    "bursts": ("bursts", "independent"),
    "chat": ("poisson", "chat"),
    "system-prompt": ("poisson", "system-prompt"),
    "rag": ("poisson", "rag"),
}

_WORDS = (
    "the of and to in is was for on that with as by at from it an be this are or his which were has have had not "
    "but they their one all there been can more its who also new first two after time other some would when "
    "only into these may most over such than under years between many state system city world school during "
    "year people three both well while where part used early known since later work number each under because "
    "through name before same group water place around still small large high long several local second "
    "however found form area house began public family great common order power game river music point line "
    "light paper market report model service energy value data table field route cache block token queue"
).split()


@dataclass(frozen=True)
class WorkloadSpec:
    """Every knob of a generated workload; the defaults are a small, realistic chat-sized service."""

    arrivals: str = "poisson"  # poisson, diurnal, bursts
    content: str = "independent"  # independent, chat, system-prompt, rag
    duration_s: float = 600.0
    rate: float = 2.0  # mean requests per second
    seed: int = 0
    input_tokens: int = 512  # mean new tokens per request (independent prompts, user turns, questions)
    output_tokens: int = 128  # mean output tokens
    # diurnal
    period_s: float = 86400.0
    peak_to_trough: float = 3.0
    peak_at_s: float | None = None  # None: 14:00 of the clock the trace is replayed on (arrivals.default_peak_s)
    # bursts
    burst_factor: float = 8.0
    burst_every_s: float = 300.0
    burst_s: float = 20.0
    # chat
    turns: float = 4.0  # mean turns per session (geometric)
    think_s: float = 20.0  # mean think time between turns (exponential)
    system_tokens: int = 1024  # chat and system-prompt: system prompt length
    # system-prompt
    system_prompts: int = 8
    # rag
    documents: int = 200
    doc_tokens: int = 1024
    docs_per_request: int = 3
    zipf: float = 1.1  # popularity skew of system prompts and documents

    @classmethod
    def for_kind(cls, kind: str, **overrides) -> WorkloadSpec:
        if kind not in KINDS:
            raise ValueError(f"unknown workload kind {kind!r}; allowed: {', '.join(KINDS)}")
        process, content = KINDS[kind]
        given = {k: v for k, v in overrides.items() if v is not None}
        unknown = set(given) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown workload setting(s) {', '.join(sorted(unknown))}")
        return cls(**{"arrivals": process, "content": content, **given})

    def check(self) -> None:
        """Refuse, before any work, what cannot be built: each knob within its bound, and the requests built and
        the prompt tokens they carry within what a trace holds (chat builds its warm-up's sessions too). Before,
        `--turns 10000` ran for minutes into 8 GB, and `--input-tokens 100000000` failed only after 43 s."""
        if self.arrivals not in arrival_processes.ARRIVALS:
            raise ValueError(f"unknown arrival process {self.arrivals!r}; allowed: "
                             f"{', '.join(arrival_processes.ARRIVALS)}")
        if self.content not in CONTENTS:
            raise ValueError(f"unknown content model {self.content!r}; allowed: {', '.join(CONTENTS)}")
        for name in ("duration_s", "rate", "input_tokens", "output_tokens", "turns", "system_prompts", "documents",
                     "doc_tokens", "docs_per_request", "period_s", "peak_to_trough", "burst_factor",
                     "burst_every_s", "burst_s"):
            if not getattr(self, name) > 0:
                raise WorkloadError(name, f"must be positive, got {getattr(self, name)!r}")
        if self.duration_s > MAX_SPAN_S:  # every reader refuses a longer trace: write none
            raise WorkloadError("duration_s", f"must be at most {MAX_SPAN_S:,.0f} s (366 days, what a trace may "
                                f"span), got {self.duration_s:,.0f}")
        for name, most in KNOB_LIMITS.items():
            if getattr(self, name) > most:
                raise WorkloadError(name, f"must be at most {most:,}, got {getattr(self, name):,}")
        warmup = chat_warmup_s(self) if self.content == "chat" else 0.0
        drawn = self.burst_factor if self.arrivals == "bursts" else 1.0  # thinning draws at the burst's rate
        # the trace itself first (--duration/--rate), then chat's warm-up (built, then dropped: work without a
        # request to show for it): a warm-up too long is blamed on --think/--turns, not on a small --duration
        # and --rate, and a --rate too high on itself, not on the default --think
        bursts = f" (drawn at the bursts' {self.burst_factor:g} x)" if drawn > 1 else ""
        try:
            check_request_count(self.duration_s * self.rate * drawn,
                                f"{self.duration_s:g} s at {self.rate:g} requests/s{bursts}")
        except ValueError as exc:
            raise WorkloadError(None, str(exc)) from None
        if warmup * self.rate > MAX_WARMUP_REQUESTS:
            raise WorkloadError("think_s", f"x --turns makes chat's warm-up {warmup:,.0f} s long (turns x think x "
                                f"ln 100), about {warmup * self.rate:,.0f} requests built before the trace starts; "
                                f"at most {MAX_WARMUP_REQUESTS:,}: lower --think or --turns")
        what = f"{self.duration_s:g} s at {self.rate:g} requests/s"
        if warmup:
            what += f" (and chat's warm-up of turns x think x ln 100 = {warmup:,.0f} s before it)"
        what += bursts
        try:
            check_request_count((self.duration_s + warmup) * self.rate * drawn, what)
        except ValueError as exc:
            raise WorkloadError(None, str(exc)) from None
        tokens = self.duration_s * self.rate * self.mean_prompt_tokens()
        if tokens > MAX_TRACE_TOKENS:
            raise WorkloadError(None, f"{what} of about {self.mean_prompt_tokens():,.0f} prompt tokens each "
                                f"would carry {tokens:,.0f} tokens; at most {MAX_TRACE_TOKENS:,}: lower the rate, "
                                "the duration or the prompt sizes")

    def mean_prompt_tokens(self) -> float:
        """About how long a prompt of this workload is on average (chat: its history grows with every turn)."""
        if self.content == "chat":
            return self.system_tokens + (self.turns + 1) / 2 * (self.input_tokens + self.output_tokens)
        if self.content == "system-prompt":
            return self.system_tokens + self.input_tokens
        if self.content == "rag":
            return 64 + min(self.docs_per_request, self.documents) * self.doc_tokens + self.input_tokens
        return self.input_tokens


class WorkloadError(ValueError):
    """A workload setting that cannot be built; `option` is the command-line option that sets it (the size of the
    whole workload: --duration/--rate)."""

    def __init__(self, field: str | None, message: str):
        if field is None:
            self.option = "--duration/--rate"
            super().__init__(message)
        else:
            self.option = "--" + OPTION_NAMES.get(field, field).replace("_", "-")
            super().__init__(f"{self.option} {message}")


# the command-line option of each workload field (trace generate)
OPTION_NAMES = {"duration_s": "duration", "think_s": "think", "period_s": "period", "burst_every_s": "burst-every",
                "burst_s": "burst-length"}
# each knob's most: a prompt's tokens as the trace loader's MAX_TOKENS, chat sessions of at most a thousand turns
# on average, corpora of at most 100,000 prompts or documents, bursts of at most 1,000 x the base rate
KNOB_LIMITS = {"input_tokens": 1 << 24, "output_tokens": 1 << 24, "system_tokens": 1 << 24, "doc_tokens": 1 << 24,
               "turns": 1000, "system_prompts": 100_000, "documents": 100_000, "docs_per_request": 1000,
               "burst_factor": 1000}
MAX_WARMUP_REQUESTS = 500_000  # chat prompts built before zero (seconds of work; none of them is kept)
MAX_TRACE_TOKENS = 4_000_000_000  # about 8 M hash ids of 512 tokens: seconds of work, a GB or two
MAX_TEXT_TOKENS = 50_000_000  # as prompt text (about 7 bytes a token): about 350 MB of file


@dataclass(frozen=True)
class _Prompt:
    arrival_s: float
    messages: tuple[tuple[str, tuple[int, ...]], ...]  # (role, segment ids)
    output_tokens: int
    session: str | None = None


class _Segments:
    """Segment ids -> token lengths; text on demand, the same for the same id."""

    def __init__(self, seed: int):
        self.seed = seed
        self.lengths: list[int] = []

    def new(self, tokens: int) -> int:
        self.lengths.append(max(1, int(tokens)))
        return len(self.lengths) - 1

    def text(self, sid: int) -> str:
        rng = np.random.default_rng([self.seed, sid])
        return " ".join(_WORDS[i] for i in rng.integers(0, len(_WORDS), self.lengths[sid]))


def _lognormal(rng: np.random.Generator, mean: float, n: int | None = None, sigma: float = 0.6):
    """Lengths with the given mean and a realistic right tail."""
    return np.maximum(1, rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, n)).astype(int)


def _zipf_choice(rng: np.random.Generator, n: int, s: float, size: int):
    """`size` independent picks of 0..n-1, rank r with probability proportional to 1/(r+1)^s."""
    weights = 1.0 / np.arange(1, n + 1) ** s
    return rng.choice(n, size=size, p=weights / weights.sum())


def generate(spec: WorkloadSpec, with_text: bool = True) -> list[TraceRequest]:
    """The workload's requests in arrival order (same spec, same requests). Without text only lengths and
    hash ids are filled in (a day of traffic as text is gigabytes)."""
    spec.check()
    if with_text and spec.duration_s * spec.rate * spec.mean_prompt_tokens() > MAX_TEXT_TOKENS:
        raise WorkloadError(None, f"about {spec.duration_s * spec.rate * spec.mean_prompt_tokens():,.0f} prompt "
                            f"tokens as text (about 7 bytes each); at most {MAX_TEXT_TOKENS:,} in a prompt log: "
                            "lower the rate, the duration or the prompt sizes, or write hash ids (--format "
                            "mooncake)")
    rng = np.random.default_rng(spec.seed)
    segs = _Segments(spec.seed)
    options = {}
    if spec.arrivals == "diurnal":
        options = {"period_s": spec.period_s, "peak_to_trough": spec.peak_to_trough, "peak_at_s": spec.peak_at_s}
    elif spec.arrivals == "bursts":
        options = {"factor": spec.burst_factor, "every_s": spec.burst_every_s, "burst_s": spec.burst_s}
    rate = spec.rate / spec.turns if spec.content == "chat" else spec.rate  # chat: sessions start at rate/turns
    warmup = chat_warmup_s(spec) if spec.content == "chat" else 0.0
    if "peak_at_s" in options:
        peak = arrival_processes.default_peak_s(spec.period_s) if spec.peak_at_s is None else spec.peak_at_s
        options["peak_at_s"] = peak + warmup  # the day's curve keeps its phase on the trace's own clock
    times = arrival_processes.arrivals(spec.arrivals, rate, spec.duration_s + warmup, rng, **options) - warmup
    prompts = {"independent": _independent, "chat": _chat, "system-prompt": _system_prompt, "rag": _rag}[
        spec.content](spec, times, rng, segs)
    prompts = sorted((p for p in prompts if 0 <= p.arrival_s < spec.duration_s), key=lambda p: p.arrival_s)
    return _to_requests(prompts, segs, with_text)


def chat_warmup_s(spec: WorkloadSpec) -> float:
    """How long before the trace's start chat sessions begin, so that its first minutes carry `rate` requests per
    second as the rest does: sessions started only from zero ramped up for a session's length, and a 300 s trace
    at --rate 2 carried 1.5 (26 % short). A session's span after its first turn is exponential with mean
    think x turns when it has more than one turn (a geometric sum of exponential think times); starting them that
    long x ln(100) earlier leaves fewer than 1 % of the sessions alive at zero that have not begun yet."""
    return spec.think_s * spec.turns * math.log(100)


def _independent(spec, times, rng, segs):
    ins, outs = _lognormal(rng, spec.input_tokens, len(times)), _lognormal(rng, spec.output_tokens, len(times))
    return [_Prompt(float(t), (("user", (segs.new(i),)),), int(o)) for t, i, o in zip(times, ins, outs, strict=True)]


def _chat(spec, times, rng, segs):
    system = segs.new(spec.system_tokens)
    out = []
    for n, start in enumerate(times):
        turns = int(rng.geometric(1.0 / spec.turns))
        history: list[tuple[str, tuple[int, ...]]] = [("system", (system,))]
        t = float(start)
        for _ in range(turns):
            history.append(("user", (segs.new(_lognormal(rng, spec.input_tokens)),)))
            output = int(_lognormal(rng, spec.output_tokens))
            reply = segs.new(output)
            out.append(_Prompt(t, tuple(history), output, session=f"chat-{spec.seed}-{n}"))
            history.append(("assistant", (reply,)))
            t += float(rng.exponential(spec.think_s)) + 0.001
    return out


def _system_prompt(spec, times, rng, segs):
    systems = [segs.new(spec.system_tokens) for _ in range(spec.system_prompts)]
    picks = _zipf_choice(rng, spec.system_prompts, spec.zipf, len(times))
    ins, outs = _lognormal(rng, spec.input_tokens, len(times)), _lognormal(rng, spec.output_tokens, len(times))
    return [_Prompt(float(t), (("system", (systems[k],)), ("user", (segs.new(i),))), int(o))
            for t, k, i, o in zip(times, picks, ins, outs, strict=True)]


def _rag(spec, times, rng, segs):
    instruction = segs.new(64)
    docs = [segs.new(spec.doc_tokens) for _ in range(spec.documents)]
    k = min(spec.docs_per_request, spec.documents)
    weights = 1.0 / np.arange(1, spec.documents + 1) ** spec.zipf
    weights /= weights.sum()
    out = []
    for t in times:
        picked = rng.choice(spec.documents, size=k, replace=False, p=weights)  # in order of relevance
        question = segs.new(_lognormal(rng, spec.input_tokens))
        out.append(_Prompt(float(t), (("system", (instruction,)),
                                      ("user", (*(docs[d] for d in picked), question))),
                           int(_lognormal(rng, spec.output_tokens))))
    return out


def _to_requests(prompts: list[_Prompt], segs: _Segments, with_text: bool) -> list[TraceRequest]:
    ids: dict[tuple, int] = {}
    texts: dict[int, str] = {}

    def text(sid: int) -> str:
        if sid not in texts:
            texts[sid] = segs.text(sid)
        return texts[sid]

    out = []
    for p in prompts:
        flat = [sid for _, group in p.messages for sid in group]
        total = sum(segs.lengths[s] for s in flat)
        out.append(TraceRequest(
            arrival_s=round(p.arrival_s, 3), input_tokens=total, output_tokens=p.output_tokens,
            hash_ids=_block_ids(flat, segs.lengths, total, ids), session=p.session,
            messages=tuple({"role": role, "content": "\n\n".join(text(s) for s in group)}
                           for role, group in p.messages) if with_text else None))
    return out


def _block_ids(flat: list[int], lengths: list[int], total: int, ids: dict[tuple, int]) -> tuple[int, ...]:
    """Mooncake-style ids: block i's identity is (its end, the segments that cover tokens up to its end)."""
    out = []
    covered: list[int] = []
    pos = 0  # tokens covered by `covered`
    it = iter(flat)
    for start in range(0, total, MOONCAKE_BLOCK_TOKENS):
        end = min(start + MOONCAKE_BLOCK_TOKENS, total)
        while pos < end:
            sid = next(it)
            covered.append(sid)
            pos += lengths[sid]
        key = (end, tuple(covered))
        out.append(ids.setdefault(key, len(ids)))
    return tuple(out)

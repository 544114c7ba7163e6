"""Trace loaders. Formats:

- Mooncake JSONL: {"timestamp": ms, "input_length", "output_length", "hash_ids": [...]} (512 tokens per id);
- Qwen Bailian JSONL (Alibaba's anonymized traces, `qwen_*_blksz_16.jsonl`): {"chat_id", "parent_chat_id",
  "timestamp": s, "input_length", "output_length", "type", "turn", "hash_ids": [...]} (16 tokens per id),
  read as Mooncake blocks of 512 tokens with each conversation as a session;
- Azure CSV: TIMESTAMP,ContextTokens,GeneratedTokens (wall-clock timestamps; no prefixes);
- BurstGPT CSV: Timestamp,Model,Request tokens,Response tokens,... (seconds from the start; no prefixes);
- prompt logs (ours): JSONL {"timestamp": s, "messages": [...] | "prompt": "...", "max_tokens", "session"};
- ServeGen rate files (arrivals only): a per-client chunk CSV, the aggregate CSV, a folder or the .tar.gz
  (see `servegen.py`; options `model`, `seed`, `start_s`, `duration_s`, `input_tokens`, `output_tokens`).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import zlib
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

from fleetserve.api.errors import APIError
from fleetserve.api.protocol import parse_chat
from fleetserve.input_file import not_a_file
from fleetserve.traces.model import MOONCAKE_BLOCK_TOKENS, TraceRequest, check_span, stand_in_words
from fleetserve.traces.servegen import ServeGenError, is_servegen, load_servegen

FORMATS = ("mooncake", "bailian", "azure", "burstgpt", "prompts", "servegen")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the line. `param`: the loader's parameter at fault
    (`model`, `duration_s`, ...), when it is one and not the file."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


GZIP_MAGIC = b"\x1f\x8b"


def _is_gzip(p: Path) -> bool:
    with open(p, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def _binary(p: Path):
    """The file's bytes, decompressed when it is gzip (public traces are often published as .jsonl.gz / .csv.gz)."""
    return gzip.open(p, "rb") if _is_gzip(p) else open(p, "rb")


MAX_LINE_CHARS = 1 << 26  # a trace line's most (64 Mi characters): /dev/zero, or a binary file, is one endless line


def _text_lines(p: Path):
    """(line number, text) of a UTF-8 file, or of a gzip-compressed one (a BOM, as spreadsheet tools write it, is
    dropped; any line end). A line longer than MAX_LINE_CHARS is an error, not a read of all memory."""
    try:
        with io.TextIOWrapper(_binary(p), encoding="utf-8-sig") as f:
            n = 0
            while line := f.readline(MAX_LINE_CHARS + 1):
                n += 1
                if len(line) > MAX_LINE_CHARS:
                    raise TraceError(f"{p}:{n}: a line of more than {MAX_LINE_CHARS} characters; no trace row is "
                                     "that long (a binary file?)")
                yield n, line
    except UnicodeDecodeError as exc:
        raise TraceError(f"{_bad_byte(p)}: not UTF-8 text ({exc.reason})") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise TraceError(f"{p}: a gzip file that cannot be decompressed ({exc or 'cut short'})") from None


def _bad_byte(p: Path) -> str:
    """Where the first byte that is not UTF-8 is, as FILE:LINE (the decoder's offset is into its read buffer)."""
    with _binary(p) as f:
        for n, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return f"{p}:{n} (byte {exc.start + 1} of the line)"
    return str(p)


def _first_text(p: Path) -> str:
    """The first non-blank line, stripped ('' for an empty file)."""
    for _, line in _text_lines(p):
        if line.strip():
            return line.strip()
    return ""


def check_trace_path(p: Path, fmt: str | None = None) -> None:
    """A trace is a regular file (or a ServeGen folder): /dev/zero had been read to a MemoryError."""
    what = not_a_file(p)
    if what is not None and not (p.is_dir() and fmt in (None, "servegen")):
        raise TraceError(f"trace file {p} {'is a directory, not a trace file' if p.is_dir() else what}")


def detect_format(path: Path) -> str:
    """By content first, the name second: a CSV written under a .jsonl name (or JSON lines under .csv) is read as
    what it holds."""
    check_trace_path(path)
    if is_servegen(path):  # every folder is one: what is left is a regular file
        return "servegen"
    first = _first_text(path)
    if first.startswith("{"):
        pass  # JSON lines: Mooncake or a prompt log, told apart below
    elif _is_burstgpt(first):
        return "burstgpt"
    elif path.suffix == ".csv" or ("timestamp" in first.lower() and "contexttokens" in first.lower().replace(" ", "")):
        return "azure"
    n, first = next(_rows(path, None), (0, {}))
    if not n:
        raise TraceError(f"{path}: the file holds no request")
    if "input_length" in first and ("parent_chat_id" in first or "chat_id" in first):
        return "bailian"
    if "hash_ids" in first or "input_length" in first:
        return "mooncake"
    if "messages" in first or "prompt" in first:
        return "prompts"
    raise TraceError(f"{path}:{n or 1}: cannot tell the trace format from the first request; expected Mooncake "
                     "(input_length, hash_ids), a prompt log (messages or prompt), or an Azure or BurstGPT .csv")


class TraceRead(NamedTuple):
    """A trace as read: its requests, the wall time of the earliest when the file says it, and what the figures
    made from it do not show (rows left out, values assumed): every command that reads a trace says `notes`."""

    requests: list[TraceRequest]
    start: datetime | None
    notes: tuple[str, ...]


def load_trace(path: str | Path, limit: int | None = None, fmt: str | None = None, **options) -> list[TraceRequest]:
    """Requests in arrival order, the earliest at 0 s (traces with epoch timestamps, or rows out of order, replay
    as they happened). `options` go to the ServeGen loader (the other formats take none)."""
    return read_trace(path, limit, fmt, **options).requests


def load_timed_trace(path: str | Path, limit: int | None = None, fmt: str | None = None,
                     **options) -> tuple[list[TraceRequest], datetime | None]:
    """`load_trace`'s requests and the wall time (UTC) of the earliest when the file says it (Azure CSV stamps;
    stamps without an offset are read as UTC), else None: Mooncake and prompt logs count from their own zero."""
    read = read_trace(path, limit, fmt, **options)
    return read.requests, read.start


def read_trace(path: str | Path, limit: int | None = None, fmt: str | None = None, **options) -> TraceRead:
    """`load_timed_trace`'s requests and start, with the trace's notes (`TraceRead`)."""
    p = Path(path)
    check_trace_path(p, fmt)
    if fmt is not None and fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; allowed: {', '.join(FORMATS)}")
    fmt = fmt or detect_format(p)
    start = None
    notes: list[str] = []
    if fmt == "servegen":
        try:
            out = load_servegen(p, limit=limit, **options)
        except ServeGenError as exc:
            raise TraceError(str(exc), exc.param) from None
    else:
        if options:
            raise TraceError(f"{', '.join(sorted(options))} apply to ServeGen rate files only; {p.name} is a {fmt} "
                             "trace", sorted(options)[0])
        if fmt == "azure":
            rows = _azure_rows(p, limit, notes)
            start = min((t for t, _, _ in rows), default=None)
            out = [TraceRequest((t - start).total_seconds(), c, g) for t, c, g in rows]
            start = start.replace(tzinfo=UTC) if start is not None else None
        else:
            out = {"mooncake": _mooncake, "bailian": _bailian, "prompts": _prompts, "burstgpt": _burstgpt}[fmt](
                p, limit, notes)
        out = _rebased(out)
    if not out:
        raise TraceError(f"{p}: no requests" + (f" ({notes[0]})" if notes else ""))
    try:
        check_span(out[-1].arrival_s, str(p))
    except ValueError as exc:
        raise TraceError(str(exc)) from None
    if (unit := millisecond_warning(out, fmt)) is not None:
        notes.append(unit)
    if fmt in ("mooncake", "bailian") and (bare := sum(1 for r in out if not r.hash_ids)):
        notes.append(f"{bare} of {_count_of(len(out), 'request')} carry no hash_ids: their prompts are counted as "
                     "blocks no other request shares (all misses)" if bare < len(out) else
                     f"no request carries hash_ids ({_count_of(len(out), 'request')}): no prompt shares a block with "
                     "another, so every hit rate is 0")
    return TraceRead(out, start, tuple(notes))


def _rebased(requests: list[TraceRequest]) -> list[TraceRequest]:
    if not requests:
        return requests
    ordered = sorted(requests, key=lambda r: r.arrival_s)  # stable: rows of one instant keep their order
    origin = ordered[0].arrival_s
    if origin == 0 and ordered == requests:
        return requests
    return [replace(r, arrival_s=r.arrival_s - origin) for r in ordered]


def _rows(p: Path, limit: int | None):
    """(line, object) of a JSON-lines file, blank lines skipped; each line must hold a JSON object. `limit`
    counts requests, as the Azure reader does, not lines (two blank lines first had left one request of three)."""
    taken = 0
    for n, line in _text_lines(p):
        if limit is not None and taken >= limit:
            return
        if line.strip():
            taken += 1
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{p}:{n}: not JSON ({exc})") from None
            if not isinstance(row, dict):
                raise TraceError(f"{p}:{n}: expected a JSON object, got {type(row).__name__}")
            yield n, row


COMPLETION_DEFAULT_MAX_TOKENS = 16  # a prompt-log completion without max_tokens (as engine/server.py answers it)
CHAT_DEFAULT_MAX_TOKENS = 64  # a prompt-log chat without one: a typical answer's length, as the log cannot say
MAX_TOKENS = 1 << 24  # per request and field: more is a corrupt row, and would keep a simulated engine busy forever


def _number(row: dict, key: str, where: str, default: float | None = None) -> float:
    value = row.get(key)
    if value is None:
        value = default
    if value is None:
        raise TraceError(f"{where}: {key} is missing (a finite number)")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TraceError(f"{where}: {key} must be a finite number, got {value!r}")
    return value


def _session(row: dict, where: str) -> str | None:
    """The row's session key as text: a whole number is one (session 0 fell out as "no key" where a test of truth
    read it, and `bench replay` crashed on it); an empty one is none; a list, an object or a boolean is refused,
    as the session policy would route it with no key under session's name."""
    value = row.get("session")
    if value is None or value == "":  # an empty field is a log's "no session", as common as a missing one
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise TraceError(f"{where}: session must be a string or a whole number, got {json.dumps(value)}")
    return value


def _count(row: dict, key: str, where: str, default: int | None = None, least: int = 0) -> int:
    value = row.get(key)
    if value is None:
        value = default
    if value is None:
        raise TraceError(f"{where}: {key} is missing (a whole number from {least} to {MAX_TOKENS})")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value) or not least <= value <= MAX_TOKENS:
        raise TraceError(f"{where}: {key} must be a whole number from {least} to {MAX_TOKENS}, got {value!r}")
    return int(value)


def _mooncake(p: Path, limit: int | None, notes: list[str]) -> list[TraceRequest]:
    out = []
    parents: dict = {}  # id -> the id before it (None: first in its prompt)
    empty = _EmptyPrompts(p, "input_length")
    for n, row in _rows(p, None):
        if limit is not None and len(out) >= limit:  # requests kept, not rows read (an empty prompt is left out)
            break
        where = f"{p}:{n}"
        hash_ids = row.get("hash_ids")
        hash_ids = () if hash_ids is None else hash_ids  # `0`, `""`, `false` are no list either: refused below
        if not isinstance(hash_ids, (list, tuple)) or not all(isinstance(h, int) and not isinstance(h, bool)
                                                     for h in hash_ids):
            raise TraceError(f"{where}: hash_ids must be a list of integers")
        if any(h < 0 for h in hash_ids):  # Mooncake's ids count up from 0; rate scaling offsets copies past the
            # largest, which a negative id's copy could land on (an id of another block)
            raise TraceError(f"{where}: hash_ids must be integers of 0 or more, got {min(hash_ids)}")
        length = _count(row, "input_length", where)
        arrival, output, session = _number(row, "timestamp", where) / 1000.0, _count(row, "output_length", where), \
            _session(row, where)  # a row left out is still checked whole
        if not hash_ids and empty.skip(n, length):
            continue
        blocks = -(-length // MOONCAKE_BLOCK_TOKENS)
        if hash_ids and len(hash_ids) != blocks:  # the ids stand for the prompt's blocks: else hit rates past the
            # ideal (5,000 tokens under one id) or none at all (10 tokens under 100 ids)
            per = length / len(hash_ids)
            hint = (f"; these ids stand for ~{per:.0f} tokens each: a trace hashed with another block size "
                    "must be re-hashed in 512-token blocks" if len(hash_ids) > blocks else "")
            raise TraceError(f"{where}: hash_ids has {_count_of(len(hash_ids), 'id')}, but input_length {length} is "
                             f"{_count_of(blocks, 'Mooncake block')} of {MOONCAKE_BLOCK_TOKENS} tokens "
                             f"(one id per block){hint}")
        _check_chain(hash_ids, parents, where)
        out.append(TraceRequest(arrival, length, output, tuple(hash_ids), session=session))
    empty.note(notes)
    return out


BAILIAN_BLOCK_TOKENS = 16  # tokens per hash id in Alibaba's Qwen Bailian traces (`..._blksz_16.jsonl`)


def _bailian(p: Path, limit: int | None, notes: list[str]) -> list[TraceRequest]:
    """Alibaba's Qwen Bailian traces: seconds, 16-token hash ids, conversations linked by `parent_chat_id`.

    The ids become Mooncake's 512-token blocks, each named by the whole prefix up to its end (32 of the trace's
    ids after the block before): two prompts share a block exactly when their first 512 x k tokens hash alike,
    whether or not the trace's own ids are chained. What two prompts share below a 512-token boundary is not
    credited (a conversation's next turn still finds its whole history, less the last partial block). Each
    conversation (a root request, `parent_chat_id` -1, and the turns that follow it) is one session."""
    per = MOONCAKE_BLOCK_TOKENS // BAILIAN_BLOCK_TOKENS
    out = []
    blocks: dict[tuple, int] = {}  # (the block before, this block's ids) -> its Mooncake id
    parents: dict[int, int] = {}  # chat id -> the chat it follows
    chats: list[int | None] = []  # per request kept
    empty = _EmptyPrompts(p, "input_length")
    for n, row in _rows(p, None):
        if limit is not None and len(out) >= limit:  # requests kept, not rows read
            break
        where = f"{p}:{n}"
        ids = row.get("hash_ids")
        ids = [] if ids is None else ids
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise TraceError(f"{where}: hash_ids must be a list of integers")
        length = _count(row, "input_length", where)
        arrival, output = _number(row, "timestamp", where), _count(row, "output_length", where)
        chat, parent = (_chat_id(row, name, where) for name in ("chat_id", "parent_chat_id"))
        if chat is not None and parent is not None and parent >= 0:  # a left-out row still links its turns
            parents[chat] = parent
        if not ids and empty.skip(n, length):
            continue
        whole, partial = length // BAILIAN_BLOCK_TOKENS, -(-length // BAILIAN_BLOCK_TOKENS)
        if ids and len(ids) not in (whole, partial):
            counts = f"{whole} or {partial}" if whole != partial else str(whole)
            raise TraceError(f"{where}: hash_ids has {_count_of(len(ids), 'id')}, but input_length {length} takes "
                             f"{counts} (a Qwen Bailian trace: one id per {BAILIAN_BLOCK_TOKENS}-token block, the "
                             "last partial one with or without its own)")
        chain: list[int] = []
        for start in range(0, len(ids), per):
            key = (chain[-1] if chain else None, tuple(ids[start:start + per]))
            chain.append(blocks.setdefault(key, len(blocks)))
        for _ in range(len(chain), -(-length // MOONCAKE_BLOCK_TOKENS) if ids else 0):
            # the prompt's tail past its last hashed block (ids for whole blocks only): a block of its own
            chain.append(blocks.setdefault((chain[-1] if chain else None, ("tail", n)), len(blocks)))
        chats.append(chat)
        out.append(TraceRequest(arrival, length, output, tuple(chain)))
    empty.note(notes)
    roots = _conversation_roots(parents)
    return [r if chat is None else replace(r, session=f"chat-{roots.get(chat, chat)}")
            for r, chat in zip(out, chats, strict=True)]


def _chat_id(row: dict, name: str, where: str) -> int | None:
    """A chat id: a whole number (-1, or any negative, for no parent), or absent."""
    value = row.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value):
        raise TraceError(f"{where}: {name} must be a whole number (-1 for a conversation's first request), got "
                         f"{json.dumps(value)[:40]}")
    return int(value)


def _conversation_roots(parents: dict[int, int]) -> dict[int, int]:
    """Each chat's first chat, following `parents` whatever the file order (a turn listed before the turn it
    follows joins the same conversation); a parent missing from the file is the root, and a cycle ends where it
    closes."""
    roots: dict[int, int] = {}
    for chat in parents:
        path, node = {}, chat  # a dict keeps the walk's order and answers "seen" at once (a long chain was n^2)
        while node in parents and node not in roots and node not in path:
            path[node] = None
            node = parents[node]
        root = roots.get(node, node)
        for seen in path:
            roots[seen] = root
    return roots


SECONDS_AS_MS_RATE = 500.0  # requests/s, read in Mooncake's milliseconds, above which seconds are the likelier unit


def millisecond_warning(requests: list[TraceRequest], fmt: str) -> str | None:
    """A Mooncake trace whose timestamps were written in seconds still loads (they are numbers), as a rate a
    thousand times the real one: Mooncake's own synthetic trace is 3.9 requests/s, read in seconds 3,900/s,
    and every figure is then that of an overload. Said, not changed: only the writer knows the unit."""
    if fmt != "mooncake" or len(requests) < 20:
        return None
    span = requests[-1].arrival_s - requests[0].arrival_s
    rate = (len(requests) - 1) / span if span > 0 else 0.0
    if rate <= SECONDS_AS_MS_RATE:
        return None
    return (f"{len(requests)} requests in {span:.3g} s is {rate:,.0f} requests/s: Mooncake timestamps are "
            f"milliseconds; if this file's are seconds, convert it with `fleetserve trace scale FILE --time 1000 "
            "-o OUT`")


CHAIN_CHECK_IDS = 2_000_000  # ids whose parent is remembered (~200 MB): later new ids are checked within a prompt


def _check_chain(hash_ids: list, parents: dict, where: str) -> None:
    """A Mooncake id names a block *and everything before it*: an id twice in one prompt, or after two different
    blocks, is not a prefix chain, and hit rates counted on it differ between counters ([1, 1] gave an oracle of
    0.5 over an ideal of 0)."""
    def refuse(block, what: str) -> TraceError:
        return TraceError(f"{where}: hash_ids is not a prefix chain: id {block!r} comes {what} (an id stands for "
                          "its block and the whole prefix before it)")

    if len(set(hash_ids)) != len(hash_ids):
        raise refuse(next(b for i, b in enumerate(hash_ids) if b in hash_ids[:i]), "twice in this prompt")
    before = None
    for block in hash_ids:
        known = parents.get(block, parents)
        if known is parents:
            if len(parents) < CHAIN_CHECK_IDS:
                parents[block] = before
        elif known != before:
            raise refuse(block, f"{_after(known)} in an earlier request and {_after(before)} here")
        before = block


AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _after(parent) -> str:
    return "at the start of the prompt" if parent is None else f"after {parent!r}"


def _azure_time(text: str) -> datetime:
    t = datetime.fromisoformat(text.strip())  # 7 fractional digits, as Azure writes them, and offsets
    return t.astimezone(UTC).replace(tzinfo=None) if t.tzinfo else t  # without an offset: UTC


def wall_start(path: str | Path, limit: int | None = None) -> datetime | None:
    """The wall time (UTC) of a trace's earliest request, when the file says it (`load_timed_trace`)."""
    return load_timed_trace(path, limit)[1]


def _whole(text: str) -> int:
    """A token count as a CSV writes it: `100`, or `100.0` / `1e3` (pandas writes a column of whole numbers so
    once it held a gap); ValueError for a fraction or no number."""
    try:
        return int(text)
    except ValueError:
        value = float(text)  # ValueError: no number
        if not math.isfinite(value) or value != int(value):
            raise ValueError(text) from None
        return int(value)


BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")  # BurstGPT: seconds from the trace start


def _csv_rows(p: Path, columns: tuple[str, ...], what: str, optional: tuple[str, ...] = ()):
    """(line, the `columns`' values, then each `optional` column's or None where the header lacks it) of a CSV
    trace, blank rows skipped (the caller stops at its --limit of the requests it keeps). A header without the
    columns names them and what it has, and the other formats."""
    reader = csv.reader(line for _, line in _text_lines(p))
    header = next(reader, None)
    if header is None:
        return
    found = {name.strip().lower(): i for i, name in enumerate(header)}
    try:
        cols = [found[name.lower()] for name in columns]
    except KeyError:
        raise TraceError(f"{p}:1: {what} needs the columns {', '.join(columns)}; the header has "
                         f"{', '.join(h.strip() for h in header) or 'nothing'} (CSV traces: Azure's "
                         f"{', '.join(AZURE_COLUMNS)}, or BurstGPT's {', '.join(BURSTGPT_COLUMNS)}; JSON lines: "
                         "Mooncake or a prompt log)") from None
    extra = [found.get(name.lower()) for name in optional]
    for n, row in enumerate(reader, 2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) <= max(cols) or len(row) > len(header):  # more: a comma inside a value, or another file's row
            raise TraceError(f"{p}:{n}: {len(row)} fields; the header has {len(header)}")
        yield n, [row[i].strip() for i in cols] + [row[i].strip() if i is not None and i < len(row) else None
                                                   for i in extra]


def _tokens(p: Path, n: int, prompt: str, output: str, names: tuple[str, str]) -> tuple[int, int]:
    try:
        tokens = _whole(prompt), _whole(output)
    except ValueError:
        raise TraceError(f"{p}:{n}: {names[0]} and {names[1]} must be whole numbers, got {prompt!r} and "
                         f"{output!r}") from None
    if min(tokens) < 0 or max(tokens) > MAX_TOKENS:
        raise TraceError(f"{p}:{n}: {names[0]} and {names[1]} must be from 0 to {MAX_TOKENS}, got {prompt} and "
                         f"{output}")
    return tokens


def _count_of(n: int, one: str, many: str | None = None) -> str:
    """`1 request`, `2 requests`: the notes' counts."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


class _EmptyPrompts:
    """Rows with an empty prompt, left out: no engine serves one, and one such row in a week of traffic had
    refused the whole file. Counted for the trace's notes."""

    def __init__(self, p: Path, column: str):
        self.p, self.column, self.count, self.first = p, column, 0, None

    def skip(self, n: int, prompt_tokens: int) -> bool:
        if prompt_tokens:
            return False
        self.count += 1
        self.first = self.first or n
        return True

    def note(self, notes: list[str]) -> None:
        if self.count:
            notes.append(f"{_count_of(self.count, 'row')} with {self.column} 0 left out (an empty prompt is no "
                         f"request an engine serves; the first at {self.p}:{self.first})")


def _azure_rows(p: Path, limit: int | None, notes: list[str]) -> list[tuple[datetime, int, int]]:
    """The rows in file order, those with ContextTokens 0 left out (`_EmptyPrompts`)."""
    out: list[tuple[datetime, int, int]] = []
    empty = _EmptyPrompts(p, "ContextTokens")
    for n, (stamp, context, generated) in _csv_rows(p, AZURE_COLUMNS, "an Azure trace"):
        if limit is not None and len(out) >= limit:
            break
        try:
            t = _azure_time(stamp)
        except ValueError:
            raise TraceError(f"{p}:{n}: TIMESTAMP {stamp!r} is not a date and time "
                             "(like 2023-11-16 18:15:46.6805900)") from None
        if not 1970 <= t.year <= 9000:  # as --start: cron floors compute the days around the trace (year 9999
            # overflowed the date type in a traceback; year 1 was written back as a stamp no reader takes)
            raise TraceError(f"{p}:{n}: TIMESTAMP {stamp!r}: the year must be within 1970..9000")
        tokens = _tokens(p, n, context, generated, AZURE_COLUMNS[1:])
        if not empty.skip(n, tokens[0]):
            out.append((t, *tokens))
    empty.note(notes)
    return out


def _burstgpt(p: Path, limit: int | None, notes: list[str]) -> list[TraceRequest]:
    """BurstGPT (Azure OpenAI use at a university): seconds from the trace's start, token counts per request.
    A failed request is logged with 0 response tokens: it still arrived and was prefilled, so it stays, without
    output; several models in one file are replayed against the spec's one model (said in `notes`)."""
    out = []
    empty = _EmptyPrompts(p, "Request tokens")
    failed = 0
    models: dict[str, int] = {}
    for n, (stamp, prompt, output, model) in _csv_rows(p, BURSTGPT_COLUMNS, "a BurstGPT trace", ("Model",)):
        if limit is not None and len(out) >= limit:
            break
        try:
            t = float(stamp)
        except ValueError:
            t = math.nan
        if not math.isfinite(t) or t < 0:
            raise TraceError(f"{p}:{n}: Timestamp must be seconds from the trace start (0 or more), got {stamp!r}")
        tokens = _tokens(p, n, prompt, output, BURSTGPT_COLUMNS[1:])
        if empty.skip(n, tokens[0]):
            continue
        failed += tokens[1] == 0
        if model is not None:
            models[model] = models.get(model, 0) + 1
        out.append(TraceRequest(t, *tokens))
    empty.note(notes)
    if failed:
        notes.append(f"{failed} of {_count_of(len(out), 'request')} {'has' if failed == 1 else 'have'} Response "
                     "tokens 0 (BurstGPT logs a failed request so): replayed as prompts without output")
    if len(models) > 1:
        notes.append("the trace mixes models (" + ", ".join(f"{m or 'no name'}: {c}" for m, c in
                                                            sorted(models.items(), key=lambda x: -x[1]))
                     + "): all are replayed against the spec's one model")
    return out


def _is_burstgpt(first_line: str) -> bool:
    """A header with BurstGPT's token columns (all, or some: its error then names what is missing) and none of
    Azure's (a file with both is read by its Azure columns, which carry the wall clock)."""
    header = {h.strip().lower() for h in next(csv.reader([first_line]), [])}
    return bool({"request tokens", "response tokens"} & header) and not ({"contexttokens", "generatedtokens"} & header)


def _check_chat(messages: list, where: str) -> None:
    """The messages as the engines check them (`api.protocol.parse_chat`: roles, content a string or text parts,
    null only where the API allows it): a log the simulator accepts is one the engines answer, not a 400 at
    replay (a mistyped message became a 1-token prompt here). Tool calls in an assistant turn pass: agent logs
    carry them, and vLLM and SGLang fleets answer them."""
    try:
        parse_chat({"messages": messages}, tool_calls=True)
    except APIError as exc:
        raise TraceError(f"{where}: {exc}") from None


def _prompts(p: Path, limit: int | None, notes: list[str]) -> list[TraceRequest]:
    """A log with no timestamps at all is replayed at once, in file order; one with some is refused at the first
    line without one (it was put at 0 s, before every timed request). Requests without a token limit get the
    engines' default, counted in `notes` (their output length is assumed, not logged)."""
    out = []
    assumed = {CHAT_DEFAULT_MAX_TOKENS: 0, COMPLETION_DEFAULT_MAX_TOKENS: 0}
    timed, untimed = None, None  # the first line with and without a timestamp
    for n, row in _rows(p, limit):
        where = f"{p}:{n}"
        if row.get("timestamp") is None:
            untimed = untimed or where
        else:
            timed = timed or where
        if timed and untimed:
            raise TraceError(f"{untimed}: timestamp is missing, while {timed} has one: give every request its "
                             "arrival time in seconds, or none (all replayed at once, in file order)")
        messages = row.get("messages")
        prompt = row.get("prompt")
        if messages is None and prompt is None:
            raise TraceError(f"{where}: needs messages or prompt")
        if messages is not None and prompt is not None:  # a chat request or a completion: a replay sends one
            raise TraceError(f"{where}: has both messages and prompt; give one (messages: a chat request, prompt: "
                             "a completion)")
        if prompt is not None:
            if isinstance(prompt, list) and len(prompt) == 1:
                prompt = prompt[0]  # the OpenAI API's list form; more strings are a batch: a line each here
            if not isinstance(prompt, str) or not prompt:
                raise TraceError(f"{where}: prompt must be a non-empty string (a batch of prompts: one line each)")
        else:
            if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                raise TraceError(f"{where}: messages must be a non-empty list of objects "
                                 '(like {"role": "user", "content": "..."})')
            _check_chat(messages, where)
        # the newer OpenAI name first (max_tokens is deprecated for chat), as the API reads them
        limit_key = "max_completion_tokens" if row.get("max_completion_tokens") is not None else "max_tokens"
        # without a limit: a completion stops at 16 tokens on every engine (OpenAI's default, vLLM's, ours), a chat
        # runs to its end, taken as 64 tokens
        default = COMPLETION_DEFAULT_MAX_TOKENS if prompt is not None else CHAT_DEFAULT_MAX_TOKENS
        if row.get(limit_key) is None:
            assumed[default] += 1
        req = TraceRequest(_number(row, "timestamp", where, 0.0), 1, _count(row, limit_key, where, default, least=1),
                           session=_session(row, where), messages=tuple(messages) if messages else None, prompt=prompt)
        try:  # a lone surrogate (\ud800 in JSON) anywhere in the row: no request body can carry it
            json.dumps(row, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise TraceError(f"{where}: holds {exc.object[exc.start]!r}, which is not Unicode text (a lone "
                             "surrogate); the engines refuse it, and a replay cannot send it") from None
        # its length in the stand-in tokens the simulator and the Mooncake writer count (a word each): characters
        # / 4 made a prompt log written as Azure a third longer than the same log written as Mooncake
        words = len(stand_in_words(req.text() or ""))
        if words > MAX_TOKENS:  # as a Mooncake or Azure row's: tokenizing it took `analyze` to a native abort at
            # 6 GB, and `trace scale --format mooncake` wrote a file its own loader refuses
            raise TraceError(f"{where}: the prompt is {words} words long; at most {MAX_TOKENS} tokens a request")
        out.append(replace(req, input_tokens=max(1, words)))
    said = [f"{_count_of(assumed[CHAT_DEFAULT_MAX_TOKENS], 'chat request')} as {CHAT_DEFAULT_MAX_TOKENS} tokens"
            if assumed[CHAT_DEFAULT_MAX_TOKENS] else "",
            f"{_count_of(assumed[COMPLETION_DEFAULT_MAX_TOKENS], 'completion')} as {COMPLETION_DEFAULT_MAX_TOKENS} "
            "tokens (every engine's default)" if assumed[COMPLETION_DEFAULT_MAX_TOKENS] else ""]
    if any(said):
        notes.append(f"{sum(assumed.values())} of {_count_of(len(out), 'request')} carry no max_tokens: their output "
                     f"length is assumed, {' and '.join(x for x in said if x)} (give max_tokens to each line for the "
                     "lengths the log saw)")
    return out

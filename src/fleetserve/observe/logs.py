"""Logs: one line per request from the router and the engine, as text or as JSON lines (`--log-format`).

A request line carries the request id (the router's `x-request-id`, passed to the engine), the tenant as a
hash, the replica, the routing policy and branch, the status and the timings; never prompt or completion
text unless `--log-prompts` (default off) asks for the prompt.

Tenants are logged hashed, never by name: `tenant` is the first 12 hex digits of sha256("fleetserve-tenant:"
+ name). Logs travel further than metrics (shippers, tickets, support bundles); a hash still joins one
tenant's lines across router and engines, and `tenant_hash(name)` finds a known tenant's lines. It is a
pseudonym, not a secret: tenant names are few and guessable. Metrics keep the name (bounded by the key file,
admin-only /metrics).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import sys
import time

LOG_FORMATS = ("text", "json")
REQUEST = "request"  # the message of every per-request line

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def tenant_hash(tenant: str | None) -> str | None:
    if not tenant:
        return None
    return hashlib.sha256(b"fleetserve-tenant:" + tenant.encode()).hexdigest()[:12]


def prompt_text(body: dict) -> str | None:
    """What `--log-prompts` logs: the chat messages' text or the completion prompt."""
    if isinstance(body.get("messages"), list):
        parts = []
        for m in body["messages"]:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts += [p.get("text", "") for p in content if isinstance(p, dict)]
        return "\n".join(parts)
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else (json.dumps(prompt) if prompt is not None else None)


def _fields(record: logging.LogRecord) -> dict:
    return {k: v for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, component, (replica), logger, msg, then the record's fields."""

    def __init__(self, component: str, replica: str | None = None):
        super().__init__()
        self.component = component
        self.replica = replica

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
                "level": record.levelname.lower(), "component": self.component}
        if self.replica:
            line["replica"] = self.replica
        line["logger"] = record.name
        line["msg"] = record.getMessage()
        line.update(_fields(record))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """`TIME component LEVEL message key=value ...` (the fields of a request line, in order)."""

    def __init__(self, component: str):
        super().__init__(f"%(asctime)s {component} %(levelname)s %(message)s")
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extra = " ".join(f"{k}={json.dumps(v) if isinstance(v, str) and (' ' in v or not v) else v}"
                         for k, v in _fields(record).items() if v is not None)
        if not extra:
            return text
        head, sep, tail = text.partition("\n")  # keep a traceback below the line
        return f"{head} {extra}{sep}{tail}"


def configure_logging(log_format: str = "text", component: str = "fleetserve", replica: str | None = None,
                      level: int = logging.INFO) -> None:
    """The process's root handler on stderr, in `log_format` (text or json)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r}; allowed values: {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(component, replica) if log_format == "json" else TextFormatter(component))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for chatty in ("httpx", "httpcore"):  # a line per HTTP call at INFO: the supervisor polls its router every second
        logging.getLogger(chatty).setLevel(max(level, logging.WARNING))


def request_level(fields: dict) -> int:
    """A request line's level: WARNING for a server error (5xx: a replica failed it, or the router could not
    serve it), so that a filter on warnings finds them; INFO otherwise (a client's 4xx is the client's)."""
    status = fields.get("status")
    return logging.WARNING if isinstance(status, int) and status >= 500 else logging.INFO


def log_request(logger: logging.Logger, **fields) -> None:
    """The per-request line: message `request`, the fields as the record's attributes (None dropped)."""
    logger.log(request_level(fields), REQUEST, extra={k: v for k, v in fields.items() if v is not None})


def quiet_progress_bars() -> None:
    """JSON logs hold JSON only: no tqdm bars (model loading), transformers' messages through our handler."""
    import os

    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["TQDM_DISABLE"] = "1"
    try:
        import transformers.utils.logging as tl
    except ImportError:
        return
    tl.disable_progress_bar()
    tl.disable_default_handler()
    tl.enable_propagation()


class AccessLog:
    """The router's per-request line, the same line the formatters write, without logging's per-record cost.

    At thousands of requests a second, `logger.info(...)` (a LogRecord, the caller's frame lookup, a lock and
    a flushed write per line) cost more CPU than routing the request. Here a line is one string format into
    a buffer, written in one call every `flush_s` (and when `max_lines` are waiting, and at `close`). It is
    used only when the process logs through `configure_logging`'s handler; otherwise (a test's capture, an
    embedding application's handlers) lines go through `logging` as before.
    """

    def __init__(self, logger: logging.Logger, flush_s: float = 0.1, max_lines: int = 256):
        self.logger = logger
        self.flush_s = flush_s
        self.max_lines = max_lines
        self._lines: list[str] = []
        self._timer = None
        self._second = -1
        self._stamp = ""
        handler = next((h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler)
                        and isinstance(h.formatter, TextFormatter | JsonFormatter)), None)
        self._handler = handler if not logger.handlers and logger.propagate else None

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)

    def write(self, **fields) -> None:
        handler = self._handler
        if handler is None:
            log_request(self.logger, **fields)
            return
        now = time.time()
        formatter = handler.formatter
        level = logging.getLevelName(request_level(fields))
        if isinstance(formatter, JsonFormatter):
            line = {"ts": self._iso(now), "level": level.lower(), "component": formatter.component}
            if formatter.replica:
                line["replica"] = formatter.replica
            line["logger"] = self.logger.name
            line["msg"] = REQUEST
            line.update((k, v) for k, v in fields.items() if v is not None)
            text = json.dumps(line, ensure_ascii=False, default=str)
        else:
            extra = " ".join(f"{k}={json.dumps(v) if isinstance(v, str) and (' ' in v or not v) else v}"
                             for k, v in fields.items() if v is not None)
            text = f"{self._asctime(now)} {formatter.component} {level} {REQUEST} {extra}"
        self._lines.append(text)
        if len(self._lines) >= self.max_lines:
            self.flush()
        elif self._timer is None:
            try:
                import asyncio

                self._timer = asyncio.get_running_loop().call_later(self.flush_s, self.flush)
            except RuntimeError:
                self.flush()  # no loop: write at once

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._lines and self._handler is not None:
            data = "\n".join(self._lines) + "\n"
            self._lines.clear()
            stream = self._handler.stream
            try:
                stream.write(data)
                stream.flush()
            except (OSError, ValueError):
                pass  # stderr closed: nothing to tell anyone

    def close(self) -> None:
        self.flush()

    def _asctime(self, now: float) -> str:
        second = int(now)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        return f"{self._stamp},{int((now - second) * 1000):03d}"

    def _iso(self, now: float) -> str:
        return datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat(timespec="milliseconds")

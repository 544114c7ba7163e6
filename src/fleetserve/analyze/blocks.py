"""A trace as the KV blocks its prompts touch, in arrival order.

Mooncake traces already are: `hash_ids`, 512 tokens each (equal id = equal prefix). Prompt logs are tokenized
with the model's own tokenizer (its chat template for `messages`, as the engine does) and cut into the
engine's chained block keys (`kvcache.blocks.chain_keys`), so a shared block here is a shared block there.
Traces without prompt content (Azure) cannot be analysed: their lengths say nothing about reuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fleetserve.kvcache.blocks import chain_keys
from fleetserve.router.features import content_text
from fleetserve.traces.load import detect_format, read_trace
from fleetserve.traces.model import MOONCAKE_BLOCK_TOKENS, TraceRequest

ANALYZABLE = ("mooncake", "bailian", "prompts")


class AnalyzeInputError(ValueError):
    """Input that cannot be analysed; the message names the parameter and what is allowed."""


@dataclass(frozen=True)
class BlockTrace:
    requests: list[TraceRequest]  # in arrival order
    keys: list[tuple[int, ...]]  # per request: its prompt's block ids, in prompt order
    prompt_tokens: list[int]
    block_tokens: int
    fmt: str
    bodies: list[dict] | None = None  # prompt logs: the request bodies a router would see
    notes: tuple[str, ...] = ()  # what the loader left out or assumed (`traces.load.TraceRead`)


def load_blocks(path: str | Path, model: str | None = None, block_tokens: int = 256,
                limit: int | None = None) -> BlockTrace:
    p = Path(path)
    fmt = detect_format(p) if p.is_file() else None
    if fmt not in ANALYZABLE:
        if fmt in ("azure", "burstgpt"):
            read_trace(p, limit=1)  # a CSV of neither layout is refused as such, naming its columns
        holds = "arrival rates only" if fmt == "servegen" else "token counts only"
        raise AnalyzeInputError(f"FILE {p}: {_a(fmt)} trace has no prompt content to analyse (it holds {holds}); "
                                "allowed: Mooncake hash traces (hash_ids) or prompt logs (messages/prompt)")
    requests, _, notes = read_trace(p, limit)
    requests = sorted(requests, key=lambda r: r.arrival_s)  # stable: file order breaks ties
    if fmt in ("mooncake", "bailian"):  # a Bailian trace's ids are read as Mooncake blocks (`traces.load`)
        if not any(r.hash_ids for r in requests):
            raise AnalyzeInputError(f"FILE {p}: no hash_ids in this {fmt.capitalize()}-format trace; nothing to "
                                    "analyse")
        return BlockTrace(requests, _ids_or_fresh(requests), [r.input_tokens for r in requests],
                          MOONCAKE_BLOCK_TOKENS, "mooncake", notes=notes)
    if model is None:
        raise AnalyzeInputError("--model is needed to tokenize a prompt log (e.g. builtin:smollm2-135m or a "
                                "model directory)")
    tokenizer = load_tokenizer(model)
    ids = [prompt_ids(tokenizer, r) for r in requests]
    bodies = [_body(r) for r in requests]
    return BlockTrace(requests, [tuple(chain_keys(t, block_tokens)) for t in ids], [len(t) for t in ids],
                      block_tokens, fmt, bodies, notes)


def _a(fmt: str | None) -> str:
    names = {"azure": "an Azure", "burstgpt": "a BurstGPT", "servegen": "a ServeGen rate"}
    return names.get(fmt or "", "an unknown-format")


def _ids_or_fresh(requests: list[TraceRequest]) -> list[tuple[int, ...]]:
    """Each request's hash ids; a row without any (in a trace where others have them) gets ids no other row has,
    one per 512 tokens: its prompt is all misses in the block count as in the token count (the block figures had
    left it out, the token figures counted it)."""
    fresh = max((i for r in requests for i in r.hash_ids), default=-1) + 1
    out = []
    for r in requests:
        if r.hash_ids or r.input_tokens <= 0:
            out.append(r.hash_ids)
            continue
        n = -(-r.input_tokens // MOONCAKE_BLOCK_TOKENS)
        out.append(tuple(range(fresh, fresh + n)))
        fresh += n
    return out


def load_tokenizer(model: str):
    from transformers import AutoTokenizer

    from fleetserve.engine.demo import ModelSourceError
    from fleetserve.engine.sources import resolve_source

    try:
        path = resolve_source(model)
    except ModelSourceError as exc:
        raise AnalyzeInputError(f"--model: {exc}") from None
    return AutoTokenizer.from_pretrained(path)


def prompt_ids(tokenizer, r: TraceRequest) -> list[int]:
    """The prompt's token ids as the engine builds them (chat template when the tokenizer has one)."""
    if r.messages is not None:
        # list-of-parts content as its text parts, null as empty (as TraceRequest.text() and the router read it)
        messages = [{"role": m.get("role", "user"), "content": content_text(m.get("content"))} for m in r.messages]
        if getattr(tokenizer, "chat_template", None):
            out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(out, dict) or hasattr(out, "input_ids"):
                out = out["input_ids"]
            return list(out)
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    else:
        text = r.prompt or ""
    return list(tokenizer.encode(text, add_special_tokens=False))


def _body(r: TraceRequest) -> dict:
    body: dict = {"messages": list(r.messages)} if r.messages is not None else {"prompt": r.prompt}
    if r.session is not None:
        body["user"] = r.session
    return body

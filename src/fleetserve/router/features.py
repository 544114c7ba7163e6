"""What the router extracts from a request body for cache-aware policies: prefix keys and prompt size.

Token-id prompts (completions with `prompt: [ids]`) are cut into the engines' blocks and keyed exactly as
the engines key them (same chain hash, same namespace), so router keys and engine KV events agree. Text is
keyed in fixed character chunks (no tokenizer in the router), about 4 characters per token.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetserve.kvcache.blocks import chain_keys, namespace_key, text_chunk_keys

CHARS_PER_TOKEN = 4
# Text keys are estimates (they cannot line up with the engine's token blocks), so their chunks need not be as
# small as the engine's blocks: with vLLM's 16-token blocks an 8 KB prompt would be 125 keys to hash, index and
# match per request (measured: 3x the gateway's CPU per request of 64-token chunks) for no better a choice.
TEXT_CHUNK_MIN_TOKENS = 64


@dataclass(frozen=True)
class KVLayout:
    """How the engines key their blocks (from /get_model_info); defaults when no engine says."""

    block_size: int = 256
    model: str = ""
    version: str = "1"
    dtype: str = ""

    def root(self, salt: str | None) -> int:
        return namespace_key(self.model, self.version, self.dtype, salt) if self.model else 0


def content_text(content: object) -> str:
    """A message's text, total over any JSON: the engine validates content; routing (and a prompt log's length,
    `TraceRequest.text`) only needs the text that is there."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _text(body: dict) -> str:
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for m in messages:
            if isinstance(m, dict):
                parts.append(f"{m.get('role')}: {content_text(m.get('content'))}\n")
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else ""


def request_features(body: dict, layout: KVLayout, salt: str | None = None
                     ) -> tuple[tuple[int, ...], int, int, bool]:
    """(prefix keys, prompt tokens, tokens per key, whether the keys are the engines' exact block keys)."""
    prompt = body.get("prompt")
    root = layout.root(salt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return tuple(chain_keys(prompt, layout.block_size, root)), len(prompt), layout.block_size, True
    text = _text(body)
    chunk_tokens = max(layout.block_size, TEXT_CHUNK_MIN_TOKENS)
    keys = tuple(text_chunk_keys(text, chunk_tokens * CHARS_PER_TOKEN, root))
    return keys, len(text) // CHARS_PER_TOKEN, chunk_tokens, False


def prompt_tokens_estimate(body: dict) -> int:
    """The prompt's size without its keys, for policies that need no prefix keys (no hashing)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return len(prompt)
    return len(_text(body)) // CHARS_PER_TOKEN

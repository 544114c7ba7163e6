"""How many tokens a request may generate within the model's context, as every engine here decides it.

One rule for the built-in engine and the simulated one (it had generated 2,000,000 tokens for a `max_tokens`
no context holds, and answered 500-token completions past a `--context-length` of 100): a prompt that fills
the context, or a prompt and `max_tokens` beyond it, is a 400 `context_length_exceeded` naming the parameter,
as OpenAI and vLLM answer it; without `max_tokens` a completion stops at 16 tokens (OpenAI's legacy default,
and vLLM's) and a chat at the engine's default, either clamped to the room left.
"""

from __future__ import annotations

from fleetserve.api.errors import APIError

COMPLETION_MAX_TOKENS_DEFAULT = 16  # /v1/completions without max_tokens (OpenAI's legacy default, and vLLM's)


def token_budget(prompt_len: int, requested: int | None, limit: int, kind: str = "chat",
                 param: str = "max_tokens", chat_default: int = 512) -> int:
    if prompt_len >= limit:
        raise APIError(
            400,
            f"This model's maximum context length is {limit} tokens. However, your prompt has {prompt_len} "
            "tokens. Shorten the prompt.",
            param="messages" if kind == "chat" else "prompt",
            code="context_length_exceeded",
        )
    if requested is None:
        default = COMPLETION_MAX_TOKENS_DEFAULT if kind == "completion" else chat_default
        return min(default, limit - prompt_len)
    if prompt_len + requested > limit:
        raise APIError(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} for the completion). "
            f"Reduce the prompt or {param}.",
            param=param,
            code="context_length_exceeded",
        )
    return requested

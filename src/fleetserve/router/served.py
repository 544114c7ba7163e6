"""What a router answers itself while no replica is ready: the model names (`fleetserve router --model NAME`)
and, in front of the built-in engines, a bad body (`--check-bodies`).

At zero replicas the router holds requests until one is ready, and the held requests wake the fleet. A
listing of models, or a request for a name the fleet does not serve, need no replica: the router answers them
from the served name. Engines that load LoRA adapters serve names the spec does not list, and an external
engine's names are its own: for them the router knows none and holds everything, as before.

A body the engines will refuse need not wait for one either: it had woken a fleet at zero and got its 400 after
the cold start (minutes on a GPU, paid for), or a 503 `replicas_failing` where the answer was a 400. In front of
the built-in engines (and their simulated kind), whose checks the router shares (`api/protocol.parse_generation`:
types, ranges, what they do not support), the router runs them on a request it would hold or refuse for want
of a replica; a replica ready takes the request at once, unchecked here, as before. vLLM and SGLang support
what the built-in engines refuse (tools, n, logprobs): in front of them the router checks nothing.

Once a replica gave its model card, its `max_model_len` also refuses what no context holds (`context_refusal`):
a token-id prompt with its `max_tokens` exactly as the engines count them (`engine/budget.py`), and a text prompt's
`max_tokens` that leaves no room for one token of prompt. A text prompt's own length is the engines' tokenizer's
to count: such a prompt still waits for a replica.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from fleetserve.api.errors import APIError
from fleetserve.api.protocol import ParsedRequest
from fleetserve.engine.budget import token_budget

log = logging.getLogger(__name__)

LORA_FLAGS = frozenset({"--enable-lora", "--lora-modules", "--lora-paths", "--max-loras"})


def served_model_args(name: str, engine_kind: str, engine_args: list[str]) -> list[str]:
    """`--model NAME` for the router, or nothing when the replicas may serve other names."""
    if engine_kind in ("external", "container") or any(a.split("=", 1)[0] in LORA_FLAGS for a in engine_args):
        return []
    return ["--model", name]


def body_check_args(engine_kind: str) -> list[str]:
    """`--check-bodies` for the router in front of engines that read bodies as `api/protocol` does."""
    return ["--check-bodies"] if engine_kind == "builtin" else []


def context_refusal(parsed: ParsedRequest, card: dict | None) -> None:
    """Raise the engines' 400 `context_length_exceeded` for a request no replica of this card could take."""
    limit = (card or {}).get("max_model_len")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        return
    requested, param = parsed.sampling.max_tokens, parsed.sampling.max_tokens_param
    if parsed.kind == "completion" and isinstance(parsed.prompt, list) and parsed.prompt:
        token_budget(len(parsed.prompt), requested, limit, "completion", param)
    elif requested is not None and requested >= limit:
        raise APIError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                            f"{requested} tokens for the completion alone, which leaves no room for the prompt. "
                            f"Reduce {param}.", param=param, code="context_length_exceeded")


def read_model_cards(path: str | None, names: tuple[str, ...]) -> dict[str, dict]:
    """The cards a router of this fleet learnt before it restarted (`--model-cards-file`), for the served names:
    a router restarted at zero had a bare card again (no `max_model_len`), and held, and so woke the fleet for,
    a request its context cannot hold. Nothing when the file is missing or unreadable."""
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {n: c for n, c in data.items() if n in names and isinstance(c, dict) and c.get("id") == n}


def write_model_cards(path: str | None, cards: dict[str, dict]) -> None:
    """The learnt cards, written whole (a temporary file renamed over it: a worker reading it never sees half)."""
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        Path(tmp).write_text(json.dumps(cards, sort_keys=True))
        os.replace(tmp, path)
    except OSError as exc:  # the cards are a convenience at zero: serving goes on without them
        log.warning("could not keep the model cards in %s: %s", path, exc)

"""Trace requests as the simulator needs them: arrival, sizes, the engine's block keys and the router's keys.

Keys are derived without materialising tokens (the hot path must not touch per-token data):
- Mooncake hash ids (512 tokens each): a chain over the ids; the key of an engine block ending at token `e`
  is the chain value of the id containing token e-1, combined with e. Equal ids give equal keys, as the
  engines' own chained keys would. The router keys a token-id prompt the same way (the gateway computes the
  engines' chain for token ids; without /get_model_info it uses its default block of 256 tokens);
- prompt logs (text): the engine's keys come from the stand-in tokenizer (`traces.model.stand_in_words`: words,
  and a token per character of scripts written without spaces); the router's keys are
  the gateway's own text-chunk keys (`router.features.request_features`), which do not line up with the
  engine's blocks, exactly as for a live router in front of an engine it cannot tokenize for;
- Azure (lengths only): no keys; every prompt is unique.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetserve.router.features import KVLayout, request_features
from fleetserve.traces.model import MOONCAKE_BLOCK_TOKENS, TraceRequest, stand_in_tokens

ROUTER_DEFAULT_BLOCK = KVLayout().block_size


@dataclass(frozen=True)
class SimRequestSpec:
    """One request of the workload, keys precomputed."""

    arrival: float  # seconds after the trace start
    prompt: int
    output: int
    engine_keys: tuple = ()
    router_keys: tuple = ()
    router_block: int = ROUTER_DEFAULT_BLOCK
    exact: bool = True  # the router's keys are keyed like the engine's (token ids)
    session: str | None = None
    router_prompt: int = 0  # the router's estimate of the prompt tokens when it differs (text); 0: `prompt`


def _hash_chain(hash_ids: tuple[int, ...], prompt: int, block: int, salt: int) -> tuple:
    if not hash_ids:
        return ()
    chain = []
    parent = salt
    for h in hash_ids:
        parent = hash((parent, h))
        chain.append(parent)
    n = prompt // block
    last = len(chain) - 1
    return tuple(hash((chain[min(last, ((c + 1) * block - 1) // MOONCAKE_BLOCK_TOKENS)], (c + 1) * block))
                 for c in range(n))


def _word_chain(tokens: list[int], block: int, salt: int) -> tuple:
    keys, parent = [], salt
    for start in range(0, len(tokens) - block + 1, block):
        parent = hash((parent, tuple(tokens[start:start + block])))
        keys.append(parent)
    return tuple(keys)


def build_workload(trace: list[TraceRequest], engine_block: int, informed: bool) -> list[SimRequestSpec]:
    """Requests in arrival order, keyed for engines with `engine_block`-token blocks."""
    out = []
    for r in sorted(trace, key=lambda r: r.arrival_s):
        session = r.session
        if r.hash_ids:
            engine = _hash_chain(r.hash_ids, r.input_tokens, engine_block, 0)
            if informed:  # the router learned the engines' layout: its keys are theirs
                out.append(SimRequestSpec(r.arrival_s, r.input_tokens, r.output_tokens, engine, engine,
                                          engine_block, True, session))
            else:
                rkeys = _hash_chain(r.hash_ids, r.input_tokens, ROUTER_DEFAULT_BLOCK, 1)
                out.append(SimRequestSpec(r.arrival_s, r.input_tokens, r.output_tokens, engine, rkeys,
                                          ROUTER_DEFAULT_BLOCK, True, session))
        elif r.messages or r.prompt:
            body = {"messages": list(r.messages)} if r.messages else {"prompt": r.prompt}
            text = r.text() or ""
            words = stand_in_tokens(text)  # the engine's tokens: its stand-in tokenizer's, as its keys
            engine = _word_chain(words, engine_block, 0)
            rkeys, tokens, rblock, exact = request_features(body, KVLayout(engine_block if informed else
                                                                           ROUTER_DEFAULT_BLOCK))
            out.append(SimRequestSpec(r.arrival_s, max(1, len(words)), r.output_tokens, engine, tuple(rkeys), rblock,
                                      exact, session, max(tokens, 1)))
        else:
            out.append(SimRequestSpec(r.arrival_s, r.input_tokens, r.output_tokens, session=session))
    return out


def keys_exact(workload: list[SimRequestSpec]) -> bool:
    """Whether the router's keys are the engines' own (token ids) where the workload has keys at all; text
    prompts' are not (the router cannot tokenize as the engine does)."""
    keyed = [w for w in workload if w.engine_keys]
    return not keyed or any(w.exact for w in keyed)


def cannot_act(strategy: str, knowledge: str, has_sessions: bool, exact: bool = True) -> str | None:
    """Why a strategy would route by another policy under its own name (its figures would be that policy's), or
    None. One rule for the routing bench, analyze and the simulator's warnings."""
    if strategy == "session" and not has_sessions:
        return ("the trace has no session keys: session routing sends every request to the least loaded replica "
                "(leastload's figures, not session's)")
    if strategy == "kvaware" and knowledge == "blind":
        return ("kvaware in blind mode gets no KV events from the engines, so it routes every request by its "
                "prefixaware fallback (prefixaware's figures; the informed mode gives it the events)")
    if strategy == "kvaware" and not exact:
        return ("kvaware on text prompts cannot compute the engines' block keys, so it routes every request by its "
                "prefixaware fallback (prefixaware's figures)")
    return None


def scale_rate(trace: list[TraceRequest], factor: float, seed: int = 0) -> list[TraceRequest]:
    """`factor` times the requests over the same span (the traces package's scaler when it is there)."""
    try:
        from fleetserve.traces.scale import scale_rate as traces_scale_rate
    except ImportError:
        traces_scale_rate = None
    if traces_scale_rate is not None:
        return traces_scale_rate(trace, factor, seed)
    import random
    from dataclasses import replace

    rng = random.Random(seed)
    ordered = sorted(trace, key=lambda r: r.arrival_s)
    out = list(ordered)
    whole = int(factor)
    for i, r in enumerate(ordered):
        gap = (ordered[i + 1].arrival_s - r.arrival_s) if i + 1 < len(ordered) else 0.0
        copies = whole - 1 + (1 if rng.random() < factor - whole else 0)
        for c in range(1, copies + 1):
            out.append(replace(r, arrival_s=r.arrival_s + rng.random() * gap,
                               hash_ids=tuple(h + c * 10**9 for h in r.hash_ids)))
    out.sort(key=lambda r: r.arrival_s)
    return out

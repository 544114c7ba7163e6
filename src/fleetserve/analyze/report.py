"""`fleetserve analyze`: one dict of figures for a trace, and its rendering as text."""

from __future__ import annotations

from pathlib import Path

from fleetserve.analyze.blocks import load_blocks
from fleetserve.analyze.recommend import recommend
from fleetserve.analyze.reuse import HitCurve, block_tokens_of, ideal_reuse, stack_distances
from fleetserve.analyze.routing import strategy_context, strategy_hit_rates
from fleetserve.sim import profiles

GIB = 1 << 30


def analyze(path: str | Path, model: str | None = None, replicas: int = 4, profile: str = "h100-llama-8b",
            cache_blocks: int | None = None, l1_gib: float = 32.0, l2_gib: float = 256.0, block_tokens: int = 256,
            mode: str = "blind", limit: int | None = None, seed: int = 0) -> dict:
    """Reuse figures, the LRU curve, per-strategy hit rates and a recommendation (keys in docs/analyze.md).

    Capacities are in the trace's blocks: `cache_blocks` per replica (default: the profile's KV memory),
    L1 per replica and one shared L2 from their GiB and the profile's KV bytes per token."""
    perf = profiles.resolve(profile)
    trace = load_blocks(path, model=model, block_tokens=block_tokens, limit=limit)
    ideal = ideal_reuse(trace.keys, trace.prompt_tokens, trace.block_tokens)
    distances = stack_distances(trace.keys)
    curve = HitCurve(distances)  # blocks, as the ideal hit rate counts them
    # tokens, as the strategies' hit rates count them: the tiers and the oracle compare with those (counted in
    # blocks, a trace of 513-token prompts had an oracle of 0.475 under every strategy's 0.798), in caches that
    # store whole blocks only, as engines do (a partial last block's id had taken room: with one replica the
    # oracle, the same cache, read 0.694 where the replica found 0.846)
    whole = [min(len(ks), n // trace.block_tokens) for ks, n in zip(trace.keys, trace.prompt_tokens, strict=True)]
    by_tokens = HitCurve(stack_distances(trace.keys, whole),
                         block_tokens_of(trace.keys, trace.prompt_tokens, trace.block_tokens),
                         total=sum(trace.prompt_tokens))
    block_bytes = profiles.kv_bytes_per_token(profile) * trace.block_tokens
    engine = cache_blocks or max(1, perf.cache_blocks * perf.block_size // trace.block_tokens)
    l1 = int(l1_gib * GIB // block_bytes)
    l2 = int(l2_gib * GIB // block_bytes)
    # every block an engine stores is written through to its replica's L1 and to the shared L2 (`sim.memory`),
    # so a tier holds copies, not more blocks on top: L1 adds only what it holds beyond its engine's memory, and
    # L2 only beyond all of them (added end to end, 32 GiB of L1 smaller than the engine's memory read as +22
    # points that the simulator with that L1 never found)
    with_l1 = replicas * max(engine, l1)
    sizes = {"engine": replicas * engine, "engine+l1": with_l1, "engine+l1+l2": max(with_l1, l2)}
    tiers = {name: {"blocks": size, "hit_rate": round(by_tokens.hit_rate(size), 4)} for name, size in sizes.items()}
    by_mode = {m: strategy_hit_rates(trace, replicas, engine, perf, mode=m, seed=seed) for m in ("blind", "informed")}
    chosen = by_mode[mode]
    filled = any(whole)  # a Mooncake hash id stands for a block even when its prompt is shorter than one: ids
    # seen again made an ideal rate of 0.667 while no engine could store a block, with no word of it
    warnings = _warnings(trace, model, filled) + _above_oracle(by_mode, tiers["engine"]["hit_rate"])
    return {
        "trace": str(path),
        "format": trace.fmt,
        "requests": len(trace.requests),
        "blocks": ideal.blocks,
        "unique_blocks": ideal.unique_blocks,
        "block_tokens": trace.block_tokens,
        "ideal_hit_rate": round(ideal.hit_rate, 4),
        "ideal_prefix_hit_rate": round(ideal.prefix_hit_rate, 4),
        "ideal_token_hit_rate": round(ideal.token_hit_rate, 4),
        "requests_with_hit": round(ideal.requests_with_hit, 4),
        "hit_rate_by_cache_blocks": curve.points(ideal.unique_blocks),
        "replicas": replicas,
        "profile": perf.name,
        "cache_blocks_per_replica": engine,
        "tiers": {**tiers, "l1_blocks_per_replica": l1, "l2_blocks": l2, "l1_gib": l1_gib, "l2_gib": l2_gib},
        "oracle_hit_rate": tiers["engine"]["hit_rate"],
        "mode": mode,
        "strategy_hit_rate": {n: s["hit_rate"] for n, s in chosen.items()},
        "strategy_notes": {n: s["reason"] for n, s in chosen.items() if s.get("reason")},
        "strategies": by_mode,
        "engine": "the fleet simulator with the live routing policies, the trace at its own arrival times "
                  "(analyze.routing -> sim.fleet)",
        "recommendation": recommend(ideal.token_hit_rate, tiers, chosen, filled=filled,
                                    block_tokens=trace.block_tokens, engine_blocks=engine, l1_blocks=l1,
                                    replicas=replicas, block_hint=_block_hint(trace.fmt)),
        "warnings": warnings,
    }


def _above_oracle(by_mode: dict, oracle: float) -> list[str]:
    """Strategies above the oracle, named as `bench routing` names them (`bench.routing_sim.oracle_warnings`):
    one pooled LRU is no upper bound at every size, so the bar there is not the best."""
    beat = [f"{mode} {name} {row['hit_rate']:.3f}" for mode, rows in by_mode.items() for name, row in rows.items()
            if row.get("hit_rate") is not None and row["hit_rate"] > oracle + 0.0005]
    if not beat:
        return []
    return [f"hit rates above the oracle's {oracle:.3f} ({', '.join(beat)}): one pooled LRU of the fleet's engine "
            "memory is not an upper bound on this trace at this size (per-replica caches kept what it evicted), so "
            "the oracle is the bar, not the best; compare at another --cache-blocks"]


def _block_hint(fmt: str) -> str:
    """What a user can do about prompts shorter than a block: a prompt log is cut here, a Mooncake trace was not."""
    return ("a Mooncake trace's hash ids stand for 512-token blocks: its requests share only partial blocks"
            if fmt == "mooncake" else "with a smaller engine block, give --block-size")


def _warnings(trace, model: str | None, filled: bool) -> list[str]:
    """What the figures do not show: requests the model cannot take, prompts too short to fill a block, a
    Mooncake file whose timestamps look like seconds (its strategy figures are those of 1,000 x the load)."""
    out = list(trace.notes)  # the loader's: rows left out, values assumed, a unit that looks wrong
    if not filled:
        # Mooncake's ideal counts its ids, partial blocks too; a prompt log's keys are whole blocks only
        but = " but the ideal one" if trace.fmt == "mooncake" else ""
        out.append(f"no prompt fills one {trace.block_tokens}-token block: nothing an engine caches can be found "
                   f"again, so every hit rate{but} is 0 (engines cache whole blocks; {_block_hint(trace.fmt)})")
    from fleetserve.engine.catalog import by_source

    preset = by_source(model) if model else None
    if preset is not None:
        limit = preset.model_maximum
        over = sum(1 for r, p in zip(trace.requests, trace.prompt_tokens, strict=True) if p + r.output_tokens > limit)
        if over:
            out.append(f"{over} of {len(trace.requests)} requests need more than {preset.name}'s {limit}-token "
                       "context (prompt and completion): an engine refuses them (400 context_length_exceeded), and "
                       "the hit rates here still count them, as simulate does not")
    limit = strategy_context()
    capped = sum(1 for r in trace.requests if r.output_tokens > limit)
    if capped:
        from fleetserve.bench.routing_sim import completions_cut_warning

        out.append(completions_cut_warning(capped, len(trace.requests)))
    return out


def render(result: dict) -> list[str]:
    """Plain lines for people (the JSON has everything)."""
    lines = [f"{result['trace']}: {result['requests']} requests, {result['blocks']} blocks of "
             f"{result['block_tokens']} tokens ({result['unique_blocks']} distinct)",
             f"ideal hit rate (unbounded cache): {result['ideal_hit_rate']:.1%}  "
             f"(token-weighted {result['ideal_token_hit_rate']:.1%}; {result['requests_with_hit']:.1%} of requests "
             "reuse something)",
             "LRU hit rate by cache size (blocks): " + (", ".join(
                 f"{p['cache_blocks']}: {p['hit_rate']:.1%}" for p in result["hit_rate_by_cache_blocks"])
                 or "none (no prompt fills a whole block)"),
             f"{result['replicas']} replicas x {result['cache_blocks_per_replica']} blocks ({result['profile']}), "
             f"{result['mode']} router; one pooled LRU of that size: {result['oracle_hit_rate']:.1%}"]
    for name, rate in result["strategy_hit_rate"].items():
        note = result["strategy_notes"].get(name)
        lines.append(f"  {name:12s} " + (f"{rate:.1%}" if rate is not None else f"n/a: {note}"))
    rec = result["recommendation"]
    lines.append(f"recommendation: {rec['summary']}")
    lines += [f"  - {r}" for r in rec["reasons"]]
    return lines

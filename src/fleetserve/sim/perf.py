"""Engine performance models: how long a prefill and a decode step take, and how many KV blocks fit.

Prefill time grows with the *uncached* tokens (cached blocks are loaded, not computed); a decode step costs
a fixed part plus a part per running sequence plus a part per token of context attended (BLIS-style
linear step model). Profiles are named presets; figures are coarse public ballparks, meant for relative
comparisons (policies against each other), not absolute predictions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class PerfProfile:
    name: str
    prefill_base_s: float  # per prefill step
    prefill_per_token_s: float  # per uncached prompt token
    decode_base_s: float  # per decode step
    decode_per_seq_s: float  # per running sequence in the step
    decode_per_ctx_token_s: float  # per token of context attended in the step
    cache_blocks: int  # KV capacity in blocks
    block_size: int = 256
    max_batch: int = 64

    def prefill_time(self, uncached_tokens: int) -> float:
        return self.prefill_base_s + self.prefill_per_token_s * max(0, uncached_tokens)

    def decode_time(self, batch: int, context_tokens: int) -> float:
        if batch <= 0:
            return 0.0
        return self.decode_base_s + self.decode_per_seq_s * batch + self.decode_per_ctx_token_s * context_tokens

    def scaled(self, speedup: float) -> PerfProfile:
        """The same machine, `speedup` times faster (for time-compressed replays)."""
        f = 1.0 / speedup
        return replace(self, prefill_base_s=self.prefill_base_s * f, prefill_per_token_s=self.prefill_per_token_s * f,
                       decode_base_s=self.decode_base_s * f, decode_per_seq_s=self.decode_per_seq_s * f,
                       decode_per_ctx_token_s=self.decode_per_ctx_token_s * f)


PROFILES = {
    # instant-ish, for tests of the HTTP surface
    "fast": PerfProfile("fast", 0.0005, 1e-6, 0.0005, 1e-5, 0.0, cache_blocks=4096, block_size=16),
    # Llama-3-8B on one A10G-class GPU (about 3k prompt tokens/s, 25 ms decode steps)
    "a10g-8b": PerfProfile("a10g-8b", 0.015, 0.00033, 0.025, 0.0004, 2e-8, cache_blocks=176, block_size=256),
    # Llama-3-8B on one H100-class GPU (about 20k prompt tokens/s, 12 ms steps)
    "h100-8b": PerfProfile("h100-8b", 0.008, 0.00005, 0.012, 0.0002, 1e-8, cache_blocks=4000, block_size=256),
}


def profile(name: str) -> PerfProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown performance profile {name!r}; allowed: {', '.join(PROFILES)}") from None

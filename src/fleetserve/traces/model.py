"""One traced request, whatever the source format."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float  # seconds after the trace start
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()  # Mooncake prefix blocks (equal id = equal prefix)
    session: str | None = None
    messages: tuple[dict, ...] | None = None  # prompt logs: the real text
    prompt: str | None = None

    def token_ids(self, unique_seed: int = 0) -> list[int]:
        """Deterministic prompt tokens: each hash id stands for the same 512 tokens wherever it appears;
        without hash ids every request gets tokens of its own."""
        if self.hash_ids:
            blocks = np.concatenate([_block_tokens(h) for h in self.hash_ids])
            return blocks[: self.input_tokens].tolist()
        return _block_tokens(10**9 + unique_seed, self.input_tokens).tolist()


@functools.lru_cache(maxsize=65536)
def _block_tokens(seed: int, n: int = MOONCAKE_BLOCK_TOKENS) -> np.ndarray:
    arr = np.random.default_rng(seed).integers(0, 32000, n, dtype=np.int32)
    arr.flags.writeable = False
    return arr

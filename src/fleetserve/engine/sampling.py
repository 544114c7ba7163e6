"""Next-token choice: penalties, temperature, nucleus (top-p), seeded per request for reproducibility."""

from __future__ import annotations

import torch

from fleetserve.api.protocol import SamplingParams


def apply_penalties(logits: torch.Tensor, counts: dict[int, int], params: SamplingParams) -> torch.Tensor:
    """OpenAI's presence/frequency penalties over the tokens generated so far."""
    if not counts or (params.presence_penalty == 0 and params.frequency_penalty == 0):
        return logits
    ids = torch.tensor(list(counts.keys()), dtype=torch.long)
    freq = torch.tensor(list(counts.values()), dtype=logits.dtype)
    logits = logits.clone()
    logits[ids] -= params.presence_penalty + params.frequency_penalty * freq
    return logits


def choose_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None, counts: dict[int, int]
) -> int:
    """One token id from a 1-D logits vector. Never raises on odd numbers: when the distribution is not a
    usable one (NaN or infinite after penalties and temperature, nothing kept by top-p), the most likely token
    is taken, as greedy decoding would."""
    logits = apply_penalties(logits.float(), counts, params)
    if params.temperature == 0.0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        keep = cumulative - sorted_probs < params.top_p
        keep[0] = True  # the most likely token always stays, whatever rounding did to the sums
        sorted_probs = sorted_probs * keep
        total = sorted_probs.sum()
        if not torch.isfinite(total) or total <= 0:
            return int(torch.argmax(logits))
        choice = torch.multinomial(sorted_probs / total, 1, generator=generator)
        return int(order[choice])
    if not torch.isfinite(probs).all() or probs.sum() <= 0:
        return int(torch.argmax(logits))
    return int(torch.multinomial(probs, 1, generator=generator))

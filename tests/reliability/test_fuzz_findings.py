"""What the fuzzers (tests/fuzz) found, each pinned by a test that failed before its fix."""

from __future__ import annotations

import pytest
import torch

from fleetserve.api.protocol import parse_completion
from fleetserve.engine.sampling import choose_token


@pytest.mark.parametrize("sampling", [
    {"top_p": 5e-324},  # rounds to 0 in float32: no token was kept, multinomial raised (a 500 / error event)
    {"top_p": 1e-46},
    {"temperature": 5e-324},  # logits / temperature overflowed to inf, softmax gave NaN
    {"temperature": 1e-30, "top_p": 0.5},
])
def test_tiny_top_p_and_temperature_sample_a_token(sampling):
    parsed = parse_completion({"prompt": "x", **sampling})
    logits = torch.linspace(-30.0, 30.0, 1000)
    token = choose_token(logits, parsed.sampling, torch.Generator().manual_seed(0), {})
    assert token == 999  # the meaning is kept: top-1 / greedy


def test_tiny_values_keep_their_meaning_and_normal_values_pass_unchanged():
    assert parse_completion({"prompt": "x", "temperature": 1e-9}).sampling.temperature == 0.0
    assert parse_completion({"prompt": "x", "top_p": 5e-324}).sampling.top_p > 0.0
    plain = parse_completion({"prompt": "x", "temperature": 0.7, "top_p": 0.9}).sampling
    assert (plain.temperature, plain.top_p) == (0.7, 0.9)

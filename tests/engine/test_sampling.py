import torch

from fleetserve.api.protocol import SamplingParams
from fleetserve.engine.sampling import choose_token


def test_greedy_at_temperature_zero():
    logits = torch.tensor([0.1, 3.0, 0.2])
    assert choose_token(logits, SamplingParams(temperature=0.0), None, {}) == 1


def test_seed_makes_sampling_reproducible():
    logits = torch.randn(100, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0, seed=7)
    a = [choose_token(logits, params, torch.Generator().manual_seed(7), {}) for _ in range(3)]
    b = [choose_token(logits, params, torch.Generator().manual_seed(7), {}) for _ in range(3)]
    assert a == b


def test_tiny_top_p_keeps_only_the_most_likely():
    logits = torch.tensor([1.0, 5.0, 2.0, 0.5])
    gen = torch.Generator().manual_seed(1)
    assert {choose_token(logits, SamplingParams(top_p=0.01), gen, {}) for _ in range(20)} == {1}


def test_penalties_move_probability_away_from_repeats():
    logits = torch.tensor([2.0, 1.9])
    params = SamplingParams(temperature=0.0, presence_penalty=1.0)
    assert choose_token(logits, params, None, {0: 1}) == 1

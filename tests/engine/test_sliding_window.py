"""Sliding-window attention models (Mistral-7B-v0.1, Gemma 2/3's local layers, Qwen2 with use_sliding_window).

Their cache keeps only the window's last positions per sliding layer. The prefix cache stored blocks sliced as if it
held the whole prompt (a second request reused wrong KV and answered differently, still reporting cached tokens),
and the batch's KV buffer stacked layers of different lengths (every prompt past the window: 500
generation_failed). Both are off for such a model; it is served one sequence at a time, and answers as
transformers' own generation does."""

from __future__ import annotations

import logging

import httpx
import pytest

from tests.helpers import Server

PROMPT = "The quick brown fox jumps over the lazy dog. " * 4  # 180 tokens: past the 32-token window


@pytest.fixture(scope="module")
def windowed_model(tmp_path_factory):
    from fleetserve.engine.tiny import create_tiny_model

    return create_tiny_model(tmp_path_factory.mktemp("models") / "windowed", sliding_window=32, context_length=512)


def _reference(model_dir, prompt: str, tokens: int) -> str:
    """transformers' own greedy continuation (its cache handles the window)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_the_runner_names_the_window_only_when_it_is_narrower_than_the_context(windowed_model, tiny_model):
    from fleetserve.engine.runner import ModelRunner

    assert ModelRunner(windowed_model, threads=1).sliding_window == 32
    assert ModelRunner(windowed_model, threads=1, context_length=32).sliding_window == 32
    assert ModelRunner(windowed_model, threads=1, context_length=31).sliding_window is None  # never reached
    assert ModelRunner(tiny_model, threads=1).sliding_window is None


def test_batching_and_the_prefix_cache_are_off_and_said(windowed_model, caplog):
    from fleetserve.engine.main import attach_prefix_cache
    from fleetserve.engine.runner import ModelRunner
    from fleetserve.engine.scheduler import SerialScheduler
    from fleetserve.engine.server import Engine, EngineSettings
    from fleetserve.observe.metrics import ModelIdentity

    runner = ModelRunner(windowed_model, threads=1)
    with caplog.at_level(logging.WARNING):
        engine = Engine(runner, EngineSettings("w", ModelIdentity("default", "w", "1", "local", "r0"), max_batch=8))
        attach_prefix_cache(engine, 16, 1 << 20, 0, None)
    assert isinstance(engine.scheduler, SerialScheduler) and engine.settings.max_batch == 1
    assert runner.prefix_cache is None
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "continuous batching is off" in said and "prefix KV cache is off" in said and "32-token window" in said


def test_an_engine_serves_a_windowed_model_as_transformers_does(windowed_model, tmp_path):
    """A real engine with its defaults (batching, the prefix cache): the same long prompt twice answers as
    transformers does, with nothing reported cached; before, the first was a 500 (layers of 180 and 31 positions
    stacked)."""
    expected = _reference(windowed_model, PROMPT, 8)
    server = Server(["engine", "--model", str(windowed_model), "--served-model-name", "w", "--threads", "1",
                     "--block-size", "16"], tmp_path / "engine.log").start()
    try:
        for _ in range(2):
            r = httpx.post(server.url + "/v1/completions", json={"model": "w", "prompt": PROMPT, "max_tokens": 8,
                                                                 "temperature": 0, "ignore_eos": True}, timeout=60)
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["choices"][0]["text"] == expected
            assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        info = httpx.get(server.url + "/get_model_info", timeout=10).json()
        assert info["num_gpu_blocks"] == 0 and info["kv_events"] is None  # no cache for a router to count on
    finally:
        server.stop()
    log = (tmp_path / "engine.log").read_text()
    assert "continuous batching is off" in log and "prefix KV cache is off" in log

"""Finding 2: bounded bodies and headers everywhere, and no tokenizing on the event loop."""

import asyncio
import json
import threading

import httpx
import pytest

from fleetserve.api.errors import APIError
from fleetserve.api.protocol import parse_chat
from fleetserve.engine.runner import ModelRunner
from fleetserve.engine.server import Engine, EngineSettings
from fleetserve.observe.metrics import ModelIdentity
from tests.helpers import Server


@pytest.fixture(scope="module")
def small_limits_engine(tiny_model, tmp_path_factory):
    server = Server(["engine", "--model", str(tiny_model), "--served-model-name", "tiny", "--threads", "1",
                     "--max-body-bytes", "65536", "--max-header-bytes", "8192"],
                    tmp_path_factory.mktemp("bounds") / "engine.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def small_limits_router(small_limits_engine, tmp_path_factory):
    server = Server(["router", "--backend", small_limits_engine.url, "--max-body-bytes", "65536",
                     "--max-header-bytes", "8192"], tmp_path_factory.mktemp("bounds") / "router.log").start()
    yield server
    server.stop()


def _chat(size):
    return {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "x" * size}]}


@pytest.mark.parametrize("which", ["small_limits_engine", "small_limits_router"])
def test_a_body_over_the_limit_is_413_in_openai_json(which, request):
    url = request.getfixturevalue(which).url
    r = httpx.post(url + "/v1/chat/completions", json=_chat(100_000), timeout=30)
    assert r.status_code == 413
    error = r.json()["error"]
    assert error["code"] == "request_too_large" and "maxBodyBytes" in error["message"]


@pytest.mark.parametrize("which", ["small_limits_engine", "small_limits_router"])
def test_a_chunked_body_over_the_limit_is_413_too(which, request):
    """No content-length to trust: the body is counted as it arrives."""
    url = request.getfixturevalue(which).url

    def chunks():
        for _ in range(40):
            yield b"x" * 4096

    r = httpx.post(url + "/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("which", ["small_limits_engine", "small_limits_router"])
def test_headers_over_the_limit_are_431(which, request):
    url = request.getfixturevalue(which).url
    r = httpx.post(url + "/v1/chat/completions", json=_chat(5), headers={"x-padding": "p" * 20_000}, timeout=30)
    assert r.status_code == 431 and r.json()["error"]["code"] == "headers_too_large"


def test_bodies_under_the_limit_still_work(small_limits_router):
    assert httpx.post(small_limits_router.url + "/v1/chat/completions", json=_chat(100), timeout=60).status_code == 200


def test_a_prompt_that_cannot_fit_is_refused_before_tokenizing(tiny_model):
    runner = ModelRunner(tiny_model, threads=1)
    engine = Engine(runner, EngineSettings("tiny", ModelIdentity("default", "tiny", "1", "local", "r0")))
    calls = []
    runner.chat_ids = lambda *args: calls.append(1) or [1]
    too_long = runner.context_length * runner.max_token_chars() + 1
    with pytest.raises(APIError) as err:
        asyncio.run(engine._tokenize(parse_chat(_chat(too_long))))
    assert err.value.code == "context_length_exceeded" and calls == []


def test_tokenizing_runs_off_the_event_loop_thread(tiny_model):
    runner = ModelRunner(tiny_model, threads=1)
    engine = Engine(runner, EngineSettings("tiny", ModelIdentity("default", "tiny", "1", "local", "r0")))
    seen = []
    original = runner.chat_ids
    runner.chat_ids = lambda *args: seen.append(threading.current_thread()) or original(*args)

    async def main():
        ids, budget, _ = await engine._tokenize(parse_chat(_chat(20)))
        return ids, budget, threading.current_thread()

    ids, budget, loop_thread = asyncio.run(main())
    assert ids and budget > 0
    assert seen and seen[0] is not loop_thread


def test_a_completion_prompt_over_the_context_names_the_prompt(tiny_model):
    """`/v1/completions` over the context answered context_length_exceeded naming `messages`, which it has none of."""
    from fleetserve.api.protocol import parse_completion

    runner = ModelRunner(tiny_model, threads=1)
    engine = Engine(runner, EngineSettings("tiny", ModelIdentity("default", "tiny", "1", "local", "r0")))
    with pytest.raises(APIError) as err:
        asyncio.run(engine._tokenize(parse_completion({"prompt": [1] * runner.context_length, "max_tokens": 3})))
    assert (err.value.code, err.value.param) == ("context_length_exceeded", "prompt")


def test_a_stream_just_under_the_routers_limit_reaches_the_engine(tiny_model, tmp_path):
    """A learning router adds `stream_options.include_usage` (and a tenant's cache_salt) to what it forwards: with
    the engine's limit equal to the router's, a body just under the limit got a 413 from the engine. Fleets give
    their engines twice the clients' limit (api/limits.engine_body_limit), as here."""
    from fleetserve.api.limits import engine_body_limit

    engine = Server(["engine", "--model", str(tiny_model), "--served-model-name", "tiny", "--threads", "1",
                     "--max-body-bytes", str(engine_body_limit(65536))], tmp_path / "engine.log").start()
    router = Server(["router", "--strategy", "prefixaware", "--backend", engine.url, "--max-body-bytes", "65536"],
                    tmp_path / "router.log").start()
    try:
        text = json.dumps({**_chat(5), "stream": True}).encode()
        raw = b"{" + b" " * (65536 - len(text) - 8) + text[1:]  # the size of a long prompt, the tokens of a short one
        with httpx.stream("POST", router.url + "/v1/chat/completions", content=raw, timeout=60,
                          headers={"content-type": "application/json"}) as r:
            assert r.status_code == 200, r.read()
            text = r.read().decode()
        assert text.rstrip().endswith("data: [DONE]") and '"choices":[]' not in text.replace(" ", "")
    finally:
        router.stop()
        engine.stop()


def test_a_completion_budget_over_the_context_names_the_field_the_client_sent(tiny_model):
    """max_completion_tokens over the context was reported as `max_tokens`, which the client had not sent."""
    from fleetserve.api.protocol import parse_chat

    runner = ModelRunner(tiny_model, threads=1)
    engine = Engine(runner, EngineSettings("tiny", ModelIdentity("default", "tiny", "1", "local", "r0")))
    for field in ("max_completion_tokens", "max_tokens"):
        body = {"messages": [{"role": "user", "content": "hi"}], field: runner.context_length}
        with pytest.raises(APIError) as err:
            asyncio.run(engine._tokenize(parse_chat(body)))
        assert (err.value.code, err.value.param) == ("context_length_exceeded", field)
        assert f"Reduce the prompt or {field}." in err.value.message


def test_a_context_length_above_the_models_maximum_is_warned_and_the_maximum_served(tiny_model, caplog):
    import logging

    native = ModelRunner(tiny_model, threads=1).context_length
    with caplog.at_level(logging.WARNING, logger="fleetserve.engine.runner"):
        runner = ModelRunner(tiny_model, threads=1, context_length=native * 4)
    assert runner.context_length == native
    assert f"context length {native * 4} is above the model's maximum" in caplog.text


def test_prompts_being_tokenized_may_fill_the_batch_and_the_queue_before_a_503(tiny_model):
    from fleetserve.api.protocol import parse_completion

    runner = ModelRunner(tiny_model, threads=1)
    engine = Engine(runner, EngineSettings("tiny", ModelIdentity("default", "tiny", "1", "local", "r0"),
                                           max_waiting=2, max_batch=2))
    engine._tokenizing = 2  # two others being tokenized on an idle engine: this one has a batch slot to go to
    ids, _, _ = asyncio.run(engine._tokenize(parse_completion({"prompt": "hello", "max_tokens": 1})))
    assert ids
    engine._tokenizing = 4  # the batch and the queue are spoken for
    with pytest.raises(APIError) as err:
        asyncio.run(engine._tokenize(parse_completion({"prompt": "hello", "max_tokens": 1})))
    assert err.value.status == 503


def test_a_request_still_tokenizing_when_the_drain_time_runs_out_is_answered_503_not_cut(tiny_model):
    """`stop_answers` ended the jobs it knew; one still being tokenized was submitted after it and cut by uvicorn's
    cancel a moment later, unanswered."""
    from starlette.testclient import TestClient

    from fleetserve.engine.server import build_app

    runner = ModelRunner(tiny_model, threads=1)
    engine = Engine(runner, EngineSettings("tiny", ModelIdentity("default", "tiny", "1", "local", "r0")))
    engine.stop_answers()  # the drain time ran out
    with TestClient(build_app(engine)) as client:
        r = client.post("/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_stopping"


def test_a_fault_of_the_engine_mid_stream_is_an_error_event_counted_as_a_500(tiny_model):
    """A non-API exception inside a stream cut the connection (the client saw no error event) and was logged as
    the client's 499, never counted as an error."""
    from starlette.testclient import TestClient

    from fleetserve.engine.server import build_app

    runner = ModelRunner(tiny_model, threads=1)
    engine = Engine(runner, EngineSettings("tiny", ModelIdentity("default", "tiny", "1", "local", "r0")))

    async def breaks_after_one_token(job, started):
        yield ("token", "a")
        raise RuntimeError("a bug")

    engine._events = breaks_after_one_token
    with TestClient(build_app(engine)) as client:
        with client.stream("POST", "/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 4,
                                                             "stream": True}) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        metrics = client.get("/metrics").text
    assert '"internal_error"' in events[-2] and events[-1] == "data: [DONE]", events
    assert 'model_errors_total{' in metrics and any('status="500"' in line and line.endswith(" 1.0")
                                                    for line in metrics.splitlines()
                                                    if line.startswith("model_errors_total")), metrics

"""The built-in engine as a real process, driven by the official openai client and raw HTTP."""

import json

import httpx
import openai
import pytest

from tests.helpers import Server, wait_until
from tests.metrics_text import sample


@pytest.fixture(scope="module")
def client(tiny_engine):
    return openai.OpenAI(base_url=tiny_engine.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_served_name(client):
    (model,) = client.models.list().data
    assert model.id == "tiny"
    assert "/" not in model.model_extra["root"]  # the folder's name, not the server's filesystem layout


def test_chat_completion_with_usage(client):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8)
    assert r.object == "chat.completion" and r.model == "tiny"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_chat_yields_chunks_and_final_usage(client):
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=12, temperature=0,
        stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                           max_tokens=12, temperature=0)
    assert streamed == whole.choices[0].message.content  # greedy: streaming changes nothing but delivery


def test_completions_stream_and_echo(client):
    r = client.completions.create(model="tiny", prompt="abc", max_tokens=4, echo=True, temperature=0)
    assert r.choices[0].text.startswith("abc")
    chunks = list(client.completions.create(model="tiny", prompt="abc", max_tokens=4, stream=True))
    assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_echo_of_a_token_id_prompt_is_its_text(client, tiny_model):
    """A prompt of token ids was not echoed: the answer read as if echo had not been asked."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny_model)("the quick brown fox")["input_ids"]
    text = AutoTokenizer.from_pretrained(tiny_model).decode(ids)
    whole = client.completions.create(model="tiny", prompt=ids, max_tokens=3, echo=True, temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt=ids, max_tokens=3, echo=True, temperature=0, stream=True) if c.choices)
    plain = client.completions.create(model="tiny", prompt=ids, max_tokens=3, temperature=0).choices[0].text
    assert whole.choices[0].text == streamed == text + plain


def test_seed_reproduces_sampling(client):
    def run():
        return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                              max_tokens=16, temperature=1.0, top_p=0.9, seed=123
                                              ).choices[0].message.content
    assert run() == run()


def test_stop_sequence_is_not_returned(client):
    base = client.completions.create(model="tiny", prompt="abc", max_tokens=20, temperature=0).choices[0].text
    if len(base) < 4:
        pytest.skip("tiny model ended too early for a stop test")
    stop = base[2:4]
    r = client.completions.create(model="tiny", prompt="abc", max_tokens=20, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == base[: base.index(stop)]


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"model": "tiny"}, 400, "messages"),
        ({"model": "tiny", "messages": "hi"}, 400, "messages"),
        ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": -5}, 400, "max_tokens"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400, "temperature"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "x" * 600}]}, 400, "messages"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}, 400, "max_tokens"),
    ],
)
def test_bad_requests_get_openai_errors(tiny_engine, body, status, param):
    r = httpx.post(tiny_engine.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == status
    error = r.json()["error"]
    assert error["param"] == param and error["message"]


def test_malformed_json_and_unknown_path(tiny_engine):
    r = httpx.post(tiny_engine.url + "/v1/chat/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.get(tiny_engine.url + "/v1/nothing", timeout=30)
    assert r.status_code == 404 and "error" in r.json()


def test_an_engine_on_its_own_refuses_what_the_router_refuses(tiny_engine):
    """An engine with no router in front (no internal token) took what a web page may send any address without
    a preflight, answered a 5,000-digit number with a 500, redirected a trailing slash to the client's own Host
    header, and logged two ERROR tracebacks for a client that left while sending its body."""
    import socket
    import time

    url = tiny_engine.url + "/v1/chat/completions"
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}'
    for headers, status, code in [
        ({"content-type": "text/plain"}, 415, "unsupported_media_type"),
        ({"content-type": "application/json", "content-encoding": "gzip"}, 415, "unsupported_media_type"),
        ({"content-type": "application/json", "sec-fetch-site": "cross-site"}, 403, "cross_site_request"),
        ({"content-type": "application/json", "origin": "http://evil.example"}, 403, "cross_site_request"),
    ]:
        r = httpx.post(url, content=body, headers=headers, timeout=30)
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), headers
    same_site = {"content-type": "application/json", "origin": tiny_engine.url, "sec-fetch-site": "same-origin"}
    assert httpx.post(url, content=body, headers=same_site, timeout=30).status_code == 200
    r = httpx.post(url, content=b'{"max_tokens": ' + b"9" * 5000 + b"}", timeout=30)
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_json")
    r = httpx.post(url + "/", content=body, headers={"host": "evil.example"}, timeout=30)
    assert r.status_code == 404 and "location" not in r.headers and r.json()["error"]["code"] == "not_found"
    r = httpx.get(url, timeout=30)  # as the router answers it: the code, and the method allowed
    assert (r.status_code, r.json()["error"]["code"], r.headers["allow"]) == (405, "method_not_allowed", "POST")
    logged = tiny_engine.log_path.stat().st_size
    with socket.create_connection(("127.0.0.1", tiny_engine.port)) as sock:  # leaves after half its body
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"a\": 1")
        time.sleep(0.3)

    def since() -> str:
        return tiny_engine.log_path.read_bytes()[logged:].decode(errors="replace")

    wait_until(lambda: "status=499" in since() or "Traceback" in since(), 30, what="the engine to log the client")
    assert "Traceback" not in since() and "ERROR" not in since(), since()


def test_openai_client_raises_typed_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "y" * 600}])


def test_metrics_use_vllm_and_hyperpod_names(tiny_engine, client):
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "m"}], max_tokens=2)
    labels = {"model_name": "tiny", "namespace": "default", "model_version": "1", "instance_type": "local",
              "replica": "r0"}
    assert sample(tiny_engine.url, "model_invocations_total", **labels) >= 1
    assert sample(tiny_engine.url, "model_ttfb_milliseconds_count", **labels) >= 1
    assert sample(tiny_engine.url, "model_latency_milliseconds_count", **labels) >= 1
    assert sample(tiny_engine.url, "vllm:num_requests_running", model_name="tiny") == 0
    assert sample(tiny_engine.url, "vllm:generation_tokens_total", model_name="tiny") >= 1
    before = sample(tiny_engine.url, "model_invocations_total", **labels)
    with pytest.raises(openai.NotFoundError):  # another model's request is none of this model's invocations
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "m"}], max_tokens=2)
    assert sample(tiny_engine.url, "model_invocations_total", **labels) == before
    with pytest.raises(KeyError):  # never counted, so never exposed
        sample(tiny_engine.url, "model_errors_total", status="404", **labels)


def test_client_disconnect_cancels_generation(slow_model, tmp_path_factory):
    server = Server(["engine", "--model", str(slow_model), "--served-model-name", "slow", "--threads", "1"],
                    tmp_path_factory.mktemp("logs") / "slow.log").start()
    try:
        body = {"model": "slow", "prompt": "a", "max_tokens": 3000, "stream": True, "temperature": 0,
                "ignore_eos": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()  # keep the iterator referenced: closing it would close the stream
            first = next(line for line in lines if line.startswith("data: {"))
            assert json.loads(first[6:])["object"] == "text_completion"
            assert sample(server.url, "vllm:num_requests_running", model_name="slow") == 1
        # the connection is closed here; the engine must stop generating long before 3,000 tokens
        wait_until(lambda: sample(server.url, "vllm:num_requests_running", model_name="slow") == 0, 60,
                   what="generation to stop")
        assert sample(server.url, "model_concurrent_requests", model_name="slow") == 0
        assert sample(server.url, "vllm:generation_tokens_total", model_name="slow") < 3000
    finally:
        server.stop()


def test_a_completion_without_max_tokens_stops_at_16_as_openai_and_vllm_do(client):
    """It ran to the chat default (512, or the context): a client moved from OpenAI or vLLM got 30x the tokens."""
    r = client.completions.create(model="tiny", prompt="abc", extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"


def test_a_stream_whose_text_is_held_back_says_it_is_alive(tiny_model, tmp_path_factory):
    """A random bytes-alphabet model decodes to incomplete UTF-8 for token after token: the engine held its text
    back and sent nothing, and the router's stream idle timeout cut a stream that was generating. Held-back tokens
    now send an SSE comment past `--stream-keepalive` (0 here: at each one), which the openai client skips."""
    server = Server(["engine", "--model", str(tiny_model), "--served-model-name", "tiny", "--threads", "1",
                     "--stream-keepalive", "0"], tmp_path_factory.mktemp("logs") / "keepalive.log").start()
    try:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64,
                "temperature": 1.0, "seed": 0, "ignore_eos": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True},
                          timeout=60) as r:
            events = r.read().decode().split("\n\n")
        assert events[0].startswith("data: {")  # an answer begins with a chunk, never with a comment
        assert ": keep-alive" in events  # a byte-level random model holds text back (checked on this seed)
        assert all(e.startswith("data: ") or e in (": keep-alive", "") for e in events), events
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        asked = {k: v for k, v in body.items() if k != "ignore_eos"}
        whole = client.chat.completions.create(**asked, extra_body={"ignore_eos": True})
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            **asked, stream=True, extra_body={"ignore_eos": True}) if c.choices)
        assert streamed == whole.choices[0].message.content
    finally:
        server.stop()


def test_a_conversation_the_models_template_refuses_is_a_400_naming_messages(tiny_model, tmp_path):
    """Gemma's template refuses a system turn, Mistral's roles that do not alternate (`raise_exception`): the
    engine answered 500 "internal error (TemplateError)" with two tracebacks, and the openai client retried it."""
    import shutil

    strict = tmp_path / "strict"
    shutil.copytree(tiny_model, strict)
    template = strict / "chat_template.jinja"
    template.write_text("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
                        "{% endif %}" + template.read_text())
    server = Server(["engine", "--model", str(strict), "--served-model-name", "strict", "--threads", "1"],
                    tmp_path / "engine.log").start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="strict", max_tokens=2, messages=[
                {"role": "system", "content": "s"}, {"role": "user", "content": "x"}])
        error = refused.value.body
        assert error["param"] == "messages" and "System role not supported" in error["message"], error
        answer = client.chat.completions.create(model="strict", max_tokens=2,
                                                messages=[{"role": "user", "content": "x"}])
        assert answer.choices  # the template itself works
    finally:
        server.stop()
    assert "Traceback" not in (tmp_path / "engine.log").read_text()


def test_an_internal_error_is_counted_and_logged_as_an_error(tiny_model, tmp_path):
    """A 500 of the engine's own (here a template that fails on every chat) was counted as an invocation and never
    as an error, and wrote no request line: a fleet failing every request read an error ratio of 0, and no alert
    fired."""
    import shutil

    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    (broken / "chat_template.jinja").write_text("{{ messages[0]['content'] + 1 }}")
    server = Server(["engine", "--model", str(broken), "--served-model-name", "broken", "--threads", "1"],
                    tmp_path / "engine.log").start()
    try:
        for _ in range(2):
            r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
                "model": "broken", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
        text = httpx.get(server.url + "/metrics", timeout=30).text
    finally:
        server.stop()
    errors = {s.labels.get("status"): s.value for f in text_string_to_metric_families(text)
              if f.name == "model_errors" for s in f.samples if s.name == "model_errors_total"}
    assert errors.get("500") == 2, errors
    assert sum(" status=500" in line for line in (tmp_path / "engine.log").read_text().splitlines()) == 2


def test_a_broken_chat_template_is_the_models_fault_not_the_clients(tiny_model):
    """Only the template's own raise_exception (a TemplateError as such) refuses a conversation: a syntax error or
    an unknown filter (its subclasses) is a broken model, and answering every chat 400 would blame the client."""
    from jinja2 import TemplateError

    from fleetserve.api.errors import APIError
    from fleetserve.engine.runner import ModelRunner

    runner = ModelRunner(tiny_model, threads=1)
    messages = [{"role": "user", "content": "x"}]
    runner.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }"
    with pytest.raises(TemplateError) as broken:
        runner.chat_ids(messages)
    assert not isinstance(broken.value, APIError)
    runner.tokenizer.chat_template = "{{ raise_exception('Conversation roles must alternate') }}"
    with pytest.raises(APIError) as refused:
        runner.chat_ids(messages)
    assert refused.value.status == 400 and "roles must alternate" in refused.value.message


def test_chat_template_kwargs_are_the_templates_variables(tiny_model):
    from fleetserve.engine.runner import ModelRunner

    runner = ModelRunner(tiny_model, threads=1)
    runner.tokenizer.chat_template = ("{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}"
                                      "{{ messages[0]['content'] }}")
    messages = [{"role": "user", "content": "hi"}]
    assert runner.decode(runner.chat_ids(messages, {"enable_thinking": False})).startswith("/no_think")
    assert not runner.decode(runner.chat_ids(messages)).startswith("/no_think")


def test_a_clients_request_id_is_echoed_and_an_insane_one_is_dropped(tiny_engine):
    """An engine on its own had answered without the client's x-request-id, and logged any id as sent (a
    50,000-character one in every line about the request)."""
    url = tiny_engine.url + "/v1/chat/completions"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    r = httpx.post(url, json=body, headers={"x-request-id": "trace-42"}, timeout=30)
    assert r.status_code == 200 and r.headers["x-request-id"] == "trace-42"
    r = httpx.post(url, json={**body, "max_tokens": -1}, headers={"x-request-id": "trace-43"}, timeout=30)
    assert r.status_code == 400 and r.headers["x-request-id"] == "trace-43"  # on refusals too
    logged = tiny_engine.log_path.stat().st_size
    r = httpx.post(url, json=body, headers={"x-request-id": "y" * 50_000}, timeout=30)
    assert r.status_code == 200 and "x-request-id" not in r.headers
    huge = httpx.post(url, json=body, headers={"x-request-id": "y" * 1_000_000}, timeout=30)
    assert huge.status_code == 431  # counted by the header limit before the echo drops it

    def since() -> str:
        return tiny_engine.log_path.read_bytes()[logged:].decode(errors="replace")

    wait_until(lambda: "status=200" in since(), 30, what="the request's log line")
    assert "y" * 129 not in since() and "chatcmpl-" in since(), since()

import json
import subprocess
import sys

import httpx
import pytest

from fleetserve.fleet.process import free_port
from tests.helpers import http_ok, wait_until


@pytest.fixture
def zero_backend():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fleetserve.bench.zero_backend", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.poll() is not None or http_ok(url + "/health"), 30, what="zero backend")
        assert proc.poll() is None
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_zero_backend_answers_chat_and_completions_with_usage(zero_backend):
    with httpx.Client(base_url=zero_backend, trust_env=False) as client:  # one keep-alive connection
        chat = client.post("/v1/chat/completions", json={"model": "zero", "messages": [{"role": "user",
                                                                                       "content": "hi"}]})
        text = client.post("/v1/completions", json={"model": "zero", "prompt": "hi"})
        assert chat.status_code == 200 and text.status_code == 200
        assert chat.json()["choices"][0]["message"]["content"]
        assert text.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert client.get("/ping").json() == {"status": "ok"}
        assert client.get("/v1/models").json()["data"][0]["id"] == "zero"
        assert client.get("/get_model_info").json()["block_size"] == 16
        assert client.get("/kv/blocks").status_code == 404


def test_zero_backend_streams_sse_chunks_then_done(zero_backend):
    body = {"model": "zero", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.Client(base_url=zero_backend, trust_env=False) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            assert r.headers["transfer-encoding"] == "chunked"
            data = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
        assert data[-1] == "[DONE]"
        events = [json.loads(d) for d in data[:-1]]
        assert events[0]["choices"][0]["delta"]["content"] == "ok"
        assert events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert client.get("/health").status_code == 200  # the connection is still usable after the stream

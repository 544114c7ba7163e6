"""The simulated engine as a real process: same HTTP surface, prefix cache, KV events, probes."""

import httpx
import openai
import pytest

from tests.helpers import Server, wait_until
from tests.metrics_text import sample


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    server = Server(["engine", "--simulate", "fast", "--served-model-name", "sim", "--cache-blocks", "8",
                     "--block-size", "4"], tmp_path_factory.mktemp("sim") / "sim.log").start()
    yield server
    server.stop()


def complete(url, prompt, **kw):
    r = httpx.post(url + "/v1/completions", json={"model": "sim", "prompt": prompt, "max_tokens": 3, **kw},
                   timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_openai_client_chat_and_stream(sim):
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert r.usage.completion_tokens == 4 and r.choices[0].message.content
    chunks = list(client.completions.create(model="sim", prompt="a b c", max_tokens=5, stream=True,
                                            stream_options={"include_usage": True}))
    assert len([c for c in chunks if c.choices]) == 5 and chunks[-1].usage.completion_tokens == 5
    # models.retrieve, as the built-in engine answers it (it was a 404 through the router)
    assert client.models.retrieve("sim").id == "sim"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")


def test_repeated_prefix_is_cached_and_events_are_published(sim):
    seq = httpx.get(sim.url + "/kv/blocks", timeout=5).json()["seq"]
    prompt = list(range(100, 112))  # 3 blocks of 4 tokens
    first = complete(sim.url, prompt + [1])
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    second = complete(sim.url, prompt + [2, 3])
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 12
    assert second["fleetserve_timing"]["prefill_ms"] < first["fleetserve_timing"]["prefill_ms"] + 1e-9
    events = httpx.get(sim.url + "/kv/events", params={"since": seq, "wait": 0}, timeout=5).json()
    stored = [k for e in events["events"] if e["type"] == "stored" for k in e["keys"]]
    assert len(stored) >= 3
    blocks = httpx.get(sim.url + "/kv/blocks", timeout=5).json()
    assert set(stored) & set(blocks["keys"])


def test_lru_capacity_evicts_and_publishes_removals(sim):
    seq = httpx.get(sim.url + "/kv/blocks", timeout=5).json()["seq"]
    for start in range(0, 200, 40):  # 5 prompts x 3 blocks > 8 blocks of capacity
        complete(sim.url, list(range(5000 + start, 5000 + start + 12)))
    events = httpx.get(sim.url + "/kv/events", params={"since": seq, "wait": 0}, timeout=5).json()["events"]
    assert any(e["type"] == "removed" for e in events)
    assert len(httpx.get(sim.url + "/kv/blocks", timeout=5).json()["keys"]) <= 8


def test_client_salt_separates_cache_and_a_client_cannot_claim_a_tenant(sim):
    prompt = list(range(900, 913))  # 3 whole blocks of 4 and a token: the last is always computed
    complete(sim.url, prompt, cache_salt="tenant-a")
    assert complete(sim.url, prompt)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # other namespace
    # without the fleet's internal token, a tenant header is dropped: this lands in the unsalted namespace
    claimed = httpx.post(sim.url + "/v1/completions", json={"model": "sim", "prompt": prompt, "max_tokens": 2},
                         headers={"x-fleetserve-tenant": "tenant-a"}, timeout=30).json()
    assert claimed["usage"]["prompt_tokens_details"]["cached_tokens"] == 12
    again = complete(sim.url, prompt, cache_salt="tenant-a")
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 12


def test_peer_router_probes_and_vllm_metrics(sim):
    for path in ("/get_load", "/v1/loads", "/get_model_info", "/get_server_info", "/model_info", "/server_info",
                 "/version", "/health", "/v1/models"):
        assert httpx.get(sim.url + path, timeout=5).status_code == 200, path
    info = httpx.get(sim.url + "/get_model_info", timeout=5).json()
    assert info["block_size"] == 4 and info["num_gpu_blocks"] == 8
    card = httpx.get(sim.url + "/v1/models", timeout=5).json()["data"][0]
    assert isinstance(card["created"], int) and card["created"] > 0  # OpenAI's Model requires it
    with httpx.stream("POST", sim.url + "/v1/completions", timeout=30,
                      json={"model": "sim", "prompt": "a b", "max_tokens": 2, "stream": True}) as stream:
        stream.read()  # as the built-in engine's: no proxy may buffer it, or TTFT reads the proxy's flush
        assert stream.headers["cache-control"] == "no-cache" and stream.headers["x-accel-buffering"] == "no"
    assert httpx.post(sim.url + "/tokenize", json={"prompt": "one two three"}, timeout=5).json()["count"] == 3
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:gpu_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
        sample(sim.url, name)
    assert sample(sim.url, "vllm:cache_config_info", block_size="4", num_gpu_blocks="8") == 1


def test_bad_requests(sim):
    r = httpx.post(sim.url + "/v1/completions", json={"model": "other", "prompt": "x"}, timeout=5)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = httpx.post(sim.url + "/v1/completions", json={"model": "sim"}, timeout=5)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    # placeholder text cannot honour a stop sequence or echo a prompt: both had been ignored without a word
    for extra, param in (({"stop": ["x"]}, "stop"), ({"echo": True}, "echo")):
        r = httpx.post(sim.url + "/v1/completions", json={"model": "sim", "prompt": "a", "max_tokens": 3, **extra},
                       timeout=5)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert r.json()["error"]["code"] == "unsupported_value"
    # a client that leaves while sending its body is a 499 line, as the built-in engine logs it (a traceback)
    import socket
    import time

    logged = sim.log_path.stat().st_size
    with socket.create_connection(("127.0.0.1", sim.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"a\": 1")
        time.sleep(0.3)

    def since() -> str:
        return sim.log_path.read_bytes()[logged:].decode(errors="replace")

    wait_until(lambda: "status=499" in since() or "Traceback" in since(), 30, what="the engine to log the client")
    assert "Traceback" not in since(), since()


def test_the_context_length_bounds_what_is_asked_as_the_built_in_engine_does(tmp_path):
    """`--context-length 100` was ignored: /v1/models said 1,000,000, 500 tokens were generated, and a max_tokens of
    2,000,000 ran for minutes."""
    short = Server(["engine", "--simulate", "fast", "--served-model-name", "sim", "--context-length", "100"],
                   tmp_path / "short.log").start()
    try:
        # before any request its model_* series are there at 0, as the built-in engine's: rate() had lost the
        # first burst of a fleet of simulated engines (bench --live), its errors' included
        assert sample(short.url, "model_invocations_total") == 0
        assert sample(short.url, "model_errors_total", status="503") == 0
        assert sample(short.url, "model_concurrent_requests") == 0
        assert sample(short.url, "model_ttfb_milliseconds_count") == 0
        assert httpx.get(short.url + "/v1/models", timeout=5).json()["data"][0]["max_model_len"] == 100
        r = httpx.post(short.url + "/v1/completions", json={"model": "sim", "prompt": "a b", "max_tokens": 500},
                       timeout=5)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert r.json()["error"]["param"] == "max_tokens"
        r = httpx.post(short.url + "/v1/chat/completions", timeout=5, json={
            "model": "sim", "messages": [{"role": "user", "content": " ".join(["w"] * 200)}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        r = httpx.post(short.url + "/v1/completions", json={"model": "sim", "prompt": "a b"}, timeout=5)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16  # a completion's default
    finally:
        short.stop()


def _stream_seconds(engine, tokens: int) -> float:
    """Seconds from a request's arrival at an idle in-process engine to its last token, in virtual time."""
    import asyncio

    from fleetserve.engine.simulated import SimRequest
    from fleetserve.sim.replica import Seq
    from tests.virtual_loop import run_virtual

    async def main() -> float:
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(engine.loop())
        req = SimRequest([1] * 8, [], tokens, True, loop.time())
        req.seq = Seq(8, tokens, [], req)
        start = loop.time()
        engine.model.add(req.seq)
        engine._work.set()
        await engine._finish(req)
        elapsed = loop.time() - start
        task.cancel()
        return elapsed

    return run_virtual(main())


def test_steps_keep_the_models_schedule_when_the_loop_is_late():
    """Work the event loop does between steps (here 6 ms of blocking per token, as SSE under load) delays a
    step's tokens but not the steps after it: 30 tokens take the model's 0.30 s, not 30 x 16 ms. In virtual time:
    the blocking moves the loop's clock (it had asserted on wall time, which a loaded machine stretched)."""
    import asyncio

    from fleetserve.engine.simulated import SimulatedEngine
    from fleetserve.sim.perf import PerfProfile

    prof = PerfProfile("steps", prefill_base_s=0.01, prefill_per_token_s=0.0, decode_base_s=0.01,
                       decode_per_seq_s=0.0, decode_per_ctx_token_s=0.0, cache_blocks=1000, block_size=16)
    engine = SimulatedEngine(prof, "m")
    emit = engine._emit

    def slow_emit(seq):
        asyncio.get_running_loop()._virtual_now += 0.006  # 6 ms of the loop's time spent here
        emit(seq)

    engine._emit = slow_emit
    elapsed = _stream_seconds(engine, 30)
    assert elapsed == pytest.approx(0.306)  # the last step's end, plus its emit; drifting: 0.01 + 29 x 0.016 = 0.47


def test_the_engine_counts_a_prompt_as_the_simulator_does(sim):
    """The real-time simulated engine split on spaces only: a Chinese prompt of 12 characters was 1 token there
    and 12 in `fleetserve simulate`, so `bench routing --live` and the simulator saw different prompts."""
    from fleetserve.engine.simulated import text_tokens
    from fleetserve.traces.model import stand_in_tokens

    for text in ("请给我讲一个关于猫的故事", "hello 世界 abc中文def", "plain english words"):
        assert text_tokens(text) == stand_in_tokens(text)
    assert complete(sim.url, "请给我讲一个关于猫的故事")["usage"]["prompt_tokens"] == 12


def test_tokenize_counts_a_chat_as_serving_does(sim):
    """/tokenize left out the `role: ` prefix that serving counts (3 tokens where usage said 4), and list content
    gave a 500."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "a b c"}]}]
    r = httpx.post(sim.url + "/tokenize", json={"model": "sim", "messages": messages}, timeout=30)
    served = httpx.post(sim.url + "/v1/chat/completions", json={"model": "sim", "messages": messages,
                                                                "max_tokens": 1}, timeout=30)
    assert r.status_code == 200 and r.json()["count"] == served.json()["usage"]["prompt_tokens"] == 4
    bad = httpx.post(sim.url + "/tokenize", json={"messages": [{"role": "user", "content": 42}]}, timeout=30)
    assert bad.status_code == 400 and "messages[0].content" in bad.json()["error"]["message"]
    assert httpx.post(sim.url + "/tokenize", json={"prompt": "x y"}, timeout=30).json()["count"] == 2


def test_options_the_other_engine_kind_would_ignore_are_refused(tmp_path):
    """`engine --simulate fast --max-waiting 1 --max-batch 1` ran and took 7 concurrent requests (no queue-full
    503 ever), and --max-tokens-default was ignored too, without a word: a test of those paths against a
    simulated engine tested nothing. --speedup and --cache-blocks mean nothing to a model engine."""
    import subprocess
    import sys

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "fleetserve", "engine", *args, "--port", "1"], text=True,
                              capture_output=True, timeout=60)

    simulated = run("--simulate", "fast", "--max-waiting", "1", "--max-batch", "1")
    def said(p: subprocess.CompletedProcess) -> str:  # the message without the error box's borders
        return " ".join(p.stderr.replace("│", " ").split())

    assert simulated.returncode == 2 and "--max-batch, --max-waiting: not used by the simulated engine" in \
        said(simulated), simulated.stderr
    model = run("--model", str(tmp_path / "none"), "--speedup", "2")
    assert model.returncode == 2 and "--speedup: not used by a model engine" in said(model), model.stderr


@pytest.mark.parametrize("kind", ["simulated", "builtin"])
def test_an_engine_whose_port_is_taken_exits_98_before_loading_its_model(tmp_path, kind, tiny_model):
    """The supervisor read a taken port from the engine's log (gone with a tiny logMaxBytes: the replica spent a
    failed start more before it moved), and a model loading for minutes left its chosen port to any process.
    The engines bind first, and say a taken port by their exit code (api/graceful.EXIT_PORT_TAKEN)."""
    import socket
    import subprocess
    import sys

    from fleetserve.api.graceful import EXIT_PORT_TAKEN

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        source = ["--simulate", "fast"] if kind == "simulated" else ["--model", str(tiny_model), "--threads", "1"]
        done = subprocess.run([sys.executable, "-m", "fleetserve", "engine", *source, "--served-model-name", "x",
                               "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_PORT_TAKEN, done.stderr
    assert f"127.0.0.1:{port}: address already in use" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_empty_prompt_is_refused_and_a_request_id_echoed_as_the_built_in_engine_does(sim):
    """The simulated engine had answered an empty prompt with 0 prompt tokens, where the built-in engine (and
    vLLM) refuse it, and had not echoed the client's x-request-id."""
    r = httpx.post(sim.url + "/v1/completions", json={"model": "sim", "prompt": "", "max_tokens": 3},
                   headers={"x-request-id": "sim-7"}, timeout=5)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    assert r.headers["x-request-id"] == "sim-7"
    assert complete(sim.url, "   ")["usage"]["prompt_tokens"] >= 1  # whitespace is text to a tokenizer

"""A terminating engine finishes its in-flight streams for `--drain-timeout` seconds (Kubernetes sends SIGTERM
after preStop and passes `engine.drainTimeoutSeconds`); uvicorn's graceful shutdown was a fixed 5 s, so a pod given
130 s of grace cut every stream still running 15 s after scale-down. A real engine process, a real stream."""

import signal

import httpx
import pytest

from tests.helpers import Server

REQUEST = {"model": "sim", "prompt": "hello " * 20, "max_tokens": 60, "stream": True}


def lines_through_sigterm(server: Server, body: dict, headers: dict | None = None) -> list[str]:
    """Stream `body`, SIGTERM `server` after the second chunk; the `data:` lines the client got."""
    lines = []
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=headers, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                lines.append(line)
                if len(lines) == 2:
                    server.proc.send_signal(signal.SIGTERM)
    return lines


def stream_through_sigterm(server: Server, tokens: int = 60) -> tuple[int, bool]:
    """Stream `tokens` (60: ~3 s at this speed) through a SIGTERM; (chunks, saw [DONE])."""
    lines = lines_through_sigterm(server, {**REQUEST, "max_tokens": tokens})
    return len(lines), any("[DONE]" in line for line in lines)


@pytest.fixture
def engine(tmp_path):
    started = []

    def start(drain: str) -> Server:
        server = Server(["engine", "--simulate", "fast", "--speedup", "0.01", "--served-model-name", "sim",
                         "--drain-timeout", drain], tmp_path / f"engine-{drain}.log").start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


def test_a_stream_in_flight_at_sigterm_finishes_within_the_drain_timeout_then_the_engine_exits(engine):
    server = engine("60")
    chunks, done = stream_through_sigterm(server)
    assert done and chunks == 60 + 1, chunks  # every token, then [DONE]
    # and the engine stops once nothing is in flight (uvicorn re-raises the signal it caught)
    assert server.proc.wait(timeout=30) in (0, -signal.SIGTERM)


def test_a_stream_outlasting_the_drain_timeout_ends_with_an_error_event_then_done(engine):
    """It was cut mid-answer (an unterminated chunked body), which a client cannot tell from a network fault."""
    server = engine("0.5")
    lines = lines_through_sigterm(server, REQUEST)
    assert lines[-1] == "data: [DONE]" and len(lines) < 60, lines[-3:]
    assert '"code": "engine_stopping"' in lines[-2] and "--drain-timeout" in lines[-2], lines[-2]
    assert server.proc.wait(timeout=30) in (0, -signal.SIGTERM)


def test_the_built_in_engine_ends_a_stream_outlasting_its_drain_timeout_with_an_error_event(slow_model, tmp_path):
    from tests.helpers import internal_token

    token_file, header = internal_token(tmp_path / "drain")
    server = Server(["engine", "--model", str(slow_model), "--served-model-name", "tiny", "--threads", "1",
                     "--internal-token-file", token_file, "--drain-timeout", "0.5"], tmp_path / "tiny.log").start()
    try:
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 3000, "stream": True, "ignore_eos": True}
        lines = lines_through_sigterm(server, body, header)
        assert lines[-1] == "data: [DONE]" and len(lines) < 3000, lines[-3:]  # 3,000 tokens take seconds
        assert '"code": "engine_stopping"' in lines[-2], lines[-2]
        assert server.proc.wait(timeout=30) in (0, -signal.SIGTERM)
    finally:
        server.kill()


def test_a_router_stopped_mid_stream_lets_it_finish_within_its_drain_timeout(engine, tmp_path):
    """The router's own wait after SIGTERM was a fixed 5 s whatever its pod's grace: a router rollout cut the
    streams it proxied. Kubernetes passes it the smaller of bufferTimeoutSeconds and drainTimeoutSeconds."""
    backend = engine("60")
    router = Server(["router", "--backend", backend.url, "--drain-timeout", "60"], tmp_path / "router.log").start()
    try:
        chunks, done = stream_through_sigterm(router, 160)  # ~8 s: longer than the fixed 5 s it had
        assert done and chunks == 160 + 1, chunks
        assert router.proc.wait(timeout=30) is not None
    finally:
        router.kill()

"""Structured logs: a router and an engine with --log-format json write one JSON line per request, with the
request id, the hashed tenant, the replica, policy and branch, and timings; prompt text only with
--log-prompts."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from fleetserve.observe.logs import JsonFormatter, TextFormatter, log_request, prompt_text, tenant_hash
from fleetserve.router.auth import key_digest
from tests.helpers import Server, internal_token, wait_until

SECRET = "zebra-quartz-unguessable-prompt-words"


def _record(**fields) -> logging.LogRecord:
    logger = logging.getLogger("test.access")
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        log_request(logger, **fields)
    finally:
        logger.removeHandler(handler)
    return records[0]


def test_formatters_and_tenant_hash():
    record = _record(request_id="abc", tenant=tenant_hash("alpha"), status=200, latency_ms=1.5, prompt=None)
    line = json.loads(JsonFormatter("router").format(record))
    assert line["msg"] == "request" and line["component"] == "router" and line["level"] == "info"
    assert line["request_id"] == "abc" and line["status"] == 200 and line["latency_ms"] == 1.5
    assert "prompt" not in line  # None fields are dropped
    assert line["tenant"] == tenant_hash("alpha") != "alpha" and len(line["tenant"]) == 12
    assert tenant_hash(None) is None
    text = TextFormatter("router").format(record)
    assert "request request_id=abc" in text and "status=200" in text
    assert prompt_text({"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": [
        {"type": "text", "text": "there"}]}]}) == "hi\nthere"
    assert prompt_text({"prompt": "p"}) == "p"


def _json_lines(server: Server) -> list[dict]:
    lines = [line for line in server.log().splitlines() if line.strip()]
    return [json.loads(line) for line in lines]  # every line parses: nothing but JSON


def _fleet(tmp_path, *extra: str) -> tuple[Server, Server, dict]:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": {key_digest("alpha-key"): "alpha"}}))
    token_file, _ = internal_token(tmp_path)
    from fleetserve.engine.tiny import create_tiny_model

    model = create_tiny_model(tmp_path / "tiny", context_length=256)
    engine = Server(["engine", "--model", str(model), "--served-model-name", "tiny", "--threads", "1",
                     "--replica", "r7", "--internal-token-file", token_file, "--log-format", "json", *extra],
                    tmp_path / "engine.log").start()
    router = Server(["router", "--backend", engine.url, "--auth-file", str(keys), "--internal-token-file",
                     token_file, "--strategy", "prefixaware", "--log-format", "json", *extra],
                    tmp_path / "router.log").start()
    return engine, router, {"authorization": "Bearer alpha-key"}


def _request(router: Server, headers: dict) -> str:
    body = {"model": "tiny", "messages": [{"role": "user", "content": SECRET}], "max_tokens": 3,
            "ignore_eos": True}
    r = httpx.post(router.url + "/v1/chat/completions", json=body, headers={**headers, "x-request-id": "req-42"},
                   timeout=60)
    assert r.status_code == 200, r.text
    assert "x-fleetserve-replica" not in r.headers  # with API keys the client is a tenant: the log names it
    return router.args[router.args.index("--backend") + 1].split("://", 1)[1]


def _request_line(server: Server) -> dict:
    wait_until(lambda: any(x.get("msg") == "request" for x in _json_lines(server)), 20, what="a request line")
    return next(x for x in _json_lines(server) if x.get("msg") == "request")


def test_router_and_engine_write_json_request_lines_without_prompt_text(tmp_path):
    engine, router, headers = _fleet(tmp_path)
    try:
        replica = _request(router, headers)
        line = _request_line(router)
        assert line["request_id"] == "req-42" and line["status"] == 200
        assert line["tenant"] == tenant_hash("alpha") and "alpha" not in json.dumps(line)
        assert line["replica"] == replica and line["policy"] == "prefixaware" and line["branch"]
        assert line["attempts"] == 1 and line["ttfb_ms"] >= 0 and line["latency_ms"] >= line["ttfb_ms"]
        eline = _request_line(engine)
        assert eline["request_id"] == "req-42" and eline["status"] == 200 and eline["replica"] == "r7"
        assert eline["tenant"] == tenant_hash("alpha")
        assert eline["prompt_tokens"] > 0 and eline["completion_tokens"] > 0
        assert eline["ttft_ms"] >= 0 and eline["latency_ms"] >= eline["ttft_ms"]
        assert SECRET not in router.log() and SECRET not in engine.log()
        assert "alpha" not in engine.log()
    finally:
        router.stop()
        engine.stop()


def test_log_prompts_puts_the_prompt_in_the_request_lines(tmp_path):
    engine, router, headers = _fleet(tmp_path, "--log-prompts")
    try:
        _request(router, headers)
        assert SECRET in _request_line(router)["prompt"]
        assert SECRET in _request_line(engine)["prompt"]
    finally:
        router.stop()
        engine.stop()


def test_simulated_engine_writes_request_lines_and_hyperpod_metrics(tmp_path):
    from tests.metrics_text import sample

    engine = Server(["engine", "--simulate", "fast", "--served-model-name", "sim", "--namespace", "team-a",
                     "--model-version", "3", "--instance-type", "ml.g5.xlarge", "--replica", "r2",
                     "--log-format", "json"], tmp_path / "sim.log").start()
    try:
        body = {"model": "sim", "prompt": SECRET, "max_tokens": 2}
        r = httpx.post(engine.url + "/v1/completions", json=body, headers={"x-request-id": "sim-1"}, timeout=30)
        assert r.status_code == 200
        assert httpx.post(engine.url + "/v1/completions", json={**body, "model": "nope"}, timeout=30).status_code == 404
        line = _request_line(engine)
        assert line["request_id"] == "sim-1" and line["status"] == 200 and line["replica"] == "r2"
        assert line["prompt_tokens"] > 0 and line["completion_tokens"] == 2 and "prompt" not in line
        assert SECRET not in engine.log()
        labels = {"namespace": "team-a", "model_name": "sim", "model_version": "3", "instance_type": "ml.g5.xlarge",
                  "replica": "r2"}
        # another model's request is none of this model's invocations (it fed its rate and error panels)
        assert sample(engine.url, "model_invocations_total", **labels) == 1
        with pytest.raises(KeyError):  # never counted, so never exposed
            sample(engine.url, "model_errors_total", status="404", **labels)
        assert sample(engine.url, "model_latency_milliseconds_count", **labels) == 1
        assert sample(engine.url, "model_ttfb_milliseconds_count", **labels) == 1
        assert sample(engine.url, "model_concurrent_requests", **labels) == 0
        assert "_created" not in httpx.get(engine.url + "/metrics").text
    finally:
        engine.stop()


def test_log_format_in_the_spec_and_the_up_options_override_it():
    import pytest

    from fleetserve.cli.app import _with_log_options
    from fleetserve.spec import SpecError
    from fleetserve.spec.load import load_spec_text

    text = ("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {name: logs}\n"
            "spec:\n  model: {source: /models/m}\n  observability: {logFormat: %s}\n")
    loaded = load_spec_text(text % "json")
    obs = loaded.endpoint.spec.observability
    assert obs.log_format == "json" and obs.log_prompts is False
    plain = load_spec_text(text % "text")
    assert _with_log_options(plain, None, False) is plain
    changed = _with_log_options(plain, "json", True).endpoint.spec.observability
    assert changed.log_format == "json" and changed.log_prompts is True
    with pytest.raises(SpecError, match="logFormat"):
        load_spec_text(text % "yaml")


def test_up_passes_the_log_options_to_the_router_and_every_engine(tmp_path):
    from fleetserve.cli.app import _with_log_options
    from fleetserve.fleet.supervisor import Supervisor
    from fleetserve.spec.load import load_spec_text

    spec = tmp_path / "e.yaml"
    spec.write_text("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {name: logs-up}\n"
                    "spec:\n  model: {source: /models/m}\n")
    loaded = load_spec_text(spec.read_text())
    sup = Supervisor(loaded, str(spec), say=lambda _m: None)
    assert sup._log_args() == ["--log-format", "text"]
    sup._http.close()
    sup = Supervisor(_with_log_options(loaded, "json", True), str(spec), say=lambda _m: None)
    assert sup._log_args() == ["--log-format", "json", "--log-prompts"]
    cmd = sup._engine_command("r0", 8001, "local")
    assert cmd[cmd.index("--log-format") + 1] == "json" and "--log-prompts" in cmd
    sup._http.close()


def test_http_client_chatter_stays_out_of_our_logs(capsys):
    """The detached supervisor's log took a line per HTTP call (it polls its router every second): 56 of 61 lines
    a minute after its start."""
    from fleetserve.observe.logs import configure_logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level, logging.getLogger("httpx").level
    try:
        configure_logging("text", "supervisor")
        logging.getLogger("httpx").info('HTTP Request: GET http://127.0.0.1:1/admin/load "HTTP/1.1 200 OK"')
        logging.getLogger("httpx").warning("a failure worth a line")
        logging.getLogger("fleetserve.supervisor").info("starting 2 engine replica(s) ...")
        text = capsys.readouterr().err
    finally:
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])
        logging.getLogger("httpx").setLevel(saved[2])
    assert "HTTP Request" not in text and "a failure worth a line" in text and "starting 2 engine" in text

"""Schemathesis against the documents the router and the engine serve: no 5xx, no hang, OpenAI errors.

Both generation modes run (schema-valid and schema-violating bodies). Each request has a timeout, so a
hang fails the test as an exception instead of stalling CI; no wall-clock figure is asserted. Examples are
derandomized so a failure reproduces on every run.
"""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.fuzz.checks import SEEN, openai_errors

REQUEST_TIMEOUT_S = 30  # a tiny model answers a 16-token request in well under a second; 30 s means a hang
EXAMPLES = {"POST": 50, "GET": 5}  # the GET operations take no input: a few calls prove them
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection, openai_errors]
OPERATIONS = [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models"),
              ("GET", "/v1/models/{model}"), ("GET", "/health")]
MODES = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]


def fuzz(schema, method: str, path: str, mode: GenerationMode, call) -> None:
    """Run one operation's examples; schemathesis's pytest plugin is bypassed (it breaks on pytest 9.2)."""
    operation = schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES[method], deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case):
        call(case)

    run()


def modes(method: str) -> list[GenerationMode]:
    """Negative mode needs input to violate: GET operations here take none."""
    return MODES if method == "POST" else [GenerationMode.POSITIVE]


def fuzz_both_ways(schema, server: str, method: str, path: str, call) -> None:
    """Every mode of one operation in one test, then the check that a generation endpoint both answered and
    refused: a schema that only produced rejects, or only valid bodies, would fuzz nothing. (A separate test had
    read what the others saw, which held only while xdist ran them all on one worker.)"""
    for mode in modes(method):
        fuzz(schema, method, path, mode, call)
    if method == "POST":
        label = f"{method} {path}"
        statuses = {status for (url, op, status), _ in SEEN.items() if url == server and op == label}
        assert 200 in statuses and 400 in statuses, (server, label, statuses)


@pytest.mark.parametrize("method,path", OPERATIONS)
def test_engine_api(engine_schema, fuzz_fleet, method, path):
    engine = fuzz_fleet["engine"]
    fuzz_both_ways(engine_schema, engine.url, method, path, lambda case: case.call_and_validate(
        base_url=engine.url, headers=fuzz_fleet["engine_headers"], checks=CHECKS, timeout=REQUEST_TIMEOUT_S))


@pytest.mark.parametrize("method,path", [*OPERATIONS, ("GET", "/metrics"), ("POST", "/invocations")])
def test_router_api(router_schema, fuzz_fleet, method, path):
    router = fuzz_fleet["router"]
    fuzz_both_ways(router_schema, router.url, method, path, lambda case: case.call_and_validate(
        base_url=router.url, checks=CHECKS, timeout=REQUEST_TIMEOUT_S))


def test_fleet_still_serves_after_fuzzing(fuzz_fleet):
    """A failure in one request never fails another: after every fuzzed body, a plain request still works."""
    engine, router = fuzz_fleet["engine"], fuzz_fleet["router"]
    assert engine.proc.poll() is None and router.proc.poll() is None
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    answer = httpx.post(router.url + "/v1/chat/completions", json=body, timeout=REQUEST_TIMEOUT_S)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert httpx.get(engine.url + "/health", timeout=REQUEST_TIMEOUT_S).json()["status"] == "ok"


def test_engine_document_is_open_but_the_api_is_not(fuzz_fleet):
    """/openapi.json needs no token (it is public, like /health); the API behind it still does."""
    engine = fuzz_fleet["engine"]
    assert httpx.get(engine.url + "/openapi.json", timeout=10).status_code == 200
    denied = httpx.post(engine.url + "/v1/completions", json={"prompt": "x"}, timeout=10)
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"

"""A real engine (tiny random model, internal token on) and a real router in front of it, for the fuzzers.

Both are child processes on loopback, as in a fleet: the router holds the fleet's internal token, so the
engine trusts it; the engine is also fuzzed directly with that token (what a compromised client cannot send
is covered by tests/reliability/test_isolation.py). Generation stays short: the engine's default budget is
8 tokens and the fuzz schemas cap max_tokens at 16 (the served document keeps the real bounds).
"""

from __future__ import annotations

import copy

import httpx
import pytest
import schemathesis

from tests.helpers import Server, internal_token

FUZZ_MAX_TOKENS = 16


@pytest.fixture(scope="package")
def fuzz_fleet(tiny_model, tmp_path_factory):
    logs = tmp_path_factory.mktemp("fuzz-logs")
    token_file, token_headers = internal_token(logs)
    engine = Server(["engine", "--model", str(tiny_model), "--served-model-name", "tiny", "--threads", "1",
                     "--max-tokens-default", "8", "--internal-token-file", token_file], logs / "engine.log")
    engine.start()
    router = Server(["router", "--backend", engine.url, "--internal-token-file", token_file], logs / "router.log")
    try:
        router.start()
    except BaseException:
        engine.stop()
        raise
    yield {"engine": engine, "router": router, "engine_headers": token_headers}
    router.stop()
    engine.stop()


def served_document(url: str) -> dict:
    """The document as a client gets it: no credentials (the engine's guard lets /openapi.json through)."""
    response = httpx.get(url + "/openapi.json", timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


def short_generation(document: dict) -> dict:
    """The served document with max_tokens capped, so fuzzing spends its time on input, not on decoding."""
    doc = copy.deepcopy(document)
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        props = doc["components"]["schemas"][name]["properties"]
        for key in ("max_tokens", "max_completion_tokens"):
            props[key]["anyOf"][0]["maximum"] = FUZZ_MAX_TOKENS
    return doc


@pytest.fixture(scope="package")
def engine_schema(fuzz_fleet):
    return schemathesis.openapi.from_dict(short_generation(served_document(fuzz_fleet["engine"].url)))


@pytest.fixture(scope="package")
def router_schema(fuzz_fleet):
    doc = short_generation(served_document(fuzz_fleet["router"].url))
    # The router cannot know its backends' model names when it builds the document; the engine's are ours.
    engine_doc = served_document(fuzz_fleet["engine"].url)
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        doc["components"]["schemas"][name]["properties"]["model"] = \
            engine_doc["components"]["schemas"][name]["properties"]["model"]
    return schemathesis.openapi.from_dict(doc)

"""`fleetserve bench chaos` against real fleets, and the outcome classification it reports."""

import json

import httpx
import pytest

from fleetserve.bench.outcomes import send, tally
from tests.helpers import fleetserve


def test_chaos_bench_poison_and_overload_lose_nothing():
    result = fleetserve("bench", "chaos", "--scenarios", "poisoned_request,overload_10x", "--json", timeout=600)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    poison, overload = figures["scenarios"]["poisoned_request"], figures["scenarios"]["overload_10x"]
    assert figures["lost_total"] == 0 and figures["checks_failed"] == []
    assert poison["answered"] == poison["sent"] and poison["poison_answers"] == ["400"]
    assert poison["poison_refused_4xx"] == poison["poison_sent"] == 10 and poison["fault_lost"] == 0
    assert overload["sent"] == 60 and overload["rejected_with_retry_after"] >= 1 and overload["lost"] == 0
    assert overload["answered"] + overload["rejected_with_retry_after"] == overload["sent"]
    assert overload["answered_ok"] + overload["answered_client_error"] == overload["answered"]
    assert poison["recovery_s"] is not None and overload["recovery_s"] is not None
    assert "recovery_from" in poison and "recovery_from" in overload


def test_chaos_bench_refuses_an_empty_scenario_list():
    """`--scenarios ","` ran all eight scenarios (minutes)."""
    from fleetserve.bench import chaos

    for empty in (",", ""):
        result = fleetserve("bench", "chaos", "--scenarios", empty)
        assert result.returncode == 2 and "names no scenario" in result.stderr and "replica_sigkill" in result.stderr
    with pytest.raises(ValueError, match="no scenario named"):
        chaos.run([])


def test_chaos_bench_rejects_unknown_scenarios():
    result = fleetserve("bench", "chaos", "--scenarios", "meteor_strike")
    assert result.returncode == 2 and "replica_sigkill" in result.stderr


def _client(handler):
    return httpx.Client(transport=httpx.MockTransport(handler))


@pytest.mark.parametrize("status,headers,body,kind", [
    (200, {}, {"choices": []}, "answered"),
    (400, {}, {"error": {"message": "seed: bad", "param": "seed"}}, "answered"),
    (429, {"retry-after": "1"}, {"error": {"message": "full"}}, "rejected_with_retry_after"),
    (503, {}, {"error": {"message": "no replica"}}, "failed_with_error"),
    (500, {}, "Internal Server Error", "lost"),  # not OpenAI error JSON: nobody can act on it
])
def test_outcome_classification(status, headers, body, kind):
    content = json.dumps(body).encode() if isinstance(body, dict) else body.encode()
    with _client(lambda request: httpx.Response(status, headers=headers, content=content)) as client:
        assert send(client, "http://x/v1/chat/completions", {"stream": False}).kind == kind


def test_streams_are_answered_only_with_done_and_cut_only_with_an_error_event():
    def stream(lines):
        return lambda request: httpx.Response(200, content="".join(f"{line}\n\n" for line in lines).encode(),
                                              headers={"content-type": "text/event-stream"})

    cases = {"answered": ['data: {"choices": []}', "data: [DONE]"],
             "cut_with_error_event": ['data: {"choices": []}', 'data: {"error": {"message": "mid-stream"}}',
                                      "data: [DONE]"],
             "lost": ['data: {"choices": []}']}
    for kind, lines in cases.items():
        with _client(stream(lines)) as client:
            assert send(client, "http://x/v1/chat/completions", {"stream": True}).kind == kind, kind


def test_retry_after_is_honoured_until_answered():
    calls = []

    def handler(request):
        calls.append(1)
        if len(calls) < 3:
            return httpx.Response(503, headers={"retry-after": "0"}, json={"error": {"message": "buffer full"}})
        return httpx.Response(200, json={"choices": []})

    with _client(handler) as client:
        outcome = send(client, "http://x/v1/chat/completions", {"stream": False}, retries=5)
    assert outcome.kind == "answered" and outcome.attempts == 3
    assert tally([outcome])["retried"] == 1


def test_the_help_lists_every_scenario_by_its_name():
    """`bench chaos --help` named none: `replica_kill` was a guess, refused."""
    from fleetserve.bench.chaos import SCENARIOS
    from fleetserve.cli.bench_commands import CHAOS_SCENARIOS

    assert CHAOS_SCENARIOS == tuple(SCENARIOS)

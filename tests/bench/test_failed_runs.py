"""What the benches report when their fleet never serves: a failed run with the reason, not figures of 0 s and
exit 0, and not minutes of retries that cannot help."""

import httpx

from fleetserve.bench import chaos, scale_from_zero
from fleetserve.bench.outcomes import Outcome, send


def test_a_request_refused_because_no_replica_can_start_is_not_retried():
    """503 replicas_failing carries Retry-After like any shed request; 30 tries of each request of a burst had
    taken 10 minutes to report a model that cannot load."""
    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(503, headers={"retry-after": "0.1"}, json={"error": {
            "message": "no replica can start: bad weights", "type": "server_error", "code": "replicas_failing"}})

    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        outcome = send(client, "http://fleet/v1/chat/completions", {"model": "m"}, retries=30)
    assert (outcome.kind, outcome.code, outcome.attempts, len(calls)) == \
        ("rejected_with_retry_after", "replicas_failing", 3, 3)  # a few tries: a shortage or a crash loop may pass


def test_scale_from_zero_with_nothing_answered_has_no_response_times(monkeypatch, tmp_path):
    """first_response_s read 0.0 (the burst's own start) and the run exited 0 when no request was answered."""
    class Fleet:
        def __init__(self, *args):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def up(self):
            return {"url": "http://127.0.0.1:1/v1"}

        def status(self):
            return {"replicas": [{"cold_start_s": None}], "error": "replica r0 exited with code 1"}

    shed = [Outcome("rejected_with_retry_after", 503, latency_s=0.2, code="replicas_failing")] * 2
    monkeypatch.setattr(scale_from_zero, "LocalFleet", Fleet)
    monkeypatch.setattr(scale_from_zero, "_burst", lambda *args: list(shed))
    result = scale_from_zero.run(str(tmp_path / "model"), requests=2, buffer=1)
    assert result["first_response_s"] is None and result["last_response_s"] is None
    assert result["warm"] == {"first_response_s": None, "last_response_s": None}
    assert result["unanswered"] == 4 and result["fleet_error"] == "replica r0 exited with code 1"
    assert result["ratio"]["first_response_cold_vs_warm"] is None


def test_a_chaos_scenario_whose_fleet_does_not_start_fails_alone(monkeypatch):
    """A traceback, and the finished scenarios' results lost with it, when one scenario's fleet did not start (no
    redis-server for redis_sigkill)."""
    class Fleet:
        def __init__(self, home, name, spec):
            self.name = name

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def up(self):
            raise RuntimeError(f"fleet {self.name} did not start: error: redis-server exited during start-up")

    monkeypatch.setattr(chaos, "LocalFleet", Fleet)
    monkeypatch.setattr(chaos, "_model", lambda folder: str(folder / "model"))
    result = chaos.run(["redis_sigkill"])
    assert result["scenarios"] == {} and "redis-server exited" in result["not_started"]["redis_sigkill"]
    why = result["not_started"]["redis_sigkill"]
    assert result["checks_failed"] == [f"redis_sigkill: the fleet did not start: {why}"]


def test_kvcache_names_a_model_whose_context_cannot_hold_its_prefix(tiny_model):
    """`--model DIR` assumed a vocabulary of 1000 and any context: a 259-token, 512-context test model ended in a
    traceback (400 Bad Request from the warm-up)."""
    from tests.helpers import fleetserve

    result = fleetserve("bench", "kvcache", "--model", str(tiny_model), "--repeats", "1", "--json")
    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and "--model" in said and "512 tokens" in said and "Traceback" not in said


def test_kvcache_reads_a_model_folders_vocabulary(tmp_path):
    import json

    from fleetserve.bench.kvcache import _model

    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 259, "max_position_embeddings": 4096}))
    assert _model(str(tmp_path), tmp_path) == (str(tmp_path), 259)


def test_a_bursts_first_and_last_answers_are_timed_from_one_origin():
    """The first answer was timed from before the load generator started and the last from its own request's
    send: the first read 6.734 s and the last 6.689 s, and the cold-vs-warm ratio carried the generator's start."""
    burst = [Outcome("answered", 200, latency_s=6.6, started_at=100.05),   # sent late, answered first
             Outcome("answered", 200, latency_s=6.6, started_at=100.00),
             Outcome("answered", 200, latency_s=6.7, started_at=100.10),   # answered last
             Outcome("rejected_with_retry_after", 503, latency_s=9.0, started_at=100.0)]
    first, last = scale_from_zero._responses(burst)
    assert abs(first - 6.6) < 1e-9 and abs(last - 6.8) < 1e-9 and first <= last
    assert scale_from_zero._responses([]) == (None, None)

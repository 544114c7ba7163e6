"""The simulator and the planner hold the built-in engine to its model's own context (SmolLM2: 8,192 tokens):
a request longer than that is refused as the engine refuses it, and `plan` does not raise a limit the model
cannot give."""

import json

from fleetserve.sim.plan import plan
from fleetserve.sim.run import simulate
from fleetserve.sim.setup import SimOptions
from fleetserve.traces.model import TraceRequest
from tests.sim.test_golden import spec


def trace_with_long_requests() -> list[TraceRequest]:
    short = [TraceRequest(i * 2.0, 300, 40) for i in range(30)]
    long = [TraceRequest(61.0 + i, 9000, 40) for i in range(3)]  # 9,040 tokens: over 8,192
    return sorted(short + long, key=lambda r: r.arrival_s)


def test_requests_over_the_models_own_context_are_refused():
    report = simulate(spec("quickstart.yaml"), trace_with_long_requests(), SimOptions()).report
    assert report["failed_by_reason"]["context_length_exceeded"] == 3
    assert report["context_length"]["tokens"] == 8192
    assert "own maximum" in report["context_length"]["source"]
    assert any("8192-token context length" in w for w in report["warnings"])


def test_plan_does_not_raise_the_context_past_the_models_maximum(tmp_path):
    result = plan(spec("quickstart.yaml"), trace_with_long_requests(), SimOptions(), max_trials=6)
    data = result.to_json()
    assert data["context"]["to"] == data["context"]["from"] == 8192
    assert "the model cannot serve them" in data["context"]["why"]
    assert not any(c["path"] in ("spec.model.contextLength", "spec.engine.args") for c in data["changes"])
    json.dumps(data)


def test_verify_does_not_advise_raising_a_limit_the_model_cannot_give():
    from fleetserve.sim.verify import verify

    verdict = verify(spec("quickstart.yaml"), trace_with_long_requests(), SimOptions(),
                     {"ttft_p95_ms": 600000, "e2e_p95_ms": 600000})
    reasons = " ".join(c["reason"] for c in verdict.to_json()["checks"] if c.get("reason"))
    assert "longer context" in reasons and "raise it" not in reasons, reasons


def test_a_context_raised_to_the_models_maximum_says_what_stays_refused():
    """The why said every candidate has 131072 for requests of up to 135,155 tokens, while one stayed refused."""
    from fleetserve.sim.plan import Planner
    from fleetserve.sim.setup import SimOptions
    from fleetserve.traces.model import TraceRequest
    from tests.sim.test_golden import spec

    trace = [TraceRequest(0.0, 140_000, 10, tuple(range(274))), TraceRequest(1.0, 10_000, 10)]
    planner = Planner(spec("hyperpod.yaml"), trace, SimOptions())
    planner._fit_context(planner.base)
    why = planner.context["why"]
    assert planner.context["to"] == 131072 and "capped at the model's own maximum" in why, why
    assert "1 request(s) over it stay refused" in why


def test_a_candidate_type_no_node_of_its_gpu_can_take_is_named_not_dropped():
    """HyperPod's pod asks 6 cpu and 30Gi: no L4 type takes it, and g6.xlarge vanished from the types' reasons."""
    from fleetserve.sim.plan import Planner
    from fleetserve.sim.setup import SimOptions
    from fleetserve.traces.model import TraceRequest
    from tests.sim.test_golden import spec

    trace = [TraceRequest(i * 2.0, 500, 50) for i in range(20)]
    planner = Planner(spec("hyperpod.yaml"), trace, SimOptions(), max_trials=3, instance_types=("g6.xlarge",))
    from fleetserve.sim.plan_why import _types

    planner.plan()
    assert "ml.g6.xlarge" in planner.unfit and "no L4 type takes the replica" in planner.unfit["ml.g6.xlarge"]
    assert "ml.g6.xlarge" not in planner.types
    assert "ml.g6.xlarge: not a candidate, no L4 type takes the replica" in _types(planner)  # what the why lists


def test_max_trials_bounds_the_search_when_the_context_is_raised_too():
    """A raised context ran one more probe past --max-trials 2: "no candidate passed verify in 3 simulations"."""
    from fleetserve.sim.plan import Planner
    from fleetserve.traces.model import TraceRequest
    from tests.sim.test_golden import spec

    trace = [TraceRequest(i * 2.0, 20_000 if i % 5 == 0 else 800, 50) for i in range(30)]
    for most in (2, 3):
        planner = Planner(spec("hyperpod.yaml"), trace, SimOptions(), max_trials=most)
        planner.plan()
        assert planner.context["to"] > planner.context["from"]  # what the check is about happened
        assert planner.trials <= most, (most, [t.label for t in planner.history])


def test_with_no_context_known_a_request_over_one_replicas_kv_memory_is_refused_not_run_for_days():
    """A model whose context nothing states (vLLM, `hf:acme/mystery-7b`) and a legal 16 M-token completion: the
    request ran alone for simulated days (minutes of wall time; 1 M tokens reported an E2E p99 of 44 hours). No
    engine serves more than its KV memory holds (vLLM refuses to start with a longer max_model_len)."""
    from fleetserve.sim.fleet import KV_BOUND
    from fleetserve.sim.verify import verify
    from tests.helpers import endpoint_of

    endpoint = endpoint_of("mystery", {"model": {"name": "m", "source": "hf:acme/mystery-7b"}, "replicas": 1,
                                       "engine": {"kind": "vllm"}, "placement": {"instanceTypes": ["g6e.xlarge"]}})
    trace = [TraceRequest(i * 2.0, 500, 100) for i in range(20)] + [TraceRequest(41.0, 500, 16_777_216)]
    result = simulate(endpoint, trace, SimOptions())
    assert result.report["failed_by_reason"] == {"context_length_exceeded": 1}
    assert result.report["context_length"]["source"] == KV_BOUND and result.report["e2e_ms"]["p99"] < 60_000
    verdict = verify(endpoint, trace, SimOptions(), {"ttft_p95_ms": 10_000})
    reasons = " ".join(c.reason for c in verdict.checks if not c.passed)
    assert "more KV memory" in reasons and "raise it" not in reasons, reasons



def test_the_kv_bound_is_a_gpu_engines_only():
    """An external engine (a vLLM elsewhere, 128k) or a built-in one (its model's own context) had a 30k-token
    request refused by the CPU stand-in profile's 23,296 tokens, and verify advised a GPU with more memory."""
    from tests.helpers import endpoint_of

    trace = [TraceRequest(0.0, 30_000, 10), TraceRequest(1.0, 200, 10)]
    for written in ({"model": {"source": "hf:acme/mystery-7b"}, "engine": {"kind": "external",
                                                                          "urls": ["http://10.0.0.1:8000"]}},
                    {"model": {"source": "hf:acme/mystery-7b"}, "engine": {"kind": "builtin"}}):
        report = simulate(endpoint_of("k", {**written, "replicas": 1}), trace, SimOptions()).report
        assert "context_length_exceeded" not in report["failed_by_reason"], (written, report["failed_by_reason"])
        # an external server's speed is not known here: it was simulated at the CPU profile's without a word
        external = written["engine"]["kind"] == "external"
        assert any("speed the simulator cannot know" in w for w in report["warnings"]) == external, report["warnings"]
    external = {"model": {"source": "hf:acme/mystery-7b"}, "engine": {"kind": "external", "urls": ["http://10.0.0.1:8000"]},
                "replicas": 1}
    given = simulate(endpoint_of("k", external), trace, SimOptions(profile="h100-8b")).report  # its own: no word
    assert not any("cannot know" in w for w in given["warnings"])


def test_a_local_winner_of_several_replicas_says_they_share_the_machine():
    """plan chose 15 local replicas of the CPU engine on a 2-core machine, each simulated at the speed of a whole
    machine, and said nothing; with capacity.localSlots set it is the user's count, and the note goes."""
    from copy import deepcopy

    from fleetserve.spec.load import load_spec_data

    busy = [TraceRequest(i * 0.05, 600, 60) for i in range(1200)]  # 20 requests/s: more than one CPU replica
    result = plan(spec("quickstart.yaml"), busy, SimOptions()).to_json()
    assert any("replicas on this machine" in w and "capacity.localSlots" in w for w in result["warnings"]), result
    data = deepcopy(spec("quickstart.yaml").model_dump(by_alias=True, exclude_none=True, mode="json"))
    data["spec"]["capacity"] = {**data["spec"].get("capacity", {}), "localSlots": 32}
    slotted = plan(load_spec_data(data).endpoint, busy, SimOptions()).to_json()
    assert not any("replicas on this machine" in w for w in slotted["warnings"])


def test_plan_keeps_no_type_whose_kv_cache_cannot_hold_the_raised_context():
    """HyperPod's example planned on long prompts: the context raised to 131,072 and the input's g5.8xlarge (one
    A10G: ~46,000 tokens of KV past an 8B's weights) kept as the fallback, where vLLM refuses to start."""
    long = [TraceRequest(i * 30.0, 100_000, 50) for i in range(4)]
    trace = sorted([TraceRequest(i * 3.0, 2000, 100) for i in range(40)] + long, key=lambda r: r.arrival_s)
    result = plan(spec("hyperpod.yaml"), trace, SimOptions(), slo={"ttft_p95_ms": 60000, "e2e_p95_ms": 120000},
                  max_trials=8, instance_types=("g6e.xlarge", "p5.48xlarge"))
    data = result.to_json()
    assert data["context"]["to"] >= 100_050
    why = next(c["why"] for c in data["changes"] if c["path"] == "spec.placement.instanceTypes")
    assert "ml.g5.8xlarge: not a candidate, its KV cache holds 46,080 tokens, less than one sequence of the " \
           f"{data['context']['to']:,}-token context" in why, why
    assert why.count("g5.8xlarge: not a candidate") == 1  # the input's type once, by the name it wrote
    listed = result.winner.data["spec"]["placement"]["instanceTypes"]
    assert not any(t.endswith("g5.8xlarge") for t in listed), listed


def test_every_type_an_instance_types_list_names_is_a_candidate():
    """HyperPod's multi-node sample lists [ml.p4d.24xlarge, ml.g5.12xlarge]: the second was never searched, and the
    why named it only as a fallback."""
    import yaml

    from fleetserve.spec.load import load_spec_data
    from tests.sim.test_golden import EXAMPLES

    doc = yaml.safe_load((EXAMPLES / "hyperpod.yaml").read_text())
    doc["spec"].pop("instanceType")
    doc["spec"]["instanceTypes"] = ["ml.g5.8xlarge", "ml.g5.12xlarge"]
    from fleetserve.sim.plan import Planner

    trace = [TraceRequest(i * 2.0, 1000, 100) for i in range(40)]
    search = Planner(load_spec_data(doc).endpoint, trace, SimOptions(), max_trials=30, instance_types=())
    search.plan()
    assert search.types == ["ml.g5.8xlarge", "ml.g5.12xlarge"]
    assert {t.label.split(" static ")[0] for t in search.history if t.step == "static"} == set(search.types)


def test_with_every_type_too_small_for_the_context_the_spec_keeps_its_types_and_fallbacks():
    """No candidate left: the types stay the spec's own (verify says what fails), and their fallbacks too; they had
    been dropped from every candidate without a word."""
    from fleetserve.sim.plan import Planner
    from fleetserve.spec.load import load_spec_data

    doc = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "two"},
           "spec": {"model": {"source": "hf:meta-llama/Llama-3.1-8B-Instruct", "contextLength": 131072},
                    "engine": {"kind": "vllm", "gpus": 1}, "replicas": 1,
                    "placement": {"instanceTypes": ["g5.8xlarge", "g6.xlarge"]}}}
    search = Planner(load_spec_data(doc).endpoint, [TraceRequest(i * 2.0, 1000, 50) for i in range(10)],
                     SimOptions(), max_trials=4, instance_types=())
    search.plan()
    assert search.types == ["g5.8xlarge", "g6.xlarge"] and not search.unfit
    assert all(len(t.data["spec"]["placement"]["instanceTypes"]) == 2 for t in search.history)


def test_verify_says_a_declared_context_no_replica_of_a_type_can_start_with():
    """A spec of Llama-3.1-8B at 131,072 tokens on g5.8xlarge (one A10G): vLLM refuses to start there, and verify
    passed it without a word (failed_by_reason {})."""
    from fleetserve.spec.load import load_spec_data

    doc = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "long"},
           "spec": {"model": {"source": "hf:meta-llama/Llama-3.1-8B-Instruct", "contextLength": 131072},
                    "engine": {"kind": "vllm", "gpus": 1}, "replicas": 1,
                    "placement": {"instanceTypes": ["g5.8xlarge", "g6e.xlarge"]}}}
    report = simulate(load_spec_data(doc).endpoint, [TraceRequest(i * 2.0, 1000, 50) for i in range(5)],
                      SimOptions()).report
    said = [w for w in report["warnings"] if "does not fit the KV cache" in w]
    assert said == ["the 131,072-token context (spec.model.contextLength) does not fit the KV cache one replica has "
                    "on g5.8xlarge (46,080 tokens): vllm refuses to start there (max seq len larger than its KV "
                    "cache), while the simulator placed and served replicas on it; shorten the context or use a type "
                    "with more GPU memory"], report["warnings"]
    doc["spec"]["model"]["contextLength"] = 32768  # fits both
    report = simulate(load_spec_data(doc).endpoint, [TraceRequest(0.0, 1000, 50)], SimOptions()).report
    assert not [w for w in report["warnings"] if "does not fit the KV cache" in w]

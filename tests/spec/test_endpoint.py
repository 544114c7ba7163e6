import pytest

from fleetserve.spec import SpecError, load_spec_text

GOOD = """
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {name: chat, namespace: team-a}
spec:
  model: {source: builtin:smollm2-135m, name: smollm2, version: "3"}
  replicas: 2
  routing: {strategy: roundrobin}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec_text(text)
    return [str(p) for p in info.value.problems]


def test_valid_spec_with_defaults():
    loaded = load_spec_text(GOOD)
    e = loaded.endpoint
    assert loaded.source_format == "fleetserve"
    assert e.served_model_name == "smollm2"
    assert e.spec.replicas == 2 and e.spec.engine.kind == "builtin"
    assert e.spec.metrics.enabled is True  # observability on by default
    assert e.spec.kv_cache.block_size == 256
    assert loaded.warnings == []


def test_unknown_field_names_path_and_allowed_fields():
    (msg,) = problems(GOOD.replace("replicas: 2", "replicas: 2\n  replica: 3"))
    assert msg.startswith("spec.replica: unknown field")
    assert "replicas" in msg and "routing" in msg


def test_bad_enum_names_allowed_values():
    (msg,) = problems(GOOD.replace("roundrobin", "fastest"))
    assert msg.startswith("spec.routing.strategy:")
    assert "'fastest'" in msg
    for name in ("prefixaware", "kvaware", "session", "roundrobin", "leastload"):
        assert name in msg


def test_nested_and_multiple_errors_are_all_reported():
    text = GOOD.replace("replicas: 2", "replicas: -1\n  kvCache: {l1: {maxBytes: many}}")
    msgs = problems(text)
    assert any(m.startswith("spec.replicas:") and "-1" in m for m in msgs)
    assert any(m.startswith("spec.kvCache.l1.maxBytes:") for m in msgs)


def test_wrong_api_version_and_kind():
    (msg,) = problems(GOOD.replace("fleetserve.io/v1", "v2"))
    assert msg.startswith("apiVersion:") and "fleetserve.io/v1" in msg and "inference.sagemaker" in msg
    (msg,) = problems(GOOD.replace("kind: Endpoint", "kind: Deployment"))
    assert msg.startswith("kind:") and "'Endpoint'" in msg


def test_missing_model_source():
    (msg,) = problems(GOOD.replace("source: builtin:smollm2-135m, ", ""))
    assert msg == "spec.model.source: required field is missing"


def test_unsupported_source_scheme():
    (msg,) = problems(GOOD.replace("builtin:smollm2-135m", "gs://bucket/model"))
    assert msg.startswith("spec.model.source:") and "s3://" in msg


def test_cross_field_rules():
    msgs = problems(GOOD.replace("replicas: 2", "replicas: 2\n  autoscaling: {minReplicaCount: 3, maxReplicaCount: 2}"))
    assert any("maxReplicaCount (2) is below minReplicaCount (3)" in m for m in msgs)
    msgs = problems(GOOD.replace("replicas: 2", "replicas: 2\n  engine: {kind: external}"))
    assert any("engine.urls" in m for m in msgs)


def test_metadata_name_must_be_dns_label():
    (msg,) = problems(GOOD.replace("name: chat", "name: Chat_1"))
    assert msg.startswith("metadata.name:") and "DNS label" in msg


def test_metadata_name_must_start_with_a_letter():  # it names Services, which Kubernetes refuses otherwise
    (msg,) = problems(GOOD.replace("name: chat", "name: 1chat"))
    assert msg.startswith("metadata.name:") and "starts with a digit" in msg and "ep-1chat" in msg
    assert load_spec_text(GOOD.replace("team-a", "1team")).endpoint.metadata.namespace == "1team"  # namespaces may


def test_resources_are_kubernetes_quantities():  # the API server refused the rendered Deployment before
    engine = "  engine: {resources: {limits: {memory: 30GB}}}"
    (msg,) = problems(GOOD.replace("  replicas: 2", "  replicas: 2\n" + engine))
    assert msg.startswith("spec.engine.resources:") and "limits.memory: '30GB' is not a Kubernetes quantity" in msg
    for bad in ("{requests: {cpu: two}}", "{limits: {cpu: '-1'}}", "{limit: {cpu: 1}}"):
        assert problems(GOOD.replace("  replicas: 2", f"  replicas: 2\n  engine: {{resources: {bad}}}"))
    good = "  engine: {resources: {limits: {memory: 30Gi, cpu: 4}, requests: {cpu: 500m, memory: 1.5e9}}}"
    assert load_spec_text(GOOD.replace("  replicas: 2", "  replicas: 2\n" + good)).endpoint.spec.engine.resources
    # what the API server refuses (this test's "good" example asked 2 cpu under a 500m limit until it did)
    for bad, said in (("{requests: {cpu: 2}, limits: {cpu: 500m}}", "requests.cpu (2) is above limits.cpu (500m)"),
                      ("{requests: {memory: 2Gi}, limits: {memory: 1Gi}}", "requests.memory (2Gi) is above"),
                      ("{requests: {nvidia.com/gpu: 2}}", "needs limits.nvidia.com/gpu of the same amount")):
        (msg,) = problems(GOOD.replace("  replicas: 2", f"  replicas: 2\n  engine: {{resources: {bad}}}"))
        assert said in msg, msg
    (msg,) = problems(GOOD.replace("  replicas: 2", "  replicas: 2\n  engine: {gpus: 1, resources: {limits: "
                                                    "{nvidia.com/gpu: 2}}}"))
    assert "disagrees with engine.gpus (1)" in msg, msg


def test_a_floor_above_max_replicas_is_refused_and_replicas_above_it_warned():
    auto = ("  autoscaling: {minReplicaCount: 1, maxReplicaCount: 2, triggers: [{metric: concurrency, target: 4}], "
            "schedules: [{name: day, start: '0 9 * * *', end: '0 17 * * *', minReplicas: 5}]}")
    (msg,) = problems(GOOD.replace("  replicas: 2", "  replicas: 2\n" + auto))
    assert "schedules[0].minReplicas (5) is above maxReplicaCount (2)" in msg
    text = GOOD.replace("  replicas: 2", "  replicas: 10\n" + auto.replace("minReplicas: 5", "minReplicas: 2"))
    warnings = {w.path: w.message for w in load_spec_text(text).warnings}
    assert "the fleet runs at most 2" in warnings["spec.replicas"]
    below = GOOD.replace("  replicas: 2", "  replicas: 1\n" + auto.replace("minReplicaCount: 1", "minReplicaCount: 2")
                         .replace("minReplicas: 5", "minReplicas: 2"))
    warnings = {w.path: w.message for w in load_spec_text(below).warnings}
    assert "1 is below autoscaling.minReplicaCount (2): the fleet starts at 2" in warnings["spec.replicas"]
    unset = below.replace("  replicas: 1\n", "")  # the default 1 is not the user's word: nothing to warn
    assert "spec.replicas" not in {w.path for w in load_spec_text(unset).warnings}
    (msg,) = problems(GOOD.replace("  replicas: 2", "  replicas: 2\n" + auto.replace("maxReplicaCount: 2",
                                                                                   "maxReplicaCount: 1000")))
    assert "maxReplicaCount" in msg and "256" in msg, msg


def test_a_schedule_that_never_fires_is_refused():
    """31 February was accepted: the window never opened and its floor was never held, unsaid."""
    auto = ("  autoscaling: {minReplicaCount: 1, maxReplicaCount: 4, triggers: [{metric: concurrency, target: 4}], "
            "schedules: [{name: leap, start: '0 9 %s *', end: '0 17 %s *', minReplicas: 2}]}")
    (msg,) = problems(GOOD.replace("  replicas: 2", "  replicas: 2\n" + auto % ("31 2", "31 2")))
    assert "schedules[0].start" in msg and "never fires: day of month 31 does not occur in month 2" in msg, msg
    assert load_spec_text(GOOD.replace("  replicas: 2", "  replicas: 2\n" + auto % ("29 2", "29 2")))  # leap years
    assert load_spec_text(GOOD.replace("  replicas: 2", "  replicas: 2\n" + auto % ("31 1-2", "31 1-2")))


def test_per_replica_limits_with_several_router_workers_are_warned_as_split():
    """With router.workers 2 each worker counts its own requests: a replica limited to 1 ran 2 at once, unsaid."""
    limits = "  requestLimits: {maxConcurrentRequests: 1}\n  router: {workers: 2}"
    warnings = {w.path: w.message for w in load_spec_text(GOOD.replace("  replicas: 2", "  replicas: 2\n" + limits)
                                                          ).warnings}
    assert "a replica may see up to 2x the limit" in warnings["spec.requestLimits.maxConcurrentRequests"]
    one = {w.path for w in load_spec_text(GOOD.replace("  replicas: 2", "  replicas: 2\n" + limits.split("\n")[0])
                                          ).warnings}
    assert "spec.requestLimits.maxConcurrentRequests" not in one


def test_the_simulated_clouds_typos_and_impossible_values_are_refused_or_warned():
    """A typo in a limit's type, a negative limit, an unknown shortage type, a shortage ending before it starts and
    a budget of 150% were all accepted silently and had no effect (or a wrong one)."""
    cloud = ("  placement: {{instanceTypes: [ml.g5.xlarge]}}\n  capacity:\n    provider: simulated\n"
             "    capacityTypes: [on-demand]\n    simulated: {{limits: {{{limits}}}, shortages: [{{{short}}}], "
             "spotInterruptionRatePerHour: {spot}}}\n    consolidation: {{budgets: [{{nodes: '{budget}'}}]}}")
    ok = {"limits": "g5.xlarge: 2", "short": "instanceType: g5.xlarge, startSeconds: 0, endSeconds: 10",
          "spot": 0, "budget": "10%"}

    def spec(**change):
        return GOOD.replace("  replicas: 2", "  replicas: 2\n" + cloud.format(**{**ok, **change}))

    for change, said in (({"limits": "g5.xlarg: 2"}, "limits.g5.xlarg: unknown instance type 'g5.xlarg'; known:"),
                         ({"limits": "g5.xlarge: -1"}, "limits.g5.xlarge: Input should be greater than or equal"),
                         ({"short": "instanceType: g9.huge, startSeconds: 0, endSeconds: 9"},
                          "shortages[0].instanceType: unknown instance type 'g9.huge'"),
                         ({"short": "instanceType: g5.xlarge, startSeconds: 100, endSeconds: 10"},
                          "endSeconds (10) must be after startSeconds (100)"),
                         ({"budget": "150%"}, "'150%': a share of the nodes is at most 100%")):
        (msg,) = problems(spec(**change))
        assert said in msg, msg
    warnings = {w.path: w.message for w in load_spec_text(spec(limits="g6e.xlarge: 1", spot=5)).warnings}
    assert "no node of it is ever launched" in warnings["spec.capacity.simulated.limits.g6e.xlarge"]
    assert "has no spot" in warnings["spec.capacity.simulated.spotInterruptionRatePerHour"]
    # up and status price ml.* types at EC2 rates, as simulate does (only simulate said so); gpus pack its nodes
    assert "SageMaker instance types are priced at EC2 rates" in warnings["spec.placement.instanceTypes"]
    from fleetserve.capacity.prices import sagemaker_pricing  # a fleet that may run on spot was billed at spot rates,
    # and the warning quoted the on-demand one alone (the cost looked wrong)
    endpoint = load_spec_text(spec(limits="g6e.xlarge: 1", spot=5)).endpoint
    assert "on demand" in sagemaker_pricing(endpoint.spec)[0]
    spotted = endpoint.spec.model_copy(update={"capacity": endpoint.spec.capacity.model_copy(
        update={"capacity_types": ["spot", "on-demand"]})})
    assert "/h spot" in sagemaker_pricing(spotted)[0]
    gpus = GOOD.replace("  replicas: 2", "  replicas: 2\n  engine: {gpus: 1}\n" + cloud.format(**ok))
    assert "spec.engine.gpus" not in {w.path for w in load_spec_text(gpus).warnings}
    assert not {p for p in (w.path for w in load_spec_text(spec()).warnings) if "simulated" in p}


def test_an_instance_type_outside_the_catalog_is_warned():
    text = GOOD.replace("  replicas: 2", "  replicas: 2\n  placement: {instanceTypes: [g6e.xlarge, ml.g9.huge]}")
    warnings = {w.path: w.message for w in load_spec_text(text).warnings}
    assert "not in the built-in catalog" in warnings["spec.placement.instanceTypes[1]"]
    assert "spec.placement.instanceTypes[0]" not in warnings


def test_a_key_given_twice_is_refused_with_both_lines():
    (msg,) = problems(GOOD.replace("  replicas: 2", "  replicas: 2\n  routing: {strategy: leastload}"))
    assert msg == "not valid YAML: key 'routing' given twice in one mapping (line 8 and line 9); keep one"


def test_yaml_merge_keys_may_be_overridden():
    engine = "  engine:\n    <<: {port: 9000, kind: builtin}\n    port: 9001"
    text = GOOD.replace("  replicas: 2", "  replicas: 2\n" + engine)
    assert load_spec_text(text).endpoint.spec.engine.port == 9001


def test_not_yaml_and_not_mapping():
    assert "not valid YAML" in problems("a: [")[0]
    assert "mapping" in problems("- 1\n- 2")[0]


def test_settings_without_effect_are_warned():
    text = GOOD.replace("roundrobin", "prefixaware") + "  kvCache: {l2: {enabled: true, tenantUrls: {a: \"redis://x\"}}}\n"
    warnings = {w.path for w in load_spec_text(text).warnings}
    assert {"spec.kvCache.l2.tenantUrls"} <= warnings
    assert "spec.routing.strategy" not in warnings  # every routing strategy is implemented


def test_a_local_queue_depth_trigger_in_front_of_vllm_or_sglang_reads_their_gauge_so_nothing_is_warned():
    """vLLM's and SGLang's health bodies carry no queue: a local queue_depth trigger read only the router's queue
    and the spec warned; `fleetserve up` now has the router read their /metrics gauge (router/engine_queue.py)."""
    from fleetserve.fleet.supervisor import Supervisor

    auto = "  autoscaling: {triggers: [{metric: concurrency, target: 4}, {metric: queue_depth, target: 2}]}\n"
    for kind in ("vllm", "sglang"):
        loaded = load_spec_text(GOOD + f"  engine: {{kind: {kind}, gpus: 1}}\n" + auto)
        assert not [w for w in loaded.warnings if "queue_depth" in w.message]
        sup = Supervisor(loaded, "spec.yaml", say=lambda _m: None)
        args = sup._engine_kind_router_args()
        sup._http.close()
        assert args[args.index("--queue-metrics") + 1] == kind and "--model-metrics" in args
    sup = Supervisor(load_spec_text(GOOD + auto), "spec.yaml", say=lambda _m: None)
    args = sup._engine_kind_router_args()  # the built-in engine's health body has its queue, and it counts its
    sup._http.close()  # own model_* series: the router adds only the errors it produces itself
    assert "--queue-metrics" not in args and args[args.index("--model-metrics-scope") + 1] == "router"


def test_instance_types_no_replica_fits_on_are_a_warning():
    """1-GPU replicas on p5.48xlarge (8 GPUs) without allowLargerInstances validated, and simulate showed an error
    rate of 1.0 as cold-start timeouts; a pod asking more cpu than the type has is the same."""
    from fleetserve.spec.load import load_spec_data

    def warnings(spec: dict) -> list[str]:
        loaded = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "w"},
                                 "spec": {"model": {"source": "catalog:llama-3.1-8b-instruct"}, **spec}})
        return [f"{w.path}: {w.message}" for w in loaded.warnings]

    big = warnings({"placement": {"instanceTypes": ["p5.48xlarge"]}})
    assert any("no listed type takes a replica" in w and "allowLargerInstances" in w for w in big)
    assert not any("no listed type" in w for w in warnings({"placement": {"instanceTypes": ["p5.48xlarge"]},
                                                               "capacity": {"allowLargerInstances": True}}))
    cpu = warnings({"placement": {"instanceTypes": ["g6e.xlarge"]},
                    "engine": {"resources": {"requests": {"cpu": "6", "memory": "30Gi"}}}})
    assert any("no listed type takes a replica of 1 GPU(s), 17.7 GiB of GPU memory together, 6 cpu, 30 GiB of "
               "memory" in w and "allowLargerInstances" not in w for w in cpu), cpu


def test_a_model_its_gpus_cannot_hold_is_a_validate_warning():
    """The GPU-memory check was the simulator's alone: a 70B on one 24 GB A10G validated without a word."""
    from fleetserve.spec.load import load_spec_data

    def warnings(model: str, instance_type: str, gpus: int = 1) -> list[str]:
        loaded = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "w"},
                                 "spec": {"model": {"source": model}, "engine": {"kind": "vllm", "gpus": gpus},
                                          "placement": {"instanceTypes": [instance_type]},
                                          "capacity": {"allowLargerInstances": True}}})
        return [w.message for w in loaded.warnings if w.path == "spec.placement.instanceTypes"]

    big = warnings("hf:meta-llama/Llama-3.1-70B-Instruct", "g5.xlarge")
    assert len(big) == 1 and "GPU memory holds the bf16 weights" in big[0] and "g5.xlarge: 1 GPU(s) of 24 GiB" in big[0]
    assert warnings("hf:meta-llama/Llama-3.1-8B-Instruct", "g5.xlarge") == []
    assert warnings("hf:meta-llama/Llama-3.1-70B-Instruct", "p4d.24xlarge", gpus=8) == []  # 8 x 40 GB holds it


def test_a_schedule_lead_past_a_day_is_an_error_naming_the_field():
    """scheduleLeadTime 1e12 validated, then simulate died in datetime ('year 33714 is out of range')."""
    import pytest

    from fleetserve.spec.load import SpecError, load_spec_data

    data = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "lead"},
            "spec": {"model": {"source": "builtin:smollm2-135m"},
                     "autoscaling": {"scheduleLeadTime": 1e12, "schedules": [
                         {"name": "day", "start": "0 9 * * *", "end": "0 17 * * *", "minReplicas": 1}]}}}
    with pytest.raises(SpecError) as caught:
        load_spec_data(data)
    assert "spec.autoscaling.scheduleLeadTime" in str(caught.value) and "86400" in str(caught.value)


def test_a_budget_zone_and_a_node_affinity_render_cannot_read_are_errors_naming_the_field():
    """validate passed both, then `render k8s` died: ZoneInfoNotFoundError, and AttributeError on a string where
    Kubernetes' NodeAffinity has an object."""
    import pytest

    from fleetserve.spec.load import SpecError, load_spec_data

    def load(spec: dict):
        return load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "x"},
                               "spec": {"model": {"source": "builtin:smollm2-135m"}, **spec}})

    cases = [
        ({"capacity": {"consolidation": {"budgets": [{"nodes": "1", "timezone": "Nowhere/X"}]}}},
         "spec.capacity.consolidation.budgets.0", "Nowhere/X"),
        ({"capacity": {"consolidation": {"budgets": [{"nodes": "1", "schedule": "99 * * * *",
                                                      "durationSeconds": 60}]}}},
         "spec.capacity.consolidation.budgets.0", "budget schedule"),
        ({"placement": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "x"}}},
         "spec.placement", "nodeSelectorTerms"),
        ({"placement": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 500, "preference": {"matchExpressions": []}}]}}}, "spec.placement", "weight"),
        ({"placement": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "k", "operator": "Near", "values": ["a"]}]}]}}}}, "spec.placement", "Near"),
        # what the API server and Karpenter refuse, which rendered with exit 0: values per operator, a karpenter.sh/
        # key in the NodePool's requirements, a budget Karpenter's pattern or a Go duration cannot take
        *[({"placement": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [expr]}]}}}}, "spec.placement", said) for expr, said in [
            ({"key": "a", "operator": "Gt", "values": ["x"]}, "exactly one whole number"),
            ({"key": "a", "operator": "Lt", "values": ["1", "2"]}, "exactly one whole number"),
            ({"key": "a", "operator": "In", "values": []}, "at least one value"),
            ({"key": "a", "operator": "Exists", "values": ["v"]}, "takes no values"),
            ({"key": "karpenter.sh/nodepool", "operator": "In", "values": ["gpu"]}, "Karpenter refuses it"),
            # its rule is on the domain: a subdomain of karpenter.sh had passed, and the NodePool was refused
            ({"key": "node.karpenter.sh/x", "operator": "In", "values": ["gpu"]}, "Karpenter refuses it")]],
        ({"capacity": {"consolidation": {"budgets": [{"nodes": "007%"}]}}}, "spec.capacity.consolidation", "007%"),
        ({"capacity": {"consolidation": {"budgets": [{"nodes": "1", "schedule": "0 9 * * *",
                                                      "durationSeconds": 1e30}]}}},
         "spec.capacity.consolidation", "31536000"),
    ]
    for spec, path, said in cases:
        with pytest.raises(SpecError) as caught:
            load(spec)
        text = str(caught.value)
        assert said in text and (path in text or path.replace(".0", "[0]") in text), text
    load({"placement": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2a"]},
                              {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
                              {"key": "gpu-memory", "operator": "Gt", "values": ["40"]},
                              {"key": "dedicated", "operator": "DoesNotExist"}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50, "preference": {"matchExpressions": [
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["g5.xlarge"]}]}}]}}})


def test_engine_args_may_not_set_the_flags_the_adapters_set():
    """vLLM takes the last --port: one in engine.args moved the server off the port the container, probes and Service
    use, and the pod never became ready."""
    for args, flag in ((["--port", "9000"], "--port"), (["--port=9000"], "--port"), (["--host", "::"], "--host")):
        spec = f"  replicas: 2\n  engine: {{kind: vllm, args: {args}}}"
        (msg,) = problems(GOOD.replace("  replicas: 2", spec))
        assert f"spec.engine.args: sets {flag}" in msg, msg
    engine = "  engine: {kind: vllm, args: [--max-model-len, '4096'], port: 9000}"
    ok = GOOD.replace("  replicas: 2", "  replicas: 2\n" + engine)
    assert load_spec_text(ok).endpoint.spec.engine.port == 9000
    # another served name was a 404 for every request (the router and metrics use model.name); a tensor or pipeline
    # size of the args' own left GPUs idle or asked for more than the pod has
    for kind, args, flag, says in (
            ("vllm", ["--served-model-name", "zz"], "--served-model-name", "use spec.model.name"),
            ("vllm", ["--tensor-parallel-size", "2"], "--tensor-parallel-size", "use engine.gpus"),
            ("vllm", ["-tp", "2"], "-tp", "use engine.gpus"),
            ("vllm", ["--pipeline-parallel-size=2"], "--pipeline-parallel-size", "pipeline parallelism is not"),
            ("sglang", ["--tp", "2"], "--tp", "use engine.gpus"),
            ("sglang", ["--served-model-name", "zz"], "--served-model-name", "use spec.model.name")):
        spec = f"  replicas: 2\n  engine: {{kind: {kind}, args: {args}}}"
        (msg,) = problems(GOOD.replace("  replicas: 2", spec))
        assert f"spec.engine.args: sets {flag}" in msg and says in msg, msg
    spec = "  replicas: 2\n  engine: {kind: vllm, args: [--dtype, float16]}"
    (msg,) = problems(GOOD.replace("  replicas: 2", spec).replace("model: {", "model: {dtype: bfloat16, "))
    assert "--dtype float16 disagrees with model.dtype bfloat16" in msg, msg
    # the same values the adapters set are harmless (a HyperPod worker's args often repeat them)
    agreeing = ("  replicas: 2\n  engine: {kind: vllm, gpus: 2, args: [--tensor-parallel-size, '2', "
                "--served-model-name, smollm2, --dtype, half]}")
    load_spec_text(GOOD.replace("  replicas: 2", agreeing).replace("model: {", "model: {dtype: float16, "))


@pytest.mark.parametrize("setting,path", [
    ("replicas: true", "spec.replicas"),
    ("slo: {ttftP95Ms: true}", "spec.slo.ttftP95Ms"),
    ("slo: {costPerHourUsd: false}", "spec.slo.costPerHourUsd"),
    ("autoscaling: {maxReplicaCount: true}", "spec.autoscaling.maxReplicaCount"),
    ("capacity: {simulated: {limits: {g6e.xlarge: true}}}", "spec.capacity.simulated.limits"),
])
def test_a_boolean_is_not_a_number(setting, path):
    """YAML's `true` read as 1 (`ttftP95Ms: true` verified against 1 ms): a typo, named."""
    (msg,) = problems(GOOD.replace("replicas: 2", setting))
    assert msg.startswith(path) and "boolean" in msg


@pytest.mark.parametrize("setting,path", [
    ('replicas: "3"', "spec.replicas"),
    ("slo: {ttftP95Ms: '500'}", "spec.slo.ttftP95Ms"),
    ('autoscaling: {maxReplicaCount: "4"}', "spec.autoscaling.maxReplicaCount"),
    ('capacity: {simulated: {limits: {g6e.xlarge: "2"}}}', "spec.capacity.simulated.limits"),
])
def test_a_quoted_number_is_refused_as_kubernetes_refuses_it(setting, path):
    """`replicas: "3"` ran under `up` (pydantic coerced it) while the CRD's schema refuses it: the spec said valid
    what `kubectl apply` would not take."""
    (msg,) = problems(GOOD.replace("replicas: 2", setting))
    assert msg.startswith(path) and ("got the string" in msg or "got a string" in msg), msg


@pytest.mark.parametrize("setting,path,quoted", [
    ('tls: {enabled: "true"}', "spec.tls.enabled", True),
    ("tls: {enabled: 'off'}", "spec.tls.enabled", False),
    ("metrics: {enabled: 1}", "spec.metrics.enabled", False),
    ("observability: {logPrompts: 'y'}", "spec.observability.logPrompts", False),
])
def test_a_boolean_field_takes_true_or_false_only_as_the_crd_does(setting, path, quoted):
    """pydantic read "true", "off", 1 and "y" as booleans; the CRD's `type: boolean` refuses them, so `kubectl
    apply` failed on what validate had passed."""
    (msg,) = problems(GOOD.replace("replicas: 2", "replicas: 2\n  " + setting))
    assert msg.startswith(path) and "expected true or false" in msg, msg
    assert ("without quotes" in msg) == quoted, msg


def test_byte_sizes_take_kubernetes_quantities_as_the_pods_they_size_do():
    """`l1.maxBytes: 4Gi` was refused as no integer, where the pod's memory beside it is written so."""
    spec = GOOD.replace("replicas: 2", "replicas: 2\n  kvCache: {l1: {maxBytes: 4Gi}, l2: {maxBytes: 1.5G}}\n"
                                       "  observability: {logMaxBytes: 10Mi}")
    loaded = load_spec_text(spec).endpoint.spec
    assert loaded.kv_cache.l1.max_bytes == 4 << 30 and loaded.kv_cache.l2.max_bytes == 1_500_000_000
    assert loaded.observability.log_max_bytes == 10 << 20
    for value, said in [("'1500m'", "not a whole number of bytes"), ("'4 Gi'", "Kubernetes quantity (4Gi"),
                        ("'1e400'", "too large"), ("9Ei", "less than or equal to 9223372036854775807"),
                        ("99999999999999999999", "less than or equal"),
                        ("true", "boolean"), ("0Gi", "greater than 0")]:
        (msg,) = problems(GOOD.replace("replicas: 2", f"replicas: 2\n  kvCache: {{l1: {{maxBytes: {value}}}}}"))
        assert msg.startswith("spec.kvCache.l1.maxBytes") and said in msg, msg
    from fleetserve.k8s.crd import spec_schema

    l1 = spec_schema()["properties"]["kvCache"]["properties"]["l1"]["properties"]["maxBytes"]
    assert l1["x-kubernetes-int-or-string"] is True and "type" not in l1  # the CRD takes either, as the spec


def test_numbers_are_read_as_kubernetes_reads_them():
    """YAML 1.1 took `1e6` (no dot) for a string; Kubernetes' YAML 1.2 reads a number. Refusing quoted numbers, the
    spec must read it as the number it is."""
    loaded = load_spec_text(GOOD.replace("replicas: 2", "replicas: 2\n  slo: {ttftP95Ms: 1e3, e2eP95Ms: 2E+4}"))
    slo = loaded.endpoint.spec.slo
    assert slo.ttft_p95_ms == 1000 and slo.e2e_p95_ms == 20000


def test_slo_targets_are_bounded_as_the_flags_are():
    """The flags take at least 1 ms; the spec took 0.5 and printed it as "<= 0 ms"."""
    (msg,) = problems(GOOD.replace("replicas: 2", "slo: {e2eP95Ms: 0.5}"))
    assert msg.startswith("spec.slo.e2eP95Ms") and "greater than or equal to 1" in msg


@pytest.mark.parametrize("setting, path", [
    ("router: {bufferTimeoutSeconds: 604800}", "spec.router.bufferTimeoutSeconds"),
    ("capacity: {provider: simulated, simulated: {provisioningDelaySeconds: 1e15}}",
     "spec.capacity.simulated.provisioningDelaySeconds"),
    ("engine: {startupTimeoutSeconds: 1e9}", "spec.engine.startupTimeoutSeconds"),
])
def test_waits_are_at_most_a_day(setting, path):
    """A week of bufferTimeoutSeconds held a request the simulator walked in 15 s of wall time (a day: 1.6 s), and
    1e15 s of node provisioning beside a long hold walked longer: no client or cloud waits that long."""
    (msg,) = problems(GOOD.replace("replicas: 2", setting))
    assert msg.startswith(path) and "less than or equal to 86400" in msg, msg


def test_auth_enabled_without_keys_is_an_error_of_validate():
    """`validate` said valid and `up` failed with exit 1: every request would have been a 401."""
    (msg,) = problems(GOOD.replace("replicas: 2", "auth: {enabled: true}"))
    assert msg.startswith("spec.auth") and "apiKeys is empty" in msg


def test_trigger_fields_of_prometheus_only_and_a_fallback_above_the_max_are_refused():
    """`query` on a concurrency trigger was ignored without a word, and a fallback of 10 under a max of 3 was
    capped by the HPA while the spec said 10."""
    auto = ("  autoscaling: {maxReplicaCount: 3, triggers: [{metric: concurrency, target: 4, query: 'sum(x)'}]}")
    (msg,) = problems(GOOD.replace("  routing: {strategy: roundrobin}", auto))
    assert "query apply to metric 'prometheus' only" in msg and "triggers" in msg, msg
    auto = ("  autoscaling: {maxReplicaCount: 3, triggers: [{metric: concurrency, target: 4}], "
            "fallback: {failureThreshold: 3, replicas: 10}}")
    (msg,) = problems(GOOD.replace("  routing: {strategy: roundrobin}", auto))
    assert "fallback.replicas (10) is above maxReplicaCount (3)" in msg, msg


def test_one_api_key_names_one_tenant(tmp_path, monkeypatch):
    """The same key for two tenants merged them: the last took it, the first vanished (its requests counted,
    salted and billed as the other's), and validate said valid."""
    from fleetserve.fleet.supervisor import StartupError, Supervisor

    digest = "a" * 64
    auth = (f"  auth: {{enabled: true, apiKeys: [{{tenant: alpha, keySha256: '{digest}'}}, "
            f"{{tenant: bravo, keySha256: '{digest}'}}]}}")
    (msg,) = problems(GOOD.replace("  routing: {strategy: roundrobin}", auth))
    assert "apiKeys[1] (tenant 'bravo') has the keySha256 of apiKeys[0] (tenant 'alpha')" in msg, msg
    same = GOOD.replace("  routing: {strategy: roundrobin}", "  auth: {enabled: true, apiKeys: [{tenant: alpha, "
                        "keyEnv: KEY_A}, {tenant: bravo, keyEnv: KEY_B}]}")
    monkeypatch.setenv("KEY_A", "same-key")
    monkeypatch.setenv("KEY_B", "same-key")
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path))
    path = tmp_path / "e.yaml"
    path.write_text(same)
    sup = Supervisor(load_spec_text(same), str(path), say=lambda _m: None)
    try:
        with pytest.raises(StartupError, match=r"apiKeys\[1\] \(tenant 'bravo'\) holds the same key as apiKeys\[0\]"):
            sup._security_args()
    finally:
        sup._http.close()


@pytest.mark.parametrize("url, says", [
    ("http://localhost:6379", "unix://"), ("not a url", "unix://"), ("localhost:6379", "unix://"),
    ("redis://h:99999", "port"), ("redis://", "host"), ("redis://h/abc", "database"), ("unix://", "path"),
    ("redis://not a url", "no host name"), ("redis://a b:6379/0", "no host name"), ("redis://-x:1", "no host name"),
    # validate passed them, and every replica died at its start with redis-py's traceback (found in a black-box pass)
    ("redis://h:6379/0?socket_timeout=abc", "Invalid value for 'socket_timeout'"),
    ("redis://h:6379/0?sockettimeout=1", "query parameter(s) sockettimeout not taken here"),
    ("redis://h:6379/0?decode_responses=true", "decode_responses not taken"),  # every read a malformed reply
    ("redis://h:6379/0?connection_class=x", "connection_class not taken"),
])
def test_an_l2_url_redis_cannot_read_is_refused_naming_the_field(url, says):
    """`http://...` was valid, and `up` then died in every replica with redis-py's ValueError."""
    (msg,) = problems(GOOD + f"  kvCache: {{l2: {{enabled: true, url: {url!r}}}}}\n")
    assert msg.startswith("spec.kvCache.l2.url") and says in msg
    load_spec_text(GOOD + "  kvCache: {l2: {enabled: true, url: 'unix:///run/redis.sock'}}\n")
    for good in ("redis://[::1]:6379", "redis://10.0.0.5/1", "rediss://redis_1.cache.svc.cluster.local:6380",
                 "redis://h/0?socket_timeout=0.5&max_connections=4", "rediss://h:6380/0?ssl_cert_reqs=none"):
        load_spec_text(GOOD + f"  kvCache: {{l2: {{enabled: true, url: {good!r}}}}}\n")


def test_a_block_size_no_prompt_can_fill_is_warned():
    text = GOOD.replace("version: \"3\"}", "version: \"3\", contextLength: 4096}") + "  kvCache: {blockSize: 100000}\n"
    (warning,) = [w for w in load_spec_text(text).warnings if w.path == "spec.kvCache.blockSize"]
    assert "nothing is cached" in warning.message


def test_an_upper_case_redis_scheme_still_validates():  # redis-py lower-cases it: REDIS:// had worked
    load_spec_text(GOOD + "  kvCache: {l2: {enabled: true, url: 'REDIS://localhost:6379/0'}}\n")


def test_a_redis_password_with_a_slash_is_no_bad_port():  # the credentials end at the last @, as redis-py's reader
    load_spec_text(GOOD + "  kvCache: {l2: {enabled: true, url: 'redis://:ab/cd@redis.example.com:6379/0'}}\n")


def test_a_spot_fleet_of_one_with_a_drain_as_long_as_the_notice_is_told_what_a_notice_does():
    """A spot notice drains a replica at once when drainTimeoutSeconds takes the whole 120 s notice: a fleet of one
    holds every request for the replacement's cold start. Said, with what keeps it serving."""
    spot = ("  placement: {instanceTypes: [ml.g5.xlarge]}\n"
            "  capacity: {provider: simulated, capacityTypes: [spot]}\n")
    one = GOOD.replace("  replicas: 2", "  replicas: 1\n" + spot)
    warned = {w.path: w.message for w in load_spec_text(one).warnings}
    assert "drains at its node's interruption notice" in warned["spec.engine.drainTimeoutSeconds"]
    shorter = one.replace("  replicas: 1\n", "  replicas: 1\n  engine: {drainTimeoutSeconds: 30}\n")
    assert "spec.engine.drainTimeoutSeconds" not in {w.path for w in load_spec_text(shorter).warnings}
    two = GOOD.replace("  replicas: 2", "  replicas: 2\n" + spot)
    assert "spec.engine.drainTimeoutSeconds" not in {w.path for w in load_spec_text(two).warnings}


@pytest.mark.parametrize("key,camel", [("request_limits", "requestLimits"), ("kv_cache", "kvCache")])
def test_field_names_in_python_form_are_refused_as_the_crd_refuses_them(key, camel):
    """`request_limits:` passed `fleetserve validate` and the admission webhook (pydantic read fields by their
    Python names too), while the CRD has only the camelCase names: the API server pruned the section, and the
    Endpoint ran without its limits."""
    (msg,) = problems(GOOD + f"  {key}: {{}}\n")
    assert f"spec.{key}: unknown field" in msg and camel in msg, msg


@pytest.mark.parametrize("engine,says", [
    ('{kind: external, urls: ["http://h:abc"]}', "spec.engine.urls: entry 'http://h:abc': Port could not be cast"),
    ('{kind: external, urls: ["http://"]}', "spec.engine.urls: entry 'http://': expected http://host:port"),
    ('{kind: external, urls: ["http://h:8000"], healthPath: health}', "spec.engine.healthPath: 'health' must be"),
])
def test_engine_urls_and_health_path_are_checked_as_the_router_checks_them(engine, says):
    """validate, the webhook and render accepted them; the router refused them at its start (a crash loop)."""
    (msg,) = problems(GOOD.replace("  replicas: 2", f"  replicas: 2\n  engine: {engine}"))
    assert says in msg, msg


@pytest.mark.parametrize("source,says", [("builtin:nope", "unknown builtin model 'nope'; allowed: smollm2-135m"),
                                         ("hf:a/b/c", "expected hf:ORG/NAME"), ("hf:org/name@main", "model.revision"),
                                         ("hf:org/ name", "expected hf:ORG/NAME")])
def test_model_sources_that_name_no_model_are_refused_at_validate(source, says):
    """They passed validate and render k8s, and failed only when `up` (or the fetch init container) ran."""
    (msg,) = problems(GOOD.replace("source: builtin:smollm2-135m", f'source: "{source}"'))
    assert "spec.model.source" in msg and says in msg, msg


MINIMAL = """
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {name: chat}
spec:
  model: {source: builtin:smollm2-135m}
"""


def warned(extra: str) -> dict[str, str]:
    """The warnings (path -> message) of a minimal spec with `extra` lines under spec."""
    return {w.path: w.message for w in load_spec_text(MINIMAL + extra).warnings}


def test_a_ttft_target_above_the_largest_histogram_bucket_is_warned_where_the_rules_cannot_hold_it():
    """The rules counted slow requests at the 120,000 ms bucket (a stricter target than asked) and the TTFT alert,
    comparing a histogram p95 that tops out there, could never fire: silently."""
    said = warned("  slo: {ttftP95Ms: 200000}\n")
    assert "above the latency histograms' largest bucket (120000 ms)" in said["spec.slo.ttftP95Ms"]
    assert "spec.slo.ttftP95Ms" not in warned("  slo: {ttftP95Ms: 120000}\n")


def test_a_stream_idle_timeout_above_the_upstream_timeout_is_warned_as_the_lower_one_applies():
    router = "  router: {upstreamTimeoutSeconds: 30, streamIdleTimeoutSeconds: %s}\n"
    assert "the silence allowed once an answer began is at most the upstream timeout" in \
        warned(router % 90)["spec.router.streamIdleTimeoutSeconds"]
    assert "spec.router.streamIdleTimeoutSeconds" not in warned(router % 30)


def test_autoscaling_without_triggers_names_the_default_it_scales_on():
    autoscaling = "  autoscaling: {minReplicaCount: 0, maxReplicaCount: 2%s}\n"
    assert "the default trigger, concurrency with target 4 per replica" in \
        warned(autoscaling % "")["spec.autoscaling.triggers"]
    assert "spec.autoscaling.triggers" not in warned(autoscaling % ", triggers: [{metric: concurrency, target: 2}]")


def test_a_gpu_engine_given_no_gpu_is_warned_by_validate_simulate_and_render_once(tmp_path):
    """`engine.gpus: 0` (the default) on vLLM: validate and simulate said nothing while the simulator priced one GPU
    and render gave a pod without one, so `plan` could pass a fleet that cannot run once deployed."""
    from fleetserve.k8s.render import render, rendered_warnings
    from fleetserve.sim.run import spec_notes

    gpu = "  engine: {kind: vllm}\n  placement: {instanceTypes: [g6e.xlarge]}\n"
    said = warned(gpu)
    assert "requests no nvidia.com/gpu" in said["spec.engine.gpus"]
    assert "requests no" not in warned(gpu.replace("kind: vllm", "kind: vllm, gpus: 1")).get("spec.engine.gpus", "")
    loaded = load_spec_text(MINIMAL + gpu)
    assert any("requests no nvidia.com/gpu" in n for n in spec_notes(loaded.endpoint))
    printed = rendered_warnings(loaded, render(loaded.endpoint))
    assert sum("nvidia.com/gpu" in w for w in printed) == 1, printed


def test_a_version_yaml_read_as_a_number_says_to_quote_it():
    """`version: 1` said "Input should be a valid string", not how to write it."""
    (msg,) = problems(GOOD.replace('version: "3"', "version: 1.10"))
    assert msg.startswith("spec.model.version: expected a string, got the number 1.1: quote the value"), msg


@pytest.mark.parametrize("change, path", [
    ({"engine": {"env": {"1BAD=": "x"}}}, "spec.engine.env"),
    ({"engine": {"env": {"": "x"}}}, "spec.engine.env"),
    ({"engine": {"envFrom": {"A B": {"secretKeyRef": {"name": "s", "key": "k"}}}}}, "spec.engine.envFrom"),
    ({"pod": {"serviceAccountName": "Bad SA"}}, "spec.pod.serviceAccountName"),
    ({"pod": {"schedulerName": "x y"}}, "spec.pod.schedulerName"),
    ({"pod": {"volumes": [{"name": "Bad_Vol", "emptyDir": {}}]}}, "spec.pod.volumes"),
    ({"pod": {"volumes": [{"name": "model", "emptyDir": {}}]}}, "spec.pod.volumes"),
    ({"pod": {"volumes": [{"name": "data", "emptyDir": {}}, {"name": "data", "emptyDir": {}}]}}, "spec.pod.volumes"),
    # "may not specify more than 1 volume type": the schema of its fields cannot say it
    ({"pod": {"volumes": [{"name": "v", "hostPath": {"path": "/x"}, "emptyDir": {}}]}}, "spec.pod.volumes"),
    ({"pod": {"volumes": [{"name": "v"}]}}, "spec.pod.volumes"),
    ({"model": {"source": "/models/m", "volume": {"nfs": {"server": "s", "path": "/m"}, "emptyDir": {}}}},
     "spec.model.volume"),
])
def test_names_the_api_server_refuses_are_refused_naming_the_field(change, path):
    """An env name `1BAD=`, a service account `Bad SA`, a volume `Bad_Vol` or a second `model` volume validated and
    rendered with exit 0; the API server then refused the Deployment and `kubectl apply` stopped half-way."""
    from fleetserve.spec.errors import SpecError
    from fleetserve.spec.load import load_spec_data

    doc = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "names"},
           "spec": {"model": {"source": "catalog:llama-3.1-8b-instruct"}, **change}}
    with pytest.raises(SpecError) as info:
        load_spec_data(doc)
    assert any(p.path.startswith(path) for p in info.value.problems), info.value.problems


@pytest.mark.parametrize("trigger, said", [
    ({"query": "sum(foo"}, "is never closed"),
    ({"query": 'x{a="b}'}, "a quote is never closed"),
    ({"query": "up", "serverAddress": "not a url"}, "a Prometheus URL"),
])
def test_a_prometheus_trigger_that_cannot_work_is_refused(trigger, said):
    """`query: sum(foo` and `serverAddress: not a url` rendered with exit 0, and KEDA (and the local autoscaler)
    failed at every poll."""
    from fleetserve.spec.errors import SpecError
    from fleetserve.spec.load import load_spec_data

    doc = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "trig"},
           "spec": {"model": {"source": "catalog:llama-3.1-8b-instruct"},
                    "autoscaling": {"triggers": [{"metric": "prometheus", "target": 1, **trigger}]}}}
    with pytest.raises(SpecError) as info:
        load_spec_data(doc)
    assert any(p.path.startswith("spec.autoscaling.triggers[0]") and said in p.message
               for p in info.value.problems), info.value.problems
    ok = {"metric": "prometheus", "target": 1, "query": 'sum(rate(x{a="(\\")"}[1m]))',
          "serverAddress": "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1"}
    load_spec_data({**doc, "spec": {**doc["spec"], "autoscaling": {"triggers": [ok]}}})


def test_schedule_names_that_kubernetes_reads_as_one_are_refused():
    """`Biz` and `biz` (or `biz-1` and `biz_1`) validated, then rendered two KEDA cron triggers named `floor-biz`,
    and KEDA refused the ScaledObject."""
    auto = ("  autoscaling: {minReplicaCount: 0, maxReplicaCount: 4, triggers: [{metric: concurrency, target: 4}], "
            "schedules: [{name: %s, start: '0 9 * * *', end: '0 10 * * *', minReplicas: 1}, "
            "{name: %s, start: '0 11 * * *', end: '0 12 * * *', minReplicas: 1}]}")
    for first, second in (("Biz", "biz"), ("biz-1", "biz_1")):
        (msg,) = problems(GOOD.replace("  replicas: 2", "  replicas: 2\n" + auto % (first, second)))
        assert "schedules[1].name" in msg and f"({first!r}) as a Kubernetes name too" in msg, msg
    (msg,) = problems(GOOD.replace("  replicas: 2", "  replicas: 2\n" + auto % ("biz", "biz")))
    assert "is schedules[0]'s name too" in msg, msg
    assert load_spec_text(GOOD.replace("  replicas: 2", "  replicas: 2\n" + auto % ("biz", "lunch")))


def test_instance_type_names_and_capacity_types_kubernetes_can_match():
    """`instanceTypes: [""]` or `["G5 XLARGE"]` were only "not in the catalog" warnings, and rendered NodePools
    requiring `In [""]`, which no node matches; `capacityTypes: [spot, spot]` passed."""
    for bad in ('""', '"G5 XLARGE"'):
        (msg,) = problems(GOOD.replace("  replicas: 2", f"  replicas: 2\n  placement: {{instanceTypes: [{bad}]}}"))
        assert "spec.placement.instanceTypes[0]" in msg and "is not an instance type name" in msg, msg
    (msg,) = problems(GOOD.replace("  replicas: 2", "  replicas: 2\n  capacity: {capacityTypes: [spot, spot]}"))
    assert "spec.capacity.capacityTypes" in msg and "twice" in msg, msg
    # one EC2 type in SageMaker's spelling and in EC2's rendered two tiers (Deployments, NodePools, an overflow)
    (msg,) = problems(GOOD.replace("  replicas: 2", "  replicas: 2\n  placement: {instanceTypes: [g5.xlarge, "
                                                    "ml.g5.xlarge]}"))
    assert "lists a type twice: [0] and [1] 'ml.g5.xlarge'" in msg and "names the same EC2 type" in msg, msg
    assert load_spec_text(GOOD.replace("  replicas: 2", "  replicas: 2\n  placement: {instanceTypes: [ml.g5.xlarge, "
                                                        "g6e.xlarge]}\n  capacity: {capacityTypes: [spot, on-demand]}"))


def test_values_kubernetes_cannot_carry_are_errors_naming_the_field():
    """A trigger target of 1e-9 rendered a KEDA threshold the HPA reads as 0 (refused), 1e300 a 300-digit one;
    consolidateAfter 1e12 s overflowed Karpenter's Go duration; engine.gpus 1000 asked for a node none has."""
    for section, field, value, bound in (
            ("autoscaling: {triggers: [{metric: concurrency, target: %s}]}", "triggers[0].target", "1e-9", "0.001"),
            ("autoscaling: {triggers: [{metric: concurrency, target: %s}]}", "triggers[0].target", "1e300", "1e12"),
            ("capacity: {consolidation: {consolidateAfter: %s}}", "consolidateAfter", "1e12", "31536000"),
            ("engine: {gpus: %s}", "engine.gpus", "1000", "64"),
            ("autoscaling: {pollingInterval: %s}", "autoscaling.pollingInterval", "1e12", "2147483647"),
            ("autoscaling: {cooldownPeriod: %s}", "autoscaling.cooldownPeriod", "1e12", "2147483647")):
        (msg,) = problems(GOOD.replace("  replicas: 2", "  replicas: 2\n  " + section % value))
        assert field in msg, msg
        assert bound in msg or str(int(float(bound))) in msg, msg


def test_kubernetes_fields_passed_through_are_checked_against_kubernetes_own_schema():
    """Passed through to the pods as given, each of these validated and rendered a Deployment the API server or the
    kubelet refused: an init container without a name, `runAsUser: root`, an unknown volume field, an env source of
    no known kind, a mount of a volume that does not exist, an annotation key `bad key!`, an image `UPPER:tag`."""
    cases = (
        ("  pod: {initContainers: [{nam: x}]}", "spec.pod.initContainers", "'nam' was unexpected"),
        ("  pod: {securityContext: {runAsUser: root}}", "spec.pod.securityContext", "runAsUser: 'root' is not of type"),
        ("  pod: {volumes: [{name: v, bogus: 1}]}", "spec.pod.volumes[0]", "'bogus' was unexpected"),
        ("  pod: {volumeMounts: [{name: nosuchvol, mountPath: /x}]}", "spec.pod.volumeMounts[0].name",
         "'nosuchvol' is no volume of the pod"),
        ("  pod: {volumeMounts: [{name: dshm, mountPath: /x}]}", "spec.pod.volumeMounts[0].name",
         "'dshm' is no volume of the pod"),  # the built-in engine's pod has no shared-memory volume
        ("  engine: {envFrom: {X: {y: 1}}}", "spec.engine.envFrom", "'y' was unexpected"),
        ("  engine: {image: 'UPPER:tag'}", "spec.engine.image", "is not an image reference"),
        # each of these passed validate and render, and the API server refused the Deployment (a review's finds)
        ("  pod: {initContainers: [{name: side, image: busybox, volumeMounts: [{name: nope, mountPath: /s}]}]}",
         "spec.pod.initContainers[0].volumeMounts[0].name", "'nope' is no volume of the pod"),
        ("  pod: {initContainers: [{name: fetch-model, image: busybox}]}", "spec.pod.initContainers",
         "'fetch-model' is an init container fleetserve renders"),
        ("  pod: {initContainers: [{name: x, image: busybox}, {name: x, image: busybox}]}", "spec.pod.initContainers",
         "[1].name: 'x' is given twice"),
        ("  engine: {kind: vllm, gpus: 1}\n  pod: {volumes: [{name: x, emptyDir: {}}], volumeMounts: [{name: x, "
         "mountPath: /dev/shm}]}", "spec.pod.volumeMounts[0].mountPath", "the vllm engine's shared memory"),
        ("  pod: {volumes: [{name: x, emptyDir: {}}, {name: y, emptyDir: {}}], volumeMounts: [{name: x, mountPath: "
         "/d}, {name: y, mountPath: /d/}]}", "spec.pod.volumeMounts[1].mountPath", "mounted by pod.volumeMounts[0]"),
        ("  pod: {securityContext: {runAsUser: -1}}", "spec.pod.securityContext", "allowed values: 0 to 2147483647"),
    )
    for text, path, said in cases:
        (msg,) = problems(GOOD.replace("  replicas: 2", "  replicas: 2\n" + text))
        assert path in msg and said in msg, msg
    (msg,) = problems(GOOD.replace("metadata: {name: chat, namespace: team-a}",
                                   "metadata: {name: chat, namespace: team-a, annotations: {'bad key!': x}}"))
    assert "metadata.annotations" in msg and "'bad key!'" in msg, msg
    big = "x" * 300_000
    (msg,) = problems(GOOD.replace("metadata: {name: chat, namespace: team-a}",
                                   "metadata: {name: chat, namespace: team-a, annotations: {k: " + big + "}}"))
    assert "metadata.annotations" in msg and "at most 253,952" in msg, msg  # the API server's limit, less ours
    assert load_spec_text(GOOD.replace("  replicas: 2", "  replicas: 2\n  pod: {volumes: [{name: v, emptyDir: {}}], "
                                                        "volumeMounts: [{name: v, mountPath: /x}, {name: model, "
                                                        "mountPath: /m}], securityContext: {runAsUser: 1000}}\n"
                                                        "  engine: {envFrom: {T: {secretKeyRef: {name: s, key: k}}}}"))


def test_a_served_model_name_clients_can_send():
    for bad in ('""', '" "', '" smollm2"'):
        (msg,) = problems(GOOD.replace("name: smollm2,", f"name: {bad},"))
        assert "spec.model.name" in msg and "not empty" in msg, msg


@pytest.mark.parametrize("urls, said", [
    ({"alpha": "redis://shared:6379/0", "beta": "redis://shared:6379/1"}, "that tenantUrls[alpha] names too"),
    ({"alpha": "redis://names-router:6379/0"}, "one of this endpoint's own objects"),
])
def test_tenant_redis_hosts_render_would_clash_on_are_refused_by_validate(urls, said):
    """validate passed both, then `render k8s` exited 2 naming two files: two tenants on one rendered Redis (no
    isolation either), and a tenant's Redis named as the endpoint's router Service."""
    from fleetserve.spec.errors import SpecError
    from fleetserve.spec.load import load_spec_data

    doc = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "names"},
           "spec": {"model": {"source": "builtin:smollm2-135m"},
                    "kvCache": {"l2": {"enabled": True, "tenantUrls": urls}}}}
    with pytest.raises(SpecError) as info:
        load_spec_data(doc)
    assert any("tenantUrls" in p.path + p.message and said in p.message for p in info.value.problems), \
        info.value.problems
    doc["spec"]["kvCache"]["l2"]["tenantUrls"] = {"alpha": "redis://a:6379/0", "beta": "redis://b.ext:6379/0",
                                                  "gamma": "redis://b.ext:6379/1",  # a Redis of the user's: theirs
                                                  "delta": "redis://names-acme:6379/0"}  # no name of ours
    load_spec_data(doc)
    doc["spec"]["kvCache"]["l2"]["tenantUrls"] = urls  # vLLM shares the one L2: nothing is rendered per tenant
    doc["spec"]["engine"] = {"kind": "vllm", "gpus": 1}
    doc["spec"]["model"] = {"source": "hf:org/m"}
    load_spec_data(doc)


@pytest.mark.parametrize("tenant", ["team=b", "acme corp", "-x", "é", "a" * 129])
def test_a_tenant_name_the_fleet_cannot_carry_to_its_redis_is_refused_naming_the_rule(tenant):
    """`team=b` with a Redis of its own passed validate and `up` started engines that read `--l2-tenant
    team=b=redis://...` as tenant `team` (exit 2); `acme corp` split in $FLEETSERVE_L2_TENANTS (found in review).
    A tenant without its own Redis keeps a free-text name (a header carries it)."""
    l2 = f"  kvCache: {{l2: {{enabled: true, tenantUrls: {{'{tenant}': 'redis://r.x:6379/0'}}}}}}"
    (msg,) = problems(GOOD.replace("  routing: {strategy: roundrobin}", l2))
    assert "tenantUrls[" in msg and "letters, digits and . _ @ : + -" in msg, msg
    auth = ("  auth: {enabled: true, apiKeys: [{tenant: 'team=b acme corp', keyEnv: K}, "
            "{tenant: 'org/team', keyEnv: L}]}")
    load_spec_text(GOOD.replace("  routing: {strategy: roundrobin}", auth))
    l2 = "  kvCache: {l2: {enabled: true, tenantUrls: {'org:team-a.b@x+1': 'redis://r.x:6379/0'}}}"
    load_spec_text(GOOD.replace("  routing: {strategy: roundrobin}", l2))


@pytest.mark.parametrize("tenant", ['"a\\r\\nx-evil: 1"', '"équipe"', '" acme"', '"tab\\there"'])
def test_a_tenant_a_header_cannot_carry_is_refused(tenant):
    """A line break in a tenant wrote a header of its own into every upstream request, and a letter past ASCII
    reached the engines as another tenant (found in review)."""
    auth = f"  auth: {{enabled: true, apiKeys: [{{tenant: {tenant}, keyEnv: K}}]}}"
    (msg,) = problems(GOOD.replace("  routing: {strategy: roundrobin}", auth))
    assert msg.startswith("spec.auth.apiKeys[0].tenant") and "printable ASCII" in msg, msg


@pytest.mark.parametrize("urls, shared, clash", [
    ({"beta": "redis://localhost/0"}, "redis://127.0.0.1:6379", "as url"),
    ({"beta": "redis://:pw@r.x:6379?db=2"}, "redis://r.x/2", "as url"),
    ({"beta": "redis://r.x/7?db=2"}, "redis://r.x/2", "as url"),  # redis-py reads ?db= before the path
    ({"alpha": "redis://r.x:6379/1", "beta": "redis://user:pw@R.X/1"}, None, "as tenantUrls[alpha]"),
    ({"alpha": "unix:///run/r.sock?db=1", "beta": "unix:///run/../run/r.sock?db=1"}, None, "as tenantUrls[alpha]"),
])
def test_a_tenant_redis_that_reaches_the_shared_database_or_another_tenants_is_refused(urls, shared, clash):
    """Hard isolation passed validate with a tenant on the shared L2's database (a typo or a copied line): the
    tenants' blocks mixed, and each engine's eviction watch counted the other's evictions too (found in review)."""
    l2 = {"enabled": True, "tenantUrls": urls} | ({"url": shared} if shared else {})
    text = GOOD.replace("  routing: {strategy: roundrobin}", f"  kvCache: {{l2: {l2!r}}}".replace("True", "true"))
    (msg,) = problems(text)
    assert msg.startswith("spec.kvCache.l2") and "reaches the same Redis database " + clash in msg, msg
    apart = {tenant: url.replace("/1", "/3", 1) if i else url for i, (tenant, url) in enumerate(urls.items())}
    apart = {t: u.replace("db=1", "db=3") if i else u for i, (t, u) in enumerate(apart.items())}
    if shared:
        apart = {t: u.replace("/0", "/5").replace("db=2", "db=5") for t, u in apart.items()}
    l2["tenantUrls"] = apart
    load_spec_text(GOOD.replace("  routing: {strategy: roundrobin}", f"  kvCache: {{l2: {l2!r}}}".replace("True",
                                                                                                          "true")))


def test_a_tenant_redis_no_key_names_is_a_warning():
    from fleetserve.spec.effects import inert_settings

    text = GOOD.replace("  routing: {strategy: roundrobin}",
                        "  auth: {enabled: true, apiKeys: [{tenant: beta, keyEnv: K}]}\n"
                        "  kvCache: {l2: {enabled: true, tenantUrls: {Beta: 'redis://r.x/1', beta: 'redis://r.x/2'}}}")
    (note,) = [n for n in inert_settings(load_spec_text(text).endpoint) if "tenantUrls" in n.path]
    assert note.path == "spec.kvCache.l2.tenantUrls[Beta]" and "no API key has the tenant 'Beta'" in note.message


def test_autoscaling_an_external_engine_is_said_to_do_nothing():
    """Autoscaling on engine.kind external passed without a word; nothing scales there (no ScaledObject either),
    and validate's summary said 1 replica for two URLs (found in review)."""
    from fleetserve.spec.effects import inert_settings

    text = GOOD.replace("  model: {source: builtin:smollm2-135m, name: smollm2, version: \"3\"}\n  replicas: 2\n",
                        "  model: {source: 'hf:o/m'}\n  engine: {kind: external, urls: ['http://a:1', 'http://b:2']}\n"
                        "  autoscaling: {minReplicaCount: 0, maxReplicaCount: 4}\n")
    notes = {n.path: n for n in inert_settings(load_spec_text(text).endpoint)}
    assert "nothing scales" in notes["spec.autoscaling"].message and notes["spec.autoscaling"].everywhere
    assert "spec.autoscaling.triggers" not in notes  # "scales on the default trigger" would say the opposite


def test_an_l2_too_small_for_a_block_is_a_warning():
    """`l2.maxBytes: 512` passed validate, and the Redis `up` started refused every block (found in review)."""
    from fleetserve.spec.effects import inert_settings

    def said(max_bytes: str) -> list[str]:
        text = GOOD.replace("  routing: {strategy: roundrobin}", f"  kvCache: {{l2: {{enabled: true, maxBytes: "
                                                                     f"{max_bytes}}}}}")
        return [n.message for n in inert_settings(load_spec_text(text).endpoint)
                if n.path == "spec.kvCache.l2.maxBytes"]

    (message,) = said("512")
    assert "512 bytes" in message and "at least 16Mi" in message
    assert said("16Mi") == [] and said("4Gi") == []


@pytest.mark.parametrize("extra, path", [
    ("  capacity: {localSlots: 1}\n", "spec.replicas"),
    ("  capacity: {localSlots: 2}\n  autoscaling: {minReplicaCount: 3, maxReplicaCount: 4}\n",
     "spec.autoscaling.minReplicaCount"),
    ("  capacity: {localSlots: 2}\n  autoscaling: {minReplicaCount: 0, maxReplicaCount: 4, schedules: [{name: d, "
     "start: '0 9 * * *', end: '0 17 * * *', minReplicas: 3}]}\n", "spec.autoscaling.schedules[0].minReplicas"),
])
def test_a_count_the_machines_slots_cannot_hold_is_a_warning(extra, path):
    """`replicas: 3` with `localSlots: 2` passed validate, and `up` waited out startupTimeoutSeconds (10 min) for
    a failure the spec alone showed (found in review)."""
    from fleetserve.spec.effects import inert_settings

    notes = [n for n in inert_settings(load_spec_text(GOOD + extra).endpoint) if n.path == "spec.capacity.localSlots"]
    (note,) = notes
    assert f"replicas of {path}:" in note.message and "refuses to start" in note.message, note
    fine = GOOD.replace("replicas: 2", "replicas: 1") + "  capacity: {localSlots: 2}\n"
    fine += "  autoscaling: {maxReplicaCount: 9}\n"  # above the slots: a shortage status reports, not a refusal
    assert not [n for n in inert_settings(load_spec_text(fine).endpoint) if n.path == "spec.capacity.localSlots"]


def test_a_start_count_the_simulated_clouds_limits_cannot_place_is_a_warning():
    """`replicas: 2` on one g5.xlarge node at most: validate said nothing, and the fleet ran one replica for good."""
    from fleetserve.spec.effects import inert_settings

    def said(placement: str, limits: str) -> list[str]:
        text = GOOD + f"  placement: {{instanceTypes: [{placement}]}}\n" \
            f"  capacity: {{provider: simulated, simulated: {{limits: {{{limits}}}}}}}\n"
        return [n.message for n in inert_settings(load_spec_text(text).endpoint)
                if n.path == "spec.capacity.simulated.limits"]

    (message,) = said("ml.g5.xlarge", "ml.g5.xlarge: 1")
    assert "at most 1 replica(s)" in message and "the 2 of spec.replicas" in message, message
    assert said("g5.xlarge", "g5.xlarge: 2") == []
    assert said("g5.xlarge, g6e.xlarge", "g5.xlarge: 1") == []  # the second type has no limit
    assert said("g5.xlarge, g6e.xlarge", "g5.xlarge: 1, g6e.xlarge: 0") != []


def test_keys_or_certificates_without_enabled_turn_their_section_on_and_an_explicit_off_is_warned():
    """`auth: {apiKeys: [...]}` without `enabled` served everyone, with no tenant, and `tls` with its files but
    `enabled: false` served plain HTTP: both read as protected and validate said nothing."""
    from fleetserve.spec.effects import inert_settings

    keys = "apiKeys: [{tenant: a, keySha256: '" + "a" * 64 + "'}]"
    files = "certFile: c.pem, keyFile: k.pem"
    on = load_spec_text(GOOD.replace("  routing: {strategy: roundrobin}", f"  auth: {{{keys}}}\n  tls: {{{files}}}"))
    assert on.endpoint.spec.auth.enabled and on.endpoint.spec.tls.enabled
    assert not [n for n in inert_settings(on.endpoint) if n.path in ("spec.auth.enabled", "spec.tls.enabled")]
    off = load_spec_text(GOOD.replace("  routing: {strategy: roundrobin}", f"  auth: {{enabled: false, {keys}}}\n"
                                      f"  tls: {{enabled: false, {files}}}"))
    assert not off.endpoint.spec.auth.enabled and not off.endpoint.spec.tls.enabled
    notes = {n.path: n.message for n in inert_settings(off.endpoint)}
    assert "the 1 apiKeys listed are not checked" in notes["spec.auth.enabled"]
    assert "serves plain HTTP" in notes["spec.tls.enabled"]
    assert not load_spec_text(GOOD).endpoint.spec.auth.enabled  # nothing listed: off, as before


def test_a_router_on_every_interface_without_keys_is_warned():
    from fleetserve.spec.effects import inert_settings

    def notes(router: str, auth: str = "") -> dict:
        text = GOOD.replace("  routing: {strategy: roundrobin}", f"  router: {router}" + auth)
        return {n.path: n.message for n in inert_settings(load_spec_text(text).endpoint)}

    assert "anyone who reaches it is served" in notes("{host: 0.0.0.0}")["spec.router.host"]
    assert "spec.router.host" not in notes("{host: 127.0.0.1}") and "spec.router.host" not in notes("{host: '::1'}")
    keyed = "\n  auth: {apiKeys: [{tenant: a, keySha256: '" + "a" * 64 + "'}]}"
    assert "spec.router.host" not in notes("{host: 0.0.0.0}", keyed)


def test_a_tenant_named_like_requests_without_one_is_refused():
    auth = "  auth: {apiKeys: [{tenant: '-', keyEnv: K}]}"
    (msg,) = problems(GOOD.replace("  routing: {strategy: roundrobin}", auth))
    assert msg.startswith("spec.auth.apiKeys[0].tenant") and "names requests without a tenant" in msg, msg


def test_an_l2_url_without_enabled_turns_l2_on_and_an_explicit_off_is_warned():
    """`l2: {url: ...}` without `enabled` left L2 off without a word (found in a black-box pass)."""
    from fleetserve.spec.effects import inert_settings

    on = load_spec_text(GOOD + "  kvCache: {l2: {url: 'redis://r.x:6379/0'}}\n").endpoint
    assert on.spec.kv_cache.l2.enabled
    off = load_spec_text(GOOD + "  kvCache: {l2: {enabled: false, url: 'redis://r.x:6379/0'}}\n").endpoint
    notes = {n.path: n.message for n in inert_settings(off)}
    assert not off.spec.kv_cache.l2.enabled
    assert "the L2 Redis URLs given are not used" in notes["spec.kvCache.l2.enabled"]

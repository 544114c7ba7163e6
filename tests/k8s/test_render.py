"""`render`: every example renders and validates; the mapping is 1:1 with the live policy objects."""

from __future__ import annotations

import base64
import copy
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from fleetserve.autoscale.policy import ScalingPolicy
from fleetserve.k8s.context import RenderOptions
from fleetserve.k8s.render import render, write
from fleetserve.spec.load import load_spec, load_spec_data
from tests.k8s.validate import validate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

FULL = {
    "apiVersion": "fleetserve.io/v1", "kind": "Endpoint",
    "metadata": {"name": "chat", "namespace": "team-b", "labels": {"team": "b"}},
    "spec": {
        "model": {"name": "llama", "source": "hf:meta-llama/Llama-3.1-8B-Instruct", "contextLength": 8192},
        "engine": {"kind": "vllm", "gpus": 1},
        "replicas": 1,
        "placement": {"instanceTypes": ["ml.g5.2xlarge", "ml.g6e.xlarge"]},
        "routing": {"strategy": "session", "sessionKey": "user"},
        "router": {"workers": 2},
        "requestLimits": {"maxConcurrentRequests": 8, "maxQueueSize": 16},
        "tls": {"enabled": True},
        "auth": {"enabled": True, "apiKeys": [{"tenant": "alpha", "keySha256": "a" * 64}]},
        "kvCache": {"l2": {"enabled": True, "maxBytes": 1 << 30}},
        "autoscaling": {
            "minReplicaCount": 0, "maxReplicaCount": 6, "pollingInterval": 15, "cooldownPeriod": 600,
            "initialCooldownPeriod": 120, "scaleUpStabilizationTime": 30, "scaleDownStabilizationTime": 240,
            "triggers": [{"metric": "concurrency", "target": 4, "activationTarget": 1},
                         {"metric": "prometheus", "target": 10, "query": "sum(x)",
                          "serverAddress": "http://prom:9090"}],
            "schedules": [{"name": "day", "timezone": "Europe/Berlin", "start": "0 9 * * 1-5",
                           "end": "0 18 * * 1-5", "minReplicas": 2}],
            "scheduleLeadTime": 300,
            "fallback": {"failureThreshold": 4, "replicas": 2},
        },
        "capacity": {"capacityTypes": ["spot", "on-demand"], "consolidation": {
            "policy": "WhenEmpty", "consolidateAfter": 120,
            "budgets": [{"nodes": "10%"}, {"nodes": "0", "schedule": "0 9 * * 1-5", "durationSeconds": 32400,
                                           "timezone": "UTC"}]}},
    },
}

BUILTIN_TENANTS = {
    "apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "iso"},
    "spec": {"model": {"source": "/fsx/models/small"}, "auth": {"enabled": True, "apiKeys": [
        {"tenant": "alpha", "keyEnv": "KEY_A"}]},
        "kvCache": {"l2": {"enabled": True, "tenantUrls": {"alpha": "redis://redis-alpha:6379/0",
                                                            "beta": "redis://redis.example.com:6379/1"}}}},
}


def _objects(doc_or_path):
    loaded = load_spec(doc_or_path) if isinstance(doc_or_path, Path) else load_spec_data(copy.deepcopy(doc_or_path))
    return render(loaded.endpoint), loaded


def _by(rendered, kind, name=None):
    found = [o for o in rendered.objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert found, f"no {kind} {name or ''}"
    return found


@pytest.mark.parametrize("spec", EXAMPLES + [FULL, BUILTIN_TENANTS], ids=lambda s: getattr(s, "name", None) or
                         s["metadata"]["name"])
def test_every_object_validates(spec):
    rendered, _ = _objects(spec)
    assert rendered.objects
    problems = {f"{o['kind']}/{o['metadata']['name']}": validate(o) for o in rendered.objects}
    assert {k: v for k, v in problems.items() if v} == {}


def test_validator_catches_unknown_and_bad_fields():
    rendered, _ = _objects(FULL)
    so = copy.deepcopy(_by(rendered, "ScaledObject", "chat-engine-t0")[0])
    so["spec"]["maxReplicas"] = 3
    assert any("maxReplicas" in p for p in validate(so))
    dep = copy.deepcopy(_by(rendered, "Deployment", "chat-router")[0])
    dep["spec"]["template"]["spec"]["containers"][0]["bogus"] = 1
    assert validate(dep)


def test_two_renders_are_byte_identical(tmp_path):
    a, _ = _objects(FULL)
    b, _ = _objects(FULL)
    assert a.files() == b.files()
    write(a, tmp_path / "a")
    write(b, tmp_path / "b")
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for n in names:
        assert (tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes()
        assert len(list(yaml.safe_load_all((tmp_path / "a" / n).read_text()))) == 1


def test_scaled_object_equals_the_live_policy():
    rendered, loaded = _objects(FULL)
    policy = ScalingPolicy.from_spec(loaded.endpoint.spec.autoscaling)
    so = _by(rendered, "ScaledObject", "chat-engine-t0")[0]["spec"]
    assert so["scaleTargetRef"]["name"] == "chat-engine-t0"
    table = {
        "minReplicaCount": policy.min_replicas, "maxReplicaCount": policy.max_replicas,
        "pollingInterval": policy.polling_interval, "cooldownPeriod": policy.cooldown,
        "initialCooldownPeriod": policy.initial_cooldown,
    }
    assert {k: so[k] for k in table} == table == {"minReplicaCount": 0, "maxReplicaCount": 6, "pollingInterval": 15,
                                                  "cooldownPeriod": 600, "initialCooldownPeriod": 120}
    behavior = so["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 30
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 240
    assert behavior["scaleUp"]["policies"] == [{"type": "Percent", "value": 100, "periodSeconds": 15},
                                               {"type": "Pods", "value": 4, "periodSeconds": 15}]
    assert behavior["scaleDown"]["policies"] == [{"type": "Percent", "value": 100, "periodSeconds": 15}]
    assert so["fallback"] == {"failureThreshold": 4, "replicas": 2}
    trig = {t["name"]: t for t in so["triggers"]}
    conc = trig["t0-concurrency"]
    assert conc["metricType"] == "AverageValue"
    assert conc["metadata"]["threshold"] == "4" and conc["metadata"]["activationThreshold"] == "1"
    assert "fleetserve_router_backend_in_flight" in conc["metadata"]["query"]
    prom = trig["t1-prometheus"]["metadata"]
    assert (prom["query"], prom["serverAddress"], prom["threshold"]) == ("sum(x)", "http://prom:9090", "10")
    # at zero replicas the router's held requests activate the engines
    pending = trig["activation-pending"]["metadata"]
    assert "fleetserve_router_pending_requests" in pending["query"] and pending["activationThreshold"] == "0"
    # ... and asks for one replica at most (the routers hold bufferSize each): the triggers size the fleet, as
    # locally; it had been the first trigger's target, or 1 (N held requests woke N replicas with ttft_p95 alone)
    assert pending["threshold"] == str(256 * FULL["spec"]["router"].get("workers", 1) * RenderOptions().router_replicas)
    workers = copy.deepcopy(FULL)
    workers["spec"]["router"] = {**workers["spec"].get("router", {}), "workers": 4, "bufferSize": 100}
    so = _by(_objects(workers)[0], "ScaledObject")[0]
    (held,) = [t["metadata"] for t in so["spec"]["triggers"] if t["name"] == "activation-pending"]
    assert held["threshold"] == str(100 * 4 * RenderOptions().router_replicas)  # every worker's buffer
    # requests routed in the window are activity, as locally (one short request every few seconds had the fleet go
    # to zero and cold-start over and over): a trigger that is active then, and never asks for a second replica
    routed = trig["activity-routed"]
    assert "increase(fleetserve_router_requests_routed_total{" in routed["metadata"]["query"]
    assert routed["metadata"]["activationThreshold"] == "0" and routed["metricType"] == "AverageValue"
    assert float(routed["metadata"]["threshold"]) >= 1e9
    cron = trig["floor-day"]["metadata"]
    assert cron == {"timezone": "Europe/Berlin", "start": "55 8 * * 1-5", "end": "0 18 * * 1-5",
                    "desiredReplicas": "2"}


def test_autoscaling_example_cron_in_its_time_zone():
    rendered, _ = _objects(ROOT / "examples" / "autoscaling.yaml")
    so = _by(rendered, "ScaledObject")[0]["spec"]
    trigger = next(t for t in so["triggers"] if t["type"] == "cron")
    cron = trigger["metadata"]
    assert cron["timezone"] == "Asia/Seoul" and cron["start"] == "55 8 * * 1-5" and cron["desiredReplicas"] == "2"
    assert trigger["metricType"] == "AverageValue"  # KEDA < 2.17 refuses a fallback beside an empty metricType
    ttft = next(t for t in so["triggers"] if t["name"] == "t1-ttft-p95")
    assert ttft["metricType"] == "Value"


def test_nodepools_follow_the_priority_list():
    rendered, _ = _objects(ROOT / "examples" / "simulated-cloud.yaml")
    pools = _by(rendered, "NodePool")
    order = [p["spec"]["template"]["spec"]["requirements"][0]["values"] for p in
             sorted(pools, key=lambda p: -p["spec"]["weight"])]
    assert order == [["g5.xlarge"], ["g6e.xlarge"], ["g5.2xlarge"]]
    weights = [p["spec"]["weight"] for p in sorted(pools, key=lambda p: p["metadata"]["name"])]
    assert weights == sorted(weights, reverse=True) and len(set(weights)) == 3
    caps = pools[0]["spec"]["template"]["spec"]["requirements"][1]
    assert caps == {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand", "spot"]}
    d = pools[0]["spec"]["disruption"]
    assert d == {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "1m",
                 "budgets": [{"nodes": "10%"}]}
    # one engine Deployment per tier, pinned to the tier's type; later tiers start at zero
    deps = {d["metadata"]["name"]: d for d in _by(rendered, "Deployment")}
    t1 = deps["priority-demo-engine-t1"]
    assert t1["spec"]["replicas"] == 0
    term = t1["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert term["values"] == ["g6e.xlarge"]
    assert deps["priority-demo-engine-t0"]["spec"]["replicas"] == 2


def test_budget_schedule_and_capacity_from_consolidation_policy():
    rendered, _ = _objects(FULL)
    pool = _by(rendered, "NodePool")[0]["spec"]
    assert pool["disruption"]["consolidationPolicy"] == "WhenEmpty"
    assert pool["disruption"]["consolidateAfter"] == "2m"
    assert pool["disruption"]["budgets"][1] == {"nodes": "0", "schedule": "0 9 * * 1-5", "duration": "9h"}
    assert pool["limits"] == {"nvidia.com/gpu": "7"}  # 6 replicas of 1 GPU, and the rollout's surge pod
    assert pool["template"]["spec"]["nodeClassRef"]["kind"] == "EC2NodeClass"


def test_a_rollout_at_the_maximum_has_room_for_its_surge_pod():
    """maxSurge 1 and a GPU limit of exactly max x GPUs: an image change at full size needed one more node than
    the limit allowed, and the rollout never finished."""
    rendered, _ = _objects(FULL)
    engine = next(d for d in _by(rendered, "Deployment")
                  if d["metadata"]["labels"]["app.kubernetes.io/component"] == "engine")["spec"]
    surge = engine["strategy"]["rollingUpdate"]["maxSurge"]
    most = FULL["spec"]["autoscaling"]["maxReplicaCount"]
    assert int(_by(rendered, "NodePool")[0]["spec"]["limits"]["nvidia.com/gpu"]) == (most + surge) * 1


def test_engine_pods_launch_nodes_from_their_own_endpoints_node_pools_only():
    """Every endpoint's NodePool labelled its nodes, but no pod asked for the label: another endpoint's pods
    could launch nodes from this pool and spend its GPU limit."""
    rendered, _ = _objects(FULL)
    pools = {p["spec"]["template"]["metadata"]["labels"]["fleetserve.io/endpoint"] for p in _by(rendered, "NodePool")}
    assert len(pools) == 1
    for dep in _by(rendered, "Deployment"):
        if dep["metadata"]["labels"]["app.kubernetes.io/component"] != "engine":
            continue
        terms = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        for term in terms:
            assert {"key": "fleetserve.io/endpoint", "operator": "In", "values": sorted(pools)} in \
                term["matchExpressions"]


def test_the_gpu_limit_admits_a_node_larger_than_one_replica():
    """Karpenter counts a node's whole capacity against the pool's limit: four 1-GPU replicas on p5.48xlarge
    (8 GPUs) need a limit of 8, or the type is never launched (the limit was 4, and `plan` chose that type)."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["placement"] = {"instanceTypes": ["p5.48xlarge"]}
    doc["spec"]["capacity"] = {**doc["spec"].get("capacity", {}), "allowLargerInstances": True}
    doc["spec"]["autoscaling"]["maxReplicaCount"] = 4
    pool = _by(_objects(doc)[0], "NodePool")[0]["spec"]
    assert pool["limits"] == {"nvidia.com/gpu": "8"}
    doc["spec"]["autoscaling"]["maxReplicaCount"] = 12  # two nodes at most: 16, and not 12
    assert _by(_objects(doc)[0], "NodePool")[0]["spec"]["limits"] == {"nvidia.com/gpu": "16"}
    # packed as the simulator packs, cpu and memory too: pods of 16 cpu / 40 GiB fit fewer than four on a 4-GPU
    # g5.12xlarge, so 4 replicas need 2 nodes (8 GPUs), and a limit of 4 left two of them pending for ever
    doc["spec"]["placement"] = {"instanceTypes": ["g5.12xlarge"]}
    doc["spec"]["autoscaling"]["maxReplicaCount"] = 4
    doc["spec"]["engine"]["resources"] = {"requests": {"cpu": "16", "memory": "40Gi"}}
    from fleetserve.capacity.catalog import Catalog
    from fleetserve.capacity.placement import replica_request, replicas_per_node

    endpoint = load_spec_data(copy.deepcopy(doc)).endpoint
    per_node = replicas_per_node(Catalog.builtin().get("g5.12xlarge"),
                                 replica_request(endpoint.spec.engine, endpoint.spec.model, endpoint.spec.kv_cache))
    assert per_node < 4
    gpus = -(-(4 + 1) // per_node) * 4  # the rollout's surge pod too
    assert _by(_objects(doc)[0], "NodePool")[0]["spec"]["limits"] == {"nvidia.com/gpu": str(gpus)}


def test_vllm_engine_uses_the_adapter_and_rendered_redis():
    rendered, _ = _objects(FULL)
    dep = _by(rendered, "Deployment", "chat-engine-t0")[0]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["vllm"] and c["args"][:2] == ["serve", "/models/current"]
    assert "--served-model-name" in c["args"] and c["args"][c["args"].index("--served-model-name") + 1] == "llama"
    env = {e["name"]: e for e in c["env"]}
    assert env["LMCACHE_REMOTE_URL"]["value"].startswith("redis://:$(REDIS_PASSWORD)@chat-redis.team-b.svc")
    names = [e["name"] for e in c["env"]]
    assert names.index("REDIS_PASSWORD") < names.index("LMCACHE_REMOTE_URL")
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 600
    # the rollout may take the model load and a new node, an image pull and the fetch before it: Kubernetes'
    # default 600 s deadline failed the Endpoint (ProgressDeadlineExceeded) on a slow but healthy start
    assert dep["spec"]["progressDeadlineSeconds"] >= 600 + 600
    slow = copy.deepcopy(FULL)
    slow["spec"]["engine"]["startupTimeoutSeconds"] = 1800
    slow_dep = _by(_objects(slow)[0], "Deployment", "chat-engine-t0")[0]
    assert slow_dep["spec"]["progressDeadlineSeconds"] > 1800
    assert dep["spec"]["template"]["spec"]["initContainers"][0]["args"][:2] == [
        "fetch", "hf:meta-llama/Llama-3.1-8B-Instruct"]
    redis = _by(rendered, "StatefulSet", "chat-redis")[0]["spec"]["template"]["spec"]["containers"][0]
    assert ["--maxmemory", str(1 << 30)] == redis["args"][6:8] and "allkeys-lru" in redis["args"]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_gpu_engines_require_the_internal_token_and_tenants_reach_them_as_cache_salt(kind):
    """Inside a cluster only the router may call a vLLM or SGLang pod (it sends the internal token as a bearer
    token, the engine's API key); tenants, which these engines do not hear, are salted into each request."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["engine"]["kind"] = kind
    rendered, _ = _objects(doc)
    c = _by(rendered, "Deployment", "chat-engine-t0")[0]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    token_env = "VLLM_API_KEY" if kind == "vllm" else "FLEETSERVE_ENGINE_TOKEN"
    # their own key, not the internal token: SGLang prints its arguments in its log
    assert env[token_env]["valueFrom"] == {"secretKeyRef": {"name": "chat-internal", "key": "engine-token"}}
    assert all(e.get("valueFrom", {}).get("secretKeyRef", {}).get("key") != "token" for e in c["env"])
    if kind == "sglang":
        assert c["args"][c["args"].index("--api-key") + 1] == "$(FLEETSERVE_ENGINE_TOKEN)"
        # SGLang has no Redis L2 here: no Redis rendered for nothing, and the spec's l2 is named
        assert not [o for o in rendered.objects if o["kind"] == "StatefulSet"] and "REDIS_PASSWORD" not in env
        assert any(w.path == "spec.kvCache.l2" for w in rendered.warnings)
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"  # left open by both engines' API-key checks
    # SGLang's /health generates a token behind the running batch, waiting up to 20 s: no 3 s probe for it
    assert c["readinessProbe"]["timeoutSeconds"] == (25 if kind == "sglang" else 3)
    assert c["livenessProbe"]["timeoutSeconds"] == (25 if kind == "sglang" else 5)
    router = _by(rendered, "Deployment", "chat-router")[0]["spec"]["template"]["spec"]
    args = router["containers"][0]["args"]
    assert "--tenant-cache-salt" in args and "--no-send-internal-token" not in args
    assert args[args.index("--engine-token-file") + 1] == "/var/run/fleetserve/internal/engine-token"
    items = next(v for v in router["volumes"] if v["name"] == "internal-token")["secret"]["items"]
    assert {"key": "engine-token", "path": "engine-token"} in items
    monitors = {o["metadata"]["name"]: o for o in rendered.objects if o["kind"] == "ServiceMonitor"}
    keys = {name: m["spec"]["endpoints"][0]["authorization"]["credentials"]["key"] for name, m in monitors.items()}
    assert keys == {"chat-router": "token", "chat-engine": "engine-token"}


def test_an_api_key_of_the_users_own_on_a_gpu_engine_is_named():
    doc = copy.deepcopy(FULL)
    doc["spec"]["engine"]["args"] = ["--api-key=mine"]
    rendered, _ = _objects(doc)
    assert any(w.path == "spec.engine.args" and "401" in w.message for w in rendered.warnings)


def test_external_engines_never_get_the_internal_token():
    doc = copy.deepcopy(FULL)
    doc["spec"]["engine"] = {"kind": "external", "urls": ["https://llm.example.com"]}
    rendered, _ = _objects(doc)
    args = _by(rendered, "Deployment", "chat-router")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-send-internal-token" in args and "--tenant-cache-salt" not in args


def test_router_flags_secrets_and_pdb():
    rendered, _ = _objects(FULL)
    c = _by(rendered, "Deployment", "chat-router")[0]["spec"]["template"]["spec"]["containers"][0]
    args = c["args"]
    for flag, value in (("--strategy", "session"), ("--session-key", "user"), ("--max-concurrent-per-replica", "8"),
                        ("--workers", "2"),
                        ("--max-queue", "16"), ("--auth-file", "/etc/fleetserve/auth/auth.json"),
                        ("--tls-cert", "/etc/fleetserve/tls/tls.crt"),
                        ("--internal-token-file", "/var/run/fleetserve/internal/token")):
        assert args[args.index(flag) + 1] == value
    assert c["resources"] == {"requests": {"cpu": "2", "memory": "512Mi"}}  # router.workers: 2
    one = _by(_objects(BUILTIN_TENANTS)[0], "Deployment", "iso-router")[0]["spec"]["template"]["spec"]["containers"]
    assert one[0]["resources"] == {"requests": {"cpu": "500m", "memory": "256Mi"}}  # it had none: BestEffort
    secret = _by(rendered, "Secret", "chat-api-keys")[0]
    assert ("a" * 64) in base64.b64decode(secret["data"]["auth.json"]).decode()
    assert _by(rendered, "PodDisruptionBudget", "chat-router")
    # the probes ask the router of itself: /health is 503 at zero replicas, which took the routers out of the
    # Service (no request reached the buffer that wakes the fleet) and restarted them every 30 s
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["livenessProbe"]["httpGet"]["path"] == "/livez"


def test_engine_pods_of_each_tier_are_evicted_one_at_a_time():
    """No budget covered the engines: Karpenter's consolidation or a drain could take every replica at once. One
    budget over every tier then blocked every eviction while a tier-0 pod stayed Pending in a shortage (the
    disruption controller expects every replica the Deployments ask for): one budget per tier."""
    rendered, _ = _objects(FULL)  # two instance types: two tiers
    tiers = [d for d in _by(rendered, "Deployment") if d["metadata"]["name"].startswith("chat-engine")]
    pdbs = _by(rendered, "PodDisruptionBudget")
    assert len(tiers) == 2
    everyone = [d["spec"]["template"]["metadata"]["labels"] for d in _by(rendered, "Deployment")]
    for d in tiers:
        (pdb,) = [p for p in pdbs if p["metadata"]["name"] == d["metadata"]["name"]]
        assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        selector = pdb["spec"]["selector"]["matchLabels"]
        chosen = [labels for labels in everyone if selector.items() <= labels.items()]
        assert chosen == [d["spec"]["template"]["metadata"]["labels"]], (selector, chosen)
    one, _ = _objects(EXAMPLES[0])
    assert [p["metadata"]["name"] for p in _by(one, "PodDisruptionBudget") if "engine" in p["metadata"]["name"]] \
        == [d["metadata"]["name"] for d in _by(one, "Deployment") if "engine" in d["metadata"]["name"]]


def test_tenant_redis_is_rendered_for_the_built_in_engine_only():
    """For vLLM the warning said engines share the one L2, and a 4 GiB tenant StatefulSet was rendered all the same,
    its password Secret wired into the engine pods (which waited for it)."""
    vllm = copy.deepcopy(BUILTIN_TENANTS)
    vllm["spec"].update(model={"source": "hf:meta-llama/Llama-3.1-8B-Instruct"}, engine={"kind": "vllm", "gpus": 1})
    rendered, _ = _objects(vllm)
    names = {o["metadata"]["name"] for o in _by(rendered, "StatefulSet")}
    assert not any("alpha" in n for n in names), names
    env = [e["name"] for d in _by(rendered, "Deployment") if "engine" in d["metadata"]["name"]
           for c in d["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])]
    assert not any("REDIS_ALPHA" in n for n in env), env
    assert any("the tenants' Redis are not rendered" in str(w) for w in rendered.warnings)
    builtin, _ = _objects(BUILTIN_TENANTS)
    assert any("alpha" in o["metadata"]["name"] for o in _by(builtin, "StatefulSet"))


def test_builtin_engine_pvc_model_and_tenant_redis():
    rendered, _ = _objects(BUILTIN_TENANTS)
    dep = _by(rendered, "Deployment", "iso-engine")[0]["spec"]["template"]["spec"]
    c = dep["containers"][0]
    assert c["args"][c["args"].index("--model") + 1] == "/fsx/models/small"
    assert dep["volumes"][0]["persistentVolumeClaim"] == {"claimName": "iso-model", "readOnly": True}
    # in the environment, after the password it expands: as arguments the kubelet's expansion put the Redis
    # password on the engine's command line (`ps` on the node)
    assert "--l2-tenant" not in c["args"] and "--l2-url" not in c["args"]
    env = [e["name"] for e in c["env"]]
    value = {e["name"]: e.get("value") for e in c["env"]}
    assert value["FLEETSERVE_L2_TENANTS"] == (
        "alpha=redis://:$(REDIS_PASSWORD_REDIS_ALPHA)@redis-alpha.default.svc.cluster.local:6379/0 "
        "beta=redis://redis.example.com:6379/1")
    assert env.index("REDIS_PASSWORD_REDIS_ALPHA") < env.index("FLEETSERVE_L2_TENANTS")
    assert "$(REDIS_PASSWORD)" in value["FLEETSERVE_L2_URL"] and env.index("REDIS_PASSWORD") < env.index(
        "FLEETSERVE_L2_URL")
    assert _by(rendered, "StatefulSet", "redis-alpha") and _by(rendered, "StatefulSet", "iso-redis")
    assert "--internal-token-file" in c["args"]
    # the engine takes what the router forwards: its own additions (cache_salt, include_usage) included
    router = _by(rendered, "Deployment", "iso-router")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    limit = int(router[router.index("--max-body-bytes") + 1])
    assert int(c["args"][c["args"].index("--max-body-bytes") + 1]) == 2 * limit
    headers = int(router[router.index("--max-header-bytes") + 1])
    assert int(c["args"][c["args"].index("--max-header-bytes") + 1]) == 2 * headers


def test_hyperpod_spec_renders():
    rendered, loaded = _objects(ROOT / "examples" / "hyperpod.yaml")
    assert loaded.source_format == "hyperpod"
    kinds = {o["kind"] for o in rendered.objects}
    assert {"Deployment", "Service", "ScaledObject", "NodePool"} <= kinds
    pool = _by(rendered, "NodePool")[0]
    assert pool["spec"]["template"]["spec"]["requirements"][0]["values"] == ["g5.8xlarge"]
    so = _by(rendered, "ScaledObject")[0]["spec"]
    assert (so["minReplicaCount"], so["maxReplicaCount"]) == (1, 4)
    prom = so["triggers"][0]["metadata"]
    assert prom["threshold"] == "8" and prom["activationThreshold"] == "1"


def test_labels_follow_conventions():
    rendered, _ = _objects(FULL)
    for o in rendered.objects:
        labels = o["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "fleetserve"
        assert labels["app.kubernetes.io/instance"] == "chat"
        assert labels["app.kubernetes.io/managed-by"] == "fleetserve"
        assert labels["team"] == "b"
        assert len(o["metadata"]["name"]) <= 63


def test_the_router_sees_every_engine_pod_through_a_headless_service():
    """Cache-aware routing needs the replicas apart: the router resolves the headless Service's pod IPs."""
    rendered, _ = _objects(FULL)
    headless = _by(rendered, "Service", "chat-engine-pods")[0]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is False
    engine = _by(rendered, "Service", "chat-engine")[0]
    assert headless["spec"]["selector"] == engine["spec"]["selector"]
    args = _by(rendered, "Deployment", "chat-router")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--backend-dns") + 1].startswith("chat-engine-pods.team-b.svc.cluster.local:")
    assert "--backend" not in args


def test_render_findings_of_a_black_box_pass(tmp_path):
    """Each of these rendered a broken or incomplete fleet, or lost a user's files."""
    import subprocess

    # a zone-only nodeAffinity used to rule out every instance type: no engine Deployment at all
    zone = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "zone"},
            "spec": {"model": {"source": "builtin:smollm2-135m"}, "placement": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2a"]}]}]}}}}}
    rendered, _ = _objects(zone)
    assert _by(rendered, "Deployment", "zone-engine")
    pool = _by(rendered, "NodePool")[0]["spec"]["template"]["spec"]["requirements"]
    assert {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2a"]} in pool

    # HyperPod's worker.args name the model positionally, as `vllm serve MODEL` wants; the adapter names it too
    rendered, loaded = _objects(ROOT / "examples" / "hyperpod.yaml")
    engine = next(d for d in _by(rendered, "Deployment") if d["metadata"]["name"].endswith("engine"))
    args = engine["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "serve" and not [a for a in args[2:] if a.startswith("/opt/ml/model")], args
    assert any(w.path == "spec.worker.args" for w in loaded.warnings)

    # a HyperPod trigger without serverAddress asks the Prometheus given to render, not 127.0.0.1
    hp = yaml.safe_load((ROOT / "examples" / "hyperpod.yaml").read_text())
    hp["spec"]["autoScalingSpec"]["prometheusTrigger"].pop("serverAddress")
    hp["spec"]["modelName"] = 'Llama"3 (8B)'  # HyperPod allows it; it lands in PromQL strings
    spec = tmp_path / "hp.yaml"
    spec.write_text(yaml.safe_dump(hp))
    from fleetserve.k8s.context import RenderOptions

    rendered = render(load_spec(spec).endpoint, RenderOptions(prometheus_url="http://prom.monitoring:9090"))
    servers = {t["metadata"]["serverAddress"] for o in _by(rendered, "ScaledObject") for t in o["spec"]["triggers"]
               if t["type"] == "prometheus"}
    assert servers == {"http://prom.monitoring:9090"}
    rules = _by(rendered, "PrometheusRule")[0]["spec"]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    check = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr

    # render -o removed every NN-*.yaml in the folder, a user's own and another endpoint's included
    out = tmp_path / "manifests"
    out.mkdir()
    (out / "00-namespace.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: team}\n")
    first = _objects(EXAMPLES[0])[0]
    write(first, out)
    stale = out / "08-service-chat-old.yaml"  # what an earlier render of FULL wrote and no longer wants
    stale.write_text(yaml.safe_dump({"kind": "Service", "metadata": {"name": "chat-old", "namespace": "team-b",
                                     "labels": {"app.kubernetes.io/managed-by": "fleetserve",
                                                "app.kubernetes.io/instance": "chat"}}}))
    removed: list[dict] = []
    write(_objects(FULL)[0], out, removed)
    names = {p.name for p in out.iterdir()}
    assert "00-namespace.yaml" in names and set(first.files()) <= names and not stale.exists()
    # and said: `kubectl apply` of the folder leaves the object running
    from fleetserve.k8s.render import delete_commands

    assert delete_commands(removed) == ["kubectl -n team-b delete service chat-old"]
    assert delete_commands([{"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p"}}]) == [
        "kubectl delete nodepool.karpenter.sh p"]


def test_user_env_keeps_its_order_and_never_duplicates_ours():
    doc = copy.deepcopy(FULL)
    doc["spec"]["engine"]["env"] = {"Z_BASE": "/data", "A_PATH": "$(Z_BASE)/x", "POD_NAME": "mine"}
    doc["spec"]["engine"]["envFrom"] = {"API_TOKEN": {"secretKeyRef": {"name": "api", "key": "token"}}}
    rendered, _ = _objects(doc)
    names = [e["name"] for e in _by(rendered, "Deployment", "chat-engine-t0")[0]["spec"]["template"]["spec"][
        "containers"][0]["env"]]
    assert names.count("POD_NAME") == 1 and names.index("API_TOKEN") < names.index("Z_BASE") < names.index("A_PATH")
    assert any(w.path == "spec.engine.env" and "POD_NAME" in w.message for w in rendered.warnings)


def test_an_l2_url_of_this_machine_is_named_before_it_reaches_a_pod():
    """`unix:///run/redis.sock` or `redis://127.0.0.1` rendered into pods without a word: in a pod it is the pod
    itself, and no engine ever reached its L2 (found in review)."""
    doc = copy.deepcopy(BUILTIN_TENANTS)  # the built-in engine: vLLM's L2 refuses a socket already
    doc["spec"]["kvCache"]["l2"]["url"] = "unix:///run/redis.sock?db=0"
    doc["spec"]["kvCache"]["l2"]["tenantUrls"]["beta"] = "redis://127.0.0.1:6379/1"
    said = {w.path: w.message for w in _objects(doc)[0].warnings}
    assert "names this machine" in said["spec.kvCache.l2.url"]
    assert "names this machine" in said["spec.kvCache.l2.tenantUrls.beta"]
    doc = copy.deepcopy(FULL)
    doc["spec"]["kvCache"]["l2"]["url"] = "redis://:pw@localhost:6379/0"
    said = [w.message for w in _objects(doc)[0].warnings if w.path == "spec.kvCache.l2.url"]
    assert any(m.startswith("'redis://localhost:6379/0' names this machine") for m in said), said  # no password
    doc["spec"]["kvCache"]["l2"]["url"] = "redis://redis.cache.svc:6379/0"
    assert not [w for w in _objects(doc)[0].warnings if "names this machine" in w.message]


def test_credentials_written_in_the_spec_are_named_before_they_reach_the_manifests():
    doc = copy.deepcopy(FULL)
    doc["spec"]["kvCache"]["l2"]["url"] = "redis://:s3cret@redis.example.com:6379/0"
    doc["spec"]["autoscaling"]["triggers"][1]["customHeaders"] = "Authorization=Bearer abc"
    rendered, _ = _objects(doc)
    named = {w.path for w in rendered.warnings if "plain text" in w.message}
    assert named == {"spec.kvCache.l2.url", "spec.autoscaling.triggers[1].customHeaders"}
    assert not [w for w in _objects(FULL)[0].warnings if "plain text" in w.message]


def test_long_names_give_valid_nodepool_labels_and_tenants_never_share_a_password_variable():
    doc = copy.deepcopy(BUILTIN_TENANTS)
    doc["metadata"] = {"name": "a" * 40, "namespace": "n" * 40}
    doc["spec"]["placement"] = {"instanceTypes": ["g5.xlarge"]}
    doc["spec"]["kvCache"]["l2"]["tenantUrls"] = {"a-b": "redis://redis-ab:6379/0", "a.b": "redis://redis-a-b:6379/0"}
    rendered, _ = _objects(doc)
    labels = _by(rendered, "NodePool")[0]["spec"]["template"]["metadata"]["labels"]
    assert all(len(v) <= 63 for v in labels.values()), labels
    env = [e["name"] for e in _by(rendered, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert len([n for n in env if n.startswith("REDIS_PASSWORD_")]) == 2 and len(env) == len(set(env))


def test_no_rendered_redis_selects_another_ones_pods():
    """The shared Redis's Service and StatefulSet selected name/instance/component only, which every tenant's Redis
    pod carries too: about 2 of 3 shared-L2 connections reached a tenant's Redis."""
    rendered, _ = _objects(BUILTIN_TENANTS)
    pods = {s["metadata"]["name"]: s["spec"]["template"]["metadata"]["labels"] for s in _by(rendered, "StatefulSet")
            if s["metadata"]["labels"]["app.kubernetes.io/component"] == "redis"}
    assert len(pods) == 2  # iso-redis (shared) and redis-alpha (the tenant's)
    selectors = [(s["metadata"]["name"], s["spec"]["selector"]["matchLabels"]) for s in _by(rendered, "StatefulSet")
                 if s["metadata"]["name"] in pods]
    selectors += [(s["metadata"]["name"], s["spec"]["selector"]) for s in _by(rendered, "Service")
                  if s["metadata"]["name"] in pods]
    for owner, sel in selectors:
        chosen = [name for name, labels in pods.items() if sel.items() <= labels.items()]
        assert chosen == [owner], (owner, chosen)


def test_each_engine_pod_is_scraped_through_one_service():
    """The engine Service and the headless one for the router's DNS carry the same labels, and the engine
    ServiceMonitor selected both: every engine series was scraped twice, doubling any sum without a service filter."""
    rendered, _ = _objects(ROOT / "examples" / "hyperpod.yaml")
    monitor = next(m for m in _by(rendered, "ServiceMonitor") if m["metadata"]["labels"][
        "app.kubernetes.io/component"] == "engine")
    selector = monitor["spec"]["selector"]

    def selects(labels: dict) -> bool:
        if not selector["matchLabels"].items() <= labels.items():
            return False
        absent = [e["key"] for e in selector.get("matchExpressions", []) if e["operator"] == "DoesNotExist"]
        return all(key not in labels for key in absent)

    chosen = [s["metadata"]["name"] for s in _by(rendered, "Service") if selects(s["metadata"]["labels"])]
    assert len(chosen) == 1 and not chosen[0].endswith("-pods"), chosen


@pytest.mark.parametrize("kind, waiting", [("vllm", "vllm:num_requests_waiting"), ("sglang", "sglang:num_queue_reqs"),
                                           ("builtin", "vllm:num_requests_waiting")])
def test_queue_depth_reads_the_engines_own_waiting_gauge(kind, waiting):
    """SGLang exports sglang:num_queue_reqs; the query read vLLM's name, and `or vector(0)` hid that it read
    nothing: queue_depth scaling saw only the router's buffer."""
    from fleetserve.k8s.context import Context, RenderOptions
    from fleetserve.k8s.keda import builtin_query

    doc = copy.deepcopy(FULL)
    doc["spec"]["engine"]["kind"] = kind
    _, loaded = _objects(doc)
    query = builtin_query(Context.build(loaded.endpoint, RenderOptions()), "queue_depth")
    assert waiting in query and ("vllm:" not in query if kind == "sglang" else True)
    # and the requests the router queues for a slot, as /admin/load and the simulator count them
    assert "fleetserve_router_queued_requests" in query


def test_pods_require_every_key_of_the_specs_required_node_affinity():
    """A zone in the spec's required node affinity reached the NodePool only: the engine pods could be scheduled on
    any zone's nodes. Alternatives (several terms) stay alternatives, each with the tier's types."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["placement"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["g5.xlarge", "g6e.xlarge"]},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2a"]},
            {"key": "team", "operator": "Exists"}]}]}}}
    rendered, _ = _objects(doc)
    for dep in _by(rendered, "Deployment"):
        if dep["metadata"]["labels"]["app.kubernetes.io/component"] != "engine":
            continue
        terms = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        keys = [[e["key"] for e in t["matchExpressions"]] for t in terms]
        assert keys == [["node.kubernetes.io/instance-type", "karpenter.sh/capacity-type", "fleetserve.io/endpoint",
                         "topology.kubernetes.io/zone", "team"]], keys
    doc["spec"]["placement"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] = [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}]}]
    rendered, _ = _objects(doc)
    dep = _by(rendered, "Deployment", "chat-engine")[0]["spec"]["template"]["spec"]  # one tier: every GPU type
    terms = dep["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"][-1]["values"] for t in terms] == [["a"], ["b"]]


def test_a_hostname_rule_stays_on_the_pods_and_out_of_the_nodepool_karpenter_refuses_it_in():
    """kubernetes.io/hostname in the spec's required node affinity was copied into the NodePool's requirements,
    which Karpenter v1's CRD refuses ("label kubernetes.io/hostname is restricted"): the whole apply failed."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["placement"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["bad-node"]},
            {"key": "team", "operator": "Exists"}]}]}}}
    rendered, _ = _objects(doc)
    pools = _by(rendered, "NodePool")
    keys = [{r["key"] for r in p["spec"]["template"]["spec"]["requirements"]} for p in pools]
    assert keys and all("kubernetes.io/hostname" not in k and "team" in k for k in keys), keys
    engine = _by(rendered, "Deployment", "chat-engine")[0]["spec"]["template"]["spec"]
    terms = engine["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert "kubernetes.io/hostname" in {e["key"] for t in terms for e in t["matchExpressions"]}


def test_pods_pinned_to_named_nodes_take_the_affinity_as_given_and_no_nodepool_is_rendered():
    """HyperPod's own sample of a model on the nodes' local NVMe pins its pods by kubernetes.io/hostname: the pods
    also required fleetserve's NodePool label and capacity type, which that existing node never carries, and a
    NodePool of 15 GPU types was rendered for nodes Karpenter cannot launch. Pending for ever."""
    sample = ROOT / "tests" / "data" / "hyperpod" / "v1_nvme_k8s_volume.yaml"
    rendered, loaded = _objects(sample)
    assert not [o for o in rendered.objects if o["kind"] == "NodePool"]
    (engine,) = [d for d in _by(rendered, "Deployment") if d["metadata"]["name"].endswith("-engine")]
    given = yaml.safe_load(sample.read_text())["spec"]["nodeAffinity"]
    assert engine["spec"]["template"]["spec"]["affinity"] == {"nodeAffinity": given}
    said = [str(w) for w in rendered.warnings if w.path == "spec.placement.nodeAffinity"]
    assert len(said) == 1 and "by hostname" in said[0] and "no Karpenter NodePool" in said[0], said
    assert all(validate(o) == [] for o in rendered.objects), [validate(o) for o in rendered.objects]
    # preferred terms beside the pin make no tiers of their own: one Deployment, no overflow ScaledObject (each had
    # been a Deployment on the same named nodes)
    doc = yaml.safe_load(sample.read_text())
    doc["spec"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = [
        {"weight": w, "preference": {"matchExpressions": [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                                          "values": [t]}]}}
        for w, t in ((100, "ml.g5.12xlarge"), (50, "ml.g6e.12xlarge"))]
    rendered, _ = _objects(doc)
    engines = [d["metadata"]["name"] for d in _by(rendered, "Deployment") if "-engine" in d["metadata"]["name"]]
    assert engines == ["case1-3-k8s-volume-engine"], engines
    assert not [o for o in rendered.objects if o["kind"] in ("NodePool", "ScaledObject")]
    # a second term that names instance types, or a hostname NotIn, still leaves Karpenter nodes to launch
    doc = yaml.safe_load(sample.read_text())
    doc["spec"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"].append(
        {"matchExpressions": [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                               "values": ["ml.g5.12xlarge"]}]})
    assert _by(_objects(doc)[0], "NodePool")
    doc = yaml.safe_load(sample.read_text())
    doc["spec"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"][0]["operator"] = "NotIn"
    assert _by(_objects(doc)[0], "NodePool")


def test_hyperpods_model_metric_trigger_reads_series_the_router_exports_in_front_of_vllm():
    """HyperPod's example scales on sum(model_concurrent_requests{...}), which vLLM does not export (HyperPod's
    reverse-proxy sidecar does, per pod): it read 0 and never scaled past minReplicaCount (then render only
    warned). The router now counts model_* per replica with the endpoint's labels, so the trigger reads them."""
    rendered, loaded = _objects(ROOT / "examples" / "hyperpod.yaml")
    assert not any("model_*" in w.message and "not export" in w.message for w in rendered.warnings)
    router = _by(rendered, "Deployment")
    (args,) = [d["spec"]["template"]["spec"]["containers"][0]["args"] for d in router
               if d["metadata"]["name"].endswith("-router")]
    assert "--model-metrics" in args
    assert args[args.index("--served-model-name") + 1] == loaded.endpoint.served_model_name == "Llama-3.1-8B-Instruct"
    assert args[args.index("--namespace") + 1] == "ns-team-a" and args[args.index("--model-version") + 1] == "1.0"
    (so,) = _by(rendered, "ScaledObject")
    assert 'model_name="Llama-3.1-8B-Instruct"' in so["spec"]["triggers"][0]["metadata"]["query"]
    builtin, _ = _objects(BUILTIN_TENANTS)  # the built-in engine exports them itself: the router adds only the
    (bargs,) = [d["spec"]["template"]["spec"]["containers"][0]["args"] for d in _by(builtin, "Deployment")
                if d["metadata"]["name"].endswith("-router")]  # errors it produces (scope router)
    assert bargs[bargs.index("--model-metrics-scope") + 1] == "router"
    assert "--model-metrics-scope" not in args
    # at zero the router answers a body the built-in engines refuse (router/served.py); vLLM's checks are its own
    assert "--check-bodies" in bargs and "--check-bodies" not in args


def test_a_budget_that_falls_on_another_utc_day_is_shifted_with_its_weekdays_and_warned_once():
    """02:00 every day in Kolkata is 20:30 UTC every day: it was written unshifted ('used as UTC', 5.5 h off), and
    the warning came once per NodePool. 02:00 Monday-Friday there is 20:30 Sunday-Thursday UTC, 23:00 Saturday
    in Auckland (UTC+13 in January) is 10:00 Saturday UTC, and 22:00 Saturday in New York is 03:00 Sunday UTC;
    only a day of the month, which would move across month ends, stays a warning (once)."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["capacity"]["consolidation"]["budgets"] = [
        {"nodes": "1", "schedule": "0 2 * * *", "durationSeconds": 3600, "timezone": "Asia/Kolkata"},
        {"nodes": "0", "schedule": "0 2 * * 1-5", "durationSeconds": 3600, "timezone": "Asia/Kolkata"},
        {"nodes": "0", "schedule": "0 2 * * sun,sat", "durationSeconds": 3600, "timezone": "Asia/Kolkata"},
        {"nodes": "2", "schedule": "0 23 * * 6", "durationSeconds": 3600, "timezone": "Pacific/Auckland"},
        {"nodes": "1", "schedule": "0 22 * * sat", "durationSeconds": 3600, "timezone": "America/New_York"},
        {"nodes": "0", "schedule": "0 2 1 * *", "durationSeconds": 3600, "timezone": "Asia/Kolkata"}]
    rendered, _ = _objects(doc)
    pools = _by(rendered, "NodePool")
    assert len(pools) > 1
    for pool in pools:
        daily, weekdays, weekend, saturday, new_york, monthly = pool["spec"]["disruption"]["budgets"]
        assert daily["schedule"] == "30 20 * * *"
        assert weekdays["schedule"] == "30 20 * * 0,1,2,3,4"
        assert weekend["schedule"] == "30 20 * * 5,6"
        assert saturday["schedule"] == "0 10 * * 6"
        assert new_york["schedule"] == "0 3 * * 0"  # 22:00 Saturday at UTC-5 is 03:00 Sunday
        assert monthly["schedule"] == "0 2 1 * *"
    moved = [w for w in rendered.warnings if "another UTC day" in w.message]
    assert len(moved) == 1 and "budgets[5]" in moved[0].path


def test_engine_pods_request_the_memory_of_their_l1_tier():
    """A vLLM pod with a 64 GiB LMCache buffer requested no memory: scheduled on any node, OOM-killed when L1
    filled. It now requests the L1 (raised where the spec asks less, with a warning); a limit below it is named."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["kvCache"]["l1"] = {"enabled": True, "maxBytes": 64 << 30}
    doc["spec"]["placement"]["instanceTypes"] = ["ml.g5.12xlarge"]
    doc["spec"]["capacity"] = {**doc["spec"].get("capacity", {}), "allowLargerInstances": True}

    def engine(d):
        rendered, _ = _objects(d)
        pod = _by(rendered, "Deployment", "chat-engine")[0]["spec"]["template"]["spec"]
        return pod["containers"][0]["resources"], {w.path: w.message for w in rendered.warnings}

    resources, warnings = engine(doc)
    assert resources["requests"]["memory"] == "64Gi" and "memory" not in resources["limits"]
    assert "spec.engine.resources" not in warnings
    doc["spec"]["engine"]["resources"] = {"requests": {"memory": "30Gi"}}
    resources, warnings = engine(doc)
    assert resources["requests"]["memory"] == "64Gi" and "30Gi" in warnings["spec.engine.resources"]
    doc["spec"]["engine"]["resources"] = {"limits": {"memory": "32Gi"}}
    resources, warnings = engine(doc)
    assert resources["limits"]["memory"] == "32Gi" and "memory" not in resources["requests"]  # cannot exceed it
    assert "OOM" in warnings["spec.engine.resources"]
    doc["spec"]["engine"]["resources"] = {"requests": {"memory": "80Gi"}}
    resources, warnings = engine(doc)
    assert resources["requests"]["memory"] == "80Gi" and "spec.engine.resources" not in warnings


def test_a_metrics_port_the_engine_does_not_serve_is_named():
    """vLLM, SGLang and the built-in engine serve /metrics on their serving port only: a separate modelMetricsPort
    made the engine ServiceMonitor scrape a closed port, silently (an image of one's own, engine.command, may)."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["metrics"] = {"modelMetricsPort": 9400}
    rendered, _ = _objects(doc)
    message = {w.path: w.message for w in rendered.warnings}["spec.metrics.modelMetricsPort"]
    assert "9400" in message and "8000" in message
    doc["spec"]["engine"]["command"] = ["python3", "-m", "my_server"]
    rendered, _ = _objects(doc)
    assert "spec.metrics.modelMetricsPort" not in {w.path for w in rendered.warnings}


def test_amazon_managed_prometheus_triggers_are_signed_with_the_keda_operators_identity():
    """HyperPod's example queries an AMP workspace: KEDA sent unsigned queries, every one failed, and the endpoint
    never scaled. The trigger now names its region and a TriggerAuthentication of the `aws` pod identity."""
    rendered, _ = _objects(ROOT / "examples" / "hyperpod.yaml")
    (so,) = _by(rendered, "ScaledObject")
    amp = [t for t in so["spec"]["triggers"] if "aps-workspaces" in t["metadata"]["serverAddress"]]
    assert amp and all(t["metadata"]["awsRegion"] == "us-west-2" for t in amp)
    (auth,) = _by(rendered, "TriggerAuthentication")
    assert {t["authenticationRef"]["name"] for t in amp} == {auth["metadata"]["name"]}
    assert auth["spec"]["podIdentity"] == {"provider": "aws", "identityOwner": "keda"}
    assert validate(auth) == []
    assert any("aps:QueryMetrics" in w.message for w in rendered.warnings)
    # the cluster's own Prometheus on AMP (--prometheus-url): every query is signed, the activation one included
    from fleetserve.k8s.context import Context, RenderOptions
    from fleetserve.k8s.keda import keda_objects

    _, loaded = _objects(FULL)
    ctx = Context.build(loaded.endpoint, RenderOptions(
        prometheus_url="https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-1"))
    objects = keda_objects(ctx, lambda *a: None)
    queries = [t for o in objects if o["kind"] == "ScaledObject" for t in o["spec"]["triggers"]
               if t["type"] == "prometheus" and "aps-workspaces" in t["metadata"]["serverAddress"]]
    assert {t["name"] for t in queries} >= {"t0-concurrency", "activation-pending", "overflow"}
    assert all(t["metadata"]["awsRegion"] == "eu-west-1" and "authenticationRef" in t for t in queries)
    assert [o["kind"] for o in objects].count("TriggerAuthentication") == 1
    plain, _ = _objects(FULL)  # an in-cluster Prometheus: nothing to sign
    assert not [o for o in plain.objects if o["kind"] == "TriggerAuthentication"]
    assert not any("authenticationRef" in t for o in _by(plain, "ScaledObject") for t in o["spec"]["triggers"])


@pytest.mark.skipif(__import__("shutil").which("promtool") is None, reason="promtool not installed")
@pytest.mark.parametrize("metric", ["concurrency", "queue_depth", "request_rate", "ttft_p95"])
def test_a_lost_router_scrape_is_a_failure_not_an_idle_fleet(metric, tmp_path):
    """`or vector(0)` with ignoreNullValues read a router that Prometheus could not scrape (a wrong token or
    selector) as 0 load: the fleet scaled to zero, never woke, and the fallback never applied. The built-in queries
    are now 0 while the router is scraped with nothing to count, and empty (a KEDA failure) when it is not."""
    import subprocess

    from fleetserve.k8s.context import Context, RenderOptions
    from fleetserve.k8s.keda import builtin_query

    _, loaded = _objects(FULL)
    ctx = Context.build(loaded.endpoint, RenderOptions())
    query = builtin_query(ctx, metric)
    router = f'namespace="team-b",service="{ctx.router_name}"'
    (tmp_path / "rules.yml").write_text("groups: []\n")
    scraped = {"interval": "1m", "input_series": [
        {"series": f"fleetserve_router_pending_requests{{{router}}}", "values": "0x10"}],
        "promql_expr_test": [{"expr": query, "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": 0}]}]}
    lost = {"interval": "1m", "input_series": [{"series": 'up{job="other"}', "values": "1x10"}],
            "promql_expr_test": [{"expr": query, "eval_time": "5m", "exp_samples": []}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "tests": [scraped, lost]}))
    done = subprocess.run(["promtool", "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    (so,) = _by(render(loaded.endpoint), "ScaledObject", "chat-engine-t0")
    ignore = {t["name"]: t["metadata"]["ignoreNullValues"] for t in so["spec"]["triggers"] if t["type"] == "prometheus"}
    assert ignore == {"t0-concurrency": "false", "t1-prometheus": "true", "activation-pending": "false",
                      "activity-routed": "false"}


@pytest.mark.skipif(__import__("shutil").which("promtool") is None, reason="promtool not installed")
def test_an_idle_fleets_ttft_reads_zero_not_nan(tmp_path):
    """With nothing served in the window the quantile is NaN (KEDA before kedacore/keda#7522 made it -9.2e15), and
    the trigger kept ignoreNullValues, so a lost scrape read as an idle fleet there too."""
    import subprocess

    from fleetserve.k8s.context import Context, RenderOptions
    from fleetserve.k8s.keda import builtin_query

    doc = copy.deepcopy(FULL)
    doc["spec"]["autoscaling"]["triggers"] = [{"metric": "ttft_p95", "target": 800}]
    _, loaded = _objects(doc)
    ctx = Context.build(loaded.endpoint, RenderOptions())
    router = f'namespace="team-b",service="{ctx.router_name}"'
    bucket = f"fleetserve_router_served_ttfb_milliseconds_bucket{{{router}"
    (tmp_path / "rules.yml").write_text("groups: []\n")
    series = [(f"fleetserve_router_pending_requests{{{router}}}", "0x20"),
              (f'{bucket},le="100.0"}}', "0+6x5 30x14"), (f'{bucket},le="+Inf"}}', "0+6x5 30x14")]
    test = {"interval": "1m", "input_series": [{"series": n, "values": v} for n, v in series],
            "promql_expr_test": [
                {"expr": builtin_query(ctx, "ttft_p95"), "eval_time": "4m", "exp_samples": [{"labels": "{}",
                                                                                               "value": 95}]},
                {"expr": builtin_query(ctx, "ttft_p95"), "eval_time": "15m", "exp_samples": [{"labels": "{}",
                                                                                                "value": 0}]}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "tests": [test]}))
    done = subprocess.run(["promtool", "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    (so,) = _by(render(loaded.endpoint), "ScaledObject", "chat-engine-t0")
    assert {t["metadata"]["ignoreNullValues"] for t in so["spec"]["triggers"] if t["type"] == "prometheus"} == \
        {"false"}


@pytest.mark.skipif(__import__("shutil").which("promtool") is None, reason="promtool not installed")
def test_the_request_rate_query_counts_model_requests_as_the_local_controller_does(tmp_path):
    """The query counted every answer of every path: a client polling GET /v1/models scaled a Kubernetes fleet, and
    not a local one, whose /admin/load counts model requests."""
    import subprocess

    from fleetserve.k8s.context import Context, RenderOptions
    from fleetserve.k8s.keda import builtin_query

    _, loaded = _objects(FULL)
    ctx = Context.build(loaded.endpoint, RenderOptions())
    router = f'namespace="team-b",service="{ctx.router_name}"'
    (tmp_path / "rules.yml").write_text("groups: []\n")
    series = [(f"fleetserve_router_pending_requests{{{router}}}", "0x10"),
              (f'fleetserve_router_requests_received_total{{{router},path="/v1/chat/completions"}}', "0+60x10"),
              (f'fleetserve_router_requests_received_total{{{router},path="/v1/completions"}}', "0+30x10"),
              (f'fleetserve_router_requests_received_total{{{router},path="/invocations"}}', "0+30x10"),
              (f'fleetserve_router_requests_received_total{{{router},path="/v1/models"}}', "0+600x10"),
              (f'fleetserve_router_requests_received_total{{{router},path="other"}}', "0+600x10"),
              # answers of long streams, counted when they end: no scaling signal (it read them minutes late)
              (f'fleetserve_router_requests_total{{{router},path="/v1/completions",code="200"}}', "0+600x10")]
    test = {"interval": "1m", "input_series": [{"series": n, "values": v} for n, v in series],
            "promql_expr_test": [{"expr": builtin_query(ctx, "request_rate"), "eval_time": "5m",
                                  "exp_samples": [{"labels": "{}", "value": 2}]}]}  # (60 + 30 + 30) / 60 s
    (tmp_path / "t.yml").write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "tests": [test]}))
    done = subprocess.run(["promtool", "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_autoscaling_without_metrics_names_what_its_triggers_cannot_read():
    """With metrics.enabled false nothing scrapes the router, so the built-in triggers read nothing: a failure on
    every poll since they no longer read a lost scrape as zero load. Render says so."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["metrics"] = {"enabled": False}
    rendered, _ = _objects(doc)
    assert "never wakes from zero" in {w.path: w.message for w in rendered.warnings}["spec.metrics.enabled"]
    assert "spec.metrics.enabled" not in {w.path for w in _objects(FULL)[0].warnings}


def test_instance_type_local_is_this_machine_not_a_node_type():
    """`instanceTypes: [local]` (what `models list` gives the CPU model) rendered a NodePool and an affinity for a
    node type no cluster has (every pod Pending), and validate said no replica would start, while the simulator
    ran the fleet on this machine's slots."""
    data = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "cpu"},
            "spec": {"model": {"source": "builtin:smollm2-135m"}, "replicas": 2,
                     "placement": {"instanceTypes": ["local"]}}}
    loaded = load_spec_data(data)
    said = {w.path: w.message for w in loaded.warnings}
    assert "'local' is this machine" in said["spec.placement.instanceTypes"]
    assert "no replica would start" not in said["spec.placement.instanceTypes"]
    rendered = render(loaded.endpoint)
    kinds = {o["kind"] for o in rendered.objects}
    assert "NodePool" not in kinds
    engines = yaml.safe_dump([o for o in rendered.objects if o["kind"] == "Deployment"])
    assert "node.kubernetes.io/instance-type" not in engines


def test_a_fallback_over_a_value_trigger_names_the_keda_version_it_needs():
    """KEDA falls back on Value triggers since 2.18 (as the local controller and the simulator do); older KEDA's
    admission webhook refuses such a ScaledObject."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["autoscaling"]["triggers"].append({"metric": "ttft_p95", "target": 800})
    rendered, _ = _objects(doc)
    named = [w.message for w in rendered.warnings if w.path == "spec.autoscaling.fallback"]
    assert len(named) == 1 and "triggers[2] (ttft_p95)" in named[0] and "triggers[0]" not in named[0]
    assert "KEDA 2.18" in named[0]
    assert not [w for w in _objects(FULL)[0].warnings if w.path == "spec.autoscaling.fallback"]


def test_the_drain_timeout_sets_the_grace_periods_and_the_builtin_engines_own_wait():
    """`engine.drainTimeoutSeconds` is one value in three places: the supervisor and the simulator stop a drained
    replica after it; here it is the engine pods' grace after preStop and the built-in engine's wait after SIGTERM
    (uvicorn's graceful shutdown was a fixed 5 s: on Kubernetes a stream still running 15 s after scale-down was
    cut whatever the pod's grace)."""
    doc = copy.deepcopy(BUILTIN_TENANTS)
    doc["spec"]["engine"] = {"drainTimeoutSeconds": 299.5}
    doc["spec"]["router"] = {"bufferTimeoutSeconds": 900, "streamIdleTimeoutSeconds": 6, "upstreamTimeoutSeconds": 4.5}
    rendered, _ = _objects(doc)
    engine = _by(rendered, "Deployment", "iso-engine")[0]["spec"]["template"]["spec"]
    assert engine["terminationGracePeriodSeconds"] == 10 + 300 + 5  # preStop, the drain, then the exit
    args = engine["containers"][0]["args"]
    assert args[args.index("--drain-timeout") + 1] == "300"
    # a held-back stream outlives the router's cut: its stream idle timeout, or its upstream timeout when shorter
    assert args[args.index("--stream-keepalive") + 1] == "1.5"
    # the router waits as long for the streams it proxies (its own --drain-timeout: it was a fixed 5 s)
    router = _by(rendered, "Deployment", "iso-router")[0]["spec"]["template"]["spec"]
    assert router["terminationGracePeriodSeconds"] == 10 + 300 + 5
    router_args = router["containers"][0]["args"]
    assert router_args[router_args.index("--drain-timeout") + 1] == "300"
    default = _by(_objects(BUILTIN_TENANTS)[0], "Deployment", "iso-engine")[0]["spec"]["template"]["spec"]
    assert default["terminationGracePeriodSeconds"] == 10 + 120 + 5


def test_a_vllm_engine_without_a_shutdown_timeout_is_told_it_cuts_streams_at_sigterm():
    """vLLM aborts in-flight requests at SIGTERM unless `--shutdown-timeout` (vLLM 0.18+) is given; the pod's grace
    alone does not keep them."""
    named = [w.message for w in _objects(FULL)[0].warnings if w.path == "spec.engine.args" and "SIGTERM" in w.message]
    assert len(named) == 1 and "--shutdown-timeout=120" in named[0] and "vLLM 0.18" in named[0]
    doc = copy.deepcopy(FULL)
    for given in (["--shutdown-timeout=100"], ["--shutdown-timeout 100"], ["--shutdown-timeout", "100"]):
        doc["spec"]["engine"]["args"] = given
        assert not [w for w in _objects(doc)[0].warnings if "SIGTERM" in w.message], given
    builtin = _objects(BUILTIN_TENANTS)[0]
    assert not [w for w in builtin.warnings if "SIGTERM" in w.message]


def test_render_findings_of_a_second_black_box_pass():
    """Each of these was accepted and rendered a fleet Kubernetes refuses or runs wrong."""
    import re

    from fleetserve.spec import SpecError

    # pollingInterval 0.5 rendered as 0: KEDA polled the metrics without a pause
    fast = copy.deepcopy(FULL)
    fast["spec"]["autoscaling"]["pollingInterval"] = 0.5
    rendered, _ = _objects(fast)
    assert _by(rendered, "ScaledObject", "chat-engine-t0")[0]["spec"]["pollingInterval"] == 1
    assert any("KEDA's least, 1 s" in str(w) for w in rendered.warnings)

    # a stabilization window over an hour: the HPA KEDA makes refuses it and the ScaledObject never got Ready
    for field in ("scaleUpStabilizationTime", "scaleDownStabilizationTime"):
        slow = copy.deepcopy(FULL)
        slow["spec"]["autoscaling"][field] = 4000
        with pytest.raises(SpecError, match=f"spec.autoscaling.{field}.*3600"):
            _objects(slow)

    # shared dicts were written as YAML anchors and aliases (&id001 / *id001): no object may carry one
    for spec in [*EXAMPLES, FULL, BUILTIN_TENANTS]:
        texts = _objects(spec)[0].files().values()
        assert not [t for t in texts if re.search(r"[&*]id\d{3}", t)], spec

    # a gated Hugging Face model without a token, or an S3 bucket without a service account: the fetch-model init
    # container was refused (401, 403) with nothing said at render time
    rendered, _ = _objects(FULL)  # hf:meta-llama/Llama-3.1-8B-Instruct
    assert any(w.path == "spec.model.tokenSecret" and "gated" in w.message for w in rendered.warnings)
    tokened = copy.deepcopy(FULL)
    tokened["spec"]["model"]["tokenSecret"] = {"name": "hf", "key": "token"}
    assert not any(w.path == "spec.model.tokenSecret" for w in _objects(tokened)[0].warnings)
    bucket = copy.deepcopy(FULL)
    bucket["spec"]["model"]["source"] = "s3://models/llama-8b"
    assert any(w.path == "spec.model.source" and "403" in w.message for w in _objects(bucket)[0].warnings)

    # a plain-text password holding a "/" (base64 gives one in four passwords in ten) was not warned of
    slash = copy.deepcopy(BUILTIN_TENANTS)
    slash["spec"]["kvCache"]["l2"]["tenantUrls"] = {"alpha": "redis://:ab/cd@redis.example.com:6379/0"}
    assert any(w.path == "spec.kvCache.l2.tenantUrls.alpha" for w in _objects(slash)[0].warnings)
    # a bare Service name is a Redis the render deploys with its own password: the URL's is not used, and it had
    # been warned of as written into the manifests (it is in none of them)
    replaced = copy.deepcopy(BUILTIN_TENANTS)
    replaced["spec"]["kvCache"]["l2"]["tenantUrls"] = {"alpha": "redis://:pw2@redis-alpha:6379/1"}
    rendered, _ = _objects(replaced)
    (said,) = [w.message for w in rendered.warnings if w.path == "spec.kvCache.l2.tenantUrls.alpha"]
    assert "is not used" in said and "redis-alpha-auth" in said and "plain text" not in said
    assert "pw2" not in yaml.safe_dump_all(rendered.objects)
    trailing = copy.deepcopy(FULL)
    trailing["metadata"]["labels"] = {"team": "b\n"}
    with pytest.raises(SpecError, match="not a Kubernetes label value"):
        _objects(trailing)

    # a StatefulSet's serviceName must be a headless Service (it named the clients' ClusterIP one)
    rendered, _ = _objects(BUILTIN_TENANTS)
    services = {o["metadata"]["name"]: o for o in _by(rendered, "Service")}
    for sts in _by(rendered, "StatefulSet"):
        governing = services[sts["spec"]["serviceName"]]
        assert governing["spec"]["clusterIP"] == "None"
        assert governing["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]

    # a TLS Redis (rediss://) was refused for a tenant, and vLLM's LMCache got "redis://rediss://..."
    tls = copy.deepcopy(BUILTIN_TENANTS)
    tls["spec"]["kvCache"]["l2"]["tenantUrls"] = {"alpha": "rediss://redis-alpha:6380/0"}
    engine = _by(_objects(tls)[0], "Deployment", "iso-engine")[0]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in engine["env"]}  # the user's own: not rendered, not rewritten
    assert "alpha=rediss://redis-alpha:6380/0" in env["FLEETSERVE_L2_TENANTS"].split()
    from fleetserve.engine.adapters import vllm_launch

    gpu = load_spec_data({**copy.deepcopy(FULL), "spec": {**copy.deepcopy(FULL)["spec"], "kvCache": {
        "l2": {"enabled": True, "url": "rediss://cache.example.com:6380/0"}}}}).endpoint.spec
    assert vllm_launch(gpu, "/m", 8000).env["LMCACHE_REMOTE_URL"] == "rediss://cache.example.com:6380/0"

    # spec.replicas above maxReplicaCount started that many pods, past the NodePool's GPU limit
    many = copy.deepcopy(FULL)
    many["spec"]["replicas"] = 9
    rendered, _ = _objects(many)
    assert _by(rendered, "Deployment", "chat-engine-t0")[0]["spec"]["replicas"] == 6  # maxReplicaCount

    # a label value the API server refuses failed the whole apply; one of fleetserve's keys was replaced in silence
    spaced = copy.deepcopy(FULL)
    spaced["metadata"]["labels"] = {"team": "a b"}
    with pytest.raises(SpecError, match=r"metadata.labels.*'team'.*not a Kubernetes label value"):
        _objects(spaced)
    for key in ("bad key", "-x", "Example.com/x", "a/" + "b" * 64):
        keyed = copy.deepcopy(FULL)
        keyed["metadata"]["labels"] = {key: "v"}
        with pytest.raises(SpecError, match="not a Kubernetes label key"):
            _objects(keyed)
    ours = copy.deepcopy(FULL)
    ours["metadata"]["labels"] = {"app.kubernetes.io/component": "mine", "fleetserve.io/tier": "9",
                                  "example.com/team": "b", "empty": ""}
    rendered, _ = _objects(ours)
    said = {w.path for w in rendered.warnings}
    assert {"metadata.labels.app.kubernetes.io/component", "metadata.labels.fleetserve.io/tier"} <= said
    assert "metadata.labels.example.com/team" not in said


def test_long_endpoint_names_keep_alerts_and_overflow_on_their_pods():
    """Long names hash the Deployments' (NAME-engine-t0 cut, then 8 hex digits): the rules' NAME-engine.* matched
    no Deployment, and an overflow's DEPLOYMENT-.* no pod once Kubernetes cut the pods' generated names at 58."""
    import re

    long = copy.deepcopy(FULL)
    long["metadata"]["name"] = "a" * 55
    rendered, _ = _objects(long)
    deployments = sorted(d["metadata"]["name"] for d in _by(rendered, "Deployment")
                         if d["metadata"]["labels"]["app.kubernetes.io/component"] == "engine")
    assert len(deployments) == 2 and all(len(d) == 63 for d in deployments)
    rules = yaml.safe_dump(_by(rendered, "PrometheusRule")[0]["spec"])
    (selector,) = set(re.findall(r'deployment=~"([^"]+)"', rules))
    assert all(re.fullmatch(selector, d) for d in deployments)
    # the unschedulable alert selects the last tier's pods by their owner, the ReplicaSet DEPLOYMENT-HASH (never
    # cut, where a pod's name is cut to 58 characters, then 5 more)
    owners = set(re.findall(r'owner_name=~"([^"]+)"', rules))
    tier = {d["metadata"]["labels"]["fleetserve.io/tier"]: d["metadata"]["name"] for d in _by(rendered, "Deployment")
            if d["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"}
    assert len(owners) == 2
    for t, other in (("0", "1"), ("1", "0")):  # each tier's pods, and only its own
        (owner,) = [o for o in owners if re.fullmatch(o, f"{tier[t]}-6d4cf56db6")]
        assert not re.fullmatch(owner, f"{tier[other]}-6d4cf56db6")
    # a tier's overflow counts the tier before it by owner: for names of 59-63 characters (not hashed), the cut
    # at 58 dropped the tier suffix and a pod prefix counted the tier's own pods too
    for name in ("a" * 55, "b" * 50):
        long = copy.deepcopy(FULL)
        long["metadata"]["name"] = name
        rendered, _ = _objects(long)
        tiers = sorted(d["metadata"]["name"] for d in _by(rendered, "Deployment")
                       if d["metadata"]["labels"]["app.kubernetes.io/component"] == "engine")
        overflow = _by(rendered, "ScaledObject", tiers[1])[0]["spec"]["triggers"][0]["metadata"]["query"]
        (owner,) = re.findall(r'owner_name=~"([^"]+)"', overflow)
        assert re.fullmatch(owner, f"{tiers[0]}-6d4cf56db6") and not re.fullmatch(owner, f"{tiers[1]}-6d4cf56db6")
        assert 'owner_kind="ReplicaSet"' in overflow and "kube_pod_owner" in overflow
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as folder:  # the query is PromQL Prometheus parses
        rules = Path(folder) / "q.yml"
        rules.write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": [{"record": "q:overflow",
                                                                              "expr": overflow}]}]}))
        check = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True,
                               timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr


def test_node_affinity_preferences_reach_the_pods_and_add_no_identical_tiers():
    """AWS's node-affinity sample: its two preferences (a zone, and a misspelt instance-type key) narrowed
    nothing the catalog models, so three identical tiers, NodePools and overflow ScaledObjects were rendered,
    and the pods lost both preferences; ml.g5.16xlarge (then outside the catalog) was dropped unsaid."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["placement"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "node.kubernetes.io/instance-type", "operator": "In",
             "values": ["ml.g5.16xlarge", "ml.g5.12xlarge", "ml.g5.8xlarge"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "preference": {"matchExpressions": [
                {"key": "node.kubernetes.io/instanceType", "operator": "In", "values": ["ml.g5.8xlarge"]}]}},
            {"weight": 50, "preference": {"matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-2a"]}]}}]}}
    rendered, loaded = _objects(doc)
    (pool,) = _by(rendered, "NodePool")
    types = next(r["values"] for r in pool["spec"]["template"]["spec"]["requirements"]
                 if r["key"] == "node.kubernetes.io/instance-type")
    assert sorted(types) == ["g5.16xlarge", "g5.8xlarge"]  # a 4-GPU type takes no 1-GPU replica (not allowed larger)
    left = [w.message for w in rendered.warnings if w.path == "spec.placement.nodeAffinity" and "left out" in w.message]
    assert len(left) == 1 and "g5.12xlarge (4 GPU(s))" in left[0] and "allowLargerInstances" in left[0], left
    engines = [d for d in _by(rendered, "Deployment") if d["metadata"]["labels"]["app.kubernetes.io/component"]
               == "engine"]
    assert len(engines) == 1
    preferred = engines[0]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert [p["weight"] for p in preferred] == [100, 50]
    assert preferred[0]["preference"]["matchExpressions"][0]["values"] == ["ml.g5.8xlarge"]  # another key: as given
    notes = [w.message for w in loaded.warnings if w.path == "spec.placement.nodeAffinity"]
    assert any("'node.kubernetes.io/instanceType' is not the instance-type label" in n for n in notes)


@pytest.mark.parametrize("command,args_start", [
    (["python3", "-m", "vllm.entrypoints.openai.api_server"], ["--model", "/opt/ml/model/llama", "--host"]),
    (["vllm", "serve"], ["/opt/ml/model/llama", "--host"]),
])
def test_a_hyperpod_worker_command_gets_the_servers_arguments_without_our_launcher(command, args_start):
    """HyperPod's worker.command replaced our `vllm serve` but our args kept `serve MODEL`: the pod ran
    `python3 -m vllm.entrypoints.openai.api_server serve /opt/ml/model/llama` and exited."""
    from tests.spec.test_hyperpod import AUDIT

    doc = yaml.safe_load(AUDIT)
    doc["spec"]["worker"]["command"] = command
    rendered, _ = _objects(doc)
    (deployment,) = _by(rendered, "Deployment", "audit-engine")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == command and container["args"][:len(args_start)] == args_start
    assert "serve" not in container["args"] and container["args"].count("/opt/ml/model/llama") == 1


def test_a_hyperpod_image_neither_vllm_nor_sglang_is_rendered_as_given_and_never_sees_our_token():
    """DJL-LMI from AWS's samples: its own entrypoint, args and port, probed on SageMaker's /ping, sent chat bodies
    on /invocations by the router, never given the fleet's internal token (nor by Prometheus)."""
    doc = yaml.safe_load((ROOT / "examples" / "hyperpod.yaml").read_text())
    image = "763104351884.dkr.ecr.us-east-2.amazonaws.com/djl-inference:0.32.0-lmi14.0.0-cu124"
    doc["spec"]["worker"].update(image=image, command=["dockerd-entrypoint.sh"], args=["--model-id", "/opt/ml/model"])
    doc["spec"].pop("loadBalancer", None)
    doc["spec"]["invocationEndpoint"] = "invocations"
    doc["spec"].pop("metrics", None)
    rendered, loaded = _objects(doc)
    (deployment,) = [d for d in _by(rendered, "Deployment") if "-engine" in d["metadata"]["name"]]
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    assert (c["image"], c["command"], c["args"]) == (image, ["dockerd-entrypoint.sh"], ["--model-id", "/opt/ml/model"])
    assert c["readinessProbe"]["httpGet"]["path"] == "/ping"
    assert {p["containerPort"] for p in c["ports"]} == {8000}
    secrets = [e for e in c["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    assert not [e for e in secrets if e["valueFrom"]["secretKeyRef"]["key"] in ("token", "engine-token")]
    (router,) = [d for d in _by(rendered, "Deployment") if d["metadata"]["name"].endswith("-router")]
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--invocation-path") + 1] == "/invocations" and "--no-send-internal-token" in args
    assert "--model-metrics" in args and "--model" not in args  # its served names are its own
    # where the image serves metrics is not known: no engine ServiceMonitor, and the warning says how to give it
    engine_monitors = [m for m in rendered.objects if m["kind"] == "ServiceMonitor" and "-engine" in
                       m["metadata"]["name"]]
    assert not engine_monitors and "modelMetricsPath" in {w.path: w.message for w in rendered.warnings}[
        "spec.metrics"]
    doc["spec"]["metrics"] = {"enabled": True, "modelMetrics": {"path": "/metrics", "port": 8000}}
    rendered, _ = _objects(doc)
    (monitor,) = [m for m in rendered.objects if m["kind"] == "ServiceMonitor" and "-engine" in m["metadata"]["name"]]
    assert "authorization" not in monitor["spec"]["endpoints"][0]  # Prometheus sends it no token of ours
    for obj in rendered.objects:
        assert validate(obj) == [], obj["kind"]


def test_a_long_endpoint_name_makes_pods_it_can_start_and_render_names_the_secrets_to_create():
    """A 63-character Redis StatefulSet never made a pod (its controller-revision-hash label would be 74
    characters), and the hashed Secret names the pods read were printed nowhere: pods waited without a word."""
    from fleetserve.k8s.secrets_needed import describe, secrets_needed

    doc = copy.deepcopy(FULL)
    doc["metadata"]["name"] = "llama-3-1-8b-instruct-production-kv-routing-endpoint-us-west-2"  # 62
    rendered, loaded = _objects(doc)
    for sts in _by(rendered, "StatefulSet"):
        assert len(sts["metadata"]["name"]) <= 52, sts["metadata"]["name"]
    needed = dict(secrets_needed(rendered.objects))
    referenced = {v["secret"]["secretName"] for o in rendered.objects
                  for v in (o.get("spec", {}).get("template", {}).get("spec", {}).get("volumes") or [])
                  if "secret" in v}
    assert referenced and referenced <= set(needed) | {o["metadata"]["name"] for o in _by(rendered, "Secret")}
    internal = next(n for n in needed if n.endswith("internal") or "internal" in n or "token" in needed[n])
    assert "token" in needed[internal]
    assert all(len(n) <= 63 for n in needed)
    text = describe(sorted(needed.items()), "team-b")
    assert text.startswith("note: create before applying, in namespace team-b, the Secret(s) ") and internal in text


def test_a_builtin_engine_on_gpus_runs_the_cuda_build_of_the_default_image():
    """It requested a GPU and ran the CPU-only image: the GPU node was paid for and never used."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["engine"] = {"kind": "builtin", "gpus": 1}
    rendered, _ = _objects(doc)
    engines = [d["spec"]["template"]["spec"]["containers"][0] for d in _by(rendered, "Deployment")
               if d["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"]
    assert engines and all(e["image"].endswith(":0.1.0-cuda") for e in engines)
    doc["spec"]["engine"] = {"kind": "builtin"}
    rendered, _ = _objects(doc)
    engines = [d["spec"]["template"]["spec"]["containers"][0] for d in _by(rendered, "Deployment")
               if d["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"]
    assert engines and all(e["image"].endswith(":0.1.0") for e in engines)


def test_a_vllm_image_without_lmcache_and_a_token_in_engine_env_are_warned():
    """LMCache's connector went to any vLLM image (one built without it stops at start), and HF_TOKEN in
    engine.env went into the Deployment as plain text, both without a word."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["engine"] = {"kind": "vllm", "gpus": 1, "image": "vllm/vllm-openai:v0.10.1",
                             "env": {"HF_TOKEN": "hf_abc", "LOG_LEVEL": "info", "API_KEY": "$(FROM_SECRET)"}}
    rendered, _ = _objects(doc)
    said = {w.path: w.message for w in rendered.warnings}
    assert "LMCacheConnectorV1" in said["spec.engine.image"]
    assert "plain text" in said["spec.engine.env.HF_TOKEN"]
    assert "spec.engine.env.LOG_LEVEL" not in said and "spec.engine.env.API_KEY" not in said
    # a credential given as a flag's value went into the container's arguments without a word (found in review)
    doc["spec"]["engine"]["args"] = ["--api-key", "sk-abc", "--hf-token=hf_x", "--max-num-seqs", "64",
                                     "--api-key=$(FROM_SECRET)", "--disable-api-key-check", "--tokenizer", "o/t",
                                     "--max-num-batched-tokens", "8192", "--password-file", "/x", "--tokenizer-mode",
                                     "auto", "--gcs-credentials", "/etc/gcs.json", "--api-keys", "a,b"]
    said = {w.path: w.message for w in _objects(doc)[0].warnings}
    assert "a credential (--api-key) goes into the rendered manifests as plain text" in said["spec.engine.args[0]"]
    assert "a credential (--hf-token)" in said["spec.engine.args[2]"]
    flagged = {p for p in said if p.startswith("spec.engine.args[")}
    assert flagged == {"spec.engine.args[0]", "spec.engine.args[2]", "spec.engine.args[17]"}, said  # not the rest
    doc["spec"]["engine"]["image"] = "lmcache/vllm-openai:v0.3.7"
    rendered, _ = _objects(doc)
    assert "spec.engine.image" not in {w.path for w in rendered.warnings}


@pytest.mark.parametrize("source,ok", [("/usr/local/models/m", False), ("/opt/models/m", False), ("/tmp/m", False),
                                       ("/", False), ("/fsx/models/m", True), ("/opt/ml/model", True),
                                       ("/mnt/models/m", True)])
def test_a_local_model_path_is_never_mounted_over_the_images_own_folders(source, ok):
    """The volume goes at the path's first folder: /usr/local/models/m was mounted at /usr, hiding Python, and
    the pod never started."""
    doc = copy.deepcopy(BUILTIN_TENANTS)
    doc["spec"]["model"]["source"] = source
    if ok:
        rendered, _ = _objects(doc)
        (engine,) = _by(rendered, "Deployment")[:1]
        mounts = {m["mountPath"] for c in engine["spec"]["template"]["spec"]["containers"] for m in c.get(
            "volumeMounts", []) if m["name"] == "model"}
        assert mounts and not mounts & {"/usr", "/opt", "/tmp", "/"}
    else:
        with pytest.raises(ValueError, match=r"spec.model.source: .* over the image's own folder"):
            _objects(doc)


def test_an_image_run_as_given_finds_the_fetched_model_files_at_its_mount_path(tmp_path):
    """HyperPod's DJL-LMI sample: the image reads /opt/ml/model itself, where it had found `cache/` and a `current`
    link that fleetserve's engines are pointed at. The files now go to the volume's `model` folder (the fetcher's
    symlinks followed) and the engine mounts that folder there. The init script is run here with a stand-in
    `fleetserve` that answers as `model prepare --download` does: a snapshot of relative symlinks to blobs."""
    import os
    import subprocess

    if subprocess.run(["cp", "--version"], capture_output=True).returncode != 0:
        pytest.skip("the init script runs GNU cp (the fleetserve image is Debian's); this cp is another")
    djl = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "djl"},
           "spec": {"model": {"source": "s3://bucket/models/m", "mountPath": "/opt/ml/model"},
                    "engine": {"kind": "container", "image": "djl-lmi:latest", "gpus": 1}}}
    rendered, _ = _objects(djl)
    pod = _by(rendered, "Deployment", "djl-engine")[0]["spec"]["template"]["spec"]
    (engine,) = pod["containers"]
    assert {"name": "model", "mountPath": "/opt/ml/model", "subPath": "model"} in engine["volumeMounts"]
    (init,) = pod["initContainers"]
    assert init["volumeMounts"] == [{"name": "model", "mountPath": "/fetch"}]
    snapshot = tmp_path / "hub" / "snapshots" / "abc"
    (tmp_path / "hub" / "blobs").mkdir(parents=True)
    (tmp_path / "hub" / "blobs" / "w1").write_text("weights")
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to("../../blobs/w1")
    stub = tmp_path / "bin" / "fleetserve"
    stub.parent.mkdir()
    stub.write_text(f"#!/bin/sh\necho {snapshot}\n")
    stub.chmod(0o755)
    volume = tmp_path / "volume"
    script = init["command"][2].replace("/fetch", str(volume))
    subprocess.run(["sh", "-c", script, *init["args"]], check=True, timeout=30,
                   env={**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}"})
    copied = volume / "model" / "model.safetensors"
    assert copied.read_text() == "weights" and not copied.is_symlink()  # what the engine sees at /opt/ml/model
    subprocess.run(["sh", "-c", script, *init["args"]], check=True, timeout=30,  # a pod restart reruns it
                   env={**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}"})
    assert copied.read_text() == "weights"
    vllm, _ = _objects({**djl, "spec": {**djl["spec"], "engine": {"kind": "vllm", "gpus": 1}}})
    args = _by(vllm, "Deployment", "djl-engine")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "/opt/ml/model/current" in args  # engines fleetserve starts are pointed at the fetched folder


def test_a_vllm_probe_on_an_api_path_is_warned():
    """vLLM checks its API key on /v1/*, which the kubelet does not send: the pod never became ready, unsaid."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["engine"]["probes"] = {"readinessProbe": {"httpGet": {"path": "/v1/models", "port": "http"}}}
    rendered, _ = _objects(doc)
    assert any(str(w).startswith("spec.engine.probes.readinessProbe: /v1/models needs the engine's API key")
               for w in rendered.warnings), rendered.warnings
    doc["spec"]["engine"]["probes"] = {"readinessProbe": {"httpGet": {"path": "/health", "port": "http"}}}
    assert not any("probes" in str(w) for w in _objects(doc)[0].warnings)


def test_a_fetched_model_asks_for_the_node_disk_its_weights_take():
    """The copy lands in an emptyDir on the node's disk, asked for by nobody: a 20 GiB root volume evicted the pod
    mid-download instead of the node being passed over."""
    rendered, _ = _objects(ROOT / "examples" / "hyperpod.yaml")  # Llama-3.1-8B: 16 GB of bf16 weights
    (init,) = [d for d in _by(rendered, "Deployment") if "engine" in d["metadata"]["name"]][0]["spec"]["template"][
        "spec"]["initContainers"]
    assert init["resources"]["requests"]["ephemeral-storage"] == "17Gi"
    unsized = copy.deepcopy(BUILTIN_TENANTS)
    unsized["spec"]["model"] = {"source": "s3://bucket/models/mine"}  # no size in its name: nothing asked
    (init,) = _by(_objects(unsized)[0], "Deployment", "iso-engine")[0]["spec"]["template"]["spec"]["initContainers"]
    assert "resources" not in init
    unsized["spec"]["model"] = {"source": "hf:org/Llama-3.1-70B-Instruct-AWQ"}  # 4-bit: a bf16 estimate (143Gi)
    (init,) = _by(_objects(unsized)[0], "Deployment", "iso-engine")[0]["spec"]["template"]["spec"]["initContainers"]
    assert "resources" not in init  # had kept the pod Pending on any sensible volume


def test_a_lead_time_that_moves_a_start_before_the_previous_end_is_warned():
    """fleetserve raises the floor scheduleLeadTime early and holds it to the end; KEDA's cron trigger, its start
    moved that much earlier, fires before the previous end when the lead is not shorter than the gap, and then
    holds the floor only until that end."""
    doc = copy.deepcopy(FULL)
    auto = doc["spec"]["autoscaling"]
    auto["scheduleLeadTime"] = 3 * 3600  # each window's own gap (16 h, 20 h) is longer
    auto["schedules"] = [{"name": "night", "timezone": "UTC", "start": "0 4 * * *", "end": "0 8 * * *",
                          "minReplicas": 1},
                         {"name": "day", "timezone": "UTC", "start": "0 9 * * *", "end": "0 17 * * *",
                          "minReplicas": 2}]
    rendered, _ = _objects(doc)
    assert not any("scheduleLeadTime" in str(w) for w in rendered.warnings)  # 16 h between end and start
    auto["schedules"] = [{"name": "short", "timezone": "UTC", "start": "0 9 * * *", "end": "30 6 * * *",
                          "minReplicas": 1}]  # open 09:00 to 06:30 the next day; a 3 h lead starts it at 06:00
    rendered, _ = _objects(doc)
    assert any(str(w).startswith("spec.autoscaling.schedules[0]: scheduleLeadTime (10800 s) is not shorter than the "
                                 "gap") for w in rendered.warnings), rendered.warnings
    # a whole day's lead gives the start's own text back: it had passed unwarned while the floor held all day
    auto["scheduleLeadTime"] = 86400
    auto["schedules"] = [{"name": "hour", "timezone": "UTC", "start": "0 9 * * *", "end": "0 10 * * *",
                          "minReplicas": 1}]
    rendered, _ = _objects(doc)
    assert any("is not shorter than the gap" in str(w) for w in rendered.warnings), rendered.warnings
    # 23 h moves 09:00 to 10:00, its end: KEDA refuses a cron trigger whose start is its end
    auto["scheduleLeadTime"] = 82800
    rendered, _ = _objects(doc)
    so = _by(rendered, "ScaledObject")[0]
    (cron,) = [t["metadata"] for t in so["spec"]["triggers"] if t["name"] == "floor-hour"]
    assert cron["start"] != cron["end"] and cron["start"] == "0 9 * * *"
    assert any("KEDA's cron scaler refuses" in str(w) for w in rendered.warnings), rendered.warnings


def test_pod_tolerations_priority_pull_secrets_and_security_context_reach_the_pods():
    """A cluster's own tainted node groups, preemption order, a private registry and a namespace enforcing the
    restricted Pod Security level had no place in the spec: every one needed a patch after each render."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["pod"] = {
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"},
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},  # ours already
                        {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}],
        "priorityClassName": "inference-high", "imagePullSecrets": ["regcred"],
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000}}
    rendered, _ = _objects(doc)
    for obj in rendered.objects:
        assert validate(obj) == [], (obj["kind"], obj["metadata"]["name"], validate(obj))
    pods = {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in rendered.objects
            if o["kind"] in ("Deployment", "StatefulSet")}
    engine = pods["chat-engine-t0"]
    assert engine["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"},
        {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]
    assert engine["priorityClassName"] == "inference-high" and engine["securityContext"]["runAsUser"] == 1000
    assert all(pod["imagePullSecrets"] == [{"name": "regcred"}] for pod in pods.values()), sorted(pods)
    assert "priorityClassName" not in pods["chat-router"]
    from fleetserve.k8s.secrets_needed import secrets_needed

    assert ("regcred", [".dockerconfigjson"]) in secrets_needed(rendered.objects)  # named with the others to create


@pytest.mark.parametrize("pod,says", [
    ({"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]}, "Exists matches any value"),
    ({"tolerations": [{"value": "x"}]}, "without a key must have operator Exists"),
    ({"tolerations": [{"key": "a", "operator": "In"}]}, "'Equal' or 'Exists'"),
    ({"tolerations": [{"key": "a", "effect": "NoSchedule", "tolerationSeconds": 5}]}, "effect NoExecute only"),
    ({"tolerations": [{"key": "bad key!", "operator": "Exists"}]}, "'bad key!' is not a taint key"),
    ({"tolerations": [{"key": "a", "value": "no spaces"}]}, "'no spaces' is not a taint value"),
    ({"priorityClassName": "High Priority"}, "a PriorityClass name"),
    ({"imagePullSecrets": ["ok", "Not OK"]}, "[1] 'Not OK': a Secret name"),
])
def test_bad_pod_settings_are_refused_naming_the_field(pod, says):
    from fleetserve.spec import SpecError

    doc = copy.deepcopy(FULL)
    doc["spec"]["pod"] = pod
    with pytest.raises(SpecError) as info:
        load_spec_data(doc)
    message = str(info.value)
    assert "spec.pod." in message and says in message, message


@pytest.mark.parametrize("spec", EXAMPLES + [FULL], ids=lambda s: getattr(s, "name", None) or "full")
def test_router_pods_meet_the_restricted_pod_security_level(spec):
    """The routers run fleetserve's own image (uid 10001, writes only /tmp): a namespace enforcing the restricted
    level refused them, as the operator's own pod already met it."""
    rendered, _ = _objects(spec)
    routers = [o for o in rendered.objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("router")]
    assert routers
    for router in routers:
        pod = router["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["seccompProfile"] == \
            {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["readOnlyRootFilesystem"] and {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
        assert {"name": "tmp", "emptyDir": {}} in pod["volumes"]
        assert validate(router) == []


def _meets_restricted(pod: dict) -> list[str]:
    """What Pod Security's restricted level refuses in a pod spec (the checks that concern our containers)."""
    problems = []
    pod_sc = pod.get("securityContext") or {}
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{c['name']}: allowPrivilegeEscalation")
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            problems.append(f"{c['name']}: capabilities.drop ALL")
        if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")) or 0 in (sc.get("runAsUser"),
                                                                            pod_sc.get("runAsUser")):
            problems.append(f"{c['name']}: runAsNonRoot")
        if (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            problems.append(f"{c['name']}: seccompProfile")
    return problems


def test_builtin_engines_their_model_fetch_and_the_l2_redis_meet_the_restricted_level():
    """They run fleetserve's own image (uid 10001) or Redis, yet had no container security context: a namespace
    enforcing the restricted level refused them, and Redis ran as root (its `command` replaced the entrypoint
    that drops to the redis user) with every default capability."""
    doc = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "r", "namespace": "ns"},
           "spec": {"model": {"name": "m", "source": "hf:org/model"}, "kvCache": {"l2": {"enabled": True}}}}
    rendered, _ = _objects(doc)
    (engine,) = [o for o in rendered.objects if o["kind"] == "Deployment" and "engine" in o["metadata"]["name"]]
    (redis,) = _by(rendered, "StatefulSet")
    engine_pod, redis_pod = engine["spec"]["template"]["spec"], redis["spec"]["template"]["spec"]
    assert [c["name"] for c in engine_pod["initContainers"]] == ["fetch-model"]
    assert _meets_restricted(engine_pod) == [] and _meets_restricted(redis_pod) == []
    assert redis_pod["securityContext"]["runAsUser"] == 999
    assert redis_pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"]  # it keeps no file
    assert validate(engine) == [] and validate(redis) == []
    doc["spec"]["engine"] = {"image": "registry.example.com/our-engine:1"}  # the user's image: its user, its rules
    rendered, _ = _objects(doc)
    (engine,) = [o for o in rendered.objects if o["kind"] == "Deployment" and "engine" in o["metadata"]["name"]]
    assert "securityContext" not in engine["spec"]["template"]["spec"]["containers"][0]


def test_karpenter_durations_are_whole_minutes_and_seconds_as_its_crd_asks():
    """A 90 s budget rendered `duration: 90s`, which Karpenter v1's NodePool CRD refuses (its pattern takes whole
    minutes): the apply failed, and the operator retried the same error for ever, without a word at render."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["capacity"]["consolidation"] = {"consolidateAfter": 45.5, "budgets": [
        {"nodes": "0", "schedule": "0 9 * * *", "durationSeconds": 90, "timezone": "UTC"},
        {"nodes": "1", "schedule": "0 18 * * *", "durationSeconds": 5400, "timezone": "UTC"}]}
    rendered, _ = _objects(doc)
    for pool in _by(rendered, "NodePool"):
        disruption = pool["spec"]["disruption"]
        assert [b["duration"] for b in disruption["budgets"]] == ["2m", "90m"]
        assert disruption["consolidateAfter"] == "46s"
        assert validate(pool) == []
    warned = {w.path: w.message for w in rendered.warnings}
    assert "whole minutes; rendered as 2 min" in warned["spec.capacity.consolidation.budgets[0].durationSeconds"]
    assert "spec.capacity.consolidation.budgets[1].durationSeconds" not in warned
    assert "46 s" in warned["spec.capacity.consolidation.consolidateAfter"]


@pytest.mark.parametrize("cron, end, lead_s, shifted", [
    ("0 9 * * 1-5", "0 17 * * 1-5", 600, "50 8 * * 1-5"),
    ("0 0 * * 1", "0 6 * * 1", 600, "50 23 * * 0"),  # across midnight: the weekday moves with it
    ("30 0 * * 1-5", "0 6 * * 1-5", 3600, "30 23 * * 0,1,2,3,4"),
    ("0 9 * * 1", "0 17 * * 1", 86400, "0 9 * * 0"),
    ("0 0 * * *", "0 6 * * *", 60, "59 23 * * *"),  # every day stays every day
    ("0 0 1 * *", "0 6 1 * *", 600, None),  # the 1st less ten minutes is a month's last day: no cron says it
    ("0 0 * 6 *", "0 6 * 6 *", 60, None),
    ("0,30 9 * * *", "15,45 9 * * *", 60, None),
])
def test_a_floors_lead_moves_its_start_across_midnight_as_the_local_controller_does(cron, end, lead_s, shifted):
    """A start at 00:00 Monday with a 10-minute lead was left on time on Kubernetes (with a warning), while the
    local controller and the simulator raised the floor at 23:50 Sunday."""
    from fleetserve.autoscale.schedule import Cron
    from fleetserve.k8s.keda import shift_earlier

    assert shift_earlier(Cron.parse(cron), lead_s) == shifted
    doc = copy.deepcopy(FULL)
    auto = doc["spec"]["autoscaling"]
    auto["scheduleLeadTime"] = lead_s
    auto["schedules"] = [{"name": "w", "timezone": "UTC", "start": cron, "end": end, "minReplicas": 1}]
    rendered, _ = _objects(doc)
    (so,) = _by(rendered, "ScaledObject", "chat-engine-t0")
    (trigger,) = [t for t in so["spec"]["triggers"] if t["type"] == "cron"]
    assert trigger["metadata"]["start"] == (shifted or cron)
    assert any("cannot move" in str(w) for w in rendered.warnings) == (shifted is None)


def test_keda_rounding_warnings_name_the_specs_fields():
    """They named the policy's attributes (`spec.autoscaling: down_window=10.5s`), which no spec has."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["autoscaling"].update(cooldownPeriod=600.5, scaleDownStabilizationTime=240.5)
    warned = {w.path: w.message for w in _objects(doc)[0].warnings}
    assert warned["spec.autoscaling.cooldownPeriod"].startswith("600.5s is rounded down")
    assert warned["spec.autoscaling.scaleDownStabilizationTime"].startswith("240.5s is rounded down")
    assert "spec.autoscaling" not in warned


def test_render_leaves_out_the_instance_types_the_local_fleet_never_places_on():
    """`capacity.allowLargerInstances` was honoured by `fleetserve up` and the simulator only: render k8s offered
    p5.48xlarge to a 1-GPU replica, and Karpenter packed replicas onto 8-GPU nodes that `plan` never priced. A type
    no replica fits (larger without the flag, or too small) is left out of the NodePools and the pods' affinity; a
    spec with none left is refused with the reason, as `validate` says "no replica would start"."""
    import pytest

    from fleetserve.k8s.render import render
    from fleetserve.spec.load import load_spec_data

    def endpoint(types: list[str], **capacity):
        return load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "big"},
                               "spec": {"model": {"source": "catalog:llama-3.1-8b-instruct"},
                                        "engine": {"kind": "vllm", "gpus": 1}, "capacity": capacity,
                                        "placement": {"instanceTypes": types}}}).endpoint

    def pools(rendered) -> list[list[str]]:
        return [next(r["values"] for r in o["spec"]["template"]["spec"]["requirements"]
                     if r["key"] == "node.kubernetes.io/instance-type")
                for o in rendered.objects if o["kind"] == "NodePool"]

    assert pools(render(endpoint(["p5.48xlarge", "g5.xlarge"]))) == [["g5.xlarge"]]
    engines = [o for o in render(endpoint(["p5.48xlarge", "g5.xlarge"])).objects if o["kind"] == "Deployment"
               and "p5.48xlarge" in str(o)]
    assert not engines
    assert pools(render(endpoint(["p5.48xlarge", "g5.xlarge"], allowLargerInstances=True))) == \
        [["p5.48xlarge"], ["g5.xlarge"]]
    # a tier left out keeps the others' names: renumbered, t1 had become g6.xlarge's NodePool, and on an upgrade
    # its running g5.12xlarge nodes drifted
    three = render(endpoint(["g5.xlarge", "g5.12xlarge", "g6.xlarge"]))
    def short(name: str) -> str:  # a NodePool's default-big-DIGEST-tK read as default-big-tK
        return re.sub(r"^default-big-[0-9a-f]{6}-", "default-big-", name)

    named = {short(o["metadata"]["name"]): o for o in three.objects if o["kind"] in ("NodePool", "Deployment")}
    assert {"default-big-t0", "default-big-t2", "big-engine-t0", "big-engine-t2"} <= set(named), sorted(named)
    assert not any(n.endswith("-t1") for n in named)
    assert pools(three) == [["g5.xlarge"], ["g6.xlarge"]]
    assert next(r["values"] for r in named["default-big-t2"]["spec"]["template"]["spec"]["requirements"]
                if r["key"] == "node.kubernetes.io/instance-type") == ["g6.xlarge"]
    assert named["big-engine-t2"]["metadata"]["labels"]["fleetserve.io/tier"] == "2"
    first_out = {short(o["metadata"]["name"]) for o in render(endpoint(["p5.48xlarge", "g5.xlarge"])).objects}
    assert "big-engine-t1" in first_out and "default-big-t1" in first_out  # not renamed to the one-tier name
    last_out = {o["metadata"]["name"] for o in render(endpoint(["g5.xlarge", "p5.48xlarge"])).objects
                if o["kind"] == "Deployment"}
    assert "big-engine-t0" in last_out and "big-engine" not in last_out  # the name it had with both tiers
    with pytest.raises(ValueError, match=r"spec.placement: no listed instance type \(p5.48xlarge\).*"
                                         r"no replica would start.*allowLargerInstances"):
        render(endpoint(["p5.48xlarge"]))


def test_strings_kubernetes_would_read_as_numbers_are_quoted_in_the_files():
    """PyYAML (YAML 1.1) wrote `7e1`, `1e-5`, `0o17` and `+1e3` unquoted; Kubernetes' go-yaml reads them as numbers,
    and kubectl refused every file with such a label, version or env value ("cannot unmarshal number")."""
    from fleetserve.k8s.render import render, to_yaml
    from fleetserve.spec.load import load_spec_data

    endpoint = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint",
                               "metadata": {"name": "numeric", "labels": {"build": "7e1"}},
                               "spec": {"model": {"name": "smollm2", "version": "7e1",
                                                  "source": "builtin:smollm2-135m"},
                                        "engine": {"kind": "builtin", "env": {"EPSILON": "1e-5", "MODE": "0o17"}},
                                        "replicas": 1}}).endpoint
    text = "\n".join(to_yaml(o) for o in render(endpoint).objects)
    for value in ("7e1", "1e-5", "0o17"):
        assert f": {value}\n" not in text and f"- {value}\n" not in text, value
    for obj in render(endpoint).objects:  # every string stays a string when read back
        assert yaml.safe_load(to_yaml(obj)) == obj
    assert to_yaml({"a": "+1e3", "b": "yes", "c": "plain", "d": "v1e3"}) == "a: '+1e3'\nb: 'yes'\nc: plain\nd: v1e3\n"


def test_the_unschedulable_alert_reads_this_endpoints_pods_only():
    """`NAME-engine-.*` matched the pods of an endpoint named NAME-engine in the same namespace (its pods are
    NAME-engine-engine-HASH-XXXXX): its Pending pods fired this endpoint's alert."""
    import re

    one = copy.deepcopy(FULL)
    one["spec"]["placement"] = {"instanceTypes": ["ml.g5.xlarge"]}  # one tier: NAME-engine
    rendered, _ = _objects(one)
    rules = yaml.safe_dump(_by(rendered, "PrometheusRule")[0]["spec"])
    (owner,) = set(re.findall(r'owner_name=~"([^"]+)"', rules))  # by the pods' ReplicaSet
    name = FULL["metadata"]["name"]
    assert re.fullmatch(owner, f"{name}-engine-6d4cf56db6")
    assert not re.fullmatch(owner, f"{name}-engine-engine-6d4cf56db6")  # the other endpoint's


def test_a_trigger_target_reaches_keda_exactly():
    """`target: 1234.5678` rendered threshold '1234.57' (and 1234567.5 '1.23457e+06'): KEDA scaled on another
    number than the local controller and the simulator."""
    from fleetserve.k8s.context import num

    assert [num(v) for v in (4.0, 1234.5678, 1234567.5, 0.001, 1e12)] == [
        "4", "1234.5678", "1234567.5", "0.001", "1000000000000"]
    assert all(float(num(v)) == v for v in (1234.5678, 1234567.5, 0.1 + 0.2, 2 / 3))


def test_cron_macros_karpenter_and_keda_take_are_read_as_the_fields_they_stand_for():
    """A budget `schedule: "@daily"`, which Karpenter's pattern takes, was refused: "needs 5 fields"."""
    from fleetserve.autoscale.schedule import Cron

    assert Cron.parse("@daily") == Cron.parse("0 0 * * *") and Cron.parse("@WEEKLY") == Cron.parse("0 0 * * 0")
    doc = copy.deepcopy(FULL)
    doc["spec"]["capacity"]["consolidation"]["budgets"] = [
        {"nodes": "0", "schedule": "@daily", "durationSeconds": 3600, "timezone": "Asia/Kolkata"}]
    rendered, _ = _objects(doc)
    (budget,) = _by(rendered, "NodePool")[0]["spec"]["disruption"]["budgets"]
    assert budget["schedule"] == "30 18 * * *"  # midnight in Kolkata, written in UTC


@pytest.mark.parametrize("written, rendered_as", [
    ("0 9 * * 7", "0 9 * * 0"), ("0 9 * * 5-7", "0 9 * * 0,5,6"), ("0 9 * * 0-7", "0 9 * * 0,1,2,3,4,5,6"),
    ("0 9 * * 1-7/2", "0 9 * * 0,1,3,5"), ("0 9 * * sun", "0 9 * * sun"), ("0 9 * * 1-5", "0 9 * * 1-5"),
    ("0 9 * * 1/3", "0 9 * * 1/3"), ("0 9 * * 5/2", "0 9 * * 5/2"), ("0 9 * * 5/1", "0 9 * * 5/1"),
])
def test_sunday_written_7_reaches_keda_and_karpenter_as_0(written, rendered_as):
    """Cron takes 7 for Sunday, and validate passed it; KEDA's cron scaler and Karpenter's budget schedules
    (robfig/cron: day of week 0-6) refuse it, so the ScaledObject (scaling included) and the budget failed."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["autoscaling"]["scheduleLeadTime"] = 0
    doc["spec"]["autoscaling"]["schedules"] = [{"name": "w", "timezone": "UTC", "start": written,
                                                "end": written.replace("0 9", "0 18", 1), "minReplicas": 1}]
    doc["spec"]["capacity"]["consolidation"]["budgets"] = [
        {"nodes": "0", "schedule": written, "durationSeconds": 3600, "timezone": "UTC"}]
    rendered, _ = _objects(doc)
    (so,) = _by(rendered, "ScaledObject", "chat-engine-t0")
    (trigger,) = [t for t in so["spec"]["triggers"] if t["type"] == "cron"]
    assert (trigger["metadata"]["start"], trigger["metadata"]["end"]) == (
        rendered_as, rendered_as.replace("0 9", "0 18", 1))
    (budget,) = _by(rendered, "NodePool")[0]["spec"]["disruption"]["budgets"]
    assert budget["schedule"] == rendered_as
    # the days the local controller and the simulator hold are the days robfig/cron reads in the rendered text
    from fleetserve.autoscale.schedule import Cron

    def robfig_days(field: str) -> set[int]:  # day of week 0-6; `N/step` runs to 6
        days: set[int] = set()
        for part in field.split(","):
            if part.isalpha():
                days.add("sun mon tue wed thu fri sat".split().index(part[:3].lower()))
                continue
            rng, _, step = part.partition("/")
            lo, _, hi = rng.partition("-")
            days |= set(range(int(lo), int(hi or (6 if step else lo)) + 1, int(step or 1)))
        return days

    assert Cron.parse(written).weekdays == robfig_days(rendered_as.split()[4])


def test_a_step_from_a_start_past_saturday_is_refused_and_n_slash_1_runs_to_the_end_as_robfig_reads_it():
    from fleetserve.autoscale.schedule import Cron, ScheduleError

    with pytest.raises(ScheduleError, match="7/2 starts past Saturday"):
        Cron.parse("0 9 * * 7/2")
    assert Cron.parse("0 8/1 * * *").hours == frozenset(range(8, 24))  # robfig: N/step is N to the field's end


def test_endpoints_whose_namespace_and_name_join_alike_get_nodepools_of_their_own(tmp_path):
    """`team-a`/`chat` and `team`/`a-chat` both made NodePool `team-a-chat-t0` (cluster-wide): the second apply took
    the first endpoint's pool, and its pods never got a node. Both now render into one folder, pools apart."""
    def pools(namespace: str, name: str) -> set[str]:
        doc = copy.deepcopy(FULL)
        doc["metadata"].update(namespace=namespace, name=name)
        rendered, _ = _objects(doc)
        write(rendered, tmp_path / "cluster")  # cluster-wide objects of both meet in one folder without a clash
        return {o["metadata"]["name"] for o in rendered.objects if o["kind"] == "NodePool"}

    first, second = pools("team-a", "chat"), pools("team", "a-chat")
    assert first and second and not first & second, (first, second)
    assert all(n.startswith("team-a-chat-") and len(n) <= 63 for n in first | second)


def test_a_change_of_the_served_models_context_rolls_the_routers():
    """At zero the router refuses what its cached model card's max_model_len cannot hold; on Kubernetes nothing
    restarted it when the engines' context grew, and it refused at zero what the new engines take."""
    def digest(change) -> str:
        doc = copy.deepcopy(FULL)
        change(doc["spec"])
        rendered, _ = _objects(doc)
        (router,) = _by(rendered, "Deployment", "chat-router")
        return router["spec"]["template"]["metadata"]["annotations"]["fleetserve.io/model-config"]

    same = digest(lambda s: None)
    assert digest(lambda s: s["model"].update(contextLength=16384)) != same
    assert digest(lambda s: s["engine"].update(args=["--enforce-eager"])) != same
    assert digest(lambda s: s.update(replicas=5)) == same  # what leaves the card alone rolls nothing


def test_node_affinity_terms_a_nodepool_cannot_carry_are_said():
    """(g5 AND zone a) OR (g6 AND zone b): each NodePool dropped the zones and the pairing, silently."""
    doc = copy.deepcopy(FULL)
    doc["spec"]["placement"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [kind]},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]}]}
            for kind, zone in (("g5.xlarge", "us-west-2a"), ("g6.xlarge", "us-west-2b"))]}}}
    rendered, _ = _objects(doc)
    said = [w for w in rendered.warnings if "nodeSelectorTerms" in w.path]
    assert len(said) == 1 and "alternatives" in said[0].message
    engines = [o for o in rendered.objects if o["kind"] == "Deployment" and "engine" in o["metadata"]["name"]]
    assert engines
    for dep in engines:
        terms = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert len(terms) == 2  # the pods keep both


@pytest.mark.skipif(__import__("shutil").which("promtool") is None, reason="promtool not installed")
def test_the_overflow_tier_waits_the_whole_ttl_before_it_takes_a_pending_pod(tmp_path):
    """kube-state-metrics writes kube_pod_status_unschedulable only while a pod is unschedulable, so a
    min_over_time over the TTL was 1 from the pod's first sample: a pod waiting a minute for Karpenter's node
    started a second, dearer node on the next tier at every cold start."""
    import subprocess

    rendered, loaded = _objects(FULL)  # two tiers, the default 180 s TTL
    assert loaded.endpoint.spec.capacity.unavailable_offering_ttl == 180
    tiers = sorted(d["metadata"]["name"] for d in _by(rendered, "Deployment")
                   if d["metadata"]["labels"]["app.kubernetes.io/component"] == "engine")
    query = _by(rendered, "ScaledObject", tiers[1])[0]["spec"]["triggers"][0]["metadata"]["query"]
    pod = 'namespace="team-b",pod="{}"'
    owner = 'kube_pod_owner{{{},owner_kind="ReplicaSet",owner_name="{}"}}'
    series = [  # minutes 0-5 at 15 s: a placed pod, then a new one Pending from 5 min; tier 1's own pod Pending
        (f"kube_pod_status_unschedulable{{{pod.format('p-new')}}}", "_x20 1x40"),
        (owner.format(pod.format("p-old"), f"{tiers[0]}-6d4cf56db6"), "1x60"),
        (owner.format(pod.format("p-new"), f"{tiers[0]}-6d4cf56db6"), "1x60"),
        (f"kube_pod_status_unschedulable{{{pod.format('q-own')}}}", "1x60"),
        (owner.format(pod.format("q-own"), f"{tiers[1]}-7f9b8c6d5e"), "1x60")]
    # Pending 30 s, 120 s, 165 s: Karpenter's node may still come; 180 s, the whole TTL: the offering is short
    expect = {"5m30s": 0, "7m": 0, "7m45s": 0, "8m": 1, "9m": 1}

    def case(pending_values: str) -> dict:
        inputs = [(s, pending_values if "p-new" in s and "unschedulable" in s else v) for s, v in series]
        return {"interval": "15s", "input_series": [{"series": s, "values": v} for s, v in inputs],
                "promql_expr_test": [{"expr": query, "eval_time": t, "exp_samples": [{"labels": "{}", "value": v}]}
                                     for t, v in expect.items()]}

    # the second: kube-state-metrics missed a scrape at 6 min (a restart): the gap had started the count again
    tests = [case("_x20 1x40"), case("_x20 1x3 stale 1x36")]
    (tmp_path / "rules.yml").write_text("groups: []\n")
    (tmp_path / "t.yml").write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "tests": tests}))
    done = subprocess.run(["promtool", "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(__import__("shutil").which("promtool") is None, reason="promtool not installed")
def test_the_unschedulable_alert_waits_for_the_last_tier(tmp_path):
    """A tier-0 pod Pending while the overflow tier serves for it is the design, not "cannot be placed on any
    tier": the alert counted every tier's Pending pods and fired in every shortage over 15 minutes."""
    import subprocess

    rendered, _ = _objects(FULL)
    (expr,) = [r["expr"] for g in _by(rendered, "PrometheusRule")[0]["spec"]["groups"] for r in g["rules"]
               if r.get("alert") == "FleetserveEngineUnschedulable"]
    tiers = {d["metadata"]["labels"]["fleetserve.io/tier"]: d["metadata"]["name"] for d in _by(rendered, "Deployment")
             if d["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"}

    def pending(tier: str, pod: str) -> list[tuple[str, str]]:
        where = f'namespace="team-b",pod="{pod}"'
        return [(f"kube_pod_status_unschedulable{{{where}}}", "1x60"),
                (f'kube_pod_owner{{{where},owner_kind="ReplicaSet",owner_name="{tiers[tier]}-6d4cf56db6"}}', "1x60")]

    def case(series, fires: bool) -> dict:
        return {"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
                "promql_expr_test": [{"expr": expr, "eval_time": "30m",
                                      "exp_samples": [{"labels": "{}", "value": 1}] if fires else []}]}

    def deployments(asked: int, ready0: int, ready1: int) -> list[tuple[str, str]]:
        d = 'namespace="team-b",deployment="{}"'
        return [(f"kube_deployment_spec_replicas{{{d.format(tiers['0'])}}}", f"{asked}x60"),
                (f"kube_deployment_status_replicas_available{{{d.format(tiers['0'])}}}", f"{ready0}x60"),
                (f"kube_deployment_status_replicas_available{{{d.format(tiers['1'])}}}", f"{ready1}x60")]

    (tmp_path / "rules.yml").write_text("groups: []\n")
    (tmp_path / "t.yml").write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "tests": [
        case(pending("0", "a-0"), fires=False), case(pending("0", "a-0") + pending("1", "b-0"), fires=True),
        # the overflow serves in full: no alert; it does not take them (KEDA down, its maximum reached): the alert
        case(pending("0", "a-0") + deployments(3, 1, 2), fires=False),
        case(pending("0", "a-0") + deployments(3, 1, 0), fires=True)]}))
    done = subprocess.run(["promtool", "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_users_label_under_fleetserve_io_never_reaches_the_objects():
    """`fleetserve.io/discovery: pods` in metadata.labels went onto every Service: the ServiceMonitors, which select
    Services without that label, matched none (nothing scraped, every built-in scaling query empty), while the
    warning said fleetserve's value replaced the user's."""
    data = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint",
            "metadata": {"name": "a", "labels": {"fleetserve.io/discovery": "pods", "fleetserve.io/endpoint": "x",
                                                 "team": "search"}},
            "spec": {"model": {"source": "builtin:smollm2-135m"}, "kvCache": {"l2": {"enabled": True}}}}
    rendered = render(load_spec_data(data).endpoint)
    for obj in rendered.objects:
        mine = obj["metadata"].get("labels", {})
        assert mine.get("team") == "search", obj["metadata"]["name"]  # the user's own labels still go on
        assert mine.get("fleetserve.io/endpoint") != "x", obj["metadata"]["name"]
    services = [o for o in rendered.objects if o["kind"] == "Service"]
    scraped = [o["metadata"]["name"] for o in services if "fleetserve.io/discovery" not in o["metadata"]["labels"]]
    assert {"a-engine", "a-router"} <= set(scraped), scraped
    assert any(w.path == "metadata.labels.fleetserve.io/discovery" for w in rendered.warnings), rendered.warnings


def test_a_mount_at_a_path_the_engine_container_mounts_already_is_refused_naming_the_field():
    """`pod.volumeMounts` at /models (the built-in engine's model volume) rendered two mounts at one path: the API
    server refused the Deployment."""
    data = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "a"},
            "spec": {"model": {"source": "builtin:smollm2-135m"},
                     "pod": {"volumes": [{"name": "x", "emptyDir": {}}],
                             "volumeMounts": [{"name": "x", "mountPath": "/models/"}]}}}
    with pytest.raises(ValueError, match=r"spec\.pod\.volumeMounts\[0\]\.mountPath: '/models/' is where the engine "
                                         r"container mounts its 'model' volume"):
        render(load_spec_data(data).endpoint)
    data["spec"]["pod"]["volumeMounts"][0]["mountPath"] = "/data"
    render(load_spec_data(data).endpoint)


def test_an_affinity_that_asks_for_capacity_the_spec_does_not_list_is_named_for_it():
    """Spot only in the node affinity beside the default capacityTypes [on-demand]: validate said nothing, and render
    refused with "no listed instance type () can take a replica of 1 GPU(s)", as if the size were the fault."""
    data = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "a"},
            "spec": {"model": {"source": "builtin:smollm2-135m"}, "engine": {"kind": "vllm", "gpus": 1},
                     "placement": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                         "nodeSelectorTerms": [{"matchExpressions": [
                             {"key": "node.kubernetes.io/instance-type", "operator": "In",
                              "values": ["g5.xlarge", "g6.xlarge"]},
                             {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]}]}}}}}
    loaded = load_spec_data(data)
    (note,) = [w for w in loaded.warnings if w.path == "spec.placement.nodeAffinity"]
    assert "only as spot capacity" in note.message and "add spot to capacity.capacityTypes" in note.message
    with pytest.raises(ValueError, match=r"spec\.placement\.nodeAffinity: allows instance types only as spot"):
        render(loaded.endpoint)
    data["spec"]["capacity"] = {"capacityTypes": ["spot"]}
    loaded = load_spec_data(data)
    assert not [w for w in loaded.warnings if w.path == "spec.placement.nodeAffinity"]
    render(loaded.endpoint)


def test_a_tenant_host_that_is_no_service_name_is_refused_naming_the_field():
    """`redis://9redis` rendered Services `9redis` and `9redis-headless`, which the API server refuses (a Service
    name starts with a letter): the operator retried them every 30 s, holding back the rest of its pass."""
    from fleetserve.cli.console import render_refusal

    doc = copy.deepcopy(BUILTIN_TENANTS)
    doc["spec"]["kvCache"]["l2"]["tenantUrls"] = {"alpha": "redis://9redis:6379/0"}
    with pytest.raises(ValueError) as refused:
        _objects(doc)
    (problem,) = render_refusal(refused.value).problems
    assert problem.path == "spec.kvCache.l2.tenantUrls[alpha]" and "starts with a letter" in problem.message
    doc["spec"]["kvCache"]["l2"]["tenantUrls"] = {"alpha": "redis://r9:6379/0"}
    assert {s["metadata"]["name"] for s in _by(_objects(doc)[0], "Service")} >= {"r9", "r9-headless"}


@pytest.mark.parametrize("command,args", [
    (["/bin/bash", "-c"], ["vllm serve /opt/ml/model --port 8000"]),
    (["sh", "-c", "exec python3 -m vllm.entrypoints.openai.api_server --model /opt/ml/model"], []),
])
def test_a_hyperpod_shell_wrapper_with_one_command_line_runs_that_line_with_the_adapters_flags(command, args):
    """`bash -c "vllm serve ..."` as worker.command/args: our flags had replaced the script and landed after
    `bash -c` (bash: --: invalid option), the pod crash-looping while render exited 0."""
    from tests.spec.test_hyperpod import AUDIT

    doc = yaml.safe_load(AUDIT)
    doc["spec"]["worker"].update(command=command, args=args)
    rendered, loaded = _objects(doc)
    (deployment,) = _by(rendered, "Deployment", "audit-engine")
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["vllm"] and c["args"][:2] == ["serve", "/opt/ml/model/llama"]
    assert c["args"][c["args"].index("--port") + 1] == "8000" and "--served-model-name" in c["args"]
    notes = [w.message for w in loaded.warnings if w.path == "spec.worker.command"]
    assert len(notes) == 1 and "read as that command line" in notes[0], notes


def test_a_shell_script_that_does_more_than_launch_the_engine_is_refused_naming_the_command():
    """`pip install ... && vllm serve ...`: flags after the script are its $0, $1, ..., so the pod served without
    the model's name, prefix caching or tensor parallelism, with no warning."""
    from fleetserve.spec.errors import SpecError
    from tests.spec.test_hyperpod import AUDIT

    doc = yaml.safe_load(AUDIT)
    doc["spec"]["worker"].update(command=["/bin/sh", "-c", "pip install foo && exec vllm serve /opt/ml/model"],
                                 args=[])
    with pytest.raises(SpecError) as caught:
        load_spec_data(doc)
    (problem,) = caught.value.problems
    assert problem.path == "spec.worker.command" and "shell script" in problem.message
    assert "vllm serve" in problem.message  # what to write instead
    native = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "sh"},
              "spec": {"model": {"name": "m", "source": "hf:org/m"},
                       "engine": {"kind": "sglang", "gpus": 1, "command": ["bash", "-lc"], "args": ["x"]}}}
    with pytest.raises(SpecError) as caught:
        load_spec_data(native)
    assert [p.path for p in caught.value.problems] == ["spec.engine.command"]


def test_lmcache_settings_in_the_engine_env_that_the_adapter_writes_over_are_warned():
    """LMCACHE_CHUNK_SIZE=512 in engine.env rendered as 256 (kvCache.blockSize) without a word."""
    doc = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "lm"},
           "spec": {"model": {"name": "m", "source": "hf:org/m"},
                    "engine": {"kind": "vllm", "gpus": 1,
                               "env": {"LMCACHE_CHUNK_SIZE": "512", "PYTHONHASHSEED": "42", "LOG_LEVEL": "debug",
                                       "LMCACHE_REMOTE_URL": "redis://x:6379"}},
                    "kvCache": {"l1": {"enabled": True}}}}
    rendered, _ = _objects(doc)
    warned = {w.path: w.message for w in rendered.warnings if w.path.startswith("spec.engine.env.")}
    # no L2 here: the adapter writes no LMCACHE_REMOTE_URL, so the user's stands
    assert set(warned) == {"spec.engine.env.LMCACHE_CHUNK_SIZE", "spec.engine.env.PYTHONHASHSEED"}, warned
    assert "kvCache.blockSize" in warned["spec.engine.env.LMCACHE_CHUNK_SIZE"] and "'512'" in \
        warned["spec.engine.env.LMCACHE_CHUNK_SIZE"]
    (deployment,) = [d for d in _by(rendered, "Deployment") if d["metadata"]["name"] == "lm-engine"]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LMCACHE_CHUNK_SIZE"] == "256" and env["LOG_LEVEL"] == "debug"
    assert env["LMCACHE_REMOTE_URL"] == "redis://x:6379"


def test_a_scale_to_zero_endpoint_whose_triggers_ask_another_prometheus_is_warned_about_its_wake_up():
    """The triggers that wake an endpoint from zero ask --prometheus-url (in-cluster by default); with the user's
    triggers on an Amazon Managed Prometheus workspace nothing said that the wake-up asked a server that may not
    exist."""
    amp = "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1"
    doc = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "z"},
           "spec": {"model": {"name": "m", "source": "hf:org/m"}, "engine": {"kind": "vllm", "gpus": 1},
                    "autoscaling": {"minReplicaCount": 0, "maxReplicaCount": 2, "triggers": [
                        {"metric": "prometheus", "query": "sum(rate(x[1m]))", "target": 5, "serverAddress": amp}]}}}
    loaded = load_spec_data(copy.deepcopy(doc))
    warned = [w.message for w in render(loaded.endpoint).warnings if "never wakes" in w.message]
    assert len(warned) == 1 and amp in warned[0], warned
    told = render(loaded.endpoint, RenderOptions(prometheus_url=amp)).warnings
    assert not [w for w in told if "never wakes" in w.message]


def test_each_required_term_keeps_its_own_instance_types_and_zone_only_narrows_its_zones():
    """Two alternative terms (us-west-2a: g5.xlarge or g5.2xlarge; us-west-2b: g5.xlarge): each pod term had
    admitted every type of the tier, and `--zone` replaced the spec's zones instead of narrowing them."""
    from fleetserve.spec.load import load_spec_data

    def term(zone, *types):
        return {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]},
                                     {"key": "node.kubernetes.io/instance-type", "operator": "In",
                                      "values": list(types)}]}

    doc = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "az"},
           "spec": {"model": {"name": "m", "source": "hf:org/m"}, "engine": {"kind": "vllm", "gpus": 1},
                    "placement": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [term("us-west-2a", "ml.g5.xlarge", "ml.g5.2xlarge"),
                                              term("us-west-2b", "ml.g5.xlarge")]}}}}}
    loaded = load_spec_data(copy.deepcopy(doc))

    def pod_terms(rendered):
        (deployment,) = [d for d in _by(rendered, "Deployment") if d["metadata"]["name"] == "az-engine"]
        terms = deployment["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        return [{e["key"].rsplit("/", 1)[-1]: sorted(e["values"]) for e in t["matchExpressions"]} for t in terms]

    terms = pod_terms(render(loaded.endpoint))
    assert [(t["zone"], t["instance-type"]) for t in terms] == [
        (["us-west-2a"], ["g5.2xlarge", "g5.xlarge"]), (["us-west-2b"], ["g5.xlarge"])]
    narrowed = render(loaded.endpoint, RenderOptions(zones=("us-west-2a", "us-west-2c")))
    assert [(t["zone"], t["instance-type"]) for t in pod_terms(narrowed)] == [
        (["us-west-2a"], ["g5.2xlarge", "g5.xlarge"])]  # 2b is not in --zone: that term is left out, and said
    assert any("nodeSelectorTerms[1]" in w.path and "left out" in w.message for w in narrowed.warnings)
    with pytest.raises(ValueError, match=r"--zone us-west-2c: none is a zone .*us-west-2a, us-west-2b"):
        render(loaded.endpoint, RenderOptions(zones=("us-west-2c",)))


def test_a_window_whose_floor_is_not_above_min_replica_count_renders_no_cron_trigger_and_is_named():
    """KEDA's cron scaler is active for its whole window whatever desiredReplicas says (kedacore/keda#5586): a window
    of minReplicas 0 over minReplicaCount 0 held a GPU replica up from zero all window long, where the local
    controller and the simulator, which hold a floor only above minReplicaCount, did nothing."""
    from fleetserve.spec.effects import inert_settings

    doc = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "w"},
           "spec": {"model": {"name": "m", "source": "hf:meta-llama/Llama-3.1-8B-Instruct"},
                    "engine": {"kind": "vllm", "gpus": 1},
                    "autoscaling": {"minReplicaCount": 0, "maxReplicaCount": 3, "schedules": [
                        {"name": "none", "start": "0 9 * * 1-5", "end": "0 17 * * 1-5", "minReplicas": 0},
                        {"name": "rush", "start": "0 18 * * *", "end": "0 19 * * *", "minReplicas": 2}]}}}
    rendered, loaded = _objects(doc)
    crons = [t for t in _by(rendered, "ScaledObject")[0]["spec"]["triggers"] if t["type"] == "cron"]
    assert [t["metadata"]["desiredReplicas"] for t in crons] == ["2"]
    policy = ScalingPolicy.from_spec(loaded.endpoint.spec.autoscaling)
    assert policy.floor(datetime(2026, 12, 7, 10, 0, tzinfo=UTC).timestamp()) == 0  # Monday 10:00: no floor here
    (note,) = [n for n in inert_settings(loaded.endpoint) if "schedules" in n.path]
    assert note.path == "spec.autoscaling.schedules[0].minReplicas" and "'none' changes nothing" in note.message


def test_a_short_initial_cooldown_beside_starting_replicas_is_named():
    """KEDA counts initialCooldownPeriod from the ScaledObject's creation, before the replicas load: with 0 s a
    fleet `up` had just said ready went to zero 30 ms later, without a word from validate."""
    from fleetserve.spec.effects import inert_settings

    def notes(auto: dict, replicas: int = 1):
        doc = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "w"},
               "spec": {"model": {"name": "m", "source": "hf:meta-llama/Llama-3.1-8B-Instruct"},
                        "engine": {"kind": "vllm", "gpus": 1}, "replicas": replicas,
                        "autoscaling": {"minReplicaCount": 0, "maxReplicaCount": 3, **auto}}}
        return [n for n in inert_settings(load_spec_data(doc).endpoint)
                if n.path == "spec.autoscaling.initialCooldownPeriod"]

    (note,) = notes({"initialCooldownPeriod": 0})
    assert "goes to zero 0s after it starts" in note.message and note.everywhere
    assert notes({}) == [] and notes({"initialCooldownPeriod": 0}, replicas=0) == []
    assert notes({"initialCooldownPeriod": 0, "minReplicaCount": 1}) == []

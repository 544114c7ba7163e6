"""The live routing policy decides the same in the simulator and in the gateway on the same snapshots.

A simulation records every decision (request, snapshot, replica states, KV index). The recording is then
replayed into a fresh policy as the gateway builds it (`create_policy(strategy, session_key=...)`), with the
snapshot built the gateway's way: `BackendPool` backends carrying the recorded counters, `Backend.view()`,
and the per-replica limit of `router.admission.limit_views`. Snapshots and choices must be identical.
"""

import copy

import pytest

from fleetserve.router import feedback
from fleetserve.router.admission import limit_views
from fleetserve.router.policies import FleetSnapshot, create_policy
from fleetserve.router.pool import BackendPool
from fleetserve.sim.fleet import SimFleet
from fleetserve.sim.run import engine_block
from fleetserve.sim.setup import SimOptions
from fleetserve.sim.workload import build_workload
from fleetserve.spec.load import load_spec_data


class Recorder:
    def __init__(self, policy, fleet):
        self.policy = policy
        self.name = policy.name
        self.fleet = fleet
        self.log = []
        self.predictions = {}

    def choose(self, request, snapshot):
        states = {r.id: r.state for r in self.fleet.replicas}
        index = copy.deepcopy(snapshot.kv_index)
        choice = self.policy.choose(request, snapshot)
        if choice is not None and choice.prediction is not None:
            self.predictions[id(choice.prediction)] = len(self.log)
        self.log.append((request, snapshot, states, index, choice.replica.id if choice else None))
        return choice

    def observe(self, prediction, cached_tokens, prompt_tokens=None):
        """A response's usage (router.feedback.report), replayed into the gateway's policy in order."""
        self.log.append(("observe", self.predictions[id(prediction)], prediction, cached_tokens, prompt_tokens))
        self.policy.observe(prediction, cached_tokens, prompt_tokens)


def endpoint(strategy: str, limit: int | None):
    spec = {"model": {"source": "hf:meta-llama/Llama-3.1-8B-Instruct"}, "replicas": 3,
            "placement": {"instanceTypes": ["g6e.xlarge"]}, "routing": {"strategy": strategy},
            "autoscaling": {"minReplicaCount": 2, "maxReplicaCount": 4, "pollingInterval": 15,
                            "triggers": [{"metric": "concurrency", "target": 4}]}}
    if limit:
        spec["requestLimits"] = {"maxConcurrentRequests": limit, "maxQueueSize": 1000}
    return load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "p"},
                           "spec": spec}).endpoint


@pytest.mark.parametrize(("strategy", "knowledge", "limit"), [
    ("prefixaware", "blind", None), ("kvaware", "informed", None), ("leastload", "blind", 3),
    ("session", "blind", None),
])
def test_same_snapshots_same_decisions(mooncake, strategy, knowledge, limit):
    ep = endpoint(strategy, limit)
    options = SimOptions(knowledge=knowledge, seed=3)
    trace = mooncake[:250]
    if strategy == "session":
        from dataclasses import replace

        trace = [replace(r, session=f"s{i % 7}") for i, r in enumerate(trace)]
    workload = build_workload(trace, engine_block(ep, options), knowledge == "informed")
    fleet = SimFleet(ep, workload, options)
    recorder = fleet.policy = Recorder(fleet.policy, fleet)
    fleet.run()
    assert len(recorder.log) >= len(trace)

    gateway_policy = create_policy(strategy, session_key=ep.spec.routing.session_key)
    pool = BackendPool([])
    gateway_choices = {}
    observed = 0
    for i, entry in enumerate(recorder.log):
        if entry[0] == "observe":  # the gateway feeds the same response figures (router.feedback.report)
            _, at, prediction, cached, prompt_tokens = entry
            assert gateway_choices[at].prediction == prediction
            assert feedback.report(gateway_policy, gateway_choices[at], cached, prompt_tokens)
            observed += 1
            continue
        request, snapshot, states, index, chosen = entry
        urls = [v.url for v in snapshot.replicas]
        pool.set_backends(urls, ready=set(urls), draining={f"http://{i}" for i, s in states.items() if s == "draining"})
        for v in snapshot.replicas:
            b = pool.get(v.id)
            b.in_flight, b.running, b.waiting = v.in_flight, v.running, v.waiting
            b.prefill_backlog, b.cache_blocks = v.prefill_backlog, v.cache_blocks
        views = limit_views(pool.snapshot().replicas, limit)
        assert views == snapshot.replicas
        choice = gateway_policy.choose(request, FleetSnapshot(views, snapshot.now, index))
        assert (choice.replica.id if choice else None) == chosen
        gateway_choices[i] = choice
    if strategy == "prefixaware":  # blind: the router-side index learned from the responses, on both sides
        assert observed >= len(trace) // 2
        assert gateway_policy.learner.summary() == recorder.policy.learner.summary()

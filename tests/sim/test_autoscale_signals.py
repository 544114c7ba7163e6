"""What the simulated autoscaler reads does not depend on what the router knows (`--knowledge`): KEDA reads the
engines' queues from their own gauges whatever the router was told, so blind and informed runs scale alike."""

from fleetserve.sim.fleet import SimFleet
from fleetserve.sim.setup import SimOptions
from fleetserve.sim.workload import build_workload
from fleetserve.spec.load import load_spec_data
from fleetserve.traces.model import TraceRequest


def test_a_queue_depth_trigger_reads_the_engines_queues_in_blind_and_informed_runs_alike():
    spec = {"model": {"source": "hf:meta-llama/Llama-3.1-8B-Instruct"}, "replicas": 1,
            "routing": {"strategy": "leastload"}, "capacity": {"localSlots": 6},
            "autoscaling": {"minReplicaCount": 1, "maxReplicaCount": 6, "pollingInterval": 15,
                            "triggers": [{"metric": "queue_depth", "target": 2}]}}
    endpoint = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "q"},
                               "spec": spec}).endpoint
    trace = [TraceRequest(i * 0.05, 2000, 300) for i in range(1200)]  # far more than one replica's batch
    decisions, waiting = {}, {}
    for knowledge in ("blind", "informed"):
        fleet = SimFleet(endpoint, build_workload(trace, 16, knowledge == "informed"),
                         SimOptions(knowledge=knowledge, profile="h100-llama-8b"))
        seen = []
        read = fleet.load

        def spy(read=read, seen=seen):
            load = read()
            seen.append(load["waiting"])
            return load

        fleet.load = spy
        fleet.run()
        decisions[knowledge], waiting[knowledge] = [(t, d) for t, d, _ in fleet.decisions], max(seen)
    assert waiting["blind"] > 2 and max(d for _, d in decisions["blind"]) > 1  # it scaled on the engines' queue
    assert decisions["blind"] == decisions["informed"]

import pytest

from fleetserve.capacity.catalog import Catalog
from fleetserve.capacity.consolidation import Budget, ConsolidationPolicy, consolidate
from fleetserve.capacity.manager import CapacityManager
from fleetserve.capacity.placement import (
    Availability,
    InsufficientCapacity,
    Offering,
    ReplicaRequest,
    Tier,
    place,
    tiers_from_spec,
)
from fleetserve.capacity.providers import (
    InsufficientCapacityError,
    LocalProvider,
    Node,
    RecordingProvider,
    Shortage,
    SimulatedCloud,
)
from fleetserve.spec.endpoint import PlacementSection

CATALOG = Catalog.builtin()
ONE_GPU = ReplicaRequest(gpus=1)


def test_catalog_has_prices_sources_and_ml_aliases():
    g5 = CATALOG.get("ml.g5.xlarge")
    assert g5.gpus == 1 and g5.on_demand == pytest.approx(1.006) and 0 < g5.spot < g5.on_demand
    assert "aws-list" in CATALOG.sources
    with pytest.raises(KeyError, match="known:"):
        CATALOG.get("x1.huge")


def test_priority_list_cheapest_within_tier_spot_first():
    tiers = [Tier(("g5.2xlarge", "g5.xlarge"), ("spot", "on-demand")), Tier(("g6e.xlarge",), ("on-demand",))]
    p = place(ONE_GPU, tiers, CATALOG, Availability(), 0.0)
    assert p.offering == Offering("g5.xlarge", "spot") and p.tier == 0


def test_shortage_on_first_type_falls_through_to_second_at_once():
    provider = RecordingProvider(CATALOG, fail={Offering("g5.xlarge", "on-demand")})
    tiers = tiers_from_spec(PlacementSection(instance_types=["ml.g5.xlarge", "ml.g6e.xlarge"]), CATALOG,
                            ("on-demand",))
    manager = CapacityManager(provider, CATALOG, tiers, ONE_GPU)
    slot = manager.acquire("r0", now=100.0)
    assert slot.node.offering.instance_type == "g6e.xlarge"
    # both attempts happened in the same instant: no waiting before the fallback
    assert [(c[0], c[1].instance_type, c[3]) for c in provider.calls] == [
        ("create", "g5.xlarge", 100.0), ("create", "g6e.xlarge", 100.0)]
    assert any("unavailable for 180s" in line for line in manager.log)
    # the failed offering is skipped for its TTL, then tried again
    provider.fail.clear()
    assert manager.acquire("r1", now=150.0).node.offering.instance_type == "g6e.xlarge"
    assert manager.acquire("r2", now=281.0).node.offering.instance_type == "g5.xlarge"


def test_never_a_larger_node_unless_allowed():
    tiers = [Tier(("g5.12xlarge",), ("on-demand",))]  # 4 GPUs for a 1-GPU replica
    refused = place(ONE_GPU, tiers, CATALOG, Availability(), 0.0)
    assert isinstance(refused, InsufficientCapacity)
    assert "g5.12xlarge has more GPUs than a replica asks: capacity.allowLargerInstances" in refused.reason
    assert place(ONE_GPU, tiers, CATALOG, Availability(), 0.0, allow_larger=True).offering.instance_type == \
        "g5.12xlarge"


def test_single_sku_tier_is_noted():
    tiers = [Tier(("g5.xlarge", "g5.12xlarge"), ("on-demand",))]
    p = place(ONE_GPU, tiers, CATALOG, Availability(), 0.0)
    assert any("collapses to the single type g5.xlarge" in n for n in p.notes)


def test_node_affinity_tiers_required_and_preferred():
    affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "node.kubernetes.io/instance-type", "operator": "In",
             "values": ["ml.g5.xlarge", "ml.g6.xlarge", "ml.g6e.xlarge"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["ml.g6e.xlarge"]}]}},
            {"weight": 50, "preference": {"matchExpressions": [
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]}},
        ],
    }
    tiers = tiers_from_spec(PlacementSection(node_affinity=affinity), CATALOG, ("spot", "on-demand"))
    assert tiers[0].capacity_types == ("spot",) and set(tiers[0].instance_types) == {"g5.xlarge", "g6.xlarge",
                                                                                      "g6e.xlarge"}
    assert tiers[1].instance_types == ("g6e.xlarge",)
    assert place(ONE_GPU, tiers, CATALOG, Availability(), 0).offering == Offering("g6.xlarge", "spot")


def _node(i, used, slots=1, last_change=0.0, ready_at=0.0):
    return Node(f"n{i}", Offering("g5.xlarge", "on-demand"), 1.0, slots, 0.0, ready_at, used=used,
                last_change=last_change)


def test_consolidation_when_empty_waits_for_consolidate_after_and_resets():
    policy = ConsolidationPolicy("WhenEmpty", consolidate_after=60, budgets=(Budget("100%"),))
    nodes = [_node(1, 0, last_change=0.0), _node(2, 1)]
    assert consolidate(nodes, policy, now=59.0) == []
    assert [r.node_id for r in consolidate(nodes, policy, now=60.0)] == ["n1"]
    nodes[0].last_change = 50.0  # a replica came and went: the timer restarts
    assert consolidate(nodes, policy, now=100.0) == []


def test_consolidation_budget_limits_disruptions():
    nodes = [_node(i, 0) for i in range(10)]
    assert len(consolidate(nodes, ConsolidationPolicy("WhenEmpty"), now=1.0)) == 1  # default 10%
    assert len(consolidate(nodes, ConsolidationPolicy("WhenEmpty", budgets=(Budget("3"),)), now=1.0)) == 3
    # a budget of 0 nodes during a window (09:00-17:00 Seoul = 00:00-08:00 UTC) blocks disruption then
    from fleetserve.autoscale.schedule import Cron

    quiet = Budget("0", schedule=Cron.parse("0 9 * * *"), duration=8 * 3600, timezone="Asia/Seoul")
    policy = ConsolidationPolicy("WhenEmpty", budgets=(Budget("100%"), quiet))
    monday_10_seoul = 1796000400.0  # 2026-11-30 01:00 UTC
    assert consolidate(nodes, policy, now=monday_10_seoul) == []
    assert len(consolidate(nodes, policy, now=monday_10_seoul + 9 * 3600)) == 10


def test_a_budget_holds_across_rounds_while_deleted_nodes_terminate():
    """The simulated cloud deletes at once, so each 0.2-second round saw nothing deleting: a budget of 10 % of 4
    nodes removed three within a second. A deleted node counts as disrupting for NODE_TERMINATION_S."""
    from fleetserve.capacity.consolidation import NODE_TERMINATION_S

    provider = RecordingProvider(CATALOG)
    manager = CapacityManager(provider, CATALOG, [Tier(("g5.xlarge",), ("on-demand",))], ONE_GPU,
                              consolidation=ConsolidationPolicy("WhenEmpty", budgets=(Budget("10%"),)))
    slots = [manager.acquire(f"r{i}", now=0.0) for i in range(4)]
    for i, slot in enumerate(slots):
        manager.release(f"r{i}", slot.node.id, now=1.0)
    gone = []
    for step in range(10):  # one second of the local fleet's loop
        gone += manager.consolidate(now=10.0 + step * 0.2, load_ratio=0.0)
    assert len(gone) == 1 and len(manager.nodes()) == 3
    gone += manager.consolidate(now=10.0 + NODE_TERMINATION_S, load_ratio=0.0)
    assert len(gone) == 2 and len(manager.nodes()) == 2


def test_underutilized_only_when_the_rest_absorbs_the_load():
    nodes = [_node(1, 1, slots=4), _node(2, 3, slots=4)]
    policy = ConsolidationPolicy("WhenEmptyOrUnderutilized", budgets=(Budget("100%"),))
    assert [r.node_id for r in consolidate(nodes, policy, now=1.0, load_ratio=0.5)] == ["n1"]
    assert consolidate(nodes, policy, now=1.0, load_ratio=0.9) == []  # 0.9 x 4/3 > 1


def test_two_underutilized_nodes_never_count_on_the_same_free_slot():
    """Each removal's replicas fill free slots elsewhere: the second removal of a round had counted them again."""
    policy = ConsolidationPolicy("WhenEmptyOrUnderutilized", budgets=(Budget("100%"),))
    host = _node(1, 3, slots=4)  # one free slot
    a, b = _node(2, 1, slots=4), _node(3, 1, slots=4)
    removed = [r.node_id for r in consolidate([host, a, b], policy, now=1.0, load_ratio=0.1)]
    # one of a, b: its replica takes the host's slot or the other's, and the other's then has none left (both had
    # gone, and the second replica needed a new node)
    assert len(removed) == 1 and "n1" not in removed
    full = _node(4, 4, slots=4)
    one, two = _node(5, 3, slots=4), _node(6, 3, slots=4)
    removed = [r.node_id for r in consolidate([full, one, two], policy, now=1.0, load_ratio=0.1)]
    assert removed == []  # either one's 3 replicas need the other's 1 free slot and more


def test_underutilized_takes_the_dearest_of_equals_and_never_swaps_a_node_for_an_empty_one():
    """The cheapest of equally used nodes went first (g5 at $0.40/h moved onto g6e at $0.74/h, which stayed), and
    a full node was "moved" onto an identical empty one, restarting its replica for nothing."""
    policy = ConsolidationPolicy("WhenEmptyOrUnderutilized", budgets=(Budget("100%"),))
    cheap = Node("cheap", Offering("g5.xlarge", "spot"), 0.40, 2, 0.0, 0.0, used=1, last_change=0.0)
    dear = Node("dear", Offering("g6e.xlarge", "spot"), 0.74, 2, 0.0, 0.0, used=1, last_change=0.0)
    assert [r.node_id for r in consolidate([cheap, dear], policy, now=1.0)] == ["dear"]
    full, fresh = _node(1, 1), _node(2, 0, last_change=0.9)
    assert "n1" not in {r.node_id for r in consolidate([full, fresh], policy, now=1.0)}


def test_simulated_cloud_delays_shortages_and_spot_interruptions():
    cloud = SimulatedCloud(CATALOG, limits={"g5.xlarge": 1}, provisioning_delay=90,
                           shortages=[Shortage("g6.xlarge", 0, 600)])
    node = cloud.create(Offering("g5.xlarge", "spot"), 1, now=0.0)
    assert not node.ready(89.0) and node.ready(90.0)
    with pytest.raises(InsufficientCapacityError, match="limit"):
        cloud.create(Offering("g5.xlarge", "on-demand"), 1, now=1.0)
    with pytest.raises(InsufficientCapacityError):
        cloud.create(Offering("g6.xlarge", "on-demand"), 1, now=10.0)
    assert [e.kind for e in cloud.poll(100.0)] == ["ready"]
    cloud.interrupt(node.id, now=200.0)  # spot notice: 120 s
    assert [(e.kind, e.at) for e in cloud.poll(250.0)] == [("interruption-notice", 200.0)]
    assert cloud.poll(260.0) == []
    assert [(e.kind, e.node_id) for e in cloud.poll(320.0)] == [("terminated", node.id)]
    later = cloud.create(Offering("g6.xlarge", "on-demand"), 1, now=600.0)  # the shortage is over
    assert [(e.kind, e.node_id) for e in cloud.poll(700.0)] == [("ready", later.id)]


def test_cost_ledger_splits_by_replica_namespace_version_and_idle():
    manager = CapacityManager(RecordingProvider(CATALOG), CATALOG, [Tier(("g5.12xlarge",), ("on-demand",))],
                              ONE_GPU, allow_larger=True, namespace="team-a", model_version="7")
    a = manager.acquire("r0", now=0.0)
    b = manager.acquire("r1", now=0.0)
    assert a.node.id == b.node.id and a.node.slots == 4  # bin-packed on one 4-GPU node
    manager.release("r1", b.node.id, now=1800.0)
    totals = manager.ledger.totals(now=3600.0)
    price = CATALOG.get("g5.12xlarge").on_demand
    assert totals["total"] == pytest.approx(price)
    assert totals["by_replica"]["r0"] == pytest.approx(price / 4)
    assert totals["by_replica"]["r1"] == pytest.approx(price / 8)
    assert totals["by_namespace"]["team-a"] == pytest.approx(price * 3 / 8)
    assert totals["by_model_version"]["7"] == pytest.approx(price * 3 / 8)
    assert totals["idle_by_node"][a.node.id] == pytest.approx(price * 5 / 8)
    assert manager.cost_per_hour() == pytest.approx(price)


def test_a_stopped_fleet_gives_back_every_node_and_its_cost_stops():
    """`down` released the replicas but kept the nodes: `status` showed a stopped fleet at $1.006/h."""
    manager = CapacityManager(RecordingProvider(CATALOG), CATALOG, [Tier(("g5.12xlarge",), ("on-demand",))],
                              ONE_GPU, allow_larger=True)
    slot = manager.acquire("r0", now=0.0)
    manager.release("r0", slot.node.id, now=600.0)
    manager.release_all(now=600.0)
    assert manager.nodes() == [] and manager.cost_per_hour() == 0.0
    assert manager.ledger.totals(now=3600.0)["total"] == pytest.approx(CATALOG.get("g5.12xlarge").on_demand / 6)
    local = CapacityManager(LocalProvider(slots=2), CATALOG, [Tier(("local",))], ReplicaRequest(), local_slots=2)
    local.release_all(now=1.0)
    assert local.nodes() == []


def test_a_dead_fleets_status_costs_nothing_once_no_replica_runs():
    from fleetserve.fleet.state import FleetState, NodeState, mark_stale

    state = FleetState(name="x", namespace="default", model="m", spec_path="e.yaml", supervisor_pid=0,
                       status="running", cost_per_hour=1.006,
                       nodes=[NodeState("node-1", "g5.xlarge", "on-demand", 1.006, 1, 1, True, False)])
    state = mark_stale(state)
    assert (state.status, state.cost_per_hour, state.nodes) == ("dead", 0.0, [])


def test_local_provider_is_one_node_with_slots():
    manager = CapacityManager(LocalProvider(slots=2), CATALOG, [Tier(("local",))], ReplicaRequest(), local_slots=2)
    assert manager.acquire("r0", 0.0).node.id == "local"
    assert manager.acquire("r1", 0.0).node.id == "local"
    full = manager.acquire("r2", 0.0)
    assert isinstance(full, InsufficientCapacity)
    manager.release("r0", "local", 1.0)
    assert manager.acquire("r2", 2.0).node.id == "local"


def test_this_machine_full_of_its_own_replicas_is_a_wait_not_a_capacity_shortage():
    """A request that woke a fleet draining its last replica found every slot taken: the local offering was marked
    unavailable for the ICE TTL (180 s), the emptied node was removed, and nothing could be placed for three
    minutes (every request a 503). A full machine is waited out, never marked."""
    from fleetserve.capacity.placement import Offering

    manager = CapacityManager(LocalProvider(slots=1), CATALOG, [Tier(("local",))], ReplicaRequest(), local_slots=1)
    assert manager.acquire("r0", 0.0).node.id == "local"
    full = manager.acquire("r1", 1.0)
    assert isinstance(full, InsufficientCapacity)
    assert full.reason.startswith("every replica slot of this machine is taken (1 of capacity.localSlots = 1)")
    assert manager.availability.available(Offering("local", "on-demand"), 1.0)
    manager.release("r0", "local", 2.0)
    manager.release_all(now=2.0)  # the empty machine goes, as consolidation removes it
    assert manager.nodes() == []
    assert manager.acquire("r1", 3.0).node.id == "local"


def test_this_machine_is_released_at_zero_as_before_the_first_replica():
    """A local fleet that scaled to zero kept this machine's price ($3.60/h, accruing) where it read $0/h before
    its first request; an underutilized one is never cordoned (there is no other machine to move to)."""
    manager = CapacityManager(LocalProvider(slots=2, price_per_hour=3.6), Catalog.builtin(local_price=3.6),
                              [Tier(("local",))], ReplicaRequest(), local_slots=2)
    assert manager.cost_per_hour() == 0.0
    manager.acquire("r0", 0.0)
    manager.acquire("r1", 0.0)
    assert manager.cost_per_hour() == pytest.approx(3.6)
    manager.release("r1", "local", 10.0)
    assert manager.consolidate(20.0, load_ratio=0.1) == [] and manager.nodes()  # half used: kept, not cordoned
    manager.release("r0", "local", 30.0)
    manager.consolidate(40.0, load_ratio=0.0)
    assert manager.nodes() == [] and manager.cost_per_hour() == 0.0
    assert manager.ledger.totals(now=3600.0)["total"] == pytest.approx(3.6 * 40 / 3600)
    assert manager.acquire("r2", 50.0).node.id == "local"  # woken: the machine is taken again
    # both stints count (the second took the first's place in the ledger: node_hours_by_type read 2 minutes of a
    # 2-hour run, and the cost total lost the earlier hours)
    manager.release("r2", "local", 50.0 + 3600)
    totals = manager.ledger.totals(now=3650.0)
    assert totals["total"] == pytest.approx(3.6 * (40 + 3600) / 3600)
    assert totals["by_node"] == {"local": pytest.approx(3.6 * (40 + 3600) / 3600)}
    assert manager.ledger.hours_by_instance_type(3650.0) == {"local": pytest.approx((40 + 3600) / 3600)}


def test_underutilized_node_is_cordoned_emptied_by_moves_then_deleted():
    """WhenEmptyOrUnderutilized is applied, not only computed: cordon, replacements elsewhere, then delete."""
    provider = RecordingProvider(CATALOG)
    manager = CapacityManager(provider, CATALOG, [Tier(("g5.12xlarge",), ("on-demand",))], ONE_GPU,
                              allow_larger=True, consolidation=ConsolidationPolicy(budgets=(Budget("100%"),)))
    a = manager.acquire("r0", 0.0).node  # 4 slots
    for i in range(1, 4):
        manager.acquire(f"r{i}", 0.0)
    b = manager.acquire("r4", 0.0).node  # a second node with one replica
    assert a.id != b.id and (a.used, b.used) == (4, 1)
    manager.release("r1", a.id, 10.0)  # now a holds 3, b holds 1: b's replica fits in a's free slot
    removals = manager.consolidate(20.0, load_ratio=0.25)
    assert [(r.node_id, r.reason) for r in removals] == [(b.id, "Underutilized")]
    assert manager.cordoned == {b.id}
    assert manager.acquire("r5", 21.0).node.id == a.id  # the replacement lands elsewhere, never on b
    manager.release("r4", b.id, 30.0)  # the moved replica drained
    manager.consolidate(31.0, load_ratio=0.25)
    assert b.id not in {n.id for n in manager.nodes()} and ("delete", b.id, 31.0) in provider.calls
    assert manager.cordoned == set()


def test_underutilized_is_not_applied_when_the_rest_cannot_absorb_the_load():
    provider = RecordingProvider(CATALOG)
    manager = CapacityManager(provider, CATALOG, [Tier(("g5.12xlarge",), ("on-demand",))], ONE_GPU,
                              allow_larger=True, consolidation=ConsolidationPolicy(budgets=(Budget("100%"),)))
    a = manager.acquire("r0", 0.0).node
    for i in range(1, 3):
        manager.acquire(f"r{i}", 0.0)
    manager.acquire("r3", 0.0)
    manager.acquire("r4", 0.0)  # second node
    manager.release("r1", a.id, 10.0)
    assert manager.consolidate(20.0, load_ratio=0.95) == [] and manager.cordoned == set()


def test_a_replica_asks_for_its_pods_cpu_and_memory_as_kubernetes_reads_them():
    from types import SimpleNamespace

    from fleetserve.capacity.placement import fits, quantity, replica_request

    assert [quantity(q) for q in ("500m", "6", "30Gi", "32G", "1e9", "2Ki")] == [0.5, 6.0, 30 * 2**30, 32e9, 1e9, 2048]
    engine = SimpleNamespace(gpus=1, resources={"limits": {"cpu": "8", "memory": "64Gi"},
                                                "requests": {"cpu": "6", "memory": "30Gi"}})
    asked = replica_request(engine)  # requests win; limits stand in where requests say nothing
    assert (asked.gpus, asked.vcpu, asked.memory_gb) == (1, 6.0, 30.0)
    assert not fits(CATALOG.get("g6e.xlarge"), asked, allow_larger=False)  # 4 vCPU, 32 GiB
    assert fits(CATALOG.get("g5.2xlarge"), asked, allow_larger=False)  # 8 vCPU, 32 GiB
    only_limits = replica_request(SimpleNamespace(gpus=0, resources={"limits": {"memory": "20Gi"}}))
    assert (only_limits.gpus, only_limits.vcpu, only_limits.memory_gb) == (1, 0.0, 20.0)


def test_a_node_takes_as_many_replicas_as_every_resource_allows():
    """Slots were counted by GPUs only: 8 one-GPU replicas asking 16 cpu each on a 96-vCPU p4d.24xlarge."""
    from fleetserve.capacity.providers import SimulatedCloud

    cloud = SimulatedCloud(CATALOG, provisioning_delay=0.0)
    asked = ReplicaRequest(gpus=1, vcpu=16, memory_gb=30)
    manager = CapacityManager(cloud, CATALOG, [Tier(("p4d.24xlarge",))], asked, allow_larger=True)
    slot = manager.acquire("r0", 0.0)
    assert slot.node.slots == 5  # 96 vCPU less the kubelet's share, // 16; its 8 GPUs and 1,152 GiB would take more
    gpus_only = CapacityManager(SimulatedCloud(CATALOG, provisioning_delay=0.0), CATALOG, [Tier(("p4d.24xlarge",))],
                                ReplicaRequest(gpus=1), allow_larger=True)
    assert gpus_only.acquire("r0", 0.0).node.slots == 8


def test_a_pod_asking_a_nodes_whole_cpu_or_memory_does_not_fit():
    """Kubernetes schedules against allocatable capacity: the kubelet keeps ~0.1 cpu and ~1.5 GiB."""
    from fleetserve.capacity.placement import allocatable, fits

    small = CATALOG.get("g5.xlarge")  # 4 vCPU, 16 GiB
    cpu, memory = allocatable(small)
    assert 3.8 < cpu < 4 and 14 < memory < 16
    assert not fits(small, ReplicaRequest(gpus=1, memory_gb=16), allow_larger=False)
    assert not fits(small, ReplicaRequest(gpus=1, vcpu=4), allow_larger=False)
    assert fits(CATALOG.get("g5.2xlarge"), ReplicaRequest(gpus=1, vcpu=6, memory_gb=30), allow_larger=False)


def test_the_live_fleets_simulated_cloud_never_places_a_model_its_gpus_cannot_hold():
    """The GPU-memory check was the simulator's alone: `fleetserve up` on a simulated cloud placed a 70B on one
    24 GB A10G where verify and plan refused it. The live capacity manager now asks what the simulator asks."""
    from fleetserve.capacity.placement import InsufficientCapacity
    from fleetserve.fleet.capacity import build_capacity
    from fleetserve.spec.load import load_spec_data

    def manager(source: str, instance_type: str):
        spec = {"model": {"name": "m", "source": source}, "engine": {"kind": "vllm"},
                "placement": {"instanceTypes": [instance_type]},
                "capacity": {"provider": "simulated", "simulated": {"provisioningDelaySeconds": 1}}}
        endpoint = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "fit"},
                                   "spec": spec}).endpoint
        return build_capacity(endpoint.spec, "default", 0.0)

    refused = manager("hf:meta-llama/Llama-3.1-70B-Instruct", "g5.xlarge").acquire("r0", 0.0)
    assert isinstance(refused, InsufficientCapacity) and "GiB of GPU memory" in refused.reason
    placed = manager("hf:meta-llama/Llama-3.1-8B-Instruct", "g5.xlarge").acquire("r0", 0.0)
    assert not isinstance(placed, InsufficientCapacity)


def test_a_replica_asks_for_the_memory_its_l1_tier_fills():
    """The L1 tier (LMCache's CPU buffer, SGLang's HiCache, the built-in engine's L1) lives in the pod's memory."""
    from types import SimpleNamespace

    from fleetserve.capacity.placement import fits, replica_request

    no_l2 = SimpleNamespace(enabled=False)
    l1 = SimpleNamespace(l1=SimpleNamespace(enabled=True, max_bytes=64 << 30), l2=no_l2)
    engine = SimpleNamespace(kind="vllm", gpus=1, resources={"requests": {"cpu": "6", "memory": "30Gi"}})
    assert replica_request(engine, kv_cache=l1).memory_gb == 64.0
    assert replica_request(SimpleNamespace(kind="vllm", gpus=1, resources=None), kv_cache=l1).memory_gb == 64.0
    off = SimpleNamespace(l1=SimpleNamespace(enabled=False, max_bytes=64 << 30), l2=no_l2)
    assert replica_request(engine, kv_cache=off).memory_gb == 30.0
    # vLLM with L2 only: LMCache still holds a CPU staging buffer on each GPU rank, 1 GiB each as adapters size it
    l2_only = SimpleNamespace(l1=off.l1, l2=SimpleNamespace(enabled=True))
    assert replica_request(SimpleNamespace(kind="vllm", gpus=4, resources=None), kv_cache=l2_only).memory_gb == 4.0
    assert replica_request(SimpleNamespace(kind="sglang", gpus=4, resources=None), kv_cache=l2_only).memory_gb == 0
    assert not fits(CATALOG.get("g5.2xlarge"), replica_request(engine, kv_cache=l1), allow_larger=False)  # 32 GiB
    # a memory limit below the L1 caps the request, as the rendered pod's (k8s/engine.memory_for_l1 warns)
    capped = SimpleNamespace(kind="vllm", gpus=1, resources={"limits": {"memory": "32Gi"}})
    assert replica_request(capped, kv_cache=l1).memory_gb == 32.0


def test_the_l2_redis_price_is_booked_in_the_live_fleets_cost_as_in_the_simulators():
    """kvCache.l2.pricePerHour was counted by simulate, verify and plan only: `status` of the same fleet showed the
    nodes' cost alone. One ledger books it for both, from the fleet's start to its stop."""
    from fleetserve.fleet.capacity import build_capacity
    from fleetserve.spec.load import load_spec_text

    text = """apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {name: l2cost}
spec:
  model: {source: /models/m}
  capacity: {localPricePerHour: 1.0}
  kvCache: {l2: {enabled: true, pricePerHour: 0.5}}
"""
    manager = build_capacity(load_spec_text(text).endpoint.spec, "team-a", 0.0)
    assert manager.cost_per_hour() == pytest.approx(0.5)  # before any replica: the Redis runs
    slot = manager.acquire("r0", now=0.0)
    assert manager.cost_per_hour() == pytest.approx(1.5)
    manager.release("r0", slot.node.id, 3600.0)
    totals = manager.ledger.totals(3600.0)
    assert totals["by_service"] == {"l2": pytest.approx(0.5)} and totals["total"] == pytest.approx(1.5)
    manager.release_all(7200.0)
    # the machine to its release at the stop (2 h, $2) and the Redis as long (2 h, $1); nothing after
    assert manager.cost_per_hour() == 0 and manager.ledger.totals(9000.0)["total"] == pytest.approx(3.0)
    off = build_capacity(load_spec_text(text.replace("enabled: true", "enabled: false")).endpoint.spec, "a", 0.0)
    assert off.cost_per_hour() == 0 and off.ledger.totals(3600.0)["by_service"] == {}


def test_a_shortage_is_said_as_one_not_as_a_size_mismatch():
    """Every fitting offering out of capacity read "no available offering fits a replica of 1 GPU(s)", as if the
    replica were too large for the types; only the capacity log said "insufficient capacity"."""
    tiers = [Tier(("g5.xlarge",), ("spot", "on-demand"))]
    availability = Availability()
    availability.mark_unavailable(Offering("g5.xlarge", "spot"), 0.0)
    availability.mark_unavailable(Offering("g5.xlarge", "on-demand"), 0.0)
    short = place(ONE_GPU, tiers, CATALOG, availability, 1.0)
    assert isinstance(short, InsufficientCapacity)
    assert short.reason.startswith("no capacity for a replica of 1 GPU(s)") and \
        "out of capacity for now (g5.xlarge spot, g5.xlarge on-demand)" in short.reason, short.reason
    misfit = place(ONE_GPU, [Tier(("g5.12xlarge",), ("on-demand",))], CATALOG, Availability(), 0.0)
    assert misfit.reason.startswith("no listed offering fits")


def _replacing_with(offering: Offering, price: float, slots: int = 1):
    from fleetserve.capacity.consolidation import Replacement
    from fleetserve.capacity.placement import Placement

    return lambda node: Replacement(Placement(offering, price, 0), slots)


def test_an_on_demand_node_is_replaced_by_a_cheaper_node_placement_takes_now():
    """Karpenter replaces a node when its pods fit elsewhere plus on one cheaper node. Without it a fleet that fell
    back to a dearer type during a shortage paid for it until the next scale-down."""
    policy = ConsolidationPolicy("WhenEmptyOrUnderutilized", budgets=(Budget("100%"),))
    dear = Node("dear", Offering("g6e.xlarge", "on-demand"), 1.861, 1, 0.0, 0.0, used=1, last_change=0.0)
    cheaper = _replacing_with(Offering("g5.xlarge", "on-demand"), 1.006)
    (removal,) = consolidate([dear], policy, now=1.0, load_ratio=0.9, replacement=cheaper)
    assert removal.node_id == "dear" and removal.reason == "Underutilized"  # made first: no load check
    assert removal.replacement.placement.offering.instance_type == "g5.xlarge"
    same = _replacing_with(Offering("g6e.xlarge", "on-demand"), 1.861)
    assert consolidate([dear], policy, now=1.0, replacement=same) == []  # no saving, no move
    # a spot node is not replaced (Karpenter's SpotToSpotConsolidation gate is off by default)
    spot = Node("spot", Offering("g6e.xlarge", "spot"), 0.9, 1, 0.0, 0.0, used=1, last_change=0.0)
    assert consolidate([spot], policy, now=1.0, replacement=_replacing_with(Offering("g5.xlarge", "spot"), 0.4)) == []
    # not before consolidateAfter settles it
    late = ConsolidationPolicy("WhenEmptyOrUnderutilized", consolidate_after=60, budgets=(Budget("100%"),))
    assert consolidate([dear], late, now=59.0, replacement=cheaper) == []


def test_a_replacement_needs_room_for_the_replicas_that_do_not_fit_elsewhere():
    policy = ConsolidationPolicy("WhenEmptyOrUnderutilized", budgets=(Budget("100%"),))
    big = Node("big", Offering("g5.12xlarge", "on-demand"), 5.672, 4, 0.0, 0.0, used=3, last_change=0.0)
    one_slot = _replacing_with(Offering("g5.xlarge", "on-demand"), 1.006, slots=1)
    assert consolidate([big], policy, now=1.0, replacement=one_slot) == []  # 3 replicas, room for 1
    other = Node("other", Offering("g5.12xlarge", "on-demand"), 5.672, 4, 0.0, 0.0, used=2, last_change=0.0)
    # two fit in `other`'s free slots, the third on the new node; one replacement a round (`other` is not replaced
    # too, on the same slots)
    removals = consolidate([big, other], policy, now=1.0, load_ratio=1.0, replacement=one_slot)
    assert [(r.node_id, r.replacement is not None) for r in removals] == [("big", True)]
    # a cordoned node's free slots take no replica: counted, the two moved replicas had needed two new nodes
    assert consolidate([big, other], policy, now=1.0, load_ratio=1.0, replacement=one_slot,
                       cordoned={"other"}) == []
    # replicas that all fit elsewhere are the deletion's to move: when the load forbids it, no replacement either
    small = Node("small", Offering("g6e.xlarge", "on-demand"), 1.861, 1, 0.0, 0.0, used=1, last_change=0.0)
    roomy = Node("roomy", Offering("g5.12xlarge", "spot"), 2.2, 4, 0.0, 0.0, used=1, last_change=0.0)
    cheaper = _replacing_with(Offering("g5.xlarge", "on-demand"), 1.006)
    assert consolidate([small, roomy], policy, now=1.0, load_ratio=0.9, replacement=cheaper) == []


def test_a_fleet_that_fell_back_during_a_shortage_moves_to_the_cheaper_type_when_it_returns():
    cloud = SimulatedCloud(CATALOG, shortages=[Shortage("g5.xlarge", 0.0, 100.0)], provisioning_delay=90)
    tiers = [Tier(("g5.xlarge",), ("on-demand",)), Tier(("g6e.xlarge",), ("on-demand",))]
    manager = CapacityManager(cloud, CATALOG, tiers, ONE_GPU,
                              consolidation=ConsolidationPolicy(consolidate_after=30, budgets=(Budget("100%"),)))
    fallback = manager.acquire("r0", 0.0).node
    assert fallback.offering.instance_type == "g6e.xlarge"
    assert manager.consolidate(150.0, load_ratio=1.0) == []  # g5.xlarge is marked out of capacity until 180 s
    (removal,) = manager.consolidate(181.0, load_ratio=1.0)
    assert removal.node_id == fallback.id and manager.cordoned == {fallback.id}
    new = next(n for n in manager.nodes() if n.id != fallback.id)
    assert (new.offering.instance_type, new.used) == ("g5.xlarge", 0)
    assert any(f"replacing node {fallback.id} (g6e.xlarge" in line and "g5.xlarge" in line for line in manager.log)
    assert manager.acquire("r1", 182.0).node is new  # the moving replica's replacement lands on it
    manager.release("r0", fallback.id, 300.0)  # the moved replica drained
    manager.consolidate(301.0, load_ratio=1.0)
    assert [n.offering.instance_type for n in manager.nodes()] == ["g5.xlarge"] and manager.cordoned == set()
    assert manager.cost_per_hour() == pytest.approx(CATALOG.get("g5.xlarge").on_demand)


def test_a_replacement_out_of_capacity_leaves_the_node_and_is_tried_after_the_mark_expires():
    cloud = SimulatedCloud(CATALOG, limits={"g5.xlarge": 0}, provisioning_delay=0)
    tiers = [Tier(("g5.xlarge",), ("on-demand",)), Tier(("g6e.xlarge",), ("on-demand",))]
    manager = CapacityManager(cloud, CATALOG, tiers, ONE_GPU,
                              consolidation=ConsolidationPolicy(budgets=(Budget("100%"),)))
    node = manager.acquire("r0", 0.0).node  # g5.xlarge refused: marked until 180 s
    assert manager.consolidate(181.0, load_ratio=0.5) == []  # tried, refused again, marked again
    assert manager.cordoned == set() and [n.id for n in manager.nodes()] == [node.id]
    assert any("no cheaper node to replace one with yet" in line for line in manager.log)
    assert manager.consolidate(200.0, load_ratio=0.5) == []
    cloud.limits.clear()
    assert manager.consolidate(362.0, load_ratio=0.5)[0].node_id == node.id

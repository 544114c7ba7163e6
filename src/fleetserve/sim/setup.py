"""From an Endpoint spec to the simulator's parts: options, performance profiles, capacity, scaling policy.

Choices the spec does not make, made here and documented in docs/simulator.md:
- a spec with instance types (ours or HyperPod's) runs on the simulated cloud even when it says
  `capacity.provider: local` (a local fleet cannot run GPU types; the simulator can pretend to), with
  `provisioning_delay_s` (90 s: a GPU node until the device plugin is up) unless the spec's simulated
  cloud section sets one; a spec without instance types runs on one local node of `localSlots` slots;
- the performance profile follows each replica's instance type (its GPU's Llama-3.1-8B preset in
  `sim.profiles`) unless
  `profile` names one; the local node uses `cpu-135m`;
- `prometheus` triggers are answered from the simulated load by what their query names (see `fake_prometheus`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from fleetserve.autoscale.policy import ScalingPolicy
from fleetserve.capacity.catalog import Catalog
from fleetserve.capacity.from_spec import capacity_manager
from fleetserve.capacity.manager import CapacityManager
from fleetserve.capacity.model_fit import stated_size
from fleetserve.capacity.placement import tiers_from_spec
from fleetserve.sim.perf import PerfProfile, profile
from fleetserve.sim.profiles import PRESETS, ProfileError, derived_profile, resolve
from fleetserve.traces.clock import CLOCKLESS_START

KNOWLEDGE_MODES = ("blind", "informed")
DEFAULT_START = CLOCKLESS_START.isoformat()  # a Monday morning (UTC): cron floors see a working day


@dataclass(frozen=True)
class SimOptions:
    seed: int = 0
    knowledge: str = "blind"  # informed: the router gets KV events, capacity and queue; blind: none of them
    profile: str | PerfProfile | None = None  # preset name, profile.json or a PerfProfile; None: by instance type
    provisioning_delay_s: float | None = None
    metric_lag_s: float = 15.0  # the autoscaler sees the fleet's load this late (one scrape interval)
    reconcile_s: float = 1.0  # how often the control loop looks (capacity events, drains, consolidation)
    health_interval_s: float = 1.0  # informed: how often replicas' queue reports refresh
    start: str = DEFAULT_START  # wall time of the trace's first second (cron floors, budgets)
    warm_start: bool = True  # the initial replicas are running when the trace starts
    window_s: float = 300.0  # peak/idle windows: the trace is cut into windows this long
    peak_fraction: float = 0.1  # the busiest 10 % of windows (at least one) are "peak"
    idle_fraction: float = 0.25  # the quietest 25 % (at least one) are "idle"
    static_replicas: int | None = None  # run without autoscaling at this count (plan's baseline)
    spot_interruption_rate: float | None = None
    fast_forward: bool = True  # skip the control loop's rounds through idle stretches (same results, faster)
    prices: dict[str, tuple[float, float]] | None = None  # (on-demand, spot) $/h by instance type (--prices)
    extra: dict = field(default_factory=dict)
    # what the inputs carry that every report says first (a profile of another model, a trace in seconds, a flag
    # without effect): printed with the report's warnings and in its JSON
    input_warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.knowledge not in KNOWLEDGE_MODES:
            raise ValueError(f"knowledge: {self.knowledge!r}; allowed: {', '.join(KNOWLEDGE_MODES)}")
        if not 0 < self.peak_fraction <= 1 or not 0 < self.idle_fraction <= 1:
            raise ValueError("peak_fraction and idle_fraction must be in (0, 1]")
        if self.window_s <= 0:
            raise ValueError("window_s must be positive")

    def catalog(self, local_price: float = 0.0) -> Catalog:
        """The shipped catalog with this run's own prices (`--prices`) over its list prices."""
        catalog = Catalog.builtin(local_price=local_price)
        return catalog.with_prices(self.prices) if self.prices else catalog

    @property
    def start_epoch(self) -> float:
        moment = datetime.fromisoformat(self.start)  # without an offset: UTC, never the machine's zone
        return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def gpu_types(spec, catalog: Catalog) -> list[str]:
    """The cloud instance types the spec places on; none for this machine (`instanceTypes: [local]`, as `models
    list` advertises for the CPU model, is the local machine's slots, not a GPU type every request failed on)."""
    if spec.placement.instance_types:
        return [n for n in (catalog.canonical(n) for n in spec.placement.instance_types) if n != "local"]
    if spec.placement.node_affinity:
        return [n for tier in tiers_from_spec(spec.placement, catalog, ("on-demand", "spot"))
                for n in tier.instance_types]
    return []


def uses_cloud(spec, catalog: Catalog) -> bool:
    return bool(gpu_types(spec, catalog))


LARGE_FROM_B = 30.0  # from this many billion parameters on, the 70B shape stands in; below it, the 8B


def model_shape(spec) -> tuple[str, str | None]:
    """(the published shape the GPU rooflines use, why it is a guess or None) from the parameter count the model's
    name, source or engine arguments state: Llama-3.1-70B from 30B up, Llama-3.1-8B below (a 70B was simulated at
    an 8B's speed: TTFT 122 ms where its own roofline says 312, and plan verified it). Sizes other than 8 and 70
    are stood in for, and said so; a model whose size nothing states is simulated as the 8B, and said so."""
    size = stated_size(spec.model, spec.engine)
    if size is None:
        return "llama-3.1-8b", "its size is not in its name, source or engine arguments"
    shape = "llama-3.1-70b" if size >= LARGE_FROM_B else "llama-3.1-8b"
    exact = 70.0 if shape == "llama-3.1-70b" else 8.0
    return shape, None if size == exact else f"a {size:g}B model, simulated with the shape of {shape}"


def profile_for(instance_type: str, catalog: Catalog, options: SimOptions, spec=None,
                notes: set[str] | None = None) -> PerfProfile:
    """The chosen profile, else the roofline of the spec's model (`model_shape`) on the instance's GPUs (the
    replica's `engine.gpus`); the 8B preset of the GPU (A10G's for GPUs without one) without a spec. What is
    guessed goes into `notes` (the report's warnings)."""
    if isinstance(options.profile, PerfProfile):
        return options.profile
    if options.profile:
        return resolve(options.profile)
    if spec is not None and spec.engine.kind == "external" and notes is not None:  # it ran with no word
        notes.add("engine.kind external: the servers at engine.urls run at a speed the simulator cannot know; "
                  f"simulated with the {'cpu-135m' if instance_type == 'local' else 'GPU roofline'} profile "
                  "(give --profile, e.g. one `fleetserve profile` measured, for theirs)")
    if instance_type == "local":
        return profile("cpu-135m")
    gpu = catalog.get(instance_type).gpu
    model, guessed = model_shape(spec) if spec is not None else ("llama-3.1-8b", None)
    n = (spec.engine.gpus if spec is not None else 0) or 1
    if guessed and notes is not None:
        notes.add(f"the model's speed is a stand-in ({guessed}); give --profile for its own")
    if model != "llama-3.1-8b" or n > 1:
        try:
            return derived_profile(gpu, n, model)
        except ProfileError as exc:
            if notes is not None:
                notes.add(f"{exc} ({instance_type}): simulated with the GPU's Llama-3.1-8B preset; the real replica "
                          "may not load")
    for name, data in PRESETS.items():
        if data.get("gpu") == gpu and data.get("model") == "llama-3.1-8b":
            return resolve(name)
    return resolve("a10g-llama-8b")


def too_small_for_context(spec, types, catalog: Catalog, options: SimOptions) -> dict[str, int]:
    """The instance types (each once, by its first name: `ml.` or not) whose GPU memory, past the weights, holds
    less KV cache than one sequence of the context the spec declares: the tokens each holds. vLLM and SGLang refuse
    to start there ("max seq len larger than the KV cache"); the simulator had served such a fleet without a word.
    Only a declared context (model.contextLength, the engine's flag): at the model's own maximum, which such a
    type cannot hold either, an engine would want a limit written for it."""
    from fleetserve.spec.context import declared_limit

    limit = declared_limit(spec)
    if limit is None or spec.engine.kind not in ("vllm", "sglang"):
        return {}
    out, seen = {}, set()
    for t in types:
        if t == "local" or t not in catalog or Catalog.canonical(t) in seen:
            continue
        seen.add(Catalog.canonical(t))
        held = replica_kv_tokens(t, catalog, options, spec)
        if held is not None and 0 < held < limit[0]:
            out[t] = held
    return out


def replica_kv_tokens(instance_type: str, catalog: Catalog, options: SimOptions, spec) -> int | None:
    """The tokens one replica's KV cache holds on `instance_type` (its profile's cache blocks x block size), or None
    where no profile is known."""
    try:
        p = profile_for(instance_type, catalog, options, spec)
    except (KeyError, ValueError):
        return None
    return p.cache_blocks * p.block_size


def build_capacity(spec, catalog: Catalog, options: SimOptions, now: float) -> CapacityManager:
    """The live CapacityManager on a virtual-time provider: cloud nodes whenever the spec lists GPU types."""
    return capacity_manager(spec, catalog, now, "sim", cloud=uses_cloud(spec, catalog),
                            provisioning_delay=options.provisioning_delay_s,
                            spot_interruption_rate=options.spot_interruption_rate, seed_offset=options.seed,
                            at_least_slots=options.static_replicas or 0)


def scaling_policy(spec, options: SimOptions) -> ScalingPolicy | None:
    if options.static_replicas is not None or spec.autoscaling is None or not spec.autoscaling.enabled:
        return None
    return ScalingPolicy.from_spec(spec.autoscaling)


def fake_prometheus(load_of):
    """A stand-in for the Prometheus server of `prometheus` triggers: the query's words pick the signal
    (concurrent/inflight -> in flight + buffered; waiting/queue -> queued; ttf -> TTFT p95 in ms;
    rate/invocations/requests_total -> requests per second; anything else: concurrency)."""

    def query(server: str, text: str) -> float | None:
        load = load_of()
        if load is None:
            return None
        q = text.lower()
        if "waiting" in q or "queue" in q:
            return float(load["waiting"] + load["pending"])
        if "ttf" in q:
            return float(load["ttft_p95_ms"])
        if "concurrent" in q or "in_flight" in q or "inflight" in q:
            return float(load["in_flight"] + load["pending"])
        if "rate(" in q or "invocations" in q or "requests_total" in q:
            return float(load.get("request_rate", 0.0))
        return float(load["in_flight"] + load["pending"])

    return query

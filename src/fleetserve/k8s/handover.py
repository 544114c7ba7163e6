"""Make before break for engine Deployments that change name (tiers going from one instance type to several, or
back): the new tier 0 takes over from the old Deployments replica by replica.

    handover(desired, mine, wanted, scaled, creates) -> (held keys, shrink patches)

- The new tier 0, when created, starts with the replicas the old ones run (KEDA had scaled them; render's count
  is the minimum), never more than its ScaledObject's maxReplicaCount. Overflow tiers start as rendered (0):
  they take what tier 0 cannot place, as always.
- The old Deployments keep serving, and shrink as the new tier 0's replicas become available: together they
  run what tier 0 wants, so a NodePool's GPU limit that cannot hold both fleets at once frees a node per new
  replica instead of leaving the rest Pending for ever. At zero they are deleted.
- Their NodePools (a tier the new layout no longer has) stay while they do: deleting one had Karpenter drain
  the nodes of replicas that were still serving. So do their PodDisruptionBudgets: deleted at once, a drain or a
  consolidation could evict every replica still serving at the same time.

Replacing at once dropped a fleet of 5 busy replicas to 1 cold one for the minutes of a model load.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetserve.k8s.labels import COMPONENT_LABEL, TIER_LABEL
from fleetserve.k8s.reconcile import Action, Key, key

ENGINE = "engine"


def _labels(obj: dict) -> dict:
    return (obj.get("metadata") or {}).get("labels") or {}


def _replicas(obj: dict) -> int:
    return int((obj.get("spec") or {}).get("replicas", 1))


def _available(obj: dict) -> int:
    """Replicas of `obj`'s current spec that are available (none before the controller has seen that spec)."""
    status, meta = obj.get("status") or {}, obj.get("metadata") or {}
    if (status.get("observedGeneration") or 0) < meta.get("generation", 1):
        return 0
    return min(int(status.get("availableReplicas") or 0), int(status.get("updatedReplicas") or 0))


def _max_replicas(desired: Sequence[dict], target: tuple[str | None, str]) -> int | None:
    for obj in desired:
        if obj["kind"] == "ScaledObject" and (obj["metadata"].get("namespace"), obj["spec"]["scaleTargetRef"]
                                              ["name"]) == target:
            return obj["spec"].get("maxReplicaCount")
    return None


def handover(desired: Sequence[dict], mine: dict[Key, dict], wanted: set[Key], scaled: set, creates: list[Action],
             patches: list[Action]) -> tuple[set[Key], list[Action]]:
    """The old engine Deployments (and their tiers' NodePools and PodDisruptionBudgets) to keep this pass, and the
    patches of the handover: the old ones shrinking as the new tiers' replicas become available, the new tier 0
    raised to what the old ones run. A NodePool of a held tier that the new layout changes keeps the old instance
    types beside the new ones meanwhile (`patches` are widened in place): narrowed at once, Karpenter replaced the
    nodes under the held replicas as drifted."""
    old = [k for k, o in mine.items() if k not in wanted and k[1] == "Deployment"
           and _labels(o).get(COMPONENT_LABEL) == ENGINE]
    tiers_new = [o for o in desired if o["kind"] == "Deployment" and _labels(o).get(COMPONENT_LABEL) == ENGINE]
    if not old or not tiers_new:
        return set(), []
    first = tiers_new[0]
    old.sort(key=lambda k: _labels(mine[k]).get(TIER_LABEL, ""))
    running = sum(_replicas(mine[k]) for k in old)
    target = (first["metadata"].get("namespace"), first["metadata"]["name"])
    extra: list[Action] = []
    if target in scaled:
        most = _max_replicas(desired, target)
        grown = min(running, most) if most is not None else running
        created = next((a for a in creates if a.kind == "Deployment" and (a.namespace, a.name) == target), None)
        if created is not None:
            wants = created.body["spec"]["replicas"] = max(_replicas(created.body), grown)
        else:  # it exists: the old name wanted again mid-handover, or KEDA resized it; never below what they run
            now = _replicas(mine[key(first)])
            wants = max(now, grown)
            if wants > now:
                extra.append(Action("patch", *key(first), {"spec": {"replicas": wants}},
                                    f"taking over {running} replica(s) from {', '.join(k[3] for k in old)}"))
    else:
        wants = _replicas(first)  # a static count: the usual patch sets it
    # every new tier's available replicas count: the overflow tiers take what tier 0 cannot place
    serving = sum(_available(mine[key(o)]) for o in tiers_new if key(o) in mine)
    left = max(0, wants - serving)  # what the old ones still serve
    held: set[Key] = set()
    for k in old:
        keep = min(_replicas(mine[k]), left)
        left -= keep
        if keep == 0:
            continue  # deleted: the new tiers serve its share
        held.add(k)
        if keep < _replicas(mine[k]):
            extra.append(Action("patch", *k, {"spec": {"replicas": keep}}, "handing over to " + target[1]))
    tiers = {_labels(mine[k]).get(TIER_LABEL) for k in held}
    # a budget the new layout has for the same pods already covers them: two budgets over one pod make the
    # Eviction API refuse it, and every drain and consolidation failed for the whole handover
    budgets = {_selector(o) for o in desired if o["kind"] == "PodDisruptionBudget"}
    for k, o in mine.items():
        if k[1] not in ("NodePool", "PodDisruptionBudget") or _labels(o).get(TIER_LABEL) not in tiers:
            continue
        if k[1] == "PodDisruptionBudget" and _selector(o) in budgets:
            continue
        if k not in wanted:
            held.add(k)
        elif k[1] == "NodePool":
            for action in patches:
                if (action.kind, action.name) == ("NodePool", k[3]):
                    _widen(action.body, o)
    return held, extra


def _selector(obj: dict) -> str:
    return repr(sorted((((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}).items()))


def _widen(patch: dict, observed: dict) -> None:
    """A NodePool patch's `In` requirements, with the values the observed pool allows kept beside the new ones."""
    wanted = ((((patch.get("spec") or {}).get("template") or {}).get("spec") or {}).get("requirements"))
    if not isinstance(wanted, list):
        return
    before = {(r.get("key"), r.get("operator")): r.get("values") or []
              for r in (((observed.get("spec") or {}).get("template") or {}).get("spec") or {}).get("requirements")
              or ()}
    for requirement in wanted:
        if requirement.get("operator") == "In":
            kept = before.get((requirement.get("key"), "In"), [])
            requirement["values"] = list(dict.fromkeys([*requirement.get("values", []), *kept]))

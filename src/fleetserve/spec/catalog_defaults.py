"""What `model.source: catalog:NAME` fills in: the preset's engine, GPUs, arguments and instance types, for each
setting the spec leaves out, so that `up`, `simulate`, `plan` and `render k8s` serve one model the same way.

Before, the preset named only the weights: `catalog:llama-3.1-8b-instruct` with nothing else rendered a
built-in CPU engine on no particular node, and with `engine.kind: vllm` a vLLM without the preset's
`--max-model-len`. A setting the spec gives always wins; the preset's arguments are added only for its own
engine (vLLM's flags are not SGLang's), and only those flags the spec's arguments do not already name (a
`model.contextLength` names the engine's context flag: the preset's `--max-model-len 8192` after it overrode a
`contextLength: 32768` in vLLM, which keeps the last).
"""

from __future__ import annotations

from typing import Any


def _given(section: dict, *names: str) -> bool:
    return any(name in section for name in names)


def _flags(args: list) -> set[str]:
    return {str(a).split("=", 1)[0] for a in args if str(a).startswith("--")}


def _options(args: tuple[str, ...]) -> list[list[str]]:
    """`--flag value` and `--switch` as [flag, value] and [switch]."""
    out: list[list[str]] = []
    for arg in args:
        if arg.startswith("--") or not out:
            out.append([arg])
        else:
            out[-1].append(arg)
    return out


def fill_from_catalog(data: Any) -> Any:
    """`data` (the raw `spec` mapping) with the preset's settings where it has none; unchanged otherwise."""
    if not isinstance(data, dict):
        return data
    model = data.get("model")
    source = model.get("source") if isinstance(model, dict) else None
    if not isinstance(source, str) or not source.startswith("catalog:"):
        return data
    from fleetserve.engine.catalog import CATALOG

    preset = CATALOG.get(source.removeprefix("catalog:"))
    if preset is None:
        return data  # the source's own validator names the allowed ones
    data = dict(data)
    engine = data.get("engine")
    if engine is None:
        engine = {}
    if not isinstance(engine, dict):
        return data  # a wrong type is named by the model's validation
    engine = dict(engine)
    if not _given(engine, "kind"):
        engine["kind"] = preset.engine
    if engine["kind"] == preset.engine:
        if preset.gpus and not _given(engine, "gpus"):
            engine["gpus"] = preset.gpus
        args = engine.get("args")
        if isinstance(args, list) or args is None:
            named = _flags(args or [])
            if any(model.get(k) is not None for k in ("contextLength", "context_length")):  # the spec's wins
                from fleetserve.spec.context import ENGINE_FLAGS

                named.add(ENGINE_FLAGS.get(engine["kind"], ""))
            engine["args"] = [token for flag, *value in _options(preset.args) if flag not in named
                              for token in (flag, *value)] + list(args or [])
        placement = data.get("placement")
        if placement is None or isinstance(placement, dict):
            placement = dict(placement or {})
            if preset.instance_types != ("local",) and not _given(
                    placement, "instanceTypes", "instance_types", "nodeAffinity", "node_affinity"):
                placement["instanceTypes"] = list(preset.instance_types)
                _allow_larger(data, preset)
            data["placement"] = placement
    data["engine"] = engine
    return data


def _allow_larger(data: dict, preset) -> None:
    """The preset's types of more GPUs than its replica asks (the 70B's 4 GPUs on an 8-GPU p4d or p5) are usable
    only with `capacity.allowLargerInstances`: set it where the spec says nothing, or the preset's own fallbacks
    could never take a replica."""
    from fleetserve.capacity.catalog import Catalog

    catalog = Catalog.builtin()
    if not preset.gpus or not any(n in catalog and catalog.get(n).gpus > preset.gpus for n in preset.instance_types):
        return
    capacity = data.get("capacity")
    if capacity is None or isinstance(capacity, dict):
        capacity = dict(capacity or {})
        if not _given(capacity, "allowLargerInstances", "allow_larger_instances"):
            capacity["allowLargerInstances"] = True
        data["capacity"] = capacity


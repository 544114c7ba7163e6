"""What a router answers itself while no replica is ready: the model names (`fleetserve router --model NAME`)
and, in front of the built-in engines, a bad body (`--check-bodies`).

At zero replicas the router holds requests until one is ready, and the held requests wake the fleet. A
listing of models, or a request for a name the fleet does not serve, need no replica: the router answers them
from the served name. Engines that load LoRA adapters serve names the spec does not list, and an external
engine's names are its own: for them the router knows none and holds everything, as before.

A body the engines will refuse need not wait for one either: it had woken a fleet at zero and got its 400 after
the cold start (minutes on a GPU, paid for), or a 503 `replicas_failing` where the answer was a 400. In front of
the built-in engines (and their simulated kind), whose checks the router shares (`api/protocol.parse_generation`:
types, ranges, what they do not support), the router runs them on a request it would hold or refuse for want
of a replica; a replica ready takes the request at once, unchecked here, as before. vLLM and SGLang support
what the built-in engines refuse (tools, n, logprobs): in front of them the router checks nothing.
"""

from __future__ import annotations

LORA_FLAGS = frozenset({"--enable-lora", "--lora-modules", "--lora-paths", "--max-loras"})


def served_model_args(name: str, engine_kind: str, engine_args: list[str]) -> list[str]:
    """`--model NAME` for the router, or nothing when the replicas may serve other names."""
    if engine_kind in ("external", "container") or any(a.split("=", 1)[0] in LORA_FLAGS for a in engine_args):
        return []
    return ["--model", name]


def body_check_args(engine_kind: str) -> list[str]:
    """`--check-bodies` for the router in front of engines that read bodies as `api/protocol` does."""
    return ["--check-bodies"] if engine_kind == "builtin" else []

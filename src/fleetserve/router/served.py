"""The model names a router answers for while no replica is ready (`fleetserve router --model NAME`).

At zero replicas the router holds requests until one is ready, and the held requests wake the fleet. A
listing of models, or a request for a name the fleet does not serve, need no replica: the router answers them
from the served name. Engines that load LoRA adapters serve names the spec does not list, and an external
engine's names are its own: for them the router knows none and holds everything, as before.
"""

from __future__ import annotations

LORA_FLAGS = frozenset({"--enable-lora", "--lora-modules", "--lora-paths", "--max-loras"})


def served_model_args(name: str, engine_kind: str, engine_args: list[str]) -> list[str]:
    """`--model NAME` for the router, or nothing when the replicas may serve other names."""
    if engine_kind in ("external", "container") or any(a.split("=", 1)[0] in LORA_FLAGS for a in engine_args):
        return []
    return ["--model", name]

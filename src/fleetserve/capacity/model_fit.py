"""The GPU memory a model needs, from the parameter count its spec states.

One place for every part that asks "does this model fit on that GPU?": placement in the live fleet's simulated
cloud, in the simulator and in `plan` (through `placement.replica_request`), `validate`'s warnings, and the
roofline profiles' own fit condition (`sim/profiles.derive`). The check lived in the simulator only, so a 70B
on one 24 GB GPU was refused by `verify` and `plan` but placed by `fleetserve up` on a simulated cloud, and
`validate` said nothing.

Weights are counted in bf16 (2 bytes a parameter) with `RESERVED_PER_GPU` on each GPU (activations, CUDA graphs),
all within vLLM's default `gpu_memory_utilization`. A model whose size nothing states asks for no GPU memory.
"""

from __future__ import annotations

import re

GIB = 1 << 30
GPU_MEMORY_UTILIZATION = 0.9  # vLLM default
RESERVED_PER_GPU = 1 * GIB  # activations, CUDA graphs
BYTES_PER_PARAMETER = 2  # bf16

# a parameter count written as a word of its own in a model name: 70B, 8b, 7.5B (not 8x7b, not a hash's 3c70b91)
_SIZE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)b(?![\w])")
# and in millions, in the model's name or source only (smollm2-135m, 360M; an engine argument's 4m is a size of
# something else): the demo model was "of unknown size" and simulated as an 8B without saying why
_MILLIONS = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)m(?![\w])")


def stated_size(model, engine) -> float | None:
    """Billions of parameters the model's name, source or engine arguments state (the largest), or None."""
    named = " ".join(str(t) for t in (model.source, model.name)).lower()
    said = " ".join([named, *(str(a) for a in engine.args)]).lower()
    sizes = [float(m) for m in _SIZE.findall(said)] + [float(m) / 1000 for m in _MILLIONS.findall(named)]
    return max(sizes) if sizes else None


def gpu_memory_needed_gib(params_b: float, gpus: int) -> float:
    """GPU memory `gpus` GPUs need together to load a model of `params_b` billion parameters: bf16 weights and
    RESERVED_PER_GPU on each, within GPU_MEMORY_UTILIZATION of their memory (the roofline's fit condition)."""
    return round((params_b * 1e9 * BYTES_PER_PARAMETER + gpus * RESERVED_PER_GPU) / GIB / GPU_MEMORY_UTILIZATION, 1)

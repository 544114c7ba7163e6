"""Performance profiles as files, and shipped presets for GPU instance types with their sources.

A profile file is JSON with `PerfProfile`'s fields at the top level (what `fleetserve profile` writes), plus
free-form context (`model`, `device`, `measurements`, ...) that loaders ignore. Only the fields the running
`PerfProfile` declares are passed to it, so a file written with more fields loads into an older model, and
a newer model's new fields keep their defaults when a file lacks them.

Presets are derived, not measured here: a roofline from each GPU's datasheet (memory bandwidth and dense
BF16 tensor throughput) and the model's published shape, with two stated efficiency assumptions:

    decode step   = (weights + KV read) / (bandwidth x MBU) + fixed step overhead + per-sequence compute
    prefill token = 2 x params FLOPs / (tensor FLOP/s x MFU)
    KV capacity   = GPU memory x 0.9 (vLLM's default gpu_memory_utilization) - weights - 1 GiB per GPU

The scheduler's budgets are vLLM's own defaults for its OpenAI server (`EngineArgs.get_batch_defaults`): GPUs
with at least 70 GiB that are not A100s (H100, H200) schedule 8,192 tokens per step and 1,024 sequences, the
others 2,048 and 256 (an A100's larger budget lowered its throughput, vLLM PR #17885).

with MBU = 0.6 and MFU = 0.5 (assumptions within the ranges inference engines publish for bf16 at moderate
batch; tensor parallelism over n GPUs multiplies bandwidth and FLOP/s by n x 0.85 for its all-reduces).
Load times are the Ray Serve LLM cold starts measured on H100 (research/autoscale.md 10.1): 71 s for an
8B model at TP1 and 126 s for a 70B model at TP4 with optimised loading. They are meant for comparing
instance types and policies; measure your own with `fleetserve profile` where it matters.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

from fleetserve.capacity.model_fit import GIB, GPU_MEMORY_UTILIZATION, RESERVED_PER_GPU
from fleetserve.sim.perf import PROFILES, PerfProfile

FORMAT = "fleetserve.profile/v1"
MBU = 0.6
MFU = 0.5
TP_EFFICIENCY = 0.85
STEP_OVERHEAD_S = 0.002  # scheduler + kernel launches per engine step (CUDA graphs keep it small)


class ProfileError(ValueError):
    """A profile that cannot be loaded; the message names the file or preset and what is allowed."""


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float
    bandwidth_gbs: float  # GB/s
    bf16_tflops: float  # dense
    source: str


@dataclass(frozen=True)
class Model:
    name: str
    params_b: float
    layers: int
    kv_heads: int
    head_dim: int
    source: str

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * 2  # bf16

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * self.kv_heads * self.head_dim * 2 * 2  # K and V, bf16


GPUS = {
    "A10G": GPU("A10G", 24, 600, 70, "AWS G5 (A10G): 24 GB GDDR6, 600 GB/s (same memory as the A10, whose datasheet "
                "gives 125 dense BF16 TFLOPS; the A10G's tensor rate is lower, ~70 TFLOPS, per Baseten 'NVIDIA A10 vs "
                "A10G for ML model inference')"),
    "L4": GPU("L4", 24, 300, 121, "NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s, 242 BF16 TFLOPS with sparsity "
              "(121 dense)"),
    "L40S": GPU("L40S", 48, 864, 362, "NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s, 362.05 BF16 TFLOPS dense "
                "(733 with sparsity)"),
    "A100-40GB": GPU("A100-40GB", 40, 1555, 312, "NVIDIA A100 datasheet: 40 GB HBM2, 1,555 GB/s, 312 BF16 "
                     "TFLOPS dense"),
    "A100-80GB": GPU("A100-80GB", 80, 2039, 312, "NVIDIA A100 datasheet: 80 GB HBM2e (SXM), 2,039 GB/s, 312 "
                     "BF16 TFLOPS dense"),
    "H100-80GB": GPU("H100-80GB", 80, 3350, 989, "NVIDIA H100 SXM datasheet: 80 GB HBM3, 3.35 TB/s, 989 BF16 "
                     "TFLOPS dense (1,979 with sparsity)"),
}

MODELS = {
    "llama-3.1-8b": Model("llama-3.1-8b", 8.03, 32, 8, 128, "meta-llama/Llama-3.1-8B config.json: 32 layers, 8 KV "
                          "heads of 128 dims; 8.03B parameters"),
    "llama-3.1-70b": Model("llama-3.1-70b", 70.6, 80, 8, 128, "meta-llama/Llama-3.1-70B config.json: 80 layers, 8 "
                           "KV heads of 128 dims; 70.6B parameters"),
}

# preset name -> (GPU, GPUs per replica, model, instance type it fits)
PRESET_SHAPES = {
    "a10g-llama-8b": ("A10G", 1, "llama-3.1-8b", "g5.xlarge"),
    "l4-llama-8b": ("L4", 1, "llama-3.1-8b", "g6.xlarge"),
    "l40s-llama-8b": ("L40S", 1, "llama-3.1-8b", "g6e.xlarge"),
    "a100-llama-8b": ("A100-40GB", 1, "llama-3.1-8b", "p4d.24xlarge (1 of 8 GPUs)"),
    "h100-llama-8b": ("H100-80GB", 1, "llama-3.1-8b", "p5.48xlarge (1 of 8 GPUs)"),
    "a10g-x8-llama-70b": ("A10G", 8, "llama-3.1-70b", "g5.48xlarge"),
    "l4-x8-llama-70b": ("L4", 8, "llama-3.1-70b", "g6.48xlarge"),
    "l40s-x4-llama-70b": ("L40S", 4, "llama-3.1-70b", "g6e.12xlarge"),
    "a100-x8-llama-70b": ("A100-40GB", 8, "llama-3.1-70b", "p4d.24xlarge"),
    "h100-x4-llama-70b": ("H100-80GB", 4, "llama-3.1-70b", "p5.48xlarge (4 of 8 GPUs)"),
}
LOAD_S = {"llama-3.1-8b": 71.0, "llama-3.1-70b": 126.0}


def vllm_batch_defaults(gpu: GPU) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM's OpenAI server picks on this GPU when not told."""
    if gpu.memory_gib >= 70 and "A100" not in gpu.name:
        return 8192, 1024
    return 2048, 256


def derive(name: str, gpu: GPU, n: int, model: Model, block_size: int = 256) -> dict:
    """A preset's profile fields from the roofline above (see the module docstring)."""
    scale = n * (TP_EFFICIENCY if n > 1 else 1.0)
    bandwidth = gpu.bandwidth_gbs * 1e9 * scale * MBU
    flops = gpu.bf16_tflops * 1e12 * scale * MFU
    kv_bytes = model.kv_bytes_per_token
    free = n * (gpu.memory_gib * GIB * GPU_MEMORY_UTILIZATION - RESERVED_PER_GPU) - model.weight_bytes
    if free <= 0:
        raise ProfileError(f"{model.name} does not fit on {n} x {gpu.name}")
    weights_read_s = model.weight_bytes / bandwidth
    per_token_flops_s = 2 * model.params_b * 1e9 / flops
    chunk, seqs = vllm_batch_defaults(gpu)
    return {
        "format": FORMAT,
        "name": name,
        "prefill_base_s": round(weights_read_s + STEP_OVERHEAD_S, 6),
        "prefill_per_token_s": per_token_flops_s,
        "decode_base_s": round(weights_read_s + STEP_OVERHEAD_S, 6),
        "decode_per_seq_s": per_token_flops_s,
        "decode_per_ctx_token_s": kv_bytes / bandwidth,
        "cache_blocks": int(free // (kv_bytes * block_size)),
        "block_size": block_size,
        "max_batch": seqs,  # vLLM max_num_seqs default on this GPU
        "prefill_chunk": chunk,  # vLLM max_num_batched_tokens default (chunked prefill is always on in V1)
        "load_s": LOAD_S[model.name],
        "kv_bytes_per_token": kv_bytes,
        "gpus": n,
        "gpu": gpu.name,
        "model": model.name,
        "source": f"derived (roofline, MBU {MBU}, MFU {MFU}): {gpu.source}; {model.source}; load time: Ray Serve "
                  "LLM cold start on H100 (research/autoscale.md 10.1)",
    }


def preset_dict(name: str) -> dict:
    try:
        gpu, n, model, instance = PRESET_SHAPES[name]
    except KeyError:
        raise ProfileError(f"unknown profile preset {name!r}; allowed: {', '.join(PRESET_SHAPES)}") from None
    return {**derive(name, GPUS[gpu], n, MODELS[model]), "instance_type": instance}


PRESETS = {name: preset_dict(name) for name in PRESET_SHAPES}


def derived_profile(gpu: str, n: int, model: str) -> PerfProfile:
    """The roofline profile of `model` (a MODELS key) on `n` GPUs named `gpu` (a GPUS key), for shapes no preset
    names (a 70B model on 8 GPUs, an 8B on two); ProfileError when the GPU is unknown or the model does not fit."""
    if gpu not in GPUS or model not in MODELS:
        raise ProfileError(f"no roofline for {model} on {gpu}; GPUs: {', '.join(GPUS)}; models: {', '.join(MODELS)}")
    name = f"{gpu.lower()}-x{n}-{model.removeprefix('llama-3.1-')}"
    return profile_from_dict(derive(name, GPUS[gpu], n, MODELS[model]))


def profile_from_dict(data: dict) -> PerfProfile:
    """A PerfProfile from a profile dict: fields it declares are taken, everything else is context."""
    if not isinstance(data, dict):
        raise ProfileError("a profile is a JSON object")
    declared = {f.name: f for f in fields(PerfProfile)}
    values = {k: v for k, v in data.items() if k in declared}
    missing = [n for n, f in declared.items() if n not in values and f.default is MISSING
               and f.default_factory is MISSING]
    if missing:
        raise ProfileError(f"profile lacks {', '.join(missing)}")
    text = values.get("first_text_tokens")
    if text is not None:
        if not isinstance(text, list | tuple) or not all(isinstance(k, int) and k >= 0 for k in text):
            raise ProfileError(f"profile field first_text_tokens must be a list of token indices, got {text!r}")
        values["first_text_tokens"] = tuple(text)
    samples = values.get("request_overhead_samples")
    if samples is not None:
        if not isinstance(samples, list | tuple) or not all(
                isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x <= MAX_STEP_SECONDS
                for x in samples):
            raise ProfileError(f"profile field request_overhead_samples must be a list of seconds from 0 to "
                               f"{MAX_STEP_SECONDS:g}, got {samples!r}"[:300])
        values["request_overhead_samples"] = tuple(float(x) for x in samples)
    whole = values.get("whole_prefill_when_idle")
    if whole is not None and not isinstance(whole, bool):
        raise ProfileError(f"profile field whole_prefill_when_idle must be true or false, got {whole!r}")
    for k, v in values.items():
        if k in ("name", "source", "first_text_tokens", "request_overhead_samples", "whole_prefill_when_idle"):
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not math.isfinite(v)):
            raise ProfileError(f"profile field {k} must be a number, got {v!r}")
        # a batch or chunk of 0 never admitted a request (simulate hung), a block of 0 divided by zero, and
        # negative times gave 0 ms latencies with exit 0
        if k in COUNT_FIELDS and (v < 1 or v > MAX_COUNT or not float(v).is_integer()):
            raise ProfileError(f"profile field {k} must be a whole number from 1 to {MAX_COUNT}, got {v!r}")
        if k in RATE_FIELDS and v <= 0:
            raise ProfileError(f"profile field {k} must be above 0, got {v!r}")
        if v < 0:
            raise ProfileError(f"profile field {k} must not be negative, got {v!r}")
        most = MAX_SECONDS.get(k)
        if most is not None and v > most:  # a 1e4 s decode step ran simulate for ever, a 1e308 printed 309 digits
            raise ProfileError(f"profile field {k} must be at most {most:g} seconds, got {v!r}")
    if all(values.get(k, 1) == 0 for k in TIME_FIELDS):  # every request answered in 0 ms, and verify passed
        raise ProfileError(f"profile fields {', '.join(TIME_FIELDS)} are all 0: an engine that takes no time at all")
    for k in COUNT_FIELDS:
        if k in values:
            values[k] = int(values[k])
    return PerfProfile(**values)


TIME_FIELDS = ("prefill_base_s", "prefill_per_token_s", "decode_base_s", "decode_per_seq_s")
COUNT_FIELDS = ("cache_blocks", "block_size", "max_batch", "prefill_chunk", "kv_bytes_per_token")
RATE_FIELDS = ("l1_gbps", "l2_gbps")  # divided by
MAX_STEP_SECONDS = 60.0  # a step, a token or a request's overhead taking longer is a typo, not an engine
MAX_SECONDS = {**{k: MAX_STEP_SECONDS for k in ("prefill_base_s", "prefill_per_token_s", "decode_base_s",
                                                "decode_per_seq_s", "decode_per_ctx_token_s", "request_overhead_s")},
               "load_s": 3600.0}
MAX_COUNT = 1 << 40  # blocks, tokens, bytes: past this a value is a typo (and 10**400 did not fit a float)


FILE_DEFAULT_PREFILL_CHUNK = 2048  # vLLM V1's max_num_batched_tokens for an API server on a GPU under 70 GiB


def load_profile_file(path: str | Path) -> PerfProfile:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"{p}: cannot read ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as exc:
        # nesting past the recursion limit, a 5,000-digit number, bytes that are not UTF-8: tracebacks before
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ProfileError(f"{p}: not JSON ({why})") from None
    fmt = data.get("format") if isinstance(data, dict) else None
    if fmt is not None and fmt != FORMAT:  # a later format may mean other units: refused, not misread
        raise ProfileError(f"{p}: format {fmt!r} is not one this version reads; allowed: {FORMAT}")
    if isinstance(data, dict) and "prefill_chunk" not in data:
        # a hand-written file that says nothing of chunking gets vLLM V1's default budget (chunked prefill is
        # always on there), not the dataclass's whole-prompt steps, which no current engine takes
        data = {**data, "prefill_chunk": FILE_DEFAULT_PREFILL_CHUNK}
    try:
        return profile_from_dict(data)
    except ProfileError as exc:
        raise ProfileError(f"{p}: {exc}") from None


def resolve(name_or_path: str) -> PerfProfile:
    """A preset here, a preset of `sim.perf`, or a profile JSON file."""
    if name_or_path in PRESETS:
        return profile_from_dict(PRESETS[name_or_path])
    if name_or_path in PROFILES:
        return PROFILES[name_or_path]
    if Path(name_or_path).is_file():
        return load_profile_file(name_or_path)
    if name_or_path.endswith(".json") or "/" in name_or_path:  # a file that is not there, not an unknown preset
        raise ProfileError(f"{name_or_path}: no such file (or a folder); a profile is a preset name or a JSON file")
    raise ProfileError(f"unknown profile {name_or_path!r}; allowed: {', '.join([*PRESETS, *PROFILES])} or a "
                       "profile JSON file")


def kv_bytes_per_token(name_or_path: str, default: int = 131_072) -> int:
    """The KV bytes per token a preset or file states (PerfProfile may not carry it)."""
    if name_or_path in PRESETS:
        return int(PRESETS[name_or_path]["kv_bytes_per_token"])
    p = Path(name_or_path)
    if p.is_file():
        try:
            return int(json.loads(p.read_text()).get("kv_bytes_per_token", default))
        except (OSError, ValueError, AttributeError):
            return default
    return int(getattr(PROFILES.get(name_or_path), "kv_bytes_per_token", default))


def to_dict(profile: PerfProfile, **context) -> dict:
    return {"format": FORMAT, **asdict(profile), **context}

"""The context length a spec's engines will enforce: `spec.model.contextLength`, else the engine's own flag in
`spec.engine.args` (vLLM `--max-model-len`, SGLang `--context-length`; HyperPod specs carry it there), and for the
built-in engine never more than the model's own maximum where the catalog knows it offline (`builtin:` and
`catalog:` demo models): the engine clamps a longer `contextLength` to it (`engine/runner.py`).

A real engine rejects a request whose prompt and completion do not fit; the simulator reports how many of a
trace's requests would be (`sim.run`), so a spec that cannot serve a trace is not verified in silence."""

from __future__ import annotations

import json
import re
from pathlib import Path

ENGINE_FLAGS = {"vllm": "--max-model-len", "sglang": "--context-length"}
# vLLM reads 4096, 4k / 1.5m (powers of 1000), 4K / 1M (powers of 1024, whole numbers), and -1 or auto (as long
# as memory allows)
_VLLM_TOKENS = re.compile(r"(\d+)|(\d+(?:\.\d+)?)([kmgt])|(\d+)([KMGT])")
_UNITS = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _flag_value(spec) -> tuple[str, str | None] | None:
    """(flag, its value or None when the flag ends the list) as written in `spec.engine.args`, or None."""
    flag = ENGINE_FLAGS.get(spec.engine.kind)
    if flag is None:
        return None
    return flag_in_args(spec.engine.args, flag)


def flag_in_args(args, flag: str) -> tuple[str, str | None] | None:
    """(flag, its value or None when the flag ends the list) in an argument list (`--flag v` or `--flag=v`)."""
    args = [str(a) for a in args]
    for i, arg in enumerate(args):
        if arg == flag:
            return flag, args[i + 1] if i + 1 < len(args) else None
        if arg.startswith(flag + "="):
            return flag, arg[len(flag) + 1:]
    return None


def flag_tokens(kind: str, value: str) -> int | None:
    """The token count an engine reads from its context flag; None for vLLM's -1 (no fixed limit). ValueError
    names what the engine would accept."""
    if kind == "vllm":
        text = value.strip()
        if text == "-1" or text.lower() == "auto":
            return None
        m = _VLLM_TOKENS.fullmatch(text)
        if m:
            tokens = int(m[1]) if m[1] else int(float(m[2]) * _UNITS[m[3]]) if m[2] else int(m[4]) * _UNITS[m[5]]
            if tokens > 0:
                return tokens
        raise ValueError("allowed: a positive token count (4096, 4k, 4K) or -1 / auto")
    if value.strip().isdigit() and int(value) > 0:
        return int(value)
    raise ValueError("allowed: a positive whole number of tokens")


def context_flag_problem(spec) -> str | None:
    """Why the engine would refuse the context flag in `spec.engine.args`, or None."""
    found = _flag_value(spec)
    if found is None:
        return None
    flag, value = found
    if value is None:
        return f"{flag} has no value"
    try:
        tokens = flag_tokens(spec.engine.kind, value)
    except ValueError as exc:
        return f"{flag} {value!r} is not a context length; {exc}"
    declared = spec.model.context_length
    if declared and tokens != declared:  # the engine gets both, and keeps the last: the args'
        return (f"{flag} {value} disagrees with model.contextLength {declared}: the engine would enforce "
                f"{flag}'s; give the context length once")
    return None


MODEL_MAXIMUM = "the model's own maximum"  # the start of `model_maximum`'s "where"


def model_maximum(spec) -> tuple[int, str] | None:
    """(tokens, where) of the longest context the spec's model takes, known without loading it: a catalog preset
    (`catalog:NAME`, or its source), or for vLLM and SGLang a model whose source or name is a preset's weights
    (an S3 folder `models/Llama-3.1-8B-Instruct`, as HyperPod specs give it); None when it is not known here."""
    preset = _preset_of(spec)
    if preset is None:
        return _folder_maximum(spec)
    return preset.model_maximum, f"{MODEL_MAXIMUM} ({preset.name}, engine/catalog.py)"


def _folder_maximum(spec) -> tuple[int, str] | None:
    """The built-in engine's model in a local folder: its config's `max_position_embeddings` (or the name its
    architecture gives it), which the engine clamps every context to (`engine/runner.py`); read without loading it.
    Before, the simulator served a tiny model's 5,000-token requests that the engine refuses."""
    source = spec.model.source if isinstance(spec.model.source, str) else ""
    if spec.engine.kind != "builtin" or not source or ":" in source.split("/", 1)[0]:
        return None  # a scheme (hf:, s3://, builtin:) is not a folder here
    config = Path(source).expanduser() / "config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    # the names transformers' configs map to max_position_embeddings (GPT-2's n_positions, ...); a config with
    # none of them takes its class default, unknown here: no bound rather than a guess
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx"):
        tokens = data.get(key)
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
            return tokens, f"{MODEL_MAXIMUM} ({config}: {key})"
    return None


def _preset_of(spec):
    source = spec.model.source if isinstance(spec.model.source, str) else ""
    from fleetserve.engine.catalog import CATALOG, by_source

    kind = spec.engine.kind
    if kind not in ENGINE_FLAGS and kind != "builtin":
        return None  # an external server enforces what it enforces
    named = by_source(source)
    if named is not None:
        return named if named.engine == kind or kind != "builtin" else None
    if kind == "builtin":
        return None  # the built-in engine reads the model's own config when it loads it
    names = {source.rstrip("/").rsplit("/", 1)[-1].lower(), (spec.model.name or "").lower()}
    for preset in CATALOG.values():
        if preset.source.startswith("hf:") and preset.source.rsplit("/", 1)[-1].lower() in names:
            return preset
    return None


def context_warning(spec) -> str | None:
    """vLLM refuses to start with a context above the model's own maximum (unless told to allow it, with rope
    scaling); the simulator serves the maximum, so the spec is not verified on a context it cannot get."""
    declared, native = declared_limit(spec), model_maximum(spec)
    if spec.engine.kind not in ENGINE_FLAGS or declared is None or native is None or declared[0] <= native[0]:
        return None
    return (f"{declared[0]} tokens is above {native[1]}, {native[0]}: {spec.engine.kind} refuses to start with it "
            f"unless the model's context is extended (rope scaling); verify and plan use {native[0]}")


def context_limit(spec) -> tuple[int, str] | None:
    """(tokens, where it was declared), or None when nothing bounds it here: the declared limit, or the model's
    own maximum when that is shorter or nothing is declared."""
    declared = declared_limit(spec)
    native = model_maximum(spec)
    if native is not None and (declared is None or native[0] < declared[0]):
        return native
    return declared


def declared_limit(spec) -> tuple[int, str] | None:
    """The context the spec itself declares (model.contextLength, or the engine's own flag), or None."""
    if spec.model.context_length:
        return spec.model.context_length, "spec.model.contextLength"
    found = _flag_value(spec)
    if found is None or found[1] is None:
        return None
    flag, value = found
    try:
        tokens = flag_tokens(spec.engine.kind, value)
    except ValueError:
        return None  # the spec's validation names it
    if not tokens:
        return None
    return tokens, f"spec.engine.args {flag}{_from_preset(spec, flag, value)}"


def _from_preset(spec, flag: str, value: str) -> str:
    """Where a `catalog:` spec's context flag came from when the spec did not write it: the preset's arguments."""
    source = spec.model.source if isinstance(spec.model.source, str) else ""
    if not source.startswith("catalog:"):
        return ""
    from fleetserve.engine.catalog import CATALOG

    preset = CATALOG.get(source.removeprefix("catalog:"))
    if preset is not None and flag_in_args(preset.args, flag) == (flag, value):
        return f", from the {source} preset's arguments (engine/catalog.py)"
    return ""


def with_context_limit(data: dict, tokens: int, source: str) -> dict:
    """A spec's data (camelCase, as dumped) with the limit `context_limit` found at `source` set to `tokens` (and the
    engine's flag too, where the spec gives both: they must agree)."""
    spec = data["spec"]
    if source == "spec.model.contextLength":
        spec["model"]["contextLength"] = tokens
    flag = ENGINE_FLAGS.get((spec.get("engine") or {}).get("kind"))
    if flag is None:
        return data
    args = [str(a) for a in spec["engine"].get("args") or ()]
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            args[i + 1] = str(tokens)
        elif arg.startswith(flag + "="):
            args[i] = f"{flag}={tokens}"
    spec["engine"]["args"] = args
    return data

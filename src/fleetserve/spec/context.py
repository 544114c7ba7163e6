"""The context length a spec's engines will enforce: `spec.model.contextLength`, else the engine's own flag in
`spec.engine.args` (vLLM `--max-model-len`, SGLang `--context-length`; HyperPod specs carry it there).

A real engine rejects a request whose prompt and completion do not fit; the simulator reports how many of a
trace's requests would be (`sim.run`), so a spec that cannot serve a trace is not verified in silence."""

from __future__ import annotations

ENGINE_FLAGS = {"vllm": "--max-model-len", "sglang": "--context-length"}


def context_limit(spec) -> tuple[int, str] | None:
    """(tokens, where it was declared), or None when nothing bounds it here."""
    if spec.model.context_length:
        return spec.model.context_length, "spec.model.contextLength"
    flag = ENGINE_FLAGS.get(spec.engine.kind)
    if flag is None:
        return None
    args = [str(a) for a in spec.engine.args]
    for i, arg in enumerate(args):
        value = args[i + 1] if arg == flag and i + 1 < len(args) else arg.removeprefix(flag + "=")
        if (arg == flag or arg.startswith(flag + "=")) and value.isdigit() and int(value) > 0:
            return int(value), f"spec.engine.args {flag}"
    return None


def with_context_limit(data: dict, tokens: int, source: str) -> dict:
    """A spec's data (camelCase, as dumped) with the limit `context_limit` found at `source` set to `tokens`."""
    spec = data["spec"]
    if source == "spec.model.contextLength":
        spec["model"]["contextLength"] = tokens
        return data
    flag = ENGINE_FLAGS[spec["engine"]["kind"]]
    args = [str(a) for a in spec["engine"].get("args") or ()]
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            args[i + 1] = str(tokens)
        elif arg.startswith(flag + "="):
            args[i] = f"{flag}={tokens}"
    spec["engine"]["args"] = args
    return data

"""`fleetserve profile`: measure the built-in engine on this machine and fit the simulator's step model.

Everything runs in-process on the engine's own code paths: `ModelRunner` loads the model (timed: load_s),
prefill is the runner's model on a fresh cache for a whole prompt (what the batching scheduler does when no
decode waits), and decode steps run on the batching scheduler's `SlotCache` with its additive step mask, so
a step here is a step there. Each figure is the fastest of `repeats` runs after a warm-up: on a shared
machine the noise only ever adds time, so the minimum is the engine's own cost.

The fits are the `PerfProfile` model (`sim/perf.py`), by least squares with non-negative coefficients:

    prefill(n)        = prefill_base_s + prefill_per_token_s * n
    decode(b, ctx)    = decode_base_s + decode_per_seq_s * b + decode_per_ctx_token_s * (b * ctx)

KV bytes per token come from the model's shape and dtype; `cache_blocks` from the engine cache bytes.

With `text_probe` > 0, the profile also says what a streaming client sees of the output: greedy generations
(temperature 0, no stop at EOS, as a benchmark asks) of that many random prompts, detokenised by the engine's
own `TextStream`, give the token with which the first text chunk is sent (`first_text_tokens`: 1 for most
real models; a random model's byte tokens often show nothing until the end: 0).
"""

from __future__ import annotations

import gc
import itertools
import os
import platform
import time
from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np

from fleetserve.sim.profiles import FORMAT


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nonneg_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (all column subsets; we fit 2 or 3 columns)."""
    best, best_err = np.zeros(x.shape[1]), float("inf")
    for k in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), k):
            coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if (coef < 0).any():
                continue
            err = float(((x[:, cols] @ coef - y) ** 2).sum())
            if err < best_err:
                best_err, best = err, np.zeros(x.shape[1])
                best[list(cols)] = coef
    return best


def fit_warnings(prefills: list[dict], per_token_s: float, decodes: list[dict], coefs: tuple[float, ...]) -> list[str]:
    """What makes a fitted profile untrustworthy, said instead of written in silence: a prefill cost that does not
    grow with the prompt (the simulator would prefill any prompt at one price), a longer prompt measured faster
    than a shorter one, or a fit that explains little of what was measured. On a busy machine all three came out
    of default runs: prefill_per_token_s 0.0, then 2.9e-4, then 6.6e-6."""
    out = []
    if per_token_s <= 0:
        out.append("prefill_per_token_s is 0: the measured prefill time did not grow with the prompt, so the "
                   "simulator would prefill every prompt at one price")
    slower = [(a["tokens"], b["tokens"]) for a, b in zip(prefills, prefills[1:], strict=False)
              if b["seconds"] < 0.9 * a["seconds"]]
    if slower:
        out.append("longer prompts measured faster than shorter ones (" + ", ".join(
            f"{b} tokens < {a}" for a, b in slower) + ")")
    for what, points, r2 in (("prefill", prefills, _r2([p["seconds"] for p in prefills],
                                                       [coefs[0] + per_token_s * p["tokens"] for p in prefills])),
                             ("decode", decodes, _r2([d["step_s"] for d in decodes],
                                                     [coefs[1] + coefs[2] * d["batch"] + coefs[3] * d["batch"]
                                                      * d["context"] for d in decodes]))):
        if len(points) >= 3 and r2 < 0.8:
            out.append(f"the {what} fit explains {max(r2, 0.0):.0%} of the measured variation (R^2 {r2:.2f})")
    if out:
        out.append("the machine was probably busy: measure again on a quiet one, or with more --repeats")
    return out


def _r2(measured: list[float], fitted: list[float]) -> float:
    y = np.array(measured)
    total = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - np.array(fitted)) ** 2).sum()) / total if total > 0 else 1.0


PROMPT_LENGTHS = (32, 64, 128, 256, 512, 1024, 2048, 4096)  # prefill is measured at these, up to --max-prompt


class MeasureInputError(ValueError):
    """An option the measurement cannot use, named (the CLI exits 2 with it)."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


def _best_time(fn: Callable[[], None], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(model: str, *, dtype: str = "auto", threads: int | None = None, max_prompt: int = 2048,
            batches: tuple[int, ...] = (1, 2, 4, 8), repeats: int = 3, decode_steps: int = 4,
            cache_bytes: int = 512 << 20, block_size: int = 256, prefill_chunk: int = 256, max_batch: int = 8,
            text_probe: int = 0, text_tokens: int = 48, text_prompt: tuple[int, int] = (32, 192),
            progress: Callable[[str], None] | None = None) -> dict:
    import torch
    from transformers import DynamicCache

    from fleetserve.engine.batching import SlotCache
    from fleetserve.engine.runner import ModelRunner
    from fleetserve.engine.sources import resolve_source

    say = progress or (lambda _m: None)
    path = resolve_source(model)
    say("loading the model ...")
    start = time.perf_counter()
    runner = ModelRunner(path, dtype=dtype, threads=threads)
    load_s = time.perf_counter() - start
    config = runner.model.config
    layers, _, kv_heads, _, head_dim = runner.block_shape(1)  # (layers, K|V, kv heads, tokens, head dim)
    kv_bytes = layers * 2 * kv_heads * head_dim * torch.tensor([], dtype=runner.torch_dtype).element_size()
    if cache_bytes < kv_bytes * block_size:  # a profile of zero blocks is refused by every command that reads it
        raise MeasureInputError("--cache-bytes/--block-size", f"{cache_bytes} bytes hold no {block_size}-token "
                                f"block of this model ({kv_bytes * block_size} bytes per block): give more bytes or "
                                "fewer tokens per block")
    rng = np.random.default_rng(0)
    vocab = runner.vocab_size()
    ctx_limit = runner.context_length

    def ids(n: int) -> list[int]:
        return rng.integers(0, vocab, n).tolist()

    def prefill(tokens: list[int]):
        return runner.model(input_ids=torch.tensor([tokens]), cache=DynamicCache(config=config), use_cache=True,
                            logits_to_keep=1)

    lengths = [n for n in PROMPT_LENGTHS if n <= min(max_prompt, ctx_limit // 2)]
    if len(lengths) < 2:  # one length gives no slope: prefill_per_token_s came out 0, "the machine was busy"
        grid = ", ".join(map(str, PROMPT_LENGTHS))
        raise MeasureInputError("--max-prompt", f"{max_prompt}: prefill is measured at {grid} tokens up to it (and "
                                f"up to half the model's {ctx_limit}-token context); at least two "
                                "lengths are needed for a per-token time: allowed at least 64, with a context of at "
                                "least 128")
    prefills = []
    with torch.inference_mode():
        for n in (lengths[0], lengths[-1], lengths[0]):  # first calls pay one-time kernel set-up
            prefill(ids(n))
        for n in lengths:
            say(f"prefill {n} tokens ...")
            tokens = ids(n)
            seconds = _best_time(lambda tokens=tokens: prefill(tokens), repeats)
            prefills.append({"tokens": n, "seconds": round(seconds, 6), "tokens_per_s": round(n / seconds, 1)})
        contexts = sorted({c for c in (64, min(512, ctx_limit // 4), min(1024, ctx_limit // 2) - decode_steps - 2)
                           if 16 <= c})
        decodes = []
        for c in contexts:
            out = prefill(ids(c))
            keys = [layer.keys[0] for layer in out.cache.layers]
            values = [layer.values[0] for layer in out.cache.layers]
            for b in batches:
                say(f"decode batch {b}, context {c} ...")
                step_s = _decode_step_time(runner, SlotCache, keys, values, b, c, decode_steps, repeats)
                decodes.append({"batch": b, "context": c, "step_s": round(step_s, 6),
                                "tokens_per_s": round(b / step_s, 1)})
    text = []
    if text_probe:
        say(f"first text chunk of {text_probe} greedy generations ...")
        lengths_rng = np.random.default_rng(1)
        prompts = [ids(int(lengths_rng.integers(text_prompt[0], text_prompt[1] + 1))) for _ in range(text_probe)]
        text = first_text_tokens(runner, prompts, text_tokens)
    n = np.array([p["tokens"] for p in prefills], dtype=float)
    pb, pt = nonneg_fit(np.column_stack([np.ones_like(n), n]), np.array([p["seconds"] for p in prefills]))
    b = np.array([d["batch"] for d in decodes], dtype=float)
    c = np.array([d["context"] for d in decodes], dtype=float)
    db, ds, dc = nonneg_fit(np.column_stack([np.ones_like(b), b, b * c]), np.array([d["step_s"] for d in decodes]))
    measured_dtype, torch_threads = runner.dtype, torch.get_num_threads()
    runner = None  # the engine process loads its own copy: a model that fits once need not fit twice
    gc.collect()
    say("starting an engine process on it (the cold start) ...")
    cold_s = cold_start_s(str(path), dtype, threads)
    return {
        "format": FORMAT,
        "name": f"measured-{os.path.basename(str(path).rstrip('/'))}",
        "prefill_base_s": float(pb), "prefill_per_token_s": float(pt),
        "decode_base_s": float(db), "decode_per_seq_s": float(ds), "decode_per_ctx_token_s": float(dc),
        "cache_blocks": int(cache_bytes // (kv_bytes * block_size)), "block_size": block_size,
        # load_s: the simulator's cold start, an engine process's from its start to /health 200 (the model's load
        # alone, ~7 s of a live 13-20 s, had verify pass a scale-from-zero spec that failed live)
        "max_batch": max_batch, "prefill_chunk": prefill_chunk, "load_s": round(cold_s, 3),  # the engine's limits
        "whole_prefill_when_idle": True,  # engine/batching.py: chunks only while decodes wait
        "kv_bytes_per_token": int(kv_bytes),
        "source": f"measured by fleetserve profile on {_cpu_name()} ({torch_threads} torch threads)",
        "model": model, "dtype": measured_dtype, "context_length": ctx_limit,
        "device": {"cpu": _cpu_name(), "cores": os.cpu_count(), "torch_threads": torch_threads,
                   "torch": torch.__version__},
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "prefill_tokens_per_s": {str(p["tokens"]): p["tokens_per_s"] for p in prefills},
        "warnings": fit_warnings(prefills, float(pt), decodes, (float(pb), float(db), float(ds), float(dc))),
        "measurements": {"load_s": round(cold_s, 3), "model_load_s": round(load_s, 3), "prefill": prefills,
                         "decode": decodes},
        **({"first_text_tokens": text, "first_text_probe": {"prompts": text_probe, "tokens": text_tokens,
                                                            "prompt_tokens": list(text_prompt)}} if text else {}),
    }


def cold_start_s(path: str, dtype: str = "auto", threads: int | None = None, timeout_s: float = 600.0) -> float:
    """Seconds from an engine process's start to its first /health 200: a replica's cold start as `up` pays it
    (the interpreter, imports, the tokenizer, the model's load, the server), the load alone being part of it."""
    import subprocess
    import sys
    import tempfile

    import httpx

    from fleetserve.fleet.process import die_with_parent, free_port

    port = free_port()
    argv = [sys.executable, "-m", "fleetserve", "engine", "--model", path, "--port", str(port), "--dtype", dtype,
            *(["--threads", str(threads)] if threads else [])]
    log = tempfile.TemporaryFile()  # never a pipe: an engine writing more than it holds would block there
    start = time.perf_counter()
    # it dies with this process (a SIGTERMed profile had left it loading)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
                            preexec_fn=die_with_parent())
    # one client for every poll: `httpx.get` builds a client and its TLS context each call (~36 ms of CPU), which
    # every 50 ms took ~40 % of a core from the engine whose start this measures
    client = httpx.Client(timeout=1.0, trust_env=False)
    try:
        while time.perf_counter() - start < timeout_s:
            if proc.poll() is not None:
                log.seek(0)
                raise MeasureInputError("--model", f"an engine process on it exited with code {proc.returncode}: "
                                        f"{log.read().decode(errors='replace')[-500:]}")
            try:
                if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return time.perf_counter() - start
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise MeasureInputError("--model", f"an engine process on it was not ready within {timeout_s:g} s")
    finally:
        client.close()
        proc.kill()
        proc.wait()
        log.close()


def first_text_tokens(runner, prompts: list[list[int]], tokens: int) -> list[int]:
    """For each prompt, the output token (1-based) whose text the engine streams first, 0 when none of
    `tokens` greedy tokens shows text before the end (the engine skips empty deltas; `finish` flushes)."""
    import threading

    from fleetserve.api.protocol import SamplingParams
    from fleetserve.engine.textstream import TextStream

    sampling = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    out = []
    for prompt in prompts:
        stream, shown = TextStream(runner.decode), []

        def on_token(token: int, stream=stream, shown=shown) -> bool:
            shown.append(bool(stream.push(token)))
            return True

        runner.generate(prompt, sampling, tokens, on_token, threading.Event())
        out.append(shown.index(True) + 1 if True in shown else 0)
    return out


def _decode_step_time(runner, slot_cache_cls, keys, values, batch: int, context: int, steps: int,
                      repeats: int) -> float:
    """Seconds of one decode step (the fastest) for `batch` rows of `context` tokens, as the batching loop runs it."""
    import torch

    times = []
    for _ in range(repeats):
        slots = slot_cache_cls(len(keys), keys[0].shape[0], keys[0].shape[2], batch, runner.torch_dtype)
        for _row in range(batch):
            slots.admit(keys, values)
        for step in range(steps + 1):
            slots.ensure_room(1)
            mask = slots.step_mask()
            inputs = torch.full((batch, 1), 1, dtype=torch.long)
            positions = torch.full((batch, 1), context + step, dtype=torch.long)
            start = time.perf_counter()
            runner.model(input_ids=inputs, position_ids=positions, attention_mask=mask, cache=slots, use_cache=True,
                         logits_to_keep=1)
            elapsed = time.perf_counter() - start
            slots.pos += 1
            if step:  # the first step warms up
                times.append(elapsed)
    return min(times)

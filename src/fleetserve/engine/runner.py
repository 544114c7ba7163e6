"""Model runner: loads an HF-format causal LM with its tokenizer and generates token by token.

v0 decodes one sequence at a time on a transformers DynamicCache; continuous batching and the tiered prefix
cache replace the loop in `generate` without changing its contract (ids in, token callbacks out).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleetserve.api.errors import invalid
from fleetserve.api.protocol import SamplingParams
from fleetserve.engine.sources import check_model_dir
from fleetserve.kvcache.blocks import reusable_blocks

log = logging.getLogger(__name__)

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
PREFILL_CHUNK = 2048  # a prompt alone is computed in chunks this large: a client that left is seen between them


def _auto_dtype(torch):
    """bfloat16 where the CPU computes it natively (AVX-512 BF16 or AMX: about 1.7x faster prefill and
    decode on SmolLM2 here), else float32."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return torch.float32
    return torch.bfloat16 if ("avx512_bf16" in flags or "amx_bf16" in flags) else torch.float32


@dataclass(frozen=True)
class GenerationResult:
    finish_reason: str  # "stop", "length" or "cancelled"
    completion_tokens: int
    cached_tokens: int = 0


def _load_model(auto, path: Path, torch_dtype):
    """The model in eval mode. Weights whose sizes differ from config.json's (the config of another model, or a
    cut copy of the weights) were a traceback ending "For details look at the above report!", the one line that
    `up` and `status` showed: it now says what is wrong, as the model source's error (exit 2)."""
    from fleetserve.engine.demo import ModelSourceError

    try:
        return auto.from_pretrained(path, dtype=torch_dtype).eval()
    except RuntimeError as exc:
        text = str(exc)
        if "ignore_mismatched_sizes" not in text and "size mismatch for" not in text:
            raise
        first = next((line.strip() for line in text.splitlines() if "size mismatch for" in line), "")
        which = first[:240] if first else "tensor sizes differ: the load report in this log lists them"
        raise ModelSourceError(f"model directory {path}: its weights do not match its config.json ({which}): "
                               "the config of another model, or weights of another size") from None


class ModelRunner:
    """Owns the model and tokenizer of one replica. Not thread-safe: one scheduler thread calls `generate`."""

    def __init__(self, path: str | Path, *, dtype: str = "auto", threads: int | None = None,
                 context_length: int | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = check_model_dir(Path(path))
        if threads:
            torch.set_num_threads(threads)
        torch_dtype = getattr(torch, _DTYPES[dtype]) if dtype in _DTYPES else _auto_dtype(torch)
        self.dtype = str(torch_dtype).removeprefix("torch.")
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self.model = _load_model(AutoModelForCausalLM, self.path, torch_dtype)
        config = self.model.config
        native = getattr(config, "max_position_embeddings", None) or 2048
        self.context_length = min(context_length or native, native)
        if context_length and context_length > native:  # it was cut without a word; /v1/models shows the model's
            log.warning("context length %d is above the model's maximum (%d positions in its config): serving %d",
                        context_length, native, native)
        self.eos_ids = self._eos_ids()
        self.sliding_window = self._sliding_window()
        self._torch = torch
        self.torch_dtype = torch_dtype
        self.prefix_cache = None  # fleetserve.engine.prefix_cache.PrefixCache, when the KV cache is on
        self.block_size = 256
        self._max_token_chars: int | None = None

    def _sliding_window(self) -> int | None:
        """The narrowest attention window of the model's sliding-window layers (Mistral-7B-v0.1, Gemma 2 and 3's
        local layers, Qwen2 with use_sliding_window), when it is narrower than the served context; None when every
        layer sees the whole context. Such a layer's cache keeps only its window's last positions, which the
        prefix cache's blocks and the batch's KV buffer both took for the whole prompt: wrong tokens reused, or a
        500 on every prompt past the window (`Engine` and `attach_prefix_cache` turn both off for it)."""
        from transformers import DynamicCache

        windows = [int(layer.sliding_window) for layer in DynamicCache(config=self.model.config).layers
                   if getattr(layer, "is_sliding", False)]
        narrowest = min(windows, default=None)
        return narrowest if narrowest is not None and narrowest <= self.context_length else None

    def block_shape(self, block_size: int) -> tuple[int, ...]:
        c = self.model.config
        kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return (c.num_hidden_layers, 2, kv_heads, block_size, head_dim)

    def _cache_from_blocks(self, blocks):
        from transformers import DynamicCache

        torch = self._torch
        layers = []
        for layer in range(blocks[0].shape[0]):
            keys = torch.cat([b[layer, 0] for b in blocks], dim=1).unsqueeze(0)
            values = torch.cat([b[layer, 1] for b in blocks], dim=1).unsqueeze(0)
            layers.append((keys, values))
        return DynamicCache(ddp_cache_data=layers, config=self.model.config)

    def prefetch_l2(self, prompt_ids: list[int], root: int, tenant: str | None):
        """The prompt's blocks in L2 (`prefix_cache.Prefetched`), read before the job reaches the generation
        thread, as many as the prefetch budget holds; None without L2."""
        from fleetserve.kvcache.blocks import chain_keys

        if self.prefix_cache is None or self.prefix_cache.l2_for(tenant) is None:
            return None
        keys = chain_keys(prompt_ids, self.block_size, root)
        return self.prefix_cache.prefetch_l2(keys[: reusable_blocks(len(prompt_ids), self.block_size)], tenant)

    def cached_prefix(self, prompt_ids: list[int], root: int, tenant: str | None, prefetched=None):
        """(cache, cached tokens, block keys): the longest cached prefix (engine -> L1 -> L2) loaded into a
        fresh cache; at least one prompt token is always left to compute. Without a prefix cache: empty.
        `prefetched`: the L2 blocks `prefetch_l2` read (None: L2 is read here); its budget is released here."""
        from transformers import DynamicCache

        from fleetserve.kvcache.blocks import chain_keys

        if self.prefix_cache is None:
            return DynamicCache(config=self.model.config), 0, []
        keys = chain_keys(prompt_ids, self.block_size, root)
        found = self.prefix_cache.lookup(keys[: reusable_blocks(len(prompt_ids), self.block_size)], tenant,
                                         prefetched, len(prompt_ids))
        if prefetched is not None:
            prefetched.release()
        if not found:
            return DynamicCache(config=self.model.config), 0, keys
        return self._cache_from_blocks([block for _, block in found]), len(found) * self.block_size, keys

    def store_new_blocks(self, cache, keys: list[int], cached_tokens: int, tenant: str | None) -> None:
        """After a prefill: hand the prompt's full blocks that were not cached yet to the prefix cache."""
        if self.prefix_cache is None:
            return
        first = cached_tokens // self.block_size
        new = self._blocks_from_cache(cache, first, len(keys) - first)
        self.prefix_cache.store(list(zip(keys[first:], new, strict=True)), tenant, keys[:first])

    def _blocks_from_cache(self, cache, first: int, count: int) -> list:
        torch = self._torch
        b = self.block_size
        out = []
        for i in range(first, first + count):
            per_layer = [torch.stack([layer.keys[0, :, i * b:(i + 1) * b], layer.values[0, :, i * b:(i + 1) * b]])
                         for layer in cache.layers]
            out.append(torch.stack(per_layer).clone())
        return out

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (getattr(self.model.generation_config, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, list):
                ids.update(source)
        end_of_turn = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(end_of_turn, int) and end_of_turn != self.tokenizer.unk_token_id:
            ids.add(end_of_turn)
        return frozenset(ids)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def chat_ids(self, messages: list[dict[str, str]], template_kwargs: dict | None = None) -> list[int]:
        if self.has_chat_template:
            from jinja2 import TemplateError

            try:
                out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                         **(template_kwargs or {}))
            except TemplateError as exc:
                if type(exc) is not TemplateError:  # a broken template (syntax, an unknown filter): the model's
                    raise  # fault, a 500 that alerts, not the client's
                # the template's raise_exception: it refuses the conversation on purpose (Gemma: no system turn;
                # Mistral: roles must alternate), the client's to fix, said in its words (it was a 500)
                said = "; a developer message is given to it as system" if any(
                    m.get("role") == "system" for m in messages) else ""
                raise invalid("messages", f"the model's chat template refuses this conversation: {exc}{said}") \
                    from None
            if isinstance(out, dict) or hasattr(out, "input_ids"):
                out = out["input_ids"]
            return list(out)
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        return self.encode(text)

    def max_token_chars(self) -> int:
        """The longest token's text: a prompt of more than context_length times this many characters cannot
        fit, whatever it tokenizes to (checked before tokenizing, which costs seconds for megabytes)."""
        if self._max_token_chars is None:
            self._max_token_chars = max((len(t) for t in self.tokenizer.get_vocab()), default=1) or 1
        return self._max_token_chars

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_new_tokens: int,
        on_token: Callable[[int], bool],
        cancelled: threading.Event,
        root: int = 0,
        tenant: str | None = None,
        prefetched=None,
    ) -> GenerationResult:
        """Generate up to `max_new_tokens`; `on_token` returns False to stop (a stop string was seen).

        With a prefix cache, the longest cached prefix (engine -> L1 -> L2) is loaded and only the rest of the
        prompt is computed; `root` namespaces the block keys (model build and tenant salt).
        """
        from fleetserve.engine.sampling import choose_token

        torch = self._torch
        generator = None
        if sampling.seed is not None:
            generator = torch.Generator().manual_seed(sampling.seed)
        counts: dict[int, int] = {}
        cache, cached_tokens, keys = self.cached_prefix(prompt_ids, root, tenant, prefetched)
        rest = prompt_ids[cached_tokens:]
        produced = 0
        with torch.inference_mode():
            # the prompt but its last chunk in chunks, a hung-up client seen between them (one pass had gone on
            # long after it left); the last chunk (at least one token) gives the first token's logits below
            last = max(0, len(rest) - 1) // PREFILL_CHUNK * PREFILL_CHUNK
            for start in range(0, last, PREFILL_CHUNK):
                if cancelled.is_set():
                    return GenerationResult("cancelled", produced, cached_tokens)
                cache = self.model(input_ids=torch.tensor([rest[start:start + PREFILL_CHUNK]], dtype=torch.long),
                                   cache=cache, use_cache=True, logits_to_keep=1).cache
            inputs = torch.tensor([rest[last:]], dtype=torch.long)
            while produced < max_new_tokens:
                if cancelled.is_set():
                    return GenerationResult("cancelled", produced, cached_tokens)
                out = self.model(input_ids=inputs, cache=cache, use_cache=True, logits_to_keep=1)
                cache = out.cache
                if produced == 0:
                    self.store_new_blocks(cache, keys, cached_tokens, tenant)
                token = choose_token(out.logits[0, -1], sampling, generator, counts)
                if token in self.eos_ids and not sampling.ignore_eos:
                    return GenerationResult("stop", produced, cached_tokens)
                produced += 1
                counts[token] = counts.get(token, 0) + 1
                if not on_token(token):
                    return GenerationResult("stop", produced, cached_tokens)
                inputs = torch.tensor([[token]], dtype=torch.long)
        return GenerationResult("length", produced, cached_tokens)


def describe(path: Path) -> dict:
    """Small facts about a model directory without loading it (for /v1/models and logs)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {
        "architecture": (config.get("architectures") or ["?"])[0],
        "context_length": config.get("max_position_embeddings"),
        "vocab_size": config.get("vocab_size"),
    }

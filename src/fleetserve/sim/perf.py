"""Engine performance models: how long a prefill and a decode step take, and how many KV blocks fit.

Prefill time grows with the *uncached* tokens (cached blocks are loaded, not computed); a decode step costs
a fixed part plus a part per running sequence plus a part per token of context attended (BLIS-style
linear step model). A step may carry a prefill chunk of at most `prefill_chunk` tokens next to the decode
of the whole running batch (chunked prefill); the two costs add. Blocks loaded from the L1 (CPU memory) and
L2 (Redis) tiers cost their bytes over the tier's bandwidth instead of prefill compute.

Profiles are named presets; figures are coarse public ballparks, meant for relative comparisons (policies
against each other, instance types against each other), not absolute predictions. Each preset names its
source; the GPU presets derived from datasheets live in `profiles.py`, which also loads profile files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

LLAMA_8B_KV_BYTES_PER_TOKEN = 131_072  # 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes


@dataclass(frozen=True)
class PerfProfile:
    name: str
    prefill_base_s: float  # per step that carries a prefill chunk
    prefill_per_token_s: float  # per uncached prompt token
    decode_base_s: float  # per decode step
    decode_per_seq_s: float  # per running sequence in the step
    decode_per_ctx_token_s: float  # per token of context attended in the step
    cache_blocks: int  # KV capacity in blocks (running sequences and the prefix cache share it)
    block_size: int = 256
    max_batch: int = 64  # sequences in prefill or decode at once (vLLM max_num_seqs)
    prefill_chunk: int = 1 << 30  # prompt tokens per step (vLLM max_num_batched_tokens); huge: whole prompts, and
    # every prompt admitted into a step gets its first token at the step's end (no current engine does that)
    # the built-in engine prefills a prompt whole while nothing decodes (chunks only keep decodes moving), as its
    # profile measures it; vLLM and SGLang chunk always. Charged per chunk, a lone 1,020-token prompt on a
    # measured profile simulated 47 % above the profile's own figure for it
    whole_prefill_when_idle: bool = False
    load_s: float = 0.0  # model load until the replica answers (after its node is ready)
    kv_bytes_per_token: int = LLAMA_8B_KV_BYTES_PER_TOKEN
    l1_gbps: float = 12.0  # CPU memory -> GPU (PCIe, effective)
    l2_gbps: float = 1.2  # Redis over the network -> GPU
    # client-visible latency outside the engine's steps (HTTP, router proxy, tokenization, streaming), added
    # to each request's TTFT and E2E; measured by `bench fidelity` against a live fleet (0 in presets)
    request_overhead_s: float = 0.0
    # measured samples of that overhead (seconds); when given, each request draws its own (seeded) instead
    request_overhead_samples: tuple[float, ...] = ()
    # samples of the output token with which a streaming client first receives text (1: the first token; 0:
    # none before the end). The engine sends no chunk while a token's text is empty (an incomplete UTF-8
    # sequence, a held-back stop prefix); a model's tokenizer and outputs decide how often. Measured by
    # `fleetserve profile` (`analyze.measure.first_text_tokens`); empty: every first token shows text
    first_text_tokens: tuple[int, ...] = ()
    source: str = ""

    def prefill_time(self, uncached_tokens: int) -> float:
        return self.prefill_base_s + self.prefill_per_token_s * max(0, uncached_tokens)

    def alone_prefill_time(self, uncached_tokens: int) -> float:
        """A prompt's prefill on a replica with nothing else to do, as `SimReplica` steps it: one step per
        `prefill_chunk` tokens, or one step in all where the engine takes a lone prompt whole (the built-in
        engine's profiles)."""
        tokens = max(0, uncached_tokens)
        steps = 1 if self.whole_prefill_when_idle else max(1, math.ceil(tokens / max(self.prefill_chunk, 1)))
        return steps * self.prefill_base_s + self.prefill_per_token_s * tokens

    def decode_time(self, batch: int, context_tokens: int) -> float:
        if batch <= 0:
            return 0.0
        return self.decode_base_s + self.decode_per_seq_s * batch + self.decode_per_ctx_token_s * context_tokens

    @property
    def block_bytes(self) -> int:
        return self.kv_bytes_per_token * self.block_size

    def load_time(self, l1_blocks: int, l2_blocks: int) -> float:
        """Seconds to bring cached blocks from L1 and L2 into engine memory."""
        if not (l1_blocks or l2_blocks):
            return 0.0
        b = self.block_bytes
        return l1_blocks * b / (self.l1_gbps * 1e9) + l2_blocks * b / (self.l2_gbps * 1e9)

    def blocks_for_bytes(self, nbytes: int) -> int:
        return max(0, nbytes // max(self.block_bytes, 1))

    def scaled(self, speedup: float) -> PerfProfile:
        """The same machine, `speedup` times faster (for time-compressed replays)."""
        f = 1.0 / speedup
        return replace(self, prefill_base_s=self.prefill_base_s * f, prefill_per_token_s=self.prefill_per_token_s * f,
                       decode_base_s=self.decode_base_s * f, decode_per_seq_s=self.decode_per_seq_s * f,
                       decode_per_ctx_token_s=self.decode_per_ctx_token_s * f)


PROFILES = {
    # instant-ish, for tests of the HTTP surface
    "fast": PerfProfile("fast", 0.0005, 1e-6, 0.0005, 1e-5, 0.0, cache_blocks=4096, block_size=16,
                        source="test stand-in"),
    # Llama-3-8B on one A10G-class GPU (about 3k prompt tokens/s, 25 ms decode steps, ~6 GB of KV). Prefill is
    # chunked as vLLM V1 does on a GPU under 70 GiB (max_num_batched_tokens 2048, profiles.vllm_batch_defaults)
    "a10g-8b": PerfProfile("a10g-8b", 0.015, 0.00033, 0.025, 0.0004, 2e-8, cache_blocks=176, block_size=256,
                           prefill_chunk=2048,
                           source="coarse public ballpark (the real-time simulated engine's preset)"),
    # Llama-3-8B on one H100-class GPU (about 20k prompt tokens/s, 12 ms steps); vLLM V1's 8192-token chunks
    "h100-8b": PerfProfile("h100-8b", 0.008, 0.00005, 0.012, 0.0002, 1e-8, cache_blocks=4000, block_size=256,
                           prefill_chunk=8192,
                           source="coarse public ballpark (the real-time simulated engine's preset)"),
    # the built-in engine on this kind of CPU machine (SmolLM2-135M): seconds, not milliseconds. Its KV: 30 layers
    # x 3 KV heads x 64 x (K, V) x 2 bytes (bf16) = 23,040 bytes a token (`fleetserve profile` measures the same),
    # so the engine's default 512 MiB cache holds 91 blocks of 256 tokens (9,216 bytes and 2,048 blocks had made
    # hit rates and TTFT look better than the engine gives)
    "cpu-135m": PerfProfile("cpu-135m", 0.02, 0.0006, 0.03, 0.004, 1e-7, cache_blocks=91, block_size=256,
                            max_batch=8, prefill_chunk=256, whole_prefill_when_idle=True, load_s=8.0,
                            kv_bytes_per_token=23040,
                            source="research/engine.md: SmolLM2-135M on 2 CPU cores, batch 8, chunk 256; its KV "
                                   "from the model's config"),
}


def profile(name: str) -> PerfProfile:
    """A profile by name: these, the GPU presets of `sim.profiles` (h100-llama-8b, ...), or a `fleetserve profile`
    file. One lookup for the simulator and the simulated engine processes: `bench routing --live --profile
    h100-llama-8b` was refused where the simulator's bench took it."""
    if name in PROFILES:
        return PROFILES[name]
    from fleetserve.sim.profiles import resolve

    return resolve(name)

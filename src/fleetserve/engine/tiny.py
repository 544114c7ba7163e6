"""Tiny random-initialised Llama models with a byte-level tokenizer, for tests: no download, built in a second.

Two alphabets: `bytes` (every byte a token; a random model's output is then mostly incomplete UTF-8, so a
stream often shows no text before its end) and `ascii` (printable ASCII and newline only: every token is text
at once, as with a real model's vocabulary; other bytes are dropped when encoding)."""

from __future__ import annotations

from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (every byte is one token)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, codes, strict=True)}


ALPHABETS = ("bytes", "ascii")


def build_byte_tokenizer(alphabet: str = "bytes"):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if alphabet not in ALPHABETS:
        raise ValueError(f"alphabet {alphabet!r}; allowed: {', '.join(ALPHABETS)}")
    chars = range(256) if alphabet == "bytes" else [b for b in range(256) if b == 10 or 32 <= b <= 126]
    table = _bytes_to_unicode()
    vocab = {table[b]: i for i, b in enumerate(chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def create_tiny_model(
    path: str | Path,
    *,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    context_length: int = 2048,
    seed: int = 0,
    alphabet: str = "bytes",
    sliding_window: int | None = None,
) -> Path:
    """Write a random Llama (safetensors) plus tokenizer and chat template to `path`; same seed, same weights.
    `sliding_window`: a Qwen2 instead, whose layers after the first attend to that many positions only (the
    pattern of Gemma 2 and 3's local layers)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_byte_tokenizer(alphabet)
    windowed = {"use_sliding_window": True, "sliding_window": sliding_window, "max_window_layers": 1}
    config = (Qwen2Config if sliding_window else LlamaConfig)(
        **(windowed if sliding_window else {}),
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=hidden_size * 2,
        vocab_size=len(tokenizer),
        max_position_embeddings=context_length,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = (Qwen2ForCausalLM if sliding_window else LlamaForCausalLM)(config).eval()
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out

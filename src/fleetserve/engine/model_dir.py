"""What a loadable model folder holds, checked before anything loads it: config.json, weights whose files are
whole and a tokenizer, each readable; `ModelSourceError` names what is wrong and how to fix it."""

from __future__ import annotations

import json
from pathlib import Path


class ModelSourceError(Exception):
    """A model source that cannot be resolved to a loadable directory; the message says how to fix it."""


class UnreadableModelFile(ModelSourceError):
    """A file of the model this user cannot read: its permissions are the fix, not another copy."""


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
# what a tokenizer is built from: a fast tokenizer's file, SentencePiece's model, BPE's vocabulary (GPT-2's
# vocab.json with merges.txt), WordPiece's vocabulary
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def check_model_dir(path: Path) -> Path:
    """A clear error for a missing or incomplete model directory."""
    if not path.exists():
        raise ModelSourceError(f"model directory {path} does not exist")
    if not path.is_dir():
        raise ModelSourceError(f"model path {path} is not a directory")
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        missing.append("weights (" + " or ".join(WEIGHT_FILES) + ")")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):  # tokenizer_config.json alone builds none: the
        missing.append("tokenizer (" + " or ".join(TOKENIZER_FILES) + ")")  # engine had died at its start
    if missing:
        raise ModelSourceError(f"model directory {path} is incomplete: missing {', '.join(missing)}")
    _check_readable(path)
    return path


def _check_readable(path: Path) -> None:
    """config.json a JSON object, and each safetensors file's header whole: a truncated copy (a download cut
    short) or a config that is not JSON had passed, and the engine's start, `profile` and `analyze` failed with
    a library's traceback instead of naming the file."""
    config = _json_file(path / "config.json")
    if not isinstance(config, dict):
        raise ModelSourceError(f"{path / 'config.json'} is not a JSON object")
    if not isinstance(config.get("model_type"), str):  # what transformers reads the architecture by
        raise ModelSourceError(f"{path / 'config.json'} names no model_type (e.g. \"llama\"): not a model's config")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = _json_file(index)
        names = set((shards.get("weight_map") or {}).values()) if isinstance(shards, dict) else None
        if not names:
            raise ModelSourceError(f"{index} has no weight_map naming the weight files")
        files = [path / n for n in sorted(names)]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise ModelSourceError(f"model directory {path} is incomplete: missing {', '.join(absent[:3])} "
                                   f"(named by {index.name})")
    else:
        files = [path / "model.safetensors"] if (path / "model.safetensors").is_file() else []
    for f in files:
        _check_safetensors_header(f)
    for name in TOKENIZER_FILES:  # present and unreadable had passed, and the engine died loading it
        if (path / name).is_file():
            _check_opens(path / name)


def _check_opens(path: Path) -> None:
    """A file that cannot be read is named as such: the fix is its permissions, not a new copy."""
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise UnreadableModelFile(f"{path} cannot be read ({exc.strerror or type(exc).__name__}): check its "
                               "permissions for this user") from None


def _json_file(path: Path):
    _check_opens(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelSourceError(f"{path} is not valid JSON ({type(exc).__name__}: {str(exc)[:120]})") from None


def _check_safetensors_header(path: Path) -> None:
    """The file's 8-byte header length, the JSON header it announces and the tensors' data it lists all fit the
    file (safetensors' layout): a copy cut after its header passed on the header alone."""
    _check_opens(path)  # unreadable had read as "truncated or damaged", which a new copy does not fix
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            header = json.loads(f.read(min(length, 100 << 20))) if 0 < length <= size - 8 else None
        ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"] \
            if isinstance(header, dict) else None
        ok = ends is not None and 8 + length + max(ends, default=0) == size  # covered whole, as the format asks
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, IndexError):
        ok = False
    if not ok:
        raise ModelSourceError(f"{path} is not a whole safetensors file ({size} bytes; truncated, damaged or with "
                               "bytes after its tensors): prepare the model again")

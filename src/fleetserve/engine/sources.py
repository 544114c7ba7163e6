"""Resolve a `model.source` to a local HF-format directory: local path (also an FSx mount), `hf:` from the
local Hugging Face cache (offline), `builtin:` demo models, `s3://` copied once into the model cache (fsspec),
`catalog:` presets.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from fleetserve.engine.demo import DEMO_NAME, ModelSourceError, demo_model_dir
from fleetserve.spec.endpoint import SOURCE_SCHEMES

BUILTIN = {DEMO_NAME: demo_model_dir}
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


def _json_file(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelSourceError(f"{path} is not valid JSON ({type(exc).__name__}: {str(exc)[:120]})") from None


def _check_safetensors_header(path: Path) -> None:
    """The file's 8-byte header length, the JSON header it announces and the tensors' data it lists all fit the
    file (safetensors' layout): a copy cut after its header passed on the header alone."""
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


def _hf_cache_dir(repo_id: str, revision: str | None, download: bool = False) -> Path:
    """The model from the local Hugging Face cache; with `download` (`model prepare --download`, what the
    Kubernetes init container runs), fetched from the Hub first when missing (HF_TOKEN, HF_ENDPOINT apply).
    An engine or a fleet never downloads: replicas start from what was prepared."""
    from huggingface_hub import snapshot_download

    try:
        # the cache location is read at call time (huggingface_hub reads its environment once, at import)
        # not `original/`: Meta's repos keep a second copy of the weights there in their own format, which no
        # engine here reads (an 8B model took 32 GB of a node's disk, not 16)
        folder = snapshot_download(repo_id, revision=revision, local_files_only=not download,
                                   cache_dir=os.environ.get("HF_HUB_CACHE") or None,
                                   token=os.environ.get("HF_TOKEN") or None, ignore_patterns=["original/*"])
    except Exception as exc:  # huggingface_hub raises several types for "not in the cache", "cannot reach"
        if download:
            raise ModelSourceError(f"hf:{repo_id}: cannot download from the Hugging Face Hub "
                                   f"({type(exc).__name__}: {str(exc)[:300]})") from None
        raise ModelSourceError(
            f"hf:{repo_id} is not in the local Hugging Face cache "
            f"({os.environ.get('HF_HUB_CACHE', '~/.cache/huggingface/hub')}); "
            f"fleetserve never downloads at run time: fetch it first (hf download {repo_id}, or fleetserve model "
            f"prepare hf:{repo_id} --download) ({type(exc).__name__})"
        ) from None
    return Path(folder)


def resolve_source(source: str, revision: str | None = None, region: str | None = None,
                   progress: bool = False, download: bool = False) -> Path:
    """The local directory holding the model named by `source`, or ModelSourceError saying what is wrong."""
    if source.startswith("builtin:"):
        name = source.removeprefix("builtin:")
        if name not in BUILTIN:
            raise ModelSourceError(f"unknown builtin model {name!r}; allowed: {', '.join(sorted(BUILTIN))}")
        return check_model_dir(BUILTIN[name]())
    if source.startswith("hf:"):
        return check_model_dir(_hf_cache_dir(source.removeprefix("hf:"), revision, download))
    if source.startswith("s3://"):
        from fleetserve.engine.s3source import fetch_s3

        try:
            fetched = fetch_s3(source, region, progress=progress)
        except Exception as exc:  # the S3 client's own errors (no credentials, an endpoint it cannot reach) were
            # tracebacks wherever a source is resolved (`profile`, `up`): one message, as `model prepare` said it
            if type(exc).__module__.split(".")[0] not in ("botocore", "boto3", "s3transfer"):
                raise
            raise ModelSourceError(f"{source}: {exc}") from None
        return check_model_dir(fetched)
    if source.startswith("catalog:"):
        from fleetserve.engine.catalog import preset

        try:
            entry = preset(source.removeprefix("catalog:"))
        except KeyError as exc:
            raise ModelSourceError(str(exc.args[0])) from None
        return resolve_source(entry.source, revision, region, progress, download)
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", source)
    if scheme:  # gs://, https://, ...: not a folder name, and read as one it was "/cwd/gs:/bucket does not exist"
        raise ModelSourceError(f"unsupported model source scheme {scheme.group(1)}:// in {source!r}; allowed: "
                               f"{', '.join(SOURCE_SCHEMES)} (copy it to a local folder or to S3 first)")
    if not source.strip():  # "" had read the current folder as the model
        raise ModelSourceError(f"the model source is empty; allowed: {', '.join(SOURCE_SCHEMES)}")
    try:
        path = Path(source).expanduser().resolve()
    except (RuntimeError, OSError) as exc:  # a symlink loop (RuntimeError on Python 3.11): a traceback had said it
        raise ModelSourceError(f"model path {source}: {exc}") from None
    return check_model_dir(path)

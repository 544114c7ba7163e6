"""Resolve a `model.source` to a local HF-format directory: local path (also an FSx mount), `hf:` from the
local Hugging Face cache (offline), `builtin:` demo models, `s3://` copied once into the model cache (fsspec),
`catalog:` presets.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fleetserve.engine.demo import DEMO_NAME, demo_model_dir
from fleetserve.engine.model_dir import ModelSourceError, check_model_dir
from fleetserve.spec.endpoint import SOURCE_SCHEMES

BUILTIN = {DEMO_NAME: demo_model_dir}


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

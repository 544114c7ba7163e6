"""`s3://bucket/prefix` model sources: copied once into the local model cache through fsspec/s3fs.

The copy goes to a temporary folder first and is renamed into place when complete (cache_entry.py), with a
manifest of the objects' sizes and ETags; a later start reuses it without downloading unless the objects changed
or a local file no longer has the size the manifest records (a damaged copy is fetched again). The
endpoint comes from AWS_ENDPOINT_URL (an S3-compatible server), credentials from the usual AWS chain.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from fleetserve.engine.cache_entry import locked, partial
from fleetserve.engine.model_dir import ModelSourceError
from fleetserve.engine.paths import models_dir

MANIFEST = ".fleetserve-s3.json"


CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 20


def _filesystem(region: str | None):
    import s3fs

    client_kwargs = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("FLEETSERVE_S3_ENDPOINT")
    if endpoint:
        client_kwargs["endpoint_url"] = endpoint
    if region:
        client_kwargs["region_name"] = region
    # bounded: an endpoint that accepts connections and never answers had held `model prepare` silent for 7
    # minutes (botocore's 60 s read timeout, retried by botocore and again by s3fs); a read of a large object's
    # chunk that takes longer than READ_TIMEOUT_S without a byte is as good as gone
    config = {"connect_timeout": CONNECT_TIMEOUT_S, "read_timeout": READ_TIMEOUT_S,
              "retries": {"max_attempts": 1, "mode": "standard"}}  # s3fs retries the call itself
    fs = s3fs.S3FileSystem(client_kwargs=client_kwargs, config_kwargs=config, skip_instance_cache=True)
    fs.retries = 2  # s3fs's own retries of a failed call (5 by default), on top of botocore's
    return fs


def fetch_s3(source: str, region: str | None = None, progress: bool = False) -> Path:
    """The local copy of the model under `source`, downloading what is missing or changed."""
    location = source.removeprefix("s3://").rstrip("/")
    if "/" not in location:
        location += "/"
    target = models_dir() / "s3" / hashlib.sha256(source.encode()).hexdigest()[:16]
    fs = _filesystem(region)
    try:
        listing = fs.find(location, detail=True)
    except (OSError, PermissionError, ValueError) as exc:
        raise ModelSourceError(f"{source}: cannot list the S3 prefix ({type(exc).__name__}: {exc})") from None
    objects = {path[len(location):].lstrip("/"): info for path, info in listing.items()
               if info.get("type") != "directory" and not path.endswith("/")}
    if not objects:
        raise ModelSourceError(f"{source}: no objects under this prefix (is the bucket/prefix right?)")
    manifest = {name: [int(info.get("size", 0)), str(info.get("ETag", ""))] for name, info in objects.items()}
    with locked(target):
        if _current(target, manifest):
            return target
        with partial(target) as tmp:
            names = sorted(objects)
            if progress:
                from rich.progress import track

                names = track(names, description=f"fetching {source}")
            for name in names:
                local = tmp / name
                local.parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(f"{location.rstrip('/')}/{name}", str(local))
            (tmp / MANIFEST).write_text(json.dumps(manifest))
    return target


def _current(target: Path, manifest: dict) -> bool:
    """The local copy is of these objects and whole: the same manifest and every file of the size it records (a
    copy cut short had been kept, and its check said to prepare it again, which kept it again). What the objects
    themselves lack (no tokenizer under the prefix) is the model check's to say, not a reason to download it all
    again at every start."""
    try:
        if json.loads((target / MANIFEST).read_text()) != manifest:
            return False
        return all((target / name).stat().st_size == size for name, (size, _) in manifest.items())
    except (OSError, ValueError):
        return False

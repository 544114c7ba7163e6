"""A short fingerprint of a model directory's weights, config and tokenizer, for the shared L2 cache's keys.

Why: a Redis shared by several fleets held blocks keyed by the served name, version and dtype only, so two
different models served under one name (a fine-tune and its base, two test models) read each other's KV and
answered wrongly. The fingerprint separates them. Every byte counts: a first version sampled the weights (the
first and last MiB and sixteen 64 KiB slices), and a model that differed from another in one layer's k_proj and
v_proj (a ROME-style edit, a partial fine-tune) had the same fingerprint and read its blocks. A weight file's
SHA-256 (about 1.4 GB/s here) is kept under $FLEETSERVE_HOME/fingerprints, keyed by the file's path, size,
inode and modification and change times, so an engine restart does not read a 16 GB model twice.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from fleetserve.engine.paths import home

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
SMALL_FILE = 8 << 20  # read each start: not worth a cache entry


def _stat_key(path: Path, st: os.stat_result) -> str:
    ident = f"{path.resolve()}\0{st.st_size}\0{st.st_ino}\0{st.st_dev}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
    return hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def file_digest(path: Path) -> str:
    """The file's SHA-256, from the cache while the file is unchanged (same path, size, inode and times)."""
    st = path.stat()
    if st.st_size <= SMALL_FILE:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    folder = home() / "fingerprints"
    cached = folder / _stat_key(path, st)
    try:
        value = cached.read_text().strip()
        if len(value) == 64:
            return value
    except OSError:
        pass
    with path.open("rb") as f:
        value = hashlib.file_digest(f, "sha256").hexdigest()
    try:  # a read-only home (a pod's) only costs the next start another read
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = folder / f".{cached.name}.{os.getpid()}"
        tmp.write_text(value)
        os.replace(tmp, cached)
    except OSError:
        pass
    return value


def model_fingerprint(model_dir: str | Path) -> str:
    """16 hex digits that change when the weights, the config or the tokenizer change."""
    root = Path(model_dir)
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root)
        if rel.parts[0].startswith("."):  # .cache and the like: downloads' bookkeeping, not the model
            continue
        if path.suffix in WEIGHT_SUFFIXES or path.suffix == ".json" or path.name.startswith(("tokenizer", "vocab",
                                                                                              "merges")):
            h.update(str(rel).encode("utf-8", "surrogatepass") + b"\0")
            h.update(f"{path.stat().st_size}\0{file_digest(path)}\0".encode())
    return h.hexdigest()[:16]

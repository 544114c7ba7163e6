"""A short fingerprint of a model directory's weights, config and tokenizer, for the shared L2 cache's keys.

Why: a Redis shared by several fleets held blocks keyed by the served name, version and dtype only, so two
different models served under one name (a fine-tune and its base, two test models) read each other's KV and
answered wrongly. The fingerprint separates them. It reads the small files whole and samples the weights
(their size, the first and last MiB and sixteen 64 KiB slices between), so a multi-GB model costs a few MiB
of reads at start, not a full hash.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SMALL_FILE = 8 << 20  # read whole below this
EDGE = 1 << 20
SLICE = 64 << 10
SLICES = 16
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def _sample(path: Path, h) -> None:
    size = path.stat().st_size
    h.update(f"{path.name}\0{size}\0".encode())
    with path.open("rb") as f:
        if size <= SMALL_FILE:
            h.update(f.read())
            return
        h.update(f.read(EDGE))
        for i in range(1, SLICES + 1):
            f.seek(size * i // (SLICES + 1))
            h.update(f.read(SLICE))
        f.seek(size - EDGE)
        h.update(f.read(EDGE))


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
            _sample(path, h)
    return h.hexdigest()[:16]

"""Model cache entries are written whole or not at all, and what a killed writer left is cleaned up."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from fleetserve.engine import demo, model_dir
from fleetserve.engine.cache_entry import locked, partial, stale_partials
from fleetserve.engine.model_dir import UnreadableModelFile, check_model_dir

WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from fleetserve.engine.cache_entry import locked, partial
    target = Path(sys.argv[1])
    with locked(target), partial(target) as tmp:
        (tmp / "weights").write_bytes(b"x" * 1000)
        print("writing", flush=True)
        time.sleep(60)
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_what_a_killed_writer_left_is_removed_by_the_next_one(tmp_path, sig):
    """SIGTERM runs no `finally`: the half-written folder (as large as the model) had stayed in the cache."""
    target = tmp_path / "models" / "entry"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert proc.stdout.readline().strip() == "writing"
    finally:
        proc.send_signal(sig)
        proc.wait(timeout=30)
    left = stale_partials(target)
    assert len(left) == 1 and (left[0] / "weights").is_file() and not target.exists()
    with locked(target), partial(target) as tmp:
        (tmp / "weights").write_bytes(b"y")
    assert stale_partials(target) == [] and (target / "weights").read_bytes() == b"y"


def test_what_writers_before_the_partial_names_left_is_removed_and_no_other_entrys(tmp_path):
    target = tmp_path / "entry"
    legacy = tmp_path / ".entry-k3x_9a0b"  # mkdtemp's name for it before 2026-12-06
    other = tmp_path / ".entry-b.partial-abc"  # a writer of the entry "entry-b", under way
    for folder in (legacy, other):
        folder.mkdir()
    assert stale_partials(target) == [legacy]
    with locked(target), partial(target) as tmp:
        (tmp / "weights").write_bytes(b"w")
    assert not legacy.exists() and other.is_dir()


def test_a_failed_write_keeps_the_entry_it_would_have_replaced(tmp_path):
    target = tmp_path / "entry"
    with locked(target), partial(target) as tmp:
        (tmp / "weights").write_bytes(b"old")
    with pytest.raises(RuntimeError), locked(target), partial(target) as tmp:
        (tmp / "weights").write_bytes(b"half")
        raise RuntimeError("download cut")
    assert (target / "weights").read_bytes() == b"old" and stale_partials(target) == []


def test_an_entry_is_as_readable_as_the_umask_makes_a_folder(tmp_path):
    """mkdtemp makes 0700: a cache shared by users, or a pod running as another uid, could not read the model."""
    old = os.umask(0o022)
    try:
        with locked(tmp_path / "entry"), partial(tmp_path / "entry") as tmp:
            (tmp / "weights").write_bytes(b"w")
    finally:
        os.umask(old)
    assert (tmp_path / "entry").stat().st_mode & 0o777 == 0o755


def test_an_unreadable_file_is_named_as_unreadable_not_as_damaged(tmp_path, monkeypatch, tiny_model):
    """Unreadable weights read as "truncated or damaged" (a new copy fixes nothing), and an unreadable tokenizer
    passed the check and the engine died loading it. Root reads every file, so the refusal is injected."""
    import builtins
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    for name in ("model.safetensors", "tokenizer.json"):
        def refusing(path, *args, _name=name, **kwargs):
            if str(path).endswith(_name):
                raise PermissionError(13, "Permission denied", str(path))
            return builtins.open(path, *args, **kwargs)

        monkeypatch.setattr(model_dir, "open", refusing, raising=False)
        with pytest.raises(UnreadableModelFile, match=rf"{name} cannot be read \(Permission denied\)"):
            check_model_dir(folder)
        monkeypatch.setattr(demo, "_import_gguf", lambda *a: pytest.fail("an unreadable entry is not re-imported"))
        with pytest.raises(UnreadableModelFile):
            demo.demo_model_dir(folder)

"""The demo model's import into the model cache: once for caches that link to a shared folder, and again when
the entry is damaged. The GGUF conversion (45 s) is replaced by a copy of the tiny model."""

import shutil

import pytest

from fleetserve.engine import demo
from fleetserve.engine.model_dir import ModelSourceError, check_model_dir


@pytest.fixture
def imported(tmp_path, monkeypatch, tiny_model) -> list:
    """The folders the demo import wrote, each a copy of the tiny model."""
    done = []

    def fake_import(src, out):
        done.append(out)
        shutil.copytree(tiny_model, out, dirs_exist_ok=True)

    monkeypatch.setattr(demo, "_import_gguf", fake_import)
    monkeypatch.setattr(demo, "demo_gguf_dir", lambda: tmp_path / "gguf")
    return done


def test_a_linked_cache_entry_is_imported_where_it_points_once_for_every_cache(tmp_path, imported):
    """Two caches (two test workers, two users' homes) that link their entry to one folder import it once: the
    import had replaced the link with a folder of its own, and each cache paid the 45 s conversion."""
    shared = tmp_path / "shared" / "smollm2-135m"
    links = []
    for name in ("a", "b"):
        link = tmp_path / name / "models" / "smollm2-135m"
        link.parent.mkdir(parents=True)
        link.symlink_to(shared)
        links.append(link)
    assert [demo.demo_model_dir(link) for link in links] == links  # the entry's own path, as before
    assert len(imported) == 1 and imported[0].parent == shared.parent and shared.is_dir()
    assert all(link.is_symlink() for link in links)


def test_a_damaged_demo_entry_is_imported_again(tmp_path, imported, tiny_model):
    """Its check said "prepare the model again", and prepare returned the same damaged entry."""
    entry = tmp_path / "models" / "smollm2-135m"
    shutil.copytree(tiny_model, entry)
    weights = entry / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # a copy cut short
    with pytest.raises(ModelSourceError, match="not a whole safetensors file"):
        check_model_dir(entry)
    assert demo.demo_model_dir(entry) == entry and check_model_dir(entry) == entry
    assert len(imported) == 1 and imported[0].name.startswith(".smollm2-135m.partial-")
    assert demo.demo_model_dir(entry) == entry and len(imported) == 1  # whole now: not imported again

"""The demo model's import into a cache entry that links to a shared folder."""

import shutil

from fleetserve.engine import demo


def test_a_linked_cache_entry_is_imported_where_it_points_once_for_every_cache(tmp_path, monkeypatch, tiny_model):
    """Two caches (two test workers, two users' homes) that link their entry to one folder import it once: the
    import had replaced the link with a folder of its own, and each cache paid the 45 s conversion."""
    imported = []

    def fake_import(src, out):
        imported.append(out)
        shutil.copytree(tiny_model, out, dirs_exist_ok=True)

    monkeypatch.setattr(demo, "_import_gguf", fake_import)
    monkeypatch.setattr(demo, "demo_gguf_dir", lambda: tmp_path / "gguf")
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
